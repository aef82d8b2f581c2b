//! The one loader: finds the tensors an [`ArchSpec`] names and makes them resident on a backend.
//! It reads no geometry itself (every size comes from the spec) and knows no family by name:
//! where a family's checkpoints spell a tensor several ways, the spec's
//! [`TensorAliases`](fp4forge_arch::TensorAliases) list them.

use fp4forge_arch::{ArchSpec, AttentionSpec, MlpSpec, MoeSpec, OutputGate, Presence, Tied};

use crate::backend::Backend;
use crate::error::Result;
use crate::ir::{
    Attention, AttentionParams, Decoder, Layer, Mlp, Moe, RouterParams, RouterScoring,
};
use crate::ir::{KvDtype, KvLayerSpec};
use crate::models::load_ctx::LoadCtx;
use crate::rope::RopeSpec;

/// Loads the decoder `spec` describes from the checkpoint behind `ctx`.
pub(crate) fn load<B: Backend>(
    spec: &ArchSpec,
    ctx: &LoadCtx<'_, B>,
    kv_dtype: KvDtype,
) -> Result<Decoder<B>> {
    let hidden = spec.hidden_size;
    let ropes = spec
        .ropes
        .iter()
        .map(|r| ctx.backend.load_rope(&RopeSpec::from_arch(r)))
        .collect::<Result<Vec<_>>>()?;

    let embed = ctx.linear("model.embed_tokens", spec.vocab_size, hidden)?;
    let tied = match spec.tie_word_embeddings {
        Tied::Yes => true,
        Tied::No => false,
        Tied::IfNoLmHead => !ctx.loader.has_linear("lm_head"),
    };
    let lm_head = if tied {
        None
    } else {
        Some(ctx.linear("lm_head", spec.vocab_size, hidden)?)
    };
    let norm = ctx.vector("model.norm.weight", hidden)?;

    let mut layers = Vec::with_capacity(spec.layers.len());
    for (i, l) in spec.layers.iter().enumerate() {
        let p = format!("model.layers.{i}");
        let mlp = match &l.mlp {
            MlpSpec::Dense { intermediate } => {
                Mlp::Dense(ctx.swiglu(&format!("{p}.mlp"), hidden, *intermediate)?)
            }
            MlpSpec::Moe(m) => Mlp::Moe(moe(spec, m, ctx, &p)?),
        };
        layers.push(Layer {
            input_norm: ctx.vector(&format!("{p}.input_layernorm.weight"), hidden)?,
            post_norm: ctx.vector(&format!("{p}.post_attention_layernorm.weight"), hidden)?,
            attn: attention(&l.attention, ctx, &p, hidden, kv_dtype)?,
            mlp,
        });
    }
    Ok(Decoder {
        embed,
        lm_head,
        norm,
        eps: spec.rms_norm_eps as f32,
        hidden,
        layers,
        ropes,
    })
}

/// A vector that `presence` says the checkpoint has always, maybe, or never.
fn vector_if<B: Backend>(
    ctx: &LoadCtx<'_, B>,
    presence: Presence,
    name: &str,
    len: usize,
) -> Result<Option<B::Tensor>> {
    match presence {
        Presence::Required => ctx.vector(name, len).map(Some),
        Presence::Optional => ctx.opt_vector(name, len),
        Presence::Absent => Ok(None),
    }
}

fn attention<B: Backend>(
    s: &AttentionSpec,
    ctx: &LoadCtx<'_, B>,
    p: &str,
    hidden: usize,
    kv_dtype: KvDtype,
) -> Result<Attention<B>> {
    let a = format!("{p}.self_attn");
    let (qd, kvd, d) = (s.q_dim(), s.kv_dim(), s.head_dim);
    let g_proj = format!("{a}.g_proj");
    // A stated gate must be there; its width is told by the shape (laguna.md §1).
    let gate = match s.output_gate {
        OutputGate::PerHead | OutputGate::PerElement => true,
        OutputGate::IfPresent => ctx.loader.has_linear(&g_proj),
        OutputGate::Absent => false,
    };
    let gate = if gate {
        let (g, rows, cols) = ctx.linear_any(&g_proj)?;
        if cols != hidden || (rows != s.q_heads && rows != qd) {
            return Err(ctx.loader.error(
                &format!("{g_proj}.weight"),
                format!(
                    "shape [{rows}, {cols}]: expected [{}, {hidden}] (per-head gate) or \
                     [{qd}, {hidden}] (per-element gate)",
                    s.q_heads
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
    let bias = |name: &str, len: usize| vector_if(ctx, s.bias, &format!("{a}.{name}.bias"), len);
    Ok(Attention {
        q: ctx.linear(&format!("{a}.q_proj"), qd, hidden)?,
        k: ctx.linear(&format!("{a}.k_proj"), kvd, hidden)?,
        v: ctx.linear(&format!("{a}.v_proj"), kvd, hidden)?,
        o: ctx.linear(&format!("{a}.o_proj"), hidden, qd)?,
        q_bias: bias("q_proj", qd)?,
        k_bias: bias("k_proj", kvd)?,
        v_bias: bias("v_proj", kvd)?,
        o_bias: bias("o_proj", hidden)?,
        q_norm: vector_if(ctx, s.qk_norm, &format!("{a}.q_norm.weight"), d)?,
        k_norm: vector_if(ctx, s.qk_norm, &format!("{a}.k_norm.weight"), d)?,
        gate,
        rope: s.rope,
        params: AttentionParams {
            heads: s.q_heads,
            kv_heads: s.kv_heads,
            head_dim: d,
            scale: 1.0 / (d as f32).sqrt(),
        },
        kv: KvLayerSpec {
            kv_heads: s.kv_heads,
            head_dim: d,
            window: s.window,
            dtype: kv_dtype,
            k_scale: scale_of("k_scale")?,
            v_scale: scale_of("v_scale")?,
        },
    })
}

fn moe<B: Backend>(spec: &ArchSpec, m: &MoeSpec, ctx: &LoadCtx<'_, B>, p: &str) -> Result<Moe<B>> {
    let hidden = spec.hidden_size;
    let r = &m.router;
    let selection_bias = match r.selection_bias {
        Presence::Absent => None,
        presence => {
            let names: Vec<String> = spec
                .aliases
                .selection_bias
                .iter()
                .map(|a| format!("{p}.{a}"))
                .collect();
            match names.iter().find(|n| ctx.loader.has(n)) {
                Some(n) => Some(ctx.vector(n, m.experts)?),
                None if presence == Presence::Required => {
                    let first = names
                        .first()
                        .map_or("e_score_correction_bias", String::as_str);
                    Some(ctx.vector(first, m.experts)?)
                }
                None => None,
            }
        }
    };
    let shared = match m.shared_intermediate {
        None => None,
        Some(inter) => {
            let prefixes: Vec<String> = spec
                .aliases
                .shared_expert
                .iter()
                .map(|a| format!("{p}.{a}"))
                .collect();
            let prefix = prefixes
                .iter()
                .find(|x| ctx.loader.has_linear(&format!("{x}.gate_proj")))
                .or(prefixes.first())
                .cloned()
                .unwrap_or_else(|| format!("{p}.mlp.shared_expert"));
            Some(ctx.swiglu(&prefix, hidden, inter)?)
        }
    };
    Ok(Moe {
        router: ctx.linear(&format!("{p}.mlp.gate"), m.experts, hidden)?,
        selection_bias,
        experts: ctx.experts(
            &format!("{p}.mlp.experts"),
            m.experts,
            hidden,
            m.intermediate,
        )?,
        shared,
        params: RouterParams {
            top_k: r.top_k,
            scoring: match r.scoring {
                fp4forge_arch::RouterScoring::Softmax => RouterScoring::Softmax,
                fp4forge_arch::RouterScoring::Sigmoid => RouterScoring::Sigmoid,
            },
            normalize: r.normalize,
            logit_softcap: r.logit_softcap as f32,
        },
        routed_scale: r.routed_scaling as f32,
    })
}
