//! Config coherence: the `quantization_config` of DST selects exactly the modules that are
//! quantized, each with one NVFP4 scheme of the right kind, and nothing else in `config.json`
//! changed (but `tie_word_embeddings`, which reads `false` after `--untie-lm-head`).

use std::collections::HashMap;

use fp4forge_format::{Checkpoint, QuantizationScheme};
use serde_json::Value;

use super::Check;
use crate::plan::fusion::fusion_key;
use crate::plan::modules::{LinearModule, ModuleState};
use crate::plan::untie;
use crate::plan::TargetMatcher;
use crate::BuilderError;

/// The config checks; `untied`: DST's `lm_head` is the untied, quantized copy of SRC's tied
/// embedding, so DST must say `tie_word_embeddings: false` and the flag is otherwise ignored.
pub(super) fn check(
    src: &Checkpoint,
    dst: &Checkpoint,
    dst_modules: &[LinearModule],
    untied: bool,
) -> Result<Vec<Check>, BuilderError> {
    let src_config = src.config()?;
    let dst_config = dst.config()?;

    let mut others = Check::new(if untied {
        "config.json unchanged apart from quantization_config and tie_word_embeddings"
    } else {
        "config.json unchanged apart from quantization_config"
    });
    let strip = |v: Value| {
        let v = match v {
            Value::Object(mut map) => {
                map.remove("quantization_config");
                Value::Object(map)
            }
            other => other,
        };
        if untied {
            untie::without_tie_flags(v)
        } else {
            v
        }
    };
    if untied && !untie::config_is_untied(&dst_config) {
        others.fail(format!(
            "{}: lm_head is untied but tie_word_embeddings is not false",
            dst.config_path().display()
        ));
    }
    let to_value = |c: &fp4forge_format::ModelConfig| -> Result<Value, BuilderError> {
        serde_json::from_str(&c.to_json_pretty()).map_err(|source| BuilderError::Json {
            path: dst.config_path(),
            source,
        })
    };
    others.count = 1;
    let (a, b) = (strip(to_value(&src_config)?), strip(to_value(&dst_config)?));
    if a != b {
        if let (Value::Object(a), Value::Object(b)) = (&a, &b) {
            let keys: Vec<&String> = a
                .keys()
                .chain(b.keys())
                .filter(|k| a.get(*k) != b.get(*k))
                .collect();
            others.fail(format!("keys differ: {keys:?}"));
        } else {
            others.fail("config differs".to_string());
        }
    }

    let mut schemes = Check::new("quantization_config selects exactly the quantized modules");
    let groups: Vec<(String, QuantizationScheme)> = dst_config
        .quantization_config
        .get()
        .map(|q| {
            q.groups()
                .map(|(n, s)| (n.to_string(), s.clone()))
                .collect()
        })
        .unwrap_or_default();
    let ignore: Vec<String> = dst_config
        .quantization_config
        .get()
        .map(|q| q.ignore_list().to_vec())
        .unwrap_or_default();
    let mut matchers = Vec::with_capacity(groups.len());
    for (name, scheme) in &groups {
        let targets = scheme.targets.get().cloned().unwrap_or_default();
        matchers.push((name.as_str(), scheme, TargetMatcher::new(targets, &ignore)?));
    }
    let mut resolved: HashMap<&str, &str> = HashMap::new();
    for m in dst_modules {
        schemes.count += 1;
        let hits: Vec<&(&str, &QuantizationScheme, TargetMatcher)> = matchers
            .iter()
            .filter(|(_, _, matcher)| matcher.matches(&m.name, true))
            .collect();
        match (&m.state, hits.as_slice()) {
            (ModuleState::Dense { .. }, []) => {}
            (ModuleState::Dense { .. }, hits) => schemes.fail(format!(
                "{} is not quantized but group {} selects it",
                m.name, hits[0].0
            )),
            (ModuleState::Packed { .. }, []) => {
                schemes.fail(format!("{} is quantized but no group selects it", m.name))
            }
            (ModuleState::Packed { w4a4 }, [(group, scheme, _)]) => {
                resolved.insert(&m.name, group);
                let weights_ok = scheme.weights.get().is_some_and(|w| w.is_nvfp4());
                let has_inputs = scheme.input_activations.get().is_some();
                if !weights_ok {
                    schemes.fail(format!("{}: group {group} is not NVFP4 weights", m.name));
                } else if has_inputs != *w4a4 {
                    schemes.fail(format!(
                        "{}: group {group} {} input activations but the module {} input_global_scale",
                        m.name,
                        if has_inputs { "quantizes" } else { "does not quantize" },
                        if *w4a4 { "has" } else { "has no" }
                    ));
                }
            }
            (ModuleState::Packed { .. }, hits) => schemes.fail(format!(
                "{} is selected by several groups ({}): ambiguous",
                m.name,
                hits.iter().map(|h| h.0).collect::<Vec<_>>().join(", ")
            )),
        }
    }
    // Fused shards must share a scheme (vLLM refuses mixed schemes in one fused layer).
    type Shards<'m> = Vec<(&'m str, Option<&'m &'m str>)>;
    let mut by_key: HashMap<(String, usize), Shards<'_>> = HashMap::new();
    for m in dst_modules {
        if let Some(key) = fusion_key(&m.name) {
            by_key
                .entry(key)
                .or_default()
                .push((&m.name, resolved.get(m.name.as_str())));
        }
    }
    for members in by_key.values() {
        if members.windows(2).any(|w| w[0].1 != w[1].1) {
            let names: Vec<&str> = members.iter().map(|m| m.0).collect();
            schemes.fail(format!(
                "fused siblings [{}] resolve to different schemes",
                names.join(", ")
            ));
        }
    }
    Ok(vec![others, schemes])
}
