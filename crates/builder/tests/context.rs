//! `context`: switching the full-attention YaRN settings and max_position_embeddings in place.

use std::path::{Path, PathBuf};

use fp4forge_builder::context::{set_max_context, MaxContext};
use fp4forge_builder::synth::Preset;
use fp4forge_builder::BuilderError;
use serde_json::Value;

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
}

/// A checkpoint directory holding `text` as its config.json.
fn dir_with(text: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("config.json");
    std::fs::write(&config, text).unwrap();
    (tmp, config)
}

#[test]
fn switches_the_real_s_config_between_1m_and_256k_touching_only_three_values() {
    let original = std::fs::read_to_string(fixture("laguna-s-2.1/config.json")).unwrap();
    let (tmp, config) = dir_with(&original);

    // Shipped at 1M: nothing to do, nothing written.
    let report = set_max_context(tmp.path(), MaxContext::M1).unwrap();
    assert!(!report.changed);
    assert_eq!(report.blocks, ["rope_parameters.full_attention"]);
    assert_eq!(std::fs::read_to_string(&config).unwrap(), original);

    let report = set_max_context(tmp.path(), MaxContext::K256).unwrap();
    assert!(report.changed);
    assert_eq!(report.previous_max_position_embeddings, Some(1_048_576));
    assert_eq!(report.previous_factor, Some(128.0));
    let expected = original
        .replace(
            "\"max_position_embeddings\": 1048576",
            "\"max_position_embeddings\": 262144",
        )
        .replace("\"factor\": 128.0", "\"factor\": 32.0")
        .replace(
            "\"attention_factor\": 1.4852030263919618",
            "\"attention_factor\": 1.3465735902799727",
        );
    assert_ne!(expected, original);
    assert_eq!(std::fs::read_to_string(&config).unwrap(), expected);
    // No temporary file left behind.
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);

    // Idempotent.
    let again = set_max_context(&config, MaxContext::K256).unwrap();
    assert!(!again.changed);
    assert_eq!(std::fs::read_to_string(&config).unwrap(), expected);

    // And back: the original bytes exactly.
    assert!(set_max_context(tmp.path(), MaxContext::M1).unwrap().changed);
    assert_eq!(std::fs::read_to_string(&config).unwrap(), original);
}

#[test]
fn other_keys_keep_their_bytes_even_in_python_spelling() {
    // Python's json writes 1e-06 and 4-space indents; serde_json would not. Both survive.
    let text = r#"{
    "rms_norm_eps": 1e-06,
    "rope_parameters": {
        "full_attention": {"rope_type": "yarn", "factor": 32, "original_max_position_embeddings": 8192, "attention_factor": 1.3465735902799727},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}
    },
    "max_position_embeddings": 262144,
    "zeta": [1.0, 2.50]
}
"#;
    let (tmp, config) = dir_with(text);
    // factor 32 (an integer) already equals 32.0: nothing to do.
    assert!(
        !set_max_context(tmp.path(), MaxContext::K256)
            .unwrap()
            .changed
    );
    assert!(set_max_context(tmp.path(), MaxContext::M1).unwrap().changed);
    let expected = text
        .replace("\"factor\": 32,", "\"factor\": 128.0,")
        .replace("1.3465735902799727}", "1.4852030263919618}")
        .replace(": 262144,", ": 1048576,");
    assert_eq!(std::fs::read_to_string(&config).unwrap(), expected);
}

#[test]
fn a_missing_attention_factor_is_added_and_flat_blocks_work() {
    let text = "{\n  \"max_position_embeddings\": 131072,\n  \"rope_scaling\": {\n    \"type\": \"yarn\",\n    \"factor\": 32.0,\n    \"original_max_position_embeddings\": 4096\n  },\n  \"vocab_size\": 10\n}\n";
    let (tmp, config) = dir_with(text);
    let report = set_max_context(&config, MaxContext::M1).unwrap();
    assert!(report.changed);
    assert_eq!(report.blocks, ["rope_scaling"]);
    assert_eq!(
        std::fs::read_to_string(&config).unwrap(),
        "{\n  \"max_position_embeddings\": 1048576,\n  \"rope_scaling\": {\n    \"type\": \"yarn\",\n    \"factor\": 128.0,\n    \"original_max_position_embeddings\": 4096,\n    \"attention_factor\": 1.4852030263919618\n  },\n  \"vocab_size\": 10\n}\n"
    );
    assert!(!set_max_context(tmp.path(), MaxContext::M1).unwrap().changed);

    let flat = r#"{"rope_parameters": {"rope_type": "yarn", "factor": 128.0, "attention_factor": 1.4852030263919618}, "max_position_embeddings": 1048576}"#;
    let (tmp, config) = dir_with(flat);
    let report = set_max_context(tmp.path(), MaxContext::K256).unwrap();
    assert_eq!(report.blocks, ["rope_parameters"]);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    assert_eq!(v["rope_parameters"]["factor"], 32.0);
    assert_eq!(v["rope_parameters"]["attention_factor"], 1.3465735902799727);
    assert_eq!(v["max_position_embeddings"], 262144);
}

#[test]
fn refuses_a_config_without_a_yarn_block() {
    // The tiny fixture has plain ("default") RoPE on both layer types.
    let original = std::fs::read_to_string(fixture("tiny-laguna/bf16/config.json")).unwrap();
    let (tmp, config) = dir_with(&original);
    let err = set_max_context(tmp.path(), MaxContext::M1).unwrap_err();
    assert!(matches!(err, BuilderError::Config { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("YaRN") && msg.contains("config.json"), "{msg}");
    assert_eq!(std::fs::read_to_string(&config).unwrap(), original);

    let (tmp, _) = dir_with("[1, 2]");
    assert!(set_max_context(tmp.path(), MaxContext::M1).is_err());
    let (tmp, _) = dir_with("{not json");
    let err = set_max_context(tmp.path(), MaxContext::M1).unwrap_err();
    assert!(matches!(err, BuilderError::Json { .. }), "{err}");
    let missing = tempfile::tempdir().unwrap();
    let err = set_max_context(missing.path(), MaxContext::M1).unwrap_err();
    assert!(matches!(err, BuilderError::Io { .. }), "{err}");
}

#[test]
fn presets_switch_both_ways() {
    for preset in Preset::ALL {
        let text = serde_json::to_string_pretty(&preset.config()).unwrap();
        let (tmp, config) = dir_with(&text);
        for max in [MaxContext::K256, MaxContext::M1, MaxContext::K256] {
            set_max_context(tmp.path(), max).unwrap();
            let v: Value =
                serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
            let full = &v["rope_parameters"]["full_attention"];
            assert_eq!(full["factor"].as_f64(), Some(max.factor()));
            assert_eq!(
                full["attention_factor"].as_f64(),
                Some(max.attention_factor())
            );
            assert_eq!(
                v["max_position_embeddings"].as_u64(),
                Some(max.max_position_embeddings())
            );
            assert_eq!(
                v["rope_parameters"]["sliding_attention"],
                preset.config()["rope_parameters"]["sliding_attention"]
            );
        }
    }
    assert_eq!("1M".parse::<MaxContext>(), Ok(MaxContext::M1));
    assert_eq!("256k".parse::<MaxContext>(), Ok(MaxContext::K256));
    assert!("512k".parse::<MaxContext>().is_err());
    // attention_factor = 0.1·ln(factor) + 1.
    for max in [MaxContext::K256, MaxContext::M1] {
        assert!((0.1 * max.factor().ln() + 1.0 - max.attention_factor()).abs() < 1e-15);
    }
}
