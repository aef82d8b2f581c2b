//! Each family read from a real config: the engine's fixtures (`crates/engine/tests/fixtures/`)
//! and hand-written ones for the error paths.

use std::path::{Path, PathBuf};

use fp4forge_arch::{
    ArchError, ArchSpec, ConfigJson, Family, MlpSpec, OutputGate, Presence, RouterScoring, Tied,
};
use serde_json::{json, Value};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../engine/tests/fixtures")
        .join(name)
        .join("config.json")
}

fn spec(v: Value) -> Result<ArchSpec, ArchError> {
    let Value::Object(m) = v else { unreachable!() };
    ArchSpec::from_config(&ConfigJson::from_map(Path::new("config.json"), m))
}

#[test]
fn qwen3_moe_fixture() {
    let s = ArchSpec::from_path(&fixture("tiny-qwen3moe")).unwrap();
    assert_eq!(s.family, Family::Qwen3Moe);
    assert_eq!((s.hidden_size, s.vocab_size, s.layers.len()), (64, 256, 3));
    assert_eq!(s.tie_word_embeddings, Tied::No);
    assert!(matches!(
        s.layers[0].mlp,
        MlpSpec::Dense { intermediate: 128 }
    ));
    for l in &s.layers {
        let a = &l.attention;
        assert_eq!(
            (a.q_heads, a.kv_heads, a.head_dim, a.window),
            (6, 2, 16, None)
        );
        assert_eq!(a.qk_norm, Presence::Required);
        assert_eq!(a.output_gate, OutputGate::Absent);
    }
    let MlpSpec::Moe(m) = &s.layers[1].mlp else {
        panic!("layer 1 routes")
    };
    assert_eq!(
        (m.experts, m.intermediate, m.shared_intermediate),
        (8, 32, None)
    );
    assert_eq!(m.router.scoring, RouterScoring::Softmax);
    assert_eq!((m.router.top_k, m.router.normalize), (2, true));
    assert_eq!(s.ropes.len(), 1);
    assert_eq!((s.ropes[0].theta, s.ropes[0].rotary_dim), (1e6, 16));
}

#[test]
fn laguna_fixture() {
    let s = ArchSpec::from_path(&fixture("tiny-laguna-bf16")).unwrap();
    assert_eq!(s.family, Family::Laguna);
    assert_eq!(s.ropes.len(), 2);
    assert!(matches!(s.layers[0].mlp, MlpSpec::Dense { .. }));
    let MlpSpec::Moe(m) = &s.layers[1].mlp else {
        panic!("layer 1 routes")
    };
    assert_eq!(m.router.scoring, RouterScoring::Sigmoid);
    assert_eq!(m.shared_intermediate, Some(32));
    assert_eq!(m.router.routed_scaling, 2.5);
    assert!(s.aliases.shared_expert.contains(&"mlp.shared_experts"));
    // full layers (0, 4) use rope 0 (YaRN, half rotary), sliding ones rope 1 with the window.
    assert_eq!(s.layers[0].attention.window, None);
    assert_eq!(s.layers[1].attention.window, Some(512));
    assert_eq!(s.ropes[s.layers[0].attention.rope].rotary_dim, 8);
    assert_eq!(s.ropes[s.layers[1].attention.rope].rotary_dim, 16);
    assert_eq!(
        (s.layers[0].attention.q_heads, s.layers[1].attention.q_heads),
        (4, 6)
    );
}

#[test]
fn qwen3_moe_sparse_step_and_sliding() {
    let s = spec(json!({
        "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 32, "num_hidden_layers": 4,
        "num_attention_heads": 4, "vocab_size": 10, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 64, "rope_theta": 10000.0, "num_experts": 4,
        "num_experts_per_tok": 2, "moe_intermediate_size": 8, "intermediate_size": 16,
        "decoder_sparse_step": 2, "use_sliding_window": true, "sliding_window": 8
    }))
    .unwrap();
    let dense: Vec<bool> = s
        .layers
        .iter()
        .map(|l| matches!(l.mlp, MlpSpec::Dense { .. }))
        .collect();
    assert_eq!(dense, [true, false, true, false]);
    assert!(s.layers.iter().all(|l| l.attention.window == Some(8)));
    assert_eq!(s.layers[0].attention.kv_heads, 4);
    assert_eq!(s.layers[0].attention.head_dim, 8);
}

#[test]
fn errors_name_file_and_field() {
    let e = spec(json!({"architectures": ["GPT2LMHeadModel"]}))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("GPT2LMHeadModel") && e.contains("Qwen3MoeForCausalLM"),
        "{e}"
    );
    let e = spec(json!({
        "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 3
    }))
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("config.json") && e.contains("`num_key_value_heads`"),
        "{e}"
    );
    let e = spec(json!({
        "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 4, "vocab_size": 10, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 64, "rope_theta": 10000.0
    }))
    .unwrap_err()
    .to_string();
    assert!(e.contains("`num_experts`"), "{e}");
    let e = spec(json!({"architectures": ["LlamaForCausalLM"], "hidden_size": 8}))
        .unwrap_err()
        .to_string();
    assert!(e.contains("`num_hidden_layers`"), "{e}");
}
