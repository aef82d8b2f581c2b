//! [`ApiError`]: a failed request, its HTTP status and OpenAI's error body. Request errors
//! ([`RequestError`]) and the scheduler's refusals ([`SubmitError`]) turn into one here, so
//! neither the wire types nor the engine side know HTTP.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use fp4forge_api::{ErrorBody, ErrorResponse, RequestError};

use crate::scheduler::SubmitError;

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

    /// 401: a `/v1` request without an `Authorization: Bearer` header, on a server started with
    /// an API key (OpenAI's wording and shape; no code, as OpenAI sends none).
    pub fn missing_api_key() -> Self {
        Self::invalid(
            None,
            "You didn't provide an API key. You need to provide your API key in an \
             Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
        )
        .with_status(StatusCode::UNAUTHORIZED)
    }

    /// 401: the bearer token is not the server's API key (`invalid_api_key`, as OpenAI; the
    /// token is not echoed back).
    pub fn invalid_api_key() -> Self {
        Self::invalid(None, "Incorrect API key provided.")
            .with_status(StatusCode::UNAUTHORIZED)
            .with_code("invalid_api_key")
    }

    /// The body OpenAI's clients parse.
    pub fn body(&self) -> ErrorResponse {
        ErrorResponse {
            error: ErrorBody {
                message: self.message.clone(),
                kind: self.kind.to_string(),
                param: self.param.clone(),
                code: self.code.map(str::to_string),
            },
        }
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
        let body = serde_json::to_vec(&self.body()).unwrap_or_else(|_| b"{}".to_vec());
        (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response()
    }
}

impl From<RequestError> for ApiError {
    fn from(e: RequestError) -> Self {
        Self::invalid(e.param(), e.to_string())
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        match e {
            SubmitError::QueueFull { .. } => Self::busy(e.to_string()),
            SubmitError::Stopped => Self::internal(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_map_to_their_statuses_and_request_errors_keep_the_field() {
        let busy = ApiError::from(SubmitError::QueueFull {
            waiting: 3,
            limit: 3,
        });
        assert_eq!(busy.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(busy.code, Some("server_busy"));
        assert!(busy.message.contains("limit 3"), "{}", busy.message);
        let stopped = ApiError::from(SubmitError::Stopped);
        assert_eq!(stopped.status, StatusCode::INTERNAL_SERVER_ERROR);
        let bad = ApiError::from(RequestError::UnknownField {
            field: "foo".into(),
        });
        assert_eq!(bad.status, StatusCode::BAD_REQUEST);
        assert_eq!(bad.param.as_deref(), Some("foo"));
        assert_eq!(bad.body().error.kind, "invalid_request_error");
    }
}
