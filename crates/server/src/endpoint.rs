//! What differs between generation endpoints: an [`Endpoint`] says how its request reads, what
//! choices it plans, and how updates become stream chunks and the final response. The one
//! handler (`handler.rs`) does the rest the same way for all.

use std::future::Future;
use std::sync::Arc;

use fp4forge_api::GenerationRequest;
use serde::Serialize;

use crate::api_error::ApiError;
use crate::generation::{ChoiceSpec, Collected, Update, Usage};
use crate::request::CommonParams;
use crate::state::AppState;

/// A generation endpoint (`/v1/completions`, `/v1/chat/completions`). A value of the type is
/// one request's formatting state (which logprobs, text offsets so far).
pub(crate) trait Endpoint: Sized + Send + 'static {
    /// The request body.
    type Request: GenerationRequest + Send;
    /// One choice of a stream chunk.
    type Choice: Serialize + Send;
    /// The response body when not streaming.
    type Response: Serialize;
    /// The prefix of response ids (`cmpl`, `chatcmpl`).
    const ID_PREFIX: &'static str;
    /// The `object` of stream chunks.
    const CHUNK_OBJECT: &'static str;

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

    /// The stream choice for one update (`None`: nothing to send yet, e.g. text a parser holds).
    fn chunk(&mut self, state: &AppState, update: Update) -> Option<Self::Choice>;

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
