//! Laguna (poolside; `LagunaForCausalLM`): laguna.md §2-§3.
//!
//! Per layer: its own query-head count (`num_attention_heads_per_layer`), full or sliding
//! attention (`layer_types`, `sliding_window`; the key span includes the query), q/k RMSNorm per
//! head before RoPE, NeoX rotation within the partial rotary slice (full layers: YaRN from
//! `rope_parameters.full_attention`, attention_factor scaling cos/sin; sliding layers: default
//! RoPE from `rope_parameters.sliding_attention`), a softplus output gate per head computed from
//! the normed input, and a dense SwiGLU (`mlp_layer_types`/`mlp_only_layers`) or a sigmoid-routed
//! MoE: `e_score_correction_bias` for selection only, renormalised top-k, ×
//! `moe_routed_scaling_factor`, plus an always-on shared expert. Untied `lm_head`.
//!
//! Accepted spellings: experts per expert 2-D (`mlp.experts.E.{gate,up,down}_proj`, bf16 or
//! NVFP4) or fused 3-D (`mlp.experts.gate_up_proj`, `mlp.experts.down_proj`); the bias under
//! `mlp.experts.`, `mlp.gate.` or `mlp.` (absent = zeros); `mlp.shared_expert.` or
//! `mlp.shared_experts.`.

use crate::backend::{AttentionParams, Backend, RouterParams, RouterScoring};
use crate::config::ConfigJson;
use crate::error::Result;
use crate::kv_cache::{KvDtype, KvLayerSpec};
use crate::models::decoder::{Attention, Decoder, Layer, LoadCtx, Mlp, Moe};
use crate::rope::RopeSpec;

/// Reads a Laguna checkpoint.
pub(crate) fn load<B: Backend>(
    cfg: &ConfigJson,
    ctx: &LoadCtx<'_, B>,
    kv_dtype: KvDtype,
) -> Result<Decoder<B>> {
    let hidden = cfg.usize("hidden_size")?;
    let n_layers = cfg.usize("num_hidden_layers")?;
    let kv_heads = cfg.usize("num_key_value_heads")?;
    let head_dim = cfg.usize("head_dim")?;
    let vocab = cfg.usize("vocab_size")?;
    let eps = cfg.f64("rms_norm_eps")? as f32;
    let max_pos = cfg.usize("max_position_embeddings")?;

    for (key, what) in [
        ("swa_attention_sink_enabled", "attention sinks"),
        (
            "moe_apply_router_weight_on_input",
            "router weights on the expert input",
        ),
    ] {
        if cfg.opt_bool(key)?.unwrap_or(false) {
            return Err(cfg.error(key, format!("{what} are not supported")));
        }
    }

    let heads = per_layer_heads(cfg, n_layers)?;
    let layer_types = super::layer_types(cfg, n_layers)?;
    let any_sliding = layer_types.iter().any(|s| *s);
    let window = if any_sliding {
        Some(cfg.usize("sliding_window")?)
    } else {
        None
    };
    if window == Some(0) {
        return Err(cfg.error("sliding_window", "must be at least 1"));
    }

    let mut rope_specs = Vec::new();
    let mut rope_of = [usize::MAX; 2];
    for (sliding, name) in [(false, "full_attention"), (true, "sliding_attention")] {
        if layer_types.contains(&sliding) {
            let path = format!("rope_parameters.{name}");
            let params = if cfg.has(&path) {
                Some(path.as_str())
            } else if cfg.has("rope_parameters") {
                Some("rope_parameters")
            } else {
                None
            };
            rope_of[usize::from(sliding)] = rope_specs.len();
            rope_specs.push(RopeSpec::from_config(
                cfg,
                params,
                "rope_theta",
                head_dim,
                max_pos,
            )?);
        }
    }
    let ropes = rope_specs
        .iter()
        .map(|r| ctx.backend.load_rope(r))
        .collect::<Result<Vec<_>>>()?;

    let dense = mlp_kinds(cfg, n_layers)?;
    let dense_inter = if dense.iter().any(|d| *d) {
        cfg.usize("intermediate_size")?
    } else {
        0
    };
    let moe = if dense.iter().any(|d| !*d) {
        Some(MoeConfig::read(cfg)?)
    } else {
        None
    };
    let gating = match cfg.get("gating") {
        Some(serde_json::Value::Bool(b)) => *b,
        _ => true,
    };

    let embed = ctx.linear("model.embed_tokens", vocab, hidden)?;
    let tied = cfg.opt_bool("tie_word_embeddings")?.unwrap_or(false);
    let lm_head = if tied {
        None
    } else {
        Some(ctx.linear("lm_head", vocab, hidden)?)
    };
    let norm = ctx.vector("model.norm.weight", hidden)?;

    let mut layers = Vec::with_capacity(n_layers);
    for i in 0..n_layers {
        let p = format!("model.layers.{i}");
        let h = heads[i];
        let sliding = layer_types[i];
        let a = format!("{p}.self_attn");
        let gate = if gating || ctx.loader.has_linear(&format!("{a}.g_proj")) {
            let (g, rows, cols) = ctx.linear_any(&format!("{a}.g_proj"))?;
            if cols != hidden || (rows != h && rows != h * head_dim) {
                return Err(ctx.loader.error(
                    &format!("{a}.g_proj.weight"),
                    format!(
                        "shape [{rows}, {cols}]: expected [{h}, {hidden}] (per-head gate) or \
                         [{}, {hidden}] (per-element gate)",
                        h * head_dim
                    ),
                ));
            }
            Some(g)
        } else {
            None
        };
        let scale_of = |name: &str| -> Result<f32> {
            let t = format!("{a}.{name}");
            if ctx.loader.has(&t) {
                ctx.loader.scalar(&t)
            } else {
                Ok(1.0)
            }
        };
        let attn = Attention {
            q: ctx.linear(&format!("{a}.q_proj"), h * head_dim, hidden)?,
            k: ctx.linear(&format!("{a}.k_proj"), kv_heads * head_dim, hidden)?,
            v: ctx.linear(&format!("{a}.v_proj"), kv_heads * head_dim, hidden)?,
            o: ctx.linear(&format!("{a}.o_proj"), hidden, h * head_dim)?,
            q_bias: ctx.opt_vector(&format!("{a}.q_proj.bias"), h * head_dim)?,
            k_bias: ctx.opt_vector(&format!("{a}.k_proj.bias"), kv_heads * head_dim)?,
            v_bias: ctx.opt_vector(&format!("{a}.v_proj.bias"), kv_heads * head_dim)?,
            o_bias: ctx.opt_vector(&format!("{a}.o_proj.bias"), hidden)?,
            q_norm: Some(ctx.vector(&format!("{a}.q_norm.weight"), head_dim)?),
            k_norm: Some(ctx.vector(&format!("{a}.k_norm.weight"), head_dim)?),
            gate,
            rope: rope_of[usize::from(sliding)],
            params: AttentionParams {
                heads: h,
                kv_heads,
                head_dim,
                scale: 1.0 / (head_dim as f32).sqrt(),
            },
            kv: KvLayerSpec {
                kv_heads,
                head_dim,
                window: if sliding { window } else { None },
                dtype: kv_dtype,
                k_scale: scale_of("k_scale")?,
                v_scale: scale_of("v_scale")?,
            },
        };
        if h == 0 || kv_heads == 0 || !h.is_multiple_of(kv_heads) {
            return Err(cfg.error(
                "num_attention_heads_per_layer",
                format!("layer {i}: {h} query heads are not a multiple of {kv_heads} KV heads"),
            ));
        }
        let mlp = if dense[i] {
            Mlp::Dense(ctx.swiglu(&format!("{p}.mlp"), hidden, dense_inter)?)
        } else {
            let m = moe
                .as_ref()
                .ok_or_else(|| cfg.error("mlp_layer_types", "no MoE config"))?;
            Mlp::Moe(m.load(ctx, &p, hidden)?)
        };
        layers.push(Layer {
            input_norm: ctx.vector(&format!("{p}.input_layernorm.weight"), hidden)?,
            post_norm: ctx.vector(&format!("{p}.post_attention_layernorm.weight"), hidden)?,
            attn,
            mlp,
        });
    }
    Ok(Decoder {
        embed,
        lm_head,
        norm,
        eps,
        hidden,
        layers,
        ropes,
    })
}

/// Query heads of each layer.
fn per_layer_heads(cfg: &ConfigJson, n_layers: usize) -> Result<Vec<usize>> {
    if cfg.has("num_attention_heads_per_layer") {
        let h = cfg.usize_list("num_attention_heads_per_layer")?;
        if h.len() != n_layers {
            return Err(cfg.error(
                "num_attention_heads_per_layer",
                format!("{} entries for {n_layers} layers", h.len()),
            ));
        }
        Ok(h)
    } else {
        Ok(vec![cfg.usize("num_attention_heads")?; n_layers])
    }
}

/// `true` for each layer with a dense MLP: `mlp_layer_types` (`dense`/`sparse`), else
/// `mlp_only_layers`.
fn mlp_kinds(cfg: &ConfigJson, n_layers: usize) -> Result<Vec<bool>> {
    if cfg.has("mlp_layer_types") {
        let kinds = cfg.str_list("mlp_layer_types")?;
        if kinds.len() != n_layers {
            return Err(cfg.error(
                "mlp_layer_types",
                format!("{} entries for {n_layers} layers", kinds.len()),
            ));
        }
        return kinds
            .iter()
            .enumerate()
            .map(|(i, k)| match k.as_str() {
                "dense" => Ok(true),
                "sparse" | "moe" => Ok(false),
                other => Err(cfg.error(
                    "mlp_layer_types",
                    format!("layer {i}: unknown MLP type {other:?} (dense, sparse)"),
                )),
            })
            .collect();
    }
    if cfg.has("mlp_only_layers") {
        let dense = cfg.usize_list("mlp_only_layers")?;
        return Ok((0..n_layers).map(|i| dense.contains(&i)).collect());
    }
    Err(cfg.error(
        "mlp_layer_types",
        "missing (nor is there `mlp_only_layers`): cannot tell dense from MoE layers",
    ))
}

/// The MoE numbers of a Laguna config.
struct MoeConfig {
    experts: usize,
    top_k: usize,
    inter: usize,
    shared_inter: usize,
    routed_scale: f32,
    normalize: bool,
    softcap: f32,
}

impl MoeConfig {
    fn read(cfg: &ConfigJson) -> Result<Self> {
        let experts = cfg.usize("num_experts")?;
        let top_k = cfg.usize("num_experts_per_tok")?;
        if top_k == 0 || top_k > experts {
            return Err(cfg.error(
                "num_experts_per_tok",
                format!("{top_k} is not in 1..={experts} (num_experts)"),
            ));
        }
        Ok(Self {
            experts,
            top_k,
            inter: cfg.usize("moe_intermediate_size")?,
            shared_inter: cfg.usize("shared_expert_intermediate_size")?,
            routed_scale: cfg.f64("moe_routed_scaling_factor")? as f32,
            // transformers' Laguna always renormalises; the key is optional.
            normalize: cfg.opt_bool("norm_topk_prob")?.unwrap_or(true),
            softcap: cfg.opt_f64("moe_router_logit_softcapping")?.unwrap_or(0.0) as f32,
        })
    }

    fn load<B: Backend>(&self, ctx: &LoadCtx<'_, B>, p: &str, hidden: usize) -> Result<Moe<B>> {
        let bias_names = [
            format!("{p}.mlp.experts.e_score_correction_bias"),
            format!("{p}.mlp.gate.e_score_correction_bias"),
            format!("{p}.mlp.e_score_correction_bias"),
        ];
        let selection_bias = match bias_names.iter().find(|n| ctx.loader.has(n)) {
            Some(n) => Some(ctx.vector(n, self.experts)?),
            None => None,
        };
        let shared = if self.shared_inter == 0 {
            None
        } else {
            let singular = format!("{p}.mlp.shared_expert");
            let plural = format!("{p}.mlp.shared_experts");
            let prefix = if ctx.loader.has_linear(&format!("{plural}.gate_proj")) {
                plural
            } else {
                singular
            };
            Some(ctx.swiglu(&prefix, hidden, self.shared_inter)?)
        };
        Ok(Moe {
            router: ctx.linear(&format!("{p}.mlp.gate"), self.experts, hidden)?,
            selection_bias,
            experts: ctx.experts(
                &format!("{p}.mlp.experts"),
                self.experts,
                hidden,
                self.inter,
            )?,
            shared,
            params: RouterParams {
                top_k: self.top_k,
                scoring: RouterScoring::Sigmoid,
                normalize: self.normalize,
                logit_softcap: self.softcap,
            },
            routed_scale: self.routed_scale,
        })
    }
}
