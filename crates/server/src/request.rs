//! What completions and chat requests share once read: the sampling and stopping parameters
//! with the model's defaults, the token budget against the context, the prompt checks, and the
//! turn from prompts into [`ChoiceSpec`]s for the engine.

use std::sync::Arc;

use axum::http::StatusCode;
use fp4forge_api::{Integer, Sampling};
use fp4forge_engine::{LogitsAdjust, SamplingParams, TextCodec};

use crate::api_error::ApiError;
use crate::generation::ChoiceSpec;
use crate::scheduler::{fresh_seed, SeqRequest};
use crate::state::AppState;

/// Runs `work` with the tokenizer on a blocking thread (tokenizing and template rendering are
/// CPU work that must not stall the async runtime, nor the engine thread), at most one per
/// core at once.
pub(crate) async fn with_codec<T: Send + 'static>(
    state: &Arc<AppState>,
    work: impl FnOnce(&TextCodec) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let _permit = state
        .tokenize_permits
        .acquire()
        .await
        .map_err(|e| ApiError::internal(format!("tokenizer permits: {e}")))?;
    let codec = state.codec.clone();
    tokio::task::spawn_blocking(move || work(&codec))
        .await
        .map_err(|e| ApiError::internal(format!("tokenizer task: {e}")))?
}

/// Refuses, before tokenizing, a prompt text of `bytes` bytes that cannot fit: every token
/// stands for at most `max_token_bytes` bytes, so it has more tokens than the limit.
pub(crate) fn check_prompt_bytes(
    bytes: usize,
    state: &AppState,
    param: &str,
    which: &str,
) -> Result<(), ApiError> {
    let limit = state.max_prompt_bytes();
    if bytes <= limit {
        return Ok(());
    }
    Err(ApiError::field(
        param,
        format!(
            "{which} has {bytes} bytes of text, so more than {} tokens (no token of this \
             model's vocabulary stands for more than {} bytes); this server accepts prompts of \
             at most {} tokens (the model's context is {} tokens)",
            bytes / state.max_token_bytes,
            state.max_token_bytes,
            state.max_prompt_tokens(),
            state.info.max_context
        ),
    )
    .with_code("context_length_exceeded"))
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
    /// Penalties, bias, bans and min-p (`None`: neutral, the logits go to the sampler as they
    /// are).
    pub adjust: Option<Arc<LogitsAdjust>>,
    /// Keep the matched stop string in the text (vLLM).
    pub include_stop_str: bool,
    /// Leave special tokens out of the text (vLLM's `skip_special_tokens`, default true).
    pub skip_special: bool,
    /// Keep only the last this many prompt tokens (vLLM's `truncate_prompt_tokens`).
    pub truncate_prompt: Option<usize>,
    /// Alternatives per position in the reported `prompt_logprobs` (vLLM), when asked for.
    pub prompt_logprobs: Option<usize>,
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
        let adjust = Self::adjust(fields, state)?;
        Ok(Self {
            adjust: (!adjust.is_neutral()).then(|| Arc::new(adjust)),
            include_stop_str: fields.include_stop_str_in_output.unwrap_or(false),
            skip_special: fields.skip_special_tokens.unwrap_or(true),
            truncate_prompt: fields.truncate_prompt_tokens.and_then(Integer::to_usize),
            prompt_logprobs: fields.prompt_logprob_count(),
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

    /// The logit adjustments the request asks for: ids checked against the vocabulary,
    /// `bad_words` tokenized as vLLM does (each word alone and after a space, the latter only
    /// when it is a different token sequence of the same length).
    fn adjust(fields: &Sampling<'_>, state: &AppState) -> Result<LogitsAdjust, ApiError> {
        let vocab = state.info.vocab_size;
        let logit_bias: std::collections::HashMap<u32, f32> =
            fields.logit_bias_list().into_iter().collect();
        if let Some(&t) = logit_bias.keys().find(|&&t| t as usize >= vocab) {
            return Err(ApiError::field(
                "logit_bias",
                format!("token id {t} is outside the vocabulary of {vocab} tokens"),
            ));
        }
        let allowed_token_ids = fields.allowed_token_list();
        if let Some(&t) = allowed_token_ids
            .iter()
            .flatten()
            .find(|&&t| t as usize >= vocab)
        {
            return Err(ApiError::field(
                "allowed_token_ids",
                format!("token id {t} is outside the vocabulary of {vocab} tokens"),
            ));
        }
        let mut bad_words: Vec<Vec<u32>> = Vec::new();
        for word in fields.bad_words.unwrap_or_default() {
            let encode = |text: &str| {
                state
                    .codec
                    .encode(text, false)
                    .map_err(|e| ApiError::field("bad_words", format!("cannot tokenize: {e}")))
            };
            let bare = encode(word.trim_start())?;
            let spaced = encode(&format!(" {}", word.trim_start()))?;
            if bare.is_empty() {
                continue;
            }
            let distinct = spaced.len() == bare.len() && spaced.first() != bare.first();
            bad_words.push(bare);
            if distinct {
                bad_words.push(spaced);
            }
        }
        Ok(LogitsAdjust {
            presence_penalty: fields.presence_penalty.unwrap_or(0.0) as f32,
            frequency_penalty: fields.frequency_penalty.unwrap_or(0.0) as f32,
            repetition_penalty: fields.repetition_penalty.unwrap_or(1.0) as f32,
            logit_bias,
            min_p: fields.min_p.unwrap_or(0.0) as f32,
            bad_words,
            allowed_token_ids,
        })
    }

    /// `prompt` cut to its last `truncate_prompt_tokens` tokens, when asked.
    pub fn truncated(&self, mut prompt: Vec<u32>) -> Vec<u32> {
        if let Some(k) = self.truncate_prompt {
            if prompt.len() > k {
                prompt.drain(..prompt.len() - k);
            }
        }
        prompt
    }

    /// The request's own stop token ids that are not the model's EOS: a finish on one of these
    /// reports it as `stop_reason` (EOS reports none, as in vLLM).
    pub fn reported_stop_ids(&self, state: &AppState) -> Vec<u32> {
        self.stop_token_ids
            .iter()
            .copied()
            .filter(|t| !state.eos_ids.contains(t))
            .collect()
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

/// The choices of a request: `n` per prompt, in prompt order. `prompt_logprobs` is what the
/// echoed prompt needs; the sequences compute enough for `common.prompt_logprobs` too.
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
                    prompt_logprobs: prompt_logprobs.max(common.prompt_logprobs),
                    adjust: common.adjust.clone(),
                    grammar: None,
                },
                stops: common.stop.clone(),
                keep_special: !common.skip_special,
                include_stop_str: common.include_stop_str,
                stop_reason_ids: common.reported_stop_ids(state),
                report_prompt_logprobs: common.prompt_logprobs,
                echo,
            });
        }
    }
    Ok(specs)
}
