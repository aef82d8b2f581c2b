//! Model families: how each reads its `config.json` and names its tensors. The forward pass they
//! share lives in `decoder` (crate-private).

pub(crate) mod decoder;
pub(crate) mod laguna;
pub(crate) mod llama;

use crate::config::ConfigJson;
use crate::error::Result;

/// The architectures (`config.json` `architectures[0]`) the engine runs.
pub const SUPPORTED_ARCHITECTURES: [&str; 4] = [
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "LagunaForCausalLM",
];

/// The code path a supported architecture takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Dense Llama-style decoders (Llama, SmolLM2, Mistral, Qwen2).
    Llama,
    /// Laguna MoE.
    Laguna,
}

impl Family {
    /// The family of an architecture name, if supported.
    pub fn of(architecture: &str) -> Option<Self> {
        match architecture {
            "LlamaForCausalLM" | "MistralForCausalLM" | "Qwen2ForCausalLM" => Some(Family::Llama),
            "LagunaForCausalLM" => Some(Family::Laguna),
            _ => None,
        }
    }
}

/// `true` for each sliding-attention layer, from `layer_types`.
pub(crate) fn layer_types(cfg: &ConfigJson, n_layers: usize) -> Result<Vec<bool>> {
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
