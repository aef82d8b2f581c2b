//! Which part of the model a tensor belongs to, and at what precision it is stored.

use std::collections::HashMap;
use std::fmt;

use serde::{Serialize, Serializer};

use super::tensor::TensorDesc;
use crate::plan::is_embedding_module;

/// A part of the model, as byte accounting groups it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Component {
    /// Input embedding table (one row read per token).
    Embedding,
    /// Attention query projection.
    AttnQ,
    /// Attention key projection.
    AttnK,
    /// Attention value projection.
    AttnV,
    /// Fused `qkv_proj`.
    AttnQkv,
    /// Attention output projection.
    AttnO,
    /// Attention output gate (`g_proj`).
    AttnGate,
    /// KV-cache quantization scales (`k_scale`, `v_scale`).
    KvScales,
    /// RMS/layer norms (per layer, q/k, final).
    Norms,
    /// MoE router (`mlp.gate`) and its `e_score_correction_bias`.
    Router,
    /// Routed experts (top-k of E read per token).
    RoutedExperts,
    /// Always-on shared expert (and its gate, if any).
    SharedExpert,
    /// Dense MLP layers.
    DenseMlp,
    /// Output projection.
    LmHead,
    /// `lm_head` tied to the embedding: no bytes of its own, but the whole table is read.
    LmHeadTied,
    /// Anything not recognised.
    Other,
}

impl Component {
    /// Whether this is part of attention's weights (q, k, v, o, gate).
    pub fn is_attention(self) -> bool {
        matches!(
            self,
            Self::AttnQ | Self::AttnK | Self::AttnV | Self::AttnQkv | Self::AttnO | Self::AttnGate
        )
    }

    /// Short human name.
    pub fn label(self) -> &'static str {
        match self {
            Self::Embedding => "embedding",
            Self::AttnQ => "attn q_proj",
            Self::AttnK => "attn k_proj",
            Self::AttnV => "attn v_proj",
            Self::AttnQkv => "attn qkv_proj",
            Self::AttnO => "attn o_proj",
            Self::AttnGate => "attn g_proj (gate)",
            Self::KvScales => "kv-cache scales",
            Self::Norms => "norms",
            Self::Router => "router (+bias)",
            Self::RoutedExperts => "routed experts",
            Self::SharedExpert => "shared expert",
            Self::DenseMlp => "dense mlp",
            Self::LmHead => "lm_head",
            Self::LmHeadTied => "lm_head (tied)",
            Self::Other => "other",
        }
    }
}

impl fmt::Display for Component {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// Storage precision of a module (all its tensors, scales included).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Precision {
    /// bfloat16.
    Bf16,
    /// float16.
    F16,
    /// float32.
    F32,
    /// FP8 (E4M3/E5M2) weights with their scales.
    Fp8,
    /// NVFP4 weights with 16-bit activations (no `input_global_scale`): 4.5 bits/weight.
    Nvfp4A16,
    /// NVFP4 W4A4 (with `input_global_scale`): 4.5 bits/weight.
    Nvfp4,
    /// Packed integer weights (`weight_packed` without a global scale).
    IntPacked,
    /// Any other dtype, by its safetensors name.
    Other(String),
}

impl Precision {
    /// The precision of a plain tensor of this safetensors dtype.
    pub fn of_dtype(dtype: &str) -> Self {
        match dtype {
            "BF16" => Self::Bf16,
            "F16" => Self::F16,
            "F32" => Self::F32,
            "F8_E4M3" | "F8_E5M2" => Self::Fp8,
            other => Self::Other(other.to_string()),
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Bf16 => "bf16",
            Self::F16 => "f16",
            Self::F32 => "f32",
            Self::Fp8 => "fp8",
            Self::Nvfp4A16 => "nvfp4a16",
            Self::Nvfp4 => "nvfp4 (w4a4)",
            Self::IntPacked => "int-packed",
            Self::Other(d) => d,
        })
    }
}

impl Serialize for Precision {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Where a tensor sits: its component and layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// The component.
    pub component: Component,
    /// Decoder layer index, if the tensor is inside `layers.N`.
    pub layer: Option<usize>,
}

/// Places a tensor by its name (HF checkpoint spelling, plus common variants: `shared_experts`,
/// `block_sparse_moe`, fused `qkv_proj` and 3-D fused `experts.gate_up_proj`).
pub fn place(tensor: &str) -> Placement {
    let parts: Vec<&str> = tensor.split('.').collect();
    let layer = parts
        .windows(2)
        .find(|w| matches!(w[0], "layers" | "h" | "blocks"))
        .and_then(|w| w[1].parse().ok());
    let module = tensor.rsplit_once('.').map_or(tensor, |(m, _)| m);
    let leaf = parts.last().copied().unwrap_or("");
    let has = |seg: &str| parts.contains(&seg);
    let component = if leaf == "e_score_correction_bias" {
        Component::Router
    } else if is_embedding_module(module) {
        Component::Embedding
    } else if has("lm_head") {
        Component::LmHead
    } else if matches!(leaf, "k_scale" | "v_scale" | "q_scale" | "prob_scale") {
        Component::KvScales
    } else if parts
        .iter()
        .any(|p| p.ends_with("norm") || p.ends_with("layernorm") || p.ends_with("_ln"))
    {
        Component::Norms
    } else if has("shared_expert") || has("shared_experts") || has("shared_expert_gate") {
        Component::SharedExpert
    } else if has("experts") {
        Component::RoutedExperts
    } else if (has("mlp") || has("block_sparse_moe")) && (has("gate") || has("router")) {
        Component::Router
    } else if has("q_proj") {
        Component::AttnQ
    } else if has("k_proj") {
        Component::AttnK
    } else if has("v_proj") {
        Component::AttnV
    } else if has("qkv_proj") {
        Component::AttnQkv
    } else if has("o_proj") {
        Component::AttnO
    } else if has("g_proj") {
        Component::AttnGate
    } else if has("mlp") {
        Component::DenseMlp
    } else {
        Component::Other
    };
    Placement { component, layer }
}

/// The precision of every tensor: a module's tensors all take the precision of its weight
/// (`weight_packed` + `weight_global_scale` = NVFP4, W4A4 with `input_global_scale`; otherwise the
/// dtype of `weight`); tensors of a module without a weight take their own dtype's.
pub fn precisions(tensors: &[TensorDesc]) -> Vec<Precision> {
    #[derive(Default)]
    struct Seen<'a> {
        packed: bool,
        global: bool,
        input_global: bool,
        weight: Option<&'a str>,
    }
    let mut modules: HashMap<&str, Seen> = HashMap::new();
    for t in tensors {
        let s = modules.entry(t.module()).or_default();
        match t.leaf() {
            "weight_packed" => s.packed = true,
            "weight_global_scale" => s.global = true,
            "input_global_scale" => s.input_global = true,
            "weight" => s.weight = Some(&t.dtype),
            _ => {}
        }
    }
    tensors
        .iter()
        .map(|t| {
            let s = &modules[t.module()];
            match (s.packed, s.global, s.input_global, s.weight) {
                (true, true, true, _) => Precision::Nvfp4,
                (true, true, false, _) => Precision::Nvfp4A16,
                (true, false, _, _) => Precision::IntPacked,
                (false, _, _, Some(w)) => Precision::of_dtype(w),
                (false, _, _, None) => Precision::of_dtype(&t.dtype),
            }
        })
        .collect()
}

/// Logical parameters a tensor stores: weights and biases count, scales do not; a `weight_packed`
/// holds two 4-bit values per byte (U8) or eight per I32.
pub fn params(t: &TensorDesc) -> u64 {
    match t.leaf() {
        "weight_packed" => match t.dtype.as_str() {
            "I32" | "U32" => t.numel() * 8,
            _ => t.numel() * 2,
        },
        "weight_scale"
        | "weight_global_scale"
        | "input_global_scale"
        | "input_scale"
        | "weight_zero_point"
        | "weight_shape"
        | "k_scale"
        | "v_scale"
        | "q_scale"
        | "prob_scale"
        | "output_scale"
        | "weight_scale_2" => 0,
        _ => t.numel(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement() {
        let c = |n: &str| place(n).component;
        assert_eq!(c("model.embed_tokens.weight"), Component::Embedding);
        assert_eq!(c("lm_head.weight"), Component::LmHead);
        assert_eq!(
            c("model.layers.3.self_attn.q_proj.weight_packed"),
            Component::AttnQ
        );
        assert_eq!(
            c("model.layers.3.self_attn.g_proj.weight"),
            Component::AttnGate
        );
        assert_eq!(
            c("model.layers.3.self_attn.q_norm.weight"),
            Component::Norms
        );
        assert_eq!(c("model.layers.3.self_attn.k_scale"), Component::KvScales);
        assert_eq!(c("model.layers.3.mlp.gate.weight"), Component::Router);
        assert_eq!(
            c("model.layers.3.mlp.experts.e_score_correction_bias"),
            Component::Router
        );
        assert_eq!(
            c("model.layers.3.mlp.experts.7.gate_proj.weight_scale"),
            Component::RoutedExperts
        );
        assert_eq!(
            c("model.layers.3.mlp.experts.gate_up_proj"),
            Component::RoutedExperts
        );
        assert_eq!(
            c("model.layers.3.mlp.shared_expert.down_proj.weight"),
            Component::SharedExpert
        );
        assert_eq!(
            c("model.layers.0.mlp.gate_proj.weight"),
            Component::DenseMlp
        );
        assert_eq!(c("model.norm.weight"), Component::Norms);
        assert_eq!(c("model.layers.0.input_layernorm.weight"), Component::Norms);
        assert_eq!(place("model.layers.17.mlp.gate.weight").layer, Some(17));
    }

    #[test]
    fn module_precision() {
        let t = |n: &str, d: &str| TensorDesc::new(n, d, vec![1]);
        let ts = [
            t("a.weight_packed", "U8"),
            t("a.weight_scale", "F8_E4M3"),
            t("a.weight_global_scale", "F32"),
            t("b.weight_packed", "U8"),
            t("b.weight_global_scale", "F32"),
            t("b.input_global_scale", "F32"),
            t("c.weight", "BF16"),
            t("m.e_score_correction_bias", "F32"),
        ];
        let p = precisions(&ts);
        assert_eq!(p[1], Precision::Nvfp4A16);
        assert_eq!(p[3], Precision::Nvfp4);
        assert_eq!(p[6], Precision::Bf16);
        assert_eq!(p[7], Precision::F32);
    }
}
