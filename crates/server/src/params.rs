//! Reading a request body: JSON that parses, an object, and typed fields whose errors name the
//! field and say what was expected and what came. Every value a handler uses comes through
//! here, so no input reaches the engine unchecked.

use serde_json::{Map, Value};

use crate::error::ApiError;

/// A request body as a JSON object.
pub(crate) struct Body {
    map: Map<String, Value>,
}

/// A short rendering of `v` for messages.
fn show(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 60 {
        let cut: String = s.chars().take(57).collect();
        format!("{cut}...")
    } else {
        s
    }
}

/// The JSON type of `v`, as a message names it.
pub(crate) fn type_name(v: &Value) -> &'static str {
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

impl Body {
    /// Parses `bytes` as a JSON object.
    pub fn parse(bytes: &[u8]) -> Result<Self, ApiError> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(ApiError::invalid(
                None,
                "the request body is empty; expected a JSON object",
            ));
        }
        let v: Value = serde_json::from_slice(bytes)
            .map_err(|e| ApiError::invalid(None, format!("malformed JSON in the body: {e}")))?;
        match v {
            Value::Object(map) => Ok(Self { map }),
            other => Err(ApiError::invalid(
                None,
                format!("the body must be a JSON object, got {}", type_name(&other)),
            )),
        }
    }

    /// The raw value of `key`, `None` when absent or `null`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn wrong(key: &str, expected: &str, v: &Value) -> ApiError {
        ApiError::field(
            key,
            format!(
                "`{key}` must be {expected}, got {} {}",
                type_name(v),
                show(v)
            ),
        )
    }

    /// A boolean field.
    pub fn bool(&self, key: &str) -> Result<Option<bool>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(Self::wrong(key, "true or false", v)),
        }
    }

    /// A string field.
    pub fn str(&self, key: &str) -> Result<Option<&str>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(Self::wrong(key, "a string", v)),
        }
    }

    /// A number field in `[lo, hi]`.
    pub fn number(&self, key: &str, lo: f64, hi: f64) -> Result<Option<f64>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(v @ Value::Number(n)) => {
                let x = n.as_f64().unwrap_or(f64::NAN);
                if x.is_finite() && x >= lo && x <= hi {
                    Ok(Some(x))
                } else {
                    Err(ApiError::field(
                        key,
                        format!("`{key}` must be between {lo} and {hi}, got {}", show(v)),
                    ))
                }
            }
            Some(v) => Err(Self::wrong(key, "a number", v)),
        }
    }

    /// An integer field in `[lo, hi]`; `what` says what the bound is (for the message).
    pub fn int(&self, key: &str, lo: i64, hi: i64, what: &str) -> Result<Option<i64>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => {
                let n = as_int(v).ok_or_else(|| Self::wrong(key, "an integer", v))?;
                if n < i128::from(lo) {
                    return Err(ApiError::field(
                        key,
                        format!("`{key}` must be at least {lo}, got {}", show(v)),
                    ));
                }
                if n > i128::from(hi) {
                    return Err(ApiError::field(
                        key,
                        format!("`{key}` = {} exceeds {what} ({hi})", show(v)),
                    ));
                }
                Ok(Some(n as i64))
            }
        }
    }

    /// `stop`: a string or a list of non-empty strings (at most `max`).
    pub fn stop(&self, max: usize) -> Result<Vec<String>, ApiError> {
        let key = "stop";
        let list = match self.get(key) {
            None => return Ok(Vec::new()),
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(items)) => items
                .iter()
                .map(|x| match x {
                    Value::String(s) => Ok(s.clone()),
                    other => Err(Self::wrong(key, "a string or a list of strings", other)),
                })
                .collect::<Result<_, _>>()?,
            Some(v) => return Err(Self::wrong(key, "a string or a list of strings", v)),
        };
        if list.len() > max {
            return Err(ApiError::field(
                key,
                format!(
                    "`stop` has {} sequences; at most {max} are allowed",
                    list.len()
                ),
            ));
        }
        if list.iter().any(String::is_empty) {
            return Err(ApiError::field(key, "`stop` sequences must not be empty"));
        }
        Ok(list)
    }

    /// A list of token ids (`stop_token_ids`).
    pub fn token_ids(&self, key: &str) -> Result<Vec<u32>, ApiError> {
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|x| {
                    as_int(x)
                        .and_then(|n| u32::try_from(n).ok())
                        .ok_or_else(|| Self::wrong(key, "a list of token ids", x))
                })
                .collect(),
            Some(v) => Err(Self::wrong(key, "a list of token ids", v)),
        }
    }

    /// Refuses a field set to anything but its neutral value (features the server lacks).
    pub fn unsupported(&self, key: &str, neutral: &[Value]) -> Result<(), ApiError> {
        match self.get(key) {
            Some(v) if !neutral.contains(v) => Err(ApiError::field(
                key,
                format!("`{key}` is not supported by this server (got {})", show(v)),
            )),
            _ => Ok(()),
        }
    }

    /// `model`: must name the served model when given.
    pub fn check_model(&self, served: &str) -> Result<(), ApiError> {
        match self.str("model")? {
            Some(m) if m != served => Err(ApiError::unknown_model(m, served)),
            _ => Ok(()),
        }
    }
}

/// An integral JSON number (a float with no fraction counts), wide enough to tell "too big"
/// from "negative".
pub(crate) fn as_int(v: &Value) -> Option<i128> {
    match v {
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Some(i128::from(i))
            } else if let Some(u) = n.as_u64() {
                Some(i128::from(u))
            } else {
                let f = n.as_f64()?;
                (f.is_finite() && f.fract() == 0.0 && f.abs() < 1e30).then_some(f as i128)
            }
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(s: &str) -> Body {
        Body::parse(s.as_bytes()).unwrap()
    }

    #[test]
    fn malformed_and_non_object_bodies_are_refused() {
        let e = Body::parse(b"{\"a\": ").err().unwrap();
        assert!(e.message.contains("malformed JSON"), "{}", e.message);
        let e = Body::parse(b"[1]").err().unwrap();
        assert!(e.message.contains("an array"), "{}", e.message);
        let e = Body::parse(b"  ").err().unwrap();
        assert!(e.message.contains("empty"), "{}", e.message);
    }

    #[test]
    fn typed_fields_name_the_field_and_the_value() {
        let b =
            body(r#"{"max_tokens": "ten", "n": -1, "big": 1e300, "t": 3.0, "stop": ["", "x"]}"#);
        let e = b.int("max_tokens", 0, 10, "the limit").unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        assert!(e.message.contains("an integer") && e.message.contains("\"ten\""));
        let e = b.int("n", 1, 10, "the limit").unwrap_err();
        assert!(e.message.contains("at least 1"), "{}", e.message);
        let e = b.int("big", 0, 10, "the limit").unwrap_err();
        assert!(e.message.contains("an integer"), "{}", e.message);
        assert_eq!(b.int("t", 0, 10, "x").unwrap(), Some(3));
        assert!(b.stop(4).unwrap_err().message.contains("empty"));
        let e = body(r#"{"max_tokens": 99999999999999999999}"#)
            .int("max_tokens", 0, 10, "the limit")
            .unwrap_err();
        assert!(e.message.contains("exceeds the limit"), "{}", e.message);
    }
}
