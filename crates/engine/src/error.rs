//! The engine's one error type. Every variant names what it is about: the file, the tensor, the
//! config field, the token.

use std::path::PathBuf;

use thiserror::Error;

/// Everything that can go wrong loading or running a model.
#[derive(Debug, Error)]
pub enum EngineError {
    /// A safetensors file or `config.json` could not be read (the error names file and tensor).
    #[error(transparent)]
    Checkpoint(#[from] fp4forge_format::CheckpointError),

    /// A `config.json` field is missing or holds a value the engine cannot use.
    #[error("{}: config field `{field}`: {reason}", file.display())]
    Config {
        /// The `config.json` file.
        file: PathBuf,
        /// The field, as a dotted path (`rope_parameters.full_attention.factor`).
        field: String,
        /// What is wrong with it.
        reason: String,
    },

    /// The checkpoint's architecture is not one the engine implements.
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
        /// Every architecture the engine can run.
        supported: Vec<&'static str>,
    },

    /// A tensor is missing or has a dtype or shape the model cannot use.
    #[error("{}: tensor `{tensor}`: {reason}", dir.display())]
    Tensor {
        /// The checkpoint directory.
        dir: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// What is wrong.
        reason: String,
    },

    /// A sequence would grow past the model's context.
    #[error(
        "context overflow: {position} tokens already in the sequence plus {adding} new ones \
         exceed the context of {max_context} tokens"
    )]
    ContextOverflow {
        /// Tokens already in the session.
        position: usize,
        /// Tokens being added.
        adding: usize,
        /// The context limit (`max_position_embeddings` or the `max_context` option).
        max_context: usize,
    },

    /// A token id is outside the vocabulary.
    #[error("token id {token} is outside the vocabulary of {vocab_size} tokens")]
    TokenOutOfRange {
        /// The offending id.
        token: u32,
        /// The model's vocabulary size.
        vocab_size: usize,
    },

    /// A call was given arguments it cannot use (an empty prompt, inconsistent options).
    #[error("invalid input: {0}")]
    InvalidInput(String),

    /// A backend could not do what was asked (device errors, shape contracts broken).
    #[error("backend {backend}: {reason}")]
    Backend {
        /// The backend's name.
        backend: String,
        /// What went wrong.
        reason: String,
    },

    /// A tokenizer or config file of the checkpoint could not be read or parsed.
    #[error("{}: {reason}", path.display())]
    TextFile {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },

    /// The tokenizer refused a text or ids.
    #[error("tokenizer: {reason}")]
    Tokenizer {
        /// What it said.
        reason: String,
    },

    /// The chat template does not compile.
    #[error("{}: chat template: {reason}", path.display())]
    ChatTemplate {
        /// Where the template came from.
        path: PathBuf,
        /// The template error.
        reason: String,
    },

    /// The chat template failed while rendering (e.g. its own `raise_exception`).
    #[error("chat template: {reason}")]
    ChatRender {
        /// The error, with its template location.
        reason: String,
    },

    /// The device asked for is not built into this binary (CUDA without the `cuda` feature).
    #[error(
        "device {device}: this build has no CUDA backend; rebuild with the `cuda` feature \
         (cargo build --release -p fp4forge --features cuda)"
    )]
    DeviceNotBuilt {
        /// The device asked for.
        device: crate::Device,
    },

    /// The device could not be started (no driver, no such GPU, ...).
    #[error("starting device {device}: {source}")]
    DeviceStart {
        /// The device asked for.
        device: crate::Device,
        /// What the backend said.
        source: Box<EngineError>,
    },

    /// A chat was asked of a checkpoint without a chat template.
    #[error(
        "the checkpoint has no chat template (chat_template.jinja or tokenizer_config.json \
         `chat_template`)"
    )]
    NoChatTemplate,
}

/// Shorthand for the engine's results.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;
