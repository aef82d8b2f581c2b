//! `model.safetensors.index.json`: which shard holds which tensor.

use std::path::{Path, PathBuf};

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::CheckpointError;

/// The file name of a sharded checkpoint's index.
pub const INDEX_FILE_NAME: &str = "model.safetensors.index.json";

/// The file name of a single-file checkpoint.
pub const SINGLE_FILE_NAME: &str = "model.safetensors";

/// The parsed contents of a shard index (`{"metadata": {...}, "weight_map": {...}}`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ShardIndex {
    /// The `metadata` object (usually `{"total_size": N}`), kept as written.
    #[serde(default)]
    pub metadata: Map<String, Value>,
    /// Tensor name → shard file name, in file order.
    pub weight_map: IndexMap<String, String>,
}

impl ShardIndex {
    /// Reads and parses the index at `path`.
    pub fn from_path(path: &Path) -> Result<Self, CheckpointError> {
        let bytes = std::fs::read(path).map_err(|e| CheckpointError::io(path, e))?;
        serde_json::from_slice(&bytes).map_err(|source| CheckpointError::Json {
            path: path.to_path_buf(),
            source,
        })
    }

    /// The distinct shard file names, in order of first appearance in `weight_map`.
    pub fn shard_names(&self) -> Vec<&str> {
        let mut seen = indexmap::IndexSet::new();
        for shard in self.weight_map.values() {
            seen.insert(shard.as_str());
        }
        seen.into_iter().collect()
    }

    /// `metadata.total_size`, when present and a non-negative integer.
    pub fn total_size(&self) -> Option<u64> {
        self.metadata.get("total_size").and_then(Value::as_u64)
    }

    /// Checks that every shard name is a plain file name (no directory part, not `..`), so
    /// that an index can never point outside its directory.
    pub(crate) fn check_shard_names(&self, index_path: &Path) -> Result<(), CheckpointError> {
        for (tensor, shard) in &self.weight_map {
            let plain = Path::new(shard)
                .file_name()
                .is_some_and(|n| n == shard.as_str())
                && shard != ".."
                && shard != ".";
            if !plain {
                return Err(CheckpointError::IndexMismatch {
                    index: PathBuf::from(index_path),
                    tensor: tensor.clone(),
                    shard: shard.clone(),
                    reason: "shard must be a plain file name in the index's directory".into(),
                });
            }
        }
        Ok(())
    }
}
