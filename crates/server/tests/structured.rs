//! Structured output through the real server on the tiny random model: whatever the weights,
//! a constrained output follows its constraint (`response_format: json_schema` output parses
//! and validates against the schema, over several seeds at temperature 1); regex, choice and
//! grammar constraints on completions; forced tool calls (`tool_choice` required or named)
//! come back as `tool_calls` whose arguments follow the tool's parameters; a constraint that
//! does not compile, or two of them, is a 400 naming the field before anything is generated.

mod common;

use common::TestServer;
use serde_json::{json, Value};

fn schema() -> Value {
    json!({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["red", "green"]}, "maxItems": 3}},
        "required": ["name", "age", "ok"], "additionalProperties": false})
}

fn chat(extra: Value) -> Value {
    let mut body = json!({
        "messages": [{"role": "user", "content": "Describe a person."}],
        "max_tokens": 120,
        "temperature": 1,
    });
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            b.insert(k.clone(), v.clone());
        }
    }
    body
}

fn assert_valid(schema: &Value, text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
    let validator = jsonschema::validator_for(schema).expect("a valid schema");
    let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{text}: {errors:?}");
}

#[tokio::test]
async fn json_schema_output_always_parses_and_validates() {
    let s = TestServer::start(|c| c).await;
    let schema = schema();
    let format = json!({"type": "json_schema",
        "json_schema": {"name": "person", "schema": schema, "strict": true}});
    for seed in 0..6 {
        let (status, v) = s
            .post(
                "/v1/chat/completions",
                &chat(json!({"response_format": format, "seed": seed, "n": 2})),
            )
            .await;
        assert_eq!(status, 200, "{v}");
        for c in v["choices"].as_array().expect("choices") {
            assert_eq!(c["finish_reason"], "stop", "{c}");
            assert_valid(&schema, c["message"]["content"].as_str().unwrap_or(""));
        }
    }
    // vLLM's spellings and a stream: the same guarantee.
    for extra in [
        json!({"structured_outputs": {"json": schema}, "seed": 11}),
        json!({"guided_json": schema.to_string(), "seed": 12}),
    ] {
        let (status, v) = s.post("/v1/chat/completions", &chat(extra)).await;
        assert_eq!(status, 200, "{v}");
        assert_valid(
            &schema,
            v["choices"][0]["message"]["content"].as_str().unwrap_or(""),
        );
    }
    let chunks = s
        .stream(
            "/v1/chat/completions",
            &chat(json!({"response_format": format, "seed": 13, "stream": true})),
        )
        .await;
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_valid(&schema, &text);
    // json_object: an object (the schema of any object, bounded here by max_tokens: a random
    // model may not close it, so only a finished one is checked).
    let (status, v) = s
        .post(
            "/v1/chat/completions",
            &chat(json!({"response_format": {"type": "json_object"}, "seed": 3})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let text = v["choices"][0]["message"]["content"].as_str().unwrap_or("");
    assert!(text.starts_with('{'), "{text}");
    if v["choices"][0]["finish_reason"] == "stop" {
        assert!(
            serde_json::from_str::<Value>(text).is_ok_and(|v| v.is_object()),
            "{text}"
        );
    }
    s.stop().await;
}

#[tokio::test]
async fn regex_choice_and_grammar_constrain_completions() {
    let s = TestServer::start(|c| c).await;
    let complete = |extra: Value| {
        let mut body = json!({"prompt": "The answer is", "max_tokens": 40, "temperature": 1,
                              "n": 3, "seed": 5});
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                b.insert(k.clone(), v.clone());
            }
        }
        body
    };
    let texts = |v: &Value| -> Vec<String> {
        v["choices"]
            .as_array()
            .expect("choices")
            .iter()
            .map(|c| c["text"].as_str().unwrap_or("").to_string())
            .collect()
    };
    let (status, v) = s
        .post(
            "/v1/completions",
            &complete(json!({"guided_regex": "[0-9]{3}-[a-z]{2}"})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    for t in texts(&v) {
        let b = t.as_bytes();
        assert!(
            b.len() == 6 && b[3] == b'-' && b[..3].iter().all(u8::is_ascii_digit),
            "{t}"
        );
    }
    let (status, v) = s
        .post(
            "/v1/completions",
            &complete(json!({"structured_outputs": {"choice": ["Paris", "Rome"]}})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert!(texts(&v).iter().all(|t| t == "Paris" || t == "Rome"), "{v}");
    let (status, v) = s
        .post(
            "/v1/completions",
            &complete(json!({"guided_grammar": "start: \"(\" D (\"+\" D)* \")\"\nD: /[0-9]/"})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    for t in texts(&v) {
        let finished = t.ends_with(')');
        assert!(t.starts_with('('), "{t}");
        let inner = t.trim_start_matches('(').trim_end_matches(')');
        assert!(inner.split('+').all(|d| d.len() <= 1), "{t}");
        assert!(finished || t.len() >= 30, "{t}");
    }
    s.stop().await;
}

#[tokio::test]
async fn forced_tool_calls_follow_the_tools_parameters() {
    let s = TestServer::start(|c| c).await;
    let params = json!({"type": "object", "properties": {
        "city": {"enum": ["Paris", "Rome"]}, "days": {"type": "integer", "minimum": 1,
        "maximum": 7}}, "required": ["city", "days"], "additionalProperties": false});
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": params}},
        {"type": "function", "function": {"name": "get_time", "parameters":
            {"type": "object", "properties": {}, "additionalProperties": false}}}]);
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    for (choice, seed) in [
        (named.clone(), 1),
        (json!("required"), 2),
        (json!("required"), 3),
    ] {
        let body = chat(json!({"tools": tools, "tool_choice": choice, "seed": seed,
                               "parallel_tool_calls": false}));
        let (status, v) = s.post("/v1/chat/completions", &body).await;
        assert_eq!(status, 200, "{v}");
        let c = &v["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls", "{v}");
        let calls = c["message"]["tool_calls"].as_array().expect("tool_calls");
        assert_eq!(calls.len(), 1, "{v}");
        let name = calls[0]["function"]["name"].as_str().unwrap_or("");
        if choice == named {
            assert_eq!(name, "get_weather");
        }
        let args = calls[0]["function"]["arguments"].as_str().unwrap_or("");
        let schema = if name == "get_weather" {
            params.clone()
        } else {
            json!({"type": "object", "additionalProperties": false})
        };
        assert_valid(&schema, args);
        assert!(calls[0]["id"].as_str().is_some_and(|id| !id.is_empty()));
    }
    // Streamed: the call arrives as tool-call deltas, never as content.
    let chunks = s
        .stream(
            "/v1/chat/completions",
            &chat(json!({"tools": tools, "tool_choice": named, "seed": 4, "stream": true})),
        )
        .await;
    let deltas: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
        .flatten()
        .collect();
    assert_eq!(deltas[0]["function"]["name"], "get_weather");
    let args: String = deltas
        .iter()
        .filter_map(|d| d["function"]["arguments"].as_str())
        .collect();
    assert_valid(&params, &args);
    assert!(chunks.iter().all(|c| c["choices"][0]["delta"]["content"]
        .as_str()
        .unwrap_or("")
        .is_empty()));
    s.stop().await;
}

#[tokio::test]
async fn bad_or_double_constraints_are_refused_by_field() {
    let s = TestServer::start(|c| c).await;
    for (path, body, field) in [
        (
            "/v1/completions",
            json!({"prompt": "x", "guided_regex": "a("}),
            "guided_regex",
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "structured_outputs": {"grammar": "start: undefined_rule"}}),
            "structured_outputs.grammar",
        ),
        (
            "/v1/chat/completions",
            chat(
                json!({"response_format": {"type": "json_schema", "json_schema":
                {"name": "x", "schema": {"type": "integer", "minimum": 5, "maximum": 1}}}}),
            ),
            "response_format",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"response_format": {"type": "json_object"}, "guided_choice": ["a"]})),
            "guided_choice",
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "structured_outputs": {"structural_tag": "{}"}}),
            "structured_outputs.structural_tag",
        ),
    ] {
        let (status, v) = s.post(path, &body).await;
        assert_eq!(status, 400, "{body}: {v}");
        assert_eq!(v["error"]["param"], field, "{v}");
    }
    // Nothing was generated for them.
    assert_eq!(s.metric("fp4forge_generation_tokens_total").await, 0.0);
    s.stop().await;
}
