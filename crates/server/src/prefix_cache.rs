//! Prefix caching: finished sequences' KV caches kept for the requests that follow.
//!
//! Requests often share a long beginning: a few-shot evaluation repeats its examples in every
//! prompt, the choices of a multiple-choice item share their context, a chat's next turn repeats
//! the conversation so far. When a sequence finishes, the engine thread puts its session (its
//! KV cache) here with the tokens it holds. A new request copies the part of the entry it shares
//! the longest prefix with ([`Session::fork`]) and prefills only the rest; the entry stays, so
//! every later request of a few-shot task finds its examples cached, however many use them at
//! once. A finished sequence replaces the entries whose tokens begin its own (and which kept no
//! more prompt logprobs), so repeating a prompt does not pile up copies.
//!
//! Exactness: the reused keys and values are the ones the prefix's own prefill wrote, so the
//! continuation's logits are what a full prefill computes (up to the f32 summation order that
//! chunked prefill already varies). Prompt logprobs of the reused positions come from the entry
//! (kept when its request asked for them, with at least as many alternatives), so an echoed
//! request gets every position's logprobs as if it ran alone. At least the prompt's last token
//! is always recomputed: its logits start the generation.
//!
//! Memory is bounded: entries are evicted least recently used first to stay within the
//! capacity in bytes of KV storage; capacity 0 disables the cache. On a GPU a fork shares the
//! entry's full KV blocks (the paged cache copies only the partial last block and the sliding
//! layers' rings), and entries are also evicted when running sequences need the memory.

use fp4forge_engine::{Backend, Session, TokenLogprob};

/// A finished sequence's session and what its cache holds.
struct Entry<'m, B: Backend> {
    /// The tokens whose keys and values the session holds (its whole sequence).
    tokens: Vec<u32>,
    /// How many of them were the prompt.
    prompt_len: usize,
    /// Prompt logprobs (position 0 first, `None`) and their number of alternatives, when the
    /// request asked for them.
    prompt_logprobs: Option<(usize, Vec<Option<TokenLogprob>>)>,
    session: Session<'m, B>,
    bytes: usize,
    last_used: u64,
}

/// A cached prefix handed to a new request.
pub(crate) struct Reuse<'m, B: Backend> {
    /// The session, cut back to `len` tokens.
    pub session: Session<'m, B>,
    /// Prompt tokens already in the cache (prefill starts here; always below the prompt's length).
    pub len: usize,
    /// Logprobs of prompt positions `0..=len` (position 0 `None`) when asked for, else empty.
    pub prompt_logprobs: Vec<Option<TokenLogprob>>,
}

/// Finished sessions by the tokens they hold, within a byte budget.
pub(crate) struct PrefixCache<'m, B: Backend> {
    entries: Vec<Entry<'m, B>>,
    capacity: usize,
    bytes: usize,
    clock: u64,
}

impl<'m, B: Backend> PrefixCache<'m, B> {
    /// An empty cache holding at most `capacity` bytes of KV storage (0: never holds any).
    pub fn new(capacity: usize) -> Self {
        Self {
            entries: Vec::new(),
            capacity,
            bytes: 0,
            clock: 0,
        }
    }

    /// Whether entries are kept at all.
    pub fn enabled(&self) -> bool {
        self.capacity > 0
    }

    /// Bytes of KV storage held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// A copy of the entry sharing the longest usable prefix with `prompt` (non-empty), cut
    /// back to that prefix; the entry stays. `prompt_top`: the request wants every prompt
    /// position's logprobs with that many alternatives (only entries that kept at least as many
    /// serve it). `None` when no entry shares a token.
    pub fn take(&mut self, prompt: &[u32], prompt_top: Option<usize>) -> Option<Reuse<'m, B>> {
        let mut candidates: Vec<(usize, usize)> = self
            .entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| Some((usable_prefix(e, prompt, prompt_top)?, i)))
            .filter(|&(len, _)| len > 0)
            .collect();
        // longest first; among equals the most recently used
        candidates.sort_by_key(|&(len, i)| std::cmp::Reverse((len, self.entries[i].last_used)));
        for (len, i) in candidates {
            let session = match self.entries[i].session.fork(len) {
                Ok(Some(s)) => s,
                // a wrapped sliding-window ring: only the whole sequence is reusable
                Ok(None) => continue,
                Err(_) => {
                    // the session is broken (or out of memory for the copy): it serves nobody
                    let e = self.entries.swap_remove(i);
                    self.bytes -= e.bytes;
                    return self.take(prompt, prompt_top);
                }
            };
            self.clock += 1;
            let e = &mut self.entries[i];
            e.last_used = self.clock;
            let prompt_logprobs = match (prompt_top, &e.prompt_logprobs) {
                (Some(top), Some((_, lps))) => lps
                    .iter()
                    .take(len + 1)
                    .map(|lp| {
                        lp.clone().map(|mut lp| {
                            lp.top.truncate(top);
                            lp
                        })
                    })
                    .collect(),
                _ => Vec::new(),
            };
            return Some(Reuse {
                session,
                len,
                prompt_logprobs,
            });
        }
        None
    }

    /// Keeps a finished sequence's `session`, which holds `tokens` (the first `prompt_len` of
    /// them its prompt, whose logprobs with `top` alternatives are given when they were
    /// computed). Drops the entries it extends (their tokens a prefix of `tokens`, no more
    /// prompt logprobs kept), then the least recently used ones to make room; drops the session
    /// when it alone is over the capacity or its length disagrees with `tokens`.
    pub fn put(
        &mut self,
        session: Session<'m, B>,
        tokens: Vec<u32>,
        prompt_len: usize,
        prompt_logprobs: Option<(usize, Vec<Option<TokenLogprob>>)>,
    ) {
        let bytes = session.kv_bytes();
        if !self.enabled()
            || bytes > self.capacity
            || session.position() != tokens.len()
            || prompt_len > tokens.len()
        {
            return;
        }
        let prompt_logprobs = prompt_logprobs.filter(|(_, l)| l.len() == prompt_len);
        // entries this one extends, with no more prompt logprobs, serve nothing it does not
        let kept = prompt_logprobs.as_ref().map(|(top, _)| *top);
        let mut i = 0;
        while i < self.entries.len() {
            let e = &self.entries[i];
            let covered = match (&e.prompt_logprobs, kept) {
                (None, _) => true,
                (Some((top, _)), Some(new_top)) => *top <= new_top && e.prompt_len <= prompt_len,
                (Some(_), None) => false,
            };
            if covered && tokens.starts_with(&e.tokens) && session.can_fork(e.tokens.len()) {
                let e = self.entries.swap_remove(i);
                self.bytes -= e.bytes;
            } else {
                i += 1;
            }
        }
        while self.bytes + bytes > self.capacity && self.evict_oldest() {}
        self.clock += 1;
        self.bytes += bytes;
        self.entries.push(Entry {
            tokens,
            prompt_len,
            prompt_logprobs,
            session,
            bytes,
            last_used: self.clock,
        });
    }
}

impl<B: Backend> PrefixCache<'_, B> {
    /// Drops the least recently used entry (its KV memory goes back to the device's pool,
    /// less blocks that sessions forked from it still share); false when there is none.
    pub fn evict_oldest(&mut self) -> bool {
        let Some(oldest) = (0..self.entries.len()).min_by_key(|&i| self.entries[i].last_used)
        else {
            return false;
        };
        let e = self.entries.swap_remove(oldest);
        self.bytes -= e.bytes;
        true
    }
}

/// How many tokens of `e` a request for `prompt` can reuse: the shared prefix, less what must
/// be recomputed. Without prompt logprobs, at most `prompt.len() - 1` (the last token's logits
/// start the generation). With them, position `p`'s logprob needs the logits at `p - 1`, so
/// the reused positions `1..=len` must have their logprobs in the entry: `len` below the shared
/// prefix and the entry's prompt, and the entry must have kept at least `top` alternatives.
fn usable_prefix<B: Backend>(
    e: &Entry<'_, B>,
    prompt: &[u32],
    prompt_top: Option<usize>,
) -> Option<usize> {
    let shared = e
        .tokens
        .iter()
        .zip(prompt)
        .take_while(|(a, b)| a == b)
        .count();
    match prompt_top {
        None => Some(shared.min(prompt.len().saturating_sub(1))),
        Some(top) => {
            let (kept, _) = e.prompt_logprobs.as_ref()?;
            if *kept < top {
                return None;
            }
            Some(shared.min(prompt.len()).min(e.prompt_len).saturating_sub(1))
        }
    }
}
