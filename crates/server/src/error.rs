//! [`ServerError`]: why the server could not start, or stopped. (A failed request is an
//! [`ApiError`](crate::api_error::ApiError).)

use std::path::PathBuf;

use thiserror::Error;

/// Why the server could not start, or stopped.
#[derive(Debug, Error)]
pub enum ServerError {
    /// The model could not be loaded (its device included: one this build lacks, or one that
    /// does not start).
    #[error("loading {}: {source}", dir.display())]
    Load {
        /// The checkpoint directory.
        dir: PathBuf,
        /// What the engine said.
        source: fp4forge_engine::EngineError,
    },
    /// The model directory does not exist, or is not a directory.
    #[error("{}: {problem}", dir.display())]
    NoModelDir {
        /// The path given.
        dir: PathBuf,
        /// `no such directory`, `not a directory`, or the I/O error.
        problem: String,
    },
    /// The model directory has no tokenizer, which a text API needs.
    #[error("{}: no tokenizer.json (the server needs the checkpoint's tokenizer)", dir.display())]
    NoTokenizer {
        /// The checkpoint directory.
        dir: PathBuf,
    },
    /// A configuration value is unusable.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The listening socket could not be set up.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: String,
        /// The socket error.
        source: std::io::Error,
    },
    /// Serving failed (an I/O error of the listener).
    #[error("serving: {0}")]
    Serve(std::io::Error),
    /// The engine thread stopped unexpectedly.
    #[error("the engine thread stopped: {0}")]
    Engine(String),
}
