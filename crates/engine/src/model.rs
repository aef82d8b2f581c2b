//! A loaded model: its resident weights on a backend, its geometry, and the options it runs
//! with. Sessions ([`crate::Session`]) borrow it; any number can run against one model.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use fp4forge_format::{Checkpoint, LoadFormat};

use crate::backend::cpu::{CpuActivations, CpuIsa};
use crate::backend::{Backend, CpuBackend, KvLimit};
use fp4forge_arch::ArchSpec;

use crate::config::ConfigJson;
use crate::error::{EngineError, Result};
use crate::ir::Decoder;
use crate::ir::{KvDtype, KvLayerSpec};
use crate::models::load_ctx::LoadCtx;
use crate::models::{self, Family};
use crate::session::Session;
use crate::weights::WeightLoader;

/// Default prefill chunk (tokens per forward pass while prefilling).
pub const DEFAULT_PREFILL_CHUNK: usize = 512;

/// Default prefill chunk on a GPU ([`crate::Device::default_prefill_chunk`]): the tensor-core
/// GEMMs and the grouped experts fill the device only with thousands of rows per pass.
pub const DEFAULT_PREFILL_CHUNK_GPU: usize = 2048;

/// How a model is loaded and run: plain data (every field public, [`Default`]) with builder-style
/// setters of the same names, e.g. `ModelOptions::new().kv_dtype(KvDtype::F32).threads(2)`.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelOptions {
    /// KV cache storage type (default bf16).
    pub kv_dtype: KvDtype,
    /// Whether W4A4 modules (those with `input_global_scale`) quantize their input activations
    /// to NVFP4 first, as Blackwell FP4 GEMMs do. Off (default): weight-only (W4A16) everywhere.
    pub emulate_w4a4: bool,
    /// Caps the context below `max_position_embeddings` (never above it).
    pub max_context: Option<usize>,
    /// Tokens per forward pass during prefill (bounds activation memory; default 512).
    pub prefill_chunk: usize,
    /// CPU threads for [`Model::load`] (0, the default: rayon's global pool, one per core).
    pub threads: usize,
    /// The CPU kernels' instruction set for [`Model::load`] (default: the best the CPU has).
    pub cpu_isa: CpuIsa,
    /// What a decode step's NVFP4 weights multiply on the CPU for [`Model::load`] (default f32;
    /// see [`CpuActivations`]).
    pub cpu_activations: CpuActivations,
    /// How the weight files are held: memory-mapped (default) or read into memory, which a
    /// file truncated or rewritten while serving cannot affect.
    pub load_format: LoadFormat,
    /// The cap on the KV caches' memory, applied once the weights are loaded
    /// ([`Backend::limit_kv_memory`]); `None` (the default): no cap.
    pub kv_limit: Option<KvLimit>,
}

impl Default for ModelOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl ModelOptions {
    /// bf16 KV cache, weight-only NVFP4 (W4A16), the config's context, 512-token prefill chunks,
    /// rayon's global thread pool.
    pub fn new() -> Self {
        Self {
            kv_dtype: KvDtype::Bf16,
            emulate_w4a4: false,
            max_context: None,
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
            threads: 0,
            cpu_isa: CpuIsa::Auto,
            cpu_activations: CpuActivations::F32,
            load_format: LoadFormat::Mmap,
            kv_limit: None,
        }
    }

    /// Sets [`ModelOptions::kv_limit`].
    pub fn kv_limit(mut self, limit: Option<KvLimit>) -> Self {
        self.kv_limit = limit;
        self
    }

    /// Sets [`ModelOptions::load_format`].
    pub fn load_format(mut self, format: LoadFormat) -> Self {
        self.load_format = format;
        self
    }

    /// Sets [`ModelOptions::kv_dtype`].
    pub fn kv_dtype(mut self, dtype: KvDtype) -> Self {
        self.kv_dtype = dtype;
        self
    }

    /// Sets [`ModelOptions::emulate_w4a4`].
    pub fn emulate_w4a4(mut self, yes: bool) -> Self {
        self.emulate_w4a4 = yes;
        self
    }

    /// Sets [`ModelOptions::max_context`].
    pub fn max_context(mut self, tokens: usize) -> Self {
        self.max_context = Some(tokens);
        self
    }

    /// Sets [`ModelOptions::prefill_chunk`] (at least 1).
    pub fn prefill_chunk(mut self, tokens: usize) -> Self {
        self.prefill_chunk = tokens.max(1);
        self
    }

    /// Sets [`ModelOptions::threads`].
    pub fn threads(mut self, threads: usize) -> Self {
        self.threads = threads;
        self
    }

    /// Sets [`ModelOptions::cpu_isa`].
    pub fn cpu_isa(mut self, isa: CpuIsa) -> Self {
        self.cpu_isa = isa;
        self
    }

    /// Sets [`ModelOptions::cpu_activations`].
    pub fn cpu_activations(mut self, act: CpuActivations) -> Self {
        self.cpu_activations = act;
        self
    }
}

/// Sampling defaults a checkpoint ships in `generation_config.json` (absent keys are `None`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct GenerationDefaults {
    /// `temperature`.
    pub temperature: Option<f32>,
    /// `top_p`.
    pub top_p: Option<f32>,
    /// `top_k`.
    pub top_k: Option<usize>,
    /// `do_sample` (false means greedy).
    pub do_sample: Option<bool>,
}

/// What a loaded model is.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    /// The checkpoint directory.
    pub dir: PathBuf,
    /// `architectures[0]` of the config.
    pub architecture: String,
    /// The code path it runs on.
    pub family: Family,
    /// Vocabulary size (rows of the embedding and of the logits).
    pub vocab_size: usize,
    /// Residual stream width.
    pub hidden_size: usize,
    /// Decoder layers.
    pub num_layers: usize,
    /// Longest sequence a session accepts.
    pub max_context: usize,
    /// `bos_token_id`, if the config has one.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence ids from `generation_config.json`, else from `config.json`.
    pub eos_token_ids: Vec<u32>,
    /// Sampling defaults from `generation_config.json`.
    pub generation_defaults: GenerationDefaults,
    /// Bytes of all tensors as stored (what the weights occupy once paged in).
    pub weight_bytes: u64,
    /// The backend's name.
    pub backend: String,
}

/// A loaded model on backend `B`.
pub struct Model<B: Backend = CpuBackend> {
    backend: B,
    decoder: Decoder<B>,
    kv_specs: Vec<KvLayerSpec>,
    info: ModelInfo,
    options: ModelOptions,
    /// Keeps the memory maps the weights borrow from alive (they also hold it; this makes the
    /// ownership explicit).
    _checkpoint: Arc<Checkpoint>,
}

impl Model<CpuBackend> {
    /// Loads the checkpoint in `dir` on the CPU backend (with `options.threads` threads and the
    /// kernels of `options.cpu_isa`).
    pub fn load(dir: impl AsRef<Path>, options: ModelOptions) -> Result<Self> {
        let backend = CpuBackend::new()
            .with_isa(options.cpu_isa)?
            .with_activations(options.cpu_activations)
            .with_threads(options.threads)?;
        Self::load_with_backend(dir, options, backend)
    }
}

impl<B: Backend> Model<B> {
    /// Loads the checkpoint in `dir` onto `backend`. Weights stay packed (memory-mapped on the
    /// CPU); every dtype and shape is checked against `config.json`.
    pub fn load_with_backend(
        dir: impl AsRef<Path>,
        options: ModelOptions,
        backend: B,
    ) -> Result<Self> {
        let dir = dir.as_ref();
        let cfg = ConfigJson::from_path(&dir.join("config.json"))?;
        let spec = ArchSpec::from_config(&cfg)?;

        let ckpt = Arc::new(Checkpoint::open_with(dir, options.load_format)?);
        let loader = WeightLoader::new(ckpt.clone());
        let ctx = LoadCtx {
            backend: &backend,
            loader: &loader,
            emulate_w4a4: options.emulate_w4a4,
        };
        let decoder = models::loader::load(&spec, &ctx, options.kv_dtype)?;
        if let Some(limit) = options.kv_limit {
            if let KvLimit::DeviceFraction(f) = limit {
                if !(f > 0.0 && f <= 1.0) {
                    return Err(EngineError::InvalidInput(format!(
                        "gpu_memory_utilization {f}: a fraction in (0, 1]"
                    )));
                }
            }
            backend.limit_kv_memory(limit)?;
        }
        let kv_specs = decoder.layers.iter().map(|l| l.attn.kv.clone()).collect();

        let config_max = spec.max_position_embeddings;
        let max_context = options
            .max_context
            .map_or(config_max, |m| m.min(config_max));
        let generation = dir.join("generation_config.json");
        let (eos_token_ids, generation_defaults) = if generation.is_file() {
            let g = ConfigJson::from_path(&generation)?;
            let eos = match g.token_ids("eos_token_id")? {
                ids if ids.is_empty() => cfg.token_ids("eos_token_id")?,
                ids => ids,
            };
            let defaults = GenerationDefaults {
                temperature: g.opt_f64("temperature")?.map(|v| v as f32),
                top_p: g.opt_f64("top_p")?.map(|v| v as f32),
                top_k: g.opt_usize("top_k")?,
                do_sample: g.opt_bool("do_sample")?,
            };
            (eos, defaults)
        } else {
            (
                cfg.token_ids("eos_token_id")?,
                GenerationDefaults::default(),
            )
        };
        let bos_token_id = cfg.token_ids("bos_token_id")?.first().copied();
        let info = ModelInfo {
            dir: dir.to_path_buf(),
            architecture: spec.architecture.clone(),
            family: spec.family,
            vocab_size: spec.vocab_size,
            hidden_size: spec.hidden_size,
            num_layers: decoder.layers.len(),
            max_context,
            bos_token_id,
            eos_token_ids,
            generation_defaults,
            weight_bytes: ckpt.tensors().map(|t| t.info.byte_len() as u64).sum(),
            backend: backend.name(),
        };
        Ok(Self {
            backend,
            decoder,
            kv_specs,
            info,
            options,
            _checkpoint: ckpt,
        })
    }

    /// What the model is.
    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// The options it was loaded with.
    pub fn options(&self) -> &ModelOptions {
        &self.options
    }

    /// The backend it runs on.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The KV cache layout of each layer.
    pub fn kv_specs(&self) -> &[KvLayerSpec] {
        &self.kv_specs
    }

    /// The memory of the KV caches on the model's backend ([`Backend::kv_memory`]).
    pub fn kv_memory(&self) -> crate::backend::KvMemory {
        self.backend.kv_memory()
    }

    /// A new session with an empty KV cache.
    pub fn new_session(&self) -> Result<Session<'_, B>> {
        Session::new(self)
    }

    pub(crate) fn decoder(&self) -> &Decoder<B> {
        &self.decoder
    }
}
