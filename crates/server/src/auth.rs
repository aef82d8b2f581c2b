//! API-key authentication (`--api-key`): every `/v1` route wants `Authorization: Bearer KEY`;
//! `/health` and `/metrics` stay open, as in vLLM, so probes and scrapers need no secret.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::api_error::ApiError;
use crate::state::AppState;

/// Whether `path` needs the key: `/v1` and everything below it.
fn is_protected(path: &str) -> bool {
    path == "/v1" || path.starts_with("/v1/")
}

/// The token of an `Authorization: Bearer TOKEN` header value (scheme case-insensitive, as
/// RFC 7235 says), or `None` for any other scheme.
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at(value.iter().position(|&b| b == b' ')?);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return None;
    }
    Some(rest.trim_ascii())
}

/// Compares in time that depends only on the lengths, so a wrong key's timing does not tell how
/// much of it was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Refuses a `/v1` request without the configured key with 401 and OpenAI's error body (no key
/// configured: lets everything through).
pub(crate) async fn require_api_key(
    State(state): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    let Some(key) = state.config.api_key.as_deref() else {
        return next.run(req).await;
    };
    if !is_protected(req.uri().path()) {
        return next.run(req).await;
    }
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| bearer_token(v.as_bytes()));
    match given {
        Some(Some(token)) if constant_time_eq(token, key.as_bytes()) => next.run(req).await,
        Some(Some(_)) => unauthorized(ApiError::invalid_api_key()),
        Some(None) | None => unauthorized(ApiError::missing_api_key()),
    }
}

/// The 401 with the header that names the scheme expected.
fn unauthorized(error: ApiError) -> Response {
    let mut response = error.into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_v1_routes_are_protected() {
        for p in ["/v1", "/v1/models", "/v1/chat/completions", "/v1/nope"] {
            assert!(is_protected(p), "{p}");
        }
        for p in ["/health", "/metrics", "/", "/v10/models", "/v1x"] {
            assert!(!is_protected(p), "{p}");
        }
    }

    #[test]
    fn bearer_tokens_are_read_and_other_schemes_refused() {
        assert_eq!(bearer_token(b"Bearer sk-1"), Some(&b"sk-1"[..]));
        assert_eq!(bearer_token(b"bearer   sk-1 "), Some(&b"sk-1"[..]));
        assert_eq!(bearer_token(b"Basic dXNlcjpwYXNz"), None);
        assert_eq!(bearer_token(b"sk-1"), None);
        assert_eq!(bearer_token(b"Bearer"), None);
    }

    #[test]
    fn keys_compare_exactly() {
        assert!(constant_time_eq(b"sk-abc", b"sk-abc"));
        assert!(!constant_time_eq(b"sk-abc", b"sk-abd"));
        assert!(!constant_time_eq(b"sk-abc", b"sk-ab"));
        assert!(!constant_time_eq(b"", b"x"));
    }
}
