//! [`Server`]: loads the model, binds the socket, routes, serves until a shutdown signal, then
//! drains.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;

use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
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
use crate::error::ServerError;
use crate::handler::handler;
use crate::http::{count_requests, json_response, method_not_allowed, not_found};
use crate::metrics::Metrics;
use crate::scheduler;
use crate::state::{unix_now, AppState};
use crate::structured::Grammars;

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
        if !dir.join("tokenizer.json").is_file() {
            return Err(ServerError::NoTokenizer { dir });
        }
        let codec = {
            let d = dir.clone();
            tokio::task::spawn_blocking(move || TextCodec::load(&d))
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

    /// The longest sequence (prompt + generated tokens) served.
    pub fn max_context(&self) -> usize {
        self.state.info.max_context
    }

    /// Serves until `shutdown` completes, then stops accepting connections, lets the requests
    /// in flight finish (up to the configured drain timeout), stops the engine thread and
    /// returns.
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
        let drain = state.config.drain_timeout;
        let signalled = Arc::new(tokio::sync::Notify::new());
        let notify = signalled.clone();
        let listener = listener.tap_io(|tcp| {
            // Streamed tokens go out as they are made, not when a segment fills.
            let _ = tcp.set_nodelay(true);
        });
        let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
            shutdown.await;
            notify.notify_one();
        });
        let result = tokio::select! {
            r = serve => r.map_err(ServerError::Serve),
            () = async {
                signalled.notified().await;
                tokio::time::sleep(drain).await;
            } => Ok(()),
        };
        state.engine.shutdown();
        drop(state);
        tokio::task::spawn_blocking(move || engine.join())
            .await
            .map_err(|e| ServerError::Engine(e.to_string()))?
            .map_err(|_| ServerError::Engine("the engine thread panicked".into()))?;
        result
    }
}

/// Every route, with the body limit, the API key check and request counting.
fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/v1/completions", post(handler::<Completions>))
        .route("/v1/chat/completions", post(handler::<Chat>))
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
        .layer(DefaultBodyLimit::max(state.config.max_body_bytes))
        .with_state(state)
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

/// Completes on SIGINT (Ctrl-C) or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
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
