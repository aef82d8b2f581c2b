//! Prefix caching: requests that reuse an earlier sequence's KV cache answer exactly what a
//! server without the cache answers (prompt logprobs included), and `/metrics` counts the reuse.

mod common;

use common::TestServer;
use fp4forge_engine::{Device, KvDtype, Model, ModelOptions};
use serde_json::{json, Value};

fn argmax(row: &[f32]) -> u32 {
    (0..row.len()).fold(0, |b, i| if row[i] > row[b] { i } else { b }) as u32
}

/// Token ids `0..n` of a fixed pseudo-random prompt (no special ids).
fn prompt(seed: u32, n: usize) -> Vec<u32> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(12_345);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            30 + x % 400
        })
        .collect()
}

/// The fields of a completion that must agree between the servers.
fn answer(v: &Value) -> (Value, Value, Value, Value) {
    let c = &v["choices"][0];
    (
        c["text"].clone(),
        c["logprobs"]["tokens"].clone(),
        c["logprobs"]["token_logprobs"].clone(),
        c["logprobs"]["top_logprobs"].clone(),
    )
}

/// How far (relative to max(1, |x|)) a cached answer's logprobs may be from a fresh one's on the
/// test device: the same keys and values up to f32 summation order. The cached side runs the
/// suffix's rows through other GEMV/GEMM shapes than a whole prefill, so its sums round
/// differently: on the CPU a few ulps (1.4e-6 at a logprob of -4.03, about 3 ulps, was seen:
/// 1e-6); on the GPU a suffix of a few tokens takes other kernels than a whole prompt (the
/// one-token and few-token tensor-core GEMVs against the prefill GEMM, split-K sums), 4.3e-6 at
/// -4.12 (1.04e-6 relative, 9 ulps) was seen on an H200: 1e-5. A wrong key, value or position
/// moves logprobs by orders of magnitude more (the test's prompts have no top-N gap under 8e-4).
fn tolerance() -> f64 {
    if common::test_device() == Device::Cpu {
        1e-6
    } else {
        1e-5
    }
}

/// Asserts two answers agree: same tokens, logprobs within [`tolerance`] relative to their
/// magnitude (at least 1), the same top-N keys in the same order.
fn assert_same(what: &str, a: &Value, b: &Value) {
    let tol = tolerance();
    let (ta, ka, la, pa) = answer(a);
    let (tb, kb, lb, pb) = answer(b);
    assert_eq!(ta, tb, "{what}: text");
    assert_eq!(ka, kb, "{what}: tokens");
    let close = |x: &Value, y: &Value| match (x.as_f64(), y.as_f64()) {
        (Some(x), Some(y)) => (x - y).abs() <= tol * x.abs().max(y.abs()).max(1.0),
        _ => x == y,
    };
    let (la, lb) = (la.as_array().unwrap(), lb.as_array().unwrap());
    assert_eq!(la.len(), lb.len(), "{what}: logprob count");
    for (i, (x, y)) in la.iter().zip(lb).enumerate() {
        assert!(close(x, y), "{what}: position {i}: {x} vs {y}");
    }
    let (pa, pb) = (pa.as_array().unwrap(), pb.as_array().unwrap());
    for (i, (x, y)) in pa.iter().zip(pb).enumerate() {
        match (x.as_object(), y.as_object()) {
            (Some(x), Some(y)) => {
                assert_eq!(
                    x.keys().collect::<Vec<_>>(),
                    y.keys().collect::<Vec<_>>(),
                    "{what}: top tokens at {i}: {x:?} vs {y:?}"
                );
                for (k, v) in x {
                    assert!(close(v, &y[k]), "{what}: top {k} at {i}: {v} vs {}", y[k]);
                }
            }
            _ => assert_eq!(x, y, "{what}: top at {i}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reused_prefixes_answer_exactly_like_fresh_prefills() {
    let cached = TestServer::start(|c| c).await;
    let fresh = TestServer::start(|c| c.prefix_cache_bytes(0)).await;
    let hits = "fp4forge_prefix_cache_hits_total{";
    let reused = "fp4forge_prefix_cache_reused_tokens_total{";

    // 1. Scoring (echo + prompt logprobs) of prompts sharing 11 of their 14 tokens, shorter than
    //    the tiny model's sliding window (16), so a cached sequence can be cut back.
    let base = prompt(1, 14);
    let mut other = base[..11].to_vec();
    other.extend([401, 402, 403]);
    let score = |ids: &[u32], top: usize| json!({"prompt": ids, "max_tokens": 0, "echo": true, "logprobs": top});
    let mut answers = Vec::new();
    for s in [&cached, &fresh] {
        let (st, first) = s.post("/v1/completions", &score(&base, 5)).await;
        assert_eq!(st, 200, "{first}");
        let (st, second) = s.post("/v1/completions", &score(&other, 3)).await;
        assert_eq!(st, 200, "{second}");
        answers.push(second);
    }
    assert_same("scoring a shared prefix", &answers[0], &answers[1]);
    assert_eq!(cached.metric(hits).await, 1.0);
    // positions 0..=10 are shared, 1..=10 keep their logprobs: 10 tokens reused
    assert_eq!(cached.metric(reused).await, 10.0);
    // ... and reported as vLLM reports them; `null` without a cache
    let details = |v: &Value| v["usage"]["prompt_tokens_details"].clone();
    assert_eq!(details(&answers[0]), json!({"cached_tokens": 10}));
    assert_eq!(details(&answers[1]), Value::Null);
    assert!(answers[1]["usage"]
        .as_object()
        .unwrap()
        .contains_key("prompt_tokens_details"));
    assert_eq!(fresh.metric(hits).await, 0.0);
    // The first request's entry stays after serving the second: it serves `other` again, now
    // with 5 alternatives (the second request's entry kept only 3).
    let (_, a) = cached.post("/v1/completions", &score(&other, 5)).await;
    let (_, b) = fresh.post("/v1/completions", &score(&other, 5)).await;
    assert_same("a prefix served twice", &a, &b);
    assert_eq!(cached.metric(hits).await, 2.0);
    assert_eq!(cached.metric(reused).await, 20.0);
    // No entry kept 7 alternatives: recomputed, still exact.
    let (_, a) = cached.post("/v1/completions", &score(&other, 7)).await;
    let (_, b) = fresh.post("/v1/completions", &score(&other, 7)).await;
    assert_same("more alternatives than cached", &a, &b);
    assert_eq!(cached.metric(hits).await, 2.0);
    // ... but one with 5 serves a request for 1: the whole shared prompt but its last token
    let (_, a) = cached.post("/v1/completions", &score(&base, 1)).await;
    let (_, b) = fresh.post("/v1/completions", &score(&base, 1)).await;
    assert_same("fewer alternatives than cached", &a, &b);
    assert_eq!(cached.metric(hits).await, 3.0);
    assert_eq!(cached.metric(reused).await, 33.0);
    // Each finished `other` replaced the entry it repeats with fewer alternatives: left are
    // `base` with 5 and with 1, `other` with 7.
    // (a response can reach the client before its session reaches the cache)
    let entries = "fp4forge_prefix_cache_entries{";
    for _ in 0..100 {
        if cached.metric(entries).await == 3.0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(cached.metric(entries).await, 3.0);

    // 2. Greedy generation from a reused prefix.
    let mut gen_prompt = base[..9].to_vec();
    gen_prompt.extend([77, 78]);
    let generate = |ids: &[u32]| {
        json!({"prompt": ids, "max_tokens": 6, "temperature": 0, "ignore_eos": true,
               "logprobs": 2})
    };
    let (_, a) = cached.post("/v1/completions", &generate(&gen_prompt)).await;
    let (_, b) = fresh.post("/v1/completions", &generate(&gen_prompt)).await;
    assert_same("generation after a reused prefix", &a, &b);
    assert_eq!(details(&a), json!({"cached_tokens": 9}));

    // Summed over the prompts of a request (each once, whatever `n`), streamed usage too; a
    // prompt that misses counts 0.
    let two = json!({"prompt": [&gen_prompt, &prompt(9, 5)], "max_tokens": 2, "n": 2,
                     "temperature": 0, "ignore_eos": true, "stream": true,
                     "stream_options": {"include_usage": true}});
    let events = cached.stream("/v1/completions", &two).await;
    let usage = events
        .iter()
        .find_map(|e| e.get("usage").filter(|u| !u.is_null()))
        .expect("a usage chunk");
    assert_eq!(usage["prompt_tokens_details"], json!({"cached_tokens": 10}));

    // 3. A conversation's next turn: past the window the ring has wrapped, so only a prompt
    //    that extends the whole cached sequence (prompt + generated tokens fed back) reuses it.
    let turn1 = prompt(2, 40);
    let (_, t1) = cached.post("/v1/completions", &generate(&turn1)).await;
    let (_, t1_fresh) = fresh.post("/v1/completions", &generate(&turn1)).await;
    assert_same("first turn", &t1, &t1_fresh);
    // the generated ids: greedy decoding of the same model by the engine (f32 cache too)
    let model = Model::load(&cached.dir, ModelOptions::new().kv_dtype(KvDtype::F32)).unwrap();
    let mut session = model.new_session().unwrap();
    let mut logits = session.prefill(&turn1).unwrap();
    let mut ids = Vec::new();
    for _ in 0..6 {
        let next = argmax(&logits);
        ids.push(next);
        logits = session.step(next).unwrap();
    }
    let text: String = t1["choices"][0]["logprobs"]["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(text, t1["choices"][0]["text"].as_str().unwrap());
    let mut turn2 = turn1.clone();
    turn2.extend(&ids);
    turn2.extend([300, 301, 302]);
    let before = (cached.metric(hits).await, cached.metric(reused).await);
    let (_, a) = cached.post("/v1/completions", &generate(&turn2)).await;
    let (_, b) = fresh.post("/v1/completions", &generate(&turn2)).await;
    assert_same("second turn", &a, &b);
    let after = (cached.metric(hits).await, cached.metric(reused).await);
    // the session held the prompt and the first 5 generated tokens (the 6th was never fed)
    assert_eq!(after.0, before.0 + 1.0, "the second turn reuses the first");
    assert_eq!(after.1 - before.1, (turn1.len() + 5) as f64);
    // Prompt logprobs over a wrapped sequence need a cut-back: not reusable, still exact.
    let (_, a) = cached.post("/v1/completions", &score(&turn2, 2)).await;
    let (_, b) = fresh.post("/v1/completions", &score(&turn2, 2)).await;
    assert_same("scoring past the window", &a, &b);

    let (_, text) = cached.get_text("/metrics").await;
    assert!(common::metric_value(&text, "fp4forge_prefix_cache_entries{").unwrap() >= 1.0);
    assert!(common::metric_value(&text, "fp4forge_prefix_cache_bytes{").unwrap() > 0.0);
    cached.stop().await;
    fresh.stop().await;
}
