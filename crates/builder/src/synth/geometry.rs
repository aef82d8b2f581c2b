//! The shape of a Laguna model, read from its `config.json`: exactly what naming and sizing
//! every tensor of the checkpoint needs (laguna.md §1, §3.1).

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
    /// Reads the geometry of a Laguna `config.json` (`model_type` `"laguna"`). Missing optional
    /// keys take transformers' defaults: heads per layer = `num_attention_heads`, MLP types from
    /// `mlp_layer_types`, else `mlp_only_layers`, else layer 0 dense; `gating` true (per head).
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
        let size = |key: &str| -> Result<usize, BuilderError> {
            match config.get(key) {
                Some(v) => v
                    .as_u64()
                    .filter(|&n| n > 0)
                    .map(|n| n as usize)
                    .ok_or_else(|| err(key, format!("expected a positive integer, found {v}"))),
                None => Err(err(key, "missing".into())),
            }
        };
        let hidden_size = size("hidden_size")?;
        let n_layers = size("num_hidden_layers")?;
        let head_dim = size("head_dim")?;
        let kv_heads = size("num_key_value_heads")?;
        let vocab_size = size("vocab_size")?;

        let list = |key: &str| -> Result<Option<&Vec<Value>>, BuilderError> {
            match config.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::Array(a)) if a.len() == n_layers => Ok(Some(a)),
                Some(Value::Array(a)) => Err(err(
                    key,
                    format!("{} entries for {n_layers} layers", a.len()),
                )),
                Some(v) => Err(err(key, format!("expected a list, found {v}"))),
            }
        };

        let full: Vec<bool> = match list("layer_types")? {
            Some(types) => types
                .iter()
                .map(|t| match t.as_str() {
                    Some("full_attention") => Ok(true),
                    Some("sliding_attention") => Ok(false),
                    _ => Err(err("layer_types", format!("unknown layer type {t}"))),
                })
                .collect::<Result<_, _>>()?,
            None => vec![true; n_layers],
        };
        let heads: Vec<usize> = match list("num_attention_heads_per_layer")? {
            Some(h) => h
                .iter()
                .map(|v| {
                    v.as_u64()
                        .filter(|&n| n > 0)
                        .map(|n| n as usize)
                        .ok_or_else(|| {
                            err(
                                "num_attention_heads_per_layer",
                                format!("expected positive integers, found {v}"),
                            )
                        })
                })
                .collect::<Result<_, _>>()?,
            None => vec![size("num_attention_heads")?; n_layers],
        };
        let dense: Vec<bool> = match list("mlp_layer_types")? {
            Some(types) => types
                .iter()
                .map(|t| match t.as_str() {
                    Some("dense") => Ok(true),
                    Some("sparse") => Ok(false),
                    _ => Err(err("mlp_layer_types", format!("unknown MLP type {t}"))),
                })
                .collect::<Result<_, _>>()?,
            None => match config.get("mlp_only_layers").and_then(Value::as_array) {
                Some(only) => {
                    let only: Vec<u64> = only.iter().filter_map(Value::as_u64).collect();
                    (0..n_layers).map(|i| only.contains(&(i as u64))).collect()
                }
                None => (0..n_layers).map(|i| i == 0).collect(),
            },
        };
        let per_head_gate = match config.get("gating") {
            None | Some(Value::Bool(true)) => Some(true),
            Some(Value::Bool(false)) | Some(Value::Null) => None,
            Some(Value::String(s)) => match s.replace('_', "-").to_ascii_lowercase().as_str() {
                "per-head" | "head" | "true" => Some(true),
                "per-element" | "element" => Some(false),
                "false" | "none" | "off" => None,
                _ => return Err(err("gating", format!("unknown gating mode {s:?}"))),
            },
            Some(v) => return Err(err("gating", format!("unexpected value {v}"))),
        };

        let any_dense = dense.iter().any(|&d| d);
        let any_moe = dense.iter().any(|&d| !d);
        let intermediate = if any_dense {
            size("intermediate_size")?
        } else {
            0
        };
        let (num_experts, moe_intermediate) = if any_moe {
            (size("num_experts")?, size("moe_intermediate_size")?)
        } else {
            (0, 0)
        };
        let shared_intermediate = match config.get("shared_expert_intermediate_size") {
            Some(v) if v.as_u64() == Some(0) || v.is_null() => None,
            Some(_) if any_moe => Some(size("shared_expert_intermediate_size")?),
            _ => None,
        };
        let tie_word_embeddings = config
            .get("tie_word_embeddings")
            .and_then(Value::as_bool)
            .unwrap_or(false);

        let layers = (0..n_layers)
            .map(|i| LayerGeometry {
                full_attention: full[i],
                q_heads: heads[i],
                gate_rows: per_head_gate.map(|per_head| {
                    if per_head {
                        heads[i]
                    } else {
                        heads[i] * head_dim
                    }
                }),
                dense_intermediate: dense[i].then_some(intermediate),
            })
            .collect();
        Ok(Self {
            hidden_size,
            head_dim,
            kv_heads,
            vocab_size,
            num_experts,
            moe_intermediate,
            shared_intermediate,
            tie_word_embeddings,
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
