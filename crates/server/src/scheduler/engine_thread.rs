//! The engine thread: started with its model loaded on the configured device, reached through
//! an [`EngineHandle`] that queues sequences (or refuses them with a [`SubmitError`]).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use fp4forge_engine::{Backend, Device, Model, ModelInfo, ModelOptions, WithModel};
use tokio::sync::mpsc::UnboundedSender;

use super::job::{CancelFlag, Event, Job, Msg, SeqRequest};
use super::policy::{Limits, Scheduler};
use crate::config::ServerConfig;
use crate::error::ServerError;
use crate::metrics::Metrics;

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

    /// Asks the engine thread to end every sequence it has, waiting or running, at once (each
    /// gets `Done` with [`Finish::Abort`](super::Finish::Abort), so its handler answers) and
    /// stop; sequences submitted later are refused.
    pub fn abort(&self) {
        let _ = self.tx.send(Msg::Abort);
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
        .threads(config.threads)
        .cpu_isa(config.cpu_isa)
        .cpu_activations(config.cpu_activations)
        .load_format(config.load_format)
        .kv_limit(config.kv_limit());
    if let Some(c) = config.max_context {
        options = options.max_context(c);
    }
    let dir = config.model_dir.clone();
    let device = config.device;
    let limits = Limits {
        max_batch: config.max_batch,
        prefill_budget: config.prefill_budget,
        prefix_cache_bytes: config.prefix_cache_bytes,
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
            load_and_serve(device, dir, options, serve);
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

impl WithModel for Serve {
    type Output = ();

    /// Reports the model's info, then schedules until shut down.
    fn with<B: Backend>(self, model: Model<B>) {
        // (before `ready`: the server's start-up line reports the cap)
        self.metrics
            .kv_capacity_bytes
            .store(model.kv_memory().capacity.unwrap_or(0), Ordering::Relaxed);
        let _ = self.ready.send(Ok(model.info().clone()));
        Scheduler::new(&model, self.limits, self.metrics).run(self.rx);
    }
}

/// Loads the model from `dir` on `device` (the engine picks the backend) and hands it to
/// `serve`, or tells `serve` why it could not be loaded.
fn load_and_serve(device: Device, dir: PathBuf, options: ModelOptions, serve: Serve) {
    let failed = serve.ready.clone();
    if let Err(source) = fp4forge_engine::open(device, &dir, options, serve) {
        let _ = failed.send(Err(ServerError::Load { dir, source }));
    }
}
