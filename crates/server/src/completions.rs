//! `POST /v1/completions`: text or token-id prompts (one or a list), `echo` with prompt
//! logprobs (the log-likelihood scoring lm-evaluation-harness and `fp4forge eval` use:
//! `echo: true, max_tokens: 0, logprobs: N`), legacy logprobs (`tokens`, `token_logprobs`,
//! `top_logprobs` as token → logprob objects, `text_offset` in characters), plain or streamed.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use fp4forge_engine::TextCodec;
use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::generation::{Generation, Update};
use crate::http::{json_response, sse_response, FrameSource};
use crate::params::{as_int, type_name, Body};
use crate::request::{check_prompt, choice_specs, max_tokens, read_request, with_codec};
use crate::state::{response_id, AppState};
use crate::stream::ChunkStream;
use crate::text::Piece;

/// OpenAI's default `max_tokens` for completions.
const DEFAULT_MAX_TOKENS: usize = 16;

/// One prompt as sent.
enum PromptIn {
    Text(String),
    Ids(Vec<u32>),
}

/// `prompt`: a string, a list of token ids, or a list of either.
fn read_prompts(body: &Body) -> Result<Vec<PromptIn>, ApiError> {
    let key = "prompt";
    let bad = |what: String| ApiError::field(key, what);
    let ids = |items: &[Value], which: &str| -> Result<Vec<u32>, ApiError> {
        items
            .iter()
            .map(|x| {
                as_int(x)
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| {
                        bad(format!(
                            "{which} must be a list of token ids (non-negative integers), found \
                             {} {x}",
                            type_name(x)
                        ))
                    })
            })
            .collect()
    };
    match body.get(key) {
        None => Err(bad("`prompt` is required".into())),
        Some(Value::String(s)) => Ok(vec![PromptIn::Text(s.clone())]),
        Some(Value::Array(items)) if items.is_empty() => Err(bad("`prompt` is empty".into())),
        Some(Value::Array(items)) if items.iter().all(Value::is_number) => {
            Ok(vec![PromptIn::Ids(ids(items, "`prompt`")?)])
        }
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, x)| match x {
                Value::String(s) => Ok(PromptIn::Text(s.clone())),
                Value::Array(inner) => Ok(PromptIn::Ids(ids(inner, &format!("`prompt[{i}]`"))?)),
                other => Err(bad(format!(
                    "`prompt[{i}]` must be a string or a list of token ids, got {}",
                    type_name(other)
                ))),
            })
            .collect(),
        Some(v) => Err(bad(format!(
            "`prompt` must be a string, a list of token ids, or a list of either; got {}",
            type_name(v)
        ))),
    }
}

/// Tokenizes text prompts (with BOS where the tokenizer adds one); token-id prompts are used as
/// they are.
async fn tokenize(
    codec: &Arc<TextCodec>,
    prompts: Vec<PromptIn>,
) -> Result<Vec<Vec<u32>>, ApiError> {
    with_codec(codec, move |codec| {
        prompts
            .into_iter()
            .map(|p| match p {
                PromptIn::Ids(ids) => Ok(ids),
                PromptIn::Text(t) => codec
                    .encode(&t, true)
                    .map_err(|e| ApiError::field("prompt", format!("cannot tokenize: {e}"))),
            })
            .collect()
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
    let echo = body.bool("echo")?.unwrap_or(false);
    let max_lp = state.config.max_logprobs as i64;
    let logprobs = body
        .int("logprobs", 0, max_lp, "this server's limit of top logprobs")?
        .map(|n| n as usize);
    let prompts = read_prompts(&body)?;
    let many = prompts.len() > 1;
    let prompts = tokenize(&state.codec, prompts).await?;
    for (i, p) in prompts.iter().enumerate() {
        let which = if many {
            format!("prompt {i}")
        } else {
            "the prompt".into()
        };
        check_prompt(p, &state, "prompt", &which)?;
    }
    let max_tokens = max_tokens(
        &body,
        &["max_tokens"],
        &state,
        &prompts,
        Some(DEFAULT_MAX_TOKENS),
        0,
    )?;
    let prompt_logprobs = if echo { logprobs } else { None };
    let specs = choice_specs(
        prompts,
        &common,
        &state,
        max_tokens,
        logprobs,
        prompt_logprobs,
        echo,
    )?;
    let generation = Generation::submit(&state.engine, state.codec.clone(), specs)?;
    let id = response_id("cmpl");
    let created = crate::state::unix_now();
    if common.stream {
        let n = generation.choice_count();
        return Ok(sse_response(CompletionStream {
            inner: ChunkStream {
                generation,
                state,
                id,
                created,
                object: "text_completion",
                include_usage: common.include_usage,
                done: false,
            },
            logprobs: logprobs.is_some(),
            offsets: vec![0; n],
        }));
    }
    let (choices, usage) = generation.collect().await?;
    let choices: Vec<Value> = choices
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let mut offset = 0;
            let text: String = c.pieces.iter().map(|p| p.text.as_str()).collect();
            let lp = logprobs.map(|_| {
                let mut acc = LegacyLogprobs::default();
                for p in &c.pieces {
                    acc.add(&state.codec, p, &mut offset);
                }
                acc.json()
            });
            json!({
                "index": i,
                "text": text,
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
            "object": "text_completion",
            "created": created,
            "model": state.model_name,
            "choices": choices,
            "usage": usage.json(),
        }),
    ))
}

/// The legacy logprobs object, built piece by piece.
#[derive(Default)]
struct LegacyLogprobs {
    tokens: Vec<Value>,
    token_logprobs: Vec<Value>,
    top_logprobs: Vec<Value>,
    text_offset: Vec<usize>,
}

impl LegacyLogprobs {
    /// Adds `piece`'s tokens; `offset` is the character offset of the piece in the choice's
    /// text, advanced past it.
    fn add(&mut self, codec: &TextCodec, piece: &Piece, offset: &mut usize) {
        let mut chars = 0;
        for t in &piece.tokens {
            self.tokens.push(Value::String(t.text.clone()));
            self.text_offset.push(*offset + chars);
            chars += t.text.chars().count();
            match &t.logprob {
                None => {
                    self.token_logprobs.push(Value::Null);
                    self.top_logprobs.push(Value::Null);
                }
                Some(lp) => {
                    self.token_logprobs.push(json!(lp.logprob));
                    let mut top = Map::new();
                    for &(id, v) in &lp.top {
                        let key = codec.decode(&[id], true).unwrap_or_default();
                        top.entry(key).or_insert(json!(v));
                    }
                    let key = codec.decode(&[t.id], true).unwrap_or_default();
                    top.entry(key).or_insert(json!(lp.logprob));
                    self.top_logprobs.push(Value::Object(top));
                }
            }
        }
        *offset += piece.text.chars().count().max(chars);
    }

    fn json(self) -> Value {
        json!({
            "tokens": self.tokens,
            "token_logprobs": self.token_logprobs,
            "top_logprobs": self.top_logprobs,
            "text_offset": self.text_offset,
        })
    }
}

/// A streamed completion's events (legacy logprobs keep each choice's text offset).
struct CompletionStream {
    inner: ChunkStream,
    logprobs: bool,
    offsets: Vec<usize>,
}

impl FrameSource for CompletionStream {
    async fn next_frames(&mut self) -> Option<Bytes> {
        let (logprobs, offsets) = (self.logprobs, &mut self.offsets);
        self.inner
            .next_frames(|state, u| match u {
                Update::Piece { choice, piece } => {
                    let lp = logprobs.then(|| {
                        let mut acc = LegacyLogprobs::default();
                        acc.add(&state.codec, &piece, &mut offsets[choice]);
                        acc.json()
                    });
                    json!({"index": choice, "text": piece.text, "logprobs": lp,
                           "finish_reason": null})
                }
                Update::Finished { choice, reason } => {
                    json!({"index": choice, "text": "", "logprobs": null,
                           "finish_reason": reason, "stop_reason": null})
                }
            })
            .await
    }
}
