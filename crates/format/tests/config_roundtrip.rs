//! `config.json` and `quantization_config` round-trip exactly; presets match the spec.

use fp4forge_format::config::{
    DynamicMode, Field, KeyOrder, ModelConfig, QuantizationArgs, QuantizationConfig,
    QuantizationScheme,
};
use fp4forge_format::CheckpointError;
use indexmap::IndexMap;
use serde_json::{json, Value};

/// A config.json in transformers' unsorted style, with unknown keys, nested objects, `null`s
/// (typed and untyped), floats and a compressed-tensors block whose keys are not sorted.
const CONFIG: &str = r#"{
  "architectures": ["LagunaForCausalLM"],
  "zzz_custom": {"b": 1, "a": [1, 2.5, null]},
  "model_type": "laguna",
  "hidden_size": 64,
  "head_dim": null,
  "eos_token_id": [2, 24],
  "rms_norm_eps": 1e-06,
  "num_attention_heads_per_layer": [4, 6],
  "layer_types": ["full_attention", "sliding_attention"],
  "sliding_window": 512,
  "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                      "full_attention": {"rope_type": "yarn", "factor": 128.0}},
  "quantization_config": {
    "quant_method": "compressed-tensors",
    "config_groups": {
      "group_1": {
        "weights": {"num_bits": 4, "type": "float", "symmetric": true, "group_size": 16,
                    "strategy": "tensor_group", "dynamic": false, "actorder": null,
                    "block_structure": null, "observer": "memoryless_minmax",
                    "observer_kwargs": {}, "scale_dtype": "torch.float8_e4m3fn",
                    "zp_dtype": null},
        "input_activations": {"num_bits": 4, "type": "float", "symmetric": true,
                              "group_size": 16, "strategy": "tensor_group", "dynamic": "local",
                              "observer": "static_minmax"},
        "output_activations": null,
        "targets": ["re:.*mlp\\.experts\\.\\d+\\.(gate|up|down)_proj$"],
        "format": "nvfp4-pack-quantized"
      },
      "group_0": {
        "targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "int", "dynamic": true, "future_key": 3},
        "input_activations": null
      }
    },
    "format": "mixed-precision",
    "ignore": ["lm_head"],
    "kv_cache_scheme": null,
    "sparsity_config": {},
    "global_compression_ratio": null,
    "version": "0.17.0"
  },
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16"
}"#;

/// Compact text of a JSON value: equal text means equal values *and* equal key order.
fn text(v: &impl serde::Serialize) -> String {
    serde_json::to_string(v).unwrap()
}

#[test]
fn model_config_round_trips_exactly() {
    let original: Value = serde_json::from_str(CONFIG).unwrap();
    let cfg: ModelConfig = serde_json::from_str(CONFIG).unwrap();
    assert_eq!(text(&cfg), text(&original));
    let again: Value = serde_json::from_str(&cfg.to_json_pretty()).unwrap();
    assert_eq!(text(&again), text(&original));

    assert_eq!(cfg.hidden_size.value(), Some(64));
    assert!(cfg.head_dim.is_null());
    assert!(cfg.num_hidden_layers.is_absent());
    assert_eq!(cfg.sliding_window, Field::Set(512));
    assert_eq!(cfg.weights_dtype(), Some("bfloat16"));
    assert_eq!(cfg.num_attention_heads_per_layer.get().unwrap(), &[4, 6]);
    assert!(cfg.extra.contains_key("zzz_custom"));
    let q = cfg.quantization_config.get().unwrap();
    let groups: Vec<&str> = q.groups().map(|(n, _)| n).collect();
    assert_eq!(groups, ["group_1", "group_0"]);
    let g1 = &q.config_groups.get().unwrap()["group_1"];
    let w = g1.weights.get().unwrap();
    assert!(w.is_nvfp4());
    assert!(w.actorder.is_null() && w.zp_dtype.is_null());
    assert_eq!(w.observer_kwargs.get().map(|m| m.len()), Some(0));
    assert_eq!(
        g1.input_activations.get().unwrap().dynamic,
        Field::Set(DynamicMode::Local)
    );
    let g0 = &q.config_groups.get().unwrap()["group_0"];
    assert!(g0.output_activations.is_absent() && g0.format.is_absent());
    assert_eq!(
        g0.weights.get().unwrap().dynamic.value(),
        Some(DynamicMode::Dynamic)
    );
    assert!(g0.weights.get().unwrap().extra.contains_key("future_key"));
    assert_eq!(q.ignore_list(), ["lm_head"]);
}

#[test]
fn edits_keep_order_and_append_new_keys_sorted() {
    let mut cfg: ModelConfig = serde_json::from_str(CONFIG).unwrap();
    cfg.hidden_size = Field::Set(128);
    cfg.num_hidden_layers = Field::Set(2);
    cfg.extra.insert("a_new_key".into(), json!(true));
    cfg.head_dim = Field::Absent;
    let out: Value = serde_json::to_value(&cfg).unwrap();
    let keys: Vec<&String> = out.as_object().unwrap().keys().collect();
    let original: Value = serde_json::from_str(CONFIG).unwrap();
    let mut expected: Vec<&String> = original
        .as_object()
        .unwrap()
        .keys()
        .filter(|k| *k != "head_dim")
        .collect();
    let (a, n) = ("a_new_key".to_owned(), "num_hidden_layers".to_owned());
    expected.extend([&a, &n]);
    assert_eq!(keys, expected);
    assert_eq!(out["hidden_size"], json!(128));
}

#[test]
fn nvfp4a16_preset_matches_spec_group_0() {
    // Spec §3.2, group_0, exactly as llmcompressor 0.14 / CT 0.20.1 write it (sorted keys).
    let spec = json!({
        "format": "nvfp4-pack-quantized",
        "input_activations": null,
        "output_activations": null,
        "targets": ["re:.*self_attn\\.(q|k|v|o)_proj$"],
        "weights": {"dynamic": false, "group_size": 16, "num_bits": 4,
                    "observer": "memoryless_minmax", "scale_dtype": "torch.float8_e4m3fn",
                    "strategy": "tensor_group", "symmetric": true, "type": "float"}
    });
    let ours = QuantizationScheme::nvfp4a16(["re:.*self_attn\\.(q|k|v|o)_proj$"]);
    assert_eq!(text(&ours), text(&spec));
    let parsed: QuantizationScheme = serde_json::from_value(spec).unwrap();
    assert_eq!(parsed, ours, "equality ignores key order");
    assert!(QuantizationArgs::nvfp4_weights().is_nvfp4());
}

#[test]
fn compressed_tensors_preset_matches_spec_top_level() {
    let groups = IndexMap::from([(
        "group_0".to_owned(),
        QuantizationScheme::nvfp4a16(["Linear"]),
    )]);
    let cfg = QuantizationConfig::compressed_tensors(groups, vec!["lm_head".into()]);
    let v = serde_json::to_value(&cfg).unwrap();
    let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
    assert_eq!(
        keys,
        [
            "config_groups",
            "format",
            "global_compression_ratio",
            "ignore",
            "kv_cache_scheme",
            "moe_sparsity_config",
            "quant_method",
            "quantization_status",
            "sparsity_config",
            "transform_config",
            "version"
        ]
    );
    assert_eq!(v["format"], json!("nvfp4-pack-quantized"));
    assert_eq!(v["quant_method"], json!("compressed-tensors"));
    assert_eq!(v["quantization_status"], json!("compressed"));
    assert_eq!(v["version"], json!("0.20.1"));
    assert_eq!(v["kv_cache_scheme"], Value::Null);
    assert_eq!(v["sparsity_config"], json!({}));

    let mixed = QuantizationConfig::compressed_tensors(
        IndexMap::from([
            ("group_0".to_owned(), QuantizationScheme::nvfp4a16(["a"])),
            ("group_1".to_owned(), QuantizationScheme::default()),
        ]),
        vec![],
    );
    assert_eq!(
        mixed.format.get().map(String::as_str),
        Some("mixed-precision")
    );
    assert_eq!(cfg.key_order, KeyOrder::Sorted);
}

#[test]
fn type_errors_name_the_field() {
    let bad =
        r#"{"quantization_config": {"config_groups": {"g": {"weights": {"num_bits": "4"}}}}}"#;
    let err =
        ModelConfig::from_slice(std::path::Path::new("x/config.json"), bad.as_bytes()).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, CheckpointError::Json { .. }));
    assert!(msg.contains("x/config.json"), "{msg}");
    assert!(
        msg.contains("quantization_config") && msg.contains("num_bits"),
        "{msg}"
    );

    let bad = r#"{"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"dynamic": "global"}}}}"#;
    let err = serde_json::from_str::<QuantizationConfig>(bad).unwrap_err();
    assert!(err.to_string().contains("dynamic"), "{err}");
    assert!(serde_json::from_str::<ModelConfig>("[1]").is_err());
}

#[test]
fn file_helpers_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    std::fs::write(&path, CONFIG).unwrap();
    let cfg = ModelConfig::from_path(&path).unwrap();
    let out = dir.path().join("out.json");
    cfg.write(&out).unwrap();
    let written = std::fs::read_to_string(&out).unwrap();
    assert!(written.ends_with("}\n"));
    assert_eq!(ModelConfig::from_path(&out).unwrap(), cfg);
    let missing = ModelConfig::from_path(dir.path().join("nope.json")).unwrap_err();
    assert!(matches!(missing, CheckpointError::Io { .. }));
}
