//! The builder's one error type.

use std::path::PathBuf;

/// Everything that can go wrong in `fp4forge-builder`; each variant names what it is about.
#[derive(Debug, thiserror::Error)]
pub enum BuilderError {
    /// A `targets`/`ignore` pattern whose `re:` regex does not compile.
    #[error("invalid pattern {pattern:?}: {source}")]
    InvalidPattern {
        /// The pattern as written (with its `re:` prefix).
        pattern: String,
        /// Why the regex crate refused it.
        #[source]
        source: Box<regex::Error>,
    },
    /// A file could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A checkpoint's safetensors files could not be read (the error names file and tensor).
    #[error(transparent)]
    Checkpoint(#[from] fp4forge_format::CheckpointError),
    /// A file is not valid JSON.
    #[error("{}: invalid JSON: {source}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// A config field is missing or has a value the builder cannot use.
    #[error("{source_name}: config field `{field}`: {reason}")]
    Config {
        /// The config's file (or another label for where it came from).
        source_name: String,
        /// The field, as a JSON path (`quantization_config.config_groups.group_0.weights`).
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A `--hardware` spec that is neither a known device nor `NAME=GBPS`.
    #[error("hardware {spec:?}: {reason}")]
    Hardware {
        /// The spec as given.
        spec: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A tensor whose name, dtype or shape does not fit what the builder expects.
    #[error("tensor `{tensor}`: {reason}")]
    Tensor {
        /// The tensor name.
        tensor: String,
        /// What is wrong with it.
        reason: String,
    },
}
