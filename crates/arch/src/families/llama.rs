//! Llama-style dense decoders (`LlamaForCausalLM` — SmolLM2 —, `MistralForCausalLM`,
//! `Qwen2ForCausalLM`): GQA, one RoPE (default, linear, llama3, yarn) from `rope_parameters` or
//! `rope_theta` + `rope_scaling`, RMSNorm with `rms_norm_eps`, SwiGLU MLP, attention biases and
//! per-head q/k norms where the checkpoint has them (Qwen2's q/k/v biases), sliding windows from
//! `layer_types`, Mistral's bare `sliding_window` or Qwen2's `use_sliding_window` +
//! `max_window_layers`, and tied embeddings when `tie_word_embeddings` says so or, when it is
//! absent, the checkpoint has no `lm_head`.
//!
//! Shape reads ([`crate::ShapeSpec`]) also cover dense Qwen3 (`qwen3`: per-head q/k norms): by
//! `model_type`, `qwen2` has q/k/v biases and no o bias, `mistral`'s bare `sliding_window` slides
//! every layer. Tensors are named as in transformers' Llama (`self_attn.{q,k,v,o}_proj`,
//! `mlp.{gate,up,down}_proj`).

use crate::fields::ConfigJson;
use crate::shape::ShapeRules;
use crate::spec::{
    ArchSpec, AttentionSpec, LayerSpec, MlpSpec, OutputGate, Presence, TensorAliases, Tied,
};
use crate::Result;

use crate::family::Family;

/// What a Llama-family `model_type` adds to the generic shape keys.
pub(super) fn shape_rules(model_type: &str) -> ShapeRules {
    ShapeRules {
        qk_norm: model_type == "qwen3",
        qkv_bias_only: model_type == "qwen2",
        slide_by_default: model_type == "mistral",
        ..ShapeRules::default()
    }
}

/// Reads a Llama-family config; `arch` decides how a bare `sliding_window` is read.
pub(super) fn read(cfg: &ConfigJson, arch: &str) -> Result<ArchSpec> {
    let hidden = cfg.usize("hidden_size")?;
    let n_layers = cfg.usize("num_hidden_layers")?;
    let heads = cfg.usize("num_attention_heads")?;
    // transformers' default: no GQA when the key is absent.
    let kv_heads = cfg.opt_usize("num_key_value_heads")?.unwrap_or(heads);
    super::check_gqa(cfg, "num_key_value_heads", None, heads, kv_heads)?;
    // transformers' default: hidden_size / num_attention_heads.
    let head_dim = match cfg.opt_usize("head_dim")? {
        Some(d) => d,
        None => hidden / heads,
    };
    let inter = cfg.usize("intermediate_size")?;
    let vocab = cfg.usize("vocab_size")?;
    let eps = cfg.f64("rms_norm_eps")?;
    let max_pos = cfg.usize("max_position_embeddings")?;

    let sliding = sliding_layers(cfg, arch, n_layers)?;
    let window = super::window(cfg, &sliding)?;
    let rope = super::single_rope(cfg, head_dim, max_pos)?;
    let tied = match cfg.opt_bool("tie_word_embeddings")? {
        Some(true) => Tied::Yes,
        Some(false) => Tied::No,
        None => Tied::IfNoLmHead,
    };
    let layers = sliding
        .iter()
        .map(|&s| LayerSpec {
            attention: AttentionSpec {
                q_heads: heads,
                kv_heads,
                head_dim,
                window: if s { window } else { None },
                rope: 0,
                qk_norm: Presence::Optional,
                bias: Presence::Optional,
                output_gate: OutputGate::Absent,
            },
            mlp: MlpSpec::Dense {
                intermediate: inter,
            },
        })
        .collect();
    Ok(ArchSpec {
        file: cfg.file().to_path_buf(),
        architecture: arch.to_owned(),
        family: Family::Llama,
        hidden_size: hidden,
        vocab_size: vocab,
        rms_norm_eps: eps,
        max_position_embeddings: max_pos,
        tie_word_embeddings: tied,
        ropes: vec![rope],
        layers,
        aliases: TensorAliases::default(),
    })
}

/// Which layers use a sliding window.
fn sliding_layers(cfg: &ConfigJson, arch: &str, n_layers: usize) -> Result<Vec<bool>> {
    if cfg.has("layer_types") {
        return crate::fields::layer_types(cfg, n_layers);
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
