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
    /// A checkpoint whose config and tensors contradict each other (no loader accepts it).
    #[error("{source_name}: not a checkpoint a loader accepts ({count} problem(s)): {}", problems.join("; "))]
    Malformed {
        /// The checkpoint's `config.json`.
        source_name: String,
        /// How many problems there are.
        count: usize,
        /// The first of them, each naming the tensor or module.
        problems: Vec<String>,
    },
    /// A fused group (q/k/v, gate/up) whose members would be split between quantized and not.
    #[error("fused group split: [{quantized}] would be quantized but [{left_out}] would not; fused siblings share one global scale, so select all of them or none")]
    FusedGroupSplit {
        /// Members that the patterns select.
        quantized: String,
        /// Members they leave out.
        left_out: String,
    },
    /// The targets select nothing to quantize, or one of them matches no linear module.
    #[error("nothing to quantize: {reason} (pass --allow-empty to accept it)")]
    NothingSelected {
        /// Which pattern matched nothing (with the nearest module names), or why the selection
        /// is empty (already NVFP4, ignored).
        reason: String,
    },
    /// `--untie-lm-head` cannot apply: the model is not tied, has no embedding the geometry
    /// names, the embedding is already quantized, or `--ignore` excludes `lm_head`.
    #[error("--untie-lm-head: {reason}")]
    Untie {
        /// Why, naming the tensor, field or pattern.
        reason: String,
    },
    /// A tensor could not be quantized (NaN/inf, shape); names the file and the tensor.
    #[error("{}: {source}", file.display())]
    Numerics {
        /// The shard holding the tensor.
        file: PathBuf,
        /// What is wrong (names the tensor).
        #[source]
        source: fp4forge_format::NumericsError,
    },
    /// The output directory cannot be created or replaced.
    #[error("{}: {reason}", path.display())]
    Output {
        /// The output directory.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A GGUF file could not be read (the error names the file and the key or tensor).
    #[error(transparent)]
    Gguf(#[from] fp4forge_format::gguf::GgufError),
    /// A GGUF model cannot be imported: unsupported architecture, tokenizer or layout.
    #[error("{}: {reason}", file.display())]
    Import {
        /// The GGUF file.
        file: PathBuf,
        /// What is unsupported or inconsistent (names the key or tensor).
        reason: String,
    },
    /// The build was cancelled (e.g. Ctrl-C); nothing was written.
    #[error("cancelled; no output was written")]
    Cancelled,
}

impl From<fp4forge_arch::ArchError> for BuilderError {
    fn from(e: fp4forge_arch::ArchError) -> Self {
        use fp4forge_arch::ArchError;
        match e {
            ArchError::Checkpoint(c) => BuilderError::Checkpoint(c),
            ArchError::Field {
                file,
                field,
                reason,
            } => BuilderError::Config {
                source_name: file.display().to_string(),
                field,
                reason,
            },
            ArchError::UnsupportedArchitecture {
                file,
                found,
                supported,
            } => BuilderError::Config {
                source_name: file.display().to_string(),
                field: "architectures".into(),
                reason: format!(
                    "unsupported architecture {found:?}; supported: {}",
                    supported.join(", ")
                ),
            },
        }
    }
}
