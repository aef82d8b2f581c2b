//! No request field is silently ignored: every field of vLLM's `CompletionRequest` and
//! `ChatCompletionRequest` (vllm/entrypoints/openai/protocol.py at vLLM commit 0052bed3, the
//! 0.10.0 line) is sent with a value that asks for something, and the server either honours it
//! (200; for the sampling and output fields the effect is asserted here, the older ones in
//! api.rs) or refuses it by name with a 400. Only `user`, `store`, `metadata` and
//! `service_tier` are accepted with no effect.

mod common;

use common::TestServer;
use serde_json::{json, Value};

/// What the server does with a field.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Expect {
    /// Accepted, with an effect (asserted below or in api.rs).
    Honoured,
    /// A 400 that names the field.
    Refused,
    /// Accepted and ignored (OpenAI bookkeeping only).
    Ignored,
}
use Expect::*;

/// vLLM's `CompletionRequest` fields (`prompt` is in every request sent).
const COMPLETION: &[(&str, &str, Expect)] = &[
    ("model", "null", Honoured),
    ("prompt_embeds", "\"AAAA\"", Refused),
    ("best_of", "2", Refused),
    ("echo", "true", Honoured),
    ("frequency_penalty", "1.5", Honoured),
    ("logit_bias", "{\"5\": 3}", Honoured),
    ("logprobs", "2", Honoured),
    ("max_tokens", "3", Honoured),
    ("n", "2", Honoured),
    ("presence_penalty", "1.5", Honoured),
    ("seed", "3", Honoured),
    ("stop", "[\"x\"]", Honoured),
    ("stream", "false", Honoured),
    ("stream_options", "null", Honoured),
    ("suffix", "\"tail\"", Refused),
    ("temperature", "0.5", Honoured),
    ("top_p", "0.5", Honoured),
    ("user", "\"u-1\"", Ignored),
    ("use_beam_search", "true", Refused),
    ("top_k", "3", Honoured),
    ("min_p", "0.5", Honoured),
    ("repetition_penalty", "1.5", Honoured),
    ("length_penalty", "0.5", Refused),
    ("stop_token_ids", "[5]", Honoured),
    ("include_stop_str_in_output", "true", Honoured),
    ("ignore_eos", "true", Honoured),
    ("min_tokens", "2", Honoured),
    ("skip_special_tokens", "false", Honoured),
    ("spaces_between_special_tokens", "false", Refused),
    ("truncate_prompt_tokens", "2", Honoured),
    ("allowed_token_ids", "[5, 6]", Honoured),
    ("prompt_logprobs", "1", Honoured),
    ("add_special_tokens", "false", Honoured),
    ("response_format", "{\"type\": \"json_object\"}", Honoured),
    ("guided_json", "{\"type\": \"object\"}", Honoured),
    ("guided_regex", "\"a+\"", Honoured),
    ("guided_choice", "[\"a\"]", Honoured),
    ("guided_grammar", "\"start: \\\"a\\\"\"", Honoured),
    ("guided_decoding_backend", "\"xgrammar\"", Refused),
    ("guided_whitespace_pattern", "\" \"", Refused),
    ("priority", "1", Refused),
    ("request_id", "\"r-1\"", Refused),
    ("logits_processors", "[\"m.P\"]", Refused),
    ("return_tokens_as_token_ids", "true", Refused),
    ("cache_salt", "\"salt\"", Refused),
    ("kv_transfer_params", "{\"a\": 1}", Refused),
    ("vllm_xargs", "{\"a\": 1}", Refused),
    // newer vLLM sampling field, shared by both requests here
    ("bad_words", "[\"a\"]", Honoured),
];

/// vLLM's `ChatCompletionRequest` fields (`messages` is in every request sent).
const CHAT: &[(&str, &str, Expect)] = &[
    ("model", "null", Honoured),
    ("frequency_penalty", "1.5", Honoured),
    ("logit_bias", "{\"5\": 3}", Honoured),
    ("logprobs", "true", Honoured),
    ("top_logprobs", "2", Honoured),
    ("max_tokens", "3", Honoured),
    ("max_completion_tokens", "3", Honoured),
    ("n", "2", Honoured),
    ("presence_penalty", "1.5", Honoured),
    ("response_format", "{\"type\": \"json_object\"}", Honoured),
    ("seed", "3", Honoured),
    ("stop", "[\"x\"]", Honoured),
    ("stream", "false", Honoured),
    ("stream_options", "null", Honoured),
    ("temperature", "0.5", Honoured),
    ("top_p", "0.5", Honoured),
    ("tools", "[]", Honoured),
    ("tool_choice", "\"none\"", Honoured),
    ("reasoning_effort", "\"high\"", Refused),
    ("include_reasoning", "false", Honoured),
    ("parallel_tool_calls", "false", Honoured),
    ("user", "\"u-1\"", Ignored),
    ("best_of", "2", Refused),
    ("use_beam_search", "true", Refused),
    ("top_k", "3", Honoured),
    ("min_p", "0.5", Honoured),
    ("repetition_penalty", "1.5", Honoured),
    ("length_penalty", "0.5", Refused),
    ("stop_token_ids", "[5]", Honoured),
    ("include_stop_str_in_output", "true", Honoured),
    ("ignore_eos", "true", Honoured),
    ("min_tokens", "2", Honoured),
    ("skip_special_tokens", "false", Honoured),
    ("spaces_between_special_tokens", "false", Refused),
    ("truncate_prompt_tokens", "2", Honoured),
    ("prompt_logprobs", "1", Honoured),
    ("allowed_token_ids", "[5, 6]", Honoured),
    ("bad_words", "[\"a\"]", Honoured),
    ("echo", "true", Refused),
    ("add_generation_prompt", "false", Honoured),
    ("continue_final_message", "false", Honoured),
    ("add_special_tokens", "true", Honoured),
    (
        "documents",
        "[{\"title\": \"t\", \"text\": \"x\"}]",
        Honoured,
    ),
    (
        "chat_template",
        "\"{{ messages[0]['content'] }}\"",
        Honoured,
    ),
    (
        "chat_template_kwargs",
        "{\"enable_thinking\": false}",
        Honoured,
    ),
    ("mm_processor_kwargs", "{\"a\": 1}", Refused),
    ("guided_json", "{\"type\": \"object\"}", Honoured),
    ("guided_regex", "\"a+\"", Honoured),
    ("guided_choice", "[\"a\"]", Honoured),
    ("guided_grammar", "\"start: \\\"a\\\"\"", Honoured),
    ("structural_tag", "\"{}\"", Refused),
    ("guided_decoding_backend", "\"xgrammar\"", Refused),
    ("guided_whitespace_pattern", "\" \"", Refused),
    ("priority", "1", Refused),
    ("request_id", "\"r-1\"", Refused),
    ("logits_processors", "[\"m.P\"]", Refused),
    ("return_tokens_as_token_ids", "true", Refused),
    ("cache_salt", "\"salt\"", Refused),
    ("kv_transfer_params", "{\"a\": 1}", Refused),
    ("vllm_xargs", "{\"a\": 1}", Refused),
    // OpenAI fields vLLM takes as extras
    ("store", "true", Ignored),
    ("metadata", "{\"k\": \"v\"}", Ignored),
    ("service_tier", "\"auto\"", Ignored),
];

async fn check_all(s: &TestServer, path: &str, base: Value, fields: &[(&str, &str, Expect)]) {
    for &(name, value, expect) in fields {
        let mut body = base.clone();
        body[name] = serde_json::from_str(value).expect(name);
        if name == "top_logprobs" {
            body["logprobs"] = json!(true);
        }
        let (status, v) = s.post(path, &body).await;
        match expect {
            Honoured | Ignored => assert_eq!(status, 200, "{path} {name}: {v}"),
            Refused => {
                assert_eq!(status, 400, "{path} {name}: {v}");
                assert_eq!(v["error"]["param"], name, "{path} {name}: {v}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_vllm_request_field_is_honoured_or_refused_by_name() {
    let s = TestServer::start(|c| c).await;
    let cmpl = json!({"prompt": "Hello world", "max_tokens": 3, "temperature": 0});
    check_all(&s, "/v1/completions", cmpl, COMPLETION).await;
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
                      "temperature": 0});
    check_all(&s, "/v1/chat/completions", chat, CHAT).await;
    s.stop().await;
}

fn text(v: &Value) -> String {
    v["choices"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_fields_change_the_result_as_vllm_does() {
    let s = TestServer::start(|c| c).await;
    let tok = common::tokenizer(&s.dir);
    let path = "/v1/completions";
    let body = |extra: Value| {
        let mut b = json!({"prompt": "Hello world! How are you", "max_tokens": 12,
                           "temperature": 0, "ignore_eos": true});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let (_, base) = s.post(path, &body(json!({}))).await;
    let greedy = text(&base);
    let a = common::encode(&s.dir, "a");
    let t = *a.last().unwrap();
    let t_text = tok.decode(&[t; 4], false).unwrap();

    // logit_bias +100 and allowed_token_ids [t] each force t.
    for extra in [
        json!({"logit_bias": {t.to_string(): 100}, "max_tokens": 4}),
        json!({"allowed_token_ids": [t], "max_tokens": 4}),
    ] {
        let (st, v) = s.post(path, &body(extra.clone())).await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(text(&v), t_text, "{extra}");
    }
    // A stop token id reports itself as stop_reason; EOS and length report null.
    let (_, v) = s
        .post(
            path,
            &body(json!({"logit_bias": {t.to_string(): 100}, "stop_token_ids": [t]})),
        )
        .await;
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    assert_eq!(v["choices"][0]["stop_reason"], json!(t), "{v}");
    assert_eq!(base["choices"][0]["stop_reason"], Value::Null, "{base}");
    // Penalties change a greedy text long enough to repeat itself.
    let long = json!({"max_tokens": 64});
    let (_, v) = s.post(path, &body(long.clone())).await;
    let long_greedy = text(&v);
    for extra in [
        json!({"presence_penalty": 2, "max_tokens": 64}),
        json!({"frequency_penalty": 2, "max_tokens": 64}),
        json!({"repetition_penalty": 3, "max_tokens": 64}),
    ] {
        let (st, v) = s.post(path, &body(extra.clone())).await;
        assert_eq!(st, 200, "{v}");
        assert_ne!(text(&v), long_greedy, "{extra}");
    }
    // min_p 1 keeps only the most likely token: seeded sampling becomes greedy.
    let sampled = json!({"temperature": 1, "seed": 11});
    let (_, free) = s.post(path, &body(sampled.clone())).await;
    assert_ne!(
        text(&free),
        greedy,
        "the seed should sample away from greedy"
    );
    let mut with_min_p = sampled.clone();
    with_min_p["min_p"] = json!(1.0);
    let (_, v) = s.post(path, &body(with_min_p)).await;
    assert_eq!(text(&v), greedy);
    // bad_words: a word that is one token (alone) is never generated; the text before it is
    // unchanged.
    let (_, lp) = s.post(path, &body(json!({"logprobs": 0}))).await;
    let tokens: Vec<String> = lp["choices"][0]["logprobs"]["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect();
    let at = tokens
        .iter()
        .position(|t| {
            t.len() > 1
                && t.chars().all(|c| c.is_ascii_alphanumeric())
                && tok.encode(t.as_str(), false).unwrap().get_ids().len() == 1
        })
        .expect("a one-token word in the greedy text");
    let word = tokens[at].clone();
    let (_, v) = s
        .post(
            path,
            &body(json!({"logprobs": 0, "bad_words": [word.clone()]})),
        )
        .await;
    let banned: Vec<&Value> = v["choices"][0]["logprobs"]["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .collect();
    assert!(!banned.contains(&&json!(word)), "{word}: {v}");
    assert_eq!(
        banned[..at]
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect::<Vec<_>>(),
        tokens[..at].iter().map(String::as_str).collect::<Vec<_>>()
    );
    // include_stop_str_in_output keeps the matched stop string; stop_reason names it.
    let stop: String = greedy.chars().skip(4).take(2).collect();
    let at = greedy.find(&stop).unwrap();
    for (include, want) in [(false, &greedy[..at]), (true, &greedy[..at + stop.len()])] {
        let (_, v) = s
            .post(
                path,
                &body(json!({"stop": [stop.clone()], "include_stop_str_in_output": include})),
            )
            .await;
        assert_eq!(text(&v), want, "{v}");
        assert_eq!(v["choices"][0]["stop_reason"], json!(stop), "{v}");
    }
    // skip_special_tokens: false keeps a special token's text.
    let special = json!({"logit_bias": {"9": 100}, "max_tokens": 2});
    let (_, v) = s.post(path, &body(special.clone())).await;
    assert_eq!(text(&v), "");
    let mut keep = special.clone();
    keep["skip_special_tokens"] = json!(false);
    let (_, v) = s.post(path, &body(keep)).await;
    assert_eq!(text(&v), "<|pad|><|pad|>");
    // truncate_prompt_tokens keeps the prompt's last tokens.
    let (_, v) = s
        .post(path, &body(json!({"truncate_prompt_tokens": 2})))
        .await;
    assert_eq!(v["usage"]["prompt_tokens"], 2, "{v}");
    // chat honours n.
    let (st, v) = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                    "n": 3, "seed": 1}),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"].as_array().map(Vec::len), Some(3), "{v}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_logprobs_report_the_prompt_as_vllm_does() {
    let s = TestServer::start(|c| c).await;
    let tok = common::tokenizer(&s.dir);
    let ids: Vec<u32> = (40..48).collect();
    let path = "/v1/completions";
    let (st, v) = s
        .post(
            path,
            &json!({"prompt": ids, "max_tokens": 1, "prompt_logprobs": 2}),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let pl = v["choices"][0]["prompt_logprobs"].as_array().unwrap();
    assert_eq!(pl.len(), ids.len());
    assert_eq!(pl[0], Value::Null);
    // The same numbers as the echoed prompt's legacy logprobs (one computation).
    let (_, echo) = s
        .post(
            path,
            &json!({"prompt": ids, "max_tokens": 0, "echo": true, "logprobs": 2}),
        )
        .await;
    let legacy = &echo["choices"][0]["logprobs"];
    for (i, &id) in ids.iter().enumerate().skip(1) {
        let pos = pl[i].as_object().unwrap();
        let own = &pos[&id.to_string()];
        let lp = own["logprob"].as_f64().unwrap();
        let want = legacy["token_logprobs"][i].as_f64().unwrap();
        assert!((lp - want).abs() < 1e-6, "position {i}: {lp} vs {want}");
        assert_eq!(
            own["decoded_token"],
            json!(tok.decode(&[id], false).unwrap())
        );
        assert!(own["rank"].as_u64().unwrap() >= 1);
        // the top 2 (ranks 1 and 2) and the prompt's own token
        assert!(pos.len() == 2 || pos.len() == 3, "{pos:?}");
        let mut ranks: Vec<u64> = pos
            .iter()
            .filter(|(k, _)| **k != id.to_string())
            .map(|(_, e)| e["rank"].as_u64().unwrap())
            .collect();
        ranks.sort_unstable();
        assert!(ranks == [1, 2] || ranks.len() == 1, "{pos:?}");
        let top = legacy["top_logprobs"][i].as_object().unwrap();
        let best = pos.values().find(|e| e["rank"] == 1).unwrap();
        let best_legacy = top[best["decoded_token"].as_str().unwrap()]
            .as_f64()
            .unwrap();
        assert!((best["logprob"].as_f64().unwrap() - best_legacy).abs() < 1e-6);
    }
    // 0: the prompt's own tokens only; absent when not asked for
    let (_, v) = s
        .post(
            path,
            &json!({"prompt": ids, "max_tokens": 1, "prompt_logprobs": 0}),
        )
        .await;
    let pl = v["choices"][0]["prompt_logprobs"].as_array().unwrap();
    assert!(pl[1..].iter().all(|p| p.as_object().unwrap().len() == 1));
    assert!(echo["choices"][0].get("prompt_logprobs").is_none());

    // Chat: one list for the response, over the rendered prompt.
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
                      "n": 2, "prompt_logprobs": 1});
    let (st, v) = s.post("/v1/chat/completions", &chat).await;
    assert_eq!(st, 200, "{v}");
    let pl = v["prompt_logprobs"].as_array().unwrap();
    assert_eq!(
        pl.len() as u64,
        v["usage"]["prompt_tokens"].as_u64().unwrap()
    );
    assert_eq!(pl[0], Value::Null);
    assert!(pl[1..].iter().all(|p| p.is_object()));

    // Refused by name: the whole vocabulary, more than the server's most, or streamed.
    for bad in [
        json!({"prompt_logprobs": -1}),
        json!({"prompt_logprobs": 21}),
        json!({"prompt_logprobs": 1, "stream": true}),
    ] {
        let mut body = json!({"prompt": ids, "max_tokens": 1});
        for (k, x) in bad.as_object().unwrap() {
            body[k] = x.clone();
        }
        let (st, v) = s.post(path, &body).await;
        assert_eq!(st, 400, "{bad}: {v}");
        assert_eq!(v["error"]["param"], "prompt_logprobs", "{v}");
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_special_tokens_adds_the_tokenizers_bos_as_vllm_does() {
    // The tiny model with a tokenizer that adds a BOS (`<|pad|>`, which no template writes).
    let s = TestServer::start_with(
        |dir| {
            common::tiny_model::write_tiny_model(dir, 7)?;
            let path = dir.join("tokenizer_config.json");
            let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
            config["add_bos_token"] = json!(true);
            config["bos_token"] = json!("<|pad|>");
            std::fs::write(&path, config.to_string())?;
            Ok(())
        },
        |c| c,
    )
    .await;
    let prompt_tokens = |v: &Value| v["usage"]["prompt_tokens"].as_u64().unwrap();
    let n = common::encode(&s.dir, "Hello world").len() as u64;
    // Completions: default true, BOS first (the echoed prompt shows it).
    let body = |extra: Value| {
        let mut b = json!({"prompt": "Hello world", "max_tokens": 0, "echo": true,
                           "logprobs": 0});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let tokens = |v: &Value| v["choices"][0]["logprobs"]["tokens"].clone();
    let (_, with) = s.post("/v1/completions", &body(json!({}))).await;
    assert_eq!(prompt_tokens(&with), n + 1, "{with}");
    assert_eq!(tokens(&with)[0], "<|pad|>", "{with}");
    let (_, explicit) = s
        .post(
            "/v1/completions",
            &body(json!({"add_special_tokens": true})),
        )
        .await;
    assert_eq!(tokens(&explicit), tokens(&with));
    let (_, without) = s
        .post(
            "/v1/completions",
            &body(json!({"add_special_tokens": false})),
        )
        .await;
    assert_eq!(prompt_tokens(&without), n, "{without}");
    assert_ne!(tokens(&without)[0], "<|pad|>");
    // Token-id prompts are used as they are.
    let (_, ids) = s
        .post(
            "/v1/completions",
            &json!({"prompt": [40, 41], "max_tokens": 1, "add_special_tokens": true}),
        )
        .await;
    assert_eq!(prompt_tokens(&ids), 2, "{ids}");
    // Chat: default false (the template writes what it needs); true adds the BOS.
    let chat = |extra: Value| {
        let mut b = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let (_, plain) = s.post("/v1/chat/completions", &chat(json!({}))).await;
    let (_, with) = s
        .post(
            "/v1/chat/completions",
            &chat(json!({"add_special_tokens": true})),
        )
        .await;
    assert_eq!(prompt_tokens(&with), prompt_tokens(&plain) + 1, "{with}");
    s.stop().await;
}
