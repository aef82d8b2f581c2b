//! The families: each file reads one family's `config.json` into an [`ArchSpec`]. A new family
//! is one more file here, one more [`Family`] variant and its architecture names.

mod laguna;
mod llama;
mod qwen3_moe;

use crate::fields::ConfigJson;
use crate::spec::ArchSpec;
use crate::Result;

/// The architectures (`config.json` `architectures[0]`) a family reads.
pub const SUPPORTED_ARCHITECTURES: &[&str] = &[
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "LagunaForCausalLM",
    "Qwen3MoeForCausalLM",
];

/// A family of architectures that share one config schema and one tensor naming.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// Dense Llama-style decoders (Llama, SmolLM2, Mistral, Qwen2).
    Llama,
    /// Laguna MoE (poolside).
    Laguna,
    /// Qwen3-MoE (`Qwen3MoeForCausalLM`).
    Qwen3Moe,
}

impl Family {
    /// The family of an architecture name, if supported.
    pub fn of(architecture: &str) -> Option<Self> {
        match architecture {
            "LlamaForCausalLM" | "MistralForCausalLM" | "Qwen2ForCausalLM" => Some(Family::Llama),
            "LagunaForCausalLM" => Some(Family::Laguna),
            "Qwen3MoeForCausalLM" => Some(Family::Qwen3Moe),
            _ => None,
        }
    }

    /// Reads `cfg` as this family; `architecture` is its `architectures[0]`.
    pub fn read(self, cfg: &ConfigJson, architecture: &str) -> Result<ArchSpec> {
        match self {
            Family::Llama => llama::read(cfg, architecture),
            Family::Laguna => laguna::read(cfg, architecture),
            Family::Qwen3Moe => qwen3_moe::read(cfg, architecture),
        }
    }
}

/// `true` for each sliding-attention layer, from `layer_types`.
fn layer_types(cfg: &ConfigJson, n_layers: usize) -> Result<Vec<bool>> {
    let types = cfg.str_list("layer_types")?;
    if types.len() != n_layers {
        return Err(cfg.error(
            "layer_types",
            format!("{} entries for {n_layers} layers", types.len()),
        ));
    }
    types
        .iter()
        .enumerate()
        .map(|(i, t)| match t.as_str() {
            "full_attention" => Ok(false),
            "sliding_attention" => Ok(true),
            other => Err(cfg.error(
                "layer_types",
                format!("layer {i}: unknown type {other:?} (full_attention, sliding_attention)"),
            )),
        })
        .collect()
}

/// `sliding_window` when some layer slides (at least 1), else `None`.
fn window(cfg: &ConfigJson, sliding: &[bool]) -> Result<Option<usize>> {
    if !sliding.iter().any(|s| *s) {
        return Ok(None);
    }
    let w = cfg.usize("sliding_window")?;
    if w == 0 {
        return Err(cfg.error("sliding_window", "must be at least 1"));
    }
    Ok(Some(w))
}

/// Checks that `q_heads` is a positive multiple of `kv_heads`; `field` is blamed otherwise.
fn check_gqa(
    cfg: &ConfigJson,
    field: &str,
    layer: Option<usize>,
    q: usize,
    kv: usize,
) -> Result<()> {
    if q == 0 || kv == 0 || !q.is_multiple_of(kv) {
        let at = layer.map_or(String::new(), |i| format!("layer {i}: "));
        return Err(cfg.error(
            field,
            format!("{at}{q} query heads are not a multiple of {kv} KV heads"),
        ));
    }
    Ok(())
}

/// The rope from `rope_parameters`, else `rope_scaling` (transformers 4), else the top-level
/// `rope_theta` alone.
fn single_rope(cfg: &ConfigJson, head_dim: usize, max_pos: usize) -> Result<crate::Rope> {
    let params = if cfg.has("rope_parameters") {
        Some("rope_parameters")
    } else if cfg.has("rope_scaling") {
        Some("rope_scaling")
    } else {
        None
    };
    crate::Rope::from_config(cfg, params, "rope_theta", head_dim, max_pos)
}
