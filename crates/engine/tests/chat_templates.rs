//! Every real model's chat template (../shared/data/chat-templates, copied into
//! `fixtures/chat_templates/templates/`) renders every conversation of
//! `fixtures/chat_templates/renders.json` byte for byte as transformers 5.17 renders it
//! (`tools/reference/make_chat_template_fixtures.py`): system prompts, tool definitions, assistant
//! tool calls, tool results, reasoning, `enable_thinking`, `continue_final_message`, documents.
//! Where transformers' render fails (a template refusing a conversation), ours fails too, with
//! one known exception: a `{% for %}` over `none` (the Hermes tool-use template given no tools)
//! is an error in Jinja2 and an empty loop in minijinja; those cases must still be errors in
//! transformers, so the exception cannot hide a render that differs.

use std::path::Path;

use fp4forge_engine::{ChatInput, ChatTemplate};
use serde_json::Value;

fn fixtures() -> &'static Path {
    Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/chat_templates"
    ))
}

/// A case transformers fails only because its template loops over `tools` while it is `none`.
fn loops_over_none(case: &Value) -> bool {
    case["error"].as_str() == Some("'NoneType' object is not iterable") && case["tools"].is_null()
}

#[test]
fn real_templates_render_as_transformers_does() {
    // The fixtures pin strftime_now's date.
    std::env::set_var("FP4FORGE_CHAT_DATE", "2026-01-15");
    let text = std::fs::read_to_string(fixtures().join("renders.json")).expect("renders.json");
    let golden: Value = serde_json::from_str(&text).expect("renders.json parses");
    let bos = golden["bos_token"].as_str().unwrap_or_default().to_string();
    let eos = golden["eos_token"].as_str().unwrap_or_default().to_string();
    let cases = golden["cases"].as_array().expect("cases");
    assert!(cases.len() >= 98, "{} cases", cases.len());
    let mut failures = Vec::new();
    for case in cases {
        let name = format!("{} / {}", case["template"], case["case"]);
        let path = fixtures()
            .join("templates")
            .join(case["template"].as_str().expect("template"));
        let source = std::fs::read_to_string(&path).expect("template file");
        let template = match ChatTemplate::new(&source, &path, bos.clone(), eos.clone()) {
            Ok(t) => t,
            Err(e) => {
                failures.push(format!("{name}: does not compile: {e}"));
                continue;
            }
        };
        let list = |v: &Value| v.as_array().cloned();
        let input = ChatInput {
            messages: list(&case["messages"]).expect("messages"),
            tools: list(&case["tools"]),
            documents: list(&case["documents"]),
            add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap_or(false),
            continue_final_message: case["continue_final_message"].as_bool().unwrap_or(false),
            kwargs: case["kwargs"].as_object().cloned().unwrap_or_default(),
        };
        let ours = template.render_input(&input);
        match (case.get("rendered").and_then(Value::as_str), ours) {
            (Some(want), Ok(got)) if want == got => {}
            (Some(want), Ok(got)) => {
                let at = want
                    .char_indices()
                    .zip(got.chars())
                    .find(|((_, a), b)| a != b)
                    .map_or(want.len().min(got.len()), |((i, _), _)| i);
                let lo = at.saturating_sub(40);
                failures.push(format!(
                    "{name}: differs at byte {at}:\n  want …{:?}\n  got  …{:?}",
                    want.get(lo..(at + 60).min(want.len())).unwrap_or(""),
                    got.get(lo..(at + 60).min(got.len())).unwrap_or("")
                ));
            }
            (Some(_), Err(e)) => failures.push(format!("{name}: fails: {e}")),
            (None, Ok(_)) if loops_over_none(case) => {}
            (None, Ok(got)) => failures.push(format!(
                "{name}: transformers fails ({}), ours renders {} bytes",
                case["error"],
                got.len()
            )),
            (None, Err(_)) => {}
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} renders differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}
