//! The streaming executor: reads the source checkpoint by memory map, runs the plan's jobs across
//! threads tensor by tensor (quantizing or copying), and writes shards through the shard writer.
//! Resident memory is a few tensors, never the model: source pages are released after each job.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use fp4forge_format::config::Field;
use fp4forge_format::{
    quantize_fused, Checkpoint, ShardWriter, ShardWriterBuilder, SourceDtype, WeightView,
};
use rayon::prelude::*;
use serde::Serialize;

use crate::plan::modules::WeightSource;
use crate::plan::untie;
use crate::plan::{Job, PlanRequest, PlanSummary, QuantizeMember, QuantizePlan};
use crate::staging::StagingDir;
use crate::validate::validate_checkpoint;
use crate::BuilderError;

/// Receives progress of a long job, in source bytes processed.
pub trait Progress: Sync {
    /// Called once before work starts with the total number of source bytes.
    fn start(&self, total_bytes: u64);
    /// Called as jobs complete with the source bytes they consumed.
    fn advance(&self, bytes: u64);
    /// Polled between jobs: `true` stops the build (cleanly: no output is left behind).
    fn cancelled(&self) -> bool {
        false
    }
}

/// A [`Progress`] that ignores everything.
pub struct NoProgress;

impl Progress for NoProgress {
    fn start(&self, _: u64) {}
    fn advance(&self, _: u64) {}
}

/// What a finished build did.
#[derive(Debug, Clone, Serialize)]
pub struct BuildReport {
    /// The output directory.
    pub output: PathBuf,
    /// Plan counts and sizes.
    pub summary: PlanSummary,
    /// Shard files written.
    pub shards: Vec<String>,
    /// Non-weight files copied (tokenizer, templates, ...).
    pub copied_files: Vec<String>,
    /// Wall time.
    pub seconds: f64,
}

/// Configures and runs `quantize SRC DST`.
#[derive(Debug, Clone)]
pub struct QuantizeBuilder {
    src: PathBuf,
    dst: PathBuf,
    request: PlanRequest,
    untie_lm_head: bool,
    force: bool,
    max_shard_bytes: Option<u64>,
}

impl QuantizeBuilder {
    /// A build of `src` into `dst` with the default targets (attention q/k/v/o).
    pub fn new(src: impl Into<PathBuf>, dst: impl Into<PathBuf>) -> Self {
        Self {
            src: src.into(),
            dst: dst.into(),
            request: PlanRequest::default(),
            untie_lm_head: false,
            force: false,
            max_shard_bytes: None,
        }
    }

    /// `--targets` patterns (replacing the default).
    pub fn targets(mut self, targets: Vec<String>) -> Self {
        self.request.targets = targets;
        self
    }

    /// `--ignore` patterns.
    pub fn ignore(mut self, ignore: Vec<String>) -> Self {
        self.request.ignore = ignore;
        self
    }

    /// `--allow-empty`: write the output even when the targets select nothing to quantize.
    pub fn allow_empty(mut self, allow: bool) -> Self {
        self.request.allow_empty = allow;
        self
    }

    /// `--untie-lm-head`: write the tied embedding's values as a new NVFP4 `lm_head` (its own
    /// global scale) and `tie_word_embeddings: false`; the embedding is copied unchanged.
    /// Refused on a model that is not tied ([`crate::plan::untie::resolve`]).
    pub fn untie_lm_head(mut self, untie: bool) -> Self {
        self.untie_lm_head = untie;
        self
    }

    /// Replace an existing destination.
    pub fn force(mut self, force: bool) -> Self {
        self.force = force;
        self
    }

    /// Largest output shard, in bytes (default: the shard writer's 5 GB).
    pub fn max_shard_bytes(mut self, bytes: Option<u64>) -> Self {
        self.max_shard_bytes = bytes;
        self
    }

    /// Opens and validates the source ([`crate::validate`]) and plans the build without writing
    /// anything (`--dry-run`).
    pub fn plan(&self) -> Result<(Checkpoint, QuantizePlan), BuilderError> {
        let checkpoint = Checkpoint::open(&self.src)?;
        let validated = validate_checkpoint(&checkpoint)?;
        let config = checkpoint.config()?;
        let infos: Vec<_> = checkpoint.tensors().map(|e| e.info.clone()).collect();
        let mut request = self.request.clone();
        if self.untie_lm_head {
            request.untie_lm_head = Some(untie::resolve(&validated.shape, &infos)?);
        }
        let plan = QuantizePlan::new(&infos, config.quantization_config.get(), &request)?;
        Ok((checkpoint, plan))
    }

    /// Plans and runs the build. The destination appears only when everything is written.
    pub fn run(&self, progress: &dyn Progress) -> Result<BuildReport, BuilderError> {
        let started = Instant::now();
        let (checkpoint, plan) = self.plan()?;
        let staging = StagingDir::create_from(&self.src, &self.dst, self.force)?;
        let mut builder = ShardWriterBuilder::new();
        if let Some(bytes) = self.max_shard_bytes {
            builder = builder.max_shard_bytes(bytes);
        }
        if let Some(meta) = checkpoint.shards().first().and_then(|s| s.metadata()) {
            builder = builder.metadata(Some(meta.clone()));
        }
        let writer = builder.create(staging.path(), plan.outputs.clone())?;
        // The embedding of an untied lm_head is read twice (copied, and quantized).
        let extra_read = plan
            .summary
            .untied_lm_head
            .as_ref()
            .map_or(0, |u| u.bytes_before);
        progress.start(plan.summary.bytes_before + extra_read);
        plan.jobs
            .par_iter()
            .try_for_each(|job| run_job(&checkpoint, &writer, job, progress))?;
        let written = writer.finish()?;

        let mut config = checkpoint.config()?;
        config.quantization_config = Field::Set(plan.quantization_config.clone());
        if plan.summary.untied_lm_head.is_some() {
            untie::untie_config(&mut config);
        }
        config.write(staging.path().join("config.json"))?;
        let copied_files = checkpoint.other_files()?;
        for name in &copied_files {
            let from = checkpoint.dir().join(name);
            fs::copy(&from, staging.path().join(name)).map_err(|source| BuilderError::Io {
                path: from.clone(),
                source,
            })?;
        }
        let output = staging.commit()?;
        Ok(BuildReport {
            output,
            summary: plan.summary,
            shards: written.shards.clone(),
            copied_files,
            seconds: started.elapsed().as_secs_f64(),
        })
    }
}

/// The bytes of a weight source and the shard file that holds them.
pub(crate) fn source_bytes<'c>(
    checkpoint: &'c Checkpoint,
    source: &WeightSource,
) -> Result<(&'c [u8], &'c Path), BuilderError> {
    let (tensor, range) = match source {
        WeightSource::Tensor(t) => (t, None),
        WeightSource::ExpertSlice { tensor, bytes } => (tensor, Some(bytes.clone())),
    };
    let entry = checkpoint.get(tensor).ok_or_else(|| BuilderError::Tensor {
        tensor: tensor.clone(),
        reason: "missing from the source checkpoint".into(),
    })?;
    let bytes = entry.bytes();
    let bytes = match range {
        Some(r) => bytes.get(r).ok_or_else(|| BuilderError::Tensor {
            tensor: tensor.clone(),
            reason: "expert slice out of range".into(),
        })?,
        None => bytes,
    };
    Ok((bytes, entry.shard.path()))
}

/// Releases the source pages of a weight source once its job is done.
fn release(checkpoint: &Checkpoint, source: &WeightSource) {
    if let WeightSource::Tensor(t) = source {
        if let Some(e) = checkpoint.get(t) {
            e.release();
        }
    }
}

/// The numerics dtype of a checkpoint dtype (only bf16/f16/f32 are ever planned for quantizing).
pub(crate) fn source_dtype(member: &QuantizeMember) -> Result<SourceDtype, BuilderError> {
    match member.dtype {
        fp4forge_format::Dtype::BF16 => Ok(SourceDtype::Bf16),
        fp4forge_format::Dtype::F16 => Ok(SourceDtype::F16),
        fp4forge_format::Dtype::F32 => Ok(SourceDtype::F32),
        other => Err(BuilderError::Tensor {
            tensor: format!("{}.weight", member.module),
            reason: format!("dtype {other} cannot be quantized"),
        }),
    }
}

/// Quantizes a scale group from the checkpoint: one shared global scale, then each member.
pub(crate) fn quantize_members(
    checkpoint: &Checkpoint,
    members: &[QuantizeMember],
) -> Result<Vec<fp4forge_format::Nvfp4Tensor>, BuilderError> {
    let names: Vec<String> = members
        .iter()
        .map(|m| format!("{}.weight", m.module))
        .collect();
    let mut views = Vec::with_capacity(members.len());
    let mut files = Vec::with_capacity(members.len());
    for (m, name) in members.iter().zip(&names) {
        let (bytes, file) = source_bytes(checkpoint, &m.source)?;
        let view = WeightView::new(name, source_dtype(m)?, m.rows, m.cols, bytes).map_err(|e| {
            BuilderError::Numerics {
                file: file.to_path_buf(),
                source: e,
            }
        })?;
        views.push(view);
        files.push(file);
    }
    quantize_fused(&views).map_err(|e| {
        let file = match &e {
            fp4forge_format::NumericsError::NonFinite { tensor, .. }
            | fp4forge_format::NumericsError::NotBlockAligned { tensor, .. } => names
                .iter()
                .position(|n| n == tensor)
                .map(|i| files[i].to_path_buf()),
            _ => None,
        };
        BuilderError::Numerics {
            file: file.unwrap_or_else(|| files[0].to_path_buf()),
            source: e,
        }
    })
}

/// Bytes copied between page releases.
const COPY_CHUNK: usize = 32 << 20;

fn run_job(
    checkpoint: &Checkpoint,
    writer: &ShardWriter,
    job: &Job,
    progress: &dyn Progress,
) -> Result<(), BuilderError> {
    if progress.cancelled() {
        return Err(BuilderError::Cancelled);
    }
    match job {
        Job::Copy { tensor } => {
            let entry = checkpoint.get(tensor).ok_or_else(|| BuilderError::Tensor {
                tensor: tensor.clone(),
                reason: "missing from the source checkpoint".into(),
            })?;
            // Piece by piece, releasing each piece's pages: copying a huge embedding keeps one
            // piece resident, not the tensor.
            writer.write_in_chunks(tensor, entry.bytes(), COPY_CHUNK, |done| {
                progress.advance(done.len() as u64);
                entry.release_range(done);
            })?;
        }
        Job::CopySlice { module, source } => {
            let (bytes, _) = source_bytes(checkpoint, source)?;
            writer.write(&format!("{module}.weight"), bytes)?;
            progress.advance(bytes.len() as u64);
        }
        Job::Quantize { members } => {
            let quantized = quantize_members(checkpoint, members)?;
            for (m, q) in members.iter().zip(&quantized) {
                writer.write(&format!("{}.weight_packed", m.module), &q.packed)?;
                writer.write(&format!("{}.weight_scale", m.module), &q.scales)?;
                writer.write(
                    &format!("{}.weight_global_scale", m.module),
                    &q.global_scale.to_le_bytes(),
                )?;
                progress.advance((m.rows * m.cols * m.dtype.size()) as u64);
                release(checkpoint, &m.source);
            }
        }
    }
    Ok(())
}
