//! The one handler of every generation endpoint: the body within its limit, the typed
//! request, the model check and validation, the shared parameters, the endpoint's plan
//! submitted to the engine, and then either an event stream or one JSON response.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use fp4forge_api::{parse_request, GenerationRequest, Limits};

use crate::api_error::ApiError;
use crate::endpoint::Endpoint;
use crate::generation::Generation;
use crate::http::{check_content_length, json_response, read_body, sse_response};
use crate::request::CommonParams;
use crate::state::{response_id, unix_now, AppState};
use crate::stream::ChunkStream;

/// The server's limits on a request.
pub(crate) fn limits(state: &AppState) -> Limits {
    Limits {
        max_choices: state.config.max_choices,
        max_tokens: state.config.max_tokens_limit,
        max_logprobs: state.config.max_logprobs,
    }
}

/// The handler of endpoint `E`.
pub(crate) async fn handler<E: Endpoint>(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match serve::<E>(state, headers, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn serve<E: Endpoint>(
    state: Arc<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    check_content_length(&headers, &state)?;
    let bytes = read_body(body, &state).await?;
    let req: E::Request = parse_request(&bytes)?;
    if let Some(m) = req.model() {
        if m != state.model_name {
            return Err(ApiError::unknown_model(m, &state.model_name));
        }
    }
    req.validate(&limits(&state))?;
    let common = CommonParams::read(&req.sampling(), &state)?;
    let (endpoint, specs) = E::plan(&state, req, &common).await?;
    let generation = Generation::submit(&state.engine, state.codec.clone(), specs)?;
    let id = response_id(E::ID_PREFIX);
    let created = unix_now();
    if common.stream {
        return Ok(sse_response(ChunkStream::new(
            endpoint,
            generation,
            state,
            id,
            created,
            common.include_usage,
        )));
    }
    let (choices, usage) = generation.collect().await?;
    let body = endpoint.response(&state, id, created, choices, usage);
    let mut response = json_response(StatusCode::OK, &body);
    // For the request log line.
    response.extensions_mut().insert(usage);
    Ok(response)
}
