//! What can be wrong with a request ([`RequestError`], each variant naming the field at fault)
//! and OpenAI's error body ([`ErrorResponse`]) that carries it to the client.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Why a request body was refused. Every variant about a field names it ([`Self::param`]);
/// the message says what was expected and what came.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum RequestError {
    /// The body is empty (or only whitespace).
    #[error("the request body is empty; expected a JSON object")]
    EmptyBody,
    /// The body is not JSON.
    #[error("malformed JSON in the body: {0}")]
    MalformedJson(String),
    /// The body is JSON but not an object.
    #[error("the body must be a JSON object, got {0}")]
    NotAnObject(&'static str),
    /// A field this API does not have.
    #[error(
        "unknown field `{field}`: neither the OpenAI API nor this server's extensions have it"
    )]
    UnknownField {
        /// The field.
        field: String,
    },
    /// A field the API has but fp4forge does not implement, set to a value that would change
    /// the result.
    #[error("`{field}` is not supported by this server (got {got})")]
    Unsupported {
        /// The field.
        field: String,
        /// The value sent, shortened.
        got: String,
    },
    /// A field of the wrong JSON type.
    #[error("`{field}` must be {expected}, got {got}")]
    WrongType {
        /// The field.
        field: String,
        /// What it must be ("an integer", "true or false", ...).
        expected: &'static str,
        /// The JSON type and value sent ("a string \"ten\"").
        got: String,
    },
    /// A number outside its range.
    #[error("`{field}` must be between {min} and {max}, got {got}")]
    OutOfRange {
        /// The field.
        field: String,
        /// The least value allowed.
        min: f64,
        /// The greatest value allowed.
        max: f64,
        /// The value sent.
        got: String,
    },
    /// An integer below its minimum.
    #[error("`{field}` must be at least {min}, got {got}")]
    TooSmall {
        /// The field.
        field: String,
        /// The least value allowed.
        min: i128,
        /// The value sent.
        got: i128,
    },
    /// An integer above a limit.
    #[error("`{field}` = {got} exceeds {what} ({limit})")]
    TooLarge {
        /// The field.
        field: String,
        /// The value sent.
        got: i128,
        /// The limit.
        limit: u64,
        /// What the limit is ("this server's limit of choices per request").
        what: &'static str,
    },
    /// A required field is absent or null.
    #[error("`{field}` is required")]
    Required {
        /// The field.
        field: String,
    },
    /// Any other problem with one field (`param` may be a path such as `messages[0].role`).
    #[error("{message}")]
    Invalid {
        /// The field or path at fault.
        param: String,
        /// What is wrong.
        message: String,
    },
}

impl RequestError {
    /// A field-specific error with its own message.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Invalid {
            param: param.into(),
            message: message.into(),
        }
    }

    /// The field (or path) at fault; `None` when the body as a whole is.
    pub fn param(&self) -> Option<&str> {
        match self {
            Self::EmptyBody | Self::MalformedJson(_) | Self::NotAnObject(_) => None,
            Self::UnknownField { field }
            | Self::Unsupported { field, .. }
            | Self::WrongType { field, .. }
            | Self::OutOfRange { field, .. }
            | Self::TooSmall { field, .. }
            | Self::TooLarge { field, .. }
            | Self::Required { field } => Some(field),
            Self::Invalid { param, .. } => Some(param),
        }
    }
}

/// OpenAI's error body: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorResponse {
    /// The error.
    pub error: ErrorBody,
}

/// The inside of [`ErrorResponse`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What was wrong, for a person.
    pub message: String,
    /// OpenAI's error type (`invalid_request_error`, `server_error`, ...).
    #[serde(rename = "type")]
    pub kind: String,
    /// The request field at fault, if one is.
    #[serde(default)]
    pub param: Option<String>,
    /// A machine-readable code (`model_not_found`, `context_length_exceeded`, ...).
    #[serde(default)]
    pub code: Option<String>,
}
