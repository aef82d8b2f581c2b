//! `inspect` against `fp4forge-arch` and against checkpoints transformers wrote: the engine's
//! reference fixtures (`crates/engine/tests/fixtures/`), a tiny Laguna and a tiny Qwen3-MoE.
//! `inspect` still has its own lenient shape reader (it accepts partial configs and families the
//! engine does not run); on every config both read, both must agree.

use std::path::{Path, PathBuf};

use fp4forge_arch::{ArchSpec, MlpSpec};
use fp4forge_builder::inspect::{Architecture, AttentionKind, Basis, Inspector, Mlp};
use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../engine/tests/fixtures")
        .join(name)
}

fn agree(name: &str) {
    let path = fixture(name).join("config.json");
    let spec = ArchSpec::from_path(&path).unwrap();
    let json: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let arch = Architecture::from_config(&json, name).unwrap();
    assert_eq!(arch.hidden_size as usize, spec.hidden_size, "{name}");
    assert_eq!(arch.vocab_size as usize, spec.vocab_size, "{name}");
    assert_eq!(arch.layers.len(), spec.layers.len(), "{name}");
    for (i, (a, s)) in arch.layers.iter().zip(&spec.layers).enumerate() {
        let at = &s.attention;
        assert_eq!(arch.head_dim as usize, at.head_dim, "{name} layer {i}");
        assert_eq!(a.q_heads as usize, at.q_heads, "{name} layer {i}");
        assert_eq!(a.kv_heads as usize, at.kv_heads, "{name} layer {i}");
        assert_eq!(
            a.attention == AttentionKind::Sliding,
            at.window.is_some(),
            "{name} layer {i}"
        );
        if at.window.is_some() {
            assert_eq!(arch.sliding_window.map(|w| w as usize), at.window);
        }
        assert_eq!(
            a.gate_width.map(|w| w as usize),
            at.gate_rows(),
            "{name} layer {i}"
        );
        match (&a.mlp, &s.mlp) {
            (Mlp::Dense { intermediate }, MlpSpec::Dense { intermediate: b }) => {
                assert_eq!(*intermediate as usize, *b, "{name} layer {i}")
            }
            (Mlp::Moe(m), MlpSpec::Moe(b)) => {
                assert_eq!(m.experts as usize, b.experts, "{name} layer {i}");
                assert_eq!(m.top_k as usize, b.router.top_k, "{name} layer {i}");
                assert_eq!(m.intermediate as usize, b.intermediate, "{name} layer {i}");
                assert_eq!(
                    m.shared_intermediate.map(|x| x as usize),
                    b.shared_intermediate,
                    "{name} layer {i}"
                );
            }
            (a, b) => panic!("{name} layer {i}: inspect {a:?}, arch {b:?}"),
        }
    }
}

#[test]
fn inspect_and_arch_agree_on_real_configs() {
    for name in ["tiny-laguna-bf16", "tiny-laguna-lean", "tiny-qwen3moe"] {
        agree(name);
    }
}

#[test]
fn qwen3_moe_checkpoint_headers_agree_with_its_config() {
    let dir = fixture("tiny-qwen3moe");
    let json: Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    let from_headers = Inspector::new().inspect_path(&dir).unwrap();
    let from_config = Inspector::new()
        .inspect_config(&json, "tiny-qwen3moe")
        .unwrap();
    assert_eq!(from_headers.basis, Basis::Headers);
    assert_eq!(from_headers.model.model_type, "qwen3_moe");
    assert_eq!(from_headers.model.moe_layers, 2);
    assert_eq!(from_headers.model.dense_mlp_layers, 1);
    assert_eq!(from_headers.components, from_config.components);
    assert_eq!(from_headers.totals, from_config.totals);
    assert_eq!(from_headers.kv_cache, from_config.kv_cache);
}
