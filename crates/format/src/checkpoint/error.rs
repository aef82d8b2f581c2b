//! The one error type of checkpoint I/O: safetensors files, shard indexes, shard writing and
//! `config.json`. Every variant names the file, and the tensor or field when there is one.

use std::path::PathBuf;

use thiserror::Error;

/// Why a checkpoint file could not be read, validated or written.
#[derive(Debug, Error)]
pub enum CheckpointError {
    /// An operating-system I/O call failed on `path`.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory concerned.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A safetensors header is malformed (length prefix, JSON, layout of the data section).
    #[error("{}: invalid safetensors header: {reason}", path.display())]
    Header {
        /// The safetensors file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// One tensor entry of a safetensors header is malformed (dtype, shape, offsets).
    #[error("{}: tensor `{tensor}`: {reason}", path.display())]
    Tensor {
        /// The safetensors file.
        path: PathBuf,
        /// The tensor's name in the header.
        tensor: String,
        /// What is wrong.
        reason: String,
    },
    /// The file ends before the data of `tensor` does.
    #[error("{}: truncated: tensor `{tensor}` needs data up to byte {needed} of the data section, which holds {available}", path.display())]
    Truncated {
        /// The safetensors file.
        path: PathBuf,
        /// The first tensor whose data is cut off.
        tensor: String,
        /// End offset of that tensor within the data section.
        needed: u64,
        /// Bytes actually present in the data section.
        available: u64,
    },
    /// A JSON file (index, config) is not valid JSON or does not fit its schema.
    #[error("{}: {source}", path.display())]
    Json {
        /// The JSON file.
        path: PathBuf,
        /// The parser's error, which names the offending field where it can.
        #[source]
        source: serde_json::Error,
    },
    /// A shard listed by `model.safetensors.index.json` does not exist.
    #[error("{}: shard `{shard}` does not exist", index.display())]
    MissingShard {
        /// The index file.
        index: PathBuf,
        /// The shard file name as written in the index.
        shard: String,
    },
    /// A tensor asked for by name is not there.
    #[error("{}: no tensor named `{tensor}`", path.display())]
    MissingTensor {
        /// The file or checkpoint directory searched.
        path: PathBuf,
        /// The requested name.
        tensor: String,
    },
    /// The index and the shards disagree about where a tensor lives.
    #[error("{}: tensor `{tensor}` / shard `{shard}`: {reason}", index.display())]
    IndexMismatch {
        /// The index file.
        index: PathBuf,
        /// The tensor concerned.
        tensor: String,
        /// The shard file concerned.
        shard: String,
        /// How they disagree.
        reason: String,
    },
    /// A directory does not hold a readable checkpoint layout.
    #[error("{}: {reason}", dir.display())]
    Layout {
        /// The checkpoint directory.
        dir: PathBuf,
        /// What is missing or ambiguous.
        reason: String,
    },
    /// A tensor declared to or written through the shard writer is invalid.
    #[error("{}: tensor `{tensor}`: {reason}", dir.display())]
    Write {
        /// The output directory.
        dir: PathBuf,
        /// The tensor concerned.
        tensor: String,
        /// What is wrong (unknown name, wrong byte length, written twice, never written...).
        reason: String,
    },
}

impl CheckpointError {
    /// An [`CheckpointError::Io`] for `path`.
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }
}
