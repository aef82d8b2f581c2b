//! Bounded loopback load: 64 concurrent clients, each sending a fixed number of requests (plain
//! and streamed completions, streamed and plain chat, echo with prompt logprobs), get zero errors
//! (every response 200 and well formed, every stream ending in `[DONE]` with its usage chunk
//! where asked for); afterwards `/metrics` shows nothing running or waiting and exactly the
//! requests sent; and the process's memory is flat: its RSS after a measured set of rounds is
//! within a fixed bound of its RSS after an identical warm-up round.
//!
//! The server runs in this process (one test in this file, so nothing else shares the process),
//! which is why this process's RSS is the server's.

mod common;

use std::time::{Duration, Instant};

use common::{metric_value, parse_sse, TestServer};
use serde_json::{json, Value};

/// Concurrent clients.
const CLIENTS: usize = 64;
/// Requests each client sends per round, one after another.
const PER_CLIENT: usize = 4;
/// Measured rounds after the warm-up round (`FP4FORGE_LOAD_ROUNDS` overrides it, to watch
/// memory over a longer run).
const MEASURED_ROUNDS: usize = 3;
/// Tokens generated per request (small: the test runs in debug builds on two cores).
const MAX_TOKENS: usize = 3;
/// Allowed RSS growth over the measured rounds, MiB (see `memory_is_flat` below).
const RSS_GROWTH_BOUND_MIB: f64 = 16.0;
/// The prefix cache's budget in this test, bytes.
const PREFIX_CACHE_BYTES: usize = 1 << 20;

const PROMPTS: [&str; 8] = [
    "The quick brown fox",
    "Paris is the capital of France; Berlin is the capital of",
    "One, two, three, four",
    "Hello world! How are you today?",
    "What is the answer? The answer is",
    "Water boils at one hundred degrees. The sun is a star and the moon",
    "Cats and dogs",
    "We test the batching of many requests together, and every answer must be",
];

/// The kinds of request in the mix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    /// `/v1/completions`, not streamed.
    Completion,
    /// `/v1/completions`, streamed, with `stream_options.include_usage`.
    CompletionStream,
    /// `/v1/completions` with `echo` and `logprobs` (prompt and generated tokens scored).
    Echo,
    /// `/v1/chat/completions`, streamed, with `stream_options.include_usage`.
    ChatStream,
    /// `/v1/chat/completions`, streamed, without usage.
    ChatStreamNoUsage,
    /// `/v1/chat/completions`, not streamed, with `logprobs` and `top_logprobs`.
    ChatLogprobs,
}

/// The mix: of every eight requests, two plain completions, one streamed completion, one echo,
/// three streamed chats (one without usage) and one plain chat with logprobs.
const MIX: [Kind; 8] = [
    Kind::Completion,
    Kind::ChatStream,
    Kind::CompletionStream,
    Kind::ChatStream,
    Kind::Echo,
    Kind::Completion,
    Kind::ChatStreamNoUsage,
    Kind::ChatLogprobs,
];

impl Kind {
    fn path(self) -> &'static str {
        match self {
            Kind::Completion | Kind::CompletionStream | Kind::Echo => "/v1/completions",
            Kind::ChatStream | Kind::ChatStreamNoUsage | Kind::ChatLogprobs => {
                "/v1/chat/completions"
            }
        }
    }

    fn streamed(self) -> bool {
        matches!(
            self,
            Kind::CompletionStream | Kind::ChatStream | Kind::ChatStreamNoUsage
        )
    }

    fn body(self, prompt: &str) -> Value {
        let mut b = match self.path() {
            "/v1/completions" => json!({"prompt": prompt}),
            _ => json!({"messages": [{"role": "user", "content": prompt}]}),
        };
        b["max_tokens"] = json!(MAX_TOKENS);
        b["temperature"] = json!(0);
        b["ignore_eos"] = json!(true);
        match self {
            Kind::Completion => {}
            Kind::CompletionStream | Kind::ChatStream => {
                b["stream"] = json!(true);
                b["stream_options"] = json!({"include_usage": true});
            }
            Kind::ChatStreamNoUsage => b["stream"] = json!(true),
            Kind::Echo => {
                b["echo"] = json!(true);
                b["logprobs"] = json!(2);
            }
            Kind::ChatLogprobs => {
                b["logprobs"] = json!(true);
                b["top_logprobs"] = json!(2);
            }
        }
        b
    }
}

/// Sends one request and checks its response; `Err` says what was wrong.
async fn one(client: &reqwest::Client, base: &str, kind: Kind, prompt: &str) -> Result<(), String> {
    let r = client
        .post(format!("{base}{}", kind.path()))
        .header("content-type", "application/json")
        .body(kind.body(prompt).to_string())
        .send()
        .await
        .map_err(|e| format!("send: {e}"))?;
    let status = r.status().as_u16();
    let content_type = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let text = r.text().await.map_err(|e| format!("read: {e}"))?;
    if status != 200 {
        return Err(format!("status {status}: {text}"));
    }
    let check = |ok: bool, what: &str| {
        if ok {
            Ok(())
        } else {
            Err(format!("{what}: {text}"))
        }
    };
    if kind.streamed() {
        check(content_type == "text/event-stream", "content type")?;
        let events = std::panic::catch_unwind(|| parse_sse(&text))
            .map_err(|_| format!("malformed event stream: {text}"))?;
        check(
            events.last().is_some_and(|e| e == "[DONE]"),
            "no final [DONE]",
        )?;
        let chunks = &events[..events.len() - 1];
        let usage: Vec<&Value> = chunks
            .iter()
            .filter(|e| e.get("usage").is_some_and(|u| !u.is_null()))
            .collect();
        let finishes = chunks
            .iter()
            .flat_map(|e| e["choices"].as_array().into_iter().flatten())
            .filter(|c| c["finish_reason"] == "length")
            .count();
        check(finishes == 1, "one choice finished by length")?;
        let pieces = chunks
            .iter()
            .flat_map(|e| e["choices"].as_array().into_iter().flatten())
            .filter(|c| {
                c["text"].as_str().is_some_and(|t| !t.is_empty())
                    || c["delta"]["content"]
                        .as_str()
                        .is_some_and(|t| !t.is_empty())
            })
            .count();
        check(
            (1..=MAX_TOKENS).contains(&pieces),
            "between 1 and max_tokens text chunks",
        )?;
        if kind == Kind::ChatStreamNoUsage {
            check(usage.is_empty(), "a usage chunk nobody asked for")?;
        } else {
            check(usage.len() == 1, "exactly one usage chunk")?;
            check(
                std::ptr::eq(usage[0], &chunks[chunks.len() - 1]),
                "the usage chunk comes last before [DONE]",
            )?;
            check(
                usage[0]["usage"]["completion_tokens"] == MAX_TOKENS,
                "usage counts max_tokens",
            )?;
        }
        if kind == Kind::ChatStream || kind == Kind::ChatStreamNoUsage {
            check(
                chunks[0]["object"] == "chat.completion.chunk"
                    && chunks[0]["choices"][0]["delta"]["role"] == "assistant",
                "the first chunk gives the role",
            )?;
        }
        return Ok(());
    }
    check(content_type.starts_with("application/json"), "content type")?;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("{e}: {text}"))?;
    check(
        v["usage"]["completion_tokens"] == MAX_TOKENS,
        "usage counts max_tokens",
    )?;
    let choice = &v["choices"][0];
    check(choice["finish_reason"] == "length", "finished by length")?;
    match kind {
        Kind::Completion => {
            check(v["object"] == "text_completion", "object")?;
            check(choice["text"].is_string(), "text")?;
        }
        Kind::Echo => {
            check(
                choice["text"]
                    .as_str()
                    .is_some_and(|t| t.starts_with(prompt)),
                "echo starts with the prompt",
            )?;
            let lp = &choice["logprobs"];
            let prompt_tokens = v["usage"]["prompt_tokens"].as_u64().unwrap_or(0) as usize;
            let tokens = lp["tokens"].as_array().map_or(0, |a| a.len());
            check(
                tokens == prompt_tokens + MAX_TOKENS,
                "a logprob per prompt and generated token",
            )?;
            check(
                lp["token_logprobs"][0].is_null() && lp["token_logprobs"][1].is_number(),
                "the first prompt token has no logprob, the second has",
            )?;
        }
        Kind::ChatLogprobs => {
            check(v["object"] == "chat.completion", "object")?;
            let entries = choice["logprobs"]["content"]
                .as_array()
                .map_or(0, |a| a.len());
            check(entries == MAX_TOKENS, "a logprob entry per token")?;
            check(
                choice["logprobs"]["content"][0]["top_logprobs"]
                    .as_array()
                    .is_some_and(|a| a.len() == 2),
                "two top logprobs",
            )?;
        }
        _ => unreachable!(),
    }
    Ok(())
}

/// What one round sent: requests per endpoint and the errors met.
#[derive(Default)]
struct Round {
    completions: usize,
    chats: usize,
    errors: Vec<String>,
}

/// One round: [`CLIENTS`] tasks at once, each with its own connection, sending [`PER_CLIENT`]
/// requests one after another.
async fn round(base: &str, round_index: usize) -> Round {
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let base = base.to_string();
            tokio::spawn(async move {
                let client = reqwest::Client::builder()
                    .timeout(Duration::from_secs(300))
                    .build()
                    .unwrap();
                let mut out = Round::default();
                for i in 0..PER_CLIENT {
                    let n = c * PER_CLIENT + i + round_index;
                    let kind = MIX[n % MIX.len()];
                    let prompt = PROMPTS[(n / MIX.len() + c) % PROMPTS.len()];
                    match kind.path() {
                        "/v1/completions" => out.completions += 1,
                        _ => out.chats += 1,
                    }
                    if let Err(e) = one(&client, &base, kind, prompt).await {
                        out.errors
                            .push(format!("client {c} request {i} {kind:?}: {e}"));
                    }
                }
                out
            })
        })
        .collect();
    let mut total = Round::default();
    for t in tasks {
        let r = t.await.expect("client task");
        total.completions += r.completions;
        total.chats += r.chats;
        total.errors.extend(r.errors);
    }
    total
}

/// This process's resident set size, MiB (`/proc/self/statm`: pages; the page size from
/// `/proc/self/smaps`' first `KernelPageSize`, 4 KiB where that is unreadable).
fn rss_mib() -> f64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: f64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("statm's resident field");
    let page_kib: f64 = std::fs::read_to_string("/proc/self/smaps")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("KernelPageSize:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(4.0);
    pages * page_kib / 1024.0
}

/// `/metrics` as text.
async fn metrics(s: &TestServer) -> String {
    s.get_text("/metrics").await.1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_clients_zero_errors_and_flat_memory() {
    // Batch and queue admit all 64 at once (32 running + 32 waiting with the defaults would
    // do too; a 429 would be an error here, never a success).
    // The prefix cache keeps finished sequences up to its budget: a small one here, filled and
    // evicting from the warm-up round on (the default, 1 GiB, would legitimately grow through
    // every round of this test).
    let s = TestServer::start(|c| {
        c.max_batch(CLIENTS)
            .max_queue(4 * CLIENTS)
            .prefix_cache_bytes(PREFIX_CACHE_BYTES)
    })
    .await;
    let started = Instant::now();
    let rss_start = rss_mib();

    // Warm-up: the same round as the measured ones, so allocator arenas, connection buffers,
    // the tokenizer's caches and the KV caches' high-water mark are reached before measuring.
    let warm = round(&s.base, 0).await;
    assert!(
        warm.errors.is_empty(),
        "{} errors in the warm-up round, first: {:#?}",
        warm.errors.len(),
        &warm.errors[..warm.errors.len().min(5)]
    );
    let rss_warm = rss_mib();
    let warm_secs = started.elapsed().as_secs_f64();

    let mut sent = Round {
        completions: warm.completions,
        chats: warm.chats,
        errors: Vec::new(),
    };
    let rounds = std::env::var("FP4FORGE_LOAD_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(MEASURED_ROUNDS)
        .max(1);
    let mut rss_rounds = Vec::new();
    for r in 1..=rounds {
        let res = round(&s.base, r).await;
        sent.completions += res.completions;
        sent.chats += res.chats;
        sent.errors.extend(res.errors);
        rss_rounds.push(rss_mib());
    }
    let requests = sent.completions + sent.chats;
    println!(
        "{requests} requests ({CLIENTS} clients × {PER_CLIENT} × {} rounds) in {:.1} s \
         (warm-up round {warm_secs:.1} s)",
        rounds + 1,
        started.elapsed().as_secs_f64()
    );
    assert!(
        sent.errors.is_empty(),
        "{} errors, first: {:#?}",
        sent.errors.len(),
        &sent.errors[..sent.errors.len().min(5)]
    );

    // Afterwards: nothing running or waiting (the engine thread may still be retiring the last
    // sequences a moment after their final chunk went out), and exactly the requests sent, all
    // 200.
    let start = Instant::now();
    let text = loop {
        let text = metrics(&s).await;
        let running = metric_value(&text, "fp4forge_requests_running{");
        let waiting = metric_value(&text, "fp4forge_requests_waiting{");
        if running == Some(0.0) && waiting == Some(0.0) {
            break text;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "still running {running:?} / waiting {waiting:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let count = |endpoint: &str, status: u16| {
        metric_value(
            &text,
            &format!(
                "fp4forge_requests_total{{model_name=\"{}\",endpoint=\"{endpoint}\",\
                 status=\"{status}\"}}",
                s.model
            ),
        )
        .unwrap_or(0.0) as usize
    };
    assert_eq!(count("/v1/completions", 200), sent.completions);
    assert_eq!(count("/v1/chat/completions", 200), sent.chats);
    let not_ok: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("fp4forge_requests_total{") && !l.contains("status=\"200\""))
        .collect();
    assert!(not_ok.is_empty(), "non-200 responses: {not_ok:?}");
    assert_eq!(
        metric_value(&text, "fp4forge_generation_tokens_total{").unwrap_or(0.0) as usize,
        requests * MAX_TOKENS
    );
    assert_eq!(
        metric_value(&text, "fp4forge_cancelled_sequences_total{"),
        Some(0.0)
    );
    let cached = metric_value(&text, "fp4forge_prefix_cache_bytes{").unwrap_or(-1.0);
    assert!(
        cached > 0.0 && cached <= PREFIX_CACHE_BYTES as f64,
        "prefix cache holds {cached} bytes (budget {PREFIX_CACHE_BYTES})"
    );
    assert!(metric_value(&text, "fp4forge_prefix_cache_hits_total{").unwrap_or(0.0) > 0.0);

    // Memory is flat. Steady state is small: the tiny model's weights are a few MiB and a
    // sequence's KV cache 1.25 KiB a token (5 layers × 2 KV heads × 16 dims × K and V × f32), so
    // 64 sequences of ~20-40 tokens in flight hold ~3 MiB. What moves RSS between rounds without
    // a leak is the allocator: glibc's per-thread arenas fill up and keep freed pages. Measured
    // (2 cores, debug): +4.4 to +6.3 MiB over these 3 measured rounds in five runs; over 30
    // rounds (the `FP4FORGE_LOAD_ROUNDS` override) the growth saturates, +12.6 MiB in all with
    // the last rounds adding ≤ 0.1 MiB each, and `MALLOC_ARENA_MAX=1` flattens it further; a
    // leak grows by the same amount every round instead. The bound, 16 MiB over the 768 measured
    // requests, is 2.5× the largest growth seen and fails on any leak of ≥ 21 KiB a request (a
    // request's KV cache, its prompt's logprobs or its response text kept) or ≥ 5 MiB a round.
    let rss_end = *rss_rounds.last().unwrap();
    let growth = rss_end - rss_warm;
    println!(
        "RSS: {rss_start:.1} MiB at start, {rss_warm:.1} MiB after warm-up, \
         after each measured round {}; growth {growth:+.1} MiB (bound {RSS_GROWTH_BOUND_MIB} MiB)",
        rss_rounds
            .iter()
            .map(|r| format!("{r:.1}"))
            .collect::<Vec<_>>()
            .join(" / ")
    );
    assert!(
        growth < RSS_GROWTH_BOUND_MIB,
        "RSS grew {growth:.1} MiB over {rounds} rounds (bound {RSS_GROWTH_BOUND_MIB} MiB)"
    );

    // And the server still answers.
    let (st, _) = s
        .post(
            "/v1/completions",
            &json!({"prompt": "Hello", "max_tokens": 1}),
        )
        .await;
    assert_eq!(st, 200);
    s.stop().await;
}
