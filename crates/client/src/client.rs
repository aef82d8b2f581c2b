//! [`Client`]: the HTTP calls, with timeouts, retries of transient failures and a bound on the
//! requests in flight.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio::sync::Semaphore;

use crate::api::{
    CompletionChunk, CompletionRequest, CompletionResponse, ModelList, StreamOptions, Usage,
};
use crate::error::{ClientError, Result};
use crate::sse::SseParser;

/// Builds a [`Client`].
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    base: String,
    api_key: Option<String>,
    timeout: Duration,
    connect_timeout: Duration,
    retries: u32,
    max_in_flight: Option<usize>,
}

impl ClientBuilder {
    /// Bearer token sent as `Authorization` (vLLM's `--api-key`).
    pub fn api_key(mut self, key: Option<String>) -> Self {
        self.api_key = key;
        self
    }

    /// Limit on one whole non-streamed request, and on the wait for each piece of a stream.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Limit on establishing a connection.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Retries after a transient failure (connection error, timeout, HTTP 429/500/502/503/504),
    /// with exponential back-off from 250 ms. A stream is retried only before its first byte.
    pub fn retries(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }

    /// At most this many requests in flight through this client (and its clones); unbounded by
    /// default.
    pub fn max_in_flight(mut self, n: Option<usize>) -> Self {
        self.max_in_flight = n.map(|n| n.max(1));
        self
    }

    /// The client.
    pub fn build(self) -> Result<Client> {
        let http = reqwest::Client::builder()
            .connect_timeout(self.connect_timeout)
            .read_timeout(self.timeout)
            .pool_max_idle_per_host(1024)
            .build()
            .map_err(|error| ClientError::Http {
                url: self.base.clone(),
                error,
            })?;
        Ok(Client {
            http,
            base: self.base,
            api_key: self.api_key,
            timeout: self.timeout,
            retries: self.retries,
            limit: self.max_in_flight.map(|n| Arc::new(Semaphore::new(n))),
        })
    }
}

/// An OpenAI-compatible endpoint. Cheap to clone (clones share the connection pool and the bound
/// on requests in flight).
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    api_key: Option<String>,
    timeout: Duration,
    retries: u32,
    limit: Option<Arc<Semaphore>>,
}

/// One piece of a streamed completion, with its arrival time.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamChunk {
    /// Time from sending the request to receiving this chunk.
    pub at: Duration,
    /// The text it carries (may be empty).
    pub text: String,
}

/// A streamed completion as it arrived.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamedCompletion {
    /// The chunks that carried a choice, in arrival order.
    pub chunks: Vec<StreamChunk>,
    /// The usage of the final chunk, if the server sent one.
    pub usage: Option<Usage>,
    /// The finish reason of the last choice chunk that had one.
    pub finish_reason: Option<String>,
    /// Time from sending the request to the end of the stream.
    pub total: Duration,
}

impl StreamedCompletion {
    /// The generated text.
    pub fn text(&self) -> String {
        self.chunks.iter().map(|c| c.text.as_str()).collect()
    }
}

/// Normalises a server URL to the `/v1` base: `http://h:8000`, `http://h:8000/` and
/// `http://h:8000/v1/` all give `http://h:8000/v1`.
pub fn normalize_base_url(url: &str) -> String {
    let trimmed = url.trim().trim_end_matches('/');
    if trimmed.ends_with("/v1") {
        trimmed.to_string()
    } else {
        format!("{trimmed}/v1")
    }
}

/// The message of an error body: OpenAI's `error.message`, FastAPI's `detail`, or the body.
fn error_message(body: &str) -> String {
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(body) {
        let found = v
            .pointer("/error/message")
            .or_else(|| v.get("message"))
            .or_else(|| v.get("detail"))
            .or_else(|| v.get("error"));
        if let Some(m) = found {
            return match m {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
        }
    }
    let mut s: String = body.chars().take(300).collect();
    if s.len() < body.len() {
        s.push('…');
    }
    s
}

fn is_transient_status(status: u16) -> bool {
    matches!(status, 429 | 500 | 502 | 503 | 504)
}

fn is_transient(e: &ClientError) -> bool {
    match e {
        ClientError::Http { error, .. } => {
            error.is_connect() || error.is_timeout() || error.is_request()
        }
        ClientError::Status { status, .. } => is_transient_status(*status),
        _ => false,
    }
}

impl Client {
    /// A builder for the server at `url` (with or without the trailing `/v1`). Defaults: 600 s
    /// timeout, 10 s connect timeout, 3 retries, no bound on requests in flight.
    pub fn builder(url: &str) -> ClientBuilder {
        ClientBuilder {
            base: normalize_base_url(url),
            api_key: None,
            timeout: Duration::from_secs(600),
            connect_timeout: Duration::from_secs(10),
            retries: 3,
            max_in_flight: None,
        }
    }

    /// A client with the defaults of [`Client::builder`].
    pub fn new(url: &str) -> Result<Self> {
        Self::builder(url).build()
    }

    /// The `/v1` base URL.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    fn url(&self, path: &str) -> String {
        format!("{}/{}", self.base, path.trim_start_matches('/'))
    }

    async fn permit(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        match &self.limit {
            // The semaphore is never closed, so acquiring cannot fail.
            Some(s) => s.clone().acquire_owned().await.ok(),
            None => None,
        }
    }

    /// Runs `attempt` until it succeeds, fails for good, or the retries are spent.
    async fn with_retries<T, F, Fut>(&self, mut attempt: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let mut tries = 0;
        loop {
            match attempt().await {
                Err(e) if tries < self.retries && is_transient(&e) => {
                    let backoff = Duration::from_millis(250u64 << tries.min(6));
                    tokio::time::sleep(backoff).await;
                    tries += 1;
                }
                other => return other,
            }
        }
    }

    fn request(&self, method: reqwest::Method, url: &str) -> reqwest::RequestBuilder {
        let rb = self.http.request(method, url);
        match &self.api_key {
            Some(key) => rb.bearer_auth(key),
            None => rb,
        }
    }

    async fn check(url: &str, resp: reqwest::Response) -> Result<reqwest::Response> {
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let body = resp.text().await.unwrap_or_default();
        Err(ClientError::Status {
            url: url.to_string(),
            status: status.as_u16(),
            message: error_message(&body),
        })
    }

    async fn get_json<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<T> {
        let url = self.url(path);
        let _permit = self.permit().await;
        self.with_retries(|| async {
            let http = |error| ClientError::Http {
                url: url.clone(),
                error,
            };
            let resp = self
                .request(reqwest::Method::GET, &url)
                .timeout(self.timeout)
                .send()
                .await
                .map_err(http)?;
            let body = Self::check(&url, resp).await?.text().await.map_err(http)?;
            serde_json::from_str(&body)
                .map_err(|e| ClientError::response(&url, "(body)", e.to_string()))
        })
        .await
    }

    async fn post_json<B: serde::Serialize, T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T> {
        let url = self.url(path);
        let _permit = self.permit().await;
        self.with_retries(|| async {
            let http = |error| ClientError::Http {
                url: url.clone(),
                error,
            };
            let resp = self
                .request(reqwest::Method::POST, &url)
                .timeout(self.timeout)
                .json(body)
                .send()
                .await
                .map_err(http)?;
            let text = Self::check(&url, resp).await?.text().await.map_err(http)?;
            serde_json::from_str(&text)
                .map_err(|e| ClientError::response(&url, "(body)", e.to_string()))
        })
        .await
    }

    /// `GET /v1/models`.
    pub async fn models(&self) -> Result<ModelList> {
        self.get_json("models").await
    }

    /// `POST /v1/completions`, not streamed (`stream` is forced off).
    pub async fn completion(&self, request: &CompletionRequest) -> Result<CompletionResponse> {
        let mut request = request.clone();
        request.stream = None;
        request.stream_options = None;
        self.post_json("completions", &request).await
    }

    /// `POST /v1/completions` streamed (`stream: true`, `stream_options.include_usage: true`),
    /// timing each chunk's arrival from the moment the request is sent.
    pub async fn completion_stream(
        &self,
        request: &CompletionRequest,
    ) -> Result<StreamedCompletion> {
        let mut request = request.clone();
        request.stream = Some(true);
        request.stream_options = Some(StreamOptions {
            include_usage: Some(true),
        });
        let url = self.url("completions");
        let _permit = self.permit().await;
        let (sent, resp) = self
            .with_retries(|| async {
                let sent = Instant::now();
                let resp = self
                    .request(reqwest::Method::POST, &url)
                    .json(&request)
                    .send()
                    .await
                    .map_err(|error| ClientError::Http {
                        url: url.clone(),
                        error,
                    })?;
                Ok((sent, Self::check(&url, resp).await?))
            })
            .await?;
        let mut out = StreamedCompletion {
            chunks: Vec::new(),
            usage: None,
            finish_reason: None,
            total: Duration::ZERO,
        };
        let mut parser = SseParser::new();
        let mut body = resp.bytes_stream();
        let mut done = false;
        while let Some(piece) = body.next().await {
            let piece = piece.map_err(|error| ClientError::Http {
                url: url.clone(),
                error,
            })?;
            let at = sent.elapsed();
            for event in parser.push(&piece) {
                done |= Self::take_event(&url, &event.data, at, &mut out)?;
            }
        }
        if let Some(event) = parser.finish() {
            done |= Self::take_event(&url, &event.data, sent.elapsed(), &mut out)?;
        }
        out.total = sent.elapsed();
        if !done && out.chunks.is_empty() && out.usage.is_none() {
            return Err(ClientError::Stream {
                url,
                message: "the stream ended without any event".into(),
            });
        }
        Ok(out)
    }

    /// Folds one SSE event into `out`; true for the `[DONE]` sentinel.
    fn take_event(
        url: &str,
        data: &str,
        at: Duration,
        out: &mut StreamedCompletion,
    ) -> Result<bool> {
        let data = data.trim();
        if data == "[DONE]" {
            return Ok(true);
        }
        let value: serde_json::Value =
            serde_json::from_str(data).map_err(|e| ClientError::Stream {
                url: url.to_string(),
                message: format!(
                    "event is not JSON ({e}): {}",
                    data.chars().take(200).collect::<String>()
                ),
            })?;
        if let Some(err) = value.get("error") {
            return Err(ClientError::Stream {
                url: url.to_string(),
                message: format!(
                    "server error in stream: {}",
                    error_message(&err.to_string())
                ),
            });
        }
        let chunk: CompletionChunk = serde_json::from_value(value)
            .map_err(|e| ClientError::response(url, "choices", e.to_string()))?;
        for choice in chunk.choices {
            if choice.finish_reason.is_some() {
                out.finish_reason = choice.finish_reason;
            }
            out.chunks.push(StreamChunk {
                at,
                text: choice.text,
            });
        }
        if chunk.usage.is_some() {
            out.usage = chunk.usage;
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_are_normalised_to_v1() {
        for u in [
            "http://h:8000",
            "http://h:8000/",
            "http://h:8000/v1",
            "http://h:8000/v1/",
        ] {
            assert_eq!(normalize_base_url(u), "http://h:8000/v1");
        }
    }

    #[test]
    fn error_messages_are_extracted_from_common_shapes() {
        assert_eq!(
            error_message(r#"{"error":{"message":"bad model","type":"x"}}"#),
            "bad model"
        );
        assert_eq!(
            error_message(r#"{"object":"error","message":"too long"}"#),
            "too long"
        );
        assert_eq!(error_message(r#"{"detail":"Not Found"}"#), "Not Found");
        assert_eq!(error_message("plain"), "plain");
    }
}
