//! One handler for every generation endpoint. An [`Endpoint`] says how its request reads, what
//! choices it plans, and how updates become stream chunks and the final response; [`handler`]
//! does the rest the same way for all: the body within its limit, the typed request, the
//! model check and validation, the shared parameters, submitting to the engine, and then
//! either an event stream or one JSON response.

use std::future::Future;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use fp4forge_api::{parse_request, Limits, RequestError, Sampling, WireRequest};
use serde::Serialize;

use crate::api_error::ApiError;
use crate::generation::{ChoiceSpec, Collected, Generation, Update, Usage};
use crate::http::{body_bytes, json_response, sse_response};
use crate::request::CommonParams;
use crate::state::{response_id, unix_now, AppState};
use crate::stream::ChunkStream;

/// A generation endpoint (`/v1/completions`, `/v1/chat/completions`). A value of the type is
/// one request's formatting state (which logprobs, text offsets so far).
pub(crate) trait Endpoint: Sized + Send + 'static {
    /// The request body.
    type Request: WireRequest + Send;
    /// One choice of a stream chunk.
    type Choice: Serialize + Send;
    /// The response body when not streaming.
    type Response: Serialize;
    /// The prefix of response ids (`cmpl`, `chatcmpl`).
    const ID_PREFIX: &'static str;
    /// The `object` of stream chunks.
    const CHUNK_OBJECT: &'static str;

    /// The model the request names, if it names one.
    fn model(req: &Self::Request) -> Option<&str>;

    /// The request's sampling and stopping fields.
    fn sampling(req: &Self::Request) -> Sampling<'_>;

    /// The request's own checks against the server's limits.
    fn validate(req: &Self::Request, limits: &Limits) -> Result<(), RequestError>;

    /// Turns the request into prompts and choices (tokenizing on a blocking thread), with the
    /// formatting state for its answer.
    fn plan(
        state: &Arc<AppState>,
        req: Self::Request,
        common: &CommonParams,
    ) -> impl Future<Output = Result<(Self, Vec<ChoiceSpec>), ApiError>> + Send;

    /// Choices of the stream's first chunks, before any update (chat: the role); one chunk each.
    fn opening(&self, choices: usize) -> Vec<Self::Choice> {
        let _ = choices;
        Vec::new()
    }

    /// The stream choice for one update.
    fn chunk(&mut self, state: &AppState, update: Update) -> Self::Choice;

    /// The whole response, once every choice finished.
    fn response(
        self,
        state: &AppState,
        id: String,
        created: u64,
        choices: Vec<Collected>,
        usage: Usage,
    ) -> Self::Response;
}

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
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match serve::<E>(state, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn serve<E: Endpoint>(
    state: Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = body_bytes(body, &state)?;
    let req: E::Request = parse_request(&bytes)?;
    if let Some(m) = E::model(&req) {
        if m != state.model_name {
            return Err(ApiError::unknown_model(m, &state.model_name));
        }
    }
    E::validate(&req, &limits(&state))?;
    let common = CommonParams::read(&E::sampling(&req), &state)?;
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
    let response = endpoint.response(&state, id, created, choices, usage);
    Ok(json_response(StatusCode::OK, &response))
}
