//! What completions and chat requests share: sampling and stopping fields, `n`, streaming
//! options, the token budget against the context, and the turn from prompts into
//! [`ChoiceSpec`]s for the engine.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use fp4forge_engine::{SamplingParams, TextCodec};
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::generation::ChoiceSpec;
use crate::http::body_bytes;
use crate::params::{as_int, Body};
use crate::scheduler::{fresh_seed, SeqRequest};
use crate::state::AppState;

/// Most stop strings per request.
const MAX_STOPS: usize = 16;
/// Longest stop string, bytes (the hold-back check is quadratic in it).
const MAX_STOP_BYTES: usize = 256;

/// Reads a generation request's body (within the size limit), parses it as a JSON object and
/// reads the parameters every generation endpoint shares.
pub(crate) fn read_request(
    body: Result<Bytes, BytesRejection>,
    state: &AppState,
) -> Result<(Body, CommonParams), ApiError> {
    let bytes = body_bytes(body, state)?;
    let body = Body::parse(&bytes)?;
    let common = CommonParams::read(&body, state)?;
    Ok((body, common))
}

/// Runs `work` with the tokenizer on a blocking thread (tokenizing and template rendering are
/// CPU work that must not stall the async runtime).
pub(crate) async fn with_codec<T: Send + 'static>(
    codec: &Arc<TextCodec>,
    work: impl FnOnce(&TextCodec) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let codec = codec.clone();
    tokio::task::spawn_blocking(move || work(&codec))
        .await
        .map_err(|e| ApiError::internal(format!("tokenizer task: {e}")))?
}

/// The fields both endpoints read the same way.
#[derive(Debug, Clone)]
pub(crate) struct CommonParams {
    /// Choices per prompt.
    pub n: usize,
    /// Sampling (the seed of choice `j` is `seed + j`).
    pub sampling: SamplingParams,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Extra stop token ids (vLLM's `stop_token_ids`).
    pub stop_token_ids: Vec<u32>,
    /// Keep going past EOS (vLLM).
    pub ignore_eos: bool,
    /// No stop before this many tokens (vLLM).
    pub min_tokens: usize,
    /// Server-sent events.
    pub stream: bool,
    /// A final usage chunk when streaming.
    pub include_usage: bool,
}

impl CommonParams {
    /// Reads the shared fields of `body`, with the model's generation defaults.
    pub fn read(body: &Body, state: &AppState) -> Result<Self, ApiError> {
        body.check_model(&state.model_name)?;
        for (key, neutral) in [
            ("presence_penalty", vec![json!(0), json!(0.0)]),
            ("frequency_penalty", vec![json!(0), json!(0.0)]),
            ("repetition_penalty", vec![json!(1), json!(1.0)]),
            ("logit_bias", vec![json!({})]),
            ("best_of", vec![json!(1)]),
            ("suffix", vec![json!("")]),
            ("tools", vec![json!([])]),
            ("functions", vec![json!([])]),
            ("tool_choice", vec![json!("none"), json!("auto")]),
            ("response_format", vec![json!({"type": "text"})]),
            ("guided_json", vec![]),
            ("guided_regex", vec![]),
        ] {
            body.unsupported(key, &neutral)?;
        }
        let defaults = &state.info.generation_defaults;
        let temperature = body
            .number("temperature", 0.0, 100.0)?
            .map(|t| t as f32)
            .or(defaults.temperature)
            .unwrap_or(1.0);
        let top_p = body
            .number("top_p", 0.0, 1.0)?
            .map(|p| p as f32)
            .or(defaults.top_p)
            .unwrap_or(1.0);
        if top_p <= 0.0 {
            return Err(ApiError::field("top_p", "`top_p` must be greater than 0"));
        }
        let top_k = match body.int("top_k", -1, i64::from(u32::MAX), "the vocabulary")? {
            Some(k) if k > 0 => k as usize,
            Some(_) => 0,
            None => defaults.top_k.unwrap_or(0),
        };
        let seed = match body.get("seed") {
            None => fresh_seed(),
            Some(v) => match as_int(v) {
                Some(s) if s >= i128::from(i64::MIN) && s <= i128::from(u64::MAX) => s as u64,
                _ => {
                    return Err(ApiError::field(
                        "seed",
                        format!("`seed` must be a 64-bit integer, got {v}"),
                    ))
                }
            },
        };
        let max_choices = state.config.max_choices as i64;
        let n = body
            .int(
                "n",
                1,
                max_choices,
                "this server's limit of choices per request",
            )?
            .unwrap_or(1) as usize;
        let stop = body.stop(MAX_STOPS)?;
        if let Some(long) = stop.iter().find(|s| s.len() > MAX_STOP_BYTES) {
            return Err(ApiError::field(
                "stop",
                format!(
                    "a stop sequence of {} bytes; at most {MAX_STOP_BYTES} are allowed",
                    long.len()
                ),
            ));
        }
        let stop_token_ids = body.token_ids("stop_token_ids")?;
        let vocab = state.info.vocab_size;
        if let Some(&t) = stop_token_ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(ApiError::field(
                "stop_token_ids",
                format!("token id {t} is outside the vocabulary of {vocab} tokens"),
            ));
        }
        let ignore_eos = body.bool("ignore_eos")?.unwrap_or(false);
        let limit = state.config.max_tokens_limit as i64;
        let min_tokens = body
            .int("min_tokens", 0, limit, "this server's max_tokens limit")?
            .unwrap_or(0) as usize;
        let stream = body.bool("stream")?.unwrap_or(false);
        let include_usage = match body.get("stream_options") {
            None => false,
            Some(Value::Object(o)) => match o.get("include_usage") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(v) => {
                    return Err(ApiError::field(
                        "stream_options.include_usage",
                        format!("`stream_options.include_usage` must be true or false, got {v}"),
                    ))
                }
            },
            Some(v) => {
                return Err(ApiError::field(
                    "stream_options",
                    format!("`stream_options` must be an object, got {v}"),
                ))
            }
        };
        Ok(Self {
            n,
            sampling: SamplingParams {
                temperature,
                top_k,
                top_p,
                seed,
            },
            stop,
            stop_token_ids,
            ignore_eos,
            min_tokens,
            stream,
            include_usage,
        })
    }

    /// The engine's stop tokens for these parameters.
    pub fn stop_ids(&self, state: &AppState) -> Vec<u32> {
        let mut ids = if self.ignore_eos {
            Vec::new()
        } else {
            state.eos_ids.clone()
        };
        ids.extend(&self.stop_token_ids);
        ids.sort_unstable();
        ids.dedup();
        ids
    }
}

/// Reads `max_tokens` (`key`), checks it against the server's limit and, with each prompt,
/// the model's context. `default` applies when absent (clamped to the room left).
pub(crate) fn max_tokens(
    body: &Body,
    keys: &[&str],
    state: &AppState,
    prompts: &[Vec<u32>],
    default: Option<usize>,
    min: i64,
) -> Result<usize, ApiError> {
    let limit = state.config.max_tokens_limit;
    let mut asked = None;
    for key in keys {
        if let Some(v) = body.int(
            key,
            min,
            limit as i64,
            "this server's limit (--max-tokens-limit)",
        )? {
            asked = Some((*key, v as usize));
        }
    }
    let context = state.info.max_context;
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    match asked {
        Some((key, m)) => {
            if longest + m > context {
                return Err(ApiError::field(
                    key,
                    format!(
                        "This model's maximum context length is {context} tokens. However, you \
                         requested {} tokens ({longest} in the prompt, {m} for the completion). \
                         Please reduce the length of the prompt or of the completion.",
                        longest + m
                    ),
                )
                .with_code("context_length_exceeded"));
            }
            Ok(m)
        }
        None => {
            let room = context - longest;
            let m = default.unwrap_or(limit).min(limit).min(room);
            if m < min.max(0) as usize {
                return Err(ApiError::field(
                    "messages",
                    format!(
                        "the prompt has {longest} tokens and leaves no room to generate in the \
                         model's context of {context} tokens"
                    ),
                )
                .with_code("context_length_exceeded"));
            }
            Ok(m)
        }
    }
}

/// Checks one prompt's ids: non-empty, in the vocabulary, within the prompt limit.
pub(crate) fn check_prompt(
    ids: &[u32],
    state: &AppState,
    param: &str,
    which: &str,
) -> Result<(), ApiError> {
    if ids.is_empty() {
        return Err(ApiError::field(
            param,
            format!("{which} is empty (it has no tokens)"),
        ));
    }
    let vocab = state.info.vocab_size;
    if let Some(&t) = ids.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::field(
            param,
            format!("{which}: token id {t} is outside the vocabulary of {vocab} tokens"),
        ));
    }
    let limit = state.max_prompt_tokens();
    if ids.len() > limit {
        return Err(ApiError::field(
            param,
            format!(
                "{which} has {} tokens; this server accepts at most {limit} (the model's \
                 context is {} tokens)",
                ids.len(),
                state.info.max_context
            ),
        )
        .with_code("context_length_exceeded"));
    }
    Ok(())
}

/// The choices of a request: `n` per prompt, in prompt order.
pub(crate) fn choice_specs(
    prompts: Vec<Vec<u32>>,
    common: &CommonParams,
    state: &AppState,
    max_tokens: usize,
    logprobs: Option<usize>,
    prompt_logprobs: Option<usize>,
    echo: bool,
) -> Result<Vec<ChoiceSpec>, ApiError> {
    let total = prompts.len() * common.n;
    if total > state.config.max_choices {
        return Err(ApiError::field(
            "n",
            format!(
                "{} prompts × n = {} asks for {total} sequences; this server allows {} per request",
                prompts.len(),
                common.n,
                state.config.max_choices
            ),
        )
        .with_status(StatusCode::BAD_REQUEST));
    }
    let stop_ids = common.stop_ids(state);
    let mut specs = Vec::with_capacity(total);
    for (pi, prompt) in prompts.into_iter().enumerate() {
        let prompt = Arc::new(prompt);
        for j in 0..common.n {
            let mut sampling = common.sampling;
            sampling.seed = sampling.seed.wrapping_add(j as u64);
            specs.push(ChoiceSpec {
                prompt_index: pi,
                req: SeqRequest {
                    prompt: prompt.clone(),
                    max_tokens,
                    min_tokens: common.min_tokens.min(max_tokens),
                    sampling,
                    stop_ids: stop_ids.clone(),
                    logprobs,
                    prompt_logprobs,
                },
                stops: common.stop.clone(),
                echo,
            });
        }
    }
    Ok(specs)
}
