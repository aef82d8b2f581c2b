//! The handlers' side of a request: its sequences submitted to the engine, their events turned
//! into text updates per choice (echoed prompt, generated pieces, finish reasons), and the usage.
//! Completions and chat share it and differ only in how they format the updates.

use std::sync::Arc;

use fp4forge_engine::TextCodec;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::api_error::ApiError;
use crate::logprobs::prompt_logprobs_wire;
use crate::scheduler::{CancelFlag, EngineHandle, Event, SeqRequest};
use crate::text::{prompt_piece, ChoiceText, Piece, TextToken};

/// One choice to generate: which prompt it answers and how.
pub(crate) struct ChoiceSpec {
    /// Index of its prompt (prompts are counted once in the usage, whatever `n`).
    pub prompt_index: usize,
    /// The sequence.
    pub req: SeqRequest,
    /// Stop strings.
    pub stops: Vec<String>,
    /// Whether the prompt is echoed before the generated text.
    pub echo: bool,
    /// Whether the text keeps the tokenizer's special tokens (`skip_special_tokens: false`,
    /// or a chat parser that reads them).
    pub keep_special: bool,
    /// Whether the matched stop string stays in the text (`include_stop_str_in_output`).
    pub include_stop_str: bool,
    /// Stop tokens reported as `stop_reason` when they end the choice (the request's
    /// `stop_token_ids` that are not EOS).
    pub stop_reason_ids: Vec<u32>,
    /// Alternatives per position of vLLM's `prompt_logprobs`, when reported.
    pub report_prompt_logprobs: Option<usize>,
}

/// Something to tell the client about one choice.
#[derive(Debug)]
pub(crate) enum Update {
    /// Text (and its tokens) of choice `choice`.
    Piece {
        /// The choice.
        choice: usize,
        /// The text.
        piece: Piece,
    },
    /// Choice `choice` ended.
    Finished {
        /// The choice.
        choice: usize,
        /// `stop`, `length` or `abort`.
        reason: &'static str,
        /// vLLM's `stop_reason`: the stop string or stop token id that matched (`None`: EOS
        /// or length).
        stop_reason: Option<serde_json::Value>,
    },
}

/// Token counts of a request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    /// Prompt tokens, each distinct prompt once.
    pub prompt_tokens: usize,
    /// Generated tokens over all choices.
    pub completion_tokens: usize,
    /// Prompt tokens the prefix cache supplied, each distinct prompt once (its first
    /// choice's); `None` when the cache is off.
    pub cached_tokens: Option<usize>,
}

impl Usage {
    /// The OpenAI `usage` object (`prompt_tokens_details` as vLLM writes it).
    pub fn wire(&self) -> fp4forge_api::Usage {
        fp4forge_api::Usage::new(self.prompt_tokens as u64, self.completion_tokens as u64)
            .with_cached_tokens(self.cached_tokens.map(|c| c as u64))
    }
}

struct Choice {
    prompt: Arc<Vec<u32>>,
    prompt_index: usize,
    echo: bool,
    text: ChoiceText,
    cancel: CancelFlag,
    finished: bool,
    completion_tokens: usize,
    /// Prompt tokens the prefix cache supplied (`None`: cache off, or not prefilled yet).
    cached: Option<usize>,
    stop_reason_ids: Vec<u32>,
    report_prompt_logprobs: Option<usize>,
    prompt_logprobs: Option<fp4forge_api::PromptLogprobs>,
}

/// A request's sequences in flight. Dropping it cancels every one still running.
pub(crate) struct Generation {
    codec: Arc<TextCodec>,
    choices: Vec<Choice>,
    rx: UnboundedReceiver<(usize, Event)>,
    remaining: usize,
}

impl Drop for Generation {
    fn drop(&mut self) {
        for c in &self.choices {
            c.cancel.give_up();
        }
    }
}

impl Generation {
    /// Submits every choice. On refusal (queue full), the ones already submitted are cancelled.
    pub fn submit(
        engine: &EngineHandle,
        codec: Arc<TextCodec>,
        specs: Vec<ChoiceSpec>,
    ) -> Result<Self, ApiError> {
        let (tx, rx) = unbounded_channel();
        let mut choices = Vec::with_capacity(specs.len());
        for (i, spec) in specs.into_iter().enumerate() {
            let prompt = spec.req.prompt.clone();
            let min_tokens = spec.req.min_tokens;
            // On error, `choices` is dropped and the receiver with it: the scheduler drops the
            // sequences already queued.
            let cancel = engine.submit(i, spec.req, tx.clone())?;
            choices.push(Choice {
                text: ChoiceText::new(
                    codec.clone(),
                    &prompt,
                    spec.stops,
                    min_tokens,
                    spec.keep_special,
                    spec.include_stop_str,
                ),
                stop_reason_ids: spec.stop_reason_ids,
                report_prompt_logprobs: spec.report_prompt_logprobs,
                prompt_logprobs: None,
                prompt,
                prompt_index: spec.prompt_index,
                echo: spec.echo,
                cancel,
                finished: false,
                completion_tokens: 0,
                cached: None,
            });
        }
        Ok(Self {
            remaining: choices.len(),
            codec,
            choices,
            rx,
        })
    }

    /// Number of choices.
    pub fn choice_count(&self) -> usize {
        self.choices.len()
    }

    /// The usage so far (complete once every choice finished).
    pub fn usage(&self) -> Usage {
        // choices are in prompt order: each prompt's first choice stands for it
        let mut prompts: Vec<&Choice> = self.choices.iter().collect();
        prompts.dedup_by_key(|c| c.prompt_index);
        Usage {
            prompt_tokens: prompts.iter().map(|c| c.prompt.len()).sum(),
            completion_tokens: self.choices.iter().map(|c| c.completion_tokens).sum(),
            cached_tokens: prompts.iter().filter_map(|c| c.cached).reduce(|a, b| a + b),
        }
    }

    /// The next updates (waits for the engine); `None` once every choice finished.
    pub async fn next(&mut self) -> Option<Result<Vec<Update>, ApiError>> {
        if self.remaining == 0 {
            return None;
        }
        let Some(first) = self.rx.recv().await else {
            return Some(Err(ApiError::internal(
                "the engine stopped before the request finished",
            )));
        };
        let mut updates = Vec::new();
        let mut event = Some(first);
        while let Some((i, e)) = event {
            if let Err(e) = self.take(i, e, &mut updates) {
                return Some(Err(e));
            }
            if self.remaining == 0 {
                break;
            }
            // Whatever else already arrived goes in the same batch of updates.
            event = self.rx.try_recv().ok();
        }
        Some(Ok(updates))
    }

    fn take(&mut self, i: usize, event: Event, out: &mut Vec<Update>) -> Result<(), ApiError> {
        let codec = self.codec.clone();
        let c = &mut self.choices[i];
        if c.finished {
            return Ok(());
        }
        let text_err = |e: fp4forge_engine::EngineError| ApiError::internal(e.to_string());
        match event {
            Event::Prompt { logprobs, cached } => {
                c.cached = cached;
                if let Some(top) = c.report_prompt_logprobs {
                    c.prompt_logprobs =
                        Some(prompt_logprobs_wire(&codec, &c.prompt, &logprobs, top));
                }
                if c.echo {
                    let piece = prompt_piece(&codec, &c.prompt, logprobs).map_err(text_err)?;
                    out.push(Update::Piece { choice: i, piece });
                }
            }
            Event::Token(id, lp) => {
                let piece = c.text.push(id, lp).map_err(text_err)?;
                if !piece.is_empty() {
                    out.push(Update::Piece { choice: i, piece });
                }
                if c.text.stopped() {
                    c.completion_tokens = c.text.tokens();
                    c.finished = true;
                    c.cancel.finish();
                    self.remaining -= 1;
                    out.push(Update::Finished {
                        choice: i,
                        reason: "stop",
                        stop_reason: c.text.matched_stop().map(serde_json::Value::from),
                    });
                }
            }
            Event::Done { reason, stop_token } => {
                let mut piece = c.text.finish().map_err(text_err)?;
                // The stop token has no text but is a generated token: it is counted and its
                // logprobs listed (as vLLM does; lm-evaluation-harness relies on one entry per
                // generated token).
                if let Some((id, logprob)) = &stop_token {
                    piece.tokens.push(TextToken {
                        id: *id,
                        text: String::new(),
                        logprob: logprob.clone(),
                    });
                }
                if !piece.is_empty() {
                    out.push(Update::Piece { choice: i, piece });
                }
                c.completion_tokens = c.text.tokens() + usize::from(stop_token.is_some());
                let stop_reason = stop_token
                    .as_ref()
                    .map(|t| t.0)
                    .filter(|t| c.stop_reason_ids.contains(t))
                    .map(serde_json::Value::from);
                c.finished = true;
                self.remaining -= 1;
                out.push(Update::Finished {
                    choice: i,
                    reason: reason.name(),
                    stop_reason,
                });
            }
            Event::Failed(message) => {
                return Err(ApiError::internal(format!("generation failed: {message}")));
            }
        }
        Ok(())
    }

    /// Runs to the end, collecting each choice's pieces and finish reason.
    pub async fn collect(mut self) -> Result<(Vec<Collected>, Usage), ApiError> {
        let mut out: Vec<Collected> = (0..self.choices.len())
            .map(|_| Collected::default())
            .collect();
        while let Some(updates) = self.next().await {
            for u in updates? {
                match u {
                    Update::Piece { choice, piece } => out[choice].pieces.push(piece),
                    Update::Finished {
                        choice,
                        reason,
                        stop_reason,
                    } => {
                        out[choice].finish = Some(reason);
                        out[choice].stop_reason = stop_reason;
                    }
                }
            }
        }
        for (o, c) in out.iter_mut().zip(&mut self.choices) {
            o.prompt_logprobs = c.prompt_logprobs.take();
        }
        Ok((out, self.usage()))
    }
}

/// One choice, complete.
#[derive(Debug, Default)]
pub(crate) struct Collected {
    /// Its pieces in order (the echoed prompt first, when echoing).
    pub pieces: Vec<Piece>,
    /// Its finish reason.
    pub finish: Option<&'static str>,
    /// vLLM's `stop_reason` (the matched stop string or stop token id).
    pub stop_reason: Option<serde_json::Value>,
    /// vLLM's `prompt_logprobs`, when asked for.
    pub prompt_logprobs: Option<fp4forge_api::PromptLogprobs>,
}
