//! Errors a user can cause name what they are about: the architecture (with the supported
//! list), the missing config key, the missing tensor, the context limit, the token id.

mod common;

use std::path::Path;

use common::tiny_laguna;
use fp4forge_engine::{EngineError, Model, ModelOptions, SUPPORTED_ARCHITECTURES};

fn edit_config(dir: &Path, f: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) {
    let p = dir.join("config.json");
    let mut cfg: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    f(&mut cfg);
    std::fs::write(&p, serde_json::to_vec_pretty(&cfg).unwrap()).unwrap();
}

fn load_err(dir: &Path) -> String {
    match Model::load(dir, ModelOptions::new()) {
        Ok(_) => panic!("loading {} should fail", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn unsupported_architecture_lists_the_supported_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tiny_laguna(tmp.path(), "m", false);
    edit_config(&dir, |c| {
        c.insert(
            "architectures".into(),
            serde_json::json!(["GPT2LMHeadModel"]),
        );
    });
    let e = load_err(&dir);
    assert!(e.contains("GPT2LMHeadModel"), "{e}");
    for a in SUPPORTED_ARCHITECTURES {
        assert!(e.contains(a), "{e}");
    }
}

#[test]
fn missing_config_key_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tiny_laguna(tmp.path(), "m", false);
    for key in [
        "hidden_size",
        "rms_norm_eps",
        "moe_routed_scaling_factor",
        "sliding_window",
    ] {
        let d = tmp.path().join(format!("no-{key}"));
        std::fs::create_dir_all(&d).unwrap();
        for f in std::fs::read_dir(&dir).unwrap() {
            let f = f.unwrap();
            std::fs::copy(f.path(), d.join(f.file_name())).unwrap();
        }
        edit_config(&d, |c| {
            c.remove(key);
        });
        let e = load_err(&d);
        assert!(
            e.contains(&format!("`{key}`")) && e.contains("config.json"),
            "{e}"
        );
    }
}

#[test]
fn missing_tensor_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tiny_laguna(tmp.path(), "m", false);
    // Claim one more layer than the checkpoint has.
    edit_config(&dir, |c| {
        let n = c["num_hidden_layers"].as_u64().unwrap();
        c.insert("num_hidden_layers".into(), serde_json::json!(n + 1));
        for key in [
            "layer_types",
            "mlp_layer_types",
            "num_attention_heads_per_layer",
            "gating_types",
        ] {
            if let Some(serde_json::Value::Array(a)) = c.get_mut(key) {
                let last = a.last().cloned().unwrap();
                a.push(last);
            }
        }
    });
    let e = load_err(&dir);
    assert!(e.contains("model.layers.5."), "{e}");
}

#[test]
fn context_overflow_and_bad_tokens_are_clear() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tiny_laguna(tmp.path(), "m", false);
    let m = Model::load(&dir, ModelOptions::new().max_context(10)).unwrap();
    assert_eq!(m.info().max_context, 10);
    let mut s = m.new_session().unwrap();
    s.prefill(&[1, 2, 3, 4, 5, 6]).unwrap();
    match s.prefill(&[1, 2, 3, 4, 5]) {
        Err(EngineError::ContextOverflow {
            position: 6,
            adding: 5,
            max_context: 10,
        }) => {}
        other => panic!("expected a context overflow, got {other:?}"),
    }
    // The session is still usable after a refused call.
    s.step(7).unwrap();
    let vocab = m.info().vocab_size as u32;
    match s.step(vocab) {
        Err(EngineError::TokenOutOfRange { token, vocab_size }) => {
            assert_eq!((token, vocab_size), (vocab, vocab as usize))
        }
        other => panic!("expected a token error, got {other:?}"),
    }
    assert!(matches!(s.prefill(&[]), Err(EngineError::InvalidInput(_))));
}
