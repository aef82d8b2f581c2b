//! [`Server`]: loads the model, binds the socket, routes, serves until a shutdown signal, then
//! drains.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use fp4forge_api::{ModelEntry, ModelList};
use fp4forge_engine::TextCodec;
use serde::Serialize;
use tokio::net::TcpListener;

use crate::api_error::ApiError;
use crate::auth::require_api_key;
use crate::chat::{Chat, ChatSetup};

use crate::completions::Completions;
use crate::config::ServerConfig;
use crate::conn::{self, ConnLimits};
use crate::error::ServerError;
use crate::handler::handler;
use crate::http::{count_requests, json_response, method_not_allowed, not_found};
use crate::logs::{log_requests, log_stats};
use crate::metrics::Metrics;
use crate::scheduler;
use crate::state::{unix_now, AppState};
use crate::structured::Grammars;
use crate::tokenize::{detokenize, tokenize, version};

/// How long, after the drain timeout ended every sequence, the last responses get to go out
/// before the connections still open are dropped.
pub const ABORT_GRACE: Duration = Duration::from_secs(1);

/// A bound server with its model loaded, ready to [`run`](Server::run).
pub struct Server {
    listener: TcpListener,
    addr: SocketAddr,
    state: Arc<AppState>,
    engine: JoinHandle<()>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("addr", &self.addr)
            .field("model", &self.state.model_name)
            .finish()
    }
}

impl Server {
    /// Loads the model and tokenizer of `config.model_dir` (the model on its own engine
    /// thread) and binds `config.host:config.port` (port 0: any free one).
    pub async fn bind(config: ServerConfig) -> Result<Self, ServerError> {
        config.validate()?;
        let dir = config.model_dir.clone();
        match std::fs::metadata(&dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(ServerError::NoModelDir {
                    dir,
                    problem: "not a directory (serve takes the checkpoint's directory)".into(),
                })
            }
            Err(e) => {
                let problem = if e.kind() == std::io::ErrorKind::NotFound {
                    "no such directory".to_string()
                } else {
                    e.to_string()
                };
                return Err(ServerError::NoModelDir { dir, problem });
            }
        }
        if !dir.join("tokenizer.json").is_file() {
            return Err(ServerError::NoTokenizer { dir });
        }
        let (codec, max_token_bytes) = {
            let d = dir.clone();
            tokio::task::spawn_blocking(move || {
                TextCodec::load(&d).map(|c| {
                    let longest = longest_token_bytes(&c);
                    (c, longest)
                })
            })
            .await
            .map_err(|e| ServerError::Engine(e.to_string()))?
            .map_err(|source| ServerError::Load { dir, source })?
        };
        let model_name = config.model_name();
        let metrics = Arc::new(Metrics::new(&model_name));
        let (engine, info, join) = {
            let config = config.clone();
            let metrics = metrics.clone();
            tokio::task::spawn_blocking(move || scheduler::start(&config, metrics))
                .await
                .map_err(|e| ServerError::Engine(e.to_string()))??
        };
        let addr_text = format!("{}:{}", config.host, config.port);
        let listener = match TcpListener::bind(&addr_text).await {
            Ok(l) => l,
            Err(source) => {
                engine.shutdown();
                let _ = join.join();
                return Err(ServerError::Bind {
                    addr: addr_text,
                    source,
                });
            }
        };
        let addr = listener.local_addr().map_err(ServerError::Serve)?;
        let mut eos_ids = info.eos_token_ids.clone();
        eos_ids.extend_from_slice(codec.stop_ids());
        eos_ids.sort_unstable();
        eos_ids.dedup();
        let grammars = {
            let path = config.model_dir.join("tokenizer.json");
            let (eos, vocab) = (eos_ids.clone(), info.vocab_size);
            tokio::task::spawn_blocking(move || match std::fs::read(&path) {
                Ok(bytes) => Grammars::new(&bytes, &eos, vocab),
                Err(e) => Grammars::unavailable(format!("{}: {e}", path.display())),
            })
            .await
            .map_err(|e| ServerError::Engine(e.to_string()))?
        };
        let chat = match ChatSetup::new(&config, &codec) {
            Ok(c) => c,
            Err(e) => {
                engine.shutdown();
                let _ = join.join();
                return Err(e);
            }
        };
        let state = Arc::new(AppState {
            chat,
            engine,
            codec: Arc::new(codec),
            info,
            model_name,
            config,
            metrics,
            created: unix_now(),
            eos_ids,
            max_token_bytes,
            tokenize_permits: tokio::sync::Semaphore::new(
                std::thread::available_parallelism().map_or(1, usize::from),
            ),
            grammars: Arc::new(grammars),
        });
        Ok(Self {
            listener,
            addr,
            state,
            engine: join,
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The model name clients put in requests.
    pub fn model_name(&self) -> &str {
        &self.state.model_name
    }

    /// The backend the model runs on (`cpu-avx2`, `cuda:0`, ...).
    pub fn backend(&self) -> &str {
        &self.state.info.backend
    }

    /// The KV caches' memory cap, bytes (`None`: no cap: the CPU without
    /// `--kv-cache-memory-bytes`).
    pub fn kv_capacity_bytes(&self) -> Option<usize> {
        match self
            .state
            .metrics
            .kv_capacity_bytes
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            0 => None,
            b => Some(b),
        }
    }

    /// The longest sequence (prompt + generated tokens) served.
    pub fn max_context(&self) -> usize {
        self.state.info.max_context
    }

    /// Serves until `shutdown` completes, then stops accepting connections, lets the requests
    /// in flight finish (up to the configured drain timeout), stops the engine thread and
    /// returns. When the drain timeout runs out, every sequence still waiting or running is
    /// ended with finish reason `abort` (its response or stream completes normally, `[DONE]`
    /// included) and the server returns at most [`ABORT_GRACE`] later.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServerError> {
        let Self {
            listener,
            state,
            engine,
            ..
        } = self;
        let app = router(state.clone());
        let stats = state
            .config
            .stats_interval
            .map(|every| tokio::spawn(log_stats(state.metrics.clone(), every)));
        let drain = state.config.drain_timeout;
        let signalled = Arc::new(tokio::sync::Notify::new());
        let notify = signalled.clone();
        let limits = ConnLimits {
            max_connections: state.config.max_connections,
            header_read_timeout: state.config.header_read_timeout,
        };
        let serve = conn::serve(listener, app, limits, async move {
            shutdown.await;
            notify.notify_one();
        });
        tokio::pin!(serve);
        let result = tokio::select! {
            r = &mut serve => r.map_err(ServerError::Serve),
            () = async {
                signalled.notified().await;
                tokio::time::sleep(drain).await;
            } => {
                // Drained too slowly: the engine ends what it has, the handlers answer (finish
                // reason `abort`), and the connections close once their last bytes are out.
                state.engine.abort();
                match tokio::time::timeout(ABORT_GRACE, &mut serve).await {
                    Ok(r) => r.map_err(ServerError::Serve),
                    Err(_) => Ok(()),
                }
            }
        };
        if let Some(stats) = stats {
            stats.abort();
        }
        state.engine.shutdown();
        drop(state);
        tokio::task::spawn_blocking(move || engine.join())
            .await
            .map_err(|e| ServerError::Engine(e.to_string()))?
            .map_err(|_| ServerError::Engine("the engine thread panicked".into()))?;
        result
    }
}

/// The most bytes of text one token of `codec` stands for (at least 1): the longest decoded
/// vocabulary entry, special tokens included, plus one for a leading space a decoder drops.
/// (A byte token that is half a character decodes to U+FFFD, 3 bytes: more, never less.)
fn longest_token_bytes(codec: &TextCodec) -> usize {
    let longest = (0..codec.vocab_size() as u32)
        .filter_map(|id| codec.decode(&[id], true).ok())
        .map(|t| t.len())
        .max()
        .unwrap_or(0);
    longest + 1
}

/// Every route, with the API key check, request counting and logging, and CORS outside them
/// all.
fn router(state: Arc<AppState>) -> Router {
    // Validated by `Server::bind`.
    let cors = crate::cors::layer(&state.config).ok().flatten();
    let app = Router::new()
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/v1/completions", post(handler::<Completions>))
        .route("/v1/chat/completions", post(handler::<Chat>))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/version", get(version))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            require_api_key,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            count_requests,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            log_requests,
        ))
        .with_state(state);
    match cors {
        Some(cors) => app.layer(cors),
        None => app,
    }
}

fn model_entry(state: &AppState) -> ModelEntry {
    ModelEntry {
        id: state.model_name.clone(),
        object: "model".into(),
        created: state.created,
        owned_by: "fp4forge".into(),
        root: Some(state.info.dir.display().to_string()),
        parent: None,
        max_model_len: Some(state.info.max_context as u64),
    }
}

/// The body of `GET /health`.
#[derive(Serialize)]
struct Health {
    /// `ok`, or what is wrong.
    status: &'static str,
}

async fn models(State(state): State<Arc<AppState>>) -> Response {
    json_response(
        StatusCode::OK,
        &ModelList {
            object: "list".into(),
            data: vec![model_entry(&state)],
        },
    )
}

async fn model(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    if id == state.model_name {
        json_response(StatusCode::OK, &model_entry(&state))
    } else {
        ApiError::unknown_model(&id, &state.model_name).into_response()
    }
}

async fn health(State(state): State<Arc<AppState>>) -> Response {
    if state.engine.is_alive() {
        json_response(StatusCode::OK, &Health { status: "ok" })
    } else {
        json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &Health {
                status: "the engine thread has stopped",
            },
        )
    }
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    (
        StatusCode::OK,
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response()
}

/// Completes on SIGINT (Ctrl-C) or SIGTERM, the start of a graceful shutdown. A second
/// SIGINT/SIGTERM after that ends the process at once, without draining (exit status 128 +
/// the signal's number: 130 for SIGINT, 143 for SIGTERM).
pub async fn shutdown_signal() {
    let mut signals = Signals::new();
    let first = signals.next().await;
    eprintln!(
        "fp4forge serve: {first}: draining the requests in flight (a second signal exits at once)"
    );
    tokio::spawn(async move {
        let second = signals.next().await;
        eprintln!("fp4forge serve: {second} again: exiting now");
        std::process::exit(128 + second.number());
    });
}

/// A shutdown signal.
#[derive(Debug, Clone, Copy)]
enum Signal {
    Interrupt,
    Terminate,
}

impl Signal {
    fn number(self) -> i32 {
        match self {
            Self::Interrupt => 2,
            Self::Terminate => 15,
        }
    }
}

impl std::fmt::Display for Signal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Interrupt => "SIGINT",
            Self::Terminate => "SIGTERM",
        })
    }
}

/// SIGINT and SIGTERM, listened to from creation on (a signal that comes while nobody awaits
/// is kept for the next [`Signals::next`]).
struct Signals {
    #[cfg(unix)]
    interrupt: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    terminate: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn new() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Self {
                interrupt: signal(SignalKind::interrupt()).ok(),
                terminate: signal(SignalKind::terminate()).ok(),
            }
        }
        #[cfg(not(unix))]
        Self {}
    }

    /// The next signal (pending forever if neither could be listened to).
    async fn next(&mut self) -> Signal {
        #[cfg(unix)]
        {
            async fn recv(s: &mut Option<tokio::signal::unix::Signal>) {
                match s {
                    Some(s) => {
                        if s.recv().await.is_none() {
                            std::future::pending::<()>().await;
                        }
                    }
                    None => std::future::pending::<()>().await,
                }
            }
            tokio::select! {
                () = recv(&mut self.interrupt) => Signal::Interrupt,
                () = recv(&mut self.terminate) => Signal::Terminate,
            }
        }
        #[cfg(not(unix))]
        {
            match tokio::signal::ctrl_c().await {
                Ok(()) => Signal::Interrupt,
                Err(_) => std::future::pending().await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_tiny_model as tiny_model;

    #[tokio::test]
    async fn binds_on_the_cpu_by_default() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("tiny");
        tiny_model::write_tiny_model(&dir, 3).unwrap();
        let server = Server::bind(
            ServerConfig::new(&dir)
                .port(0)
                .threads(1)
                .drain_timeout(std::time::Duration::from_secs(1)),
        )
        .await
        .unwrap();
        assert!(server.backend().starts_with("cpu"), "{}", server.backend());
        server.run(async {}).await.unwrap();
    }

    #[tokio::test]
    async fn a_missing_model_directory_is_named_as_such() {
        let tmp = tempfile::tempdir().unwrap();
        let missing = tmp.path().join("no-such-model");
        let err = Server::bind(ServerConfig::new(&missing).port(0))
            .await
            .unwrap_err();
        let message = err.to_string();
        assert!(message.contains("no such directory"), "{message}");
        assert!(message.contains("no-such-model"), "{message}");
        assert!(!message.contains("tokenizer"), "{message}");
        let file = tmp.path().join("config.json");
        std::fs::write(&file, "{}").unwrap();
        let err = Server::bind(ServerConfig::new(&file).port(0))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("not a directory"), "{err}");
    }

    #[cfg(not(feature = "cuda"))]
    #[tokio::test]
    async fn cuda_without_the_feature_is_a_clear_error() {
        use fp4forge_engine::{Device, EngineError};
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("tiny");
        tiny_model::write_tiny_model(&dir, 3).unwrap();
        let config = ServerConfig::new(&dir).port(0).device(Device::Cuda(1));
        let err = Server::bind(config).await.unwrap_err();
        assert!(
            matches!(
                err,
                ServerError::Load {
                    source: EngineError::DeviceNotBuilt {
                        device: Device::Cuda(1)
                    },
                    ..
                }
            ),
            "{err:?}"
        );
        let message = err.to_string();
        assert!(message.contains("cuda:1"), "{message}");
        assert!(message.contains("`cuda` feature"), "{message}");
    }
}
