//! What every handler shares: the engine, the tokenizer, the model's facts, the limits, the
//! metrics.

use std::sync::Arc;

use fp4forge_engine::{ModelInfo, TextCodec};

use crate::chat::ChatSetup;
use crate::config::ServerConfig;
use crate::metrics::Metrics;
use crate::scheduler::EngineHandle;
use crate::structured::Grammars;

/// Shared state of the HTTP handlers.
pub(crate) struct AppState {
    /// The engine thread.
    pub engine: EngineHandle,
    /// Tokenizer and chat template.
    pub codec: Arc<TextCodec>,
    /// The loaded model.
    pub info: ModelInfo,
    /// The name clients use.
    pub model_name: String,
    /// Limits.
    pub config: ServerConfig,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// When the server started (Unix seconds).
    pub created: u64,
    /// End-of-sequence ids: the model's and the tokenizer's.
    pub eos_ids: Vec<u32>,
    /// How chats are rendered and parsed.
    pub chat: ChatSetup,
    /// Bytes of text the longest vocabulary entry stands for (special tokens included): a text
    /// of `b` bytes has at least `b / max_token_bytes` tokens.
    pub max_token_bytes: usize,
    /// Tokenizations running at once, at most (one per core): tokenizing is CPU and memory
    /// work on blocking threads, bounded so that many large prompts at once cannot pile up.
    pub tokenize_permits: tokio::sync::Semaphore,
    /// The grammar engine of structured output.
    pub grammars: Arc<Grammars>,
}

impl AppState {
    /// The longest prompt text worth tokenizing, bytes: any longer one has more tokens than
    /// [`Self::max_prompt_tokens`].
    pub fn max_prompt_bytes(&self) -> usize {
        self.max_prompt_tokens()
            .saturating_mul(self.max_token_bytes)
    }

    /// The longest prompt accepted, tokens.
    pub fn max_prompt_tokens(&self) -> usize {
        self.config
            .max_prompt_tokens
            .unwrap_or(usize::MAX)
            .min(self.info.max_context)
    }
}

/// Unix seconds now.
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A response id with `prefix` (`cmpl`, `chatcmpl`): unique within and across runs.
pub(crate) fn response_id(prefix: &str) -> String {
    format!("{prefix}-{:016x}", crate::scheduler::fresh_seed())
}
