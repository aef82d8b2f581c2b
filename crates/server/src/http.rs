//! Request and response plumbing shared by the handlers: reading the body within its limit and
//! timeout, JSON bodies, server-sent event streams, fallbacks for unknown routes and methods, and request counting.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::Serialize;

use crate::api_error::ApiError;
use crate::state::AppState;

/// A JSON response.
pub(crate) fn json_response<T: Serialize>(status: StatusCode, value: &T) -> Response {
    let body = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// One server-sent event carrying `value`.
pub(crate) fn sse_event<T: Serialize>(value: &T) -> Bytes {
    let mut out = b"data: ".to_vec();
    out.extend(serde_json::to_vec(value).unwrap_or_default());
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// The event that ends a stream.
pub(crate) fn sse_done() -> Bytes {
    Bytes::from_static(b"data: [DONE]\n\n")
}

/// Something that yields the frames of an event stream, one batch at a time (`None` at the
/// end). Dropping it (the client went away) must cancel the work behind it.
pub(crate) trait FrameSource: Send + 'static {
    /// The next frames.
    fn next_frames(&mut self) -> impl Future<Output = Option<Bytes>> + Send;
}

/// A `text/event-stream` response over `source`.
pub(crate) fn sse_response<S: FrameSource>(source: S) -> Response {
    let stream = futures_util::stream::unfold(source, |mut s| async move {
        s.next_frames()
            .await
            .map(|bytes| (Ok::<Bytes, Infallible>(bytes), s))
    });
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}

/// The body, or the error a client should get for it: 413 past `--max-body-bytes` (as soon as
/// its `Content-Length` or the bytes so far say so), 408 when it does not all arrive within
/// `--body-read-timeout`, 400 when the connection fails mid-body.
pub(crate) async fn read_body(body: Body, state: &AppState) -> Result<Bytes, ApiError> {
    let limit = state.config.max_body_bytes;
    let too_large = || {
        ApiError::invalid(
            None,
            format!("the request body is larger than this server's limit of {limit} bytes"),
        )
        .with_status(StatusCode::PAYLOAD_TOO_LARGE)
        .with_code("body_too_large")
    };
    let timeout = state.config.body_read_timeout;
    let read = async {
        let mut stream = body.into_data_stream();
        let mut out = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| {
                ApiError::invalid(None, format!("cannot read the request body: {e}"))
            })?;
            if out.len() + chunk.len() > limit {
                return Err(too_large());
            }
            out.extend_from_slice(&chunk);
        }
        Ok(Bytes::from(out))
    };
    match tokio::time::timeout(timeout, read).await {
        Ok(r) => r,
        Err(_) => Err(ApiError::invalid(
            None,
            format!(
                "the request body did not arrive within {} s (--body-read-timeout)",
                timeout.as_secs_f64()
            ),
        )
        .with_status(StatusCode::REQUEST_TIMEOUT)
        .with_code("body_timeout")),
    }
}

/// Refuses a request whose `Content-Length` says its body is over the limit, before reading it.
pub(crate) fn check_content_length(
    headers: &axum::http::HeaderMap,
    state: &AppState,
) -> Result<(), ApiError> {
    let limit = state.config.max_body_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    match declared {
        Some(n) if n > limit as u64 => Err(ApiError::invalid(
            None,
            format!(
                "the request body is larger than this server's limit of {limit} bytes \
                 (Content-Length: {n})"
            ),
        )
        .with_status(StatusCode::PAYLOAD_TOO_LARGE)
        .with_code("body_too_large")),
        _ => Ok(()),
    }
}

/// 404 for a path the server does not have.
pub(crate) async fn not_found(req: Request) -> ApiError {
    ApiError::invalid(
        None,
        format!(
            "no such endpoint: {} {} (this server has GET /v1/models, POST /v1/completions, \
             POST /v1/chat/completions, POST /tokenize, POST /detokenize, GET /version, GET /health, \
             GET /metrics)",
            req.method(),
            req.uri().path()
        ),
    )
    .with_status(StatusCode::NOT_FOUND)
}

/// 405 for a known path with the wrong method.
pub(crate) async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::invalid(
        None,
        format!("{} is not allowed on {}", req.method(), req.uri().path()),
    )
    .with_status(StatusCode::METHOD_NOT_ALLOWED)
}

/// Counts every request by endpoint and status.
pub(crate) async fn count_requests(
    State(state): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    let endpoint = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "other".into());
    let response = next.run(req).await;
    state.metrics.request(&endpoint, response.status().as_u16());
    response
}
