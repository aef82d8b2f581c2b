//! The slice of the OpenAI HTTP API the client speaks: `/v1/completions` (plain and streamed) and
//! `/v1/models`, with the vLLM extensions a benchmark needs (`ignore_eos`, `min_tokens`).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

/// A completion prompt: text, or token ids (OpenAI and vLLM accept `prompt: [ids]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// A text prompt; the server tokenizes it (and may add BOS).
    Text(String),
    /// Token ids, sent as they are.
    Tokens(Vec<u32>),
}

/// `stream_options` of a streamed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamOptions {
    /// Ask for a final chunk that carries `usage`.
    pub include_usage: bool,
}

/// The body of `POST /v1/completions`. `None` fields are left out of the JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionRequest {
    /// The served model name.
    pub model: String,
    /// The prompt.
    pub prompt: Prompt,
    /// Tokens to generate (0 with `echo` scores the prompt only).
    pub max_tokens: u32,
    /// Sampling temperature (0 = greedy).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Return the prompt in `text` and its token logprobs in `logprobs`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub echo: Option<bool>,
    /// Number of top alternatives per position in `top_logprobs` (also enables `token_logprobs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<u32>,
    /// Stop sequences.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop: Option<Vec<String>>,
    /// Stream the answer as server-sent events.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// Streaming options (`include_usage`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    /// vLLM: keep generating past EOS.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ignore_eos: Option<bool>,
    /// vLLM: generate at least this many tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_tokens: Option<u32>,
    /// Sampling seed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

impl CompletionRequest {
    /// A greedy, non-streamed request with every option unset.
    pub fn new(model: impl Into<String>, prompt: Prompt, max_tokens: u32) -> Self {
        Self {
            model: model.into(),
            prompt,
            max_tokens,
            temperature: Some(0.0),
            echo: None,
            logprobs: None,
            stop: None,
            stream: None,
            stream_options: None,
            ignore_eos: None,
            min_tokens: None,
            seed: None,
        }
    }
}

/// Token counts of a request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens in the prompt, as the server counted them.
    #[serde(default)]
    pub prompt_tokens: u64,
    /// Tokens generated.
    #[serde(default)]
    pub completion_tokens: u64,
    /// Their sum.
    #[serde(default)]
    pub total_tokens: u64,
}

/// The legacy (completions) logprobs object: parallel arrays, one entry per token.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Logprobs {
    /// Token texts.
    #[serde(default)]
    pub tokens: Vec<String>,
    /// Log-probability of each token given the tokens before it (`null` for the first prompt
    /// token, which has no context).
    #[serde(default)]
    pub token_logprobs: Vec<Option<f64>>,
    /// The most likely alternatives at each position, token text → logprob.
    #[serde(default)]
    pub top_logprobs: Option<Vec<Option<HashMap<String, f64>>>>,
    /// Offset of each token in the returned `text`, in characters (Unicode scalar values, as
    /// Python string indices).
    #[serde(default)]
    pub text_offset: Vec<usize>,
}

/// One choice of a completion response (or of a streamed chunk).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CompletionChoice {
    /// Choice index.
    #[serde(default)]
    pub index: u32,
    /// Generated text (prompt + generated text when echoing; the delta in a stream).
    #[serde(default)]
    pub text: String,
    /// Token logprobs, when asked for.
    #[serde(default)]
    pub logprobs: Option<Logprobs>,
    /// Why generation stopped (`length`, `stop`), `null` while streaming.
    #[serde(default)]
    pub finish_reason: Option<String>,
}

/// The body of a `/v1/completions` response, or one chunk of a stream.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CompletionResponse {
    /// Response id.
    #[serde(default)]
    pub id: String,
    /// The choices (empty in the final usage chunk of a stream).
    #[serde(default)]
    pub choices: Vec<CompletionChoice>,
    /// Token counts (in a stream: only in the final chunk, if asked for).
    #[serde(default)]
    pub usage: Option<Usage>,
}

/// One entry of `GET /v1/models`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelEntry {
    /// The model name to put in requests.
    pub id: String,
    /// The context length, where the server says (vLLM's `max_model_len`).
    #[serde(default)]
    pub max_model_len: Option<u64>,
}

/// The body of `GET /v1/models`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelList {
    /// The served models.
    pub data: Vec<ModelEntry>,
}
