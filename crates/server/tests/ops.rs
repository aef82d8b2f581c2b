//! Server operations: `/metrics` series, `/tokenize`, `/detokenize`, `/version`, CORS.

mod common;

use common::TestServer;
use serde_json::json;

/// A sequence its handler ends on a stop string finished normally: it is counted in
/// `request_success_total{finished_reason="stop"}`, not as a cancelled sequence.
#[tokio::test]
async fn a_stop_string_finish_is_a_success_not_a_cancellation() {
    let s = TestServer::start(|c| c).await;
    let greedy = json!({"model": s.model, "prompt": "The quick brown fox", "max_tokens": 8,
                        "temperature": 0});
    let (st, v) = s.post("/v1/completions", &greedy).await;
    assert_eq!(st, 200, "{v}");
    let text = v["choices"][0]["text"].as_str().unwrap().to_string();
    let stop: String = text.chars().take(1).collect();
    assert!(!stop.is_empty(), "the tiny model generated no text");
    let mut stopped = greedy.clone();
    stopped["stop"] = json!([stop]);
    let (st, v) = s.post("/v1/completions", &stopped).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    let success = |reason: &str| {
        format!(
            "fp4forge_request_success_total{{model_name=\"tiny\",finished_reason=\"{reason}\"}}"
        )
    };
    // The engine drops the ended sequence at its next step.
    let mut waited = 0;
    while s.metric(&success("stop")).await < 1.0 && waited < 100 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        waited += 1;
    }
    assert_eq!(s.metric("fp4forge_cancelled_sequences_total{").await, 0.0);
    assert_eq!(s.metric(&success("stop")).await, 1.0);
    assert_eq!(s.metric(&success("length")).await, 1.0);
    let (_, text) = s.get_text("/metrics").await;
    for needle in [
        "fp4forge_num_preemptions_total{model_name=\"tiny\"} 0",
        "fp4forge_prefix_cache_queries_total{model_name=\"tiny\"} 2",
        "fp4forge_kv_cache_usage_perc{model_name=\"tiny\"} 0",
        "# HELP fp4forge_num_preemptions_total",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        assert!(line.contains("model_name=\"tiny\""), "{line}");
    }
    s.stop().await;
}

/// Without `--allowed-origins` no CORS header is sent; with it, preflights are answered
/// (before the API key check) and responses, errors included, carry the allowed origin.
#[tokio::test]
async fn cors_answers_preflights_for_allowed_origins_only() {
    let plain = TestServer::start(|c| c).await;
    let r = common::client()
        .get(plain.url("/v1/models"))
        .header("origin", "https://a.example")
        .send()
        .await
        .unwrap();
    assert!(r.headers().get("access-control-allow-origin").is_none());
    plain.stop().await;

    let s = TestServer::start(|c| {
        c.allowed_origins(vec!["https://a.example".into()])
            .api_key(Some("sk-test".into()))
    })
    .await;
    let preflight = common::client()
        .request(reqwest::Method::OPTIONS, s.url("/v1/chat/completions"))
        .header("origin", "https://a.example")
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "authorization, content-type",
        )
        .send()
        .await
        .unwrap();
    assert_eq!(preflight.status().as_u16(), 200);
    let h = preflight.headers();
    assert_eq!(h["access-control-allow-origin"], "https://a.example");
    let methods = h["access-control-allow-methods"].to_str().unwrap();
    assert!(methods == "*" || methods.contains("POST"), "{methods}");
    // An actual request: the 401 carries the header, so the browser shows the error.
    let r = common::client()
        .get(s.url("/v1/models"))
        .header("origin", "https://a.example")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "https://a.example"
    );
    // Another origin gets no permission.
    let r = common::client()
        .get(s.url("/health"))
        .header("origin", "https://evil.example")
        .send()
        .await
        .unwrap();
    assert!(r.headers().get("access-control-allow-origin").is_none());
    s.stop().await;
}
