//! Tool calls the request forces (`tool_choice: "required"` or a named function), done as vLLM
//! does them: the output is constrained to JSON by a schema built from the tools
//! ([`ForcedCalls::schema`]), and that JSON is turned into the calls directly, whatever the
//! model's own tool-call markup (`--tool-call-parser`) is. Named: the output is the function's
//! arguments object, streamed as argument fragments. Required: a JSON array of
//! `{"name", "parameters"}` objects, at least one (one with `parallel_tool_calls: false`),
//! turned into calls when it is complete.

use serde_json::{json, Value};

use super::Event;

/// Which calls are forced.
#[derive(Debug, Clone)]
enum Kind {
    /// This function, once.
    Named(String),
    /// At least one call of any of the tools.
    Required,
}

/// The parser of one choice's forced tool calls.
#[derive(Debug, Clone)]
pub(crate) struct ForcedCalls {
    kind: Kind,
    /// The tools' definitions.
    tools: Vec<Value>,
    /// At most one call.
    single: bool,
    /// The generated text so far (required: parsed at the end).
    text: String,
    /// Calls announced so far.
    calls: usize,
}

impl ForcedCalls {
    /// A call of function `name` of `tools`.
    pub fn named(name: &str, tools: Vec<Value>) -> Self {
        Self::new(Kind::Named(name.to_string()), tools, true)
    }

    /// At least one call of `tools` (exactly one when `single`).
    pub fn required(tools: Vec<Value>, single: bool) -> Self {
        Self::new(Kind::Required, tools, single)
    }

    fn new(kind: Kind, tools: Vec<Value>, single: bool) -> Self {
        Self {
            kind,
            tools,
            single,
            text: String::new(),
            calls: 0,
        }
    }

    /// The JSON schema the output is constrained to (vLLM's `_get_json_schema_from_tool`, with
    /// the wrapper objects closed to other keys).
    pub fn schema(&self) -> Value {
        match &self.kind {
            Kind::Named(name) => self
                .tools
                .iter()
                .find(|t| t.pointer("/function/name").and_then(Value::as_str) == Some(name))
                .map_or_else(|| json!({"type": "object"}), parameters),
            Kind::Required => {
                let calls: Vec<Value> = self
                    .tools
                    .iter()
                    .map(|t| {
                        let name = t.pointer("/function/name").cloned().unwrap_or(Value::Null);
                        json!({
                            "type": "object",
                            "properties": {
                                "name": {"type": "string", "enum": [name]},
                                "parameters": parameters(t),
                            },
                            "required": ["name", "parameters"],
                            "additionalProperties": false,
                        })
                    })
                    .collect();
                let mut schema = json!({"type": "array", "minItems": 1,
                                        "items": {"anyOf": calls}});
                if self.single {
                    schema["maxItems"] = json!(1);
                }
                schema
            }
        }
    }

    /// The events of the next piece of generated text.
    pub fn push(&mut self, text: &str, new_id: impl Fn() -> String) -> Vec<Event> {
        self.text.push_str(text);
        let Kind::Named(name) = &self.kind else {
            return Vec::new();
        };
        let mut out = Vec::new();
        if self.calls == 0 {
            self.calls = 1;
            out.push(Event::ToolCall {
                index: 0,
                id: new_id(),
                name: name.clone(),
            });
        }
        if !text.is_empty() {
            out.push(Event::ToolArgs {
                index: 0,
                fragment: text.to_string(),
            });
        }
        out
    }

    /// The end of the generation: a named call announced if nothing was generated; the
    /// required calls, or the text as content if it is not a complete list of calls (cut by
    /// `max_tokens`).
    pub fn finish(&mut self, new_id: impl Fn() -> String) -> Vec<Event> {
        if let Kind::Named(_) = self.kind {
            return if self.calls == 0 {
                self.push("", new_id)
            } else {
                Vec::new()
            };
        }
        let Ok(Value::Array(items)) = serde_json::from_str::<Value>(&self.text) else {
            return vec![Event::Content(std::mem::take(&mut self.text))];
        };
        let mut out = Vec::new();
        for item in items {
            let name = item["name"].as_str().unwrap_or_default().to_string();
            let arguments = item.get("parameters").cloned().unwrap_or(json!({}));
            let index = self.calls;
            self.calls += 1;
            out.push(Event::ToolCall {
                index,
                id: new_id(),
                name,
            });
            out.push(Event::ToolArgs {
                index,
                fragment: arguments.to_string(),
            });
        }
        out
    }

    /// Whether a call was made.
    pub fn called(&self) -> bool {
        self.calls > 0
    }
}

/// A tool's parameters schema (an empty object's when it has none).
fn parameters(tool: &Value) -> Value {
    match tool.pointer("/function/parameters") {
        Some(p @ Value::Object(_)) => p.clone(),
        _ => json!({"type": "object", "properties": {}}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parsers::ParsedMessage;

    fn tools() -> Vec<Value> {
        vec![
            json!({"type": "function", "function": {"name": "add", "parameters":
                {"type": "object", "properties": {"a": {"type": "integer"}}}}}),
            json!({"type": "function", "function": {"name": "now"}}),
        ]
    }

    fn id() -> String {
        "call-1".into()
    }

    #[test]
    fn named_streams_the_arguments_as_they_come() {
        let mut f = ForcedCalls::named("add", tools());
        assert_eq!(f.schema()["properties"]["a"]["type"], "integer");
        let mut msg = ParsedMessage::default();
        for piece in ["{\"a\"", ": 4", "}"] {
            msg.extend(f.push(piece, id));
        }
        msg.extend(f.finish(id));
        assert!(f.called());
        assert_eq!(msg.tool_calls.len(), 1);
        assert_eq!(msg.tool_calls[0].name, "add");
        assert_eq!(msg.tool_calls[0].arguments, "{\"a\": 4}");
        assert_eq!(msg.content, None);
    }

    #[test]
    fn required_turns_the_array_into_calls() {
        let mut f = ForcedCalls::required(tools(), false);
        let schema = f.schema();
        assert_eq!(schema["minItems"], 1);
        assert!(schema.get("maxItems").is_none());
        assert_eq!(
            schema["items"]["anyOf"][1]["properties"]["name"]["enum"][0],
            "now"
        );
        assert_eq!(ForcedCalls::required(tools(), true).schema()["maxItems"], 1);
        let mut msg = ParsedMessage::default();
        msg.extend(f.push("[{\"name\": \"add\", \"parameters\": {\"a\": 1}}, ", id));
        msg.extend(f.push("{\"name\": \"now\", \"parameters\": {}}]", id));
        msg.extend(f.finish(id));
        let names: Vec<&str> = msg.tool_calls.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["add", "now"]);
        assert_eq!(msg.tool_calls[0].arguments, "{\"a\":1}");
        // cut short: the text stays content, no call
        let mut f = ForcedCalls::required(tools(), false);
        f.push("[{\"name\": \"ad", id);
        let mut msg = ParsedMessage::default();
        msg.extend(f.finish(id));
        assert!(!f.called());
        assert_eq!(msg.content.as_deref(), Some("[{\"name\": \"ad"));
    }
}
