//! Synthetic Laguna checkpoints: every tensor of a real checkpoint (names, dtypes, shapes exactly
//! as the release's on-disk layout), filled with seeded random values of realistic magnitude.
//!
//! A checkpoint is planned from a `config.json` (a [`Preset`] or any Laguna config): the
//! [`LagunaGeometry`] gives the tensor list, in bf16 or in the vendor stock NVFP4 layout (routed
//! experts W4A4, everything else bf16). Writing streams: every output tensor is declared up
//! front on a [`fp4forge_format::ShardWriter`], then generated and written a few at a time in
//! parallel, so memory stays at a few tensors whatever the model size. Each tensor's values are a
//! function of `(seed, tensor name)` only, so the output is byte-identical across runs and thread
//! counts, and the stock variant is exactly the NVFP4 quantization of the bf16 variant with the
//! same seed.
//!
//! ```text
//! DST/config.json               the config (+ quantization_config for the stock layout)
//! DST/generation_config.json    bos/eos/pad, temperature 1.0, top_p 1.0, top_k 20
//! DST/model*.safetensors        shards of at most 5 GB (+ index when more than one)
//! ```
//!
//! The directory appears atomically: it is built as a hidden sibling and renamed at the end.

mod files;
mod generate;
mod geometry;
mod presets;
mod tensors;

use std::path::{Path, PathBuf};

use fp4forge_format::shard_writer::DEFAULT_MAX_SHARD_BYTES;
use fp4forge_format::{write_file_atomic, ShardWriterBuilder, TensorSpec};
use serde::Serialize;
use serde_json::{Map, Value};

pub use files::{
    generation_config, nvfp4_input_activations, output_config, stock_quantization_config,
    EXPERTS_TARGET,
};
pub use geometry::{LagunaGeometry, LayerGeometry};
pub use presets::Preset;
pub use tensors::{linear_modules, nvfp4_w4a4_specs, source_tensors, Init, SourceTensor};

use crate::build::Progress;
use crate::staging::StagingDir;
use crate::BuilderError;
use tensors::Layout;

/// The seed used when none is given.
pub const DEFAULT_SEED: u64 = 0;

/// Options of a synthetic checkpoint: seed, layout, shard size, overwrite.
#[derive(Debug, Clone)]
pub struct SynthBuilder {
    seed: u64,
    stock_nvfp4: bool,
    max_shard_bytes: u64,
    force: bool,
}

impl Default for SynthBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl SynthBuilder {
    /// Defaults: seed [`DEFAULT_SEED`], bf16 layout, 5 GB shards, refuse an existing destination.
    pub fn new() -> Self {
        Self {
            seed: DEFAULT_SEED,
            stock_nvfp4: false,
            max_shard_bytes: DEFAULT_MAX_SHARD_BYTES,
            force: false,
        }
    }

    /// The seed every value derives from.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Whether to write the vendor stock NVFP4 layout (routed experts W4A4) instead of bf16.
    pub fn stock_nvfp4(mut self, yes: bool) -> Self {
        self.stock_nvfp4 = yes;
        self
    }

    /// Largest shard, in bytes of tensor data (a larger single tensor gets a shard of its own).
    pub fn max_shard_bytes(mut self, bytes: u64) -> Self {
        self.max_shard_bytes = bytes;
        self
    }

    /// Whether an existing destination may be replaced.
    pub fn force(mut self, yes: bool) -> Self {
        self.force = yes;
        self
    }

    /// Plans the checkpoint of a Laguna `config` (`source` names it in errors): its geometry,
    /// the files' JSON and every output tensor. Allocates nothing in proportion to the model.
    pub fn plan(
        &self,
        config: &Map<String, Value>,
        source: &str,
    ) -> Result<SynthPlan, BuilderError> {
        let geometry = LagunaGeometry::from_config(config, source)?;
        let has_experts = (0..geometry.layers.len()).any(|l| geometry.is_moe(l));
        if self.stock_nvfp4 && has_experts {
            for (field, n) in [
                ("hidden_size", geometry.hidden_size),
                ("moe_intermediate_size", geometry.moe_intermediate),
            ] {
                if !n.is_multiple_of(16) {
                    return Err(BuilderError::Config {
                        source_name: source.to_owned(),
                        field: field.to_owned(),
                        reason: format!("{n} is not a multiple of 16, as NVFP4 experts need"),
                    });
                }
            }
        }
        let quantization = self
            .stock_nvfp4
            .then(|| stock_quantization_config(&geometry));
        Ok(SynthPlan {
            config: output_config(config, quantization.as_ref()),
            generation_config: generation_config(config),
            layout: Layout::new(&geometry, self.stock_nvfp4),
            geometry,
            stock_nvfp4: self.stock_nvfp4,
        })
    }

    /// Plans the checkpoint of a [`Preset`].
    pub fn plan_preset(&self, preset: Preset) -> Result<SynthPlan, BuilderError> {
        self.plan(&preset.config(), &format!("preset {preset}"))
    }

    /// Writes `plan` to the directory `dst` on the current rayon pool. `progress` is started
    /// with [`SynthPlan::total_bytes`], advanced by the bytes of each tensor as it is written
    /// (from any thread) and polled for cancellation between tensors. `dst` appears complete or
    /// not at all.
    pub fn write(
        &self,
        plan: &SynthPlan,
        dst: &Path,
        progress: &dyn Progress,
    ) -> Result<SynthReport, BuilderError> {
        let staging = StagingDir::create(dst, self.force)?;
        progress.start(plan.total_bytes());
        let writer = ShardWriterBuilder::new()
            .max_shard_bytes(self.max_shard_bytes)
            .create(staging.path(), plan.layout.specs.iter().cloned())?;
        generate::run(&plan.layout, self.seed, &writer, progress, dst)?;
        let written = writer.finish()?;
        write_file_atomic(
            staging.path().join("config.json"),
            &files::pretty(&plan.config),
        )?;
        write_file_atomic(
            staging.path().join("generation_config.json"),
            &files::pretty(&plan.generation_config),
        )?;
        staging.commit()?;
        Ok(SynthReport {
            dir: dst.to_path_buf(),
            tensors: plan.layout.specs.len(),
            total_bytes: written.total_size,
            shards: written.shards,
            seed: self.seed,
            stock_nvfp4: plan.stock_nvfp4,
        })
    }
}

/// A planned synthetic checkpoint: what will be written, before anything is.
#[derive(Debug, Clone)]
pub struct SynthPlan {
    geometry: LagunaGeometry,
    config: Map<String, Value>,
    generation_config: Map<String, Value>,
    layout: Layout,
    stock_nvfp4: bool,
}

impl SynthPlan {
    /// The model's geometry.
    pub fn geometry(&self) -> &LagunaGeometry {
        &self.geometry
    }

    /// The `config.json` that will be written.
    pub fn config(&self) -> &Map<String, Value> {
        &self.config
    }

    /// The `generation_config.json` that will be written.
    pub fn generation_config(&self) -> &Map<String, Value> {
        &self.generation_config
    }

    /// Every output tensor, in data order.
    pub fn tensors(&self) -> &[TensorSpec] {
        &self.layout.specs
    }

    /// The tensors as generated, before quantization (the bf16 checkpoint's tensors).
    pub fn sources(&self) -> &[SourceTensor] {
        &self.layout.sources
    }

    /// Bytes of tensor data over all shards (headers excluded).
    pub fn total_bytes(&self) -> u64 {
        self.layout
            .specs
            .iter()
            .map(|s| s.byte_len().unwrap_or(0))
            .sum()
    }

    /// Parameters of the model (elements of the unquantized tensors).
    pub fn parameter_count(&self) -> u64 {
        self.layout.sources.iter().map(|s| s.numel() as u64).sum()
    }

    /// Whether this is the stock NVFP4 layout.
    pub fn is_stock_nvfp4(&self) -> bool {
        self.stock_nvfp4
    }
}

/// What [`SynthBuilder::write`] produced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SynthReport {
    /// The checkpoint directory.
    pub dir: PathBuf,
    /// Tensors written.
    pub tensors: usize,
    /// Bytes of tensor data.
    pub total_bytes: u64,
    /// Shard file names, in order.
    pub shards: Vec<String>,
    /// The seed used.
    pub seed: u64,
    /// Whether the stock NVFP4 layout was written.
    pub stock_nvfp4: bool,
}
