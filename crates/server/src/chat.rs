//! `POST /v1/chat/completions`: messages rendered with the checkpoint's chat template, plain or
//! streamed (a role delta first, content deltas, a finish chunk, a usage chunk when
//! `stream_options.include_usage`), with chat-style logprobs (`logprobs.content[]` entries with
//! `top_logprobs` lists).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use fp4forge_engine::{ChatMessage, EngineError, TextCodec};
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::generation::{Generation, Update};
use crate::http::{json_response, sse_response, FrameSource};
use crate::params::{type_name, Body};
use crate::request::{check_prompt, choice_specs, max_tokens, read_request, with_codec};
use crate::state::{response_id, AppState};
use crate::stream::ChunkStream;
use crate::text::Piece;

const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// `messages`: a non-empty list of `{role, content}` (content a string, a list of text parts,
/// or null).
fn read_messages(body: &Body) -> Result<Vec<ChatMessage>, ApiError> {
    let key = "messages";
    let items = match body.get(key) {
        None => return Err(ApiError::field(key, "`messages` is required")),
        Some(Value::Array(items)) => items,
        Some(v) => {
            return Err(ApiError::field(
                key,
                format!(
                    "`messages` must be a list of messages, got {}",
                    type_name(v)
                ),
            ))
        }
    };
    if items.is_empty() {
        return Err(ApiError::field(
            key,
            "`messages` is empty; give at least one message",
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let at = |field: &str| format!("messages[{i}].{field}");
            let Value::Object(m) = m else {
                return Err(ApiError::field(
                    &format!("messages[{i}]"),
                    format!("`messages[{i}]` must be an object, got {}", type_name(m)),
                ));
            };
            let role = match m.get("role") {
                Some(Value::String(r)) if ROLES.contains(&r.as_str()) => r.clone(),
                Some(Value::String(r)) => {
                    return Err(ApiError::field(
                        &at("role"),
                        format!(
                            "`messages[{i}].role` {r:?} is not one of {}",
                            ROLES.join(", ")
                        ),
                    ))
                }
                None | Some(Value::Null) => {
                    return Err(ApiError::field(
                        &at("role"),
                        format!("`messages[{i}].role` is required"),
                    ))
                }
                Some(v) => {
                    return Err(ApiError::field(
                        &at("role"),
                        format!(
                            "`messages[{i}].role` must be a string, got {}",
                            type_name(v)
                        ),
                    ))
                }
            };
            let content = match m.get("content") {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => {
                    let mut text = String::new();
                    for (j, p) in parts.iter().enumerate() {
                        match (p.get("type").and_then(Value::as_str), p.get("text")) {
                            (Some("text"), Some(Value::String(t))) => text.push_str(t),
                            (kind, _) => {
                                return Err(ApiError::field(
                                    &at("content"),
                                    format!(
                                        "`messages[{i}].content[{j}]`: only text parts \
                                         ({{\"type\": \"text\", \"text\": ...}}) are supported, \
                                         got type {}",
                                        kind.unwrap_or("(none)")
                                    ),
                                ))
                            }
                        }
                    }
                    text
                }
                Some(v) => {
                    return Err(ApiError::field(
                        &at("content"),
                        format!(
                            "`messages[{i}].content` must be a string or a list of text parts, \
                             got {}",
                            type_name(v)
                        ),
                    ))
                }
            };
            Ok(ChatMessage { role, content })
        })
        .collect()
}

/// Renders and tokenizes the conversation (the template writes any BOS itself).
async fn prompt_ids(
    codec: &Arc<TextCodec>,
    messages: Vec<ChatMessage>,
) -> Result<Vec<u32>, ApiError> {
    with_codec(codec, move |codec| {
        let text = codec.render_chat(&messages, true).map_err(|e| match e {
            EngineError::NoChatTemplate => ApiError::field(
                "messages",
                "this model has no chat template; use /v1/completions with a prompt",
            ),
            other => ApiError::field(
                "messages",
                format!("the chat template refused the messages: {other}"),
            ),
        })?;
        codec
            .encode(&text, false)
            .map_err(|e| ApiError::field("messages", format!("cannot tokenize: {e}")))
    })
    .await
}

/// The handler.
pub(crate) async fn handler(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match run(state, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn run(
    state: Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (body, common) = read_request(body, &state)?;
    let want_logprobs = body.bool("logprobs")?.unwrap_or(false);
    let max_lp = state.config.max_logprobs as i64;
    let top = body
        .int(
            "top_logprobs",
            0,
            max_lp,
            "this server's limit of top logprobs",
        )?
        .map(|n| n as usize);
    if top.is_some() && !want_logprobs {
        return Err(ApiError::field(
            "top_logprobs",
            "`top_logprobs` needs `logprobs: true`",
        ));
    }
    let logprobs = want_logprobs.then_some(top.unwrap_or(0));
    let messages = read_messages(&body)?;
    let prompt = prompt_ids(&state.codec, messages).await?;
    check_prompt(&prompt, &state, "messages", "the rendered conversation")?;
    let prompts = vec![prompt];
    let max_tokens = max_tokens(
        &body,
        &["max_tokens", "max_completion_tokens"],
        &state,
        &prompts,
        None,
        1,
    )?;
    let specs = choice_specs(prompts, &common, &state, max_tokens, logprobs, None, false)?;
    let generation = Generation::submit(&state.engine, state.codec.clone(), specs)?;
    let id = response_id("chatcmpl");
    let created = crate::state::unix_now();
    if common.stream {
        return Ok(sse_response(ChatStream {
            started: false,
            inner: ChunkStream {
                generation,
                state,
                id,
                created,
                object: "chat.completion.chunk",
                include_usage: common.include_usage,
                done: false,
            },
            logprobs: logprobs.is_some(),
        }));
    }
    let (choices, usage) = generation.collect().await?;
    let choices: Vec<Value> = choices
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let text: String = c.pieces.iter().map(|p| p.text.as_str()).collect();
            let lp = logprobs.map(|_| {
                let content: Vec<Value> = c
                    .pieces
                    .iter()
                    .flat_map(|p| content_logprobs(&state.codec, p))
                    .collect();
                json!({ "content": content })
            });
            json!({
                "index": i,
                "message": {"role": "assistant", "content": text},
                "logprobs": lp,
                "finish_reason": c.finish,
                "stop_reason": null,
            })
        })
        .collect();
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "id": id,
            "object": "chat.completion",
            "created": created,
            "model": state.model_name,
            "choices": choices,
            "usage": usage.json(),
        }),
    ))
}

/// `logprobs.content` entries of `piece`'s tokens.
fn content_logprobs(codec: &TextCodec, piece: &Piece) -> Vec<Value> {
    piece
        .tokens
        .iter()
        .filter_map(|t| {
            let lp = t.logprob.as_ref()?;
            let top: Vec<Value> = lp
                .top
                .iter()
                .map(|&(id, v)| {
                    let s = codec.decode(&[id], true).unwrap_or_default();
                    json!({"token": s, "logprob": v, "bytes": s.as_bytes()})
                })
                .collect();
            Some(json!({
                "token": t.text,
                "logprob": lp.logprob,
                "bytes": t.text.as_bytes(),
                "top_logprobs": top,
            }))
        })
        .collect()
}

/// A streamed chat completion's events: a role chunk per choice first, then the shared stream.
struct ChatStream {
    started: bool,
    inner: ChunkStream,
    logprobs: bool,
}

impl FrameSource for ChatStream {
    async fn next_frames(&mut self) -> Option<Bytes> {
        if !self.started {
            self.started = true;
            let mut out = Vec::new();
            for i in 0..self.inner.generation.choice_count() {
                out.extend_from_slice(&self.inner.chunk(
                    vec![
                        json!({"index": i, "delta": {"role": "assistant", "content": ""},
                                "logprobs": null, "finish_reason": null}),
                    ],
                    None,
                ));
            }
            return Some(Bytes::from(out));
        }
        let logprobs = self.logprobs;
        self.inner
            .next_frames(|state, u| match u {
                Update::Piece { choice, piece } => {
                    let lp = logprobs
                        .then(|| json!({"content": content_logprobs(&state.codec, &piece)}));
                    json!({"index": choice, "delta": {"content": piece.text},
                           "logprobs": lp, "finish_reason": null})
                }
                Update::Finished { choice, reason } => {
                    json!({"index": choice, "delta": {}, "logprobs": null,
                           "finish_reason": reason, "stop_reason": null})
                }
            })
            .await
    }
}
