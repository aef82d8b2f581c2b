//! Request bodies: what completions and chat share ([`Sampling`], [`Stop`],
//! [`StreamOptions`], [`Limits`]) and the two requests, one file each.

/// Defines a request body: the fields every generation request has (`model`, `max_tokens`,
/// [`Sampling`]'s, `user`; [`COMMON_FIELDS`](crate::COMMON_FIELDS) lists them), then the type's
/// own, all optional and left out of the JSON when `None`; and its [`GenerationRequest`] impl.
/// The structured-output fields are common too.
/// One definition for both requests, since serde's `flatten` cannot go with
/// `deny_unknown_fields`.
macro_rules! wire_request {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( $(#[$fmeta:meta])* pub $field:ident : $ty:ty, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
        #[serde(default, deny_unknown_fields)]
        pub struct $name {
            /// The served model name (when given, it must be the one served).
            #[serde(skip_serializing_if = "Option::is_none")]
            pub model: Option<String>,
            /// Most tokens to generate (at least 1; completions: default 16, and 0 with `echo`
            /// scores the prompt only; chat: default the room left in the context).
            #[serde(skip_serializing_if = "Option::is_none")]
            pub max_tokens: Option<Integer>,
            /// Sampling temperature, 0 to 100 (below 1e-5: greedy).
            #[serde(skip_serializing_if = "Option::is_none")]
            pub temperature: Option<f64>,
            /// Nucleus mass, in (0, 1].
            #[serde(skip_serializing_if = "Option::is_none")]
            pub top_p: Option<f64>,
            /// vLLM: top-k (-1 or 0: off).
            #[serde(skip_serializing_if = "Option::is_none")]
            pub top_k: Option<Integer>,
            /// Choices (per prompt).
            #[serde(skip_serializing_if = "Option::is_none")]
            pub n: Option<Integer>,
            /// Sampling seed.
            #[serde(skip_serializing_if = "Option::is_none")]
            pub seed: Option<Integer>,
            /// Stop sequences.
            #[serde(skip_serializing_if = "Option::is_none")]
            pub stop: Option<Stop>,
            /// vLLM: extra stop token ids.
            #[serde(skip_serializing_if = "Option::is_none")]
            pub stop_token_ids: Option<Vec<Integer>>,
            /// vLLM: keep generating past EOS.
            #[serde(skip_serializing_if = "Option::is_none")]
            pub ignore_eos: Option<bool>,
            /// vLLM: generate at least this many tokens.
            #[serde(skip_serializing_if = "Option::is_none")]
            pub min_tokens: Option<Integer>,
            /// Stream the answer as server-sent events.
            #[serde(skip_serializing_if = "Option::is_none")]
            pub stream: Option<bool>,
            /// Streaming options (`include_usage`).
            #[serde(skip_serializing_if = "Option::is_none")]
            pub stream_options: Option<StreamOptions>,
            /// Accepted and ignored: an end-user id (OpenAI uses it for abuse monitoring).
            #[serde(skip_serializing_if = "Option::is_none")]
            pub user: Option<String>,
            /// Structured output (OpenAI): `text`, `json_object` or `json_schema`.
            #[serde(skip_serializing_if = "Option::is_none")]
            pub response_format: Option<$crate::requests::structured::ResponseFormat>,
            /// vLLM: structured output (one of `json`, `regex`, `choice`, `grammar`,
            /// `json_object`).
            #[serde(skip_serializing_if = "Option::is_none")]
            pub structured_outputs: Option<$crate::requests::structured::StructuredOutputs>,
            /// vLLM (older name): a JSON schema the output follows.
            #[serde(skip_serializing_if = "Option::is_none")]
            pub guided_json: Option<serde_json::Value>,
            /// vLLM (older name): a regex the output matches.
            #[serde(skip_serializing_if = "Option::is_none")]
            pub guided_regex: Option<String>,
            /// vLLM (older name): the output is one of these strings.
            #[serde(skip_serializing_if = "Option::is_none")]
            pub guided_choice: Option<Vec<String>>,
            /// vLLM (older name): a Lark (llguidance) grammar the output follows.
            #[serde(skip_serializing_if = "Option::is_none")]
            pub guided_grammar: Option<String>,
            /// Penalty on tokens already generated, -2 to 2.
            #[serde(skip_serializing_if = "Option::is_none")]
            pub presence_penalty: Option<f64>,
            /// Penalty per occurrence in the generated tokens, -2 to 2.
            #[serde(skip_serializing_if = "Option::is_none")]
            pub frequency_penalty: Option<f64>,
            /// vLLM: penalty on tokens of the prompt or the output, > 0 (1: off).
            #[serde(skip_serializing_if = "Option::is_none")]
            pub repetition_penalty: Option<f64>,
            /// Token id (as a string) → bias added to its logit (clamped to ±100).
            #[serde(skip_serializing_if = "Option::is_none")]
            pub logit_bias: Option<std::collections::BTreeMap<String, f64>>,
            /// vLLM: drop tokens below this fraction of the top probability, 0 to 1.
            #[serde(skip_serializing_if = "Option::is_none")]
            pub min_p: Option<f64>,
            /// vLLM: words never generated.
            #[serde(skip_serializing_if = "Option::is_none")]
            pub bad_words: Option<Vec<String>>,
            /// vLLM: only these token ids may be generated.
            #[serde(skip_serializing_if = "Option::is_none")]
            pub allowed_token_ids: Option<Vec<Integer>>,
            /// vLLM: keep the matched stop string in the text.
            #[serde(skip_serializing_if = "Option::is_none")]
            pub include_stop_str_in_output: Option<bool>,
            /// vLLM: leave special tokens out of the text (default true).
            #[serde(skip_serializing_if = "Option::is_none")]
            pub skip_special_tokens: Option<bool>,
            /// vLLM: keep only the last this many prompt tokens (at least 1).
            #[serde(skip_serializing_if = "Option::is_none")]
            pub truncate_prompt_tokens: Option<Integer>,
            /// vLLM: the prompt's logprobs with this many alternatives per position (0 to the
            /// server's most logprobs; not with `stream`).
            #[serde(skip_serializing_if = "Option::is_none")]
            pub prompt_logprobs: Option<Integer>,
            $(
                $(#[$fmeta])*
                #[serde(skip_serializing_if = "Option::is_none")]
                pub $field: $ty,
            )*
        }

        impl $crate::requests::GenerationRequest for $name {
            fn model(&self) -> Option<&str> {
                self.model.as_deref()
            }

            fn structured(&self) -> $crate::requests::structured::StructuredFields<'_> {
                $crate::requests::structured::StructuredFields {
                    response_format: self.response_format.as_ref(),
                    structured_outputs: self.structured_outputs.as_ref(),
                    guided_json: self.guided_json.as_ref(),
                    guided_regex: self.guided_regex.as_ref(),
                    guided_choice: self.guided_choice.as_ref(),
                    guided_grammar: self.guided_grammar.as_ref(),
                }
            }

            fn sampling(&self) -> Sampling<'_> {
                Sampling {
                    temperature: self.temperature,
                    top_p: self.top_p,
                    top_k: self.top_k,
                    seed: self.seed,
                    n: self.n,
                    stop: self.stop.as_ref(),
                    stop_token_ids: self.stop_token_ids.as_deref(),
                    ignore_eos: self.ignore_eos,
                    min_tokens: self.min_tokens,
                    stream: self.stream,
                    stream_options: self.stream_options.as_ref(),
                    presence_penalty: self.presence_penalty,
                    frequency_penalty: self.frequency_penalty,
                    repetition_penalty: self.repetition_penalty,
                    logit_bias: self.logit_bias.as_ref(),
                    min_p: self.min_p,
                    bad_words: self.bad_words.as_deref(),
                    allowed_token_ids: self.allowed_token_ids.as_deref(),
                    include_stop_str_in_output: self.include_stop_str_in_output,
                    skip_special_tokens: self.skip_special_tokens,
                    truncate_prompt_tokens: self.truncate_prompt_tokens,
                    prompt_logprobs: self.prompt_logprobs,
                }
            }
        }
    };
}

pub mod chat;
pub mod completion;
pub mod structured;
pub mod tokenize;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::RequestError;
use crate::integer::Integer;
use crate::parse::{describe, Unimplemented, WireRequest};

/// What every generation request (completions, chat) offers the server: its model, its sampling
/// fields and one validation of all of it. Implemented by the request types' definitions.
pub trait GenerationRequest: WireRequest {
    /// The model the request names, if it names one.
    fn model(&self) -> Option<&str>;

    /// The sampling and stopping fields.
    fn sampling(&self) -> Sampling<'_>;

    /// The structured-output fields ([`StructuredFields::constraint`](structured::StructuredFields::constraint)
    /// reads the constraint).
    fn structured(&self) -> structured::StructuredFields<'_>;

    /// Checks every field that can be checked without the model: the sampling fields against
    /// `limits`, then the type's own ([`WireRequest::validate_fields`]). Token counts against
    /// the context are the server's, after tokenizing.
    fn validate(&self, limits: &Limits) -> Result<(), RequestError> {
        self.sampling().validate(limits)?;
        self.validate_fields(limits)
    }
}

/// Most stop strings per request.
pub const MAX_STOPS: usize = 16;
/// Longest stop string, bytes (the server's hold-back check is quadratic in it).
pub const MAX_STOP_BYTES: usize = 256;

/// The limits a server puts on a request, for [`GenerationRequest::validate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most choices (sequences) per request.
    pub max_choices: usize,
    /// Most tokens a request may ask to generate.
    pub max_tokens: usize,
    /// Most top logprobs per position.
    pub max_logprobs: usize,
}

/// `stop`: one string or a list of them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

impl Stop {
    /// The stop strings as a list.
    pub fn to_list(&self) -> Vec<String> {
        match self {
            Self::One(s) => vec![s.clone()],
            Self::Many(v) => v.clone(),
        }
    }
}

/// `stream_options` of a streamed request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    /// Ask for a final chunk that carries `usage`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_usage: Option<bool>,
}

/// Fields of the API (OpenAI's and vLLM's) that both endpoints refuse unless null or neutral:
/// `best_of` and beam search (`use_beam_search`, `length_penalty`), `functions`, and the vLLM
/// extras fp4forge does not implement. A neutral value (`use_beam_search: false`) asks for
/// nothing and is accepted.
pub const UNIMPLEMENTED_COMMON: &[Unimplemented] = &[
    un("best_of", &["1"]),
    un("tools", &["[]"]),
    un("functions", &["[]"]),
    un("guided_decoding_backend", &[]),
    un("use_beam_search", &["false"]),
    un("length_penalty", &["1", "1.0"]),
    un("spaces_between_special_tokens", &[]),
    un("logits_processors", &[]),
    un("return_tokens_as_token_ids", &["false"]),
    un("reasoning_effort", &[]),
    un("priority", &["0"]),
    un("modalities", &["[\"text\"]"]),
    un("prediction", &[]),
    un("audio", &[]),
    un("web_search_options", &[]),
];

const fn un(name: &'static str, neutral: &'static [&'static str]) -> Unimplemented {
    Unimplemented { name, neutral }
}

/// The sampling and stopping fields both requests have, borrowed from one of them.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sampling<'a> {
    /// Sampling temperature, 0 to 100 (below 1e-5: greedy).
    pub temperature: Option<f64>,
    /// Nucleus mass, in (0, 1].
    pub top_p: Option<f64>,
    /// Top-k (vLLM); -1 or 0: off.
    pub top_k: Option<Integer>,
    /// Seed; choice `j` uses `seed + j`.
    pub seed: Option<Integer>,
    /// Choices per prompt.
    pub n: Option<Integer>,
    /// Stop strings.
    pub stop: Option<&'a Stop>,
    /// Extra stop token ids (vLLM).
    pub stop_token_ids: Option<&'a [Integer]>,
    /// Keep going past EOS (vLLM).
    pub ignore_eos: Option<bool>,
    /// No stop before this many tokens (vLLM).
    pub min_tokens: Option<Integer>,
    /// Server-sent events.
    pub stream: Option<bool>,
    /// Streaming options.
    pub stream_options: Option<&'a StreamOptions>,
    /// Presence penalty, -2 to 2.
    pub presence_penalty: Option<f64>,
    /// Frequency penalty, -2 to 2.
    pub frequency_penalty: Option<f64>,
    /// Repetition penalty (vLLM), > 0.
    pub repetition_penalty: Option<f64>,
    /// Logit bias: token id (a string) → bias.
    pub logit_bias: Option<&'a std::collections::BTreeMap<String, f64>>,
    /// Min-p (vLLM), 0 to 1.
    pub min_p: Option<f64>,
    /// Banned words (vLLM).
    pub bad_words: Option<&'a [String]>,
    /// The only tokens that may be generated (vLLM).
    pub allowed_token_ids: Option<&'a [Integer]>,
    /// Keep the matched stop string in the text (vLLM).
    pub include_stop_str_in_output: Option<bool>,
    /// Leave special tokens out of the text (vLLM; default true).
    pub skip_special_tokens: Option<bool>,
    /// Keep only the last this many prompt tokens (vLLM).
    pub truncate_prompt_tokens: Option<Integer>,
    /// Alternatives per prompt position in `prompt_logprobs` (vLLM).
    pub prompt_logprobs: Option<Integer>,
}

impl Sampling<'_> {
    /// Checks every field's range against `limits`.
    pub fn validate(&self, limits: &Limits) -> Result<(), RequestError> {
        if let Some(t) = self.temperature {
            in_range("temperature", t, 0.0, 100.0)?;
        }
        if let Some(p) = self.top_p {
            in_range("top_p", p, 0.0, 1.0)?;
            if p <= 0.0 {
                return Err(RequestError::invalid(
                    "top_p",
                    "`top_p` must be greater than 0",
                ));
            }
        }
        if let Some(k) = self.top_k {
            int_in(
                "top_k",
                k,
                -1,
                u64::from(u32::MAX),
                "the largest top_k accepted",
            )?;
        }
        if let Some(s) = self.seed {
            if s.0 < i128::from(i64::MIN) || s.0 > i128::from(u64::MAX) {
                return Err(RequestError::invalid(
                    "seed",
                    format!("`seed` must be a 64-bit integer, got {s}"),
                ));
            }
        }
        if let Some(n) = self.n {
            int_in(
                "n",
                n,
                1,
                limits.max_choices as u64,
                "this server's limit of choices per request",
            )?;
        }
        let stop = self.stop_list();
        if stop.len() > MAX_STOPS {
            return Err(RequestError::invalid(
                "stop",
                format!(
                    "`stop` has {} sequences; at most {MAX_STOPS} are allowed",
                    stop.len()
                ),
            ));
        }
        if stop.iter().any(String::is_empty) {
            return Err(RequestError::invalid(
                "stop",
                "`stop` sequences must not be empty",
            ));
        }
        if let Some(long) = stop.iter().find(|s| s.len() > MAX_STOP_BYTES) {
            return Err(RequestError::invalid(
                "stop",
                format!(
                    "a stop sequence of {} bytes; at most {MAX_STOP_BYTES} are allowed",
                    long.len()
                ),
            ));
        }
        for &id in self.stop_token_ids.unwrap_or_default() {
            if u32::try_from(id.0).is_err() {
                return Err(RequestError::WrongType {
                    field: "stop_token_ids".into(),
                    expected: "a list of token ids",
                    got: describe(&integer_value(id)),
                });
            }
        }
        if let Some(m) = self.min_tokens {
            int_in(
                "min_tokens",
                m,
                0,
                limits.max_tokens as u64,
                "this server's max_tokens limit",
            )?;
        }
        if let Some(p) = self.presence_penalty {
            in_range("presence_penalty", p, -2.0, 2.0)?;
        }
        if let Some(p) = self.frequency_penalty {
            in_range("frequency_penalty", p, -2.0, 2.0)?;
        }
        if let Some(p) = self.repetition_penalty {
            if !(p.is_finite() && p > 0.0) {
                return Err(RequestError::invalid(
                    "repetition_penalty",
                    format!("`repetition_penalty` must be greater than 0, got {p}"),
                ));
            }
        }
        if let Some(p) = self.min_p {
            in_range("min_p", p, 0.0, 1.0)?;
        }
        for (key, &bias) in self.logit_bias.into_iter().flatten() {
            if key.trim().parse::<u32>().is_err() {
                return Err(RequestError::invalid(
                    "logit_bias",
                    format!("`logit_bias` keys must be token ids, got {key:?}"),
                ));
            }
            if !bias.is_finite() {
                return Err(RequestError::invalid(
                    "logit_bias",
                    format!("`logit_bias[{key}]` must be a finite number"),
                ));
            }
        }
        if let Some(ids) = self.allowed_token_ids {
            if ids.is_empty() {
                return Err(RequestError::invalid(
                    "allowed_token_ids",
                    "`allowed_token_ids` must not be empty",
                ));
            }
            if let Some(&id) = ids.iter().find(|id| u32::try_from(id.0).is_err()) {
                return Err(RequestError::WrongType {
                    field: "allowed_token_ids".into(),
                    expected: "a list of token ids",
                    got: describe(&integer_value(id)),
                });
            }
        }
        if self
            .bad_words
            .unwrap_or_default()
            .iter()
            .any(|w| w.trim().is_empty())
        {
            return Err(RequestError::invalid(
                "bad_words",
                "`bad_words` must not contain empty words",
            ));
        }
        if let Some(t) = self.truncate_prompt_tokens {
            int_in(
                "truncate_prompt_tokens",
                t,
                1,
                u64::from(u32::MAX),
                "the largest prompt",
            )?;
        }
        if let Some(p) = self.prompt_logprobs {
            if p.0 == -1 {
                return Err(RequestError::invalid(
                    "prompt_logprobs",
                    "`prompt_logprobs: -1` (the whole vocabulary) is not supported by this \
                     server; ask for at most the server's most logprobs",
                ));
            }
            int_in(
                "prompt_logprobs",
                p,
                0,
                limits.max_logprobs as u64,
                "this server's most logprobs",
            )?;
            if self.stream == Some(true) {
                return Err(RequestError::invalid(
                    "prompt_logprobs",
                    "`prompt_logprobs` is not available with `stream: true`",
                ));
            }
        }
        Ok(())
    }

    /// Alternatives per prompt position asked for by `prompt_logprobs` (valid after
    /// [`Self::validate`]), `None` when absent.
    pub fn prompt_logprob_count(&self) -> Option<usize> {
        self.prompt_logprobs.and_then(Integer::to_usize)
    }

    /// `logit_bias` as token id → bias clamped to `[-100, 100]` (as vLLM clamps it). Valid
    /// after [`Self::validate`] (keys that are not token ids are skipped).
    pub fn logit_bias_list(&self) -> Vec<(u32, f32)> {
        self.logit_bias
            .into_iter()
            .flatten()
            .filter_map(|(k, &b)| {
                let id = k.trim().parse::<u32>().ok()?;
                Some((id, b.clamp(-100.0, 100.0) as f32))
            })
            .collect()
    }

    /// `allowed_token_ids` as ids (those that fit `u32`; all do after [`Self::validate`]).
    pub fn allowed_token_list(&self) -> Option<Vec<u32>> {
        self.allowed_token_ids.map(|ids| {
            ids.iter()
                .filter_map(|id| u32::try_from(id.0).ok())
                .collect()
        })
    }

    /// Choices per prompt (1 when absent). Valid after [`Self::validate`].
    pub fn choices(&self) -> usize {
        self.n.and_then(Integer::to_usize).unwrap_or(1)
    }

    /// The seed as 64 bits (a negative one wraps), `None` when absent.
    pub fn seed_bits(&self) -> Option<u64> {
        self.seed.map(|s| s.0 as u64)
    }

    /// Top-k: `Some(0)` for off (-1 or 0), `None` when absent.
    pub fn top_k(&self) -> Option<usize> {
        self.top_k.map(|k| k.to_usize().unwrap_or(0))
    }

    /// The stop strings (empty when absent).
    pub fn stop_list(&self) -> Vec<String> {
        self.stop.map(Stop::to_list).unwrap_or_default()
    }

    /// The extra stop token ids (those that fit `u32`; all do after [`Self::validate`]).
    pub fn stop_token_list(&self) -> Vec<u32> {
        self.stop_token_ids
            .unwrap_or_default()
            .iter()
            .filter_map(|id| u32::try_from(id.0).ok())
            .collect()
    }

    /// Tokens before a stop may be sampled (0 when absent).
    pub fn min_token_count(&self) -> usize {
        self.min_tokens.and_then(Integer::to_usize).unwrap_or(0)
    }

    /// Whether a final usage chunk was asked for.
    pub fn include_usage(&self) -> bool {
        self.stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false)
    }
}

/// `v` as a JSON number.
pub(crate) fn integer_value(v: Integer) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

/// Checks a number against `[min, max]`.
pub(crate) fn in_range(field: &str, x: f64, min: f64, max: f64) -> Result<(), RequestError> {
    if x.is_finite() && x >= min && x <= max {
        Ok(())
    } else {
        Err(RequestError::OutOfRange {
            field: field.into(),
            min,
            max,
            got: Value::from(x).to_string(),
        })
    }
}

/// Checks an integer against `[min, max]`; `what` names the upper bound.
pub(crate) fn int_in(
    field: &str,
    v: Integer,
    min: i128,
    max: u64,
    what: &'static str,
) -> Result<(), RequestError> {
    if v.0 < min {
        return Err(RequestError::TooSmall {
            field: field.into(),
            min,
            got: v.0,
        });
    }
    if v.0 > i128::from(max) {
        return Err(RequestError::TooLarge {
            field: field.into(),
            got: v.0,
            limit: max,
            what,
        });
    }
    Ok(())
}

/// The precise error for `stream_options` that did not deserialize.
pub(crate) fn stream_options_error(v: &Value) -> RequestError {
    let Value::Object(o) = v else {
        return RequestError::WrongType {
            field: "stream_options".into(),
            expected: "an object",
            got: describe(v),
        };
    };
    for (k, x) in o {
        if k != "include_usage" {
            return RequestError::UnknownField {
                field: format!("stream_options.{k}"),
            };
        }
        if !x.is_null() && !x.is_boolean() {
            return RequestError::WrongType {
                field: "stream_options.include_usage".into(),
                expected: "true or false",
                got: describe(x),
            };
        }
    }
    RequestError::WrongType {
        field: "stream_options".into(),
        expected: "an object",
        got: describe(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neutral_values_parse_as_json() {
        for u in UNIMPLEMENTED_COMMON {
            for text in u.neutral {
                assert!(
                    serde_json::from_str::<Value>(text).is_ok(),
                    "{}: {text}",
                    u.name
                );
            }
        }
    }
}
