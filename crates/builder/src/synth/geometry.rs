//! The shape of a Laguna model, as `fp4forge_arch` reads it from its `config.json`: exactly what
//! naming and sizing every tensor of the checkpoint needs (laguna.md §1, §3.1).

use std::path::Path;

use fp4forge_arch::{ArchSpec, ConfigJson, Family, MlpSpec, Tied};
use serde_json::{Map, Value};

use crate::BuilderError;

/// Shape of one decoder layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerGeometry {
    /// `full_attention` (true) or `sliding_attention` (false).
    pub full_attention: bool,
    /// Query heads of this layer (`num_attention_heads_per_layer[i]`).
    pub q_heads: usize,
    /// Rows of `self_attn.g_proj` (heads for per-head gating, heads·head_dim per element), or
    /// `None` when the layer has no output gate.
    pub gate_rows: Option<usize>,
    /// Intermediate size of the dense SwiGLU MLP, or `None` for a mixture-of-experts layer.
    pub dense_intermediate: Option<usize>,
}

/// Shape of a whole Laguna model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LagunaGeometry {
    /// Residual stream width.
    pub hidden_size: usize,
    /// Per-head width.
    pub head_dim: usize,
    /// Key/value heads (all layers).
    pub kv_heads: usize,
    /// Vocabulary rows of `embed_tokens` and `lm_head`.
    pub vocab_size: usize,
    /// Routed experts per MoE layer.
    pub num_experts: usize,
    /// Intermediate size of one routed expert.
    pub moe_intermediate: usize,
    /// Intermediate size of the shared expert, `None` when there is none.
    pub shared_intermediate: Option<usize>,
    /// Whether `lm_head` shares the embedding (then no `lm_head.weight` is stored).
    pub tie_word_embeddings: bool,
    /// The decoder layers, in order.
    pub layers: Vec<LayerGeometry>,
}

impl LagunaGeometry {
    /// The geometry of a Laguna `config.json` (`model_type` `"laguna"`), as
    /// [`fp4forge_arch::ArchSpec`] reads it (its Laguna family states every default it takes);
    /// `source` names the config in errors.
    pub fn from_config(config: &Map<String, Value>, source: &str) -> Result<Self, BuilderError> {
        let err = |field: &str, reason: String| BuilderError::Config {
            source_name: source.to_owned(),
            field: field.to_owned(),
            reason,
        };
        let model_type = config.get("model_type").and_then(Value::as_str);
        if model_type != Some("laguna") {
            return Err(err(
                "model_type",
                format!("expected \"laguna\", found {model_type:?}"),
            ));
        }
        let cfg = ConfigJson::from_map(Path::new(source), config.clone());
        let spec = ArchSpec::from_config(&cfg)?;
        if spec.family != Family::Laguna {
            return Err(err(
                "architectures",
                format!("{:?} is not a Laguna architecture", spec.architecture),
            ));
        }
        let moe = spec.first_moe();
        let layers = spec
            .layers
            .iter()
            .map(|l| LayerGeometry {
                full_attention: l.attention.window.is_none(),
                q_heads: l.attention.q_heads,
                gate_rows: l.attention.gate_rows(),
                dense_intermediate: match l.mlp {
                    MlpSpec::Dense { intermediate } => Some(intermediate),
                    MlpSpec::Moe(_) => None,
                },
            })
            .collect();
        let first = spec.layers.first().map(|l| &l.attention);
        Ok(Self {
            hidden_size: spec.hidden_size,
            head_dim: first.map_or(0, |a| a.head_dim),
            kv_heads: first.map_or(0, |a| a.kv_heads),
            vocab_size: spec.vocab_size,
            num_experts: moe.map_or(0, |m| m.experts),
            moe_intermediate: moe.map_or(0, |m| m.intermediate),
            shared_intermediate: moe.and_then(|m| m.shared_intermediate),
            tie_word_embeddings: spec.tie_word_embeddings == Tied::Yes,
            layers,
        })
    }

    /// Whether layer `layer` is a mixture-of-experts layer.
    pub fn is_moe(&self, layer: usize) -> bool {
        self.layers
            .get(layer)
            .is_some_and(|l| l.dense_intermediate.is_none())
    }
}
