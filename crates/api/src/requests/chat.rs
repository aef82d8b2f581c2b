//! `POST /v1/chat/completions`: [`ChatCompletionRequest`] and its [`ChatMessage`]s.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::structured::{self, STRUCTURED_FIELDS};
use super::{
    int_in, stream_options_error, GenerationRequest, Limits, Sampling, Stop, StreamOptions,
};
use crate::error::RequestError;
use crate::integer::Integer;
use crate::parse::{describe, type_name, Field, Unimplemented, WireRequest};

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions.
    System,
    /// Instructions (OpenAI's newer name for `system` on reasoning models).
    Developer,
    /// The user.
    User,
    /// The model.
    Assistant,
    /// A tool's result.
    Tool,
}

impl Role {
    /// Every role, in the order messages list them.
    pub const ALL: [Role; 5] = [
        Role::System,
        Role::Developer,
        Role::User,
        Role::Assistant,
        Role::Tool,
    ];

    /// The role as the wire and chat templates spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::System => "system",
            Self::Developer => "developer",
            Self::User => "user",
            Self::Assistant => "assistant",
            Self::Tool => "tool",
        }
    }
}

/// One part of a message's content; only text parts exist here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ContentPart {
    /// `{"type": "text", "text": ...}`.
    Text {
        /// The text.
        text: String,
    },
}

/// A message's content: a string or a list of text parts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// Text parts, concatenated.
    Parts(Vec<ContentPart>),
}

/// One message of a conversation, as OpenAI and vLLM accept it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatMessage {
    /// Who wrote it.
    pub role: Role,
    /// What it says (`null` or absent: nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<MessageContent>,
    /// A participant's or tool's name (given to the chat template).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// An assistant message's tool calls (given to the chat template, arguments as objects).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<MessageToolCall>>,
    /// A tool message: the id of the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// An assistant message's reasoning (vLLM's field; the template decides whether to show it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// vLLM's newer name for `reasoning_content`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
}

/// A tool call in an assistant message of the conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessageToolCall {
    /// Its id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `function`.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The function called.
    pub function: MessageFunction,
}

/// The function of a tool call in the conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessageFunction {
    /// Its name.
    pub name: String,
    /// Its arguments: an object's JSON text (as OpenAI sends them) or the object itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<Value>,
}

/// `tool_choice`: whether and which tool the model must call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// Never: tool calls are not parsed.
    None,
    /// The model decides (the default when tools are given).
    Auto,
    /// At least one call.
    Required,
    /// This function.
    Function(String),
}

impl ChatMessage {
    /// The content as one string (text parts joined with newlines, as vLLM joins them; none:
    /// empty).
    pub fn text(&self) -> String {
        match &self.content {
            None => String::new(),
            Some(MessageContent::Text(s)) => s.clone(),
            Some(MessageContent::Parts(parts)) => parts
                .iter()
                .map(|ContentPart::Text { text }| text.as_str())
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }
}

wire_request! {
/// The body of `POST /v1/chat/completions`. Unknown fields are refused (see
/// [`WireRequest::FIELDS`] and [`WireRequest::UNIMPLEMENTED`]).
///
/// Accepted and ignored (no effect on the result): `user`, `store`, `metadata`,
/// `service_tier`.
pub struct ChatCompletionRequest {
    /// The conversation (required, non-empty).
    pub messages: Option<Vec<ChatMessage>>,
    /// OpenAI's newer name for `max_tokens` (wins when both are given).
    pub max_completion_tokens: Option<Integer>,
    /// Return each generated token's logprob.
    pub logprobs: Option<bool>,
    /// Top alternatives per generated token (needs `logprobs: true`).
    pub top_logprobs: Option<Integer>,
    /// Tool definitions (`{"type": "function", "function": {"name", "description",
    /// "parameters"}}`), given to the chat template and to the tool-call parser.
    pub tools: Option<Vec<Value>>,
    /// `none`, `auto`, `required` or `{"type": "function", "function": {"name": …}}`.
    pub tool_choice: Option<Value>,
    /// `false`: at most one tool call per message.
    pub parallel_tool_calls: Option<bool>,
    /// A chat template (Jinja source) for this request instead of the model's.
    pub chat_template: Option<String>,
    /// Extra chat-template variables (`enable_thinking`, …).
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// Append the assistant's turn opener (default true).
    pub add_generation_prompt: Option<bool>,
    /// Continue the final (assistant) message instead of starting a new one.
    pub continue_final_message: Option<bool>,
    /// vLLM: tokenize the rendered prompt with the tokenizer's special tokens (its BOS, when it
    /// adds one and the template did not write it); default false, the template writes them.
    pub add_special_tokens: Option<bool>,
    /// Documents for retrieval-augmented templates (objects with `title` and `text`).
    pub documents: Option<Vec<Map<String, Value>>>,
    /// vLLM: `false` leaves the reasoning out of the response (default true).
    pub include_reasoning: Option<bool>,
    /// Accepted and ignored: OpenAI's "store this completion".
    pub store: Option<bool>,
    /// Accepted and ignored: tags for stored completions.
    pub metadata: Option<Map<String, Value>>,
    /// Accepted and ignored: OpenAI's processing tier.
    pub service_tier: Option<String>,
}
}

impl ChatCompletionRequest {
    /// The token budget asked for and the field that asked (`max_completion_tokens` wins).
    pub fn max_tokens_field(&self) -> Option<(&'static str, Integer)> {
        self.max_completion_tokens
            .map(|m| ("max_completion_tokens", m))
            .or(self.max_tokens.map(|m| ("max_tokens", m)))
    }

    /// The tool choice (default `auto` when tools are given, else `none`). Valid after
    /// [`GenerationRequest::validate`].
    pub fn tool_choice(&self) -> ToolChoice {
        match &self.tool_choice {
            Some(Value::String(s)) if s == "none" => ToolChoice::None,
            Some(Value::String(s)) if s == "required" => ToolChoice::Required,
            Some(Value::String(_)) => ToolChoice::Auto,
            Some(v) => match v.pointer("/function/name").and_then(Value::as_str) {
                Some(name) => ToolChoice::Function(name.to_string()),
                None => ToolChoice::Auto,
            },
            None if self.tools.as_ref().is_some_and(|t| !t.is_empty()) => ToolChoice::Auto,
            None => ToolChoice::None,
        }
    }

    /// Top logprobs per generated token when `logprobs: true` (0 alternatives unless
    /// `top_logprobs`), else `None`. Valid after [`GenerationRequest::validate`].
    pub fn top_logprobs(&self) -> Option<usize> {
        (self.logprobs == Some(true))
            .then(|| self.top_logprobs.and_then(Integer::to_usize).unwrap_or(0))
    }
}

impl WireRequest for ChatCompletionRequest {
    /// The checks of its own fields: ranges, `limits`, messages
    /// present and not empty, `top_logprobs` only with `logprobs`.
    fn validate_fields(&self, limits: &Limits) -> Result<(), RequestError> {
        for (field, value) in [
            ("max_tokens", self.max_tokens),
            ("max_completion_tokens", self.max_completion_tokens),
        ] {
            if let Some(m) = value {
                int_in(
                    field,
                    m,
                    1,
                    limits.max_tokens as u64,
                    "this server's limit (--max-tokens-limit)",
                )?;
            }
        }
        if let Some(top) = self.top_logprobs {
            int_in(
                "top_logprobs",
                top,
                0,
                limits.max_logprobs as u64,
                "this server's limit of top logprobs",
            )?;
            if self.logprobs != Some(true) {
                return Err(RequestError::invalid(
                    "top_logprobs",
                    "`top_logprobs` needs `logprobs: true`",
                ));
            }
        }
        if let Some(tools) = &self.tools {
            for (i, tool) in tools.iter().enumerate() {
                check_tool(i, tool)?;
            }
        }
        if let Some(choice) = &self.tool_choice {
            check_tool_choice(choice, self.tools.as_deref().unwrap_or_default())?;
        }
        let constraint = self.structured().constraint()?;
        if let (Some(c), ToolChoice::Required | ToolChoice::Function(_)) =
            (&constraint, self.tool_choice())
        {
            return Err(RequestError::invalid(
                c.field.clone(),
                format!(
                    "`{}` and `tool_choice` (\"required\" or a named function) both constrain \
                     the output; give at most one",
                    c.field
                ),
            ));
        }
        if let Some(docs) = &self.documents {
            for (i, d) in docs.iter().enumerate() {
                if !d.get("text").is_some_and(Value::is_string) {
                    return Err(RequestError::invalid(
                        format!("documents[{i}].text"),
                        format!("`documents[{i}]` needs a string `text`"),
                    ));
                }
            }
        }
        if let Some(messages) = &self.messages {
            for (i, m) in messages.iter().enumerate() {
                for (j, call) in m.tool_calls.iter().flatten().enumerate() {
                    let at = format!("messages[{i}].tool_calls[{j}].function");
                    match &call.function.arguments {
                        None | Some(Value::Object(_)) => {}
                        Some(Value::String(s)) if s.trim().is_empty() => {}
                        Some(Value::String(s)) => {
                            if !serde_json::from_str::<Value>(s).is_ok_and(|v| v.is_object()) {
                                return Err(RequestError::invalid(
                                    format!("{at}.arguments"),
                                    format!("`{at}.arguments` must be a JSON object's text"),
                                ));
                            }
                        }
                        Some(other) => {
                            return Err(RequestError::invalid(
                                format!("{at}.arguments"),
                                format!(
                                    "`{at}.arguments` must be a string or an object, got {}",
                                    type_name(other)
                                ),
                            ))
                        }
                    }
                }
            }
            if self.continue_final_message == Some(true) {
                if self.add_generation_prompt == Some(true) {
                    return Err(RequestError::invalid(
                        "continue_final_message",
                        "`continue_final_message` and `add_generation_prompt` cannot both be true",
                    ));
                }
                if messages.last().is_some_and(|m| m.role != Role::Assistant) {
                    return Err(RequestError::invalid(
                        "continue_final_message",
                        "`continue_final_message` needs a final assistant message to continue",
                    ));
                }
            }
        }
        match &self.messages {
            None => Err(RequestError::Required {
                field: "messages".into(),
            }),
            Some(m) if m.is_empty() => Err(RequestError::invalid(
                "messages",
                "`messages` is empty; give at least one message",
            )),
            Some(_) => Ok(()),
        }
    }

    const FIELDS: &'static [Field] = &[
        Field {
            name: "messages",
            expected: "a list of messages",
        },
        Field {
            name: "max_completion_tokens",
            expected: "an integer",
        },
        Field {
            name: "logprobs",
            expected: "true or false",
        },
        Field {
            name: "top_logprobs",
            expected: "an integer",
        },
        Field {
            name: "tools",
            expected: "a list of tool definitions",
        },
        Field {
            name: "tool_choice",
            expected: "\"none\", \"auto\", \"required\" or a function object",
        },
        Field {
            name: "parallel_tool_calls",
            expected: "true or false",
        },
        Field {
            name: "chat_template",
            expected: "a string",
        },
        Field {
            name: "chat_template_kwargs",
            expected: "an object",
        },
        Field {
            name: "add_generation_prompt",
            expected: "true or false",
        },
        Field {
            name: "continue_final_message",
            expected: "true or false",
        },
        Field {
            name: "add_special_tokens",
            expected: "true or false",
        },
        Field {
            name: "documents",
            expected: "a list of objects",
        },
        Field {
            name: "include_reasoning",
            expected: "true or false",
        },
        Field {
            name: "store",
            expected: "true or false",
        },
        Field {
            name: "metadata",
            expected: "an object",
        },
        Field {
            name: "service_tier",
            expected: "a string",
        },
        STRUCTURED_FIELDS[0],
        STRUCTURED_FIELDS[1],
        STRUCTURED_FIELDS[2],
        STRUCTURED_FIELDS[3],
        STRUCTURED_FIELDS[4],
        STRUCTURED_FIELDS[5],
    ];
    const UNIMPLEMENTED: &'static [Unimplemented] = &CHAT_UNIMPLEMENTED;

    fn shape_error(key: &str, value: &Value) -> Option<RequestError> {
        match key {
            "messages" => messages_error(value),
            "stream_options" => Some(stream_options_error(value)),
            _ => structured::shape_error(key, value),
        }
    }
}

/// The chat-only fields fp4forge does not implement (chat `echo`, multimodal processor options).
const CHAT_ONLY_UNIMPLEMENTED: [Unimplemented; 2] = [
    Unimplemented {
        name: "echo",
        neutral: &["false"],
    },
    Unimplemented {
        name: "mm_processor_kwargs",
        neutral: &[],
    },
];

/// Checks one tool definition: `{"type": "function", "function": {"name": …}}`, `parameters` an
/// object when given.
fn check_tool(i: usize, tool: &Value) -> Result<(), RequestError> {
    let at = format!("tools[{i}]");
    if tool.get("type").and_then(Value::as_str) != Some("function") {
        return Err(RequestError::invalid(
            format!("{at}.type"),
            format!("`{at}.type` must be \"function\" (the only tool type)"),
        ));
    }
    let name = tool.pointer("/function/name").and_then(Value::as_str);
    if name.is_none_or(str::is_empty) {
        return Err(RequestError::invalid(
            format!("{at}.function.name"),
            format!("`{at}.function` needs a non-empty string `name`"),
        ));
    }
    match tool.pointer("/function/parameters") {
        None | Some(Value::Object(_)) | Some(Value::Null) => Ok(()),
        Some(other) => Err(RequestError::invalid(
            format!("{at}.function.parameters"),
            format!(
                "`{at}.function.parameters` must be a JSON schema object, got {}",
                type_name(other)
            ),
        )),
    }
}

/// Checks `tool_choice` against the tools: a known word (`required` needs tools), or a
/// function among them.
fn check_tool_choice(choice: &Value, tools: &[Value]) -> Result<(), RequestError> {
    match choice {
        Value::String(s) if s == "none" || s == "auto" => Ok(()),
        Value::String(s) if s == "required" && tools.is_empty() => Err(RequestError::invalid(
            "tool_choice",
            "`tool_choice: \"required\"` needs `tools`",
        )),
        Value::String(s) if s == "required" => Ok(()),
        Value::Object(_) => {
            let name = choice.pointer("/function/name").and_then(Value::as_str);
            match name {
                Some(n)
                    if tools.iter().any(|t| {
                        t.pointer("/function/name").and_then(Value::as_str) == Some(n)
                    }) =>
                {
                    Ok(())
                }
                Some(n) => Err(RequestError::invalid(
                    "tool_choice",
                    format!("`tool_choice` names \"{n}\", which is not among `tools`"),
                )),
                None => Err(RequestError::invalid(
                    "tool_choice",
                    "`tool_choice` must be \"none\", \"auto\", \"required\" or \
                     {\"type\": \"function\", \"function\": {\"name\": …}}",
                )),
            }
        }
        other => Err(RequestError::invalid(
            "tool_choice",
            format!(
                "`tool_choice` must be a string or an object, got {}",
                type_name(other)
            ),
        )),
    }
}

/// The shared unimplemented fields plus the chat-only ones.
const CHAT_UNIMPLEMENTED: [Unimplemented;
    super::UNIMPLEMENTED_COMMON.len() + CHAT_ONLY_UNIMPLEMENTED.len()] = {
    let mut all = [CHAT_ONLY_UNIMPLEMENTED[0];
        super::UNIMPLEMENTED_COMMON.len() + CHAT_ONLY_UNIMPLEMENTED.len()];
    let mut i = 0;
    while i < CHAT_ONLY_UNIMPLEMENTED.len() {
        all[i] = CHAT_ONLY_UNIMPLEMENTED[i];
        i += 1;
    }
    let mut j = 0;
    while j < super::UNIMPLEMENTED_COMMON.len() {
        all[i + j] = super::UNIMPLEMENTED_COMMON[j];
        j += 1;
    }
    all
};

/// What is wrong with one content part, `None` when it is a well-formed text part: its type
/// (only `text` is supported), a missing or non-string `text`, or a field a text part lacks.
fn text_part_problem(part: &Value) -> Option<String> {
    let Value::Object(part) = part else {
        return Some(format!(
            "must be a text part ({{\"type\": \"text\", \"text\": ...}}), got {}",
            type_name(part)
        ));
    };
    match part.get("type") {
        Some(Value::String(t)) if t == "text" => {}
        Some(Value::String(t)) => {
            return Some(format!(
                "has type {t:?}: only text parts ({{\"type\": \"text\", \"text\": ...}}) are \
                 supported"
            ))
        }
        None | Some(Value::Null) => {
            return Some(
                "has no `type` (a text part is {\"type\": \"text\", \"text\": ...})".into(),
            )
        }
        Some(v) => return Some(format!("`type` must be a string, got {}", type_name(v))),
    }
    match part.get("text") {
        Some(Value::String(_)) => {}
        None | Some(Value::Null) => {
            return Some("is a text part without `text` (the string it holds)".into())
        }
        Some(v) => return Some(format!("`text` must be a string, got {}", describe(v))),
    }
    part.keys()
        .find(|k| *k != "type" && *k != "text")
        .map(|k| format!("has unknown field `{k}` (a text part has `type` and `text`)"))
}

/// Why `messages` did not read as a list of [`ChatMessage`]s, naming the message and field.
fn messages_error(value: &Value) -> Option<RequestError> {
    let key = "messages";
    let Value::Array(items) = value else {
        return Some(RequestError::invalid(
            key,
            format!(
                "`messages` must be a list of messages, got {}",
                type_name(value)
            ),
        ));
    };
    for (i, m) in items.iter().enumerate() {
        let at = |field: &str| format!("messages[{i}].{field}");
        let Value::Object(m) = m else {
            return Some(RequestError::invalid(
                format!("messages[{i}]"),
                format!("`messages[{i}]` must be an object, got {}", type_name(m)),
            ));
        };
        let roles: Vec<&str> = Role::ALL.iter().map(|r| r.as_str()).collect();
        match m.get("role") {
            Some(Value::String(r)) if roles.contains(&r.as_str()) => {}
            Some(Value::String(r)) => {
                return Some(RequestError::invalid(
                    at("role"),
                    format!(
                        "`messages[{i}].role` {r:?} is not one of {}",
                        roles.join(", ")
                    ),
                ))
            }
            None | Some(Value::Null) => {
                return Some(RequestError::invalid(
                    at("role"),
                    format!("`messages[{i}].role` is required"),
                ))
            }
            Some(v) => {
                return Some(RequestError::invalid(
                    at("role"),
                    format!(
                        "`messages[{i}].role` must be a string, got {}",
                        type_name(v)
                    ),
                ))
            }
        }
        match m.get("content") {
            None | Some(Value::Null) | Some(Value::String(_)) => {}
            Some(Value::Array(parts)) => {
                for (j, p) in parts.iter().enumerate() {
                    if let Some(problem) = text_part_problem(p) {
                        return Some(RequestError::invalid(
                            at("content"),
                            format!("`messages[{i}].content[{j}]` {problem}"),
                        ));
                    }
                }
            }
            Some(v) => {
                return Some(RequestError::invalid(
                    at("content"),
                    format!(
                        "`messages[{i}].content` must be a string or a list of text parts, \
                         got {}",
                        type_name(v)
                    ),
                ))
            }
        }
        for key in ["name", "tool_call_id", "reasoning_content", "reasoning"] {
            if let Some(v) = m.get(key) {
                if !v.is_null() && !v.is_string() {
                    return Some(RequestError::invalid(
                        at(key),
                        format!(
                            "`messages[{i}].{key}` must be a string, got {}",
                            type_name(v)
                        ),
                    ));
                }
            }
        }
        if let Some(v) = m.get("tool_calls") {
            let calls_ok = match v {
                Value::Null => true,
                Value::Array(calls) => calls.iter().all(|c| {
                    c.as_object().is_some_and(|c| {
                        c.get("function")
                            .and_then(Value::as_object)
                            .is_some_and(|f| {
                                f.get("name").is_some_and(Value::is_string)
                                    && f.keys().all(|k| k == "name" || k == "arguments")
                            })
                            && c.keys()
                                .all(|k| ["id", "type", "function"].contains(&k.as_str()))
                    })
                }),
                _ => false,
            };
            if !calls_ok {
                return Some(RequestError::invalid(
                    at("tool_calls"),
                    format!(
                        "`messages[{i}].tool_calls` must be a list of \
                         {{\"id\", \"type\", \"function\": {{\"name\", \"arguments\"}}}} objects"
                    ),
                ));
            }
        }
        const KEYS: [&str; 7] = [
            "role",
            "content",
            "name",
            "tool_calls",
            "tool_call_id",
            "reasoning_content",
            "reasoning",
        ];
        if let Some(k) = m.keys().find(|k| !KEYS.contains(&k.as_str())) {
            return Some(RequestError::invalid(
                at(k),
                format!(
                    "`messages[{i}].{k}` is not a message field (a message has {})",
                    KEYS.join(", ")
                ),
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse_request;
    use crate::requests::GenerationRequest;

    const LIMITS: Limits = Limits {
        max_choices: 8,
        max_tokens: 1000,
        max_logprobs: 20,
    };

    fn parse(s: &str) -> Result<ChatCompletionRequest, RequestError> {
        parse_request::<ChatCompletionRequest>(s.as_bytes())
    }

    #[test]
    fn every_listed_field_reads_alone() {
        for f in crate::parse::COMMON_FIELDS
            .iter()
            .chain(ChatCompletionRequest::FIELDS)
        {
            assert!(
                parse(&format!("{{\"{}\": null}}", f.name)).is_ok(),
                "{}",
                f.name
            );
        }
    }

    #[test]
    fn messages_read_and_their_errors_name_the_message() {
        let r = parse(
            r#"{"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                {"type": "text", "text": "b"}]}, {"role": "assistant", "content": null}]}"#,
        )
        .expect("messages");
        let m = r.messages.expect("messages");
        assert_eq!((m[0].text().as_str(), m[1].text().as_str()), ("a\nb", ""));
        let e = parse(r#"{"messages": [{"content": "hi"}]}"#).expect_err("role");
        assert_eq!(e.param(), Some("messages[0].role"));
        let e = parse(r#"{"messages": [{"role": "robot"}]}"#).expect_err("robot");
        assert!(e.to_string().contains("not one of"), "{e}");
        let e =
            parse(r#"{"messages": [{"role": "assistant", "tool_calls": [{"function": "f"}]}]}"#)
                .expect_err("tc");
        assert_eq!(e.param(), Some("messages[0].tool_calls"));
        for (parts, says) in [
            (r#"[{"type": "text"}]"#, "without `text`"),
            (
                r#"[{"type": "text", "text": 3}]"#,
                "`text` must be a string, got an integer 3",
            ),
            (
                r#"[{"type": "image_url", "image_url": {}}]"#,
                "has type \"image_url\": only text",
            ),
            (r#"[{"text": "a"}]"#, "has no `type`"),
            (
                r#"[{"type": "text", "text": "a", "x": 1}]"#,
                "unknown field `x`",
            ),
        ] {
            let body = format!(r#"{{"messages": [{{"role": "user", "content": {parts}}}]}}"#);
            let e = parse(&body).expect_err(parts);
            assert_eq!(e.param(), Some("messages[0].content"), "{parts}");
            assert!(e.to_string().contains(says), "{parts}: {e}");
            assert!(
                e.to_string().contains("messages[0].content[0]"),
                "{parts}: {e}"
            );
        }
        let e = parse(r#"{"messages": [{"role": "user", "mood": "happy"}]}"#).expect_err("mood");
        assert_eq!(e.param(), Some("messages[0].mood"));
        let ok = parse(
            r#"{"messages": [{"role": "assistant", "content": null, "reasoning_content": "r",
                "tool_calls": [{"id": "c", "type": "function",
                    "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
                {"role": "tool", "tool_call_id": "c", "content": "42"}]}"#,
        )
        .expect("a tool round trip reads");
        assert_eq!(
            ok.messages.expect("messages")[1].tool_call_id.as_deref(),
            Some("c")
        );
    }

    #[test]
    fn chat_only_unimplemented_fields_are_refused() {
        for body in [
            r#"{"messages": [], "echo": true}"#,
            r#"{"messages": [], "mm_processor_kwargs": {"size": 4}}"#,
        ] {
            let e = parse(body).expect_err(body);
            assert!(e.to_string().contains("not supported"), "{e}");
        }
        assert!(parse(r#"{"messages": [], "echo": false, "store": true}"#).is_ok());
    }

    #[test]
    fn tools_and_tool_choice_are_checked() {
        let check = |body: &str| {
            parse(body)
                .expect(body)
                .validate(&LIMITS)
                .err()
                .and_then(|e| e.param().map(str::to_string))
        };
        let hi = r#""messages": [{"role": "user", "content": "hi"}]"#;
        let tool =
            r#"{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}"#;
        assert_eq!(check(&format!("{{{hi}, \"tools\": [{tool}]}}")), None);
        assert_eq!(
            check(&format!(
                "{{{hi}, \"tools\": [{{\"type\": \"function\"}}]}}"
            ))
            .as_deref(),
            Some("tools[0].function.name")
        );
        assert_eq!(
            check(&format!(
                "{{{hi}, \"tools\": [{{\"type\": \"retrieval\"}}]}}"
            ))
            .as_deref(),
            Some("tools[0].type")
        );
        for choice in [
            r#""required""#,
            r#"{"type": "function", "function": {"name": "f"}}"#,
        ] {
            assert_eq!(
                check(&format!(
                    "{{{hi}, \"tools\": [{tool}], \"tool_choice\": {choice}}}"
                )),
                None,
                "{choice}"
            );
        }
        assert_eq!(
            check(&format!("{{{hi}, \"tool_choice\": \"required\"}}")).as_deref(),
            Some("tool_choice")
        );
        assert_eq!(
            check(&format!(
                "{{{hi}, \"tools\": [{tool}], \"tool_choice\": \"required\", \
                 \"guided_regex\": \"a\"}}"
            ))
            .as_deref(),
            Some("guided_regex")
        );
        for choice in [r#"{"type": "function", "function": {"name": "g"}}"#, "3"] {
            assert_eq!(
                check(&format!(
                    "{{{hi}, \"tools\": [{tool}], \"tool_choice\": {choice}}}"
                ))
                .as_deref(),
                Some("tool_choice"),
                "{choice}"
            );
        }
        assert_eq!(
            check(&format!("{{{hi}, \"continue_final_message\": true}}")).as_deref(),
            Some("continue_final_message")
        );
    }
}
