//! The server's two error types: [`ServerError`] for starting and running it, [`ApiError`] for
//! one request (an HTTP status and OpenAI's error body).

use std::path::PathBuf;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
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

/// A failed request: its HTTP status and the body OpenAI's clients parse,
/// `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What was wrong, for a person.
    pub message: String,
    /// OpenAI's error type (`invalid_request_error`, `server_error`, ...).
    pub kind: &'static str,
    /// The request field at fault, if one is.
    pub param: Option<String>,
    /// A machine-readable code (`model_not_found`, `context_length_exceeded`, ...).
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A 400 about `param` (`None`: about the request as a whole).
    pub fn invalid(param: Option<&str>, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_owned),
            code: None,
        }
    }

    /// A 400 about field `param`.
    pub fn field(param: &str, message: impl Into<String>) -> Self {
        Self::invalid(Some(param), message)
    }

    /// Replaces the status.
    pub fn with_status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }

    /// Sets the code.
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// A 404 for a model this server does not serve.
    pub fn unknown_model(asked: &str, served: &str) -> Self {
        Self::field(
            "model",
            format!("The model `{asked}` does not exist. This server serves `{served}`."),
        )
        .with_status(StatusCode::NOT_FOUND)
        .with_code("model_not_found")
    }

    /// A 5xx: the server failed, not the request.
    pub fn internal(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    /// 429: the queue of waiting requests is full.
    pub fn busy(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: Some("server_busy"),
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.status, self.message)
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        crate::http::json_response(self.status, &self.body())
    }
}
