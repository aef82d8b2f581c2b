//! The crate's one error type: every variant names the file, and the field where there is one.

use std::path::PathBuf;

use thiserror::Error;

/// Everything that can go wrong reading a model's geometry.
#[derive(Debug, Error)]
pub enum ArchError {
    /// `config.json` could not be read or is not JSON.
    #[error(transparent)]
    Checkpoint(#[from] fp4forge_format::CheckpointError),

    /// A field is missing or holds a value the family cannot use.
    #[error("{}: config field `{field}`: {reason}", file.display())]
    Field {
        /// The `config.json` file.
        file: PathBuf,
        /// The field, as a dotted path (`rope_parameters.full_attention.factor`).
        field: String,
        /// What is wrong with it.
        reason: String,
    },

    /// `architectures[0]` names no family this crate knows.
    #[error(
        "{}: unsupported architecture {found:?}; supported: {}",
        file.display(),
        supported.join(", ")
    )]
    UnsupportedArchitecture {
        /// The `config.json` file.
        file: PathBuf,
        /// The `architectures` entries found (empty when the field is absent).
        found: Vec<String>,
        /// Every architecture a family reads.
        supported: Vec<&'static str>,
    },
}

/// `Result` with [`ArchError`].
pub type Result<T, E = ArchError> = std::result::Result<T, E>;
