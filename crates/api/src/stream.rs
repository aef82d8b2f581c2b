//! Server-sent event chunks: one envelope ([`StreamChunk`]) over the endpoint's choice type;
//! completions stream [`CompletionChoice`]s, chat streams [`ChatChunkChoice`] deltas.

use serde::{Deserialize, Serialize};

use crate::response::{ChatLogprobs, CompletionChoice, Usage};

/// One `data:` event of a stream: the envelope both endpoints share.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamChunk<C> {
    /// Response id (the same in every chunk).
    #[serde(default)]
    pub id: String,
    /// `text_completion` or `chat.completion.chunk`.
    #[serde(default)]
    pub object: String,
    /// Unix seconds.
    #[serde(default)]
    pub created: u64,
    /// The model that answers.
    #[serde(default)]
    pub model: String,
    /// This chunk's choices (empty in the final usage chunk).
    #[serde(default = "Vec::new")]
    pub choices: Vec<C>,
    /// Token counts: only in the final chunk, when `stream_options.include_usage`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// A streamed completion's chunk.
pub type CompletionChunk = StreamChunk<CompletionChoice>;

/// A streamed chat completion's chunk.
pub type ChatCompletionChunk = StreamChunk<ChatChunkChoice>;

/// What a chat chunk adds to the message.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatDelta {
    /// The role (first chunk only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// More text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// More reasoning (vLLM's field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Tool calls: the first delta of a call has its index, id, type and name; later ones add
    /// to its arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallDelta>,
}

/// Part of a streamed tool call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCallDelta {
    /// Which call of the message.
    #[serde(default)]
    pub index: u32,
    /// Its id (first delta only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `function` (first delta only).
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The name (first delta) and argument text.
    #[serde(default)]
    pub function: FunctionCallDelta,
}

/// The function part of a streamed tool call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionCallDelta {
    /// The name (first delta only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// More of the arguments' JSON text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

/// One choice of a chat chunk.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatChunkChoice {
    /// Choice index.
    #[serde(default)]
    pub index: u32,
    /// What this chunk adds.
    #[serde(default)]
    pub delta: ChatDelta,
    /// The added tokens' logprobs, when asked for.
    #[serde(default)]
    pub logprobs: Option<ChatLogprobs>,
    /// Why generation stopped (last chunk of the choice), else `null`.
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// vLLM: the stop string or token that ended it (always `null` here).
    #[serde(default)]
    pub stop_reason: Option<serde_json::Value>,
}
