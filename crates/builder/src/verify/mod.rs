//! `verify SRC DST`: proves that DST was built from SRC. Every NVFP4 module of DST whose
//! high-precision weight is in SRC is re-derived (same numerics, same fused global-scale groups)
//! and compared bit for bit; every other tensor is compared byte for byte; the config must select
//! exactly the modules that are quantized, each with one unambiguous NVFP4 scheme.
//!
//! A DST built with `--untie-lm-head` from a tied SRC has an NVFP4 `lm_head` that SRC does not
//! store: it is re-derived from SRC's embedding (the tied matrix), and `tie_word_embeddings`
//! may (must) read `false` in DST.

mod config_check;
mod report;

use std::collections::{HashMap, HashSet};
use std::path::Path;

use fp4forge_arch::LM_HEAD_MODULE;
use fp4forge_format::Checkpoint;
use rayon::prelude::*;

use crate::build::{quantize_members, source_bytes};
use crate::plan::fusion::global_scale_groups;
use crate::plan::modules::{
    fused_expert_kind, linear_modules, LinearModule, ModuleState, WeightSource, NVFP4_SUFFIXES,
};
use crate::plan::untie::{self, UntieLmHead};
use crate::plan::QuantizeMember;
use crate::validate::validate_checkpoint;
use crate::BuilderError;
pub use report::{Check, CheckStatus, VerifyReport};

/// How many failures each check lists (the count is always complete).
const MAX_LISTED: usize = 20;

/// Runs every check of DST against SRC. Fails when a checkpoint cannot be read or is malformed
/// ([`crate::validate`]: the same validation `quantize` and `inspect` apply); differences are
/// reported in the [`VerifyReport`] (see [`VerifyReport::passed`]).
pub fn verify(src: &Path, dst: &Path) -> Result<VerifyReport, BuilderError> {
    let src_ck = Checkpoint::open(src)?;
    let dst_ck = Checkpoint::open(dst)?;
    let src_valid = validate_checkpoint(&src_ck)?;
    validate_checkpoint(&dst_ck)?;
    let src_infos: Vec<_> = src_ck.tensors().map(|e| e.info.clone()).collect();
    let dst_infos: Vec<_> = dst_ck.tensors().map(|e| e.info.clone()).collect();
    let src_modules = linear_modules(&src_infos);
    let dst_modules = linear_modules(&dst_infos);
    let src_by_name: HashMap<&str, &LinearModule> =
        src_modules.iter().map(|m| (m.name.as_str(), m)).collect();
    // An untied lm_head: packed in DST, absent from a tied SRC, whose embedding it quantizes.
    let untied: Option<UntieLmHead> = dst_modules
        .iter()
        .find(|m| {
            m.name == LM_HEAD_MODULE
                && matches!(m.state, ModuleState::Packed { .. })
                && !src_by_name.contains_key(m.name.as_str())
        })
        .and_then(|_| untie::resolve(&src_valid.shape, &src_infos).ok());

    let mut report = VerifyReport::default();
    let packed_dst: Vec<&LinearModule> = dst_modules
        .iter()
        .filter(|m| matches!(m.state, ModuleState::Packed { .. }))
        .collect();

    // How DST's module `m` is re-derived: from SRC's `source` of `dtype`.
    let member = |m: &LinearModule, dtype, source| QuantizeMember {
        module: m.name.clone(),
        rows: m.rows,
        cols: m.cols,
        dtype,
        source,
    };
    // 1. Re-derive modules that SRC holds in high precision.
    let mut rederive = Check::new("NVFP4 modules re-derived from SRC, bit for bit");
    let mut kept = Check::new("NVFP4 modules carried over from SRC, byte for byte");
    let mut members: HashMap<&str, QuantizeMember> = HashMap::new();
    let mut consumed: HashSet<String> = HashSet::new();
    for m in &packed_dst {
        match src_by_name.get(m.name.as_str()).map(|s| &s.state) {
            Some(ModuleState::Dense { source, dtype }) => {
                members.insert(&m.name, member(m, *dtype, source.clone()));
                consumed.insert(match source {
                    WeightSource::Tensor(t) => t.clone(),
                    WeightSource::ExpertSlice { tensor, .. } => tensor.clone(),
                });
            }
            Some(ModuleState::Packed { .. }) => {
                kept.count += 1;
                for suffix in NVFP4_SUFFIXES {
                    let name = format!("{}.{suffix}", m.name);
                    consumed.insert(name.clone());
                    match (src_ck.get(&name), dst_ck.get(&name)) {
                        (Some(a), Some(b))
                            if a.info.dtype == b.info.dtype
                                && a.info.shape == b.info.shape
                                && a.bytes() == b.bytes() => {}
                        (None, None) => {}
                        _ => kept.fail(format!("{name} differs from SRC")),
                    }
                }
            }
            None => match untied.as_ref().filter(|u| u.module == m.name) {
                Some(u) => {
                    let Some(embedding) = src_ck.get(&u.embedding) else {
                        rederive.fail(format!("{}: {} missing from SRC", m.name, u.embedding));
                        continue;
                    };
                    if embedding.info.shape != [m.rows, m.cols] {
                        rederive.fail(format!(
                            "{}: [{}, {}] in DST but SRC's {} is {:?}",
                            m.name, m.rows, m.cols, u.embedding, embedding.info.shape
                        ));
                        continue;
                    }
                    let source = WeightSource::Tensor(u.embedding.clone());
                    members.insert(&m.name, member(m, embedding.info.dtype, source));
                }
                None => rederive.fail(format!(
                    "{}: quantized in DST but not a linear module of SRC",
                    m.name
                )),
            },
        }
    }
    let order: Vec<&str> = packed_dst
        .iter()
        .map(|m| m.name.as_str())
        .filter(|n| members.contains_key(n))
        .collect();
    let groups = global_scale_groups(order);
    let outcomes: Vec<Result<Vec<String>, BuilderError>> = groups
        .par_iter()
        .map(|group| {
            let group_members: Vec<QuantizeMember> =
                group.iter().map(|n| members[n].clone()).collect();
            let ours = match quantize_members(&src_ck, &group_members) {
                Ok(q) => q,
                Err(e) => return Ok(vec![e.to_string()]),
            };
            let mut failures = Vec::new();
            for (m, q) in group_members.iter().zip(&ours) {
                let expected: [(&str, &[u8]); 3] = [
                    ("weight_packed", &q.packed),
                    ("weight_scale", &q.scales),
                    ("weight_global_scale", &q.global_scale.to_le_bytes()),
                ];
                for (suffix, want) in expected {
                    let name = format!("{}.{suffix}", m.module);
                    match dst_ck.get(&name) {
                        Some(e) if e.bytes() == want => {}
                        Some(_) => {
                            failures.push(format!("{name} differs from the re-derived bytes"))
                        }
                        None => failures.push(format!("{name} missing")),
                    }
                }
                if dst_ck.contains(&format!("{}.input_global_scale", m.module)) {
                    failures.push(format!(
                        "{}.input_global_scale present on a module quantized weight-only from SRC",
                        m.module
                    ));
                }
            }
            Ok(failures)
        })
        .collect();
    for outcome in outcomes {
        for f in outcome? {
            rederive.fail(f);
        }
    }
    rederive.count = members.len();

    // 2. Every other DST tensor equals its SRC twin (or a slice of a fused 3-D SRC tensor).
    let mut copied = Check::new("other tensors identical to SRC, byte for byte");
    let packed_names: HashSet<String> = packed_dst
        .iter()
        .flat_map(|m| {
            NVFP4_SUFFIXES
                .iter()
                .map(move |s| format!("{}.{s}", m.name))
        })
        .collect();
    let split_sources: HashMap<String, (&LinearModule, &str)> = src_modules
        .iter()
        .filter_map(|m| match &m.state {
            ModuleState::Dense {
                source: WeightSource::ExpertSlice { tensor, .. },
                ..
            } => Some((format!("{}.weight", m.name), (m, tensor.as_str()))),
            _ => None,
        })
        .collect();
    for t in &dst_infos {
        if packed_names.contains(&t.name) {
            continue;
        }
        copied.count += 1;
        let dst_bytes = dst_ck.bytes(&t.name)?;
        if let Some(s) = src_ck.get(&t.name) {
            consumed.insert(t.name.clone());
            if s.info.dtype != t.dtype || s.info.shape != t.shape {
                copied.fail(format!(
                    "{}: dtype/shape {} {:?} in DST, {} {:?} in SRC",
                    t.name, t.dtype, t.shape, s.info.dtype, s.info.shape
                ));
            } else if s.bytes() != dst_bytes {
                copied.fail(format!("{}: bytes differ from SRC", t.name));
            }
        } else if let Some((module, tensor)) = split_sources.get(&t.name) {
            consumed.insert(tensor.to_string());
            let ModuleState::Dense { source, .. } = &module.state else {
                continue;
            };
            let (want, _) = source_bytes(&src_ck, source)?;
            if want != dst_bytes {
                copied.fail(format!("{}: differs from its slice of {tensor}", t.name));
            }
        } else {
            copied.fail(format!("{}: not in SRC", t.name));
        }
    }

    // 3. Nothing of SRC is lost.
    let mut accounted = Check::new("every SRC tensor present in DST (as is or quantized)");
    for t in &src_infos {
        accounted.count += 1;
        let module_packed = t
            .name
            .strip_suffix(".weight")
            .is_some_and(|m| dst_ck.contains(&format!("{m}.weight_packed")));
        let split = fused_expert_kind(&t.name, &t.shape).is_some() && consumed.contains(&t.name);
        if !(consumed.contains(&t.name) || module_packed || split) {
            accounted.fail(format!("{} is missing from DST", t.name));
        }
    }

    // 4. Fused siblings share one global scale in DST (vLLM requires it).
    let mut fused = Check::new("fused siblings (q/k/v, gate/up) share one global scale");
    for group in global_scale_groups(packed_dst.iter().map(|m| m.name.as_str())) {
        if group.len() < 2 {
            continue;
        }
        fused.count += 1;
        let scales: Vec<Option<&[u8]>> = group
            .iter()
            .map(|m| {
                dst_ck
                    .get(&format!("{m}.weight_global_scale"))
                    .map(|e| e.bytes())
            })
            .collect();
        if scales.windows(2).any(|w| w[0] != w[1]) {
            fused.fail(format!(
                "[{}] have different weight_global_scale",
                group.join(", ")
            ));
        }
    }

    report
        .checks
        .extend([rederive, kept, copied, accounted, fused]);
    report.checks.extend(config_check::check(
        &src_ck,
        &dst_ck,
        &dst_modules,
        untied.is_some(),
    )?);
    if let Some(u) = &untied {
        report.notes.push(format!(
            "{} is untied (--untie-lm-head): re-derived from SRC's {}, which SRC ties to it",
            u.module, u.embedding
        ));
    }
    if report.checks[1].count > 0 {
        report.notes.push(format!(
            "{} modules were already NVFP4 in SRC: compared byte for byte, not re-derived (SRC holds no high-precision weights for them)",
            report.checks[1].count
        ));
    }
    Ok(report)
}
