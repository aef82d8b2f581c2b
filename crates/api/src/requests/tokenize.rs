//! vLLM's `POST /tokenize` and `POST /detokenize` (its `TokenizeCompletionRequest`,
//! `TokenizeChatRequest`, `TokenizeResponse`, `DetokenizeRequest`, `DetokenizeResponse`) and
//! `GET /version`'s body.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::parse::{describe, parse_object, WireRequest};
use crate::requests::chat::{ChatCompletionRequest, ChatMessage};
use crate::RequestError;

/// A `/tokenize` request: a prompt, or a conversation rendered with the chat template (a body
/// with `messages` is the latter).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum TokenizeRequest {
    /// vLLM's `TokenizeCompletionRequest`.
    Completion(TokenizeCompletionRequest),
    /// vLLM's `TokenizeChatRequest`.
    Chat(TokenizeChatRequest),
}

/// Tokenizes a prompt.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TokenizeCompletionRequest {
    /// The model (checked against the served one when given).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The text.
    pub prompt: String,
    /// Add the tokenizer's special tokens (BOS, ...) as a completion does (default true).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub add_special_tokens: Option<bool>,
    /// Also return each token's text (`token_strs`; default false).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub return_token_strs: Option<bool>,
}

/// Tokenizes a conversation as `/v1/chat/completions` renders it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TokenizeChatRequest {
    /// The model (checked against the served one when given).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The conversation.
    pub messages: Vec<ChatMessage>,
    /// Append the assistant's turn opener (default true).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub add_generation_prompt: Option<bool>,
    /// Continue the final (assistant) message instead of starting a new one (default false).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub continue_final_message: Option<bool>,
    /// Add the tokenizer's special tokens on top of the template's (default false: the
    /// template writes them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub add_special_tokens: Option<bool>,
    /// Also return each token's text (`token_strs`; default false).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub return_token_strs: Option<bool>,
    /// A chat template (Jinja source) instead of the model's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chat_template: Option<String>,
    /// Extra chat-template variables.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// Tool definitions given to the chat template.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<Value>>,
}

impl TokenizeChatRequest {
    /// The same conversation as a chat completion request, for the chat endpoint's rendering.
    pub fn as_chat_request(&self) -> ChatCompletionRequest {
        ChatCompletionRequest {
            model: self.model.clone(),
            messages: Some(self.messages.clone()),
            add_generation_prompt: self.add_generation_prompt,
            continue_final_message: self.continue_final_message,
            chat_template: self.chat_template.clone(),
            chat_template_kwargs: self.chat_template_kwargs.clone(),
            tools: self.tools.clone(),
            ..Default::default()
        }
    }
}

/// What `/tokenize` answers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TokenizeResponse {
    /// Number of tokens.
    pub count: u64,
    /// The longest sequence the server serves, tokens.
    pub max_model_len: u64,
    /// The token ids.
    pub tokens: Vec<u32>,
    /// Each token's text, when `return_token_strs` asked for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_strs: Option<Vec<String>>,
}

/// A `/detokenize` request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DetokenizeRequest {
    /// The model (checked against the served one when given).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The token ids.
    pub tokens: Vec<u32>,
}

/// What `/detokenize` answers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DetokenizeResponse {
    /// The text of the tokens.
    pub prompt: String,
}

/// What `GET /version` answers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VersionResponse {
    /// The server's version.
    pub version: String,
}

/// Takes `key` out of `map` as a `T` (absent or null: `None`); a wrong type names the field.
fn take<T: DeserializeOwned>(
    map: &mut Map<String, Value>,
    key: &str,
    expected: &'static str,
) -> Result<Option<T>, RequestError> {
    match map.remove(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => {
            serde_json::from_value(v.clone())
                .map(Some)
                .map_err(|_| RequestError::WrongType {
                    field: key.into(),
                    expected,
                    got: describe(&v),
                })
        }
    }
}

/// `take` of a required field.
fn require<T: DeserializeOwned>(
    map: &mut Map<String, Value>,
    key: &str,
    expected: &'static str,
) -> Result<T, RequestError> {
    take(map, key, expected)?.ok_or_else(|| RequestError::Required { field: key.into() })
}

/// Refuses whatever field is left in `map`.
fn no_more(map: Map<String, Value>) -> Result<(), RequestError> {
    match map.into_iter().next() {
        Some((field, _)) => Err(RequestError::UnknownField { field }),
        None => Ok(()),
    }
}

/// Reads a `/tokenize` body; every error names its field.
pub fn parse_tokenize(bytes: &[u8]) -> Result<TokenizeRequest, RequestError> {
    let mut map = parse_object(bytes)?;
    let model = take(&mut map, "model", "a string")?;
    let return_token_strs = take(&mut map, "return_token_strs", "true or false")?;
    let add_special_tokens = take(&mut map, "add_special_tokens", "true or false")?;
    if !map.contains_key("messages") {
        let prompt = require(&mut map, "prompt", "a string")?;
        no_more(map)?;
        return Ok(TokenizeRequest::Completion(TokenizeCompletionRequest {
            model,
            prompt,
            add_special_tokens,
            return_token_strs,
        }));
    }
    let messages = match map.remove("messages") {
        Some(v) if !v.is_null() => {
            serde_json::from_value::<Vec<ChatMessage>>(v.clone()).map_err(|_| {
                <ChatCompletionRequest as WireRequest>::shape_error("messages", &v).unwrap_or(
                    RequestError::WrongType {
                        field: "messages".into(),
                        expected: "a list of chat messages",
                        got: describe(&v),
                    },
                )
            })?
        }
        _ => {
            return Err(RequestError::Required {
                field: "messages".into(),
            })
        }
    };
    if map.contains_key("prompt") {
        return Err(RequestError::invalid(
            "prompt",
            "give either `prompt` or `messages`, not both",
        ));
    }
    if let Some(v) = map.remove("mm_processor_kwargs") {
        if !v.is_null() {
            return Err(RequestError::Unsupported {
                field: "mm_processor_kwargs".into(),
                got: describe(&v),
            });
        }
    }
    let req = TokenizeChatRequest {
        model,
        messages,
        add_generation_prompt: take(&mut map, "add_generation_prompt", "true or false")?,
        continue_final_message: take(&mut map, "continue_final_message", "true or false")?,
        add_special_tokens,
        return_token_strs,
        chat_template: take(&mut map, "chat_template", "a string")?,
        chat_template_kwargs: take(&mut map, "chat_template_kwargs", "an object")?,
        tools: take(&mut map, "tools", "a list of tool definitions")?,
    };
    no_more(map)?;
    if req.add_generation_prompt == Some(true) && req.continue_final_message == Some(true) {
        return Err(RequestError::invalid(
            "continue_final_message",
            "`continue_final_message` and `add_generation_prompt` cannot both be true",
        ));
    }
    Ok(TokenizeRequest::Chat(req))
}

/// Reads a `/detokenize` body; every error names its field.
pub fn parse_detokenize(bytes: &[u8]) -> Result<DetokenizeRequest, RequestError> {
    let mut map = parse_object(bytes)?;
    let req = DetokenizeRequest {
        model: take(&mut map, "model", "a string")?,
        tokens: require(&mut map, "tokens", "a list of token ids")?,
    };
    no_more(map)?;
    Ok(req)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_with_messages_is_a_chat_request() {
        let r = parse_tokenize(br#"{"prompt": "hi", "return_token_strs": true}"#).unwrap();
        assert!(matches!(r, TokenizeRequest::Completion(ref c) if c.prompt == "hi"));
        let r = parse_tokenize(br#"{"messages": [{"role": "user", "content": "hi"}]}"#).unwrap();
        assert!(matches!(r, TokenizeRequest::Chat(ref c) if c.messages.len() == 1));
    }

    #[test]
    fn errors_name_the_field() {
        let param = |body: &str| parse_tokenize(body.as_bytes()).unwrap_err().to_string();
        assert!(param(r#"{"prompt": 3}"#).contains("`prompt`"));
        assert!(param(r#"{"prompt": "a", "foo": 1}"#).contains("`foo`"));
        assert!(param(r#"{}"#).contains("`prompt`"));
        assert!(param(r#"{"prompt": "a", "add_special_tokens": "yes"}"#)
            .contains("`add_special_tokens`"));
        let e = parse_detokenize(br#"{"tokens": [1, -2]}"#).unwrap_err();
        assert!(e.to_string().contains("`tokens`"), "{e}");
        let e = parse_detokenize(br#"{"tokens": [1], "prompt": "x"}"#).unwrap_err();
        assert!(e.to_string().contains("`prompt`"), "{e}");
    }
}
