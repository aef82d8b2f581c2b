//! Reading a config: [`ArchSpec::from_config`] and [`ShapeSpec::read`] find the family and hand
//! the config to its file. Each file here reads one family's `config.json` into an [`ArchSpec`],
//! says what its `model_type`s add to a lenient shape read ([`ShapeSpec`]) and how it names its
//! tensors. A new family is one more file here, its arms in the two dispatches below, and its
//! [`Family`] variant with its architecture names and `model_type`s (`family.rs`).

mod laguna;
mod llama;
mod qwen3_moe;

use std::path::Path;

use serde_json::Value;

use crate::family::Family;
use crate::fields::ConfigJson;
use crate::shape::{self, ShapeRules, ShapeSpec};
use crate::spec::ArchSpec;
use crate::{ArchError, Result};

impl ArchSpec {
    /// Reads `path` (a `config.json`) with the family its `architectures[0]` names.
    pub fn from_path(path: &Path) -> Result<Self> {
        Self::from_config(&ConfigJson::from_path(path)?)
    }

    /// Reads an already parsed config with the family its `architectures[0]` names.
    pub fn from_config(cfg: &ConfigJson) -> Result<Self> {
        let found = if cfg.has("architectures") {
            cfg.str_list("architectures")?
        } else {
            Vec::new()
        };
        let unsupported = || ArchError::UnsupportedArchitecture {
            file: cfg.file().to_path_buf(),
            found: found.clone(),
            supported: crate::SUPPORTED_ARCHITECTURES.to_vec(),
        };
        let arch = found.first().ok_or_else(unsupported)?;
        let family = Family::of(arch).ok_or_else(unsupported)?;
        read(family, cfg, arch)
    }
}

impl ShapeSpec {
    /// Reads the shape from a parsed `config.json` object; `file` names it in errors.
    pub fn from_config(config: &Value, file: impl AsRef<Path>) -> Result<Self> {
        let file = file.as_ref();
        let root = config.as_object().cloned().unwrap_or_default();
        Self::read(&ConfigJson::from_map(file, root))
    }

    /// Reads the shape from a config (see [`ShapeSpec`]'s module doc for what is read and what
    /// may be absent) with the rules of the family its `model_type` names, or the generic ones.
    pub fn read(cfg: &ConfigJson) -> Result<Self> {
        let model_type = cfg.opt_str("model_type")?.unwrap_or_default().to_owned();
        let family = Family::of_model_type(&model_type);
        let rules = match family {
            Some(f) => shape_rules(f, &model_type),
            None => shape::generic_rules(&model_type),
        };
        shape::read(cfg, model_type, family, rules)
    }
}

/// What `model_type` (one of [`Family::model_types`]) adds to the generic shape keys.
fn shape_rules(family: Family, model_type: &str) -> ShapeRules {
    match family {
        Family::Llama => llama::shape_rules(model_type),
        Family::Laguna => laguna::shape_rules(),
        Family::Qwen3Moe => qwen3_moe::shape_rules(model_type),
    }
}

/// Reads `cfg` as `family`; `architecture` is its `architectures[0]`.
fn read(family: Family, cfg: &ConfigJson, architecture: &str) -> Result<ArchSpec> {
    match family {
        Family::Llama => llama::read(cfg, architecture),
        Family::Laguna => laguna::read(cfg, architecture),
        Family::Qwen3Moe => qwen3_moe::read(cfg, architecture),
    }
}

/// `sliding_window` when some layer slides (at least 1), else `None`.
fn window(cfg: &ConfigJson, sliding: &[bool]) -> Result<Option<usize>> {
    if !sliding.iter().any(|s| *s) {
        return Ok(None);
    }
    let w = cfg.usize("sliding_window")?;
    if w == 0 {
        return Err(cfg.error("sliding_window", "must be at least 1"));
    }
    Ok(Some(w))
}

/// Checks that `q_heads` is a positive multiple of `kv_heads`; `field` is blamed otherwise.
fn check_gqa(
    cfg: &ConfigJson,
    field: &str,
    layer: Option<usize>,
    q: usize,
    kv: usize,
) -> Result<()> {
    if q == 0 || kv == 0 || !q.is_multiple_of(kv) {
        let at = layer.map_or(String::new(), |i| format!("layer {i}: "));
        return Err(cfg.error(
            field,
            format!("{at}{q} query heads are not a multiple of {kv} KV heads"),
        ));
    }
    Ok(())
}

/// The rope from `rope_parameters`, else `rope_scaling` (transformers 4), else the top-level
/// `rope_theta` alone.
fn single_rope(cfg: &ConfigJson, head_dim: usize, max_pos: usize) -> Result<crate::Rope> {
    let params = if cfg.has("rope_parameters") {
        Some("rope_parameters")
    } else if cfg.has("rope_scaling") {
        Some("rope_scaling")
    } else {
        None
    };
    crate::Rope::from_config(cfg, params, "rope_theta", head_dim, max_pos)
}
