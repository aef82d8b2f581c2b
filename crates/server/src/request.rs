//! What completions and chat requests share once read: the sampling and stopping parameters
//! with the model's defaults, the token budget against the context, the prompt checks, and the
//! turn from prompts into [`ChoiceSpec`]s for the engine.

use std::sync::Arc;

use axum::http::StatusCode;
use fp4forge_api::{Integer, Sampling};
use fp4forge_engine::{SamplingParams, TextCodec};

use crate::api_error::ApiError;
use crate::generation::ChoiceSpec;
use crate::scheduler::{fresh_seed, SeqRequest};
use crate::state::AppState;

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
    /// The shared fields of a validated request, with the model's generation defaults.
    pub fn read(fields: &Sampling<'_>, state: &AppState) -> Result<Self, ApiError> {
        let defaults = &state.info.generation_defaults;
        let temperature = fields
            .temperature
            .map(|t| t as f32)
            .or(defaults.temperature)
            .unwrap_or(1.0);
        let top_p = fields
            .top_p
            .map(|p| p as f32)
            .or(defaults.top_p)
            .unwrap_or(1.0);
        if top_p <= 0.0 {
            return Err(ApiError::field("top_p", "`top_p` must be greater than 0"));
        }
        let top_k = fields.top_k().or(defaults.top_k).unwrap_or(0);
        let seed = fields.seed_bits().unwrap_or_else(fresh_seed);
        let stop_token_ids = fields.stop_token_list();
        let vocab = state.info.vocab_size;
        if let Some(&t) = stop_token_ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(ApiError::field(
                "stop_token_ids",
                format!("token id {t} is outside the vocabulary of {vocab} tokens"),
            ));
        }
        Ok(Self {
            n: fields.choices(),
            sampling: SamplingParams {
                temperature,
                top_k,
                top_p,
                seed,
            },
            stop: fields.stop_list(),
            stop_token_ids,
            ignore_eos: fields.ignore_eos.unwrap_or(false),
            min_tokens: fields.min_token_count(),
            stream: fields.stream.unwrap_or(false),
            include_usage: fields.include_usage(),
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

/// The token budget: `asked` (the field that asked and its value, already within the server's
/// limit) checked against the model's context with each prompt, or when absent `default`
/// (the server's limit when `None`) clamped to the room left; at least `min`.
pub(crate) fn max_tokens(
    asked: Option<(&str, Integer)>,
    state: &AppState,
    prompts: &[Vec<u32>],
    default: Option<usize>,
    min: usize,
) -> Result<usize, ApiError> {
    let limit = state.config.max_tokens_limit;
    let asked = asked.map(|(key, m)| (key, m.to_usize().unwrap_or(limit)));
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
            if m < min {
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
                    grammar: None,
                },
                stops: common.stop.clone(),
                keep_special: false,
                echo,
            });
        }
    }
    Ok(specs)
}
