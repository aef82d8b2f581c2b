//! `inspect` on a dense Llama-style config, on a real (tiny) safetensors checkpoint, and on bad
//! input.

use std::io::Write;
use std::path::Path;

use fp4forge_builder::inspect::{
    unquantized_tensors, Architecture, Basis, Component, Inspector, KvDtype, QuantConfig,
    TensorDesc,
};
use fp4forge_builder::BuilderError;
use serde_json::{json, Value};

/// SmolLM2-135M's config (the parts that shape tensors).
fn smollm2() -> Value {
    json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_attention_heads": 9,
        "num_hidden_layers": 30,
        "num_key_value_heads": 3,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": true,
        "torch_dtype": "bfloat16",
        "vocab_size": 49152
    })
}

#[test]
fn dense_llama_with_tied_embeddings() {
    let r = Inspector::new()
        .inspect_config(&smollm2(), "smollm2")
        .unwrap();
    assert_eq!(r.totals.params, 134_515_008);
    assert_eq!(r.totals.bytes, 2 * 134_515_008);
    assert_eq!(r.totals.attention_params, 30 * 2 * (576 * 576 + 192 * 576));
    assert!(r.quantization.is_none());
    assert_eq!(r.model.moe_layers, 0);
    let embedding_bytes = 2 * 49_152 * 576;
    let tied = r
        .components
        .iter()
        .find(|c| c.component == Component::LmHeadTied)
        .unwrap();
    assert_eq!((tied.tensors, tied.bytes), (0, 0));
    assert_eq!(tied.bytes_per_token, embedding_bytes as f64);
    // Every weight once, the embedding table once more as lm_head, plus one row.
    let want = (2 * 134_515_008 - embedding_bytes) as f64 + embedding_bytes as f64 + 2.0 * 576.0;
    assert!((r.totals.bytes_per_token - want).abs() < 1e-3);
    // bf16 KV: 2 × 3 heads × 64 × 2 B × 30 layers; contexts stop at 8K.
    assert_eq!(r.kv_cache.dtype, KvDtype::Bf16);
    assert_eq!(r.kv_cache.groups.len(), 1);
    assert_eq!(
        r.kv_cache.groups[0].bytes_per_token_bf16,
        2 * 3 * 64 * 2 * 30
    );
    let ctx: Vec<u64> = r.kv_cache.contexts.iter().map(|c| c.context).collect();
    assert_eq!(ctx, vec![4096, 8192]);
}

fn tiny_laguna() -> Value {
    let nvfp4 = json!({"num_bits": 4, "type": "float", "symmetric": true, "group_size": 16,
                       "strategy": "tensor_group", "dynamic": false});
    json!({
        "architectures": ["LagunaForCausalLM"],
        "model_type": "laguna",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 2,
        "num_attention_heads_per_layer": [2, 4, 4, 4],
        "num_key_value_heads": 2,
        "head_dim": 16,
        "layer_types": ["full_attention", "sliding_attention", "sliding_attention", "sliding_attention"],
        "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"],
        "sliding_window": 8,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
        "gating": "per-head",
        "max_position_embeddings": 4096,
        "tie_word_embeddings": false,
        "torch_dtype": "bfloat16",
        "vocab_size": 256,
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "format": "nvfp4-pack-quantized",
            "config_groups": {
                "group_0": {"targets": ["re:.*self_attn\\.(q|k|v|o)_proj$"], "weights": nvfp4,
                            "input_activations": null},
                "group_1": {"targets": ["re:.*mlp\\.experts\\.\\d+\\.(gate|up|down)_proj$"],
                            "weights": nvfp4, "input_activations": nvfp4}
            },
            "ignore": ["lm_head"],
            "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor",
                                "symmetric": true, "dynamic": false}
        }
    })
}

/// Writes `tensors` (zero-filled) as one `model.safetensors`.
fn write_safetensors(path: &Path, tensors: &[TensorDesc]) {
    let mut header = serde_json::Map::new();
    let mut offset = 0u64;
    for t in tensors {
        let len = t.bytes().unwrap();
        header.insert(
            t.name.clone(),
            json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [offset, offset + len]}),
        );
        offset += len;
    }
    let mut text = Value::Object(header).to_string();
    while !text.len().is_multiple_of(8) {
        text.push(' ');
    }
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(&(text.len() as u64).to_le_bytes()).unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f.write_all(&vec![0u8; offset as usize]).unwrap();
}

#[test]
fn checkpoint_headers_agree_with_config() {
    let cfg = tiny_laguna();
    let arch = Architecture::from_config(&cfg, "tiny").unwrap();
    let quant = QuantConfig::from_config(&cfg, "tiny").unwrap().unwrap();
    let tensors = quant
        .apply(&arch, unquantized_tensors(&arch, "tiny").unwrap())
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), cfg.to_string()).unwrap();
    write_safetensors(&dir.path().join("model.safetensors"), &tensors);

    let from_headers = Inspector::new().inspect_path(dir.path()).unwrap();
    let from_config = Inspector::new().inspect_config(&cfg, "tiny").unwrap();
    assert_eq!(from_headers.basis, Basis::Headers);
    assert_eq!(from_config.basis, Basis::Config);
    assert_eq!(from_headers.components, from_config.components);
    assert_eq!(from_headers.totals, from_config.totals);
    assert_eq!(from_headers.kv_cache, from_config.kv_cache);

    // The same directory without weights falls back to the config.
    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    let bare = Inspector::new().inspect_path(dir.path()).unwrap();
    assert_eq!(bare.basis, Basis::Config);
    assert_eq!(bare.totals, from_config.totals);

    // Gate width = heads per layer; 3 MoE layers × 2 of 8 experts read per token.
    let t = &from_config.totals;
    let gate_params: u64 = [2u64, 4, 4, 4].iter().map(|h| h * 64).sum();
    let gate = from_config
        .components
        .iter()
        .find(|c| c.component == Component::AttnGate)
        .unwrap();
    assert_eq!(gate.params, gate_params);
    let experts = from_config
        .components
        .iter()
        .find(|c| c.component == Component::RoutedExperts)
        .unwrap();
    assert_eq!(experts.bytes_per_token, experts.bytes as f64 * 2.0 / 8.0);
    assert!(t.bytes_per_token < t.bytes as f64);
}

#[test]
fn errors_name_what_they_are_about() {
    let err = Inspector::new()
        .inspect_path(Path::new("/nonexistent/config.json"))
        .unwrap_err();
    assert!(matches!(err, BuilderError::Io { .. }));
    assert!(err.to_string().contains("/nonexistent/config.json"));

    let mut cfg = smollm2();
    cfg["model_type"] = "gpt_neox".into();
    let err = Inspector::new()
        .inspect_config(&cfg, "neox.json")
        .unwrap_err();
    assert!(err.to_string().contains("model_type"), "{err}");

    let mut cfg = smollm2();
    cfg.as_object_mut().unwrap().remove("hidden_size");
    let err = Inspector::new().inspect_config(&cfg, "c.json").unwrap_err();
    assert_eq!(
        err.to_string(),
        "c.json: config field `hidden_size`: missing"
    );

    let mut cfg = tiny_laguna();
    cfg["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] = 3.into();
    let err = Inspector::new().inspect_config(&cfg, "q.json").unwrap_err();
    assert!(
        err.to_string()
            .contains("quantization_config.config_groups.group_0.weights"),
        "{err}"
    );

    let mut cfg = tiny_laguna();
    cfg["quantization_config"]["ignore"] = json!(["re:(?<=x)y"]);
    let err = Inspector::new().inspect_config(&cfg, "q.json").unwrap_err();
    assert!(matches!(err, BuilderError::InvalidPattern { .. }), "{err}");
}

#[test]
fn qwen3_moe_from_config() {
    // Qwen3-30B-A3B: 30 532 122 624 parameters, ~3.3 B active.
    let cfg = json!({
        "model_type": "qwen3_moe",
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 768,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "max_position_embeddings": 40960,
        "sliding_window": null,
        "use_sliding_window": false,
        "tie_word_embeddings": false,
        "torch_dtype": "bfloat16",
        "vocab_size": 151936
    });
    let r = Inspector::new().inspect_config(&cfg, "qwen3").unwrap();
    assert_eq!(r.totals.params, 30_532_122_624);
    assert_eq!(r.totals.active_params, 3_041_867_776.0);
    assert_eq!(r.totals.active_params_with_embedding, 3_353_032_704.0);
    assert_eq!(r.model.moe_layers, 48);
    assert_eq!(r.model.sliding_attention_layers, 0);
}

#[test]
fn fp8_channel_scheme() {
    let mut cfg = smollm2();
    cfg["quantization_config"] = json!({
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {"group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": true,
                        "dynamic": false},
            "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                                  "symmetric": true, "dynamic": true}
        }},
        "ignore": ["lm_head"]
    });
    let arch = Architecture::from_config(&cfg, "fp8").unwrap();
    let quant = QuantConfig::from_config(&cfg, "fp8").unwrap().unwrap();
    let tensors = quant
        .apply(&arch, unquantized_tensors(&arch, "fp8").unwrap())
        .unwrap();
    let find = |n: &str| tensors.iter().find(|t| t.name == n).unwrap();
    let w = find("model.layers.0.mlp.down_proj.weight");
    assert_eq!(
        (w.dtype.as_str(), w.shape.clone()),
        ("F8_E4M3", vec![576, 1536])
    );
    let s = find("model.layers.0.mlp.down_proj.weight_scale");
    assert_eq!((s.dtype.as_str(), s.shape.clone()), ("F32", vec![576, 1]));
    // Dynamic activations: no input_scale tensor.
    assert!(!tensors.iter().any(|t| t.name.ends_with("input_scale")));
    let r = Inspector::new().inspect_config(&cfg, "fp8").unwrap();
    assert_eq!(r.totals.params, 134_515_008);
    let mlp = r
        .components
        .iter()
        .find(|c| c.component == Component::DenseMlp)
        .unwrap();
    assert_eq!(mlp.precision.to_string(), "fp8");
    assert_eq!(
        mlp.bytes,
        30 * 3 * 576 * 1536 + 30 * 4 * (1536 + 1536 + 576)
    );
}
