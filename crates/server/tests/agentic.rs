//! The agentic chat API end to end, through the real server: the real Laguna-S-2.1 chat
//! template, tool calls parsed by `poolside_v1` into OpenAI `tool_calls` with typed arguments,
//! reasoning split into `reasoning_content`, streamed and not, thinking on and off; the next
//! turn with the assistant's tool call and the tool's result. The model is a scripted tiny
//! Llama (`common/script_model.rs`) whose greedy output is fixed.

mod common;

use common::{script_model::write_laguna_agent, TestServer};
use fp4forge_server::{ReasoningFormat, ToolFormat};
use serde_json::{json, Value};

async fn server(tools: bool, reasoning: bool) -> TestServer {
    TestServer::start_with(write_laguna_agent, |c| {
        c.enable_auto_tool_choice(tools)
            .tool_call_parser(tools.then_some(ToolFormat::PoolsideV1))
            .reasoning_parser(reasoning.then_some(ReasoningFormat::PoolsideV1))
    })
    .await
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {"name": "get_weather",
        "description": "Weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}})
}

fn request(extra: Value) -> Value {
    let mut body = json!({
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [weather_tool()],
        "max_tokens": 32,
        "temperature": 0,
    });
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            b.insert(k.clone(), v.clone());
        }
    }
    body
}

#[tokio::test]
async fn tool_call_and_reasoning_not_streamed() {
    let s = server(true, true).await;
    let (status, body) = s.post("/v1/chat/completions", &request(json!({}))).await;
    assert_eq!(status, 200, "{body}");
    let choice = &body["choices"][0];
    let msg = &choice["message"];
    assert_eq!(msg["reasoning_content"], "Paris is a city.", "{body}");
    assert_eq!(msg["content"], "Checking.", "{body}");
    let call = &msg["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    assert_eq!(call["function"]["arguments"], "{\"city\": \"Paris\"}");
    assert!(call["id"].as_str().unwrap().starts_with("chatcmpl-tool-"));
    assert_eq!(choice["finish_reason"], "tool_calls");

    // Thinking off: the template closes the think block in the prompt; no reasoning.
    let (_, off) = s
        .post(
            "/v1/chat/completions",
            &request(json!({"chat_template_kwargs": {"enable_thinking": false}})),
        )
        .await;
    let msg = &off["choices"][0]["message"];
    assert!(msg.get("reasoning_content").is_none(), "{off}");
    assert_eq!(msg["content"], "Checking.");
    assert_eq!(msg["tool_calls"][0]["function"]["name"], "get_weather");

    // include_reasoning: false drops it.
    let (_, hidden) = s
        .post(
            "/v1/chat/completions",
            &request(json!({"include_reasoning": false})),
        )
        .await;
    assert!(hidden["choices"][0]["message"]
        .get("reasoning_content")
        .is_none());
    s.stop().await;
}

#[tokio::test]
async fn tool_call_and_reasoning_streamed() {
    let s = server(true, true).await;
    let events = s
        .stream("/v1/chat/completions", &request(json!({"stream": true})))
        .await;
    let (mut reasoning, mut content, mut name, mut args, mut finish) = (
        String::new(),
        String::new(),
        String::new(),
        String::new(),
        String::new(),
    );
    let mut ids = Vec::new();
    for e in events.iter().filter(|e| e.is_object()) {
        let c = &e["choices"][0];
        let d = &c["delta"];
        reasoning += d["reasoning_content"].as_str().unwrap_or("");
        content += d["content"].as_str().unwrap_or("");
        for t in d["tool_calls"].as_array().into_iter().flatten() {
            assert_eq!(t["index"], 0);
            if let Some(id) = t["id"].as_str() {
                ids.push(id.to_string());
                assert_eq!(t["type"], "function");
            }
            name += t["function"]["name"].as_str().unwrap_or("");
            args += t["function"]["arguments"].as_str().unwrap_or("");
        }
        if let Some(f) = c["finish_reason"].as_str() {
            finish = f.to_string();
        }
        // No markup leaks into content or reasoning.
        assert!(!content.contains('<') && !reasoning.contains('<'), "{e}");
    }
    assert_eq!(reasoning, "Paris is a city.");
    assert_eq!(content, "Checking.");
    assert_eq!(ids.len(), 1, "one header delta");
    assert_eq!(name, "get_weather");
    assert_eq!(args, "{\"city\": \"Paris\"}");
    assert_eq!(finish, "tool_calls");
    assert_eq!(events.last(), Some(&json!("[DONE]")));
    s.stop().await;
}

#[tokio::test]
async fn the_next_turn_carries_the_call_and_its_result() {
    let s = server(true, true).await;
    let body = request(json!({"messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "reasoning_content": "Paris is a city.",
         "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 2}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 3}"},
    ]}));
    let (status, out) = s.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{out}");
    // The rendered prompt holds the call with typed arguments and the tool result (the golden
    // render test proves the template's bytes; here the prompt length shows they were used).
    let (_, bare) = s.post("/v1/chat/completions", &request(json!({}))).await;
    let longer = out["usage"]["prompt_tokens"].as_u64().unwrap();
    let shorter = bare["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(longer > shorter + 10, "{longer} vs {shorter}");
    // A bad arguments string is a 400 naming the field.
    let bad = request(json!({"messages": [
        {"role": "assistant", "tool_calls": [{"id": "x", "type": "function",
            "function": {"name": "f", "arguments": "{not json"}}]}]}));
    let (status, err) = s.post("/v1/chat/completions", &bad).await;
    assert_eq!(status, 400);
    assert_eq!(
        err["error"]["param"], "messages[0].tool_calls[0].function.arguments",
        "{err}"
    );
    s.stop().await;
}

#[tokio::test]
async fn without_parsers_the_text_is_content_and_tools_need_the_flag() {
    let s = server(false, false).await;
    let (status, err) = s.post("/v1/chat/completions", &request(json!({}))).await;
    assert_eq!(status, 400);
    assert_eq!(err["error"]["param"], "tools", "{err}");
    let mut plain = request(json!({}));
    plain.as_object_mut().unwrap().remove("tools");
    let (status, out) = s.post("/v1/chat/completions", &plain).await;
    assert_eq!(status, 200, "{out}");
    // Special tokens are dropped from plain content (as vLLM's skip_special_tokens does).
    assert_eq!(
        out["choices"][0]["message"]["content"],
        "Paris is a city.Checking.get_weathercityParis"
    );
    assert_eq!(out["choices"][0]["finish_reason"], "stop");
    // tool_choice "none" with tools: no parsing, no error.
    let (status, _) = s
        .post(
            "/v1/chat/completions",
            &request(json!({"tool_choice": "none"})),
        )
        .await;
    assert_eq!(status, 200);
    // "required" and named choices need constrained decoding: refused by name.
    let (status, err) = s
        .post(
            "/v1/chat/completions",
            &request(json!({"tool_choice": "required"})),
        )
        .await;
    assert_eq!(
        (status, err["error"]["param"].as_str()),
        (400, Some("tool_choice"))
    );
    s.stop().await;
}
