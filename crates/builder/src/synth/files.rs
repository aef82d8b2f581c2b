//! The JSON files of a synthetic checkpoint: `config.json` (with the stock layout's
//! `quantization_config`) and `generation_config.json`.

use fp4forge_format::config::{DynamicMode, Field};
use fp4forge_format::{QuantizationArgs, QuantizationConfig, QuantizationScheme};
use indexmap::IndexMap;
use serde_json::{json, Map, Value};

use super::geometry::LagunaGeometry;
use super::tensors::linear_modules;

/// The target of the routed experts in the stock NVFP4 config (spec §3.2).
pub const EXPERTS_TARGET: &str = r"re:.*mlp\.experts\.\d+\.(gate|up|down)_proj$";

/// The `input_activations` block of the compressed-tensors `NVFP4` (W4A4) preset as
/// llmcompressor 0.14 writes it: dynamic `"local"`, group_size 16, 4 bits, observer
/// `static_minmax`, scale_dtype `torch.float8_e4m3fn`, strategy `tensor_group`, symmetric, float.
pub fn nvfp4_input_activations() -> QuantizationArgs {
    QuantizationArgs {
        dynamic: DynamicMode::Local.into(),
        observer: "static_minmax".to_owned().into(),
        ..QuantizationArgs::nvfp4_weights()
    }
}

/// The `quantization_config` of the vendor stock layout, as llmcompressor 0.14 with
/// compressed-tensors 0.20.1 writes it: one group `group_0`, the NVFP4 (W4A4) scheme on
/// [`EXPERTS_TARGET`], and `ignore` rewritten to the explicit list of every other Linear module
/// (attention q/k/v/o/g, dense MLP, routers, shared experts, `lm_head`) in model order.
pub fn stock_quantization_config(geometry: &LagunaGeometry) -> QuantizationConfig {
    let mut scheme = QuantizationScheme::nvfp4a16([EXPERTS_TARGET]);
    scheme.input_activations = Field::Set(nvfp4_input_activations());
    let groups = IndexMap::from([("group_0".to_owned(), scheme)]);
    QuantizationConfig::compressed_tensors(groups, linear_modules(geometry, false))
}

/// The `config.json` to write: `config` without any `quantization_config`, plus
/// `quantization` when given, placed where transformers' sorted keys put it: before the first
/// key that sorts after it (`architectures` and `model_type`, which lead in Laguna's own
/// configs, sort before it anyway).
pub fn output_config(
    config: &Map<String, Value>,
    quantization: Option<&QuantizationConfig>,
) -> Map<String, Value> {
    const KEY: &str = "quantization_config";
    let mut out = Map::new();
    let mut pending = quantization.map(|q| serde_json::to_value(q).unwrap_or(Value::Null));
    for (k, v) in config {
        if k == KEY {
            continue;
        }
        if k.as_str() > KEY {
            if let Some(q) = pending.take() {
                out.insert(KEY.to_owned(), q);
            }
        }
        out.insert(k.clone(), v.clone());
    }
    if let Some(q) = pending {
        out.insert(KEY.to_owned(), q);
    }
    out
}

/// `generation_config.json`: the config's `bos_token_id`, `eos_token_id`, `pad_token_id` (those
/// present) and Laguna's sampling defaults (temperature 1.0, top_p 1.0, top_k 20), keys sorted.
pub fn generation_config(config: &Map<String, Value>) -> Map<String, Value> {
    let mut out = Map::new();
    out.insert("bos_token_id".into(), Value::Null);
    out.insert("do_sample".into(), json!(true));
    out.insert("eos_token_id".into(), Value::Null);
    out.insert("pad_token_id".into(), Value::Null);
    out.insert("temperature".into(), json!(1.0));
    out.insert("top_k".into(), json!(20));
    out.insert("top_p".into(), json!(1.0));
    for key in ["bos_token_id", "eos_token_id", "pad_token_id"] {
        match config.get(key) {
            Some(v) if !v.is_null() => {
                out.insert(key.into(), v.clone());
            }
            _ => {
                out.shift_remove(key);
            }
        }
    }
    out
}

/// Two-space indented JSON with a final newline, as transformers writes its JSON files.
pub fn pretty(map: &Map<String, Value>) -> Vec<u8> {
    let mut out = serde_json::to_vec_pretty(map).unwrap_or_default();
    out.push(b'\n');
    out
}
