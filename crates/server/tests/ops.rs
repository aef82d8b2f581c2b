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

/// `/tokenize` of a prompt agrees with the tokenizer, of `messages` with the prompt the chat
/// endpoint counts; `/detokenize` inverts it; `/version` answers.
#[tokio::test]
async fn tokenize_detokenize_and_version_in_vllms_shapes() {
    let s = TestServer::start(|c| c).await;
    let text = "The quick brown fox";
    let (st, v) = s
        .post(
            "/tokenize",
            &json!({"model": s.model, "prompt": text, "return_token_strs": true}),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let ids: Vec<u32> = serde_json::from_value(v["tokens"].clone()).unwrap();
    assert_eq!(ids, common::encode(&s.dir, text));
    assert_eq!(v["count"], ids.len());
    assert!(v["max_model_len"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v["token_strs"].as_array().unwrap().len(), ids.len());
    let (_, plain) = s.post("/tokenize", &json!({"prompt": text})).await;
    assert!(plain.get("token_strs").is_none(), "{plain}");

    let (st, d) = s.post("/detokenize", &json!({"tokens": ids})).await;
    assert_eq!(st, 200, "{d}");
    assert!(d["prompt"].as_str().unwrap().ends_with(text), "{d}");

    let messages = json!([{"role": "user", "content": "Hello there"}]);
    let (st, chat) = s.post("/tokenize", &json!({"messages": messages})).await;
    assert_eq!(st, 200, "{chat}");
    let (st, done) = s
        .post(
            "/v1/chat/completions",
            &json!({"model": s.model, "messages": messages, "max_tokens": 1}),
        )
        .await;
    assert_eq!(st, 200, "{done}");
    assert_eq!(
        chat["count"], done["usage"]["prompt_tokens"],
        "{chat} {done}"
    );

    for (path, body, field) in [
        ("/tokenize", json!({"prompt": 3}), "prompt"),
        ("/tokenize", json!({"prompt": "a", "foo": 1}), "foo"),
        (
            "/tokenize",
            json!({"messages": [], "add_generation_prompt": true,
                             "continue_final_message": true}),
            "continue_final_message",
        ),
        ("/detokenize", json!({"tokens": [1, 99999999]}), "tokens"),
        ("/detokenize", json!({}), "tokens"),
    ] {
        let (st, e) = s.post(path, &body).await;
        assert_eq!(st, 400, "{path} {body}: {e}");
        let message = e["error"]["message"].as_str().unwrap();
        assert!(message.contains(field), "{path} {body}: {e}");
    }
    let (st, e) = s
        .post("/tokenize", &json!({"model": "other", "prompt": "a"}))
        .await;
    assert_eq!(st, 404, "{e}");

    let (st, v) = s.get_text("/version").await;
    assert_eq!(st, 200);
    let v: serde_json::Value = serde_json::from_str(&v).unwrap();
    assert!(v["version"].as_str().is_some_and(|v| !v.is_empty()), "{v}");
    s.stop().await;
}
