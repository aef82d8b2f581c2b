//! `POST /v1/completions`: [`CompletionRequest`] and its [`Prompt`].

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::structured::{self, STRUCTURED_FIELDS};
use super::{
    int_in, stream_options_error, GenerationRequest, Limits, Sampling, Stop, StreamOptions,
};
use crate::error::RequestError;
use crate::integer::Integer;
use crate::parse::{describe, type_name, Field, Unimplemented, WireRequest};

/// One prompt: text, or token ids.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SinglePrompt {
    /// A text prompt; the server tokenizes it (and may add BOS).
    Text(String),
    /// Token ids, used as they are.
    Tokens(Vec<u32>),
}

/// `prompt`: a string, a list of token ids, or a list of either (several prompts).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// A text prompt; the server tokenizes it (and may add BOS).
    Text(String),
    /// Token ids, sent as they are (OpenAI and vLLM accept `prompt: [ids]`).
    Tokens(Vec<u32>),
    /// Several prompts, each answered by `n` choices.
    Batch(Vec<SinglePrompt>),
}

impl Prompt {
    /// The prompts, in order.
    pub fn to_list(&self) -> Vec<SinglePrompt> {
        match self {
            Self::Text(t) => vec![SinglePrompt::Text(t.clone())],
            Self::Tokens(ids) => vec![SinglePrompt::Tokens(ids.clone())],
            Self::Batch(items) => items.clone(),
        }
    }
}

wire_request! {
/// The body of `POST /v1/completions`. `None` fields are left out of the JSON; unknown fields
/// are refused (see [`WireRequest::FIELDS`] and [`WireRequest::UNIMPLEMENTED`]).
///
/// Accepted and ignored (no effect on the result): `user`.
pub struct CompletionRequest {
    /// The prompt (required).
    pub prompt: Option<Prompt>,
    /// Return the prompt in `text` and its token logprobs in `logprobs`.
    pub echo: Option<bool>,
    /// Number of top alternatives per position in `top_logprobs` (also enables
    /// `token_logprobs`).
    pub logprobs: Option<Integer>,
    /// vLLM: tokenize text prompts with the tokenizer's special tokens (its BOS, when it adds
    /// one); default true.
    pub add_special_tokens: Option<bool>,
}
}

impl CompletionRequest {
    /// A greedy, non-streamed request with every other option unset.
    pub fn new(model: impl Into<String>, prompt: Prompt, max_tokens: u32) -> Self {
        Self {
            model: Some(model.into()),
            prompt: Some(prompt),
            max_tokens: Some(max_tokens.into()),
            temperature: Some(0.0),
            ..Self::default()
        }
    }

    /// Top logprobs per position, when asked for. Valid after [`GenerationRequest::validate`].
    pub fn top_logprobs(&self) -> Option<usize> {
        self.logprobs.and_then(Integer::to_usize)
    }
}

impl WireRequest for CompletionRequest {
    /// The checks of its own fields: ranges, `limits`, a prompt
    /// that is present and not an empty list. (Token counts against the context are the
    /// server's, after tokenizing.)
    fn validate_fields(&self, limits: &Limits) -> Result<(), RequestError> {
        if let Some(m) = self.max_tokens {
            int_in(
                "max_tokens",
                m,
                0,
                limits.max_tokens as u64,
                "this server's limit (--max-tokens-limit)",
            )?;
        }
        if let Some(n) = self.logprobs {
            int_in(
                "logprobs",
                n,
                0,
                limits.max_logprobs as u64,
                "this server's limit of top logprobs",
            )?;
        }
        self.structured().constraint()?;
        match &self.prompt {
            None => Err(RequestError::Required {
                field: "prompt".into(),
            }),
            Some(Prompt::Tokens(ids)) if ids.is_empty() => {
                Err(RequestError::invalid("prompt", "`prompt` is empty"))
            }
            Some(Prompt::Batch(items)) if items.is_empty() => {
                Err(RequestError::invalid("prompt", "`prompt` is empty"))
            }
            Some(_) => Ok(()),
        }
    }

    const FIELDS: &'static [Field] = &[
        Field {
            name: "prompt",
            expected: "a string, a list of token ids, or a list of either",
        },
        Field {
            name: "echo",
            expected: "true or false",
        },
        Field {
            name: "logprobs",
            expected: "an integer",
        },
        STRUCTURED_FIELDS[0],
        STRUCTURED_FIELDS[1],
        STRUCTURED_FIELDS[2],
        STRUCTURED_FIELDS[3],
        STRUCTURED_FIELDS[4],
        STRUCTURED_FIELDS[5],
        Field {
            name: "add_special_tokens",
            expected: "true or false",
        },
    ];
    const UNIMPLEMENTED: &'static [Unimplemented] = &COMPLETION_UNIMPLEMENTED;

    fn shape_error(key: &str, value: &Value) -> Option<RequestError> {
        match key {
            "prompt" => Some(prompt_error(value)),
            "stream_options" => Some(stream_options_error(value)),
            _ => structured::shape_error(key, value),
        }
    }
}

/// The shared unimplemented fields plus the completions-only ones (`suffix`).
const COMPLETION_UNIMPLEMENTED: [Unimplemented; super::UNIMPLEMENTED_COMMON.len() + 1] = {
    let mut all = [Unimplemented {
        name: "suffix",
        neutral: &["\"\""],
    }; super::UNIMPLEMENTED_COMMON.len() + 1];
    let mut i = 0;
    while i < super::UNIMPLEMENTED_COMMON.len() {
        all[i + 1] = super::UNIMPLEMENTED_COMMON[i];
        i += 1;
    }
    all
};

/// Why `prompt` did not read as a [`Prompt`].
fn prompt_error(value: &Value) -> RequestError {
    let bad = |m: String| RequestError::invalid("prompt", m);
    let ids_error = |items: &[Value], which: &str| {
        items
            .iter()
            .find(|x| x.as_u64().and_then(|n| u32::try_from(n).ok()).is_none())
            .map(|x| {
                bad(format!(
                    "{which} must be a list of token ids (non-negative integers), found {}",
                    describe(x)
                ))
            })
    };
    match value {
        Value::Array(items) if items.iter().all(Value::is_number) => ids_error(items, "`prompt`")
            .unwrap_or_else(|| bad("`prompt`: unreadable token ids".into())),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, x)| match x {
                Value::String(_) => None,
                Value::Array(inner) => ids_error(inner, &format!("`prompt[{i}]`")),
                other => Some(bad(format!(
                    "`prompt[{i}]` must be a string or a list of token ids, got {}",
                    type_name(other)
                ))),
            })
            .unwrap_or_else(|| bad("`prompt`: unreadable prompt list".into())),
        v => bad(format!(
            "`prompt` must be a string, a list of token ids, or a list of either; got {}",
            type_name(v)
        )),
    }
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

    fn parse(s: &str) -> Result<CompletionRequest, RequestError> {
        parse_request::<CompletionRequest>(s.as_bytes())
    }

    #[test]
    fn every_listed_field_reads_alone() {
        for f in crate::parse::COMMON_FIELDS
            .iter()
            .chain(CompletionRequest::FIELDS)
        {
            assert!(
                parse(&format!("{{\"{}\": null}}", f.name)).is_ok(),
                "{}",
                f.name
            );
        }
    }

    #[test]
    fn prompts_of_every_shape() {
        let r = parse(r#"{"prompt": ["a", [1, 2]]}"#).expect("batch");
        assert_eq!(r.prompt.expect("prompt").to_list().len(), 2);
        let r = parse(r#"{"prompt": [1, 2]}"#).expect("ids");
        assert_eq!(r.prompt, Some(Prompt::Tokens(vec![1, 2])));
        let e = parse(r#"{"prompt": [1, "a"]}"#).expect_err("mixed");
        assert!(e.to_string().contains("prompt[0]"), "{e}");
        let e = parse(r#"{"prompt": [1, -2]}"#).expect_err("negative");
        assert!(e.to_string().contains("token ids"), "{e}");
        assert_eq!(e.param(), Some("prompt"));
    }

    #[test]
    fn typed_fields_name_the_field_and_the_value() {
        let e = parse(r#"{"max_tokens": "ten"}"#).expect_err("type");
        assert_eq!(e.param(), Some("max_tokens"));
        assert!(e.to_string().contains("an integer") && e.to_string().contains("\"ten\""));
        let r = parse(r#"{"prompt": "x", "n": 0}"#).expect("parses");
        let e = r.validate(&LIMITS).expect_err("n");
        assert!(e.to_string().contains("at least 1"), "{e}");
        let r = parse(r#"{"prompt": "x", "max_tokens": 99999999999999999999}"#).expect("parses");
        let e = r.validate(&LIMITS).expect_err("big");
        assert!(e.to_string().contains("exceeds"), "{e}");
        let r = parse(r#"{"prompt": "x", "top_k": 1e10}"#).expect("parses");
        let e = r.validate(&LIMITS).expect_err("top_k");
        assert!(!e.to_string().contains("vocabulary"), "{e}");
        assert!(e.to_string().contains("largest top_k accepted"), "{e}");
        let r = parse(r#"{"prompt": "x", "stop": ["", "x"]}"#).expect("parses");
        assert!(r
            .validate(&LIMITS)
            .expect_err("stop")
            .to_string()
            .contains("empty"));
    }

    #[test]
    fn unknown_ignored_and_unimplemented_fields() {
        let e = parse(r#"{"prompt": "x", "frobnicate": 1}"#).expect_err("unknown");
        assert_eq!(e.param(), Some("frobnicate"));
        assert!(parse(r#"{"prompt": "x", "user": "u1"}"#).is_ok());
        let e = parse(r#"{"prompt": "x", "use_beam_search": true}"#).expect_err("beam");
        assert_eq!(e.param(), Some("use_beam_search"));
        assert!(e.to_string().contains("not supported"), "{e}");
        assert!(parse(r#"{"prompt": "x", "use_beam_search": false}"#).is_ok());
        let r = parse(r#"{"prompt": "x", "presence_penalty": 2.5}"#).expect("parses");
        assert_eq!(
            r.validate(&LIMITS).expect_err("range").param(),
            Some("presence_penalty")
        );
        let r = parse(r#"{"prompt": "x", "logit_bias": {"a": 1}}"#).expect("parses");
        assert_eq!(
            r.validate(&LIMITS).expect_err("key").param(),
            Some("logit_bias")
        );
        let r = parse(r#"{"prompt": "x", "logit_bias": {"7": 500}}"#).expect("parses");
        assert_eq!(r.sampling().logit_bias_list(), vec![(7, 100.0)]);
        for bad in [
            r#""repetition_penalty": 0"#,
            r#""min_p": 1.5"#,
            r#""allowed_token_ids": []"#,
            r#""bad_words": [" "]"#,
            r#""truncate_prompt_tokens": 0"#,
        ] {
            let r = parse(&format!(r#"{{"prompt": "x", {bad}}}"#)).expect("parses");
            let e = r.validate(&LIMITS).expect_err(bad);
            assert!(bad.contains(e.param().unwrap_or("?")), "{bad}: {e}");
        }
        assert!(parse(r#"{"prompt": "x", "suffix": ""}"#).is_ok());
    }
}
