//! `import-gguf`: a llama.cpp GGUF (Llama family: SmolLM2, Llama, Mistral; Qwen2) converted to a
//! transformers checkpoint that vLLM, transformers and fp4forge's engine load as they are.
//!
//! ```text
//! FILE.gguf                                  DST/
//!   {arch}.* metadata             ──────▶      config.json             (LlamaForCausalLM / Qwen2ForCausalLM)
//!   tokenizer.ggml.bos/eos ids    ──────▶      generation_config.json
//!   tensors (F32/F16/BF16/Q4_0/Q4_1/Q5_x/Q8_0/K-quants)
//!     dequantize → f32 (bit-exact with ggml)
//!     attn_q/attn_k: undo llama.cpp's RoPE row permutation (llama only)
//!     → bf16 (round-to-nearest-even) ───▶      model.safetensors       (HF names, HF shapes)
//!   tokenizer.ggml.tokens/merges/types/pre ▶   tokenizer.json          (byte-level BPE)
//!   tokenizer.chat_template       ──────▶      tokenizer_config.json   (chat_template, special tokens)
//! ```
//!
//! **dtype policy.** Every tensor — linear weights, embeddings *and* norms — is written as bf16
//! (default) or f32 (`OutputDtype::F32`). bf16 is what the original HF checkpoints ship in, so
//! the GGUF's F32 norms (bf16 values widened by the converter) come back exactly; the dequantized
//! 4-bit weights are rounded once, to nearest even. One dtype for the whole checkpoint keeps
//! `torch_dtype` truthful. Choose f32 to keep the GGUF's values bit for bit.
//!
//! The output appears atomically (a staging directory renamed at the end); tensors are
//! converted in parallel, one at a time per thread, so memory stays O(largest tensor).

mod arch;
mod convert;
mod names;
mod permute;
mod tokenizer;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use fp4forge_format::gguf::{GgufError, GgufFile, TensorInfo};
use fp4forge_format::{write_file_atomic, ShardWriterBuilder, TensorSpec};
use rayon::prelude::*;
use serde::Serialize;

use crate::build::Progress;
use crate::staging::StagingDir;
use crate::BuilderError;

pub use arch::SUPPORTED_ARCHITECTURES;
pub use convert::OutputDtype;
pub use tokenizer::{TokenizerSummary, SUPPORTED_PRE_TOKENIZERS};

use arch::{import_error, Geometry};

/// What an import did.
#[derive(Debug, Clone, Serialize)]
pub struct ImportReport {
    /// The GGUF file.
    pub source: PathBuf,
    /// The output directory.
    pub output: PathBuf,
    /// `general.architecture` of the GGUF.
    pub gguf_architecture: String,
    /// The transformers class written to config.json.
    pub architecture: String,
    /// Output dtype of every tensor.
    pub dtype: OutputDtype,
    /// Tensors written.
    pub tensors: usize,
    /// Parameters (elements) written.
    pub parameters: u64,
    /// GGUF tensor types and how many tensors had each.
    pub source_types: BTreeMap<String, usize>,
    /// Bytes of tensor data read from the GGUF.
    pub source_bytes: u64,
    /// Bytes of tensor data written.
    pub output_bytes: u64,
    /// Tensors whose Q/K rows were un-permuted.
    pub unpermuted: usize,
    /// Whether lm_head is tied to the embedding (no `output.weight` in the GGUF).
    pub tied_embeddings: bool,
    /// The rebuilt tokenizer, if the GGUF has one.
    pub tokenizer: Option<TokenizerSummary>,
    /// Files written into the output directory.
    pub files: Vec<String>,
    /// Wall time.
    pub seconds: f64,
}

/// Configures and runs `import-gguf FILE DST`.
#[derive(Debug, Clone)]
pub struct ImportGgufBuilder {
    file: PathBuf,
    dst: PathBuf,
    force: bool,
    dtype: OutputDtype,
}

/// One output tensor and where it comes from.
struct Job<'a> {
    src: &'a TensorInfo,
    spec: TensorSpec,
    permute_heads: Option<usize>,
}

impl ImportGgufBuilder {
    /// An import of `file` into the directory `dst` (bf16, refusing an existing `dst`).
    pub fn new(file: impl Into<PathBuf>, dst: impl Into<PathBuf>) -> Self {
        Self {
            file: file.into(),
            dst: dst.into(),
            force: false,
            dtype: OutputDtype::Bf16,
        }
    }

    /// Replace an existing destination.
    pub fn force(mut self, force: bool) -> Self {
        self.force = force;
        self
    }

    /// The dtype of every output tensor (default bf16).
    pub fn dtype(mut self, dtype: OutputDtype) -> Self {
        self.dtype = dtype;
        self
    }

    /// Reads the GGUF, checks it, converts and writes the checkpoint. The destination appears
    /// only when everything is written.
    pub fn run(&self, progress: &dyn Progress) -> Result<ImportReport, BuilderError> {
        let started = Instant::now();
        let gguf = GgufFile::open(&self.file)?;
        let header = gguf.header();
        let vocab_hint = header
            .strings_opt("tokenizer.ggml.tokens")?
            .map(<[String]>::len);
        let geo = Geometry::read(header, vocab_hint)?;
        geo.check_with_arch(&self.file)?;
        let jobs = plan(&gguf, &geo, self.dtype)?;
        let tok = tokenizer::build(header, geo.context)?;
        if let Some(t) = &tok {
            if t.summary.vocab_size != geo.vocab {
                return Err(import_error(
                    &self.file,
                    format!(
                        "the tokenizer has {} tokens but the model's vocabulary is {}",
                        t.summary.vocab_size, geo.vocab
                    ),
                ));
            }
        }

        let staging = StagingDir::create_from(&self.file, &self.dst, self.force)?;
        let writer = ShardWriterBuilder::new()
            .create(staging.path(), jobs.iter().map(|j| j.spec.clone()))?;
        let source_bytes: u64 = jobs.iter().map(|j| j.src.n_bytes()).sum();
        progress.start(source_bytes);
        jobs.par_iter().try_for_each(|job| {
            if progress.cancelled() {
                return Err(BuilderError::Cancelled);
            }
            let bytes = convert::convert(&gguf, job.src, job.permute_heads, self.dtype)?;
            writer.write(&job.spec.name, &bytes)?;
            progress.advance(job.src.n_bytes());
            Ok(())
        })?;
        let written = writer.finish()?;

        let mut files = written.shards.clone();
        let mut config = geo.config_json();
        config["torch_dtype"] = self.dtype.torch_name().into();
        let mut json_files = vec![
            ("config.json", config),
            ("generation_config.json", geo.generation_config_json()),
        ];
        if let Some(t) = &tok {
            json_files.push(("tokenizer.json", t.tokenizer.clone()));
            json_files.push(("tokenizer_config.json", t.config.clone()));
        }
        for (name, value) in json_files {
            let mut text = serde_json::to_vec_pretty(&value)
                .map_err(|e| import_error(&self.file, format!("cannot serialize {name}: {e}")))?;
            text.push(b'\n');
            write_file_atomic(staging.path().join(name), &text)?;
            files.push(name.to_owned());
        }
        let output = staging.commit()?;

        let mut source_types = BTreeMap::new();
        for j in &jobs {
            *source_types
                .entry(j.src.ggml_type.name().to_owned())
                .or_insert(0) += 1;
        }
        Ok(ImportReport {
            source: self.file.clone(),
            output,
            gguf_architecture: geo.arch.clone(),
            architecture: geo.class().to_owned(),
            dtype: self.dtype,
            tensors: jobs.len(),
            parameters: jobs.iter().map(|j| j.src.n_elements()).sum(),
            source_types,
            source_bytes,
            output_bytes: written.total_size,
            unpermuted: jobs.iter().filter(|j| j.permute_heads.is_some()).count(),
            tied_embeddings: geo.tied,
            tokenizer: tok.map(|t| t.summary),
            files,
            seconds: started.elapsed().as_secs_f64(),
        })
    }
}

/// `import-gguf FILE DST [--force]` with the defaults (bf16 output).
pub fn import_gguf(
    file: impl AsRef<Path>,
    dst: impl AsRef<Path>,
    force: bool,
    progress: &dyn Progress,
) -> Result<ImportReport, BuilderError> {
    ImportGgufBuilder::new(file.as_ref(), dst.as_ref())
        .force(force)
        .run(progress)
}

/// Maps every GGUF tensor to its HF name and shape, checking names, shapes and completeness.
fn plan<'a>(
    gguf: &'a GgufFile,
    geo: &Geometry,
    dtype: OutputDtype,
) -> Result<Vec<Job<'a>>, BuilderError> {
    let file = gguf.path();
    let mut jobs = Vec::with_capacity(gguf.tensors().len());
    for info in gguf.tensors() {
        let bad = |reason: String| {
            BuilderError::Gguf(GgufError::Tensor {
                path: file.to_path_buf(),
                tensor: info.name.clone(),
                reason,
            })
        };
        let mapped =
            names::map_name(&info.name).ok_or_else(|| {
                bad(format!(
                "not a tensor of a {} model (known: token_embd, output_norm, output, blk.N.{{{}}})",
                geo.arch,
                names::required_layer_weights().collect::<Vec<_>>().join(",")
            ))
            })?;
        if let Some(layer) = mapped.layer.filter(|&l| l >= geo.n_layers) {
            return Err(bad(format!(
                "layer {layer} but the model has {} layers",
                geo.n_layers
            )));
        }
        if !info.ggml_type.is_dequantizable() {
            return Err(bad(format!(
                "ggml type {} cannot be dequantized (supported: {})",
                info.ggml_type,
                fp4forge_format::GgmlType::dequantizable_list()
            )));
        }
        let shape = info.shape();
        let want = geo.expected_shape(mapped.leaf, mapped.kind);
        if want.as_ref() != Some(&shape) {
            return Err(bad(format!(
                "shape {shape:?} (HF order) does not fit the model's geometry, which needs {want:?}"
            )));
        }
        let permute_heads = geo.permuted_heads(mapped.leaf);
        jobs.push(Job {
            src: info,
            spec: TensorSpec::new(mapped.hf, dtype.dtype(), shape),
            permute_heads,
        });
    }
    // Completeness: every layer has every weight, and the top-level tensors exist.
    let mut missing = Vec::new();
    for top in ["token_embd.weight", "output_norm.weight"] {
        if gguf.tensor(top).is_none() {
            missing.push(top.to_owned());
        }
    }
    for layer in 0..geo.n_layers {
        for leaf in names::required_layer_weights() {
            let name = format!("blk.{layer}.{leaf}.weight");
            if gguf.tensor(&name).is_none() {
                missing.push(name);
            }
        }
    }
    if !missing.is_empty() {
        return Err(import_error(
            file,
            format!("{} tensors missing, first `{}`", missing.len(), missing[0]),
        ));
    }
    Ok(jobs)
}
