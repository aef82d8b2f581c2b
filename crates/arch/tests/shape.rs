//! The lenient shape read ([`ShapeSpec`]): partial configs, the `model_type`s only inspect
//! covers, the tensor names each family gives, and agreement with [`ArchSpec`] where both read.

use std::path::{Path, PathBuf};

use fp4forge_arch::{ArchSpec, AttentionKind, Family, MlpShape, MlpSpec, ShapeSpec};
use serde_json::json;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../engine/tests/fixtures")
        .join(name)
        .join("config.json")
}

#[test]
fn partial_dense_configs_read_without_eps_rope_or_architectures() {
    let cfg = json!({
        "model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96,
        "vocab_size": 100, "tie_word_embeddings": true
    });
    let s = ShapeSpec::from_config(&cfg, "qwen3.json").unwrap();
    assert_eq!(s.family, Some(Family::Llama));
    assert!(s.architectures.is_empty());
    assert_eq!((s.head_dim, s.dtype.as_str()), (16, "BF16"));
    assert!(s.layers.iter().all(|l| l.qk_norm && !l.qkv_bias));
    let names: Vec<String> = s.tensors().unwrap().into_iter().map(|t| t.name).collect();
    assert!(names.contains(&"model.layers.1.self_attn.k_norm.weight".to_string()));
    assert!(!names.iter().any(|n| n == "lm_head.weight"));
}

#[test]
fn qwen2_moe_has_qkv_biases_and_a_gated_shared_expert() {
    let cfg = json!({
        "model_type": "qwen2_moe", "hidden_size": 32, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_experts": 4, "num_experts_per_tok": 2,
        "moe_intermediate_size": 8, "shared_expert_intermediate_size": 16, "vocab_size": 10
    });
    let s = ShapeSpec::from_config(&cfg, "q2.json").unwrap();
    assert_eq!(s.family, Some(Family::Qwen3Moe));
    let l = &s.layers[0];
    assert!(l.qkv_bias && !l.o_bias && !l.qk_norm);
    let MlpShape::Moe(m) = &l.mlp else {
        panic!("{:?}", l.mlp)
    };
    assert!(m.shared_gate && !m.router_bias);
    let t = s.tensors().unwrap();
    let gate = t
        .iter()
        .find(|t| t.name == "model.layers.0.mlp.shared_expert_gate.weight")
        .unwrap();
    assert_eq!(gate.shape, vec![1, 32]);
    assert!(t
        .iter()
        .any(|t| t.name == "model.layers.0.self_attn.q_proj.bias"));
}

#[test]
fn unknown_model_types_read_but_have_no_tensor_names() {
    let cfg = json!({
        "model_type": "mixtral", "hidden_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 2, "intermediate_size": 64, "vocab_size": 10,
        "sliding_window": 16
    });
    let s = ShapeSpec::from_config(&cfg, "m.json").unwrap();
    assert_eq!(s.family, None);
    assert!(s
        .layers
        .iter()
        .all(|l| l.attention == AttentionKind::Sliding));
    let err = s.tensors().unwrap_err().to_string();
    assert!(
        err.contains("m.json") && err.contains("`model_type`"),
        "{err}"
    );
}

#[test]
fn errors_name_the_file_and_the_field() {
    let cfg = json!({"model_type": "llama", "num_hidden_layers": 1});
    let err = ShapeSpec::from_config(&cfg, "c.json")
        .unwrap_err()
        .to_string();
    assert_eq!(err, "c.json: config field `hidden_size`: missing");
    let cfg = json!({
        "model_type": "laguna", "hidden_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 2, "intermediate_size": 64, "vocab_size": 10,
        "layer_types": ["full_attention"]
    });
    let err = ShapeSpec::from_config(&cfg, "l.json")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("l.json") && err.contains("`layer_types`"),
        "{err}"
    );
}

#[test]
fn shape_agrees_with_the_full_read_on_real_configs() {
    for name in ["tiny-laguna-bf16", "tiny-laguna-lean", "tiny-qwen3moe"] {
        let path = fixture(name);
        let spec = ArchSpec::from_path(&path).unwrap();
        let text = std::fs::read(&path).unwrap();
        let shape = ShapeSpec::from_config(&serde_json::from_slice(&text).unwrap(), &path).unwrap();
        assert_eq!(shape.family, Some(spec.family), "{name}");
        assert_eq!(shape.layers.len(), spec.layers.len(), "{name}");
        for (l, s) in shape.layers.iter().zip(&spec.layers) {
            let a = &s.attention;
            assert_eq!(shape.head_dim, a.head_dim as u64, "{name}");
            assert_eq!(
                (l.q_heads, l.kv_heads),
                (a.q_heads as u64, a.kv_heads as u64)
            );
            assert_eq!(l.gate_width, a.gate_rows().map(|g| g as u64), "{name}");
            assert_eq!(l.attention == AttentionKind::Sliding, a.window.is_some());
            match (&l.mlp, &s.mlp) {
                (MlpShape::Dense { intermediate }, MlpSpec::Dense { intermediate: b }) => {
                    assert_eq!(*intermediate, *b as u64)
                }
                (MlpShape::Moe(m), MlpSpec::Moe(b)) => {
                    assert_eq!(
                        (m.experts, m.top_k),
                        (b.experts as u64, b.router.top_k as u64)
                    );
                    assert_eq!(
                        m.shared_intermediate,
                        b.shared_intermediate.map(|x| x as u64)
                    );
                }
                (x, y) => panic!("{name}: shape {x:?}, spec {y:?}"),
            }
        }
    }
}
