//! A tiny deterministic OpenAI-compatible server for tests, on 127.0.0.1:0.
//!
//! Tokenization: text splits into tokens that each hold leading whitespace plus one run of
//! non-whitespace (`" cat"`); token ids `n` render as `" w{n}"`. A token's logprob depends only
//! on its text and the server's style (see [`logprob`]); its top-3 list covers the whole (mock)
//! distribution: the token itself and two alternatives splitting the rest of the mass.
//! Generation: prompts containing `Question:` get `" The answer is N."` with N the last number of
//! the last question (then `"\n\nQuestion: next"`, to exercise stops); others get `" tok"` ×
//! `max_tokens`, streamed with a fixed delay per token.
#![allow(dead_code)]

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

/// Server behaviour.
#[derive(Debug, Clone)]
pub struct MockConfig {
    /// Served model name.
    pub model: String,
    /// 0 or 1: which logprob formula.
    pub style: u8,
    /// Echo a `<s>` token before the prompt (and count it in usage).
    pub bos: bool,
    /// Answer 400 to `max_tokens: 0`.
    pub refuse_zero: bool,
    /// Delay before each streamed token.
    pub delay: Duration,
    /// Answer 503 to the first N completion requests.
    pub fail_first: usize,
}

impl Default for MockConfig {
    fn default() -> Self {
        Self {
            model: "mock".into(),
            style: 0,
            bos: false,
            refuse_zero: false,
            delay: Duration::from_millis(2),
            fail_first: 0,
        }
    }
}

/// What the server saw.
#[derive(Debug, Default)]
pub struct Seen {
    /// Completion requests received (including refused ones).
    pub requests: AtomicUsize,
    /// Bodies of the completion requests.
    pub bodies: Mutex<Vec<Value>>,
}

struct Mock {
    config: MockConfig,
    seen: Arc<Seen>,
}

/// Splits text into mock tokens (leading whitespace + a run of non-whitespace; trailing
/// whitespace alone is a token).
pub fn tokenize(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    for c in text.chars() {
        if c.is_whitespace() && in_word {
            out.push(std::mem::take(&mut cur));
            in_word = false;
        }
        if !c.is_whitespace() {
            in_word = true;
        }
        cur.push(c);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// The logprob of a token under a style.
pub fn logprob(style: u8, token: &str) -> f64 {
    let n = token.chars().count() as f64;
    match style {
        0 => -(1.0 + 0.1 * n),
        _ => -(0.2 + 0.3 * (n % 4.0)),
    }
}

/// The full mock distribution at a position whose actual token is `token`.
pub fn distribution(style: u8, token: &str) -> Vec<(String, f64)> {
    let lp = logprob(style, token);
    let rest = 1.0 - lp.exp();
    let split = if style == 0 { 0.75 } else { 0.6 };
    vec![
        (token.to_string(), lp),
        ("<alt1>".into(), (rest * split).ln()),
        ("<alt2>".into(), (rest * (1.0 - split)).ln()),
    ]
}

fn err(status: StatusCode, message: &str) -> Response {
    (
        status,
        Json(json!({"error": {"message": message, "type": "invalid_request_error"}})),
    )
        .into_response()
}

fn gsm_answer(prompt: &str) -> String {
    let last_q = prompt.rsplit("Question:").next().unwrap_or("");
    let n = last_q
        .split(|c: char| !c.is_ascii_digit())
        .rfind(|s| !s.is_empty())
        .unwrap_or("0");
    format!(" The answer is {n}.\n\nQuestion: what next?")
}

async fn models(State(m): State<Arc<Mock>>) -> Json<Value> {
    Json(
        json!({"object": "list", "data": [{"id": m.config.model, "object": "model", "max_model_len": 4096}]}),
    )
}

async fn completions(State(m): State<Arc<Mock>>, Json(body): Json<Value>) -> Response {
    let k = m.seen.requests.fetch_add(1, Ordering::SeqCst);
    m.seen.bodies.lock().unwrap().push(body.clone());
    if k < m.config.fail_first {
        return err(StatusCode::SERVICE_UNAVAILABLE, "warming up");
    }
    let cfg = &m.config;
    if body["model"] != json!(cfg.model) {
        return err(
            StatusCode::NOT_FOUND,
            &format!("The model `{}` does not exist.", body["model"]),
        );
    }
    let Some(max_tokens) = body["max_tokens"].as_u64() else {
        return err(StatusCode::BAD_REQUEST, "max_tokens must be an integer");
    };
    if max_tokens == 0 && cfg.refuse_zero {
        return err(StatusCode::BAD_REQUEST, "max_tokens must be at least 1");
    }
    let echo = body["echo"].as_bool().unwrap_or(false);
    let top_n = body["logprobs"].as_u64();
    let (prompt_text, mut tokens): (String, Vec<String>) = match &body["prompt"] {
        Value::String(s) => (s.clone(), tokenize(s)),
        Value::Array(ids) => {
            let toks: Vec<String> = ids
                .iter()
                .map(|i| format!(" w{}", i.as_u64().unwrap_or(0)))
                .collect();
            (toks.concat(), toks)
        }
        _ => {
            return err(
                StatusCode::BAD_REQUEST,
                "prompt must be a string or token ids",
            )
        }
    };
    if cfg.bos {
        tokens.insert(0, "<s>".into());
    }
    let prompt_tokens = tokens.len() as u64;

    // generated tokens
    let stop: Vec<String> = body["stop"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    let mut gen_tokens: Vec<String> = if prompt_text.contains("Question:") {
        tokenize(&gsm_answer(&prompt_text))
    } else {
        vec![" tok".to_string(); max_tokens as usize]
    };
    gen_tokens.truncate(max_tokens as usize);
    let mut finish = "length";
    let full: String = gen_tokens.concat();
    let mut gen_text = full.clone();
    for s in &stop {
        if let Some(i) = gen_text.find(s.as_str()) {
            gen_text.truncate(i);
            finish = "stop";
        }
    }
    let completion_tokens = if finish == "stop" {
        tokenize(&gen_text).len() as u64
    } else {
        gen_tokens.len() as u64
    };
    let usage = json!({"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                       "total_tokens": prompt_tokens + completion_tokens});

    if body["stream"].as_bool().unwrap_or(false) {
        let include_usage = body["stream_options"]["include_usage"]
            .as_bool()
            .unwrap_or(false);
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
        let delay = cfg.delay;
        let n = gen_tokens.len();
        tokio::spawn(async move {
            for (i, t) in gen_tokens.into_iter().enumerate() {
                tokio::time::sleep(delay).await;
                let fin = if i + 1 == n {
                    json!("length")
                } else {
                    Value::Null
                };
                let chunk = json!({"id": "cmpl-mock", "object": "text_completion",
                    "choices": [{"index": 0, "text": t, "logprobs": null, "finish_reason": fin}]});
                if tx
                    .send(Bytes::from(format!("data: {chunk}\n\n")))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            if include_usage {
                let chunk = json!({"id": "cmpl-mock", "choices": [], "usage": usage});
                let _ = tx.send(Bytes::from(format!("data: {chunk}\n\n"))).await;
            }
            let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
        });
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
        });
        return Response::builder()
            .header("content-type", "text/event-stream")
            .body(Body::from_stream(stream))
            .unwrap();
    }

    let mut logprobs = Value::Null;
    let mut text = gen_text.clone();
    if let Some(n) = top_n {
        let mut all: Vec<String> = if echo { tokens.clone() } else { Vec::new() };
        all.extend(
            tokenize(&gen_text)
                .into_iter()
                .take(completion_tokens as usize),
        );
        let mut offsets = Vec::new();
        let mut off = 0;
        for t in &all {
            offsets.push(off);
            off += t.chars().count();
        }
        let lps: Vec<Value> = all
            .iter()
            .enumerate()
            .map(|(i, t)| {
                if i == 0 && echo {
                    Value::Null
                } else {
                    json!(logprob(cfg.style, t))
                }
            })
            .collect();
        let tops: Vec<Value> = all
            .iter()
            .enumerate()
            .map(|(i, t)| {
                if i == 0 && echo {
                    Value::Null
                } else {
                    let mut m = serde_json::Map::new();
                    for (tok, lp) in distribution(cfg.style, t).into_iter().take(n as usize) {
                        m.insert(tok, json!(lp));
                    }
                    Value::Object(m)
                }
            })
            .collect();
        logprobs = json!({"tokens": all, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets});
    }
    if echo {
        let bos = if cfg.bos { "<s>" } else { "" };
        text = format!("{bos}{prompt_text}{gen_text}");
    }
    Json(json!({
        "id": "cmpl-mock", "object": "text_completion", "model": cfg.model,
        "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}],
        "usage": usage,
    }))
    .into_response()
}

/// A running mock server.
pub struct Server {
    /// Base URL (`http://127.0.0.1:PORT`, without `/v1`).
    pub url: String,
    /// What it saw.
    pub seen: Arc<Seen>,
}

/// Starts a mock on an ephemeral loopback port (runs until the test's runtime ends).
pub async fn start(config: MockConfig) -> Server {
    let seen = Arc::new(Seen::default());
    let state = Arc::new(Mock {
        config,
        seen: Arc::clone(&seen),
    });
    let app = Router::new()
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // as uvicorn (vLLM) does: without TCP_NODELAY, Nagle + delayed ACKs bunch streamed chunks
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    Server {
        url: format!("http://{addr}"),
        seen,
    }
}
