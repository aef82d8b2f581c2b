//! Every endpoint of the server on loopback with the tiny model: models, health, metrics,
//! completions (text, token ids, lists, echo with prompt logprobs checked against the engine,
//! logprobs, stop strings, seeds, ignore_eos/min_tokens, streaming), chat (plain, streamed,
//! logprobs), and the catalogue of bad requests, each answered with the right 4xx and OpenAI's
//! error body while the server keeps serving.

mod common;

use common::{encode, TestServer};
use fp4forge_engine::{KvDtype, Model, ModelOptions};
use serde_json::{json, Value};

fn text_of(v: &Value, i: usize) -> String {
    v["choices"][i]["text"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_health_and_metrics() {
    let s = TestServer::start(|c| c).await;
    let (st, v) = s.post_raw("/v1/models", "").await;
    assert_eq!(st, 405, "{v}");
    let r = common::client()
        .get(s.url("/v1/models"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], "tiny");
    assert_eq!(v["data"][0]["max_model_len"], 4096);
    let (st, body) = s.get_text("/v1/models/tiny").await;
    assert_eq!(st, 200, "{body}");
    let (st, body) = s.get_text("/v1/models/other").await;
    assert_eq!(st, 404, "{body}");
    let (st, body) = s.get_text("/health").await;
    assert_eq!((st, body.as_str()), (200, "{\"status\":\"ok\"}"));

    let (st, _) = s
        .post(
            "/v1/completions",
            &json!({"model": "tiny", "prompt": "The quick brown fox", "max_tokens": 4,
                    "temperature": 0}),
        )
        .await;
    assert_eq!(st, 200);
    let (st, text) = s.get_text("/metrics").await;
    assert_eq!(st, 200);
    for needle in [
        "fp4forge_requests_total{model_name=\"tiny\",endpoint=\"/v1/completions\",status=\"200\"} 1",
        "fp4forge_requests_total{model_name=\"tiny\",endpoint=\"/v1/models\",status=\"200\"} 1",
        "fp4forge_prompt_tokens_total{model_name=\"tiny\"} ",
        "fp4forge_generation_tokens_total{model_name=\"tiny\"} 4",
        "fp4forge_requests_waiting{model_name=\"tiny\"} 0",
        "fp4forge_requests_running{model_name=\"tiny\"} 0",
        "# TYPE fp4forge_time_to_first_token_seconds histogram",
        "fp4forge_time_to_first_token_seconds_count{model_name=\"tiny\"} 1",
        "fp4forge_inter_token_latency_seconds_count{model_name=\"tiny\"} 3",
        // one step for the prompt, three for the tokens after the first
        "fp4forge_engine_step_seconds_count{model_name=\"tiny\"} 4",
        "fp4forge_forward_seconds_count{model_name=\"tiny\"} 4",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_from_text_token_ids_and_lists_agree() {
    let s = TestServer::start(|c| c).await;
    let prompts = [
        "The quick brown fox",
        "Paris is the capital of",
        "One, two, three",
    ];
    let mut singles = Vec::new();
    for p in prompts {
        let (st, v) = s
            .post(
                "/v1/completions",
                &json!({"model": "tiny", "prompt": p, "max_tokens": 12, "temperature": 0,
                        "ignore_eos": true}),
            )
            .await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["object"], "text_completion");
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        let ids = encode(&s.dir, p);
        assert_eq!(v["usage"]["prompt_tokens"], ids.len());
        assert_eq!(v["usage"]["completion_tokens"], 12);
        assert_eq!(v["usage"]["total_tokens"], ids.len() + 12);
        // The same prompt as token ids gives the same text.
        let (_, by_ids) = s
            .post(
                "/v1/completions",
                &json!({"prompt": ids, "max_tokens": 12, "temperature": 0, "ignore_eos": true}),
            )
            .await;
        assert_eq!(text_of(&by_ids, 0), text_of(&v, 0));
        singles.push(text_of(&v, 0));
    }
    // A list of prompts: one choice per prompt, in order, same answers.
    let (st, v) = s
        .post(
            "/v1/completions",
            &json!({"prompt": prompts, "max_tokens": 12, "temperature": 0, "ignore_eos": true}),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    for (i, want) in singles.iter().enumerate() {
        assert_eq!(v["choices"][i]["index"], i);
        assert_eq!(&text_of(&v, i), want);
    }
    assert_eq!(v["usage"]["completion_tokens"], 36);
    // A list of token-id lists.
    let lists: Vec<Vec<u32>> = prompts.iter().map(|p| encode(&s.dir, p)).collect();
    let (_, v) = s
        .post(
            "/v1/completions",
            &json!({"prompt": lists, "max_tokens": 12, "temperature": 0, "ignore_eos": true}),
        )
        .await;
    for (i, want) in singles.iter().enumerate() {
        assert_eq!(&text_of(&v, i), want);
    }
    // n choices of one greedy prompt are identical.
    let (_, v) = s
        .post(
            "/v1/completions",
            &json!({"prompt": prompts[0], "n": 3, "max_tokens": 12, "temperature": 0,
                    "ignore_eos": true}),
        )
        .await;
    assert_eq!(v["choices"].as_array().unwrap().len(), 3);
    assert!((0..3).all(|i| text_of(&v, i) == singles[0]));
    assert_eq!(v["usage"]["prompt_tokens"], lists[0].len());
    s.stop().await;
}

/// `log_softmax(row)[token]`.
fn logprob(row: &[f32], token: u32) -> f64 {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
    let lse = max
        + row
            .iter()
            .map(|&x| (x as f64 - max).exp())
            .sum::<f64>()
            .ln();
    row[token as usize] as f64 - lse
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_scores_the_prompt_like_the_engine() {
    let s = TestServer::start(|c| c).await;
    let prompt = "The sun is a star and the moon is not.";
    let ids = encode(&s.dir, prompt);
    let (st, v) = s
        .post(
            "/v1/completions",
            &json!({"prompt": prompt, "max_tokens": 0, "echo": true, "logprobs": 3}),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let c = &v["choices"][0];
    assert_eq!(c["text"], prompt);
    assert_eq!(c["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 0);
    let lp = &c["logprobs"];
    let tokens: Vec<String> = serde_json::from_value(lp["tokens"].clone()).unwrap();
    let offsets: Vec<usize> = serde_json::from_value(lp["text_offset"].clone()).unwrap();
    let token_lps = lp["token_logprobs"].as_array().unwrap();
    let tops = lp["top_logprobs"].as_array().unwrap();
    assert_eq!(tokens.len(), ids.len());
    assert_eq!(tokens.concat(), prompt);
    // text_offset counts characters.
    let mut at = 0;
    for (t, &o) in tokens.iter().zip(&offsets) {
        assert_eq!(o, at);
        at += t.chars().count();
    }
    assert!(token_lps[0].is_null() && tops[0].is_null());

    // Against the engine itself (the server runs an f32 cache too).
    let model = Model::load(&s.dir, ModelOptions::new().kv_dtype(KvDtype::F32)).unwrap();
    let logits = model.new_session().unwrap().prefill_all(&ids).unwrap();
    for i in 1..ids.len() {
        let want = logprob(logits.row(i - 1), ids[i]);
        let got = token_lps[i].as_f64().unwrap();
        assert!((got - want).abs() < 1e-4, "position {i}: {got} vs {want}");
        let top = tops[i].as_object().unwrap();
        assert!(top.len() >= 3 && top.len() <= 4, "{top:?}");
        let best = top
            .values()
            .map(|x| x.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        let engine_best = (0..logits.vocab as u32)
            .map(|t| logprob(logits.row(i - 1), t))
            .fold(f64::MIN, f64::max);
        assert!((best - engine_best).abs() < 1e-4);
    }

    // Echo with generation: prompt text first, then the generated text; offsets continue.
    let (_, v) = s
        .post(
            "/v1/completions",
            &json!({"prompt": ids, "max_tokens": 5, "echo": true, "logprobs": 1,
                    "temperature": 0, "ignore_eos": true}),
        )
        .await;
    let c = &v["choices"][0];
    let text = c["text"].as_str().unwrap();
    assert!(text.starts_with(prompt), "{text}");
    let n = c["logprobs"]["tokens"].as_array().unwrap().len();
    assert_eq!(n, ids.len() + 5);
    // Generated greedy tokens are the most likely ones.
    let lps = c["logprobs"]["token_logprobs"].as_array().unwrap();
    let tops = c["logprobs"]["top_logprobs"].as_array().unwrap();
    for i in ids.len()..n {
        let best = tops[i]
            .as_object()
            .unwrap()
            .values()
            .map(|x| x.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        assert_eq!(lps[i].as_f64().unwrap(), best);
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_strings_cut_plain_and_streamed_text() {
    let s = TestServer::start(|c| c).await;
    let body = |stop: Option<&str>, stream: bool| {
        let mut b = json!({"prompt": "Hello world! How are you", "max_tokens": 40,
                           "temperature": 0, "ignore_eos": true, "stream": stream});
        if let Some(st) = stop {
            b["stop"] = json!([st]);
        }
        b
    };
    let (_, full) = s.post("/v1/completions", &body(None, false)).await;
    let full = text_of(&full, 0);
    // A stop string from the middle of the greedy text (two ASCII characters).
    let chars: Vec<(usize, char)> = full.char_indices().collect();
    let (at, stop) = chars
        .windows(2)
        .skip(chars.len() / 3)
        .find(|w| w[0].1.is_ascii_graphic() && w[1].1.is_ascii_graphic())
        .map(|w| (w[0].0, format!("{}{}", w[0].1, w[1].1)))
        .expect("two ASCII characters in the generated text");
    let first = full.find(&stop).unwrap();
    assert!(first <= at);
    let (st, v) = s.post("/v1/completions", &body(Some(&stop), false)).await;
    assert_eq!(st, 200);
    assert_eq!(text_of(&v, 0), full[..first]);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let events = s.stream("/v1/completions", &body(Some(&stop), true)).await;
    let streamed: String = events
        .iter()
        .filter_map(|e| e.get("choices"))
        .flat_map(|c| c.as_array().unwrap().iter())
        .map(|c| c["text"].as_str().unwrap())
        .collect();
    assert_eq!(streamed, full[..first]);
    let reasons: Vec<&Value> = events
        .iter()
        .filter_map(|e| e.get("choices"))
        .flat_map(|c| c.as_array().unwrap().iter())
        .map(|c| &c["finish_reason"])
        .filter(|r| !r.is_null())
        .collect();
    assert_eq!(reasons, vec![&json!("stop")]);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_completions_match_plain_and_end_with_usage() {
    let s = TestServer::start(|c| c).await;
    let base = json!({"prompt": "Water boils at", "max_tokens": 16, "temperature": 0,
                      "ignore_eos": true, "logprobs": 2});
    let (_, plain) = s.post("/v1/completions", &base).await;
    let mut streamed = base.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let events = s.stream("/v1/completions", &streamed).await;
    assert_eq!(events.last().unwrap(), "[DONE]");
    let usage = &events[events.len() - 2];
    assert_eq!(usage["choices"], json!([]));
    assert_same_usage(&usage["usage"], &plain["usage"]);
    let mut text = String::new();
    let mut offsets = Vec::new();
    let mut token_lps = Vec::new();
    for e in &events[..events.len() - 2] {
        assert_eq!(e["object"], "text_completion");
        for c in e["choices"].as_array().unwrap() {
            text.push_str(c["text"].as_str().unwrap());
            if let Some(lp) = c["logprobs"].as_object() {
                offsets.extend(lp["text_offset"].as_array().unwrap().iter().cloned());
                token_lps.extend(lp["token_logprobs"].as_array().unwrap().iter().cloned());
            }
        }
    }
    assert_eq!(text, text_of(&plain, 0));
    let lp = &plain["choices"][0]["logprobs"];
    assert_eq!(Value::Array(offsets), lp["text_offset"]);
    assert_eq!(Value::Array(token_lps), lp["token_logprobs"]);
    // Without include_usage: no usage chunk.
    let mut no_usage = base.clone();
    no_usage["stream"] = json!(true);
    let events = s.stream("/v1/completions", &no_usage).await;
    assert!(events.iter().all(|e| e.get("usage").is_none()));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeds_reproduce_and_token_budgets_hold() {
    let s = TestServer::start(|c| c).await;
    let body = |seed: u64| {
        json!({"prompt": "Cats and dogs", "max_tokens": 20, "temperature": 1.0, "top_p": 0.9,
               "top_k": 50, "seed": seed, "ignore_eos": true})
    };
    let (_, a) = s.post("/v1/completions", &body(5)).await;
    let (_, b) = s.post("/v1/completions", &body(5)).await;
    let (_, c) = s.post("/v1/completions", &body(6)).await;
    assert_eq!(text_of(&a, 0), text_of(&b, 0));
    assert_ne!(text_of(&a, 0), text_of(&c, 0));
    // min_tokens = max_tokens: EOS can never end it early.
    for seed in 0..4 {
        let (_, v) = s
            .post(
                "/v1/completions",
                &json!({"prompt": "A", "max_tokens": 30, "min_tokens": 30, "temperature": 1.0,
                        "seed": seed}),
            )
            .await;
        assert_eq!(v["usage"]["completion_tokens"], 30, "{v}");
        assert_eq!(v["choices"][0]["finish_reason"], "length");
    }
    // The default for completions is 16 tokens (with ignore_eos it is reached).
    let (_, v) = s
        .post(
            "/v1/completions",
            &json!({"prompt": "A", "ignore_eos": true}),
        )
        .await;
    assert_eq!(v["usage"]["completion_tokens"], 16);
    // stop_token_ids: a token the greedy answer produces ends it there; it is counted and
    // listed in the logprobs (with no text), as vLLM does and lm-evaluation-harness expects.
    let prompt = vec![5u32, 6, 7];
    let model = Model::load(&s.dir, ModelOptions::new().kv_dtype(KvDtype::F32)).unwrap();
    let options = fp4forge_engine::GenerateOptions {
        max_tokens: 10,
        ..Default::default()
    };
    let greedy = model
        .new_session()
        .unwrap()
        .generate(&prompt, &options, |_| true)
        .unwrap()
        .tokens;
    let stop = greedy[3];
    let at = greedy.iter().position(|&t| t == stop).unwrap();
    let (_, v) = s
        .post(
            "/v1/completions",
            &json!({"prompt": prompt, "max_tokens": 10, "temperature": 0, "ignore_eos": true,
                    "stop_token_ids": [stop], "logprobs": 1}),
        )
        .await;
    let c = &v["choices"][0];
    assert_eq!(c["finish_reason"], "stop", "{v}");
    assert_eq!(v["usage"]["completion_tokens"], at + 1);
    let toks = c["logprobs"]["tokens"].as_array().unwrap();
    assert_eq!(toks.len(), at + 1);
    assert_eq!(toks[at], "");
    assert!(c["logprobs"]["token_logprobs"][at].as_f64().unwrap() < 0.0);
    assert_eq!(
        c["logprobs"]["text_offset"][at],
        text_of(&v, 0).chars().count()
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_plain_and_streamed_agree() {
    let s = TestServer::start(|c| c).await;
    let messages = json!([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "What is the capital of France?"}]}
    ]);
    let body = json!({"model": "tiny", "messages": messages, "max_tokens": 12,
                      "temperature": 0, "ignore_eos": true, "logprobs": true,
                      "top_logprobs": 2});
    let (st, plain) = s.post("/v1/chat/completions", &body).await;
    assert_eq!(st, 200, "{plain}");
    assert_eq!(plain["object"], "chat.completion");
    let msg = &plain["choices"][0]["message"];
    assert_eq!(msg["role"], "assistant");
    let content = msg["content"].as_str().unwrap().to_string();
    let entries = plain["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    assert_eq!(entries.len(), 12);
    let joined: String = entries
        .iter()
        .map(|e| e["token"].as_str().unwrap())
        .collect();
    assert_eq!(joined, content);
    for e in entries {
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 2);
        assert_eq!(
            e["logprob"], top[0]["logprob"],
            "greedy picks the top token"
        );
    }
    assert_eq!(plain["usage"]["completion_tokens"], 12);
    // The rendered ChatML prompt, tokenized.
    let rendered = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is the \
                    capital of France?<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(
        plain["usage"]["prompt_tokens"],
        encode(&s.dir, rendered).len()
    );

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let events = s.stream("/v1/chat/completions", &streamed).await;
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(events[0]["object"], "chat.completion.chunk");
    assert_eq!(events.last().unwrap(), "[DONE]");
    let usage = &events[events.len() - 2];
    assert_same_usage(&usage["usage"], &plain["usage"]);
    let text: String = events[1..events.len() - 2]
        .iter()
        .flat_map(|e| e["choices"].as_array().unwrap().iter())
        .filter_map(|c| c["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, content);
    let finish = &events[events.len() - 3]["choices"][0];
    assert_eq!(finish["finish_reason"], "length");
    // max_completion_tokens is honoured.
    let (_, v) = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "Hi"}],
                    "max_completion_tokens": 3, "ignore_eos": true}),
        )
        .await;
    assert_eq!(v["usage"]["completion_tokens"], 3);
    s.stop().await;
}

/// One bad request: its status, param and a phrase of its message.
struct Bad {
    path: &'static str,
    body: String,
    status: u16,
    param: Option<&'static str>,
    says: &'static str,
}

fn bad(
    path: &'static str,
    body: Value,
    status: u16,
    param: Option<&'static str>,
    says: &'static str,
) -> Bad {
    Bad {
        path,
        body: body.to_string(),
        status,
        param,
        says,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_openai_errors_and_the_server_keeps_serving() {
    let s = TestServer::start(|c| c.max_body_bytes(64 << 10).max_prompt_tokens(Some(200))).await;
    let cmpl = "/v1/completions";
    let chat = "/v1/chat/completions";
    let hi = json!([{"role": "user", "content": "Hi"}]);
    let long_prompt: Vec<u32> = (0..201).map(|i| 30 + i % 200).collect();
    let mut cases = vec![
        Bad {
            path: cmpl,
            body: "{\"prompt\": \"x\", ".into(),
            status: 400,
            param: None,
            says: "malformed JSON",
        },
        Bad {
            path: chat,
            body: "not json at all".into(),
            status: 400,
            param: None,
            says: "malformed JSON",
        },
        Bad {
            path: cmpl,
            body: "".into(),
            status: 400,
            param: None,
            says: "empty",
        },
        bad(
            cmpl,
            json!(["a", "list"]),
            400,
            None,
            "must be a JSON object",
        ),
        bad(
            cmpl,
            json!({"prompt": "x", "max_tokens": "ten"}),
            400,
            Some("max_tokens"),
            "must be an integer",
        ),
        bad(
            cmpl,
            json!({"prompt": "x", "temperature": "hot"}),
            400,
            Some("temperature"),
            "must be a number",
        ),
        bad(
            cmpl,
            json!({"prompt": 5}),
            400,
            Some("prompt"),
            "must be a string",
        ),
        bad(
            cmpl,
            json!({"prompt": [1, "a"]}),
            400,
            Some("prompt"),
            "prompt[0]",
        ),
        bad(
            cmpl,
            json!({"prompt": "x", "stream": "yes"}),
            400,
            Some("stream"),
            "true or false",
        ),
        bad(
            cmpl,
            json!({"prompt": "x", "logprobs": true}),
            400,
            Some("logprobs"),
            "must be an integer",
        ),
        bad(
            cmpl,
            json!({"prompt": "x", "stop": 7}),
            400,
            Some("stop"),
            "string",
        ),
        bad(
            cmpl,
            json!({"prompt": "x", "stop": ["z".repeat(300)]}),
            400,
            Some("stop"),
            "at most 256",
        ),
        bad(
            cmpl,
            json!({"prompt": "x", "stop": [""]}),
            400,
            Some("stop"),
            "must not be empty",
        ),
        bad(
            cmpl,
            json!({"model": "gpt-4", "prompt": "x"}),
            404,
            Some("model"),
            "does not exist",
        ),
        bad(
            chat,
            json!({"model": "nope", "messages": hi}),
            404,
            Some("model"),
            "does not exist",
        ),
        bad(
            cmpl,
            json!({"prompt": "x", "max_tokens": -1}),
            400,
            Some("max_tokens"),
            "at least 0",
        ),
        bad(
            cmpl,
            json!({"prompt": "x", "max_tokens": 1_000_000_000_000u64}),
            400,
            Some("max_tokens"),
            "exceeds",
        ),
        bad(
            cmpl,
            json!({"prompt": "x", "max_tokens": 1e300}),
            400,
            Some("max_tokens"),
            "must be an integer",
        ),
        bad(
            chat,
            json!({"messages": hi, "max_tokens": 0}),
            400,
            Some("max_tokens"),
            "at least 1",
        ),
        bad(
            chat,
            json!({"messages": hi, "max_completion_tokens": -5}),
            400,
            Some("max_completion_tokens"),
            "at least 1",
        ),
        bad(
            cmpl,
            json!({"prompt": "x", "max_tokens": 4096}),
            400,
            Some("max_tokens"),
            "maximum context length",
        ),
        bad(
            cmpl,
            json!({"prompt": long_prompt}),
            400,
            Some("prompt"),
            "at most 200",
        ),
        bad(cmpl, json!({"prompt": ""}), 400, Some("prompt"), "empty"),
        bad(cmpl, json!({"prompt": []}), 400, Some("prompt"), "empty"),
        bad(
            cmpl,
            json!({"prompt": [1, 2, 99999]}),
            400,
            Some("prompt"),
            "outside the vocabulary",
        ),
        bad(
            cmpl,
            json!({"prompt": [1, -2]}),
            400,
            Some("prompt"),
            "token ids",
        ),
        bad(cmpl, json!({}), 400, Some("prompt"), "required"),
        bad(
            chat,
            json!({"messages": []}),
            400,
            Some("messages"),
            "empty",
        ),
        bad(chat, json!({}), 400, Some("messages"), "required"),
        bad(
            chat,
            json!({"messages": "hi"}),
            400,
            Some("messages"),
            "must be a list",
        ),
        bad(
            chat,
            json!({"messages": [{"content": "hi"}]}),
            400,
            Some("messages[0].role"),
            "required",
        ),
        bad(
            chat,
            json!({"messages": [{"role": "robot", "content": "hi"}]}),
            400,
            Some("messages[0].role"),
            "not one of",
        ),
        bad(
            chat,
            json!({"messages": [{"role": "user", "content": 3}]}),
            400,
            Some("messages[0].content"),
            "must be a string",
        ),
        bad(
            chat,
            json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
            400,
            Some("messages[0].content"),
            "has type \"image_url\": only text parts",
        ),
        bad(
            chat,
            json!({"messages": hi, "top_logprobs": 2}),
            400,
            Some("top_logprobs"),
            "logprobs: true",
        ),
        bad(
            chat,
            json!({"messages": hi, "logprobs": true, "top_logprobs": 99}),
            400,
            Some("top_logprobs"),
            "exceeds",
        ),
        bad(
            cmpl,
            json!({"prompt": "x", "logprobs": 21}),
            400,
            Some("logprobs"),
            "exceeds",
        ),
        bad(
            cmpl,
            json!({"prompt": "x", "n": 0}),
            400,
            Some("n"),
            "at least 1",
        ),
        bad(
            cmpl,
            json!({"prompt": "x", "top_p": 0}),
            400,
            Some("top_p"),
            "greater than 0",
        ),
        bad(
            cmpl,
            json!({"prompt": "x", "temperature": -1}),
            400,
            Some("temperature"),
            "between",
        ),
        bad(
            cmpl,
            json!({"prompt": "x", "presence_penalty": 2.5}),
            400,
            Some("presence_penalty"),
            "between",
        ),
        bad(
            cmpl,
            json!({"prompt": "x", "stream_options": 1}),
            400,
            Some("stream_options"),
            "object",
        ),
        bad(
            cmpl,
            json!({"prompt": "x", "seed": "s"}),
            400,
            Some("seed"),
            "64-bit integer",
        ),
        bad(
            cmpl,
            json!({"prompt": "x", "stop_token_ids": [100000]}),
            400,
            Some("stop_token_ids"),
            "outside",
        ),
        bad(
            cmpl,
            json!({"prompt": "x", "min_tokens": -1}),
            400,
            Some("min_tokens"),
            "at least 0",
        ),
        bad("/v1/nothing", json!({}), 404, None, "no such endpoint"),
    ];
    // A huge text prompt (under the body limit) is refused by its bytes, before tokenizing,
    // naming the limit; in a list too, and a chat's messages.
    cases.push(bad(
        cmpl,
        json!({"prompt": "y".repeat(50_000)}),
        400,
        Some("prompt"),
        "the prompt has 50000 bytes of text",
    ));
    cases.push(bad(
        cmpl,
        json!({"prompt": ["ok", "y".repeat(50_000)]}),
        400,
        Some("prompt"),
        "at most 200 tokens",
    ));
    cases.push(bad(
        chat,
        json!({"messages": [{"role": "user", "content": "y".repeat(50_000)}]}),
        400,
        Some("messages"),
        "50000 bytes",
    ));
    // Issue 22 item 11: messages that say the actual problem.
    cases.push(bad(
        chat,
        json!({"messages": [{"role": "user", "content": [{"type": "text"}]}]}),
        400,
        Some("messages[0].content"),
        "without `text`",
    ));
    cases.push(bad(
        cmpl,
        json!({"prompt": "x", "top_k": 1e10}),
        400,
        Some("top_k"),
        "largest top_k accepted",
    ));
    cases.push(Bad {
        path: cmpl,
        body: r#"{"prompt": "\ud800"}"#.into(),
        status: 400,
        param: None,
        says: "lone UTF-16 high surrogate",
    });
    // An oversized body.
    cases.push(Bad {
        path: cmpl,
        body: json!({"prompt": "y".repeat(100 << 10)}).to_string(),
        status: 413,
        param: None,
        says: "larger than",
    });
    for case in &cases {
        let (status, v) = s.post_raw(case.path, case.body.clone()).await;
        let shown: String = case.body.chars().take(80).collect();
        assert_eq!(status, case.status, "{shown}: {v}");
        let err = &v["error"];
        let message = err["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(case.says),
            "{shown}: message {message:?} lacks {:?}",
            case.says
        );
        assert_eq!(err["type"], "invalid_request_error", "{shown}: {v}");
        assert_eq!(err["param"].as_str(), case.param, "{shown}: {v}");
        assert!(err.as_object().unwrap().contains_key("code"), "{v}");
        // And the server still answers.
        let (ok, _) = s
            .post(cmpl, &json!({"prompt": "ok", "max_tokens": 1}))
            .await;
        assert_eq!(ok, 200, "after {shown}");
    }
    let (_, metrics) = s.get_text("/metrics").await;
    assert!(metrics.contains("status=\"413\""), "{metrics}");
    s.stop().await;
}

/// Fields are of three kinds: known and honoured, accepted and ignored (no effect on the
/// result), and refused by name (unknown, or an OpenAI/vLLM field fp4forge does not implement).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_and_unimplemented_fields_are_refused_by_name_ignored_ones_accepted() {
    let s = TestServer::start(|c| c).await;
    let cmpl = "/v1/completions";
    let chat = "/v1/chat/completions";
    let hi = json!([{"role": "user", "content": "Hi"}]);
    // Unknown fields: a 400 naming the field.
    for (path, body, field) in [
        (cmpl, json!({"prompt": "x", "max_tokns": 4}), "max_tokns"),
        (chat, json!({"messages": hi, "temprature": 0}), "temprature"),
    ] {
        let (status, v) = s.post(path, &body).await;
        assert_eq!(status, 400, "{body}: {v}");
        assert_eq!(v["error"]["param"], field, "{v}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("unknown field") && message.contains(field),
            "{v}"
        );
    }
    // Unimplemented vLLM/OpenAI fields: a 400 naming the field, "not supported".
    for (path, body, field) in [
        (
            cmpl,
            json!({"prompt": "x", "length_penalty": 0.5}),
            "length_penalty",
        ),
        (
            cmpl,
            json!({"prompt": "x", "guided_decoding_backend": "xgrammar"}),
            "guided_decoding_backend",
        ),
        (
            cmpl,
            json!({"prompt": "x", "spaces_between_special_tokens": false}),
            "spaces_between_special_tokens",
        ),
        (
            chat,
            json!({"messages": hi, "use_beam_search": true}),
            "use_beam_search",
        ),
        (
            chat,
            json!({"messages": hi, "mm_processor_kwargs": {"size": 4}}),
            "mm_processor_kwargs",
        ),
        (chat, json!({"messages": hi, "echo": true}), "echo"),
        (
            chat,
            json!({"messages": hi, "reasoning_effort": "high"}),
            "reasoning_effort",
        ),
    ] {
        let (status, v) = s.post(path, &body).await;
        assert_eq!(status, 400, "{body}: {v}");
        assert_eq!(v["error"]["param"], field, "{v}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("not supported") && message.contains(field),
            "{v}"
        );
    }
    // Accepted and ignored, and unimplemented fields at their neutral value: 200.
    for (path, body) in [
        (cmpl, json!({"prompt": "x", "max_tokens": 1, "user": "u-1"})),
        (
            cmpl,
            json!({"prompt": "x", "max_tokens": 1, "use_beam_search": false, "best_of": 1}),
        ),
        (
            chat,
            json!({"messages": hi, "max_tokens": 1, "user": "u-1", "store": false,
                      "metadata": {"k": "v"}, "service_tier": "auto"}),
        ),
        (
            chat,
            json!({"messages": hi, "max_tokens": 1, "echo": false}),
        ),
    ] {
        let (status, v) = s.post(path, &body).await;
        assert_eq!(status, 200, "{body}: {v}");
    }
    s.stop().await;
}

/// Asserts a repeated request's usage: the same counts as the first's; the prompt tokens the
/// prefix cache served may differ (the first's session may or may not have reached the cache;
/// prefix_cache.rs checks the counts).
fn assert_same_usage(second: &Value, first: &Value) {
    for k in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        assert_eq!(second[k], first[k], "usage.{k}");
    }
    let prompt = first["prompt_tokens"].as_u64().unwrap();
    for u in [first, second] {
        let cached = u["prompt_tokens_details"]["cached_tokens"].as_u64();
        assert!(cached.is_some_and(|c| c < prompt), "{u}");
    }
}
