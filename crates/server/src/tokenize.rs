//! vLLM's utility endpoints: `POST /tokenize` (a prompt, or a conversation rendered as
//! `/v1/chat/completions` renders it), `POST /detokenize` and `GET /version`.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use fp4forge_api::{
    parse_detokenize, parse_tokenize, DetokenizeResponse, TokenizeRequest, TokenizeResponse,
    VersionResponse,
};

use crate::api_error::ApiError;
use crate::chat::{chat_input, render_prompt};
use crate::http::{check_content_length, json_response, read_body};
use crate::request::{check_prompt_bytes, with_codec};
use crate::state::AppState;

/// `POST /tokenize`.
pub(crate) async fn tokenize(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    respond(tokenize_body(state, headers, body).await)
}

/// `POST /detokenize`.
pub(crate) async fn detokenize(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    respond(detokenize_body(state, headers, body).await)
}

/// `GET /version`: this server's version.
pub(crate) async fn version() -> Response {
    json_response(
        StatusCode::OK,
        &VersionResponse {
            version: env!("CARGO_PKG_VERSION").into(),
        },
    )
}

fn respond<T: serde::Serialize>(r: Result<T, ApiError>) -> Response {
    match r {
        Ok(body) => json_response(StatusCode::OK, &body),
        Err(e) => e.into_response(),
    }
}

/// Refuses a request for another model than the served one.
fn check_model(model: Option<&str>, state: &AppState) -> Result<(), ApiError> {
    match model {
        Some(m) if m != state.model_name => Err(ApiError::unknown_model(m, &state.model_name)),
        _ => Ok(()),
    }
}

async fn tokenize_body(
    state: Arc<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<TokenizeResponse, ApiError> {
    check_content_length(&headers, &state)?;
    let bytes = read_body(body, &state).await?;
    let (tokens, return_strs) = match parse_tokenize(&bytes)? {
        TokenizeRequest::Completion(req) => {
            check_model(req.model.as_deref(), &state)?;
            check_prompt_bytes(req.prompt.len(), &state, "prompt", "the prompt")?;
            let add_special = req.add_special_tokens.unwrap_or(true);
            let prompt = req.prompt;
            let ids = with_codec(&state, move |codec| {
                codec
                    .encode(&prompt, add_special)
                    .map_err(|e| ApiError::field("prompt", format!("cannot tokenize: {e}")))
            })
            .await?;
            (ids, req.return_token_strs == Some(true))
        }
        TokenizeRequest::Chat(req) => {
            check_model(req.model.as_deref(), &state)?;
            let chat = req.as_chat_request();
            let (text, ids) = render_prompt(&state, &chat, chat_input(&chat)).await?;
            let ids = if req.add_special_tokens == Some(true) {
                with_codec(&state, move |codec| {
                    codec
                        .encode(&text, true)
                        .map_err(|e| ApiError::field("messages", format!("cannot tokenize: {e}")))
                })
                .await?
            } else {
                ids
            };
            (ids, req.return_token_strs == Some(true))
        }
    };
    let token_strs = return_strs.then(|| {
        tokens
            .iter()
            .map(|&id| state.codec.id_to_token(id).unwrap_or_default())
            .collect()
    });
    Ok(TokenizeResponse {
        count: tokens.len() as u64,
        max_model_len: state.info.max_context as u64,
        tokens,
        token_strs,
    })
}

async fn detokenize_body(
    state: Arc<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<DetokenizeResponse, ApiError> {
    check_content_length(&headers, &state)?;
    let bytes = read_body(body, &state).await?;
    let req = parse_detokenize(&bytes)?;
    check_model(req.model.as_deref(), &state)?;
    let vocab = state.info.vocab_size;
    if let Some((i, id)) = req
        .tokens
        .iter()
        .enumerate()
        .find(|(_, &id)| id as usize >= vocab)
    {
        return Err(ApiError::field(
            "tokens",
            format!("`tokens[{i}]` = {id} is not in the vocabulary (size {vocab})"),
        ));
    }
    let tokens = req.tokens;
    let prompt = with_codec(&state, move |codec| {
        codec
            .decode(&tokens, true)
            .map_err(|e| ApiError::field("tokens", format!("cannot detokenize: {e}")))
    })
    .await?;
    Ok(DetokenizeResponse { prompt })
}
