//! `POST /v1/chat/completions`: [`ChatCompletionRequest`] and its [`ChatMessage`]s.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{int_in, stream_options_error, Limits, Sampling, Stop, StreamOptions};
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

/// One message of a conversation. Other message fields (`tool_calls`, `tool_call_id`, ...) are
/// refused: fp4forge has no tool calling.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatMessage {
    /// Who wrote it.
    pub role: Role,
    /// What it says (`null` or absent: nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<MessageContent>,
    /// Accepted and ignored: a participant's name (the chat template is given role and
    /// content only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    /// The content as one string (parts concatenated; none: empty).
    pub fn text(&self) -> String {
        match &self.content {
            None => String::new(),
            Some(MessageContent::Text(s)) => s.clone(),
            Some(MessageContent::Parts(parts)) => parts
                .iter()
                .map(|ContentPart::Text { text }| text.as_str())
                .collect(),
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
    ];
    const UNIMPLEMENTED: &'static [Unimplemented] = &CHAT_UNIMPLEMENTED;

    fn shape_error(key: &str, value: &Value) -> Option<RequestError> {
        match key {
            "messages" => messages_error(value),
            "stream_options" => Some(stream_options_error(value)),
            _ => None,
        }
    }
}

/// The chat-only fields fp4forge does not implement (vLLM's template controls, chat `echo`).
const CHAT_ONLY_UNIMPLEMENTED: [Unimplemented; 7] = [
    Unimplemented {
        name: "echo",
        neutral: &["false"],
    },
    Unimplemented {
        name: "chat_template",
        neutral: &[],
    },
    Unimplemented {
        name: "chat_template_kwargs",
        neutral: &["{}"],
    },
    Unimplemented {
        name: "add_generation_prompt",
        neutral: &["true"],
    },
    Unimplemented {
        name: "continue_final_message",
        neutral: &["false"],
    },
    Unimplemented {
        name: "documents",
        neutral: &[],
    },
    Unimplemented {
        name: "mm_processor_kwargs",
        neutral: &[],
    },
];

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
        if let Some(v) = m.get("name") {
            if !v.is_null() && !v.is_string() {
                return Some(RequestError::invalid(
                    at("name"),
                    format!(
                        "`messages[{i}].name` must be a string, got {}",
                        type_name(v)
                    ),
                ));
            }
        }
        if let Some(k) = m
            .keys()
            .find(|k| !["role", "content", "name"].contains(&k.as_str()))
        {
            return Some(RequestError::invalid(
                at(k),
                format!(
                    "`messages[{i}].{k}` is not supported by this server (a message has \
                     role, content and name)"
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
        assert_eq!((m[0].text().as_str(), m[1].text().as_str()), ("ab", ""));
        let e = parse(r#"{"messages": [{"content": "hi"}]}"#).expect_err("role");
        assert_eq!(e.param(), Some("messages[0].role"));
        let e = parse(r#"{"messages": [{"role": "robot"}]}"#).expect_err("robot");
        assert!(e.to_string().contains("not one of"), "{e}");
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
        let e = parse(r#"{"messages": [{"role": "user", "tool_calls": []}]}"#).expect_err("tc");
        assert_eq!(e.param(), Some("messages[0].tool_calls"));
    }

    #[test]
    fn chat_only_unimplemented_fields_are_refused() {
        for body in [
            r#"{"messages": [], "echo": true}"#,
            r#"{"messages": [], "chat_template_kwargs": {"enable_thinking": false}}"#,
            r#"{"messages": [], "tools": [{"type": "function"}]}"#,
        ] {
            let e = parse(body).expect_err(body);
            assert!(e.to_string().contains("not supported"), "{e}");
        }
        assert!(parse(r#"{"messages": [], "echo": false, "store": true}"#).is_ok());
    }
}
