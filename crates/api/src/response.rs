//! Response bodies: completions (with the legacy logprobs object), chat completions (with
//! chat logprobs), and the usage both carry. Reading is lenient (`#[serde(default)]`, extra
//! fields ignored) so the client can read vLLM's answers too.

use serde::{Deserialize, Serialize};

/// Token counts of a request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens in the prompt(s), each distinct prompt once.
    #[serde(default)]
    pub prompt_tokens: u64,
    /// Tokens generated over all choices.
    #[serde(default)]
    pub completion_tokens: u64,
    /// Their sum.
    #[serde(default)]
    pub total_tokens: u64,
    /// Details of the prompt tokens: `null` when the server has no prefix cache (vLLM's shape:
    /// the field is always there, `null` unless it reports them).
    #[serde(default)]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

/// `usage.prompt_tokens_details`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens the prefix cache let the server skip (summed over the prompts).
    #[serde(default)]
    pub cached_tokens: u64,
}

impl Usage {
    /// Usage with `total_tokens` as the sum.
    pub fn new(prompt_tokens: u64, completion_tokens: u64) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: None,
        }
    }

    /// The same usage reporting `cached_tokens` (`None`: no details, `null`).
    pub fn with_cached_tokens(self, cached_tokens: Option<u64>) -> Self {
        Self {
            prompt_tokens_details: cached_tokens
                .map(|cached_tokens| PromptTokensDetails { cached_tokens }),
            ..self
        }
    }
}

/// Top alternatives at one position: token text → logprob, in order (a JSON object).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TopLogprobs(pub Vec<(String, f64)>);

impl TopLogprobs {
    /// The logprob of `token`, when listed.
    pub fn get(&self, token: &str) -> Option<f64> {
        self.0.iter().find(|(t, _)| t == token).map(|p| p.1)
    }

    /// Adds `token` unless already listed (the first entry wins).
    pub fn insert_first(&mut self, token: String, logprob: f64) {
        if self.get(&token).is_none() {
            self.0.push((token, logprob));
        }
    }

    /// The entries, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, f64)> {
        self.0.iter().map(|(t, v)| (t.as_str(), *v))
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl IntoIterator for TopLogprobs {
    type Item = (String, f64);
    type IntoIter = std::vec::IntoIter<(String, f64)>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl FromIterator<(String, f64)> for TopLogprobs {
    fn from_iter<I: IntoIterator<Item = (String, f64)>>(iter: I) -> Self {
        let mut out = Self::default();
        for (t, v) in iter {
            out.insert_first(t, v);
        }
        out
    }
}

impl Serialize for TopLogprobs {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (t, v) in &self.0 {
            map.serialize_entry(t, v)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for TopLogprobs {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let map = serde_json::Map::<String, serde_json::Value>::deserialize(d)?;
        let mut out = Vec::with_capacity(map.len());
        for (t, v) in map {
            let x = v
                .as_f64()
                .ok_or_else(|| serde::de::Error::custom(format!("top logprob of {t:?}: {v}")))?;
            out.push((t, x));
        }
        Ok(Self(out))
    }
}

/// The legacy (completions) logprobs object: parallel arrays, one entry per token.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CompletionLogprobs {
    /// Token texts.
    #[serde(default)]
    pub tokens: Vec<String>,
    /// Log-probability of each token given the tokens before it (`null` for the first prompt
    /// token, which has no context).
    #[serde(default)]
    pub token_logprobs: Vec<Option<f64>>,
    /// The most likely alternatives at each position (`null` where there are none).
    #[serde(default)]
    pub top_logprobs: Option<Vec<Option<TopLogprobs>>>,
    /// Offset of each token in the returned `text`, in characters (Unicode scalar values, as
    /// Python string indices).
    #[serde(default)]
    pub text_offset: Vec<usize>,
}

/// One prompt token's entry in vLLM's `prompt_logprobs`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PromptLogprob {
    /// Its log-probability given the tokens before it.
    #[serde(default)]
    pub logprob: f64,
    /// Its rank in the vocabulary (1: the most likely).
    #[serde(default)]
    pub rank: Option<u64>,
    /// Its text.
    #[serde(default)]
    pub decoded_token: Option<String>,
}

/// vLLM's `prompt_logprobs`: `null` for the first prompt token, then per position token id →
/// [`PromptLogprob`], holding the top N and the prompt's own token.
pub type PromptLogprobs = Vec<Option<std::collections::BTreeMap<u32, PromptLogprob>>>;

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
    pub logprobs: Option<CompletionLogprobs>,
    /// Why generation stopped (`length`, `stop`), `null` until it has.
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// vLLM: the stop string or token that ended it (always `null` here).
    #[serde(default)]
    pub stop_reason: Option<serde_json::Value>,
    /// vLLM: the prompt's logprobs, when `prompt_logprobs` asked for them (absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<PromptLogprobs>,
}

/// The body of a `/v1/completions` response.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CompletionResponse {
    /// Response id.
    #[serde(default)]
    pub id: String,
    /// `text_completion`.
    #[serde(default)]
    pub object: String,
    /// Unix seconds.
    #[serde(default)]
    pub created: u64,
    /// The model that answered.
    #[serde(default)]
    pub model: String,
    /// The choices.
    #[serde(default)]
    pub choices: Vec<CompletionChoice>,
    /// Token counts.
    #[serde(default)]
    pub usage: Option<Usage>,
}

/// One alternative in a chat logprobs entry.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatTopLogprob {
    /// The token's text.
    #[serde(default)]
    pub token: String,
    /// Its log-probability.
    #[serde(default)]
    pub logprob: f64,
    /// Its UTF-8 bytes.
    #[serde(default)]
    pub bytes: Option<Vec<u8>>,
}

/// One generated token in chat logprobs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatTokenLogprob {
    /// The token's text.
    #[serde(default)]
    pub token: String,
    /// Its log-probability.
    #[serde(default)]
    pub logprob: f64,
    /// Its UTF-8 bytes.
    #[serde(default)]
    pub bytes: Option<Vec<u8>>,
    /// The most likely alternatives, most likely first.
    #[serde(default)]
    pub top_logprobs: Vec<ChatTopLogprob>,
}

/// Chat logprobs: `{"content": [...]}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatLogprobs {
    /// One entry per generated token.
    #[serde(default)]
    pub content: Vec<ChatTokenLogprob>,
}

/// The assistant's message in a chat response.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AssistantMessage {
    /// `assistant`.
    #[serde(default)]
    pub role: String,
    /// The generated text (`null` when the model only called tools).
    #[serde(default)]
    pub content: Option<String>,
    /// The reasoning the reasoning parser split off (vLLM's field; absent without one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The tool calls the tool-call parser found (absent when there are none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

/// A tool call in a response: `{"id", "type": "function", "function": {"name", "arguments"}}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Its id, which the `tool` message answering it names.
    #[serde(default)]
    pub id: String,
    /// `function`.
    #[serde(rename = "type", default)]
    pub kind: String,
    /// The function and its arguments.
    #[serde(default)]
    pub function: FunctionCall,
}

/// A called function: its name and its arguments as JSON text.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionCall {
    /// The function's name.
    #[serde(default)]
    pub name: String,
    /// Its arguments: a JSON object, as text.
    #[serde(default)]
    pub arguments: String,
}

/// One choice of a chat completion response.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatChoice {
    /// Choice index.
    #[serde(default)]
    pub index: u32,
    /// The generated message.
    #[serde(default)]
    pub message: AssistantMessage,
    /// Token logprobs, when asked for.
    #[serde(default)]
    pub logprobs: Option<ChatLogprobs>,
    /// Why generation stopped (`length`, `stop`).
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// vLLM: the stop string or token that ended it (always `null` here).
    #[serde(default)]
    pub stop_reason: Option<serde_json::Value>,
}

/// The body of a `/v1/chat/completions` response.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionResponse {
    /// Response id.
    #[serde(default)]
    pub id: String,
    /// `chat.completion`.
    #[serde(default)]
    pub object: String,
    /// Unix seconds.
    #[serde(default)]
    pub created: u64,
    /// The model that answered.
    #[serde(default)]
    pub model: String,
    /// The choices.
    #[serde(default)]
    pub choices: Vec<ChatChoice>,
    /// Token counts.
    #[serde(default)]
    pub usage: Option<Usage>,
    /// vLLM: the prompt's logprobs, when `prompt_logprobs` asked for them (absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<PromptLogprobs>,
}
