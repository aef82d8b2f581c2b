//! What a `quantization_config` (compressed-tensors) does to the tensor set.
//!
//! Scope: `quant_method: compressed-tensors` with NVFP4 (`num_bits 4`, `type float`,
//! `group_size 16`) or FP8 (`num_bits 8`, `type float`) weights, and an 8-bit float
//! `kv_cache_scheme`. A module takes the scheme of the first group (in config order) that names
//! it by exact name or `re:` regex, else of the first group that selects it by class (`Linear`),
//! which is how vLLM resolves overlaps; `ignore` (shared by all groups) wins over both. A
//! `format` (global or per group) must be one that stores the group's weights
//! (`nvfp4-pack-quantized` for NVFP4, `float-quantized` or `naive-quantized` for FP8).

use serde::Serialize;
use serde_json::Value;

use super::arch::Architecture;
use super::tensor::TensorDesc;
use crate::plan::{is_linear_weight, TargetMatcher};
use crate::BuilderError;

/// How a group stores its weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WeightScheme {
    /// NVFP4: `weight_packed` U8 [out, in/2], `weight_scale` F8_E4M3 [out, in/16],
    /// `weight_global_scale` F32 [1].
    Nvfp4,
    /// FP8 E4M3 `weight` with an F32 `weight_scale` per tensor.
    Fp8Tensor,
    /// FP8 E4M3 `weight` with an F32 `weight_scale` per output channel.
    Fp8Channel,
    /// FP8 E4M3 `weight` with an F32 `weight_scale` per block of this shape.
    Fp8Block(u64, u64),
}

/// One `config_groups` entry.
#[derive(Debug, Clone)]
pub struct QuantGroup {
    /// The group's key (`group_0`).
    pub name: String,
    /// Its targets, with the config's `ignore` list.
    pub matcher: TargetMatcher,
    /// Weight storage.
    pub weights: WeightScheme,
    /// Whether `input_activations` is set: W4A4 NVFP4 adds `input_global_scale`, static FP8
    /// activations add `input_scale`.
    pub activations: bool,
    /// Whether the activation scale is computed at run time (FP8 `dynamic: true`; no tensor).
    pub dynamic_activations: bool,
}

/// A parsed `quantization_config`.
#[derive(Debug, Clone, Default)]
pub struct QuantConfig {
    /// `config_groups`, in config order.
    pub groups: Vec<QuantGroup>,
    /// `ignore`, as written.
    pub ignore: Vec<String>,
    /// Bits of the KV cache if `kv_cache_scheme` is set (8 for fp8).
    pub kv_cache_bits: Option<u64>,
}

impl QuantConfig {
    /// Reads `config["quantization_config"]`; `Ok(None)` when the model is unquantized.
    pub fn from_config(config: &Value, source: &str) -> Result<Option<Self>, BuilderError> {
        let Some(qc) = config.get("quantization_config").filter(|v| !v.is_null()) else {
            return Ok(None);
        };
        let err = |k: &str, r: &str| BuilderError::Config {
            source_name: source.to_string(),
            field: format!("quantization_config.{k}"),
            reason: r.to_string(),
        };
        let method = match qc.get("quant_method") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.as_str()),
            Some(v) => return Err(err("quant_method", &format!("expected a string, got {v}"))),
        };
        match method {
            Some("compressed-tensors") => {}
            other => {
                return Err(err(
                    "quant_method",
                    &format!("{other:?}: only compressed-tensors is understood"),
                ))
            }
        }
        let ignore: Vec<String> = match qc.get("ignore") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<_>>()
                .ok_or_else(|| err("ignore", "expected a list of strings"))?,
            Some(_) => return Err(err("ignore", "expected a list of strings")),
        };
        let top_format = match qc.get("format") {
            None | Some(Value::Null) => None,
            Some(Value::String(f)) if f == MIXED_PRECISION || format_scheme(f).is_some() => {
                Some(f.as_str())
            }
            Some(f) => {
                return Err(err(
                    "format",
                    &format!("unknown format {f}; understood: {}", known_formats()),
                ))
            }
        };
        let mut groups = Vec::new();
        if let Some(Value::Object(map)) = qc.get("config_groups") {
            for (name, g) in map {
                let gf = |k: &str| format!("config_groups.{name}.{k}");
                let targets: Vec<&str> = g
                    .get("targets")
                    .and_then(Value::as_array)
                    .and_then(|a| a.iter().map(Value::as_str).collect::<Option<_>>())
                    .ok_or_else(|| err(&gf("targets"), "expected a list of strings"))?;
                let w = g
                    .get("weights")
                    .filter(|v| !v.is_null())
                    .ok_or_else(|| err(&gf("weights"), "missing"))?;
                let weights = weight_scheme(w).map_err(|r| err(&gf("weights"), &r))?;
                let (field, format) = match g.get("format") {
                    None | Some(Value::Null) => ("format".to_string(), top_format),
                    Some(Value::String(f)) => (gf("format"), Some(f.as_str())),
                    Some(f) => {
                        return Err(err(&gf("format"), &format!("expected a string, got {f}")))
                    }
                };
                match format.filter(|f| *f != MIXED_PRECISION) {
                    None => {}
                    Some(f) => match format_scheme(f) {
                        None => {
                            return Err(err(
                                &field,
                                &format!("unknown format {f:?}; understood: {}", known_formats()),
                            ))
                        }
                        Some(nvfp4) if nvfp4 != (weights == WeightScheme::Nvfp4) => {
                            return Err(err(
                                &field,
                                &format!("format {f:?} does not store {weights:?} weights"),
                            ))
                        }
                        Some(_) => {}
                    },
                }
                let acts = g.get("input_activations").filter(|v| !v.is_null());
                groups.push(QuantGroup {
                    name: name.clone(),
                    matcher: TargetMatcher::new(targets, &ignore)?,
                    weights,
                    activations: acts.is_some(),
                    dynamic_activations: acts
                        .and_then(|a| a.get("dynamic"))
                        .is_some_and(|d| d == &Value::Bool(true)),
                });
            }
        }
        let kv_cache_bits = match qc.get("kv_cache_scheme") {
            None | Some(Value::Null) => None,
            Some(kv) => Some(
                kv.get("num_bits")
                    .and_then(Value::as_u64)
                    .ok_or_else(|| err("kv_cache_scheme.num_bits", "missing"))?,
            ),
        };
        Ok(Some(Self {
            groups,
            ignore,
            kv_cache_bits,
        }))
    }

    /// The group that quantizes `module`, if any.
    pub fn group_for(&self, module: &str, is_linear: bool) -> Option<&QuantGroup> {
        self.groups
            .iter()
            .find(|g| g.matcher.matches_by_name(module, is_linear))
            .or_else(|| {
                self.groups
                    .iter()
                    .find(|g| g.matcher.matches(module, is_linear))
            })
    }

    /// Rewrites an unquantized tensor set the way the compressor would store it, and adds the
    /// KV-cache scales (`self_attn.k_scale` / `v_scale`, model dtype, `[1]`) if the KV cache is
    /// quantized.
    pub fn apply(
        &self,
        arch: &Architecture,
        tensors: Vec<TensorDesc>,
    ) -> Result<Vec<TensorDesc>, BuilderError> {
        let mut out = Vec::with_capacity(tensors.len());
        for t in tensors {
            let linear = is_linear_weight(&t.name, &t.shape);
            let group = if linear {
                self.group_for(t.module(), true)
            } else {
                None
            };
            let Some(group) = group else {
                out.push(t);
                continue;
            };
            let m = t.module().to_string();
            let (rows, cols) = (t.shape[0], t.shape[1]);
            let f32_scalar = |leaf: &str| TensorDesc::new(format!("{m}.{leaf}"), "F32", vec![1]);
            match group.weights {
                WeightScheme::Nvfp4 => {
                    if !cols.is_multiple_of(16) {
                        return Err(BuilderError::Tensor {
                            tensor: t.name,
                            reason: format!("NVFP4 needs in % 16 == 0, got in = {cols}"),
                        });
                    }
                    out.push(TensorDesc::new(
                        format!("{m}.weight_packed"),
                        "U8",
                        vec![rows, cols / 2],
                    ));
                    out.push(TensorDesc::new(
                        format!("{m}.weight_scale"),
                        "F8_E4M3",
                        vec![rows, cols / 16],
                    ));
                    out.push(f32_scalar("weight_global_scale"));
                    if group.activations {
                        out.push(f32_scalar("input_global_scale"));
                    }
                }
                scheme => {
                    let scale_shape = match scheme {
                        WeightScheme::Fp8Channel => vec![rows, 1],
                        WeightScheme::Fp8Block(br, bc) => {
                            vec![rows.div_ceil(br), cols.div_ceil(bc)]
                        }
                        _ => vec![1],
                    };
                    out.push(TensorDesc::new(
                        format!("{m}.weight"),
                        "F8_E4M3",
                        vec![rows, cols],
                    ));
                    out.push(TensorDesc::new(
                        format!("{m}.weight_scale"),
                        "F32",
                        scale_shape,
                    ));
                    if group.activations && !group.dynamic_activations {
                        out.push(f32_scalar("input_scale"));
                    }
                }
            }
        }
        if self.kv_cache_bits.is_some() {
            for i in 0..arch.layers.len() {
                for leaf in ["k_scale", "v_scale"] {
                    out.push(TensorDesc::new(
                        format!("model.layers.{i}.self_attn.{leaf}"),
                        arch.dtype.clone(),
                        vec![1],
                    ));
                }
            }
        }
        Ok(out)
    }
}

/// The global `format` of groups that differ.
const MIXED_PRECISION: &str = "mixed-precision";

/// The compression formats understood, and whether each stores NVFP4 (else FP8) weights.
const FORMATS: [(&str, bool); 3] = [
    ("nvfp4-pack-quantized", true),
    ("float-quantized", false),
    ("naive-quantized", false),
];

/// Whether a known `format` stores NVFP4 (`Some(true)`) or FP8 (`Some(false)`) weights.
fn format_scheme(format: &str) -> Option<bool> {
    FORMATS.iter().find(|f| f.0 == format).map(|f| f.1)
}

/// The understood formats, for messages.
fn known_formats() -> String {
    let mut names: Vec<&str> = FORMATS.iter().map(|f| f.0).collect();
    names.push(MIXED_PRECISION);
    names.join(", ")
}

/// Reads one group's `weights` arguments.
fn weight_scheme(w: &Value) -> Result<WeightScheme, String> {
    let get = |k: &str| w.get(k).filter(|v| !v.is_null());
    let bits = get("num_bits").and_then(Value::as_u64);
    let ty = get("type").and_then(Value::as_str).unwrap_or("int");
    let strategy = get("strategy").and_then(Value::as_str).unwrap_or("");
    match (bits, ty) {
        (Some(4), "float") => match get("group_size").and_then(Value::as_u64) {
            Some(16) => Ok(WeightScheme::Nvfp4),
            other => Err(format!("4-bit float needs group_size 16, got {other:?}")),
        },
        (Some(8), "float") => match strategy {
            "tensor" => Ok(WeightScheme::Fp8Tensor),
            "channel" => Ok(WeightScheme::Fp8Channel),
            "block" => {
                let b = get("block_structure")
                    .and_then(Value::as_array)
                    .and_then(|a| a.iter().map(Value::as_u64).collect::<Option<Vec<_>>>())
                    .filter(|b| b.len() == 2 && b[0] > 0 && b[1] > 0)
                    .ok_or("fp8 block strategy needs block_structure [rows, cols]")?;
                Ok(WeightScheme::Fp8Block(b[0], b[1]))
            }
            other => Err(format!("unsupported fp8 strategy {other:?}")),
        },
        (bits, ty) => Err(format!(
            "unsupported weights: num_bits {bits:?}, type {ty:?} (NVFP4 and FP8 are understood)"
        )),
    }
}
