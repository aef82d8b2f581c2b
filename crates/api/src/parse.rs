//! Reading a request body into a typed request, with errors that name the field.
//!
//! serde alone would say "invalid type: string, expected u32" without the field, and
//! `deny_unknown_fields` would call an OpenAI field fp4forge does not implement "unknown". So a
//! body is read in four steps: JSON that parses, an object; every key known (an unknown key is
//! refused by name); every unimplemented field null or at its neutral value (else refused by
//! name); then serde. When serde fails, the field at fault is found by reading each field
//! alone, and its error says what the field must be and what came.

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::error::RequestError;
use crate::requests::Limits;

/// One field of a request type: its name and what its value must be (for messages).
#[derive(Debug, Clone, Copy)]
pub struct Field {
    /// The JSON key.
    pub name: &'static str,
    /// What the value must be, as a message says it ("an integer", "true or false").
    pub expected: &'static str,
}

/// The fields every request type has (model, sampling, stopping, streaming, `user`); each type's
/// [`WireRequest::FIELDS`] lists only its own.
pub const COMMON_FIELDS: &[Field] = &[
    Field {
        name: "model",
        expected: "a string",
    },
    Field {
        name: "max_tokens",
        expected: "an integer",
    },
    Field {
        name: "temperature",
        expected: "a number",
    },
    Field {
        name: "top_p",
        expected: "a number",
    },
    Field {
        name: "top_k",
        expected: "an integer",
    },
    Field {
        name: "n",
        expected: "an integer",
    },
    Field {
        name: "seed",
        expected: "a 64-bit integer",
    },
    Field {
        name: "stop",
        expected: "a string or a list of strings",
    },
    Field {
        name: "stop_token_ids",
        expected: "a list of token ids",
    },
    Field {
        name: "ignore_eos",
        expected: "true or false",
    },
    Field {
        name: "min_tokens",
        expected: "an integer",
    },
    Field {
        name: "stream",
        expected: "true or false",
    },
    Field {
        name: "stream_options",
        expected: "an object",
    },
    Field {
        name: "user",
        expected: "a string",
    },
    Field {
        name: "presence_penalty",
        expected: "a number",
    },
    Field {
        name: "frequency_penalty",
        expected: "a number",
    },
    Field {
        name: "repetition_penalty",
        expected: "a number",
    },
    Field {
        name: "logit_bias",
        expected: "an object of token id → number",
    },
    Field {
        name: "min_p",
        expected: "a number",
    },
    Field {
        name: "bad_words",
        expected: "a list of strings",
    },
    Field {
        name: "allowed_token_ids",
        expected: "a list of token ids",
    },
    Field {
        name: "include_stop_str_in_output",
        expected: "true or false",
    },
    Field {
        name: "skip_special_tokens",
        expected: "true or false",
    },
    Field {
        name: "truncate_prompt_tokens",
        expected: "an integer",
    },
    Field {
        name: "prompt_logprobs",
        expected: "an integer",
    },
];

/// An OpenAI or vLLM field that fp4forge does not implement. It is accepted only when null or
/// at one of its neutral values (JSON texts: what fp4forge does anyway); otherwise refused.
#[derive(Debug, Clone, Copy)]
pub struct Unimplemented {
    /// The JSON key.
    pub name: &'static str,
    /// The values that ask for nothing fp4forge lacks, as JSON texts (`"0"`, `"0.0"`).
    pub neutral: &'static [&'static str],
}

/// A request type read by [`parse_request`].
pub trait WireRequest: DeserializeOwned + Default {
    /// The fields of this type beyond [`COMMON_FIELDS`] (those it honours and those it accepts
    /// and ignores).
    const FIELDS: &'static [Field];
    /// Fields of the API that fp4forge does not implement.
    const UNIMPLEMENTED: &'static [Unimplemented];

    /// The checks of the type's own fields that need no model (ranges against `limits`,
    /// required fields present); the common ones are [`crate::GenerationRequest::validate`]'s.
    fn validate_fields(&self, limits: &Limits) -> Result<(), RequestError>;

    /// A precise error for field `key` whose `value` did not deserialize, for fields with
    /// structure (`prompt`, `messages`); `None`: the generic "must be ..." message.
    fn shape_error(key: &str, value: &Value) -> Option<RequestError> {
        let _ = (key, value);
        None
    }
}

/// Every field request type `R` has: [`COMMON_FIELDS`], then its own.
fn known_fields<R: WireRequest>() -> impl Iterator<Item = &'static Field> {
    COMMON_FIELDS.iter().chain(R::FIELDS)
}

/// The JSON type of `v`, as a message names it.
pub fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "an integer",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A short rendering of `v` for messages (at most 60 characters).
pub fn show(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 60 {
        let cut: String = s.chars().take(57).collect();
        format!("{cut}...")
    } else {
        s
    }
}

/// "a string \"ten\"": the type and value of `v`, for "got ..." in messages.
pub fn describe(v: &Value) -> String {
    format!("{} {}", type_name(v), show(v))
}

/// Parses `bytes` as a JSON object.
pub fn parse_object(bytes: &[u8]) -> Result<Map<String, Value>, RequestError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(RequestError::EmptyBody);
    }
    let v: Value = serde_json::from_slice(bytes).map_err(|e| {
        RequestError::MalformedJson(lone_surrogate(bytes).unwrap_or_else(|| e.to_string()))
    })?;
    match v {
        Value::Object(map) => Ok(map),
        other => Err(RequestError::NotAnObject(type_name(&other))),
    }
}

/// A `\\uXXXX` escape of a UTF-16 surrogate without its partner in `bytes`, described for a
/// message (serde_json calls it an "unexpected end of hex escape"); `None` when there is none.
/// JSON strings are Unicode, and half a surrogate pair is no character.
fn lone_surrogate(bytes: &[u8]) -> Option<String> {
    let hex = |at: usize| -> Option<u16> {
        let digits = std::str::from_utf8(bytes.get(at..at + 4)?).ok()?;
        u16::from_str_radix(digits, 16).ok()
    };
    let escape_at = |at: usize| -> Option<u16> {
        (bytes.get(at) == Some(&b'\\') && bytes.get(at + 1) == Some(&b'u'))
            .then(|| hex(at + 2))
            .flatten()
    };
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'\\' {
            i += 1;
            continue;
        }
        let Some(unit) = escape_at(i) else {
            i += 2; // another escape (`\\\\`, `\\n`, ...): skip the escaped character
            continue;
        };
        match unit {
            0xD800..=0xDBFF => match escape_at(i + 6) {
                Some(0xDC00..=0xDFFF) => i += 12,
                _ => {
                    return Some(format!(
                        "`\\u{unit:04x}` at byte {i} is a lone UTF-16 high surrogate (it must be \
                         followed by a low surrogate escape \\udc00-\\udfff); JSON strings must \
                         be valid Unicode"
                    ))
                }
            },
            0xDC00..=0xDFFF => {
                return Some(format!(
                    "`\\u{unit:04x}` at byte {i} is a lone UTF-16 low surrogate (no high \
                     surrogate \\ud800-\\udbff before it); JSON strings must be valid Unicode"
                ))
            }
            _ => i += 6,
        }
    }
    None
}

/// Reads a request body into `R`: see the module's documentation for the steps.
pub fn parse_request<R: WireRequest>(bytes: &[u8]) -> Result<R, RequestError> {
    let map = parse_object(bytes)?;
    request_from_map(map)
}

/// [`parse_request`] from an already parsed JSON object.
pub fn request_from_map<R: WireRequest>(mut map: Map<String, Value>) -> Result<R, RequestError> {
    let mut unimplemented = Vec::new();
    for (key, value) in &map {
        if known_fields::<R>().any(|f| f.name == key) {
            continue;
        }
        let Some(u) = R::UNIMPLEMENTED.iter().find(|u| u.name == key) else {
            return Err(RequestError::UnknownField { field: key.clone() });
        };
        let neutral = value.is_null()
            || u.neutral
                .iter()
                .filter_map(|text| serde_json::from_str::<Value>(text).ok())
                .any(|n| &n == value);
        if !neutral {
            return Err(RequestError::Unsupported {
                field: key.clone(),
                got: show(value),
            });
        }
        unimplemented.push(key.clone());
    }
    for key in unimplemented {
        map.remove(&key);
    }
    match serde_json::from_value::<R>(Value::Object(map.clone())) {
        Ok(r) => Ok(r),
        Err(whole) => Err(field_at_fault::<R>(map)
            .unwrap_or_else(|| RequestError::MalformedJson(whole.to_string()))),
    }
}

/// The first field of `map` that does not deserialize on its own, as an error naming it.
fn field_at_fault<R: WireRequest>(map: Map<String, Value>) -> Option<RequestError> {
    for (key, value) in map {
        let mut alone = Map::new();
        alone.insert(key.clone(), value.clone());
        if serde_json::from_value::<R>(Value::Object(alone)).is_ok() {
            continue;
        }
        if let Some(e) = R::shape_error(&key, &value) {
            return Some(e);
        }
        let expected = known_fields::<R>()
            .find(|f| f.name == key)
            .map_or("something else", |f| f.expected);
        return Some(RequestError::WrongType {
            field: key,
            expected,
            got: describe(&value),
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_and_non_object_bodies_are_refused() {
        assert!(matches!(
            parse_object(b"{\"a\": "),
            Err(RequestError::MalformedJson(_))
        ));
        let e = parse_object(b"[1]").expect_err("an array");
        assert!(e.to_string().contains("an array"), "{e}");
        assert_eq!(parse_object(b"  "), Err(RequestError::EmptyBody));
    }

    #[test]
    fn lone_surrogates_are_named_as_such() {
        for (body, what) in [
            (r#"{"prompt": "\ud800"}"#, "high surrogate"),
            (r#"{"prompt": "a\ud800\u0041"}"#, "high surrogate"),
            (r#"{"prompt": "\udc00x"}"#, "low surrogate"),
        ] {
            let e = parse_object(body.as_bytes()).expect_err(body);
            let m = e.to_string();
            assert!(m.contains(what) && m.contains("lone"), "{body}: {m}");
            assert!(!m.contains("hex escape"), "{body}: {m}");
        }
        // a pair, an escaped backslash before `u`, and plain escapes are fine
        assert!(parse_object(br#"{"p": "\ud83d\ude00 \\ud800 \n"}"#).is_ok());
        assert_eq!(lone_surrogate(br#"{"p": "\\ud800"#), None);
    }

    #[test]
    fn long_values_are_shortened() {
        let v = Value::String("x".repeat(100));
        assert_eq!(show(&v).chars().count(), 60);
        assert!(show(&v).ends_with("..."));
    }
}
