//! A model's shape, read leniently: exactly what byte accounting needs.
//!
//! [`ArchSpec`](crate::ArchSpec) is what the engine runs, so it needs every field (ε, rope) and an
//! `architectures[0]` a family reads. Accounting (the builder's `inspect`) needs less and reads
//! more: partial configs (no `rms_norm_eps`, no rope keys, no `architectures`) and `model_type`s
//! the engine does not run (dense `qwen3`, `qwen2_moe`). [`ShapeSpec`] is that reading:
//!
//! - **never read**: `rms_norm_eps`, every rope key, `architectures` (kept as given, may be
//!   absent), everything about routing beyond top-k;
//! - **optional**: `max_position_embeddings`, `model_type` (an unknown or absent one still reads
//!   through the generic keys below, but has no tensor names: [`ShapeSpec::tensors`] refuses);
//! - **generic keys**: `hidden_size`, `num_hidden_layers`, `num_attention_heads` (+
//!   `num_attention_heads_per_layer`), `num_key_value_heads` (+ `_per_layer`; default: no GQA),
//!   `head_dim` (default `hidden_size / num_attention_heads` when whole), `layer_types` else
//!   `sliding_window` + `use_sliding_window`, `mlp_layer_types` else `mlp_only_layers` +
//!   `decoder_sparse_step`, `num_experts` (`num_local_experts`, `n_routed_experts`),
//!   `num_experts_per_tok`, `moe_intermediate_size`, `shared_expert_intermediate_size`,
//!   `intermediate_size` (only when a layer is dense), `attention_bias` / `qkv_bias`,
//!   `tie_word_embeddings` (else `text_config.tie_word_embeddings`; default false), `torch_dtype` / `dtype` (default bfloat16),
//!   `vocab_size`.
//!
//! What a `model_type` adds beyond those keys (q/k norms, Qwen2's q/k/v-only biases, Laguna's
//! output gate and router bias, Qwen2-MoE's shared-expert gate, Mistral's always-sliding bare
//! `sliding_window`) and its tensor names are its family's ([`Family::of_model_type`]).

use std::path::PathBuf;

use serde_json::Value;

use crate::family::Family;
use crate::fields;
use crate::fields::ConfigJson;
use crate::spec::{OutputGate, TensorAliases, Tied};
use crate::Result;

/// Attention span of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionKind {
    /// Attends to every previous token: its KV cache grows with the context.
    Full,
    /// Attends to the last `sliding_window` tokens: its KV cache is capped.
    Sliding,
}

/// The MLP of one layer, as sized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MlpShape {
    /// A dense SwiGLU (`gate_proj`, `up_proj`, `down_proj`) of this intermediate size.
    Dense {
        /// Intermediate size.
        intermediate: u64,
    },
    /// A routed mixture of experts.
    Moe(MoeShape),
}

/// One MoE layer's sizes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoeShape {
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
    /// Whether the router has an `e_score_correction_bias` (Laguna, stored F32).
    pub router_bias: bool,
}

/// One decoder layer's sizes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerShape {
    /// Full or sliding-window attention.
    pub attention: AttentionKind,
    /// Query heads.
    pub q_heads: u64,
    /// Key/value heads.
    pub kv_heads: u64,
    /// Output-gate width (`g_proj` rows), if the layer has a stated gate.
    pub gate_width: Option<u64>,
    /// Whether q and k are RMS-normed per head (`q_norm`, `k_norm`).
    pub qk_norm: bool,
    /// Whether q/k/v have biases.
    pub qkv_bias: bool,
    /// Whether o has a bias.
    pub o_bias: bool,
    /// The layer's MLP.
    pub mlp: MlpShape,
}

/// A decoder-only model's shape (sizes in `u64`: accounting multiplies and sums them).
#[derive(Debug, Clone, PartialEq)]
pub struct ShapeSpec {
    /// The `config.json` (or the label) it was read from; errors name it.
    pub file: PathBuf,
    /// `model_type` (empty when absent).
    pub model_type: String,
    /// `architectures`, as given (empty when absent).
    pub architectures: Vec<String>,
    /// The family whose tensor names `model_type` uses; `None` for an unknown one.
    pub family: Option<Family>,
    /// Residual width.
    pub hidden_size: u64,
    /// Vocabulary rows of the embedding and `lm_head`.
    pub vocab_size: u64,
    /// Per-head dimension.
    pub head_dim: u64,
    /// Whether `lm_head` is the embedding matrix (no `lm_head.weight` tensor): the config says
    /// so ([`ShapeSpec::tied`] is [`Tied::Yes`]).
    pub tie_word_embeddings: bool,
    /// `tie_word_embeddings` as the config states it (at the top level, else in a nested
    /// `text_config`): [`Tied::IfNoLmHead`] when it says nothing.
    pub tied: Tied,
    /// safetensors dtype of unquantized weights (`BF16`, `F16`, `F32`).
    pub dtype: String,
    /// `max_position_embeddings`, if given.
    pub max_position_embeddings: Option<u64>,
    /// `sliding_window`, if any layer slides.
    pub sliding_window: Option<u64>,
    /// The layers, in order.
    pub layers: Vec<LayerShape>,
    /// The family's tensor-name spellings, preferred first (default for an unknown family).
    pub aliases: TensorAliases,
}

/// Reads each layer's output gate from a config with `n_layers` layers.
pub(crate) type GateReader = fn(&ConfigJson, usize) -> Result<Vec<OutputGate>>;

/// What a family adds, for one of its `model_type`s, to the generic keys of a shape read.
#[derive(Debug, Clone, Default)]
pub(crate) struct ShapeRules {
    /// q and k are RMS-normed per head.
    pub qk_norm: bool,
    /// q/k/v always carry biases and o never (Qwen2, Qwen2-MoE), whatever `attention_bias` says.
    pub qkv_bias_only: bool,
    /// Reads the per-layer output gate (Laguna); `None`: no gate.
    pub output_gate: Option<GateReader>,
    /// The router has a selection bias (`e_score_correction_bias`).
    pub router_bias: bool,
    /// A shared expert has a sigmoid gate (`shared_expert_gate`).
    pub shared_expert_gate: bool,
    /// A bare `sliding_window` (no `layer_types`, no `use_sliding_window`) slides every layer.
    pub slide_by_default: bool,
    /// Tensor-name spellings.
    pub aliases: TensorAliases,
}

impl ShapeSpec {
    /// The first MoE layer's sizes, if any layer is MoE.
    pub fn moe(&self) -> Option<&MoeShape> {
        self.layers.iter().find_map(|l| match &l.mlp {
            MlpShape::Moe(m) => Some(m),
            MlpShape::Dense { .. } => None,
        })
    }
}

/// Reads the shape from `cfg` with `family`'s `rules` for `model_type` (see the module doc).
pub(crate) fn read(
    cfg: &ConfigJson,
    model_type: String,
    family: Option<Family>,
    rules: ShapeRules,
) -> Result<ShapeSpec> {
    let req = |key: &str| -> Result<u64> {
        cfg.opt_usize(key)?
            .map(|n| n as u64)
            .ok_or_else(|| cfg.error(key, "missing"))
    };
    let opt = |key: &str| -> Result<Option<u64>> { Ok(cfg.opt_usize(key)?.map(|n| n as u64)) };

    let hidden_size = req("hidden_size")?;
    let n_layers = req("num_hidden_layers")? as usize;
    let heads = req("num_attention_heads")?;
    let kv = opt("num_key_value_heads")?.unwrap_or(heads);
    let head_dim = match opt("head_dim")? {
        Some(d) => d,
        None if heads > 0 && hidden_size.is_multiple_of(heads) => hidden_size / heads,
        None => return Err(cfg.error("head_dim", "missing and hidden_size / heads is not whole")),
    };
    let heads_per_layer = per_layer(cfg, "num_attention_heads_per_layer", n_layers)?;
    let kv_per_layer = per_layer(cfg, "num_key_value_heads_per_layer", n_layers)?;
    // Per layer, read as the families read these lists: sliding? dense?
    let sliding = if cfg.has("layer_types") {
        Some(fields::layer_types(cfg, n_layers)?)
    } else {
        None
    };
    let dense = if cfg.has("mlp_layer_types") {
        Some(fields::mlp_layer_types(cfg, n_layers)?)
    } else {
        None
    };
    let mlp_only = if cfg.has("mlp_only_layers") {
        cfg.usize_list("mlp_only_layers")?
    } else {
        Vec::new()
    };
    let sparse_step = opt("decoder_sparse_step")?.unwrap_or(1).max(1);
    let experts = match opt("num_experts")? {
        Some(e) => Some(e),
        None => match opt("num_local_experts")? {
            Some(e) => Some(e),
            None => opt("n_routed_experts")?,
        },
    }
    .filter(|&e| e > 0);
    let gates = match rules.output_gate {
        Some(read) => read(cfg, n_layers)?,
        None => vec![OutputGate::Absent; n_layers],
    };

    let sliding_window = opt("sliding_window")?;
    let all_slide = sliding.is_none()
        && sliding_window.is_some()
        && cfg
            .get("use_sliding_window")
            .and_then(Value::as_bool)
            .unwrap_or(rules.slide_by_default);

    let attention_bias = cfg.opt_bool("attention_bias")?.unwrap_or(false);
    let qkv_bias = rules.qkv_bias_only || cfg.opt_bool("qkv_bias")?.unwrap_or(attention_bias);
    let o_bias = !rules.qkv_bias_only && attention_bias;

    let moe = match experts {
        Some(experts) => {
            let shared = opt("shared_expert_intermediate_size")?.filter(|&s| s > 0);
            Some(MoeShape {
                experts,
                top_k: req("num_experts_per_tok")?,
                intermediate: req("moe_intermediate_size")?,
                shared_intermediate: shared,
                shared_gate: rules.shared_expert_gate && shared.is_some(),
                router_bias: rules.router_bias,
            })
        }
        None => None,
    };

    let mut layers = Vec::with_capacity(n_layers);
    for i in 0..n_layers {
        let attention = match sliding.as_ref().map(|s| s[i]) {
            Some(false) => AttentionKind::Full,
            Some(true) => AttentionKind::Sliding,
            None if all_slide => AttentionKind::Sliding,
            None => AttentionKind::Full,
        };
        if attention == AttentionKind::Sliding && sliding_window.is_none() {
            return Err(cfg.error("sliding_window", "missing, but some layers slide"));
        }
        let q_heads = heads_per_layer.as_ref().map_or(heads, |h| h[i]);
        let sparse = match dense.as_ref().map(|d| !d[i]) {
            Some(sparse) => sparse,
            None => {
                moe.is_some()
                    && !mlp_only.contains(&i)
                    && (i as u64 + 1).is_multiple_of(sparse_step)
            }
        };
        let mlp = match (&moe, sparse) {
            (Some(m), true) => MlpShape::Moe(m.clone()),
            (None, true) => {
                return Err(cfg.error("num_experts", "missing, but some layers are sparse"))
            }
            (_, false) => MlpShape::Dense {
                intermediate: req("intermediate_size")?,
            },
        };
        let gate_width = match gates[i] {
            OutputGate::PerHead => Some(q_heads),
            OutputGate::PerElement => Some(q_heads * head_dim),
            OutputGate::Absent | OutputGate::IfPresent => None,
        };
        layers.push(LayerShape {
            attention,
            q_heads,
            kv_heads: kv_per_layer.as_ref().map_or(kv, |k| k[i]),
            gate_width,
            qk_norm: rules.qk_norm,
            qkv_bias,
            o_bias,
            mlp,
        });
    }

    let dtype_field = if cfg.has("torch_dtype") {
        "torch_dtype"
    } else {
        "dtype"
    };
    let dtype = match cfg.opt_str(dtype_field)? {
        None | Some("bfloat16") => "BF16",
        Some("float16") => "F16",
        Some("float32") => "F32",
        Some(other) => return Err(cfg.error(dtype_field, format!("unsupported {other:?}"))),
    };
    let architectures = match cfg.get("architectures") {
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    };
    let any_slides = layers.iter().any(|l| l.attention == AttentionKind::Sliding);
    let tie_field = if cfg.has("tie_word_embeddings") {
        "tie_word_embeddings"
    } else {
        "text_config.tie_word_embeddings"
    };
    let tied = match cfg.opt_bool(tie_field)? {
        Some(true) => Tied::Yes,
        Some(false) => Tied::No,
        None => Tied::IfNoLmHead,
    };
    Ok(ShapeSpec {
        file: cfg.file().to_path_buf(),
        model_type,
        architectures,
        family,
        hidden_size,
        vocab_size: req("vocab_size")?,
        head_dim,
        tie_word_embeddings: tied == Tied::Yes,
        tied,
        dtype: dtype.to_owned(),
        max_position_embeddings: opt("max_position_embeddings")?,
        sliding_window: sliding_window.filter(|_| any_slides),
        layers,
        aliases: rules.aliases,
    })
}

/// The rules of a `model_type` no family reads: generic keys only (its tensor names are
/// unknown). Kept from inspect's original reader: OLMo-2 norms q and k, Mixtral's bare
/// `sliding_window` slides every layer.
pub(crate) fn generic_rules(model_type: &str) -> ShapeRules {
    ShapeRules {
        qk_norm: model_type == "olmo2",
        slide_by_default: model_type == "mixtral",
        ..ShapeRules::default()
    }
}

/// An optional per-layer list of integers, `n_layers` long.
fn per_layer(cfg: &ConfigJson, key: &str, n_layers: usize) -> Result<Option<Vec<u64>>> {
    if !cfg.has(key) {
        return Ok(None);
    }
    let v = cfg.usize_list(key)?;
    if v.len() != n_layers {
        return Err(cfg.error(key, format!("{} entries for {n_layers} layers", v.len())));
    }
    Ok(Some(v.into_iter().map(|n| n as u64).collect()))
}
