//! The model's shape, read from an HF `config.json`: exactly what byte accounting needs.
//!
//! Understood families: Laguna (per-layer head counts, sliding/full layer types, per-head output
//! gate, dense layer(s) + MoE with a shared expert and a biased router) and Llama/Qwen-style
//! decoders (dense or Qwen-MoE). Other `model_type`s still parse here (head counts, experts and
//! layer types are generic keys), but [`super::layout`] refuses to invent their tensor names.

use serde_json::Value;

use crate::BuilderError;

/// Attention span of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionKind {
    /// Attends to every previous token: its KV cache grows with the context.
    Full,
    /// Attends to the last `sliding_window` tokens: its KV cache is capped.
    Sliding,
}

/// The MLP of one layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mlp {
    /// A dense SwiGLU (`gate_proj`, `up_proj`, `down_proj`) of this intermediate size.
    Dense {
        /// Intermediate size.
        intermediate: u64,
    },
    /// A routed mixture of experts.
    Moe(MoeArch),
}

/// One MoE layer's shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoeArch {
    /// Routed experts.
    pub experts: u64,
    /// Experts used per token (`num_experts_per_tok`).
    pub top_k: u64,
    /// Intermediate size of one routed expert.
    pub intermediate: u64,
    /// Intermediate size of the always-on shared expert, if there is one.
    pub shared_intermediate: Option<u64>,
    /// Whether the shared expert has a sigmoid gate (`shared_expert_gate`, Qwen2-MoE).
    pub shared_gate: bool,
    /// Whether the router has an `e_score_correction_bias` (Laguna, F32).
    pub router_bias: bool,
}

/// One decoder layer's shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerArch {
    /// Full or sliding-window attention.
    pub attention: AttentionKind,
    /// Query heads.
    pub q_heads: u64,
    /// Key/value heads.
    pub kv_heads: u64,
    /// Output-gate width (`g_proj` rows), if the layer has one.
    pub gate_width: Option<u64>,
    /// Whether q and k are RMS-normed per head (`q_norm`, `k_norm`).
    pub qk_norm: bool,
    /// Whether q/k/v have biases.
    pub qkv_bias: bool,
    /// Whether o has a bias.
    pub o_bias: bool,
    /// The layer's MLP.
    pub mlp: Mlp,
}

/// A decoder-only model's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Architecture {
    /// `model_type`.
    pub model_type: String,
    /// `architectures`.
    pub architectures: Vec<String>,
    /// Residual width.
    pub hidden_size: u64,
    /// Vocabulary rows of the embedding and `lm_head`.
    pub vocab_size: u64,
    /// Per-head dimension.
    pub head_dim: u64,
    /// Whether `lm_head` is the embedding matrix (no `lm_head.weight` tensor).
    pub tie_word_embeddings: bool,
    /// safetensors dtype of unquantized weights (`BF16`, `F16`, `F32`).
    pub dtype: String,
    /// `max_position_embeddings`, if given.
    pub max_position_embeddings: Option<u64>,
    /// `sliding_window`, if any layer slides.
    pub sliding_window: Option<u64>,
    /// The layers, in order.
    pub layers: Vec<LayerArch>,
}

impl Architecture {
    /// Reads the shape from a parsed `config.json`; `source` names it in errors.
    pub fn from_config(config: &Value, source: &str) -> Result<Self, BuilderError> {
        let f = Fields { v: config, source };
        let model_type = f.str_opt("model_type")?.unwrap_or_default();
        let laguna = model_type == "laguna";
        let hidden_size = f.u64_req("hidden_size")?;
        let n_layers = f.u64_req("num_hidden_layers")? as usize;
        let heads = f.u64_req("num_attention_heads")?;
        let kv = f.u64_opt("num_key_value_heads")?.unwrap_or(heads);
        let head_dim = match f.u64_opt("head_dim")? {
            Some(d) => d,
            None if heads > 0 && hidden_size % heads == 0 => hidden_size / heads,
            None => return Err(f.err("head_dim", "missing and hidden_size / heads is not whole")),
        };
        let heads_per_layer = f.u64_list("num_attention_heads_per_layer", n_layers)?;
        let kv_per_layer = f.u64_list("num_key_value_heads_per_layer", n_layers)?;
        let layer_types = f.str_list("layer_types", n_layers)?;
        let mlp_types = f.str_list("mlp_layer_types", n_layers)?;
        let mlp_only = f.u64_list_any("mlp_only_layers")?.unwrap_or_default();
        let sparse_step = f.u64_opt("decoder_sparse_step")?.unwrap_or(1).max(1);
        let experts = match f.u64_opt("num_experts")? {
            Some(e) => Some(e),
            None => match f.u64_opt("num_local_experts")? {
                Some(e) => Some(e),
                None => f.u64_opt("n_routed_experts")?,
            },
        }
        .filter(|&e| e > 0);
        let gating = gating_per_layer(&f, n_layers, laguna)?;

        let sliding_window = f.u64_opt("sliding_window")?;
        let all_slide = layer_types.is_none()
            && sliding_window.is_some()
            && match config.get("use_sliding_window") {
                Some(Value::Bool(b)) => *b,
                _ => matches!(model_type.as_str(), "mistral" | "mixtral"),
            };

        let qk_norm = laguna || matches!(model_type.as_str(), "qwen3" | "qwen3_moe" | "olmo2");
        let qwen2 = matches!(model_type.as_str(), "qwen2" | "qwen2_moe");
        let attention_bias = f.bool_opt("attention_bias")?.unwrap_or(false);
        let qkv_bias = qwen2 || f.bool_opt("qkv_bias")?.unwrap_or(attention_bias);
        let o_bias = !qwen2 && attention_bias;

        let moe = match experts {
            Some(experts) => {
                let shared = f
                    .u64_opt("shared_expert_intermediate_size")?
                    .filter(|&s| s > 0);
                Some(MoeArch {
                    experts,
                    top_k: f.u64_req("num_experts_per_tok")?,
                    intermediate: f.u64_req("moe_intermediate_size")?,
                    shared_intermediate: shared,
                    shared_gate: model_type == "qwen2_moe" && shared.is_some(),
                    router_bias: laguna,
                })
            }
            None => None,
        };

        let mut layers = Vec::with_capacity(n_layers);
        for i in 0..n_layers {
            let attention = match layer_types.as_ref().map(|t| t[i].as_str()) {
                Some("full_attention") => AttentionKind::Full,
                Some("sliding_attention") => AttentionKind::Sliding,
                Some(other) => {
                    return Err(f.err(
                        &format!("layer_types[{i}]"),
                        &format!("unsupported layer type {other:?}"),
                    ))
                }
                None if all_slide => AttentionKind::Sliding,
                None => AttentionKind::Full,
            };
            if attention == AttentionKind::Sliding && sliding_window.is_none() {
                return Err(f.err("sliding_window", "missing, but some layers slide"));
            }
            let q_heads = heads_per_layer.as_ref().map_or(heads, |h| h[i]);
            let sparse = match mlp_types.as_ref().map(|t| t[i].as_str()) {
                Some("dense") => false,
                Some("sparse" | "moe") => true,
                Some(other) => {
                    return Err(f.err(
                        &format!("mlp_layer_types[{i}]"),
                        &format!("unsupported MLP type {other:?}"),
                    ))
                }
                None => {
                    moe.is_some()
                        && !mlp_only.contains(&(i as u64))
                        && (i as u64 + 1).is_multiple_of(sparse_step)
                }
            };
            let mlp = match (&moe, sparse) {
                (Some(m), true) => Mlp::Moe(m.clone()),
                (None, true) => {
                    return Err(f.err("num_experts", "missing, but some layers are sparse"))
                }
                (_, false) => Mlp::Dense {
                    intermediate: f.u64_req("intermediate_size")?,
                },
            };
            layers.push(LayerArch {
                attention,
                q_heads,
                kv_heads: kv_per_layer.as_ref().map_or(kv, |k| k[i]),
                gate_width: gating[i].map(|g| g.width(q_heads, head_dim)),
                qk_norm,
                qkv_bias,
                o_bias,
                mlp,
            });
        }

        let dtype = match f.str_opt("torch_dtype")?.or(f.str_opt("dtype")?).as_deref() {
            None | Some("bfloat16") => "BF16",
            Some("float16") => "F16",
            Some("float32") => "F32",
            Some(other) => return Err(f.err("torch_dtype", &format!("unsupported {other:?}"))),
        };

        Ok(Self {
            architectures: match config.get("architectures") {
                Some(Value::Array(a)) => a
                    .iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect(),
                _ => Vec::new(),
            },
            model_type,
            hidden_size,
            vocab_size: f.u64_req("vocab_size")?,
            head_dim,
            tie_word_embeddings: f.bool_opt("tie_word_embeddings")?.unwrap_or(false),
            dtype: dtype.to_string(),
            max_position_embeddings: f.u64_opt("max_position_embeddings")?,
            sliding_window: if layers.iter().any(|l| l.attention == AttentionKind::Sliding) {
                sliding_window
            } else {
                None
            },
            layers,
        })
    }

    /// The first MoE layer's shape, if any layer is MoE.
    pub fn moe(&self) -> Option<&MoeArch> {
        self.layers.iter().find_map(|l| match &l.mlp {
            Mlp::Moe(m) => Some(m),
            Mlp::Dense { .. } => None,
        })
    }
}

/// Output-gate kinds.
#[derive(Debug, Clone, Copy)]
enum Gate {
    PerHead,
    PerElement,
}

impl Gate {
    fn width(self, heads: u64, head_dim: u64) -> u64 {
        match self {
            Gate::PerHead => heads,
            Gate::PerElement => heads * head_dim,
        }
    }

    fn parse(v: &Value) -> Result<Option<Self>, String> {
        match v {
            Value::Null | Value::Bool(false) => Ok(None),
            Value::Bool(true) => Ok(Some(Gate::PerHead)),
            Value::String(s) => match s.replace('-', "_").as_str() {
                "per_head" | "headwise" => Ok(Some(Gate::PerHead)),
                "per_element" | "elementwise" => Ok(Some(Gate::PerElement)),
                "none" | "" => Ok(None),
                other => Err(format!("unknown gating {other:?}")),
            },
            other => Err(format!("unknown gating {other}")),
        }
    }
}

/// Laguna's output gate per layer: `gating_types[i]`, else `gating`, else per-head (the reference
/// module hard-codes it). Other families have no gate.
fn gating_per_layer(f: &Fields, n: usize, laguna: bool) -> Result<Vec<Option<Gate>>, BuilderError> {
    if !laguna {
        return Ok(vec![None; n]);
    }
    if let Some(Value::Array(types)) = f.v.get("gating_types") {
        if types.len() != n {
            return Err(f.err(
                "gating_types",
                &format!("has {} entries, want {n}", types.len()),
            ));
        }
        return types
            .iter()
            .enumerate()
            .map(|(i, t)| Gate::parse(t).map_err(|r| f.err(&format!("gating_types[{i}]"), &r)))
            .collect();
    }
    let gate = match f.v.get("gating") {
        Some(v) => Gate::parse(v).map_err(|r| f.err("gating", &r))?,
        None => Some(Gate::PerHead),
    };
    Ok(vec![gate; n])
}

/// Typed reads from a JSON object, with errors that name the field.
pub(crate) struct Fields<'a> {
    pub(crate) v: &'a Value,
    pub(crate) source: &'a str,
}

impl Fields<'_> {
    pub(crate) fn err(&self, field: &str, reason: &str) -> BuilderError {
        BuilderError::Config {
            source_name: self.source.to_string(),
            field: field.to_string(),
            reason: reason.to_string(),
        }
    }

    pub(crate) fn u64_opt(&self, key: &str) -> Result<Option<u64>, BuilderError> {
        match self.v.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| self.err(key, &format!("expected a non-negative integer, got {v}"))),
        }
    }

    pub(crate) fn u64_req(&self, key: &str) -> Result<u64, BuilderError> {
        self.u64_opt(key)?.ok_or_else(|| self.err(key, "missing"))
    }

    pub(crate) fn bool_opt(&self, key: &str) -> Result<Option<bool>, BuilderError> {
        match self.v.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.err(key, &format!("expected a boolean, got {v}"))),
        }
    }

    pub(crate) fn str_opt(&self, key: &str) -> Result<Option<String>, BuilderError> {
        match self.v.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(v) => Err(self.err(key, &format!("expected a string, got {v}"))),
        }
    }

    fn array(&self, key: &str, len: Option<usize>) -> Result<Option<&Vec<Value>>, BuilderError> {
        match self.v.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Array(a)) => match len {
                Some(n) if a.len() != n => {
                    Err(self.err(key, &format!("has {} entries, want {n}", a.len())))
                }
                _ => Ok(Some(a)),
            },
            Some(v) => Err(self.err(key, &format!("expected a list, got {v}"))),
        }
    }

    fn u64_items(&self, key: &str, a: &[Value]) -> Result<Vec<u64>, BuilderError> {
        a.iter()
            .map(|v| {
                v.as_u64()
                    .ok_or_else(|| self.err(key, &format!("expected integers, got {v}")))
            })
            .collect()
    }

    fn u64_list(&self, key: &str, len: usize) -> Result<Option<Vec<u64>>, BuilderError> {
        self.array(key, Some(len))?
            .map(|a| self.u64_items(key, a))
            .transpose()
    }

    fn u64_list_any(&self, key: &str) -> Result<Option<Vec<u64>>, BuilderError> {
        self.array(key, None)?
            .map(|a| self.u64_items(key, a))
            .transpose()
    }

    fn str_list(&self, key: &str, len: usize) -> Result<Option<Vec<String>>, BuilderError> {
        self.array(key, Some(len))?
            .map(|a| {
                a.iter()
                    .map(|v| {
                        v.as_str()
                            .map(str::to_string)
                            .ok_or_else(|| self.err(key, &format!("expected strings, got {v}")))
                    })
                    .collect()
            })
            .transpose()
    }
}
