//! Continuous batching under load: many clients at once get exactly their single-client greedy
//! answers (and the engine really batched them: fewer forward passes than tokens), a client
//! that disconnects mid-stream frees its sequence, a full queue answers 429, and a shutdown lets
//! the requests in flight finish before the server stops.

mod common;

use std::time::{Duration, Instant};

use common::{client, parse_sse, TestServer};
use futures_util::StreamExt;
use serde_json::{json, Value};

const PROMPTS: [&str; 16] = [
    "The quick brown fox",
    "A model reads the text",
    "Paris is the capital of",
    "Berlin is",
    "One, two, three, four",
    "Hello world!",
    "How are you today?",
    "What is the answer?",
    "Water boils at",
    "The sun is a star",
    "We test the batching",
    "Cats and dogs",
    "every answer must be",
    "the client prints it",
    "seven, eight",
    "Rome",
];

fn request(prompt: &str, tokens: usize, stream: bool) -> Value {
    json!({"prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": true,
           "stream": stream})
}

/// The completions of `prompts` (`tokens` each, greedy) requested all at once, half streamed
/// and half plain, each answered 200.
async fn all_at_once(s: &TestServer, prompts: &[&str], tokens: usize) -> Vec<String> {
    let calls = prompts.iter().enumerate().map(|(i, p)| {
        let body = request(p, tokens, i % 2 == 0);
        let url = s.url("/v1/completions");
        async move {
            let r = client()
                .post(url)
                .body(body.to_string())
                .send()
                .await
                .unwrap();
            assert_eq!(r.status().as_u16(), 200);
            let text = r.text().await.unwrap();
            if i % 2 == 0 {
                parse_sse(&text)
                    .iter()
                    .filter_map(|e| e.get("choices"))
                    .flat_map(|c| c.as_array().unwrap().iter())
                    .map(|c| c["text"].as_str().unwrap().to_string())
                    .collect::<String>()
            } else {
                let v: Value = serde_json::from_str(&text).unwrap();
                v["choices"][0]["text"].as_str().unwrap().to_string()
            }
        }
    });
    let together = futures_util::future::join_all(calls).await;
    together
}

async fn wait_until(what: &str, mut ok: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while !ok().await {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out waiting: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kv_memory_cap_preempts_and_every_client_still_gets_its_single_client_answer() {
    // Eight clients whose KV caches together need about three times the cap: the scheduler
    // admits what fits, preempts the latest admitted when a step needs more than is left,
    // and recomputes their caches later; every answer is the one the client gets alone.
    let tokens = 40;
    let prompts = &PROMPTS[..8];
    let free = TestServer::start(|c| c.max_batch(8).prefix_cache_bytes(0)).await;
    let mut alone = Vec::new();
    for p in prompts {
        let (st, v) = free
            .post("/v1/completions", &request(p, tokens, false))
            .await;
        assert_eq!(st, 200);
        alone.push(v["choices"][0]["text"].as_str().unwrap().to_string());
    }
    free.stop().await;
    // one sequence's KV bytes: what a finished one leaves in the prefix cache
    let probe = TestServer::start(|c| c.max_batch(8)).await;
    let longest = prompts.iter().max_by_key(|p| p.len()).unwrap();
    let (st, _) = probe
        .post("/v1/completions", &request(longest, tokens, false))
        .await;
    assert_eq!(st, 200);
    let one = probe.metric("fp4forge_kv_cache_used_bytes{").await as usize;
    assert!(one > 0, "the prefix cache holds the finished sequence's KV");
    probe.stop().await;

    let cap = one * 5 / 2;
    let s = TestServer::start(|c| {
        c.max_batch(8)
            .prefix_cache_bytes(0)
            .kv_cache_memory(Some(cap))
    })
    .await;
    assert_eq!(
        s.metric("fp4forge_kv_cache_capacity_bytes{").await as usize,
        cap
    );
    let together = all_at_once(&s, prompts, tokens).await;
    for (i, (a, b)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(a, b, "prompt {i} {:?}", prompts[i]);
    }
    let preempted = s.metric("fp4forge_num_preemptions_total{").await;
    println!("{preempted} preemptions under a cap of {cap} bytes ({one} per sequence)");
    assert!(preempted > 0.0, "the cap never made the scheduler preempt");
    assert_eq!(s.metric("fp4forge_kv_cache_used_bytes{").await, 0.0);
    assert_eq!(s.metric("fp4forge_requests_running{").await, 0.0);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_clients_at_once_get_their_single_client_answers() {
    let s = TestServer::start(|c| c.max_batch(16)).await;
    let tokens = 24;
    let mut alone = Vec::new();
    for p in PROMPTS {
        let (st, v) = s.post("/v1/completions", &request(p, tokens, false)).await;
        assert_eq!(st, 200);
        alone.push(v["choices"][0]["text"].as_str().unwrap().to_string());
    }
    let steps_before = s.metric("fp4forge_engine_steps_total{").await;

    let together = all_at_once(&s, &PROMPTS, tokens).await;
    for (i, (a, b)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(a, b, "prompt {i} {:?}", PROMPTS[i]);
    }
    // Batched: far fewer forward passes than the 16 × 24 tokens generated.
    let steps = s.metric("fp4forge_engine_steps_total{").await - steps_before;
    let generated = (PROMPTS.len() * tokens) as f64;
    println!("{generated} tokens in {steps} engine steps");
    assert!(
        steps < generated / 2.0,
        "{steps} steps for {generated} tokens"
    );
    assert_eq!(s.metric("fp4forge_requests_running{").await, 0.0);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_frees_its_sequence() {
    let s = TestServer::start(|c| c).await;
    for path in ["/v1/completions", "/v1/chat/completions"] {
        let cancelled = s.metric("fp4forge_cancelled_sequences_total{").await;
        let generated = s.metric("fp4forge_generation_tokens_total{").await;
        let body = if path.contains("chat") {
            json!({"messages": [{"role": "user", "content": "Go on"}], "max_tokens": 4000,
                   "ignore_eos": true, "stream": true})
        } else {
            request("Count forever:", 4000, true)
        };
        let r = client()
            .post(s.url(path))
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        let mut stream = r.bytes_stream();
        let mut chunks = 0;
        while chunks < 3 {
            stream.next().await.unwrap().unwrap();
            chunks += 1;
        }
        drop(stream);
        wait_until("the sequence is dropped", async || {
            s.metric("fp4forge_requests_running{").await == 0.0
                && s.metric("fp4forge_cancelled_sequences_total{").await > cancelled
        })
        .await;
        let made = s.metric("fp4forge_generation_tokens_total{").await - generated;
        assert!(made < 4000.0, "{made} tokens: it ran to the end");
    }
    // A plain (not streamed) request whose client gives up is dropped too.
    let cancelled = s.metric("fp4forge_cancelled_sequences_total{").await;
    let slow = client()
        .post(s.url("/v1/completions"))
        .timeout(Duration::from_millis(300))
        .body(request("Count forever:", 4000, false).to_string())
        .send()
        .await;
    assert!(slow.is_err(), "expected the client to time out");
    wait_until("the plain request is dropped", async || {
        s.metric("fp4forge_requests_running{").await == 0.0
            && s.metric("fp4forge_cancelled_sequences_total{").await > cancelled
    })
    .await;
    // And the server goes on serving.
    let (st, _) = s.post("/v1/completions", &request("Hello", 4, false)).await;
    assert_eq!(st, 200);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_429() {
    let s = TestServer::start(|c| c.max_batch(1).max_queue(1)).await;
    // The first request holds the only batch slot; wait for its first chunk.
    let first = client()
        .post(s.url("/v1/completions"))
        .body(request("Count forever:", 4000, true).to_string())
        .send()
        .await
        .unwrap();
    let mut first = first.bytes_stream();
    first.next().await.unwrap().unwrap();
    // The second waits in the queue (its response headers come at once).
    let second = client()
        .post(s.url("/v1/completions"))
        .body(request("Count forever:", 4000, true).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(second.status().as_u16(), 200);
    wait_until("one request waits", async || {
        s.metric("fp4forge_requests_waiting{").await == 1.0
    })
    .await;
    let (st, v) = s.post("/v1/completions", &request("Hello", 4, false)).await;
    assert_eq!(st, 429, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("busy"));
    drop(first);
    drop(second);
    wait_until("both are dropped", async || {
        s.metric("fp4forge_requests_running{").await == 0.0
            && s.metric("fp4forge_requests_waiting{").await == 0.0
    })
    .await;
    let (st, _) = s.post("/v1/completions", &request("Hello", 4, false)).await;
    assert_eq!(st, 200);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_requests_in_flight() {
    let mut s = TestServer::start(|c| c).await;
    let url = s.url("/v1/completions");
    let r = client()
        .post(&url)
        .body(request("Hello world!", 300, true).to_string())
        .send()
        .await
        .unwrap();
    let mut stream = r.bytes_stream();
    let mut text = String::from_utf8(stream.next().await.unwrap().unwrap().to_vec()).unwrap();
    let stopped = s.begin_shutdown();
    while let Some(piece) = stream.next().await {
        text.push_str(std::str::from_utf8(&piece.unwrap()).unwrap());
    }
    let events = parse_sse(&text);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let finish = &events[events.len() - 2]["choices"][0]["finish_reason"];
    assert_eq!(finish, "length");
    tokio::time::timeout(Duration::from_secs(30), stopped)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    // Stopped: no more connections.
    assert!(client().get(s.url("/health")).send().await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_timeout_ends_requests_in_flight_with_abort() {
    let mut s = TestServer::start(|c| c.drain_timeout(Duration::from_millis(300))).await;
    let url = s.url("/v1/completions");
    // Far more tokens than a debug build makes in the drain timeout.
    let long = 4000;
    let r = client()
        .post(&url)
        .body(request("Hello world!", long, true).to_string())
        .send()
        .await
        .unwrap();
    let mut stream = r.bytes_stream();
    let mut text = String::from_utf8(stream.next().await.unwrap().unwrap().to_vec()).unwrap();
    let plain = tokio::spawn(
        client()
            .post(&url)
            .body(request("The sun is", long, false).to_string())
            .send(),
    );
    wait_until("both run", async || {
        s.metric("fp4forge_requests_running{").await == 2.0
    })
    .await;
    let stopped = s.begin_shutdown();
    while let Some(piece) = stream.next().await {
        text.push_str(std::str::from_utf8(&piece.unwrap()).unwrap());
    }
    let events = parse_sse(&text);
    assert_eq!(events.last().unwrap(), "[DONE]", "{text}");
    let finish = &events[events.len() - 2]["choices"][0]["finish_reason"];
    assert_eq!(finish, "abort");
    let plain = plain.await.unwrap().unwrap();
    assert_eq!(plain.status().as_u16(), 200);
    let v: Value = plain.json().await.unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "abort", "{v}");
    assert!(
        v["usage"]["completion_tokens"].as_u64().unwrap() < long as u64,
        "{v}"
    );
    tokio::time::timeout(Duration::from_secs(30), stopped)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
