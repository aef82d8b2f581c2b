//! Laguna (poolside; `LagunaForCausalLM`): laguna.md §2-§3.
//!
//! Per layer: its own query-head count (`num_attention_heads_per_layer`), full or sliding
//! attention (`layer_types`, `sliding_window`), q/k RMSNorm per head before RoPE, NeoX rotation
//! within the partial rotary slice (full layers: `rope_parameters.full_attention`, YaRN; sliding
//! layers: `rope_parameters.sliding_attention`; a flat `rope_parameters` serves both), a softplus
//! output gate (`gating_types`, else `gating`, default per head), and a dense
//! SwiGLU (`mlp_layer_types`, else `mlp_only_layers`) or a sigmoid-routed MoE:
//! `e_score_correction_bias` for selection only, renormalised top-k (`norm_topk_prob`,
//! transformers' Laguna always renormalises), × `moe_routed_scaling_factor`, optional logit
//! soft-capping, plus an always-on shared expert (`shared_expert_intermediate_size`, 0 = none).
//! Untied `lm_head` unless `tie_word_embeddings`.
//!
//! Accepted spellings: `mlp.shared_expert.` or `mlp.shared_experts.`; the selection bias under
//! `mlp.experts.`, `mlp.gate.` or `mlp.` (absent = zeros).

use crate::fields::ConfigJson;
use crate::spec::{
    ArchSpec, AttentionSpec, LayerSpec, MlpSpec, MoeSpec, OutputGate, Presence, RouterScoring,
    RouterSpec, TensorAliases, Tied,
};
use crate::{Result, Rope};

use crate::shape::ShapeRules;

use crate::family::Family;

/// What Laguna adds to the generic shape keys: q/k norms, the output gate ([`gating`]), the
/// router's selection bias; its tensor names.
pub(super) fn shape_rules() -> ShapeRules {
    ShapeRules {
        qk_norm: true,
        output_gate: Some(gating),
        router_bias: true,
        aliases: aliases(),
        ..ShapeRules::default()
    }
}

/// Laguna's tensor spellings, preferred (the BF16 release's) first.
fn aliases() -> TensorAliases {
    TensorAliases {
        shared_expert: vec!["mlp.shared_expert", "mlp.shared_experts"],
        selection_bias: vec![
            "mlp.experts.e_score_correction_bias",
            "mlp.gate.e_score_correction_bias",
            "mlp.e_score_correction_bias",
        ],
        shared_expert_gate: Vec::new(),
    }
}

/// Reads a Laguna config.
pub(super) fn read(cfg: &ConfigJson, arch: &str) -> Result<ArchSpec> {
    let hidden = cfg.usize("hidden_size")?;
    let n_layers = cfg.usize("num_hidden_layers")?;
    let kv_heads = cfg.usize("num_key_value_heads")?;
    let head_dim = cfg.usize("head_dim")?;
    let vocab = cfg.usize("vocab_size")?;
    let eps = cfg.f64("rms_norm_eps")?;
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
    let sliding = crate::fields::layer_types(cfg, n_layers)?;
    let window = super::window(cfg, &sliding)?;

    let mut ropes = Vec::new();
    let mut rope_of = [usize::MAX; 2];
    for (is_sliding, name) in [(false, "full_attention"), (true, "sliding_attention")] {
        if sliding.contains(&is_sliding) {
            let path = format!("rope_parameters.{name}");
            let params = if cfg.has(&path) {
                Some(path.as_str())
            } else if cfg.has("rope_parameters") {
                Some("rope_parameters")
            } else {
                None
            };
            rope_of[usize::from(is_sliding)] = ropes.len();
            ropes.push(Rope::from_config(
                cfg,
                params,
                "rope_theta",
                head_dim,
                max_pos,
            )?);
        }
    }

    let dense = mlp_kinds(cfg, n_layers)?;
    let dense_inter = if dense.iter().any(|d| *d) {
        cfg.usize("intermediate_size")?
    } else {
        0
    };
    let moe = if dense.iter().any(|d| !*d) {
        Some(read_moe(cfg)?)
    } else {
        None
    };
    let gates = gating(cfg, n_layers)?;
    let tied = if cfg.opt_bool("tie_word_embeddings")?.unwrap_or(false) {
        Tied::Yes
    } else {
        Tied::No
    };

    let mut layers = Vec::with_capacity(n_layers);
    for i in 0..n_layers {
        super::check_gqa(
            cfg,
            "num_attention_heads_per_layer",
            Some(i),
            heads[i],
            kv_heads,
        )?;
        let mlp = match (&moe, dense[i]) {
            (_, true) => MlpSpec::Dense {
                intermediate: dense_inter,
            },
            (Some(m), false) => MlpSpec::Moe(m.clone()),
            (None, false) => return Err(cfg.error("mlp_layer_types", "no MoE config")),
        };
        layers.push(LayerSpec {
            attention: AttentionSpec {
                q_heads: heads[i],
                kv_heads,
                head_dim,
                window: if sliding[i] { window } else { None },
                rope: rope_of[usize::from(sliding[i])],
                qk_norm: Presence::Required,
                bias: Presence::Optional,
                output_gate: gates[i],
            },
            mlp,
        });
    }
    Ok(ArchSpec {
        file: cfg.file().to_path_buf(),
        architecture: arch.to_owned(),
        family: Family::Laguna,
        hidden_size: hidden,
        vocab_size: vocab,
        rms_norm_eps: eps,
        max_position_embeddings: max_pos,
        tie_word_embeddings: tied,
        ropes,
        layers,
        aliases: aliases(),
    })
}

/// The output gate of each layer: `gating_types[i]`, else `gating`, else per head (the reference
/// module gates every layer per head whatever the field says). `true`, `"per-head"`/`"per_head"`
/// (`"head"`, `"headwise"`) mean per head; `"per-element"` (`"element"`, `"elementwise"`) per
/// element; `false`, `"none"`, `"off"` no stated gate (a `g_proj` in the checkpoint is still
/// used).
fn gating(cfg: &ConfigJson, n_layers: usize) -> Result<Vec<OutputGate>> {
    let parse = |field: &str, v: &serde_json::Value| -> Result<OutputGate> {
        use serde_json::Value;
        match v {
            Value::Bool(true) => Ok(OutputGate::PerHead),
            Value::Bool(false) => Ok(OutputGate::IfPresent),
            Value::String(s) => match s.replace('_', "-").to_ascii_lowercase().as_str() {
                "per-head" | "head" | "headwise" | "true" => Ok(OutputGate::PerHead),
                "per-element" | "element" | "elementwise" => Ok(OutputGate::PerElement),
                "false" | "none" | "off" | "" => Ok(OutputGate::IfPresent),
                _ => Err(cfg.error(field, format!("unknown gating mode {s:?}"))),
            },
            other => Err(cfg.error(field, format!("unknown gating mode {other}"))),
        }
    };
    if let Some(v) = cfg.get("gating_types") {
        let types = v
            .as_array()
            .ok_or_else(|| cfg.error("gating_types", format!("expected a list, got {v}")))?;
        if types.len() != n_layers {
            return Err(cfg.error(
                "gating_types",
                format!("{} entries for {n_layers} layers", types.len()),
            ));
        }
        return types.iter().map(|t| parse("gating_types", t)).collect();
    }
    let gate = match cfg.get("gating") {
        Some(v) => parse("gating", v)?,
        None => OutputGate::PerHead,
    };
    Ok(vec![gate; n_layers])
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
        return crate::fields::mlp_layer_types(cfg, n_layers);
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
fn read_moe(cfg: &ConfigJson) -> Result<MoeSpec> {
    let experts = cfg.usize("num_experts")?;
    let top_k = cfg.usize("num_experts_per_tok")?;
    if top_k == 0 || top_k > experts {
        return Err(cfg.error(
            "num_experts_per_tok",
            format!("{top_k} is not in 1..={experts} (num_experts)"),
        ));
    }
    let intermediate = cfg.usize("moe_intermediate_size")?;
    let shared = cfg.usize("shared_expert_intermediate_size")?;
    Ok(MoeSpec {
        experts,
        intermediate,
        shared_intermediate: (shared != 0).then_some(shared),
        router: RouterSpec {
            scoring: RouterScoring::Sigmoid,
            top_k,
            // transformers' Laguna always renormalises; the key is optional.
            normalize: cfg.opt_bool("norm_topk_prob")?.unwrap_or(true),
            selection_bias: Presence::Optional,
            routed_scaling: cfg.f64("moe_routed_scaling_factor")?,
            logit_softcap: cfg.opt_f64("moe_router_logit_softcapping")?.unwrap_or(0.0),
        },
    })
}
