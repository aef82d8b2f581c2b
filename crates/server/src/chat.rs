//! `POST /v1/chat/completions`: messages rendered with the checkpoint's chat template, plain or
//! streamed (a role delta first, content deltas, a finish chunk, a usage chunk when
//! `stream_options.include_usage`), with chat-style logprobs (`logprobs.content[]` entries with
//! `top_logprobs` lists).

use std::sync::Arc;

use fp4forge_api::{
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletionRequest, ChatCompletionResponse,
    ChatDelta, ChatLogprobs, ChatTokenLogprob, ChatTopLogprob,
};
use fp4forge_engine::{ChatMessage, EngineError, TextCodec};

use crate::api_error::ApiError;
use crate::endpoint::Endpoint;
use crate::generation::{ChoiceSpec, Collected, Update, Usage};
use crate::request::{
    check_prompt, check_prompt_bytes, choice_specs, max_tokens, with_codec, CommonParams,
};
use crate::state::AppState;
use crate::text::Piece;

/// Renders and tokenizes the conversation (the template writes any BOS itself).
async fn prompt_ids(
    state: &Arc<AppState>,
    messages: Vec<ChatMessage>,
) -> Result<Vec<u32>, ApiError> {
    // The rendered conversation holds at least the messages' text.
    let bytes = messages.iter().map(|m| m.content.len()).sum();
    check_prompt_bytes(bytes, state, "messages", "the conversation")?;
    with_codec(state, move |codec| {
        let text = codec.render_chat(&messages, true).map_err(|e| match e {
            EngineError::NoChatTemplate => ApiError::field(
                "messages",
                "this model has no chat template; use /v1/completions with a prompt",
            ),
            other => ApiError::field(
                "messages",
                format!("the chat template refused the messages: {other}"),
            ),
        })?;
        codec
            .encode(&text, false)
            .map_err(|e| ApiError::field("messages", format!("cannot tokenize: {e}")))
    })
    .await
}

/// `/v1/chat/completions`: one request's formatting state.
pub(crate) struct Chat {
    /// Whether logprobs were asked for.
    logprobs: bool,
}

impl Endpoint for Chat {
    type Request = ChatCompletionRequest;
    type Choice = ChatChunkChoice;
    type Response = ChatCompletionResponse;
    const ID_PREFIX: &'static str = "chatcmpl";
    const CHUNK_OBJECT: &'static str = "chat.completion.chunk";

    async fn plan(
        state: &Arc<AppState>,
        req: ChatCompletionRequest,
        common: &CommonParams,
    ) -> Result<(Self, Vec<ChoiceSpec>), ApiError> {
        let logprobs = req.top_logprobs();
        let messages = req
            .messages
            .as_deref()
            .unwrap_or_default()
            .iter()
            .map(|m| ChatMessage {
                role: m.role.as_str().to_string(),
                content: m.text(),
            })
            .collect();
        let prompt = prompt_ids(state, messages).await?;
        check_prompt(&prompt, state, "messages", "the rendered conversation")?;
        let prompts = vec![prompt];
        let max_tokens = max_tokens(req.max_tokens_field(), state, &prompts, None, 1)?;
        let specs = choice_specs(prompts, common, state, max_tokens, logprobs, None, false)?;
        let endpoint = Self {
            logprobs: logprobs.is_some(),
        };
        Ok((endpoint, specs))
    }

    fn opening(&self, choices: usize) -> Vec<ChatChunkChoice> {
        (0..choices)
            .map(|i| ChatChunkChoice {
                index: i as u32,
                delta: ChatDelta {
                    role: Some("assistant".into()),
                    content: Some(String::new()),
                },
                logprobs: None,
                finish_reason: None,
                stop_reason: None,
            })
            .collect()
    }

    fn chunk(&mut self, state: &AppState, update: Update) -> ChatChunkChoice {
        match update {
            Update::Piece { choice, piece } => ChatChunkChoice {
                index: choice as u32,
                logprobs: self.logprobs.then(|| ChatLogprobs {
                    content: content_logprobs(&state.codec, &piece),
                }),
                delta: ChatDelta {
                    role: None,
                    content: Some(piece.text),
                },
                finish_reason: None,
                stop_reason: None,
            },
            Update::Finished { choice, reason } => ChatChunkChoice {
                index: choice as u32,
                delta: ChatDelta::default(),
                logprobs: None,
                finish_reason: Some(reason.to_string()),
                stop_reason: None,
            },
        }
    }

    fn response(
        self,
        state: &AppState,
        id: String,
        created: u64,
        choices: Vec<Collected>,
        usage: Usage,
    ) -> ChatCompletionResponse {
        let choices = choices
            .into_iter()
            .enumerate()
            .map(|(i, c)| ChatChoice {
                index: i as u32,
                message: AssistantMessage {
                    role: "assistant".into(),
                    content: Some(c.pieces.iter().map(|p| p.text.as_str()).collect()),
                },
                logprobs: self.logprobs.then(|| ChatLogprobs {
                    content: c
                        .pieces
                        .iter()
                        .flat_map(|p| content_logprobs(&state.codec, p))
                        .collect(),
                }),
                finish_reason: c.finish.map(str::to_string),
                stop_reason: None,
            })
            .collect();
        ChatCompletionResponse {
            id,
            object: "chat.completion".into(),
            created,
            model: state.model_name.clone(),
            choices,
            usage: Some(usage.wire()),
        }
    }
}

/// `logprobs.content` entries of `piece`'s tokens.
fn content_logprobs(codec: &TextCodec, piece: &Piece) -> Vec<ChatTokenLogprob> {
    piece
        .tokens
        .iter()
        .filter_map(|t| {
            let lp = t.logprob.as_ref()?;
            let top_logprobs = lp
                .top
                .iter()
                .map(|&(id, v)| {
                    let s = codec.decode(&[id], true).unwrap_or_default();
                    ChatTopLogprob {
                        bytes: Some(s.as_bytes().to_vec()),
                        token: s,
                        logprob: f64::from(v),
                    }
                })
                .collect();
            Some(ChatTokenLogprob {
                token: t.text.clone(),
                logprob: f64::from(lp.logprob),
                bytes: Some(t.text.as_bytes().to_vec()),
                top_logprobs,
            })
        })
        .collect()
}
