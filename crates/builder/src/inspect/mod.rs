//! `inspect`: account for a checkpoint's bytes, and what they cost per decoded token.
//!
//! Decode at batch 1 is memory-bound: tok/s ≤ bandwidth ÷ bytes read per token. So the report
//! lists, per component (embedding, attention q/k/v/o/gate, norms, router, routed and shared
//! experts, dense MLP, lm_head) and precision: parameters, bytes, and bytes read per decoded token
//! (every dense weight once, top-k of E routed experts per MoE layer, one embedding row, all of
//! lm_head); then the KV cache per token and per sequence; then the decode ceiling on a few
//! devices. Two reports compare side by side ([`Comparison`]), e.g. stock vs lean.
//!
//! The tensor set comes either from `config.json` alone (the architecture gives the BF16 layout,
//! `quantization_config` says which modules become NVFP4/FP8: [`Inspector::inspect_config`]) or
//! from safetensors headers ([`Inspector::inspect_tensors`]).

mod arch;
mod components;
mod hardware;
mod kv;
mod layout;
mod quant;
mod render;
mod report;
mod table;
mod tensor;
mod traffic;

use std::path::Path;

use fp4forge_format::checkpoint::CONFIG_FILE_NAME;
use fp4forge_format::Checkpoint;
use serde_json::Value;

pub use arch::{Architecture, AttentionKind, LayerArch, Mlp, MoeArch};
pub use components::{place, Component, Placement, Precision};
pub use hardware::{CeilingAt, HardwareProfile, RooflineRow};
pub use kv::{KvAtContext, KvDtype, KvLayerGroup, KvReport};
pub use layout::unquantized_tensors;
pub use quant::{QuantConfig, QuantGroup, WeightScheme};
pub use report::{
    Basis, Comparison, ComponentDelta, GroupSummary, ModelSummary, QuantSummary, Report, SpeedupAt,
};
pub use tensor::{dtype_bits, TensorDesc};
pub use traffic::{ComponentRow, Totals};

use crate::BuilderError;

/// Context lengths the KV cache and ceilings are shown at: 4K, 32K, 128K, 256K, 1M tokens
/// (each capped at `max_position_embeddings`).
pub const DEFAULT_CONTEXTS: &[u64] = &[4096, 32768, 131_072, 262_144, 1_048_576];

/// Builds [`Report`]s: which devices and context lengths to show.
#[derive(Debug, Clone)]
pub struct Inspector {
    hardware: Vec<HardwareProfile>,
    contexts: Vec<u64>,
}

impl Default for Inspector {
    fn default() -> Self {
        Self {
            hardware: HardwareProfile::builtins(),
            contexts: DEFAULT_CONTEXTS.to_vec(),
        }
    }
}

impl Inspector {
    /// The built-in devices and [`DEFAULT_CONTEXTS`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Shows these devices instead of the built-ins.
    pub fn hardware(mut self, hardware: Vec<HardwareProfile>) -> Self {
        self.hardware = hardware;
        self
    }

    /// Shows the KV cache and ceilings at these context lengths instead of the defaults.
    pub fn contexts(mut self, contexts: Vec<u64>) -> Self {
        self.contexts = contexts;
        self
    }

    /// Inspects a `config.json` file (tensor set derived from it), or a checkpoint directory: its
    /// `config.json` with the safetensors headers when there are weights, else the config alone.
    pub fn inspect_path(&self, path: &Path) -> Result<Report, BuilderError> {
        let (file, dir) = if path.is_dir() {
            (path.join(CONFIG_FILE_NAME), Some(path))
        } else {
            (path.to_path_buf(), None)
        };
        let text = std::fs::read_to_string(&file).map_err(|source| BuilderError::Io {
            path: file.clone(),
            source,
        })?;
        let config: Value = serde_json::from_str(&text).map_err(|source| BuilderError::Json {
            path: file.clone(),
            source,
        })?;
        match dir.filter(|d| has_weights(d)) {
            Some(dir) => {
                let ckpt = Checkpoint::open(dir)?;
                let tensors = ckpt.tensors().map(|t| {
                    TensorDesc::new(
                        t.info.name.clone(),
                        t.info.dtype.to_string(),
                        t.info.shape.iter().map(|&d| d as u64).collect(),
                    )
                });
                self.inspect_tensors(&config, &dir.display().to_string(), tensors)
            }
            None => self.inspect_config(&config, &file.display().to_string()),
        }
    }

    /// Inspects a parsed `config.json`, deriving the tensor set from the architecture and its
    /// `quantization_config`; `source` names it in the report and in errors.
    pub fn inspect_config(&self, config: &Value, source: &str) -> Result<Report, BuilderError> {
        let arch = Architecture::from_config(config, source)?;
        let quant = QuantConfig::from_config(config, source)?;
        let mut tensors = unquantized_tensors(&arch, source)?;
        if let Some(q) = &quant {
            tensors = q.apply(&arch, tensors)?;
        }
        self.report(&arch, quant.as_ref(), &tensors, source, Basis::Config)
    }

    /// Inspects a checkpoint from its `config.json` and its tensors' header entries (names,
    /// dtypes, shapes), exactly as stored, after validating them ([`crate::validate`]: a
    /// checkpoint that `quantize` and `verify` refuse is refused here too).
    pub fn inspect_tensors<I>(
        &self,
        config: &Value,
        source: &str,
        tensors: I,
    ) -> Result<Report, BuilderError>
    where
        I: IntoIterator<Item = TensorDesc>,
    {
        let tensors: Vec<TensorDesc> = tensors.into_iter().collect();
        let checked = crate::validate::validate(config, source, Some(&tensors))?;
        self.report(
            &checked.shape,
            checked.quant.as_ref(),
            &tensors,
            source,
            Basis::Headers,
        )
    }

    fn report(
        &self,
        arch: &Architecture,
        quant: Option<&QuantConfig>,
        tensors: &[TensorDesc],
        source: &str,
        basis: Basis,
    ) -> Result<Report, BuilderError> {
        let (components, totals) = traffic::account(arch, tensors)?;
        let kv_dtype = match quant.and_then(|q| q.kv_cache_bits) {
            Some(8) => KvDtype::Fp8,
            _ => KvDtype::Bf16,
        };
        let kv_cache = kv::kv_report(arch, kv_dtype, &self.contexts);
        let roofline = hardware::roofline(&self.hardware, totals.bytes_per_token, &kv_cache);
        Ok(Report {
            source: source.to_string(),
            basis,
            model: ModelSummary::of(arch),
            quantization: quant.map(QuantSummary::of),
            components,
            totals,
            kv_cache,
            roofline,
        })
    }
}

/// Whether a directory holds safetensors weights (an index or any `*.safetensors` file).
fn has_weights(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries.flatten().any(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.ends_with(".safetensors") || name.ends_with(".safetensors.index.json")
        })
    })
}
