//! Llama-style dense decoders (`LlamaForCausalLM` — SmolLM2 —, `MistralForCausalLM`,
//! `Qwen2ForCausalLM`): GQA, RoPE (default, linear, llama3, yarn) from `rope_parameters` or
//! `rope_theta` + `rope_scaling`, RMSNorm with `rms_norm_eps`, SwiGLU MLP, optional attention
//! biases (Qwen2's q/k/v), optional per-head q/k norms, optional sliding windows (`layer_types`,
//! Mistral's `sliding_window`, Qwen2's `use_sliding_window`), and tied embeddings when
//! `tie_word_embeddings` says so or the checkpoint has no `lm_head`.

use crate::backend::{AttentionParams, Backend};
use crate::config::ConfigJson;
use crate::error::Result;
use crate::kv_cache::{KvDtype, KvLayerSpec};
use crate::models::decoder::{Attention, Decoder, Layer, LoadCtx, Mlp};
use crate::rope::RopeSpec;

/// Reads a Llama-family checkpoint; `arch` is the config's architecture (it decides how a bare
/// `sliding_window` is read).
pub(crate) fn load<B: Backend>(
    cfg: &ConfigJson,
    arch: &str,
    ctx: &LoadCtx<'_, B>,
    kv_dtype: KvDtype,
) -> Result<Decoder<B>> {
    let hidden = cfg.usize("hidden_size")?;
    let n_layers = cfg.usize("num_hidden_layers")?;
    let heads = cfg.usize("num_attention_heads")?;
    // transformers' default: no GQA when the key is absent.
    let kv_heads = cfg.opt_usize("num_key_value_heads")?.unwrap_or(heads);
    if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        return Err(cfg.error(
            "num_key_value_heads",
            format!("{heads} query heads are not a multiple of {kv_heads} KV heads"),
        ));
    }
    let head_dim = match cfg.opt_usize("head_dim")? {
        Some(d) => d,
        None => hidden / heads,
    };
    let inter = cfg.usize("intermediate_size")?;
    let vocab = cfg.usize("vocab_size")?;
    let eps = cfg.f64("rms_norm_eps")? as f32;
    let max_pos = cfg.usize("max_position_embeddings")?;

    let sliding = sliding_layers(cfg, arch, n_layers)?;
    let window = if sliding.iter().any(|s| *s) {
        let w = cfg.usize("sliding_window")?;
        if w == 0 {
            return Err(cfg.error("sliding_window", "must be at least 1"));
        }
        Some(w)
    } else {
        None
    };

    let rope = if cfg.has("rope_parameters") {
        RopeSpec::from_config(
            cfg,
            Some("rope_parameters"),
            "rope_theta",
            head_dim,
            max_pos,
        )?
    } else if cfg.has("rope_scaling") {
        RopeSpec::from_config(cfg, Some("rope_scaling"), "rope_theta", head_dim, max_pos)?
    } else {
        RopeSpec::from_config(cfg, None, "rope_theta", head_dim, max_pos)?
    };
    let ropes = vec![ctx.backend.load_rope(&rope)?];

    let embed = ctx.linear("model.embed_tokens", vocab, hidden)?;
    let tied = match cfg.opt_bool("tie_word_embeddings")? {
        Some(t) => t,
        None => !ctx.loader.has_linear("lm_head"),
    };
    let lm_head = if tied {
        None
    } else {
        Some(ctx.linear("lm_head", vocab, hidden)?)
    };
    let norm = ctx.vector("model.norm.weight", hidden)?;

    let mut layers = Vec::with_capacity(n_layers);
    for (i, &is_sliding) in sliding.iter().enumerate() {
        let p = format!("model.layers.{i}");
        let a = format!("{p}.self_attn");
        let (qd, kvd) = (heads * head_dim, kv_heads * head_dim);
        let scale_of = |name: &str| -> Result<f32> {
            let t = format!("{a}.{name}");
            if ctx.loader.has(&t) {
                ctx.loader.scalar(&t)
            } else {
                Ok(1.0)
            }
        };
        let attn = Attention {
            q: ctx.linear(&format!("{a}.q_proj"), qd, hidden)?,
            k: ctx.linear(&format!("{a}.k_proj"), kvd, hidden)?,
            v: ctx.linear(&format!("{a}.v_proj"), kvd, hidden)?,
            o: ctx.linear(&format!("{a}.o_proj"), hidden, qd)?,
            q_bias: ctx.opt_vector(&format!("{a}.q_proj.bias"), qd)?,
            k_bias: ctx.opt_vector(&format!("{a}.k_proj.bias"), kvd)?,
            v_bias: ctx.opt_vector(&format!("{a}.v_proj.bias"), kvd)?,
            o_bias: ctx.opt_vector(&format!("{a}.o_proj.bias"), hidden)?,
            q_norm: ctx.opt_vector(&format!("{a}.q_norm.weight"), head_dim)?,
            k_norm: ctx.opt_vector(&format!("{a}.k_norm.weight"), head_dim)?,
            gate: None,
            rope: 0,
            params: AttentionParams {
                heads,
                kv_heads,
                head_dim,
                scale: 1.0 / (head_dim as f32).sqrt(),
            },
            kv: KvLayerSpec {
                kv_heads,
                head_dim,
                window: if is_sliding { window } else { None },
                dtype: kv_dtype,
                k_scale: scale_of("k_scale")?,
                v_scale: scale_of("v_scale")?,
            },
        };
        layers.push(Layer {
            input_norm: ctx.vector(&format!("{p}.input_layernorm.weight"), hidden)?,
            post_norm: ctx.vector(&format!("{p}.post_attention_layernorm.weight"), hidden)?,
            attn,
            mlp: Mlp::Dense(ctx.swiglu(&format!("{p}.mlp"), hidden, inter)?),
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

/// Which layers use a sliding window.
fn sliding_layers(cfg: &ConfigJson, arch: &str, n_layers: usize) -> Result<Vec<bool>> {
    if cfg.has("layer_types") {
        return super::layer_types(cfg, n_layers);
    }
    let window_set = cfg.has("sliding_window");
    let all = |b: bool| Ok(vec![b; n_layers]);
    match arch {
        "MistralForCausalLM" => all(window_set),
        "Qwen2ForCausalLM" => {
            if cfg.opt_bool("use_sliding_window")?.unwrap_or(false) && window_set {
                let from = cfg.opt_usize("max_window_layers")?.unwrap_or(0);
                Ok((0..n_layers).map(|i| i >= from).collect())
            } else {
                all(false)
            }
        }
        _ => all(false),
    }
}
