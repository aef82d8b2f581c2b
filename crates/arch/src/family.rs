//! Which family a config belongs to: the [`Family`] names, the architectures each reads and the
//! `model_type`s whose tensor names it knows. Reading a family's config is `families/`'s.

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

    /// The family whose tensor names a `model_type` uses, if one does: Llama for `llama`,
    /// `mistral`, `qwen2`, `qwen3`; Laguna for `laguna`; Qwen3-MoE for `qwen3_moe` and
    /// `qwen2_moe`. Wider than [`Family::of`]: a shape read needs no engine support.
    pub fn of_model_type(model_type: &str) -> Option<Self> {
        [Family::Laguna, Family::Llama, Family::Qwen3Moe]
            .into_iter()
            .find(|f| f.model_types().contains(&model_type))
    }

    /// The `model_type`s this family's shape read and tensor names cover.
    pub fn model_types(self) -> &'static [&'static str] {
        match self {
            Family::Llama => &["llama", "mistral", "qwen2", "qwen3"],
            Family::Laguna => &["laguna"],
            Family::Qwen3Moe => &["qwen2_moe", "qwen3_moe"],
        }
    }
}

/// Every `model_type` a family covers, family by family.
pub(crate) fn shape_model_types() -> Vec<&'static str> {
    [Family::Laguna, Family::Llama, Family::Qwen3Moe]
        .into_iter()
        .flat_map(|f| f.model_types().iter().copied())
        .collect()
}
