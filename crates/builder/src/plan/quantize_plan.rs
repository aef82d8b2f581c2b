//! The quantization plan: which modules become NVFP4, how they group under shared global scales,
//! which tensors the output holds, and the output `quantization_config`.

use std::collections::{BTreeSet, HashMap, HashSet};

use fp4forge_arch::LM_HEAD_MODULE;
use fp4forge_format::checkpoint::TensorInfo;
use fp4forge_format::config::Field;
use fp4forge_format::{Dtype, QuantizationConfig, QuantizationScheme, TensorSpec};
use indexmap::IndexMap;
use serde::Serialize;

use super::fusion::{fusion_key, global_scale_groups};
use super::matcher::{nearest_modules, TargetMatcher};
use super::modules::{fused_expert_kind, linear_modules, LinearModule, ModuleState, WeightSource};
use super::untie::{UntieLmHead, FLAG as UNTIE_FLAG};
use crate::BuilderError;

/// Targets used when none are given: the lean build (attention q/k/v/o).
pub const DEFAULT_TARGETS: [&str; 1] = [r"re:.*self_attn\.(q|k|v|o)_proj$"];

/// One unit of work of the executor.
#[derive(Debug, Clone, PartialEq)]
pub enum Job {
    /// Copy a source tensor byte for byte (same name, dtype, shape).
    Copy {
        /// The tensor name.
        tensor: String,
    },
    /// Write a slice of a fused 3-D expert tensor as its own 2-D `.weight` (not quantized).
    CopySlice {
        /// The output module (its `.weight` is written).
        module: String,
        /// Where the bytes come from.
        source: WeightSource,
    },
    /// Quantize a global-scale group (one module, or fused siblings) to NVFP4.
    Quantize {
        /// The members, in order.
        members: Vec<QuantizeMember>,
    },
}

/// A module to quantize, with where its high-precision weight lives.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizeMember {
    /// Module name.
    pub module: String,
    /// Output dimension.
    pub rows: usize,
    /// Input dimension.
    pub cols: usize,
    /// Source dtype.
    pub dtype: Dtype,
    /// Source bytes.
    pub source: WeightSource,
}

/// Counts and sizes of a plan, for `--dry-run` and reports.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PlanSummary {
    /// Modules newly quantized.
    pub modules_quantized: usize,
    /// Global-scale groups among them (fused siblings count once).
    pub scale_groups: usize,
    /// Fused groups (more than one member).
    pub fused_groups: usize,
    /// Modules already NVFP4 in the source, kept byte for byte.
    pub modules_already_quantized: usize,
    /// Linear modules left in high precision.
    pub modules_unquantized: usize,
    /// Tensors copied unchanged.
    pub tensors_copied: usize,
    /// Source tensor bytes.
    pub bytes_before: u64,
    /// Output tensor bytes.
    pub bytes_after: u64,
    /// Name of the config group holding the new modules.
    pub new_group: String,
    /// That group's targets as written to the config.
    pub new_group_targets: Vec<String>,
    /// Quantized modules by leaf name (`q_proj`: 48, ...).
    pub by_leaf: Vec<(String, usize)>,
    /// `--untie-lm-head`: the new `lm_head` and what it costs (`None` without the flag).
    pub untied_lm_head: Option<UntiedLmHead>,
}

/// The `lm_head` that `--untie-lm-head` writes: its source and sizes.
#[derive(Debug, Clone, Serialize)]
pub struct UntiedLmHead {
    /// The new module (`lm_head`).
    pub module: String,
    /// The embedding tensor its values come from (read once more; copied unchanged as well).
    pub source: String,
    /// `[vocab, hidden]`.
    pub shape: [usize; 2],
    /// The embedding's dtype (bf16, f16 or f32).
    pub source_dtype: String,
    /// Bytes a tied model reads for it per decoded token: the high-precision embedding.
    pub bytes_before: u64,
    /// Bytes of the new NVFP4 tensors (packed, block scales, global scale), read per token
    /// instead, and added to the checkpoint.
    pub bytes_after: u64,
}

/// A complete plan: output tensors in order, the jobs that produce them, and the new config.
#[derive(Debug, Clone)]
pub struct QuantizePlan {
    /// Output tensors, in writing order.
    pub outputs: Vec<TensorSpec>,
    /// Work items; together they write every output exactly once.
    pub jobs: Vec<Job>,
    /// The output `quantization_config`.
    pub quantization_config: QuantizationConfig,
    /// Counts and sizes.
    pub summary: PlanSummary,
}

/// Inputs of [`QuantizePlan::new`].
#[derive(Debug, Clone, Default)]
pub struct PlanRequest {
    /// `--targets` patterns (empty: [`DEFAULT_TARGETS`]).
    pub targets: Vec<String>,
    /// `--ignore` patterns.
    pub ignore: Vec<String>,
    /// `--allow-empty`: accept targets that select nothing to quantize (the output is then a
    /// copy); without it such a plan is refused.
    pub allow_empty: bool,
    /// `--untie-lm-head`, resolved ([`super::untie::resolve`]): also quantize the tied
    /// embedding's values as a new module `lm_head`, whatever the targets.
    pub untie_lm_head: Option<UntieLmHead>,
}

fn is_quantizable(dtype: Dtype) -> bool {
    matches!(dtype, Dtype::BF16 | Dtype::F16 | Dtype::F32)
}

fn nvfp4_specs(module: &str, rows: usize, cols: usize) -> [TensorSpec; 3] {
    [
        TensorSpec::new(
            format!("{module}.weight_packed"),
            Dtype::U8,
            [rows, cols / 2],
        ),
        TensorSpec::new(
            format!("{module}.weight_scale"),
            Dtype::F8_E4M3,
            [rows, cols / 16],
        ),
        TensorSpec::new(format!("{module}.weight_global_scale"), Dtype::F32, [1]),
    ]
}

impl QuantizePlan {
    /// Plans the build of `tensors` (the source checkpoint, in order) with its existing
    /// `quantization_config` (if any). Fails, naming the modules, on: a selected module whose
    /// dtype cannot be quantized or whose input dimension is not a multiple of 16, a fused group
    /// split between quantized and not, and a config that could not select modules unambiguously.
    pub fn new(
        tensors: &[TensorInfo],
        existing: Option<&QuantizationConfig>,
        request: &PlanRequest,
    ) -> Result<Self, BuilderError> {
        let targets: Vec<String> = if request.targets.is_empty() {
            DEFAULT_TARGETS.iter().map(|s| s.to_string()).collect()
        } else {
            request.targets.clone()
        };
        let matcher = TargetMatcher::new(&targets, &request.ignore)?;
        let mut modules = linear_modules(tensors);
        let untied = match &request.untie_lm_head {
            Some(untie) => Some(untied_module(untie, tensors, &matcher)?),
            None => None,
        };
        if let Some(m) = &untied {
            modules.push(m.clone());
        }
        let is_untied = |name: &str| untied.as_ref().is_some_and(|u| u.name == name);
        let by_name: HashMap<&str, &LinearModule> =
            modules.iter().map(|m| (m.name.as_str(), m)).collect();

        // 0. A weight that is not 2-D is no linear module, but one that the patterns name and
        //    that is named like a projection was rewritten, not meant: refuse it rather than
        //    leave it (and the config's claim on it) unquantized.
        for t in tensors {
            let Some(module) = t.name.strip_suffix(".weight") else {
                continue;
            };
            if t.shape.len() != 2
                && fused_expert_kind(&t.name, &t.shape).is_none()
                && named_like_linear(module)
                && matcher.targets().iter().any(|p| p.matches_name(module))
                && !matcher.is_ignored(module, false)
            {
                return Err(BuilderError::Tensor {
                    tensor: t.name.clone(),
                    reason: format!(
                        "selected by the targets but stored {}-D {:?}; a linear weight is 2-D [out, in]",
                        t.shape.len(),
                        t.shape
                    ),
                });
            }
        }

        // 1. Selection: dense modules the patterns pick (already-packed ones stay as they are).
        let mut selected: Vec<&LinearModule> = Vec::new();
        for m in &modules {
            let ModuleState::Dense { dtype, .. } = &m.state else {
                continue;
            };
            if !matcher.matches(&m.name, true) && !is_untied(&m.name) {
                continue;
            }
            if !is_quantizable(*dtype) {
                return Err(BuilderError::Tensor {
                    tensor: format!("{}.weight", m.name),
                    reason: format!("dtype {dtype} cannot be quantized (bf16, f16 or f32 only)"),
                });
            }
            if m.cols % 16 != 0 {
                return Err(BuilderError::Tensor {
                    tensor: format!("{}.weight", m.name),
                    reason: format!(
                        "input dimension {} is not a multiple of 16 (shape [{}, {}])",
                        m.cols, m.rows, m.cols
                    ),
                });
            }
            selected.push(m);
        }
        if !request.allow_empty {
            check_selection(&matcher, &modules, &selected)?;
        }
        let selected_names: HashSet<&str> = selected.iter().map(|m| m.name.as_str()).collect();

        // 2. Fused groups must be all-or-nothing. Members are judged by name: a sibling whose
        //    weight is not 2-D (so no linear module) still belongs to the group.
        let mut siblings: HashMap<(String, usize), Vec<&str>> = HashMap::new();
        for m in &modules {
            if let Some(key) = fusion_key(&m.name) {
                siblings.entry(key).or_default().push(&m.name);
            }
        }
        for t in tensors {
            let Some(module) = t.name.strip_suffix(".weight") else {
                continue;
            };
            if by_name.contains_key(module) || fused_expert_kind(&t.name, &t.shape).is_some() {
                continue;
            }
            if let Some(key) = fusion_key(module) {
                siblings.entry(key).or_default().push(module);
            }
        }
        for members in siblings.values() {
            let chosen = members
                .iter()
                .filter(|m| selected_names.contains(*m))
                .count();
            if chosen > 0 && chosen < members.len() {
                let (inside, outside): (Vec<&str>, Vec<&str>) =
                    members.iter().partition(|m| selected_names.contains(*m));
                return Err(BuilderError::FusedGroupSplit {
                    quantized: inside.join(", "),
                    left_out: outside.join(", "),
                });
            }
            let dtypes: BTreeSet<String> = members
                .iter()
                .filter(|m| selected_names.contains(*m))
                .filter_map(|m| match by_name.get(*m).map(|m| &m.state) {
                    Some(ModuleState::Dense { dtype, .. }) => Some(dtype.to_string()),
                    _ => None,
                })
                .collect();
            if dtypes.len() > 1 {
                return Err(BuilderError::FusedGroupSplit {
                    quantized: members.join(", "),
                    left_out: format!("(members have different dtypes: {dtypes:?})"),
                });
            }
        }

        // 3. Jobs and outputs, in source tensor order.
        let groups = global_scale_groups(selected.iter().map(|m| m.name.as_str()));
        let group_of_first: HashMap<&str, &Vec<&str>> = groups.iter().map(|g| (g[0], g)).collect();
        let member = |name: &str| {
            let m = by_name[name];
            let ModuleState::Dense { source, dtype } = &m.state else {
                unreachable!("only dense modules are selected")
            };
            QuantizeMember {
                module: m.name.clone(),
                rows: m.rows,
                cols: m.cols,
                dtype: *dtype,
                source: source.clone(),
            }
        };
        let mut outputs = Vec::new();
        let mut jobs = Vec::new();
        let mut summary = PlanSummary::default();
        let split_tensors = expert_slice_sources(modules.iter());
        let split_needed = expert_slice_sources(selected.iter().copied());
        let mut emitted: HashSet<String> = HashSet::new();
        for t in tensors {
            summary.bytes_before += t.byte_len() as u64;
            if split_tensors.contains(t.name.as_str()) && split_needed.contains(t.name.as_str()) {
                // Expand into per-expert modules, each quantized or written as a 2-D weight.
                for m in modules.iter().filter(|m| {
                    matches!(&m.state, ModuleState::Dense { source: WeightSource::ExpertSlice { tensor, .. }, .. } if tensor == &t.name)
                }) {
                    if selected_names.contains(m.name.as_str()) {
                        Self::push_group(&m.name, &group_of_first, &member, &mut outputs, &mut jobs, &mut emitted);
                    } else if let ModuleState::Dense { source, dtype } = &m.state {
                        outputs.push(TensorSpec::new(format!("{}.weight", m.name), *dtype, [m.rows, m.cols]));
                        jobs.push(Job::CopySlice { module: m.name.clone(), source: source.clone() });
                    }
                }
                continue;
            }
            if let Some(module) = t.name.strip_suffix(".weight") {
                if selected_names.contains(module) {
                    Self::push_group(
                        module,
                        &group_of_first,
                        &member,
                        &mut outputs,
                        &mut jobs,
                        &mut emitted,
                    );
                    continue;
                }
            }
            outputs.push(TensorSpec::new(t.name.clone(), t.dtype, t.shape.clone()));
            jobs.push(Job::Copy {
                tensor: t.name.clone(),
            });
            summary.tensors_copied += 1;
        }
        // The untied lm_head is no source tensor: its group goes last, where lm_head lives.
        if let Some(m) = &untied {
            let before = outputs.len();
            Self::push_group(
                &m.name,
                &group_of_first,
                &member,
                &mut outputs,
                &mut jobs,
                &mut emitted,
            );
            let ModuleState::Dense { source, dtype } = &m.state else {
                unreachable!("the untied lm_head is dense")
            };
            let WeightSource::Tensor(source) = source else {
                unreachable!("the untied lm_head reads a whole tensor")
            };
            summary.untied_lm_head = Some(UntiedLmHead {
                module: m.name.clone(),
                source: source.clone(),
                shape: [m.rows, m.cols],
                source_dtype: dtype.to_string(),
                bytes_before: (m.rows * m.cols * dtype.size()) as u64,
                bytes_after: outputs[before..].iter().filter_map(|s| s.byte_len()).sum(),
            });
        }
        summary.bytes_after = outputs.iter().filter_map(|s| s.byte_len()).sum();

        // 4. Config.
        let quantized_by_existing: BTreeSet<&str> = modules
            .iter()
            .filter(|m| matches!(m.state, ModuleState::Packed { .. }))
            .map(|m| m.name.as_str())
            .collect();
        // vLLM's lm_head (`ParallelLMHead`) is no `Linear` class: an untied lm_head must be
        // targeted by name.
        let mut config_targets = targets.clone();
        if let Some(m) = &untied {
            if !matcher.targets().iter().any(|p| p.matches_name(&m.name)) {
                config_targets.push(m.name.clone());
            }
        }
        let (quantization_config, new_group, new_targets) = build_config(
            existing,
            &modules,
            &selected_names,
            &quantized_by_existing,
            &config_targets,
        )?;

        summary.modules_quantized = selected.len();
        summary.scale_groups = groups.len();
        summary.fused_groups = groups.iter().filter(|g| g.len() > 1).count();
        summary.modules_already_quantized = quantized_by_existing.len();
        summary.modules_unquantized = modules.len() - selected.len() - quantized_by_existing.len();
        summary.new_group = new_group;
        summary.new_group_targets = new_targets;
        let mut leaves: IndexMap<String, usize> = IndexMap::new();
        for m in &selected {
            let leaf = m.name.rsplit('.').next().unwrap_or(&m.name);
            *leaves.entry(leaf.to_string()).or_default() += 1;
        }
        summary.by_leaf = leaves.into_iter().collect();
        Ok(QuantizePlan {
            outputs,
            jobs,
            quantization_config,
            summary,
        })
    }

    /// Emit the job and output specs of the scale group led by `module` (once per group; later
    /// members of an already-emitted group are skipped).
    fn push_group(
        module: &str,
        group_of_first: &HashMap<&str, &Vec<&str>>,
        member: &dyn Fn(&str) -> QuantizeMember,
        outputs: &mut Vec<TensorSpec>,
        jobs: &mut Vec<Job>,
        emitted: &mut HashSet<String>,
    ) {
        if emitted.contains(module) {
            return;
        }
        let Some(group) = group_of_first.get(module) else {
            // A later member of a group whose first member comes later in the file: the group is
            // emitted when its first member is reached, so place this member's outputs then.
            return;
        };
        let members: Vec<QuantizeMember> = group.iter().map(|m| member(m)).collect();
        for m in &members {
            outputs.extend(nvfp4_specs(&m.module, m.rows, m.cols));
            emitted.insert(m.module.clone());
        }
        jobs.push(Job::Quantize { members });
    }
}

/// The module `--untie-lm-head` adds: `lm_head`, dense, reading the embedding's bytes. Refuses
/// an `--ignore` pattern that excludes it, naming the pattern.
fn untied_module(
    untie: &UntieLmHead,
    tensors: &[TensorInfo],
    matcher: &TargetMatcher,
) -> Result<LinearModule, BuilderError> {
    if let Some(p) = matcher
        .ignore()
        .iter()
        .find(|p| p.matches(&untie.module, true))
    {
        return Err(BuilderError::Untie {
            reason: format!(
                "--ignore {p} excludes {}, which {UNTIE_FLAG} quantizes; drop the pattern or the flag",
                untie.module
            ),
        });
    }
    let info = tensors
        .iter()
        .find(|t| t.name == untie.embedding)
        .filter(|t| t.shape.len() == 2)
        .ok_or_else(|| BuilderError::Untie {
            reason: format!("the checkpoint has no 2-D {}", untie.embedding),
        })?;
    Ok(LinearModule {
        name: untie.module.clone(),
        rows: info.shape[0],
        cols: info.shape[1],
        state: ModuleState::Dense {
            source: WeightSource::Tensor(info.name.clone()),
            dtype: info.dtype,
        },
    })
}

/// Whether a module is named like a linear layer: a fused sibling, a `*_proj` or `lm_head`.
fn named_like_linear(module: &str) -> bool {
    let leaf = module.rsplit('.').next().unwrap_or(module);
    fusion_key(module).is_some() || leaf.ends_with("_proj") || leaf == "lm_head"
}

/// Refuses a selection that quantizes nothing, or a target pattern that matches no linear module
/// (a typo would otherwise write an unquantized copy), naming the pattern and the nearest names.
fn check_selection(
    matcher: &TargetMatcher,
    modules: &[LinearModule],
    selected: &[&LinearModule],
) -> Result<(), BuilderError> {
    let names: Vec<&str> = modules.iter().map(|m| m.name.as_str()).collect();
    for pattern in matcher.targets() {
        if !names.iter().any(|m| pattern.matches(m, true)) {
            let nearest = nearest_modules(pattern, &names, 3);
            let tied_hint = if pattern.matches_name(LM_HEAD_MODULE) {
                format!(" (no {LM_HEAD_MODULE} is stored: if the model ties it to the embedding, {UNTIE_FLAG} writes one)")
            } else {
                String::new()
            };
            return Err(BuilderError::NothingSelected {
                reason: format!(
                    "--targets {pattern} matches no linear module; nearest module names: {}{tied_hint}",
                    if nearest.is_empty() {
                        "(the checkpoint has no linear modules)".to_string()
                    } else {
                        nearest.join(", ")
                    }
                ),
            });
        }
    }
    if selected.is_empty() {
        let matched: Vec<&LinearModule> = modules
            .iter()
            .filter(|m| matcher.targets().iter().any(|p| p.matches(&m.name, true)))
            .collect();
        let packed = matched
            .iter()
            .filter(|m| matches!(m.state, ModuleState::Packed { .. }))
            .count();
        let ignored = matched
            .iter()
            .filter(|m| matcher.is_ignored(&m.name, true))
            .count();
        let patterns: Vec<String> = matcher.targets().iter().map(|p| p.to_string()).collect();
        return Err(BuilderError::NothingSelected {
            reason: format!(
                "--targets {} match {} linear modules, of which {packed} are already NVFP4 and {ignored} are ignored",
                patterns.join(" "),
                matched.len()
            ),
        });
    }
    Ok(())
}

/// The 3-D fused-expert tensors that `modules` are slices of.
fn expert_slice_sources<'m>(modules: impl Iterator<Item = &'m LinearModule>) -> HashSet<&'m str> {
    modules
        .filter_map(|m| match &m.state {
            ModuleState::Dense {
                source: WeightSource::ExpertSlice { tensor, .. },
                ..
            } => Some(tensor.as_str()),
            _ => None,
        })
        .collect()
}

/// The output `quantization_config`: the existing groups, plus one NVFP4A16 group for the new
/// modules, and `ignore` rewritten as the explicit list of every linear module left unquantized
/// (as llmcompressor writes it), so that each module resolves to exactly one scheme.
fn build_config(
    existing: Option<&QuantizationConfig>,
    modules: &[LinearModule],
    selected: &HashSet<&str>,
    already: &BTreeSet<&str>,
    targets: &[String],
) -> Result<(QuantizationConfig, String, Vec<String>), BuilderError> {
    let ignore: Vec<String> = modules
        .iter()
        .filter(|m| !selected.contains(m.name.as_str()) && !already.contains(m.name.as_str()))
        .map(|m| m.name.clone())
        .collect();
    let mut groups: IndexMap<String, QuantizationScheme> = existing
        .and_then(|c| c.config_groups.get().cloned())
        .unwrap_or_default();

    // Existing groups must not claim the new modules once `ignore` no longer hides them.
    for (name, scheme) in &groups {
        let group_targets = scheme.targets.get().cloned().unwrap_or_default();
        let m = TargetMatcher::new(&group_targets, &ignore)?;
        if let Some(clash) = selected.iter().find(|s| m.matches(s, true)) {
            return Err(BuilderError::Config {
                source_name: "quantization_config".into(),
                field: format!("config_groups.{name}.targets"),
                reason: format!(
                    "existing targets {group_targets:?} also select `{clash}`, which the new NVFP4A16 group quantizes; the scheme would be ambiguous"
                ),
            });
        }
    }

    // The user's patterns if they select exactly the new modules, else the explicit names.
    let patterns = TargetMatcher::new(targets, &ignore)?;
    let overreach = already.iter().any(|m| patterns.matches(m, true));
    let new_targets: Vec<String> = if overreach {
        let mut names: Vec<String> = modules
            .iter()
            .filter(|m| selected.contains(m.name.as_str()))
            .map(|m| m.name.clone())
            .collect();
        names.sort_unstable();
        names
    } else {
        targets.to_vec()
    };
    let mut n = 0;
    while groups.contains_key(&format!("group_{n}")) {
        n += 1;
    }
    let new_group = format!("group_{n}");
    if !selected.is_empty() {
        groups.insert(
            new_group.clone(),
            QuantizationScheme::nvfp4a16(new_targets.clone()),
        );
    }

    let config = match existing {
        Some(old) => {
            let mut c = old.clone();
            let fresh = QuantizationConfig::compressed_tensors(groups.clone(), ignore.clone());
            c.config_groups = Field::Set(groups);
            c.ignore = Field::Set(ignore);
            c.format = fresh.format;
            if c.quantization_status.is_absent() {
                c.quantization_status = fresh.quantization_status;
            }
            c
        }
        None => QuantizationConfig::compressed_tensors(groups, ignore),
    };
    Ok((config, new_group, new_targets))
}
