//! `config.json` as the families read it: typed look-ups by dotted path whose errors name the
//! file and the field. Every number of an [`crate::ArchSpec`] comes through here.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::error::{ArchError, Result};

/// A parsed `config.json` (any JSON object) and the path it came from.
#[derive(Debug, Clone)]
pub struct ConfigJson {
    file: PathBuf,
    root: Map<String, Value>,
}

impl ConfigJson {
    /// Reads and parses `path`.
    pub fn from_path(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| {
            ArchError::Checkpoint(fp4forge_format::CheckpointError::Io {
                path: path.to_path_buf(),
                source: e,
            })
        })?;
        let root: Map<String, Value> = serde_json::from_slice(&bytes).map_err(|e| {
            ArchError::Checkpoint(fp4forge_format::CheckpointError::Json {
                path: path.to_path_buf(),
                source: e,
            })
        })?;
        Ok(Self::from_map(path, root))
    }

    /// Wraps an already parsed object; `file` names it in errors.
    pub fn from_map(file: &Path, root: Map<String, Value>) -> Self {
        Self {
            file: file.to_path_buf(),
            root,
        }
    }

    /// The file this config came from.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// The raw JSON object.
    pub fn root(&self) -> &Map<String, Value> {
        &self.root
    }

    /// The value at a dotted path (`a.b.c`), if present and not `null`.
    pub fn get(&self, path: &str) -> Option<&Value> {
        let mut parts = path.split('.');
        let mut v = self.root.get(parts.next()?)?;
        for p in parts {
            v = v.as_object()?.get(p)?;
        }
        (!v.is_null()).then_some(v)
    }

    /// Whether `path` holds a non-null value.
    pub fn has(&self, path: &str) -> bool {
        self.get(path).is_some()
    }

    /// An error about `field`.
    pub fn error(&self, field: &str, reason: impl Into<String>) -> ArchError {
        ArchError::Field {
            file: self.file.clone(),
            field: field.to_owned(),
            reason: reason.into(),
        }
    }

    fn require(&self, path: &str) -> Result<&Value> {
        self.get(path)
            .ok_or_else(|| self.error(path, "missing (the model needs it)"))
    }

    /// A non-negative integer (a float with no fraction is accepted).
    pub fn usize(&self, path: &str) -> Result<usize> {
        let v = self.require(path)?;
        as_usize(v)
            .ok_or_else(|| self.error(path, format!("expected a non-negative integer, got {v}")))
    }

    /// [`usize`](Self::usize) when present.
    pub fn opt_usize(&self, path: &str) -> Result<Option<usize>> {
        match self.get(path) {
            None => Ok(None),
            Some(_) => self.usize(path).map(Some),
        }
    }

    /// A number.
    pub fn f64(&self, path: &str) -> Result<f64> {
        let v = self.require(path)?;
        v.as_f64()
            .ok_or_else(|| self.error(path, format!("expected a number, got {v}")))
    }

    /// [`f64`](Self::f64) when present.
    pub fn opt_f64(&self, path: &str) -> Result<Option<f64>> {
        match self.get(path) {
            None => Ok(None),
            Some(_) => self.f64(path).map(Some),
        }
    }

    /// A boolean.
    pub fn bool(&self, path: &str) -> Result<bool> {
        let v = self.require(path)?;
        v.as_bool()
            .ok_or_else(|| self.error(path, format!("expected true or false, got {v}")))
    }

    /// [`bool`](Self::bool) when present.
    pub fn opt_bool(&self, path: &str) -> Result<Option<bool>> {
        match self.get(path) {
            None => Ok(None),
            Some(_) => self.bool(path).map(Some),
        }
    }

    /// A string.
    pub fn str(&self, path: &str) -> Result<&str> {
        let v = self.require(path)?;
        v.as_str()
            .ok_or_else(|| self.error(path, format!("expected a string, got {v}")))
    }

    /// [`str`](Self::str) when present.
    pub fn opt_str(&self, path: &str) -> Result<Option<&str>> {
        match self.get(path) {
            None => Ok(None),
            Some(_) => self.str(path).map(Some),
        }
    }

    /// A list of non-negative integers.
    pub fn usize_list(&self, path: &str) -> Result<Vec<usize>> {
        let v = self.require(path)?;
        let items = v
            .as_array()
            .ok_or_else(|| self.error(path, format!("expected a list, got {v}")))?;
        items
            .iter()
            .enumerate()
            .map(|(i, x)| {
                as_usize(x).ok_or_else(|| {
                    self.error(
                        path,
                        format!("item {i}: expected a non-negative integer, got {x}"),
                    )
                })
            })
            .collect()
    }

    /// A list of strings.
    pub fn str_list(&self, path: &str) -> Result<Vec<String>> {
        let v = self.require(path)?;
        let items = v
            .as_array()
            .ok_or_else(|| self.error(path, format!("expected a list, got {v}")))?;
        items
            .iter()
            .enumerate()
            .map(|(i, x)| {
                x.as_str().map(str::to_owned).ok_or_else(|| {
                    self.error(path, format!("item {i}: expected a string, got {x}"))
                })
            })
            .collect()
    }

    /// Token ids given as one integer or a list (`eos_token_id`); empty when absent.
    pub fn token_ids(&self, path: &str) -> Result<Vec<u32>> {
        let Some(v) = self.get(path) else {
            return Ok(Vec::new());
        };
        let one = |x: &Value| {
            as_usize(x)
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| self.error(path, format!("expected token ids, got {v}")))
        };
        match v {
            Value::Array(items) => items.iter().map(one).collect(),
            x => Ok(vec![one(x)?]),
        }
    }
}

fn as_usize(v: &Value) -> Option<usize> {
    if let Some(n) = v.as_u64() {
        return usize::try_from(n).ok();
    }
    let f = v.as_f64()?;
    (f >= 0.0 && f.fract() == 0.0 && f < 9.0e15).then_some(f as usize)
}

/// `true` for each sliding-attention layer, from `layer_types`.
pub(crate) fn layer_types(cfg: &ConfigJson, n_layers: usize) -> Result<Vec<bool>> {
    let types = cfg.str_list("layer_types")?;
    if types.len() != n_layers {
        return Err(cfg.error(
            "layer_types",
            format!("{} entries for {n_layers} layers", types.len()),
        ));
    }
    types
        .iter()
        .enumerate()
        .map(|(i, t)| match t.as_str() {
            "full_attention" => Ok(false),
            "sliding_attention" => Ok(true),
            other => Err(cfg.error(
                "layer_types",
                format!("layer {i}: unknown type {other:?} (full_attention, sliding_attention)"),
            )),
        })
        .collect()
}

/// `true` for each dense-MLP layer, from `mlp_layer_types` (`dense`; `sparse` or `moe`).
pub(crate) fn mlp_layer_types(cfg: &ConfigJson, n_layers: usize) -> Result<Vec<bool>> {
    let kinds = cfg.str_list("mlp_layer_types")?;
    if kinds.len() != n_layers {
        return Err(cfg.error(
            "mlp_layer_types",
            format!("{} entries for {n_layers} layers", kinds.len()),
        ));
    }
    kinds
        .iter()
        .enumerate()
        .map(|(i, k)| match k.as_str() {
            "dense" => Ok(true),
            "sparse" | "moe" => Ok(false),
            other => Err(cfg.error(
                "mlp_layer_types",
                format!("layer {i}: unknown MLP type {other:?} (dense, sparse)"),
            )),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(v: Value) -> ConfigJson {
        match v {
            Value::Object(m) => ConfigJson::from_map(Path::new("config.json"), m),
            _ => unreachable!(),
        }
    }

    #[test]
    fn dotted_paths_and_errors_name_the_field() {
        let c = cfg(serde_json::json!({
            "a": {"b": 3, "c": null}, "n": 2.0, "s": "x", "l": [1, 2], "e": 5
        }));
        assert_eq!(c.usize("a.b").unwrap(), 3);
        assert_eq!(c.usize("n").unwrap(), 2);
        assert!(c.get("a.c").is_none());
        assert_eq!(c.usize_list("l").unwrap(), vec![1, 2]);
        assert_eq!(c.token_ids("e").unwrap(), vec![5]);
        assert_eq!(c.token_ids("l").unwrap(), vec![1, 2]);
        let err = c.usize("a.missing").unwrap_err().to_string();
        assert!(
            err.contains("`a.missing`") && err.contains("config.json"),
            "{err}"
        );
        let err = c.usize("s").unwrap_err().to_string();
        assert!(err.contains("`s`"), "{err}");
    }
}
