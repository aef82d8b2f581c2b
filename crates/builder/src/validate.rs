//! One validation of a checkpoint, shared by `quantize` (its SRC), `verify` (SRC and DST) and
//! `inspect`: what a loader (vLLM, transformers, our engine) would refuse is refused here, by
//! name, before anything is built, blessed or accounted.
//!
//! - `config.json` must give the model's geometry ([`fp4forge_arch::ShapeSpec`], the lenient
//!   sizes-only read): `{}` is refused.
//! - A `quantization_config` must be compressed-tensors with schemes the builder understands
//!   ([`QuantConfig::from_config`]: NVFP4 or FP8 weights, a known `format`); `awq`, an unknown
//!   format or `num_bits: 3` are refused.
//! - Every tensor that the geometry names (a family whose tensor names are known) has the
//!   geometry's shape: a `q_proj.weight` stored `[4096]` or `[4, 16, 64]` is refused.
//! - Every module the config quantizes is complete and well formed. NVFP4 (spec §2):
//!   `weight_packed` U8 `[r, c/2]`, `weight_scale` F8_E4M3 `[r, c/16]`, `weight_global_scale`
//!   F32 `[1]`, `input_global_scale` F32 `[1]` exactly when the group quantizes activations, and
//!   no `weight`; `[r, c]` is the geometry's, else read from `weight_packed`. FP8: an F8_E4M3
//!   `weight` with a `weight_scale` of the strategy's size. A module no group selects stores no
//!   quantized tensors.
//! - Fused siblings (q/k/v, gate/up: judged by name, whatever their shapes) resolve to one
//!   scheme, as vLLM requires.

use std::collections::{BTreeMap, HashMap};

use fp4forge_arch::ShapeSpec;
use fp4forge_format::Checkpoint;
use serde_json::Value;

use crate::inspect::{QuantConfig, QuantGroup, TensorDesc, WeightScheme};
use crate::plan::fusion::fusion_key;
use crate::plan::is_embedding_module;
use crate::plan::modules::fused_expert_kind;
use crate::BuilderError;

/// Problems listed in one error (the count is always complete).
const MAX_LISTED: usize = 12;

/// Tensor leaves that only a quantized module stores.
const QUANTIZED_LEAVES: [&str; 5] = [
    "weight_packed",
    "weight_scale",
    "weight_global_scale",
    "input_global_scale",
    "input_scale",
];

/// A checkpoint's config, read and checked.
#[derive(Debug, Clone)]
pub struct Validated {
    /// The model's geometry.
    pub shape: ShapeSpec,
    /// The `quantization_config`, if the model is quantized.
    pub quant: Option<QuantConfig>,
}

/// Validates `config` (a parsed `config.json`; `source` names it in errors) and, when given,
/// the checkpoint's `tensors` (header entries) against it.
pub fn validate(
    config: &Value,
    source: &str,
    tensors: Option<&[TensorDesc]>,
) -> Result<Validated, BuilderError> {
    if !config.is_object() {
        return Err(BuilderError::Config {
            source_name: source.to_string(),
            field: "(root)".into(),
            reason: "expected a JSON object".into(),
        });
    }
    let shape = ShapeSpec::from_config(config, source).map_err(|e| renamed(e.into(), source))?;
    let quant = QuantConfig::from_config(config, source)?;
    if let Some(tensors) = tensors {
        let problems = tensor_problems(&shape, quant.as_ref(), tensors);
        if !problems.is_empty() {
            return Err(BuilderError::Malformed {
                source_name: source.to_string(),
                count: problems.len(),
                problems: problems.into_iter().take(MAX_LISTED).collect(),
            });
        }
    }
    Ok(Validated { shape, quant })
}

/// [`validate`] of an opened checkpoint: its `config.json` and every tensor of its shards.
pub fn validate_checkpoint(checkpoint: &Checkpoint) -> Result<Validated, BuilderError> {
    let path = checkpoint.config_path();
    let text = std::fs::read(&path).map_err(|source| BuilderError::Io {
        path: path.clone(),
        source,
    })?;
    let config: Value = serde_json::from_slice(&text).map_err(|source| BuilderError::Json {
        path: path.clone(),
        source,
    })?;
    let tensors: Vec<TensorDesc> = checkpoint
        .tensors()
        .map(|t| {
            TensorDesc::new(
                t.info.name.clone(),
                t.info.dtype.to_string(),
                t.info.shape.iter().map(|&d| d as u64).collect(),
            )
        })
        .collect();
    validate(&config, &path.display().to_string(), Some(&tensors))
}

/// A config error that names `source` (the arch crate names the file it was given).
fn renamed(e: BuilderError, source: &str) -> BuilderError {
    match e {
        BuilderError::Config { field, reason, .. } => BuilderError::Config {
            source_name: source.to_string(),
            field,
            reason,
        },
        other => other,
    }
}

/// `[a, b]` as a shape is written in messages.
fn dims(shape: &[u64]) -> String {
    format!("{shape:?}")
}

/// The tensors of one module, by leaf.
type Leaves<'t> = BTreeMap<&'t str, &'t TensorDesc>;

/// Everything wrong with `tensors` given the geometry and the quantization config.
fn tensor_problems(
    shape: &ShapeSpec,
    quant: Option<&QuantConfig>,
    tensors: &[TensorDesc],
) -> Vec<String> {
    let mut problems = Vec::new();
    // The geometry's tensor set, where the family's names are known.
    let expected: HashMap<String, Vec<u64>> = match shape.tensors() {
        Ok(list) => list.into_iter().map(|t| (t.name, t.shape)).collect(),
        Err(_) => HashMap::new(),
    };
    for t in tensors {
        if let Some(want) = expected.get(&t.name) {
            if &t.shape != want {
                problems.push(format!(
                    "{}: shape {} but the config's geometry gives {}",
                    t.name,
                    dims(&t.shape),
                    dims(want)
                ));
            }
        }
    }

    // Modules: everything that has a `weight` or a quantized leaf, in tensor order.
    let mut modules: Vec<&str> = Vec::new();
    let mut leaves: HashMap<&str, Leaves<'_>> = HashMap::new();
    for t in tensors {
        let (module, leaf) = (t.module(), t.leaf());
        if module.is_empty() || !(leaf == "weight" || QUANTIZED_LEAVES.contains(&leaf)) {
            continue;
        }
        let shape_usize: Vec<usize> = t.shape.iter().map(|&d| d as usize).collect();
        if leaf == "weight" && fused_expert_kind(&t.name, &shape_usize).is_some() {
            continue; // transformers' fused 3-D experts: split per expert, never stored packed
        }
        let entry = leaves.entry(module).or_default();
        if entry.is_empty() {
            modules.push(module);
        }
        entry.insert(leaf, t);
    }

    let mut resolved: HashMap<&str, Option<&str>> = HashMap::new();
    for &module in &modules {
        let l = &leaves[module];
        let expected_weight = expected
            .get(&format!("{module}.weight"))
            .filter(|s| s.len() == 2);
        // Linear as transformers builds it (a 2-D weight outside the embedding, by the file or
        // by the geometry), stored packed, or named as a fused sibling.
        let linear = l.contains_key("weight_packed")
            || (!is_embedding_module(module)
                && (l.get("weight").is_some_and(|w| w.shape.len() == 2)
                    || expected_weight.is_some()
                    || fusion_key(module).is_some()));
        let group = quant.and_then(|q| q.group_for(module, linear).filter(|_| linear));
        resolved.insert(module, group.map(|g| g.name.as_str()));
        match group {
            Some(g) => check_quantized(module, g, l, expected_weight, &mut problems),
            None => {
                let stored: Vec<&str> = QUANTIZED_LEAVES
                    .iter()
                    .copied()
                    .filter(|leaf| l.contains_key(leaf))
                    .collect();
                if !stored.is_empty() {
                    problems.push(format!(
                        "{module}: stores {} but no quantization_config group quantizes it",
                        stored.join(", ")
                    ));
                }
            }
        }
    }

    // Fused siblings, judged by name, resolve to one scheme.
    let mut fused: BTreeMap<(String, usize), Vec<&str>> = BTreeMap::new();
    for &module in &modules {
        if let Some(key) = fusion_key(module) {
            fused.entry(key).or_default().push(module);
        }
    }
    for members in fused.values() {
        let first = resolved[members[0]];
        if members.iter().any(|m| resolved[m] != first) {
            let each: Vec<String> = members
                .iter()
                .map(|m| format!("{m} ({})", resolved[m].unwrap_or("not quantized")))
                .collect();
            problems.push(format!(
                "fused siblings resolve to different schemes: {}; they share one global scale, \
                 so quantize all of them or none",
                each.join(", ")
            ));
        }
    }
    problems
}

/// Checks one module that group `g` quantizes; `expected` is the geometry's `[rows, cols]`.
fn check_quantized(
    module: &str,
    g: &QuantGroup,
    l: &Leaves<'_>,
    expected: Option<&Vec<u64>>,
    problems: &mut Vec<String>,
) {
    let at = |leaf: &str| format!("{module}.{leaf}");
    let mut need = |leaf: &str, dtype: &str| -> Option<&TensorDesc> {
        match l.get(leaf) {
            None => {
                problems.push(format!(
                    "{module}: group {} quantizes it but {} is missing",
                    g.name,
                    at(leaf)
                ));
                None
            }
            Some(t) if t.dtype != dtype => {
                problems.push(format!(
                    "{}: dtype {}, expected {dtype} (group {})",
                    t.name, t.dtype, g.name
                ));
                None
            }
            Some(t) => Some(*t),
        }
    };
    match g.weights {
        WeightScheme::Nvfp4 => {
            let packed = need("weight_packed", "U8");
            let scale = need("weight_scale", "F8_E4M3");
            let global = need("weight_global_scale", "F32");
            let input = if g.activations {
                need("input_global_scale", "F32")
            } else {
                None
            };
            for extra in ["weight", "input_scale"]
                .into_iter()
                .chain((!g.activations).then_some("input_global_scale"))
            {
                if l.contains_key(extra) {
                    problems.push(format!(
                        "{}: present, but group {} stores NVFP4{} (weight_packed, weight_scale, \
                         weight_global_scale{})",
                        at(extra),
                        g.name,
                        if g.activations { "" } else { " weight-only" },
                        if g.activations {
                            ", input_global_scale"
                        } else {
                            ""
                        }
                    ));
                }
            }
            let (rows, cols) = match (expected, packed) {
                (Some(e), _) => (e[0], e[1]),
                (None, Some(p)) if p.shape.len() == 2 => (p.shape[0], p.shape[1] * 2),
                (None, Some(p)) => {
                    problems.push(format!(
                        "{}: shape {}, expected 2-D [out, in/2]",
                        p.name,
                        dims(&p.shape)
                    ));
                    return;
                }
                (None, None) => return,
            };
            if cols % 16 != 0 {
                problems.push(format!(
                    "{module}: input dimension {cols} is not a multiple of 16 (NVFP4 blocks)"
                ));
                return;
            }
            let from = if expected.is_some() {
                format!(" (geometry [{rows}, {cols}])")
            } else {
                String::new()
            };
            for (t, want) in [
                (packed, vec![rows, cols / 2]),
                (scale, vec![rows, cols / 16]),
                (global, vec![1]),
                (input, vec![1]),
            ] {
                if let Some(t) = t {
                    if t.shape != want {
                        problems.push(format!(
                            "{}: shape {}, expected {}{from}",
                            t.name,
                            dims(&t.shape),
                            dims(&want)
                        ));
                    }
                }
            }
        }
        scheme => {
            let weight = need("weight", "F8_E4M3");
            let scale = l.get("weight_scale").copied();
            if scale.is_none() {
                problems.push(format!(
                    "{module}: group {} quantizes it but {} is missing",
                    g.name,
                    at("weight_scale")
                ));
            }
            if g.activations && !g.dynamic_activations && !l.contains_key("input_scale") {
                problems.push(format!(
                    "{module}: group {} has static input activations but {} is missing",
                    g.name,
                    at("input_scale")
                ));
            }
            if l.contains_key("weight_packed") {
                problems.push(format!(
                    "{}: present, but group {} stores FP8",
                    at("weight_packed"),
                    g.name
                ));
            }
            let Some(w) = weight else { return };
            let want_weight = expected.cloned().unwrap_or_else(|| w.shape.clone());
            if w.shape.len() != 2 || w.shape != want_weight {
                problems.push(format!(
                    "{}: shape {}, expected {}",
                    w.name,
                    dims(&w.shape),
                    dims(&want_weight)
                ));
                return;
            }
            let (rows, cols) = (w.shape[0], w.shape[1]);
            let elements: u64 = match scheme {
                WeightScheme::Fp8Channel => rows,
                WeightScheme::Fp8Block(br, bc) => rows.div_ceil(br) * cols.div_ceil(bc),
                _ => 1,
            };
            if let Some(s) = scale {
                if !matches!(s.dtype.as_str(), "F32" | "BF16" | "F16") {
                    problems.push(format!("{}: dtype {}, expected a float", s.name, s.dtype));
                }
                if s.numel() != elements {
                    problems.push(format!(
                        "{}: shape {}, expected {elements} scales for {scheme:?}",
                        s.name,
                        dims(&s.shape)
                    ));
                }
            }
        }
    }
}
