//! Helpers of the server's integration tests: a tiny model on disk, a server on loopback port 0,
//! and small HTTP calls.
#![allow(dead_code)]

pub mod script_model;
pub mod tiny_model;

use std::path::PathBuf;
use std::time::Duration;

use fp4forge_engine::{Device, KvDtype};
use fp4forge_server::{Server, ServerConfig, ServerError};
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The device the test servers run their engine on: the CPU, or what `FP4FORGE_TEST_DEVICE`
/// names (`cuda`, `cuda:1`: the GPU runs of `scripts/gpu-tests.sh`, with a `--features cuda`
/// build of these tests).
pub fn test_device() -> Device {
    match std::env::var("FP4FORGE_TEST_DEVICE") {
        Ok(d) => d
            .parse()
            .unwrap_or_else(|e| panic!("FP4FORGE_TEST_DEVICE={d:?}: {e}")),
        Err(_) => Device::Cpu,
    }
}

/// A running server over a fresh tiny model.
pub struct TestServer {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// The served model name.
    pub model: String,
    /// The model directory.
    pub dir: PathBuf,
    shutdown: Option<oneshot::Sender<()>>,
    handle: Option<JoinHandle<Result<(), ServerError>>>,
    _tmp: tempfile::TempDir,
}

impl TestServer {
    /// Writes the tiny model and serves it (f32 KV cache, one engine thread, on
    /// [`test_device`]), with the config adjusted by `configure`.
    pub async fn start(configure: impl FnOnce(ServerConfig) -> ServerConfig) -> Self {
        Self::start_with(|dir| tiny_model::write_tiny_model(dir, 7), configure).await
    }

    /// Writes a model with `write` and serves it as [`TestServer::start`] does.
    pub async fn start_with(
        write: impl FnOnce(&std::path::Path) -> Result<(), Box<dyn std::error::Error>>,
        configure: impl FnOnce(ServerConfig) -> ServerConfig,
    ) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("tiny");
        write(&dir).unwrap();
        let config = configure(
            ServerConfig::new(&dir)
                .port(0)
                .threads(1)
                .kv_dtype(KvDtype::F32)
                .device(test_device()),
        );
        let server = Server::bind(config).await.unwrap();
        let base = format!("http://{}", server.local_addr());
        let model = server.model_name().to_string();
        let (tx, rx) = oneshot::channel::<()>();
        let handle = tokio::spawn(server.run(async move {
            let _ = rx.await;
        }));
        Self {
            base,
            model,
            dir,
            shutdown: Some(tx),
            handle: Some(handle),
            _tmp: tmp,
        }
    }

    /// `base + path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Signals shutdown (the server drains and stops); returns the run's join handle.
    pub fn begin_shutdown(&mut self) -> JoinHandle<Result<(), ServerError>> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        self.handle.take().expect("shut down once")
    }

    /// Shuts down and waits for the server to stop.
    pub async fn stop(mut self) {
        let h = self.begin_shutdown();
        tokio::time::timeout(Duration::from_secs(30), h)
            .await
            .expect("server stops")
            .unwrap()
            .unwrap();
    }

    /// POSTs `body` (JSON) to `path`; returns status and parsed JSON body.
    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.post_raw(path, body.to_string()).await
    }

    /// POSTs raw bytes to `path`.
    pub async fn post_raw(&self, path: &str, body: impl Into<reqwest::Body>) -> (u16, Value) {
        let r = client()
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        (status, v)
    }

    /// GETs `path` as text.
    pub async fn get_text(&self, path: &str) -> (u16, String) {
        let r = client().get(self.url(path)).send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    /// POSTs a streamed request; returns the `data:` payloads (JSON, and `[DONE]` as a string).
    pub async fn stream(&self, path: &str, body: &Value) -> Vec<Value> {
        let r = client()
            .post(self.url(path))
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "stream status");
        assert_eq!(
            r.headers()["content-type"].to_str().unwrap(),
            "text/event-stream"
        );
        let text = r.text().await.unwrap();
        parse_sse(&text)
    }

    /// The value of a metric line starting with `prefix` (e.g. `fp4forge_requests_running{`).
    pub async fn metric(&self, prefix: &str) -> f64 {
        let (_, text) = self.get_text("/metrics").await;
        metric_value(&text, prefix).unwrap_or(0.0)
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// A client without connection pooling surprises.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap()
}

/// The `data:` payloads of an event stream.
pub fn parse_sse(text: &str) -> Vec<Value> {
    text.split("\n\n")
        .filter_map(|ev| ev.strip_prefix("data: "))
        .map(|d| {
            if d == "[DONE]" {
                Value::String(d.into())
            } else {
                serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}"))
            }
        })
        .collect()
}

/// The value of the first metric line starting with `prefix`.
pub fn metric_value(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// The tiny model's tokenizer, to encode prompts as the server does.
pub fn tokenizer(dir: &std::path::Path) -> tokenizers::Tokenizer {
    tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap()
}

/// `prompt`'s ids under the tiny tokenizer.
pub fn encode(dir: &std::path::Path, prompt: &str) -> Vec<u32> {
    tokenizer(dir)
        .encode(prompt, false)
        .unwrap()
        .get_ids()
        .to_vec()
}
