//! `POST /v1/completions`: text or token-id prompts (one or a list), `echo` with prompt
//! logprobs (the log-likelihood scoring lm-evaluation-harness and `fp4forge eval` use:
//! `echo: true, max_tokens: 0, logprobs: N`), legacy logprobs (`tokens`, `token_logprobs`,
//! `top_logprobs` as token → logprob objects, `text_offset` in characters), plain or streamed.

use std::sync::Arc;

use fp4forge_api::{
    CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse, GenerationRequest,
    SinglePrompt, TopLogprobs,
};
use fp4forge_engine::TextCodec;

use crate::api_error::ApiError;
use crate::endpoint::Endpoint;
use crate::generation::{ChoiceSpec, Collected, Update, Usage};
use crate::request::{
    check_prompt, check_prompt_bytes, choice_specs, max_tokens, with_codec, CommonParams,
};
use crate::state::AppState;
use crate::structured::constrain;
use crate::text::Piece;

/// OpenAI's default `max_tokens` for completions.
const DEFAULT_MAX_TOKENS: usize = 16;

/// Tokenizes text prompts (with BOS where the tokenizer adds one, when `add_special`: vLLM's
/// `add_special_tokens`); token-id prompts are used as they are.
async fn tokenize(
    state: &Arc<AppState>,
    prompts: Vec<SinglePrompt>,
    add_special: bool,
) -> Result<Vec<Vec<u32>>, ApiError> {
    let many = prompts.len() > 1;
    for (i, p) in prompts.iter().enumerate() {
        if let SinglePrompt::Text(t) = p {
            check_prompt_bytes(t.len(), state, "prompt", &prompt_name(many, i))?;
        }
    }
    with_codec(state, move |codec| {
        prompts
            .into_iter()
            .map(|p| match p {
                SinglePrompt::Tokens(ids) => Ok(ids),
                SinglePrompt::Text(t) => codec
                    .encode(&t, add_special)
                    .map_err(|e| ApiError::field("prompt", format!("cannot tokenize: {e}"))),
            })
            .collect()
    })
    .await
}

/// How messages call prompt `i` ("the prompt" when it is the only one).
fn prompt_name(many: bool, i: usize) -> String {
    if many {
        format!("prompt {i}")
    } else {
        "the prompt".into()
    }
}

/// `/v1/completions`: one request's formatting state.
pub(crate) struct Completions {
    /// Top logprobs per position, when asked for.
    logprobs: Option<usize>,
    /// Each streamed choice's text offset so far (characters).
    offsets: Vec<usize>,
}

impl Endpoint for Completions {
    type Request = CompletionRequest;
    type Choice = CompletionChoice;
    type Response = CompletionResponse;
    const ID_PREFIX: &'static str = "cmpl";
    const CHUNK_OBJECT: &'static str = "text_completion";

    async fn plan(
        state: &Arc<AppState>,
        req: CompletionRequest,
        common: &CommonParams,
    ) -> Result<(Self, Vec<ChoiceSpec>), ApiError> {
        let echo = req.echo.unwrap_or(false);
        let logprobs = req.top_logprobs();
        let prompts = req.prompt.as_ref().map(|p| p.to_list()).unwrap_or_default();
        let many = prompts.len() > 1;
        let add_special = req.add_special_tokens.unwrap_or(true);
        let prompts: Vec<Vec<u32>> = tokenize(state, prompts, add_special)
            .await?
            .into_iter()
            .map(|p| common.truncated(p))
            .collect();
        for (i, p) in prompts.iter().enumerate() {
            check_prompt(p, state, "prompt", &prompt_name(many, i))?;
        }
        let asked = req.max_tokens.map(|m| ("max_tokens", m));
        let max_tokens = max_tokens(asked, state, &prompts, Some(DEFAULT_MAX_TOKENS), 0)?;
        let prompt_logprobs = if echo { logprobs } else { None };
        let mut specs = choice_specs(
            prompts,
            common,
            state,
            max_tokens,
            logprobs,
            prompt_logprobs,
            echo,
        )?;
        constrain(state, req.structured().constraint()?, &mut specs).await?;
        let endpoint = Self {
            logprobs,
            offsets: vec![0; specs.len()],
        };
        Ok((endpoint, specs))
    }

    fn chunk(&mut self, state: &AppState, update: Update) -> Option<CompletionChoice> {
        Some(match update {
            Update::Piece { choice, piece } => CompletionChoice {
                index: choice as u32,
                logprobs: self.logprobs.map(|top| {
                    let mut acc = CompletionLogprobs::default();
                    add_piece(
                        &mut acc,
                        &state.codec,
                        &piece,
                        top,
                        &mut self.offsets[choice],
                    );
                    acc
                }),
                text: piece.text,
                finish_reason: None,
                stop_reason: None,
                prompt_logprobs: None,
            },
            Update::Finished {
                choice,
                reason,
                stop_reason,
            } => CompletionChoice {
                index: choice as u32,
                text: String::new(),
                logprobs: None,
                finish_reason: Some(reason.to_string()),
                stop_reason,
                prompt_logprobs: None,
            },
        })
    }

    fn response(
        self,
        state: &AppState,
        id: String,
        created: u64,
        choices: Vec<Collected>,
        usage: Usage,
    ) -> CompletionResponse {
        let choices = choices
            .into_iter()
            .enumerate()
            .map(|(i, c)| {
                let mut offset = 0;
                CompletionChoice {
                    index: i as u32,
                    text: c.pieces.iter().map(|p| p.text.as_str()).collect(),
                    logprobs: self.logprobs.map(|top| {
                        let mut acc = CompletionLogprobs::default();
                        for p in &c.pieces {
                            add_piece(&mut acc, &state.codec, p, top, &mut offset);
                        }
                        acc
                    }),
                    finish_reason: c.finish.map(str::to_string),
                    stop_reason: c.stop_reason,
                    prompt_logprobs: c.prompt_logprobs,
                }
            })
            .collect();
        CompletionResponse {
            id,
            object: "text_completion".into(),
            created,
            model: state.model_name.clone(),
            choices,
            usage: Some(usage.wire()),
        }
    }
}

/// Adds `piece`'s tokens to the legacy logprobs object `acc`; `offset` is the character offset
/// of the piece in the choice's text, advanced past it; `top_n` alternatives per position (the
/// prompt's may hold more, for `prompt_logprobs`).
fn add_piece(
    acc: &mut CompletionLogprobs,
    codec: &TextCodec,
    piece: &Piece,
    top_n: usize,
    offset: &mut usize,
) {
    let tops = acc.top_logprobs.get_or_insert_with(Vec::new);
    let mut chars = 0;
    for t in &piece.tokens {
        acc.tokens.push(t.text.clone());
        acc.text_offset.push(*offset + chars);
        chars += t.text.chars().count();
        match &t.logprob {
            None => {
                acc.token_logprobs.push(None);
                tops.push(None);
            }
            Some(lp) => {
                acc.token_logprobs.push(Some(f64::from(lp.logprob)));
                let mut top = TopLogprobs::default();
                for &(id, v) in lp.top.iter().take(top_n) {
                    let key = codec.decode(&[id], true).unwrap_or_default();
                    top.insert_first(key, f64::from(v));
                }
                let key = codec.decode(&[t.id], true).unwrap_or_default();
                top.insert_first(key, f64::from(lp.logprob));
                tops.push(Some(top));
            }
        }
    }
    *offset += piece.text.chars().count().max(chars);
}
