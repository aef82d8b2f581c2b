//! The unquantized tensor set an architecture implies, with HF checkpoint names and shapes
//! (the BF16 release's on-disk layout: per-expert 2-D weights, singular `shared_expert`).

use super::arch::{Architecture, Mlp};
use super::tensor::TensorDesc;
use crate::BuilderError;

/// Families whose tensor names this module knows.
const KNOWN: &[&str] = &[
    "laguna",
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "qwen2_moe",
    "qwen3_moe",
];

/// Every tensor of the unquantized checkpoint, in model order; `source` names the config in
/// errors. Fails for a `model_type` whose tensor names are not known here.
pub fn unquantized_tensors(
    arch: &Architecture,
    source: &str,
) -> Result<Vec<TensorDesc>, BuilderError> {
    if !KNOWN.contains(&arch.model_type.as_str()) {
        return Err(BuilderError::Config {
            source_name: source.to_string(),
            field: "model_type".into(),
            reason: format!(
                "{:?}: its tensor set cannot be derived from the config (known: {}); \
                 inspect the checkpoint directory instead",
                arch.model_type,
                KNOWN.join(", ")
            ),
        });
    }
    let dt = arch.dtype.as_str();
    let h = arch.hidden_size;
    let d = arch.head_dim;
    let mut out = Vec::new();
    let mut push = |name: String, dtype: &str, shape: Vec<u64>| {
        out.push(TensorDesc::new(name, dtype, shape));
    };
    push(
        "model.embed_tokens.weight".into(),
        dt,
        vec![arch.vocab_size, h],
    );
    for (i, layer) in arch.layers.iter().enumerate() {
        let p = format!("model.layers.{i}");
        push(format!("{p}.input_layernorm.weight"), dt, vec![h]);
        push(format!("{p}.post_attention_layernorm.weight"), dt, vec![h]);
        let a = format!("{p}.self_attn");
        let (q, kv) = (layer.q_heads * d, layer.kv_heads * d);
        for (name, rows) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
            push(format!("{a}.{name}.weight"), dt, vec![rows, h]);
            if layer.qkv_bias {
                push(format!("{a}.{name}.bias"), dt, vec![rows]);
            }
        }
        push(format!("{a}.o_proj.weight"), dt, vec![h, q]);
        if layer.o_bias {
            push(format!("{a}.o_proj.bias"), dt, vec![h]);
        }
        if let Some(g) = layer.gate_width {
            push(format!("{a}.g_proj.weight"), dt, vec![g, h]);
        }
        if layer.qk_norm {
            push(format!("{a}.q_norm.weight"), dt, vec![d]);
            push(format!("{a}.k_norm.weight"), dt, vec![d]);
        }
        let m = format!("{p}.mlp");
        let swiglu = |push: &mut dyn FnMut(String, &str, Vec<u64>), prefix: &str, inter: u64| {
            push(format!("{prefix}.gate_proj.weight"), dt, vec![inter, h]);
            push(format!("{prefix}.up_proj.weight"), dt, vec![inter, h]);
            push(format!("{prefix}.down_proj.weight"), dt, vec![h, inter]);
        };
        match &layer.mlp {
            Mlp::Dense { intermediate } => swiglu(&mut push, &m, *intermediate),
            Mlp::Moe(moe) => {
                push(format!("{m}.gate.weight"), dt, vec![moe.experts, h]);
                if moe.router_bias {
                    push(
                        format!("{m}.experts.e_score_correction_bias"),
                        "F32",
                        vec![moe.experts],
                    );
                }
                for e in 0..moe.experts {
                    swiglu(&mut push, &format!("{m}.experts.{e}"), moe.intermediate);
                }
                if let Some(s) = moe.shared_intermediate {
                    swiglu(&mut push, &format!("{m}.shared_expert"), s);
                    if moe.shared_gate {
                        push(format!("{m}.shared_expert_gate.weight"), dt, vec![1, h]);
                    }
                }
            }
        }
    }
    push("model.norm.weight".into(), dt, vec![h]);
    if !arch.tie_word_embeddings {
        push("lm_head.weight".into(), dt, vec![arch.vocab_size, h]);
    }
    Ok(out)
}
