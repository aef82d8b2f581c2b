//! `--api-key`: every `/v1` route wants `Authorization: Bearer KEY` and answers 401 with
//! OpenAI's error body otherwise; `/health` and `/metrics` stay open; fp4forge's own client
//! (what `bench` and `eval` use) gets through with the key and is refused without it.

mod common;

use common::{client, TestServer};
use serde_json::{json, Value};

const KEY: &str = "sk-test-0123";

async fn call(s: &TestServer, path: &str, auth: Option<&str>) -> (u16, Option<String>, Value) {
    let mut rb = client().post(s.url(path)).body(
        json!({"model": "tiny", "prompt": "The quick", "max_tokens": 2, "temperature": 0})
            .to_string(),
    );
    if let Some(a) = auth {
        rb = rb.header("authorization", a);
    }
    let r = rb.send().await.unwrap();
    let status = r.status().as_u16();
    let www = r
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_string());
    let text = r.text().await.unwrap();
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    (status, www, v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_routes_want_the_key_and_health_and_metrics_stay_open() {
    let s = TestServer::start(|c| c.api_key(Some(KEY.into()))).await;

    let (st, www, v) = call(&s, "/v1/completions", None).await;
    assert_eq!((st, www.as_deref()), (401, Some("Bearer")), "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    assert!(v["error"]["param"].is_null(), "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("didn't provide an API key"),
        "{v}"
    );

    for wrong in [
        "Bearer sk-test-0124",
        "Bearer sk-test-012",
        "Bearer ",
        "Basic c2stdGVzdC0wMTIz",
        KEY,
    ] {
        let (st, _, v) = call(&s, "/v1/completions", Some(wrong)).await;
        assert_eq!(st, 401, "{wrong}: {v}");
        assert!(
            !v.to_string().contains("sk-test"),
            "the token is echoed: {v}"
        );
    }
    let (_, _, v) = call(&s, "/v1/completions", Some("Bearer nope")).await;
    assert_eq!(v["error"]["code"], "invalid_api_key", "{v}");

    // Unknown /v1 paths are behind the key too (no probing of what exists).
    let (st, _, v) = call(&s, "/v1/nope", None).await;
    assert_eq!(st, 401, "{v}");

    let (st, _, v) = call(&s, "/v1/completions", Some(&format!("Bearer {KEY}"))).await;
    assert_eq!(st, 200, "{v}");
    let (st, _, v) = call(&s, "/v1/completions", Some(&format!("bearer {KEY}"))).await;
    assert_eq!(st, 200, "{v}");

    let (st, body) = s.get_text("/health").await;
    assert_eq!((st, body.as_str()), (200, "{\"status\":\"ok\"}"));
    let (st, text) = s.get_text("/metrics").await;
    assert_eq!(st, 200);
    assert!(
        text.contains("fp4forge_requests_total{model_name=\"tiny\",endpoint=\"/v1/completions\",status=\"401\"} 7"),
        "{text}"
    );

    // fp4forge's own client, as `bench` and `eval --api-key` use it.
    let keyed = fp4forge_client::Client::builder(&s.base)
        .api_key(Some(KEY.into()))
        .build()
        .unwrap();
    assert_eq!(keyed.models().await.unwrap().data[0].id, "tiny");
    let open = fp4forge_client::Client::builder(&s.base).build().unwrap();
    let err = open.models().await.unwrap_err().to_string();
    assert!(err.contains("401"), "{err}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_key_the_api_is_open() {
    let s = TestServer::start(|c| c).await;
    let (st, _, v) = call(&s, "/v1/completions", None).await;
    assert_eq!(st, 200, "{v}");
    let (st, _, v) = call(&s, "/v1/completions", Some("Bearer anything")).await;
    assert_eq!(st, 200, "{v}");
    s.stop().await;
}
