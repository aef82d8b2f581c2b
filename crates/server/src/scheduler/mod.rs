//! The engine thread: continuous batching.
//!
//! One thread owns the [`Model`](fp4forge_engine::Model) and every running sequence (each its
//! own [`Session`](fp4forge_engine::Session), i.e. its own KV cache). HTTP handlers submit
//! sequences through a channel and read their tokens from another. Each engine step:
//!
//! 1. takes in newly submitted sequences, drops those whose client went away (its event
//!    receiver was dropped, or the handler cancelled it), and admits waiting ones while fewer
//!    than `max_batch` run;
//! 2. plans one forward pass: one token for every decoding sequence, plus prompt chunks of
//!    prefilling sequences up to `prefill_budget` tokens in total (a long prompt is prefilled
//!    over several steps, so it never stalls the others for long);
//! 3. runs it as ONE batched pass
//!    ([`Model::forward_batch_scored`](fp4forge_engine::Model::forward_batch_scored));
//! 4. samples each sequence's next token (in the pass itself, on the device where the backend
//!    samples, for a decoding sequence or a prompt's last chunk that needs no logits on the
//!    host: no logit adjustments, no constraint, no stop tokens to mask; else from its
//!    downloaded logits) and sends it
//!    (with logprobs, when asked: scored where the logits are, like prompt logprobs, so only
//!    the scores leave the device), ending sequences at EOS, `max_tokens` or the context limit.
//!
//! With nothing to do the thread sleeps on the channel. On shutdown it finishes the sequences
//! it has (draining) and returns.
//!
//! A finished sequence's session goes to the [`PrefixCache`](crate::prefix_cache::PrefixCache);
//! an admitted one starts from the cached session sharing the longest prefix with its prompt,
//! when there is one.
//!
//! Files: [`job`] (a sequence and its events), [`engine_thread`] (the thread, its handle, model
//! loading), [`policy`] (admission and the plan of each pass), [`step`] (running a pass and
//! sampling).

mod engine_thread;
mod job;
mod policy;
mod step;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

pub(crate) use engine_thread::{start, EngineHandle, SubmitError};
pub(crate) use job::{CancelFlag, Event, SeqRequest};

/// A seed for a request that gave none: different every call.
pub(crate) fn fresh_seed() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    t ^ COUNTER
        .fetch_add(1, Ordering::Relaxed)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
}
