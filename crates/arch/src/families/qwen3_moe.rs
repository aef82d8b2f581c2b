//! Qwen3-MoE (`Qwen3MoeForCausalLM`), as transformers' `Qwen3MoeConfig` and modeling code read
//! it: GQA with per-head q/k RMSNorm before a default RoPE over the whole head, attention biases
//! when `attention_bias` (default false), sliding windows on every layer only when
//! `use_sliding_window` (default false), and per layer a routed MoE — softmax over all experts,
//! top-k, renormalised only when `norm_topk_prob` (default false), no shared expert, no
//! selection bias — or a dense SwiGLU of `intermediate_size` for the layers in `mlp_only_layers`
//! (default none) and those off the `decoder_sparse_step` grid (default 1: every layer routes).
//! `head_dim` defaults to `hidden_size / num_attention_heads`, `num_key_value_heads` to
//! `num_attention_heads`, `tie_word_embeddings` to false: transformers' defaults.
//!
//! Experts are stored per expert (`mlp.experts.E.{gate,up,down}_proj`) or fused
//! (`mlp.experts.gate_up_proj`, `mlp.experts.down_proj`); the router is `mlp.gate`.
//!
//! Shape reads ([`crate::ShapeSpec`]) also cover Qwen2-MoE (`qwen2_moe`, which the engine does
//! not run): q/k/v biases and no o bias instead of q/k norms, and a shared expert
//! (`mlp.shared_expert`) with a sigmoid gate (`mlp.shared_expert_gate`).

use crate::fields::ConfigJson;
use crate::spec::{
    ArchSpec, AttentionSpec, LayerSpec, MlpSpec, MoeSpec, OutputGate, Presence, RouterScoring,
    RouterSpec, TensorAliases, Tied,
};
use crate::Result;

use crate::shape::ShapeRules;

use crate::family::Family;

/// What `qwen3_moe` / `qwen2_moe` add to the generic shape keys; their tensor names.
pub(super) fn shape_rules(model_type: &str) -> ShapeRules {
    let qwen2 = model_type == "qwen2_moe";
    ShapeRules {
        qk_norm: !qwen2,
        qkv_bias_only: qwen2,
        shared_expert_gate: qwen2,
        aliases: TensorAliases {
            shared_expert: vec!["mlp.shared_expert"],
            shared_expert_gate: vec!["mlp.shared_expert_gate"],
            ..TensorAliases::default()
        },
        ..ShapeRules::default()
    }
}

/// Reads a Qwen3-MoE config.
pub(super) fn read(cfg: &ConfigJson, arch: &str) -> Result<ArchSpec> {
    let hidden = cfg.usize("hidden_size")?;
    let n_layers = cfg.usize("num_hidden_layers")?;
    let heads = cfg.usize("num_attention_heads")?;
    let kv_heads = cfg.opt_usize("num_key_value_heads")?.unwrap_or(heads);
    super::check_gqa(cfg, "num_key_value_heads", None, heads, kv_heads)?;
    let head_dim = match cfg.opt_usize("head_dim")? {
        Some(d) => d,
        None => hidden / heads,
    };
    let vocab = cfg.usize("vocab_size")?;
    let eps = cfg.f64("rms_norm_eps")?;
    let max_pos = cfg.usize("max_position_embeddings")?;
    let rope = super::single_rope(cfg, head_dim, max_pos)?;
    let window = if cfg.opt_bool("use_sliding_window")?.unwrap_or(false) {
        super::window(cfg, &[true])?
    } else {
        None
    };
    let bias = if cfg.opt_bool("attention_bias")?.unwrap_or(false) {
        Presence::Required
    } else {
        Presence::Absent
    };
    let tied = if cfg.opt_bool("tie_word_embeddings")?.unwrap_or(false) {
        Tied::Yes
    } else {
        Tied::No
    };

    // `num_local_experts` is how transformers' attribute map saves `num_experts`; when neither
    // is there, the error names `num_experts`.
    let experts = if !cfg.has("num_experts") && cfg.has("num_local_experts") {
        cfg.usize("num_local_experts")?
    } else {
        cfg.usize("num_experts")?
    };
    let step = cfg.opt_usize("decoder_sparse_step")?.unwrap_or(1);
    if step == 0 {
        return Err(cfg.error("decoder_sparse_step", "must be at least 1"));
    }
    let dense_only = if cfg.has("mlp_only_layers") {
        cfg.usize_list("mlp_only_layers")?
    } else {
        Vec::new()
    };
    let sparse = |i: usize| !dense_only.contains(&i) && experts > 0 && (i + 1).is_multiple_of(step);
    let moe = if (0..n_layers).any(sparse) {
        let top_k = cfg.usize("num_experts_per_tok")?;
        if top_k == 0 || top_k > experts {
            return Err(cfg.error(
                "num_experts_per_tok",
                format!("{top_k} is not in 1..={experts} (num_experts)"),
            ));
        }
        Some(MoeSpec {
            experts,
            intermediate: cfg.usize("moe_intermediate_size")?,
            shared_intermediate: None,
            router: RouterSpec {
                scoring: RouterScoring::Softmax,
                top_k,
                normalize: cfg.opt_bool("norm_topk_prob")?.unwrap_or(false),
                selection_bias: Presence::Absent,
                routed_scaling: 1.0,
                logit_softcap: 0.0,
            },
        })
    } else {
        None
    };
    let dense_inter = if (0..n_layers).any(|i| !sparse(i)) {
        cfg.usize("intermediate_size")?
    } else {
        0
    };

    let layers = (0..n_layers)
        .map(|i| LayerSpec {
            attention: AttentionSpec {
                q_heads: heads,
                kv_heads,
                head_dim,
                window,
                rope: 0,
                qk_norm: Presence::Required,
                bias,
                output_gate: OutputGate::Absent,
            },
            mlp: match (&moe, sparse(i)) {
                (Some(m), true) => MlpSpec::Moe(m.clone()),
                _ => MlpSpec::Dense {
                    intermediate: dense_inter,
                },
            },
        })
        .collect();
    Ok(ArchSpec {
        file: cfg.file().to_path_buf(),
        architecture: arch.to_owned(),
        family: Family::Qwen3Moe,
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
