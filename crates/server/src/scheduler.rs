//! The engine thread: continuous batching.
//!
//! One thread owns the [`Model`] and every running sequence (each its own [`Session`], i.e. its
//! own KV cache). HTTP handlers submit sequences through a channel and read their tokens from
//! another. Each engine step:
//!
//! 1. takes in newly submitted sequences, drops those whose client went away (its event
//!    receiver was dropped, or the handler cancelled it), and admits waiting ones while fewer
//!    than `max_batch` run;
//! 2. plans one forward pass: one token for every decoding sequence, plus prompt chunks of
//!    prefilling sequences up to `prefill_budget` tokens in total (a long prompt is prefilled
//!    over several steps, so it never stalls the others for long);
//! 3. runs it as ONE batched pass ([`Model::forward_batch`]);
//! 4. samples each sequence's next token from its logits and sends it (with logprobs, when
//!    asked), ending sequences at EOS, `max_tokens` or the context limit.
//!
//! With nothing to do the thread sleeps on the channel. On shutdown it finishes the sequences
//! it has (draining) and returns.
//!
//! A finished sequence's session goes to the [`PrefixCache`]; an admitted one starts from the
//! cached session sharing the longest prefix with its prompt, when there is one.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use fp4forge_engine::{
    Backend, Model, ModelInfo, ModelOptions, Sampler, SamplingParams, Session, WantLogits,
};
use tokio::sync::mpsc::UnboundedSender;

use crate::config::{Device, ServerConfig};
use crate::error::ServerError;
use crate::logprobs::{rows_logprobs, token_logprob, TokenLogprob};
use crate::metrics::Metrics;
use crate::prefix_cache::PrefixCache;

/// Prompt rows per step for a sequence that wants every prompt position's logprobs (bounds the
/// `[rows, vocab]` logits held at once).
const PROMPT_LOGPROB_ROWS: usize = 128;

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
}

/// Why a sequence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finish {
    /// `max_tokens` or the context.
    Length,
    /// A stop token.
    Stop,
}

/// What the engine tells a handler about one sequence.
#[derive(Debug, Clone)]
pub(crate) enum Event {
    /// The prompt is prefilled; per-position logprobs (first `None`) when asked, else empty.
    Prompt(Vec<Option<TokenLogprob>>),
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
    choice: usize,
    req: SeqRequest,
    tx: UnboundedSender<(usize, Event)>,
    cancel: Arc<AtomicBool>,
    arrived: Instant,
}

impl Job {
    fn cancelled(&self) -> bool {
        self.tx.is_closed() || self.cancel.load(Ordering::Relaxed)
    }

    fn send(&self, e: Event) -> bool {
        self.tx.send((self.choice, e)).is_ok()
    }
}

enum Msg {
    Job(Job),
    Shutdown,
}

/// The handlers' side of the engine thread. Cheap to share (`Sync`).
pub(crate) struct EngineHandle {
    tx: Sender<Msg>,
    metrics: Arc<Metrics>,
    max_queue: usize,
    alive: Arc<AtomicBool>,
}

/// Clears its flag when the engine thread ends, however it ends (a panic included).
struct AliveGuard(Arc<AtomicBool>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// Why the engine did not take a sequence.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SubmitError {
    /// `waiting` sequences are already queued, the limit.
    #[error(
        "the server is busy: {waiting} sequences are already waiting (limit {limit}); retry later"
    )]
    QueueFull {
        /// Sequences waiting.
        waiting: usize,
        /// The queue's limit.
        limit: usize,
    },
    /// The engine thread has stopped.
    #[error("the engine has stopped")]
    Stopped,
}

/// A submitted sequence's cancel switch (the scheduler drops it at its next step).
pub(crate) type CancelFlag = Arc<AtomicBool>;

impl EngineHandle {
    /// Queues `req` as choice `choice`; its events go to `tx`. Refused when the queue is full
    /// or the engine has stopped.
    pub fn submit(
        &self,
        choice: usize,
        req: SeqRequest,
        tx: UnboundedSender<(usize, Event)>,
    ) -> Result<CancelFlag, SubmitError> {
        let waiting = self.metrics.waiting.fetch_add(1, Ordering::SeqCst);
        if waiting >= self.max_queue {
            self.metrics.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(SubmitError::QueueFull {
                waiting,
                limit: self.max_queue,
            });
        }
        let cancel = CancelFlag::default();
        let job = Job {
            choice,
            req,
            tx,
            cancel: cancel.clone(),
            arrived: Instant::now(),
        };
        if self.tx.send(Msg::Job(job)).is_err() {
            self.metrics.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(SubmitError::Stopped);
        }
        Ok(cancel)
    }

    /// Whether the engine thread is running.
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// Asks the engine thread to finish what it has and stop.
    pub fn shutdown(&self) {
        let _ = self.tx.send(Msg::Shutdown);
    }
}

/// Starts the engine thread: loads the model there (on `config.device`), then schedules until
/// shut down. Returns once the model is loaded (or failed to load).
pub(crate) fn start(
    config: &ServerConfig,
    metrics: Arc<Metrics>,
) -> Result<(EngineHandle, ModelInfo, JoinHandle<()>), ServerError> {
    let (tx, rx) = mpsc::channel();
    let (ready_tx, ready_rx) = mpsc::channel();
    let mut options = ModelOptions::new()
        .kv_dtype(config.kv_dtype)
        .threads(config.threads);
    if let Some(c) = config.max_context {
        options = options.max_context(c);
    }
    let dir = config.model_dir.clone();
    let device = config.device;
    let limits = Limits {
        max_batch: config.max_batch,
        prefill_budget: config.prefill_budget,
        prefix_cache_bytes: config.prefix_cache_bytes,
        threads: config.threads,
    };
    let thread_metrics = metrics.clone();
    let alive = Arc::new(AtomicBool::new(true));
    let guard = AliveGuard(alive.clone());
    let join = std::thread::Builder::new()
        .name("fp4forge-engine".into())
        .spawn(move || {
            let _guard = guard;
            let serve = Serve {
                ready: ready_tx,
                rx,
                limits,
                metrics: thread_metrics,
            };
            match device {
                Device::Cpu => {
                    let model = Model::load(&dir, options).map_err(|source| ServerError::Load {
                        dir: dir.clone(),
                        source,
                    });
                    serve.run(model);
                }
                #[cfg(feature = "cuda")]
                Device::Cuda(ordinal) => {
                    let model = fp4forge_engine::CudaBackend::new(ordinal)
                        .map_err(|source| ServerError::Device { device, source })
                        .and_then(|backend| {
                            Model::load_with_backend(&dir, options, backend).map_err(|source| {
                                ServerError::Load {
                                    dir: dir.clone(),
                                    source,
                                }
                            })
                        });
                    serve.run(model);
                }
                #[cfg(not(feature = "cuda"))]
                Device::Cuda(_) => {
                    let _ = serve
                        .ready
                        .send(Err(ServerError::DeviceNotBuilt { device }));
                }
            }
        })
        .map_err(|e| ServerError::Engine(e.to_string()))?;
    match ready_rx.recv() {
        Ok(Ok(info)) => Ok((
            EngineHandle {
                tx,
                metrics,
                max_queue: config.max_queue,
                alive,
            },
            info,
            join,
        )),
        Ok(Err(e)) => {
            let _ = join.join();
            Err(e)
        }
        Err(_) => {
            let _ = join.join();
            Err(ServerError::Engine(
                "it stopped while loading the model".into(),
            ))
        }
    }
}

/// What the engine thread needs once its model is loaded.
struct Serve {
    ready: Sender<Result<ModelInfo, ServerError>>,
    rx: Receiver<Msg>,
    limits: Limits,
    metrics: Arc<Metrics>,
}

impl Serve {
    /// Reports the load's outcome; with a model, schedules until shut down.
    fn run<B: Backend>(self, model: Result<Model<B>, ServerError>) {
        let model = match model {
            Ok(m) => m,
            Err(e) => {
                let _ = self.ready.send(Err(e));
                return;
            }
        };
        let _ = self.ready.send(Ok(model.info().clone()));
        Scheduler::new(&model, self.limits, self.metrics).run(self.rx);
    }
}

#[derive(Debug, Clone, Copy)]
struct Limits {
    max_batch: usize,
    prefill_budget: usize,
    prefix_cache_bytes: usize,
    /// Worker threads (0: one per core), also for prompt logprobs.
    threads: usize,
}

/// A running sequence.
struct Seq<'m, B: Backend> {
    job: Job,
    session: Session<'m, B>,
    sampler: Sampler,
    prefilled: usize,
    generated: usize,
    /// The token to feed next (valid once decoding).
    next: u32,
    /// Generated tokens fed back so far (the session holds the prompt, then these).
    fed: Vec<u32>,
    decoding: bool,
    prompt_logprobs: Vec<Option<TokenLogprob>>,
    /// A copy of the prompt logprobs for the prefix cache.
    cached_prompt_logprobs: Option<Vec<Option<TokenLogprob>>>,
    last_token_at: Option<Instant>,
    done: bool,
    /// Ended normally: its session may serve a later request's prefix.
    reusable: bool,
}

struct Scheduler<'m, B: Backend> {
    model: &'m Model<B>,
    limits: Limits,
    metrics: Arc<Metrics>,
    max_context: usize,
    waiting: VecDeque<Job>,
    active: Vec<Seq<'m, B>>,
    prefix_cache: PrefixCache<'m, B>,
    /// Threads for prompt logprobs (a vocabulary-wide log-softmax per position); `None` if it
    /// could not be started (computed on the engine thread then).
    logprob_pool: Option<rayon::ThreadPool>,
    shutting_down: bool,
}

impl<'m, B: Backend> Scheduler<'m, B> {
    fn new(model: &'m Model<B>, limits: Limits, metrics: Arc<Metrics>) -> Self {
        Self {
            max_context: model.info().max_context,
            model,
            limits,
            metrics,
            waiting: VecDeque::new(),
            active: Vec::new(),
            prefix_cache: PrefixCache::new(limits.prefix_cache_bytes),
            logprob_pool: rayon::ThreadPoolBuilder::new()
                .num_threads(limits.threads)
                .thread_name(|i| format!("fp4forge-logprobs-{i}"))
                .build()
                .ok(),
            shutting_down: false,
        }
    }

    fn run(mut self, rx: Receiver<Msg>) {
        loop {
            if self.active.is_empty() && self.waiting.is_empty() {
                if self.shutting_down {
                    break;
                }
                match rx.recv() {
                    Ok(Msg::Job(j)) => self.waiting.push_back(j),
                    Ok(Msg::Shutdown) | Err(_) => self.shutting_down = true,
                }
            }
            loop {
                match rx.try_recv() {
                    Ok(Msg::Job(j)) => self.waiting.push_back(j),
                    Ok(Msg::Shutdown) => self.shutting_down = true,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        self.shutting_down = true;
                        break;
                    }
                }
            }
            self.drop_cancelled();
            self.admit();
            if !self.active.is_empty() {
                self.step();
                self.retire();
            }
            self.metrics
                .running
                .store(self.active.len(), Ordering::Relaxed);
        }
        self.metrics.running.store(0, Ordering::Relaxed);
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
        self.active.retain(|s| {
            let keep = !s.job.cancelled();
            if !keep {
                m.cancelled.fetch_add(1, Ordering::Relaxed);
            }
            keep
        });
    }

    fn admit(&mut self) {
        while self.active.len() < self.limits.max_batch {
            let Some(job) = self.waiting.pop_front() else {
                break;
            };
            self.metrics.waiting.fetch_sub(1, Ordering::SeqCst);
            let reuse = self
                .prefix_cache
                .take(&job.req.prompt, job.req.prompt_logprobs);
            let start = match reuse {
                Some(r) => {
                    self.metrics.prefix_hits.fetch_add(1, Ordering::Relaxed);
                    self.metrics
                        .prefix_reused_tokens
                        .fetch_add(r.len as u64, Ordering::Relaxed);
                    Ok((r.session, r.len, r.prompt_logprobs))
                }
                None => self.model.new_session().map(|s| (s, 0, Vec::new())),
            };
            match start {
                Ok((session, prefilled, prompt_logprobs)) => self.active.push(Seq {
                    sampler: Sampler::new(job.req.sampling),
                    cached_prompt_logprobs: None,
                    job,
                    session,
                    prefilled,
                    generated: 0,
                    next: 0,
                    fed: Vec::new(),
                    decoding: false,
                    prompt_logprobs,
                    last_token_at: None,
                    done: false,
                    reusable: false,
                }),
                Err(e) => {
                    job.send(Event::Failed(e.to_string()));
                }
            }
        }
        self.publish_cache_size();
    }

    /// Removes ended sequences; those that ended normally leave their session to the prefix
    /// cache.
    fn retire(&mut self) {
        let ended: Vec<Seq<'m, B>> = self.active.extract_if(.., |s| s.done).collect();
        for s in ended {
            if !s.reusable || !self.prefix_cache.enabled() {
                continue;
            }
            let mut tokens = Vec::with_capacity(s.job.req.prompt.len() + s.fed.len());
            tokens.extend_from_slice(&s.job.req.prompt);
            tokens.extend_from_slice(&s.fed);
            let logprobs = s.job.req.prompt_logprobs.zip(s.cached_prompt_logprobs);
            self.prefix_cache
                .put(s.session, tokens, s.job.req.prompt.len(), logprobs);
        }
        self.publish_cache_size();
    }

    fn publish_cache_size(&self) {
        self.metrics
            .prefix_cache_bytes
            .store(self.prefix_cache.bytes(), Ordering::Relaxed);
        self.metrics
            .prefix_cache_entries
            .store(self.prefix_cache.len(), Ordering::Relaxed);
    }

    /// What each sequence feeds this step: `(index in active, tokens, logits wanted)`.
    fn plan(&self) -> Vec<(usize, usize, WantLogits)> {
        let mut plan = Vec::new();
        let mut budget = self.limits.prefill_budget;
        for (i, s) in self.active.iter().enumerate() {
            if s.decoding {
                plan.push((i, 1, WantLogits::Last));
                continue;
            }
            if budget == 0 {
                continue;
            }
            let remaining = s.job.req.prompt.len() - s.prefilled;
            let mut n = remaining.min(budget);
            let want = if s.job.req.prompt_logprobs.is_some() {
                n = n.min(PROMPT_LOGPROB_ROWS);
                WantLogits::All
            } else if n == remaining {
                WantLogits::Last
            } else {
                WantLogits::None
            };
            budget -= n;
            plan.push((i, n, want));
        }
        plan
    }

    fn step(&mut self) {
        let plan = self.plan();
        if plan.is_empty() {
            return;
        }
        if let [(i, 1, WantLogits::Last)] = plan[..] {
            if self.picks_without_logits(i) {
                return self.step_sampled(i);
            }
        }
        let rows: usize = plan.iter().map(|p| p.1).sum();
        let result = {
            let mut sessions = Vec::with_capacity(plan.len());
            let mut tokens: Vec<&[u32]> = Vec::with_capacity(plan.len());
            let mut wanted = Vec::with_capacity(plan.len());
            let mut next = plan.iter().peekable();
            for (i, s) in self.active.iter_mut().enumerate() {
                let Some(&&(pi, n, w)) = next.peek() else {
                    break;
                };
                if pi != i {
                    continue;
                }
                next.next();
                let Seq {
                    session,
                    job,
                    next: token,
                    prefilled,
                    decoding,
                    ..
                } = s;
                tokens.push(if *decoding {
                    std::slice::from_ref(token)
                } else {
                    &job.req.prompt[*prefilled..*prefilled + n]
                });
                sessions.push(session);
                wanted.push(w);
            }
            let model = self.model;
            std::panic::catch_unwind(AssertUnwindSafe(|| {
                model.forward_batch(&mut sessions, &tokens, &wanted)
            }))
        };
        self.metrics.steps.fetch_add(1, Ordering::Relaxed);
        self.metrics
            .step_rows
            .fetch_add(rows as u64, Ordering::Relaxed);
        let outputs = match result {
            Ok(Ok(outputs)) => outputs,
            Ok(Err(e)) => return self.fail(&plan, &e.to_string()),
            Err(_) => return self.fail(&plan, "the engine panicked on this batch"),
        };
        for (&(i, n, _), logits) in plan.iter().zip(outputs) {
            let s = &mut self.active[i];
            if s.decoding {
                s.fed.push(s.next);
                match logits {
                    Some(mut l) => self.emit(i, &mut l.data),
                    None => self.fail_one(i, "no logits for a decode step"),
                }
                continue;
            }
            let prompt = s.job.req.prompt.clone();
            if let (Some(top), Some(l)) = (s.job.req.prompt_logprobs, &logits) {
                if s.prefilled == 0 {
                    s.prompt_logprobs.push(None);
                }
                // row r predicts prompt position prefilled + r + 1
                let targets = &prompt[(s.prefilled + 1).min(prompt.len())..];
                let lps = rows_logprobs(self.logprob_pool.as_ref(), l, targets, top);
                s.prompt_logprobs.extend(lps.into_iter().map(Some));
            }
            s.prefilled += n;
            if s.prefilled < prompt.len() {
                continue;
            }
            self.metrics
                .prompt_tokens
                .fetch_add(prompt.len() as u64, Ordering::Relaxed);
            let lps = std::mem::take(&mut s.prompt_logprobs);
            if self.prefix_cache.enabled() && s.job.req.prompt_logprobs.is_some() {
                s.cached_prompt_logprobs = Some(lps.clone());
            }
            if !s.job.send(Event::Prompt(lps)) {
                s.done = true;
                continue;
            }
            if s.job.req.max_tokens == 0 {
                self.finish(i, Finish::Length, None);
                continue;
            }
            match logits {
                Some(l) if l.rows > 0 => {
                    let mut last = l.row(l.rows - 1).to_vec();
                    self.emit(i, &mut last);
                }
                _ => self.fail_one(i, "no logits at the end of the prompt"),
            }
        }
    }

    /// Whether sequence `i`'s next token needs no logits on the host: it is decoding, asks for
    /// no logprobs and may already sample its stop tokens (nothing to mask).
    fn picks_without_logits(&self, i: usize) -> bool {
        let s = &self.active[i];
        let req = &s.job.req;
        s.decoding
            && req.logprobs.is_none()
            && (s.generated >= req.min_tokens || req.stop_ids.is_empty())
    }

    /// Sequence `i` alone decodes one token and picks the next where the logits are
    /// (`Session::step_sampled`: on the device where the backend samples, so only the token id
    /// crosses to the host; the same token as `emit` would pick from the downloaded logits).
    fn step_sampled(&mut self, i: usize) {
        self.metrics.steps.fetch_add(1, Ordering::Relaxed);
        self.metrics.step_rows.fetch_add(1, Ordering::Relaxed);
        let s = &mut self.active[i];
        let token = s.next;
        let (session, sampler) = (&mut s.session, &mut s.sampler);
        let result =
            std::panic::catch_unwind(AssertUnwindSafe(|| session.step_sampled(token, sampler)));
        match result {
            Ok(Ok(next)) => {
                self.active[i].fed.push(token);
                self.deliver(i, next, None);
            }
            Ok(Err(e)) => self.fail_one(i, &e.to_string()),
            Err(_) => self.fail_one(i, "the engine panicked on this batch"),
        }
    }

    fn fail(&mut self, plan: &[(usize, usize, WantLogits)], message: &str) {
        for &(i, _, _) in plan {
            self.fail_one(i, message);
        }
    }

    fn fail_one(&mut self, i: usize, message: &str) {
        self.active[i].done = true;
        self.publish_running();
        self.active[i].job.send(Event::Failed(message.to_string()));
    }

    /// Publishes the sequences still running, before an ended one's last event goes out (a
    /// client that reads `/metrics` after its answer sees its sequence gone).
    fn publish_running(&self) {
        let running = self.active.iter().filter(|s| !s.done).count();
        self.metrics.running.store(running, Ordering::Relaxed);
    }

    fn finish(
        &mut self,
        i: usize,
        reason: Finish,
        stop_token: Option<(u32, Option<TokenLogprob>)>,
    ) {
        let s = &mut self.active[i];
        s.done = true;
        s.reusable = true;
        self.metrics.e2e.observe(s.job.arrived.elapsed());
        self.publish_running();
        self.active[i].job.send(Event::Done { reason, stop_token });
    }

    /// Samples sequence `i`'s next token from `logits` and sends it.
    fn emit(&mut self, i: usize, logits: &mut [f32]) {
        let s = &mut self.active[i];
        let req = &s.job.req;
        // Stop tokens may not be sampled before `min_tokens`.
        let masked: Vec<(usize, f32)> = if s.generated < req.min_tokens {
            req.stop_ids
                .iter()
                .filter_map(|&t| {
                    let t = t as usize;
                    logits.get_mut(t).map(|l| {
                        let old = *l;
                        *l = f32::NEG_INFINITY;
                        (t, old)
                    })
                })
                .collect()
        } else {
            Vec::new()
        };
        let token = s.sampler.sample(logits);
        for (t, old) in masked {
            logits[t] = old;
        }
        let lp = req.logprobs.map(|top| token_logprob(logits, token, top));
        self.deliver(i, token, lp);
    }

    /// Sends sequence `i`'s new `token` (with its logprobs `lp`, if asked) and ends the sequence
    /// on a stop token, its `max_tokens` or the context.
    fn deliver(&mut self, i: usize, token: u32, lp: Option<TokenLogprob>) {
        let s = &mut self.active[i];
        let req = &s.job.req;
        s.generated += 1;
        let now = Instant::now();
        match s.last_token_at {
            None => self.metrics.ttft.observe(now - s.job.arrived),
            Some(t) => self.metrics.itl.observe(now - t),
        }
        s.last_token_at = Some(now);
        self.metrics
            .generation_tokens
            .fetch_add(1, Ordering::Relaxed);
        if req.stop_ids.contains(&token) {
            return self.finish(i, Finish::Stop, Some((token, lp)));
        }
        if !s.job.send(Event::Token(token, lp)) {
            s.done = true;
            self.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if s.generated >= s.job.req.max_tokens || s.session.position() >= self.max_context {
            return self.finish(i, Finish::Length, None);
        }
        s.next = token;
        s.decoding = true;
    }
}

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
