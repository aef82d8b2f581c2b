//! The scheduling policy: which sequences run (admission up to `max_batch` and, where the
//! backend caps its KV memory, by the room left; the prefix cache on the way in and out;
//! cancelled ones dropped), what each feeds the next forward pass (one token per decoding
//! sequence, prompt chunks within `prefill_budget`), and preemption when a pass would need more
//! KV memory than is left: the most recently admitted sequence gives its cache back and waits,
//! then recomputes it (its prompt and the tokens it generated, in prefill chunks) and goes on.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::Instant;

use fp4forge_engine::{Backend, Constraint, Model, Sampler, Session, TokenLogprob, Want};

use super::job::{Event, Finish, Job, Msg};
use crate::metrics::Metrics;
use crate::prefix_cache::PrefixCache;

/// The logits of one step's prompt rows whose logprobs are wanted, bytes at most: the
/// `[rows, vocab]` f32 logits a pass leaves on the backend until they are scored there (a
/// 2,048-token step of a 100K vocabulary: 0.8 GB, within a GPU's activation reserve).
pub(super) const PROMPT_LOGPROB_LOGITS_BYTES: usize = 1 << 30;

/// The scheduler's limits.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    /// Most sequences running at once.
    pub(super) max_batch: usize,
    /// Most prompt tokens prefilled per step.
    pub(super) prefill_budget: usize,
    /// The prefix cache's size, bytes.
    pub(super) prefix_cache_bytes: usize,
}

/// A running sequence.
pub(super) struct Seq<'m, B: Backend> {
    pub(super) job: Job,
    pub(super) session: Session<'m, B>,
    pub(super) sampler: Sampler,
    /// The structured-output constraint (its mask applies before every pick).
    pub(super) constraint: Option<Box<dyn Constraint>>,
    pub(super) prefilled: usize,
    /// Prompt tokens the prefix cache supplied at admission.
    pub(super) reused: usize,
    pub(super) generated: usize,
    /// The token to feed next (valid once decoding).
    pub(super) next: u32,
    /// Generated tokens fed back so far (the session holds the prompt, then these).
    pub(super) fed: Vec<u32>,
    pub(super) decoding: bool,
    pub(super) prompt_logprobs: Vec<Option<TokenLogprob>>,
    /// A copy of the prompt logprobs for the prefix cache.
    pub(super) cached_prompt_logprobs: Option<Vec<Option<TokenLogprob>>>,
    pub(super) last_token_at: Option<Instant>,
    /// Preempted: its KV cache was given back; it waits for room to recompute it.
    pub(super) parked: bool,
    /// After a preemption of a decoding sequence: the tokens whose KV it recomputes (its prompt,
    /// then `fed`) before it decodes `next`; `prefilled` counts through these.
    pub(super) recompute: Option<Vec<u32>>,
    pub(super) done: bool,
    /// Ended normally: its session may serve a later request's prefix.
    pub(super) reusable: bool,
    /// Its last event (`Done` or `Failed`), sent by `retire` once its KV cache is given back or
    /// in the prefix cache, so that a client reading `/metrics` after its answer sees the memory
    /// accounted for.
    pub(super) last_event: Option<Event>,
}

impl<B: Backend> Seq<'_, B> {
    /// The tokens this sequence prefills: its prompt, or what it recomputes after a preemption.
    pub(super) fn prefill_tokens(&self) -> &[u32] {
        self.recompute.as_deref().unwrap_or(&self.job.req.prompt)
    }
}

/// The share of a capped KV memory that admission keeps free for the running sequences' next
/// blocks (vLLM's watermark), so that admitting one does not force a preemption at once.
pub(super) const KV_WATERMARK: f64 = 0.01;

/// The flags that size the KV memory, for messages.
const KV_FLAGS: &str = "--gpu-memory-utilization or --kv-cache-memory-bytes";

/// Whether a sequence's KV cache fits.
enum Room {
    Yes,
    /// Not with the memory in use now.
    NotNow,
    /// Not even alone: the capacity, bytes.
    Never(usize),
}

pub(super) struct Scheduler<'m, B: Backend> {
    pub(super) model: &'m Model<B>,
    pub(super) limits: Limits,
    pub(super) metrics: Arc<Metrics>,
    pub(super) max_context: usize,
    pub(super) waiting: VecDeque<Job>,
    pub(super) active: Vec<Seq<'m, B>>,
    pub(super) prefix_cache: PrefixCache<'m, B>,
    /// The KV bytes in use when the first waiting request last did not fit: admission tries it
    /// again only once less is in use or the prefix cache holds something to evict (not every
    /// step: each try forks its cached prefix).
    pub(super) blocked_at: Option<usize>,
    pub(super) shutting_down: bool,
}

impl<'m, B: Backend> Scheduler<'m, B> {
    /// A scheduler of `model` with nothing to run yet.
    pub(super) fn new(model: &'m Model<B>, limits: Limits, metrics: Arc<Metrics>) -> Self {
        metrics.kv_capacity.store(
            limits.max_batch.saturating_mul(model.info().max_context),
            Ordering::Relaxed,
        );
        let s = Self {
            max_context: model.info().max_context,
            model,
            limits,
            metrics,
            waiting: VecDeque::new(),
            active: Vec::new(),
            prefix_cache: PrefixCache::new(limits.prefix_cache_bytes),
            blocked_at: None,
            shutting_down: false,
        };
        s.publish_cache_size();
        s
    }

    /// Schedules until shut down and drained, or aborted.
    pub(super) fn run(mut self, rx: Receiver<Msg>) {
        loop {
            if self.active.is_empty() && self.waiting.is_empty() {
                if self.shutting_down {
                    break;
                }
                match rx.recv() {
                    Ok(Msg::Job(j)) => self.waiting.push_back(j),
                    Ok(Msg::Shutdown) | Err(_) => self.shutting_down = true,
                    Ok(Msg::Abort) => break,
                }
            }
            let mut abort = false;
            loop {
                match rx.try_recv() {
                    Ok(Msg::Job(j)) => self.waiting.push_back(j),
                    Ok(Msg::Shutdown) => self.shutting_down = true,
                    Ok(Msg::Abort) => abort = true,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        self.shutting_down = true;
                        break;
                    }
                }
            }
            if abort {
                // and those that came in behind the message
                while let Ok(m) = rx.try_recv() {
                    if let Msg::Job(j) = m {
                        self.waiting.push_back(j);
                    }
                }
                self.abort_all();
                break;
            }
            let started = Instant::now();
            self.drop_cancelled();
            self.admit();
            if !self.active.is_empty() {
                self.step();
                // (before `retire` sends ended sequences' last events: a client that reads
                // `/metrics` after its answer sees its steps counted)
                self.metrics.engine_step.observe(started.elapsed());
                self.retire();
            }
            self.publish_running();
        }
        self.metrics.running.store(0, Ordering::Relaxed);
    }

    /// Ends every waiting and running sequence with [`Finish::Abort`].
    fn abort_all(&mut self) {
        for job in self.waiting.drain(..) {
            self.metrics.waiting.fetch_sub(1, Ordering::SeqCst);
            self.metrics.success(Finish::Abort.name());
            job.send(Event::Done {
                reason: Finish::Abort,
                stop_token: None,
            });
        }
        for s in self.active.drain(..) {
            if !s.done {
                self.metrics.success(Finish::Abort.name());
                s.job.send(Event::Done {
                    reason: Finish::Abort,
                    stop_token: None,
                });
            }
        }
    }

    fn drop_cancelled(&mut self) {
        let m = &self.metrics;
        self.waiting.retain(|j| {
            let keep = !j.cancelled();
            if !keep {
                m.waiting.fetch_sub(1, Ordering::SeqCst);
                m.cancelled.fetch_add(1, Ordering::Relaxed);
            }
            keep
        });
        // A running sequence its handler ended on a stop string finished normally; only one
        // whose client went away was cancelled.
        self.active.retain(|s| {
            let keep = !s.job.cancelled();
            if !keep {
                if s.job.disconnected() {
                    m.cancelled.fetch_add(1, Ordering::Relaxed);
                } else {
                    m.success(Finish::Stop.name());
                }
            }
            keep
        });
    }

    fn admit(&mut self) {
        self.resume_parked();
        if let Some(at) = self.blocked_at {
            // (it did not fit with the prefix cache emptied; a sequence that ended since went
            // there, and is memory to evict)
            let running = self.active.iter().any(|s| !s.parked && !s.done);
            if running && self.prefix_cache.len() == 0 && self.model.kv_memory().used >= at {
                return self.publish_cache_size();
            }
            self.blocked_at = None;
        }
        // the preempted go first
        while self.active.len() < self.limits.max_batch && !self.active.iter().any(|s| s.parked) {
            let Some(job) = self.waiting.pop_front() else {
                break;
            };
            let reuse = self
                .prefix_cache
                .take(&job.req.prompt, job.req.prompt_logprobs);
            let reused = reuse.as_ref().map_or(0, |r| r.len);
            let start = match reuse {
                Some(r) => Ok((r.session, r.len, r.prompt_logprobs)),
                None => self.model.new_session().map(|s| (s, 0, Vec::new())),
            };
            let (session, prefilled, prompt_logprobs) = match start {
                Ok(s) => s,
                Err(e) => {
                    self.metrics.waiting.fetch_sub(1, Ordering::SeqCst);
                    job.send(Event::Failed(e.to_string()));
                    continue;
                }
            };
            let need = session.kv_growth_bytes(job.req.prompt.len() - prefilled);
            match self.room_for(need) {
                Room::Yes => {}
                Room::NotNow => {
                    drop(session);
                    self.blocked_at = Some(self.model.kv_memory().used);
                    self.waiting.push_front(job);
                    break;
                }
                Room::Never(cap) => {
                    self.metrics.waiting.fetch_sub(1, Ordering::SeqCst);
                    job.send(Event::Failed(format!(
                        "the prompt's KV cache needs {need} bytes; the KV memory holds {cap} \
                         ({KV_FLAGS})"
                    )));
                    continue;
                }
            }
            self.metrics.waiting.fetch_sub(1, Ordering::SeqCst);
            if self.prefix_cache.enabled() {
                self.metrics.prefix_queries.fetch_add(1, Ordering::Relaxed);
                self.metrics
                    .prefix_queried_tokens
                    .fetch_add(job.req.prompt.len() as u64, Ordering::Relaxed);
                if reused > 0 {
                    self.metrics.prefix_hits.fetch_add(1, Ordering::Relaxed);
                    self.metrics
                        .prefix_reused_tokens
                        .fetch_add(reused as u64, Ordering::Relaxed);
                }
            }
            self.active.push(Seq {
                sampler: Sampler::new(job.req.sampling),
                constraint: job.req.grammar.as_ref().map(|g| g.start(&job.req.stop_ids)),
                cached_prompt_logprobs: None,
                job,
                session,
                prefilled,
                reused: prefilled,
                generated: 0,
                next: 0,
                fed: Vec::new(),
                decoding: false,
                prompt_logprobs,
                last_token_at: None,
                parked: false,
                recompute: None,
                done: false,
                reusable: false,
                last_event: None,
            });
        }
        self.publish_cache_size();
    }

    /// Whether KV caches may take `need` more bytes now, keeping a watermark of
    /// [`KV_WATERMARK`] of the capacity for the running sequences' next blocks; entries of
    /// the prefix cache are evicted to make room. Always yes without a cap.
    fn room_for(&mut self, need: usize) -> Room {
        loop {
            let mem = self.model.kv_memory();
            let (Some(cap), Some(avail)) = (mem.capacity, mem.available) else {
                return Room::Yes;
            };
            if need > cap.saturating_sub((cap as f64 * KV_WATERMARK) as usize) {
                return Room::Never(cap);
            }
            let running = self.active.iter().any(|s| !s.parked && !s.done);
            let watermark = if running {
                (cap as f64 * KV_WATERMARK) as usize
            } else {
                0
            };
            if need + watermark <= avail {
                return Room::Yes;
            }
            if !self.prefix_cache.evict_oldest() {
                // with nothing running, no memory will come back to wait for
                return if running {
                    Room::NotNow
                } else {
                    Room::Never(cap)
                };
            }
        }
    }

    /// Un-parks preempted sequences, oldest first, while their recomputation fits.
    fn resume_parked(&mut self) {
        for i in 0..self.active.len() {
            let s = &self.active[i];
            if !s.parked || s.done {
                continue;
            }
            let tokens = s
                .recompute
                .as_ref()
                .map_or(s.job.req.prompt.len(), Vec::len);
            let need = s.session.kv_growth_bytes(tokens);
            match self.room_for(need) {
                Room::Yes => self.active[i].parked = false,
                Room::NotNow => break,
                Room::Never(cap) => self.fail_one(
                    i,
                    &format!(
                        "recomputing the sequence's KV cache needs {need} bytes; the KV memory \
                         holds {cap} ({KV_FLAGS})"
                    ),
                ),
            }
        }
    }

    /// The plan of the next pass, after preempting sequences (most recently admitted first)
    /// until what it adds to the KV caches fits the room left, evicting prefix-cache entries
    /// before any.
    pub(super) fn plan_within_memory(&mut self) -> Vec<(usize, usize, Want)> {
        loop {
            let plan = self.plan();
            let Some(avail) = self.model.kv_memory().available else {
                return plan;
            };
            let need: usize = plan
                .iter()
                .map(|&(i, n, _)| self.active[i].session.kv_growth_bytes(n))
                .sum();
            if need <= avail {
                return plan;
            }
            if self.prefix_cache.evict_oldest() {
                continue;
            }
            let holding = |s: &Seq<'m, B>| !s.parked && !s.done;
            let Some(victim) = self.active.iter().rposition(holding) else {
                return plan;
            };
            if self.active.iter().filter(|s| holding(s)).count() > 1 {
                self.preempt(victim);
            } else {
                // alone and still too big: nothing else can give memory back
                self.fail_one(
                    victim,
                    &format!("the sequence's KV cache outgrew the KV memory ({KV_FLAGS})"),
                );
            }
        }
    }

    /// Gives sequence `i`'s KV cache back and parks it; it recomputes the cache once resumed.
    fn preempt(&mut self, i: usize) {
        let s = &mut self.active[i];
        if let Err(e) = s.session.reset() {
            return self.fail_one(i, &format!("preempting the sequence: {e}"));
        }
        if s.decoding || s.recompute.is_some() {
            let mut tokens = Vec::with_capacity(s.job.req.prompt.len() + s.fed.len());
            tokens.extend_from_slice(&s.job.req.prompt);
            tokens.extend_from_slice(&s.fed);
            s.recompute = Some(tokens);
        } else {
            // still in its prompt: prefill it again (its prompt logprobs with it)
            s.prompt_logprobs.clear();
            s.reused = 0;
        }
        s.decoding = false;
        s.prefilled = 0;
        s.parked = true;
        self.metrics.preemptions.fetch_add(1, Ordering::Relaxed);
    }

    /// Removes ended sequences; those that ended normally leave their session to the prefix
    /// cache. Their last events go out after the KV memory they held is published.
    fn retire(&mut self) {
        let ended: Vec<Seq<'m, B>> = self.active.extract_if(.., |s| s.done).collect();
        let mut last = Vec::new();
        for mut s in ended {
            let event = s.last_event.take();
            if s.reusable && self.prefix_cache.enabled() {
                let mut tokens = Vec::with_capacity(s.job.req.prompt.len() + s.fed.len());
                tokens.extend_from_slice(&s.job.req.prompt);
                tokens.extend_from_slice(&s.fed);
                let logprobs = s.job.req.prompt_logprobs.zip(s.cached_prompt_logprobs);
                self.prefix_cache
                    .put(s.session, tokens, s.job.req.prompt.len(), logprobs);
            }
            // (the session, unless cached, is dropped here: its KV blocks go back)
            if let Some(e) = event {
                last.push((s.job, e));
            }
        }
        self.publish_cache_size();
        for (job, e) in last {
            job.send(e);
        }
    }

    pub(super) fn publish_cache_size(&self) {
        let mem = self.model.kv_memory();
        self.metrics
            .kv_used_bytes
            .store(mem.used, Ordering::Relaxed);
        self.metrics
            .kv_capacity_bytes
            .store(mem.capacity.unwrap_or(0), Ordering::Relaxed);
        self.metrics
            .prefix_cache_bytes
            .store(self.prefix_cache.bytes(), Ordering::Relaxed);
        self.metrics
            .prefix_cache_entries
            .store(self.prefix_cache.len(), Ordering::Relaxed);
    }

    /// What each sequence feeds this step: `(index in active, tokens, logits wanted)`.
    pub(super) fn plan(&self) -> Vec<(usize, usize, Want)> {
        let mut plan = Vec::new();
        let mut budget = self.limits.prefill_budget;
        let vocab = self.model.info().vocab_size.max(1);
        let mut logprob_rows = (PROMPT_LOGPROB_LOGITS_BYTES / (4 * vocab)).max(1);
        for (i, s) in self.active.iter().enumerate() {
            if s.parked || s.done {
                continue;
            }
            if s.decoding {
                plan.push((i, 1, Want::Last));
                continue;
            }
            if budget == 0 {
                continue;
            }
            let remaining = s.prefill_tokens().len() - s.prefilled;
            let mut n = remaining.min(budget);
            let want = if s.recompute.is_some() {
                // the next token is known: the cache is all it rebuilds
                Want::None
            } else if s.job.req.prompt_logprobs.is_some() {
                if logprob_rows == 0 {
                    continue;
                }
                n = n.min(logprob_rows);
                logprob_rows -= n;
                Want::All
            } else if n == remaining {
                Want::Last
            } else {
                Want::None
            };
            budget -= n;
            plan.push((i, n, want));
        }
        plan
    }
}
