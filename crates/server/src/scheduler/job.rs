//! A sequence as the engine thread gets it ([`Job`]: a [`SeqRequest`] with its event channel
//! and cancel switch), what it tells the handler back ([`Event`]), and the engine thread's
//! inbox ([`Msg`]).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Instant;

use fp4forge_engine::{LogitsAdjust, SamplingParams, TokenLogprob};
use tokio::sync::mpsc::UnboundedSender;

use crate::structured::Grammar;

/// What to generate for one sequence (validated by the handler).
#[derive(Debug, Clone)]
pub(crate) struct SeqRequest {
    /// Prompt token ids (non-empty, in the vocabulary, within the context).
    pub prompt: Arc<Vec<u32>>,
    /// Most tokens to generate (0: score the prompt only).
    pub max_tokens: usize,
    /// Stop tokens are not sampled before this many tokens.
    pub min_tokens: usize,
    /// How to pick tokens.
    pub sampling: SamplingParams,
    /// Tokens that end the sequence (EOS unless ignored, plus `stop_token_ids`).
    pub stop_ids: Vec<u32>,
    /// Top alternatives per generated token, when logprobs are asked for.
    pub logprobs: Option<usize>,
    /// Top alternatives per prompt token, when prompt logprobs are asked for.
    pub prompt_logprobs: Option<usize>,
    /// Logit adjustments before sampling (`None`: none; the token may be picked on the
    /// device). Logprobs stay those of the raw logits, as vLLM reports them by default.
    pub adjust: Option<Arc<LogitsAdjust>>,
    /// The structured-output constraint, when one was asked for (each sequence gets its own
    /// matcher; its tokens are picked on the host, masked).
    pub grammar: Option<Arc<Grammar>>,
}

/// Why a sequence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finish {
    /// `max_tokens` or the context.
    Length,
    /// A stop token.
    Stop,
    /// The server gave up on it: the drain timeout of a shutdown ran out.
    Abort,
}

impl Finish {
    /// Its name in OpenAI's `finish_reason` and vLLM's metrics.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Length => "length",
            Self::Stop => "stop",
            Self::Abort => "abort",
        }
    }
}

/// What the engine tells a handler about one sequence.
#[derive(Debug, Clone)]
pub(crate) enum Event {
    /// The prompt is prefilled.
    Prompt {
        /// Per-position logprobs (first `None`) when asked, else empty.
        logprobs: Vec<Option<TokenLogprob>>,
        /// Prompt tokens the prefix cache supplied (`None`: the cache is off).
        cached: Option<usize>,
    },
    /// A generated token.
    Token(u32, Option<TokenLogprob>),
    /// The sequence ended; `stop_token` is the stop token sampled (not sent as a `Token`: it
    /// is no part of the text), with its logprobs when asked for.
    Done {
        /// Why.
        reason: Finish,
        /// The stop token, if one ended it.
        stop_token: Option<(u32, Option<TokenLogprob>)>,
    },
    /// The engine failed on this sequence.
    Failed(String),
}

/// One submitted sequence.
pub(crate) struct Job {
    /// Its choice index in the request.
    pub(super) choice: usize,
    /// What to generate.
    pub(super) req: SeqRequest,
    /// Where its events go.
    pub(super) tx: UnboundedSender<(usize, Event)>,
    /// Set when the handler gives it up (and why).
    pub(super) cancel: CancelFlag,
    /// When it was submitted.
    pub(super) arrived: Instant,
}

impl Job {
    /// Whether its handler no longer wants it: it ended it (a stop string matched) or its
    /// client went away.
    pub(super) fn cancelled(&self) -> bool {
        self.tx.is_closed() || self.cancel.is_set()
    }

    /// Whether it was given up because its client went away (not ended by its handler).
    pub(super) fn disconnected(&self) -> bool {
        !self.cancel.was_finished() && self.cancelled()
    }

    /// Sends `e` to its handler; `false` when the handler is gone.
    pub(super) fn send(&self, e: Event) -> bool {
        self.tx.send((self.choice, e)).is_ok()
    }
}

/// A submitted sequence's cancel switch (the scheduler drops it at its next step), which
/// remembers why: the handler ended it (a stop string matched, a normal finish) or gave it up
/// (its client went away), so that only the latter counts as cancelled.
#[derive(Debug, Clone, Default)]
pub(crate) struct CancelFlag(Arc<AtomicU8>);

/// [`CancelFlag`] states.
const LIVE: u8 = 0;
const FINISHED: u8 = 1;
const GIVEN_UP: u8 = 2;

impl CancelFlag {
    /// The handler ended the sequence (a stop string matched).
    pub fn finish(&self) {
        let _ = self
            .0
            .compare_exchange(LIVE, FINISHED, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// The handler gave the sequence up (its client went away); a finished one stays finished.
    pub fn give_up(&self) {
        let _ = self
            .0
            .compare_exchange(LIVE, GIVEN_UP, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Whether it was finished or given up.
    fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed) != LIVE
    }

    /// Whether the handler ended it.
    pub(super) fn was_finished(&self) -> bool {
        self.0.load(Ordering::Relaxed) == FINISHED
    }
}

/// A message to the engine thread.
pub(super) enum Msg {
    /// A sequence to run.
    Job(Job),
    /// Finish what is queued and running, then stop.
    Shutdown,
    /// End every sequence now (finish reason `abort`), then stop.
    Abort,
}
