//! `POST /v1/chat/completions`: messages (tool calls, tool results and reasoning included)
//! rendered with the chat template (the request's `chat_template`, `--chat-template`, else the
//! checkpoint's) with the request's `tools`, `documents` and `chat_template_kwargs`; the output
//! split into reasoning, content and tool calls by the configured parsers; plain or streamed (a role delta first, content deltas, a finish chunk, a usage chunk when
//! `stream_options.include_usage`), with chat-style logprobs (`logprobs.content[]` entries with
//! `top_logprobs` lists).

use std::path::Path;
use std::sync::Arc;

use fp4forge_api::{
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletionRequest, ChatCompletionResponse,
    ChatDelta, ChatLogprobs, ChatMessage as WireMessage, ChatTokenLogprob, ChatTopLogprob,
    Constrained, FunctionCall, FunctionCallDelta, GenerationRequest, MessageContent,
    OutputConstraint, ToolCall, ToolCallDelta, ToolChoice,
};
use fp4forge_engine::{ChatInput, ChatTemplate, EngineError, TextCodec};
use serde_json::{json, Map, Value};

use crate::api_error::ApiError;
use crate::config::ServerConfig;
use crate::endpoint::Endpoint;
use crate::error::ServerError;
use crate::generation::{ChoiceSpec, Collected, Update, Usage};
use crate::parsers::{ChatParsers, Event, ForcedCalls, ParsedMessage, ReasoningFormat, ToolFormat};
use crate::request::{
    check_prompt, check_prompt_bytes, choice_specs, max_tokens, with_codec, CommonParams,
};
use crate::state::AppState;
use crate::structured::constrain;
use crate::text::Piece;

/// How this server renders and parses chats, fixed at start-up.
pub(crate) struct ChatSetup {
    /// `--chat-template`, compiled (else the checkpoint's).
    template: Option<ChatTemplate>,
    /// The tool-call format, when requests with tools get their calls parsed.
    tool_format: Option<ToolFormat>,
    /// The reasoning format.
    reasoning: Option<ReasoningFormat>,
}

impl ChatSetup {
    /// Compiles `--chat-template` and settles the parsers: with `--enable-auto-tool-choice`,
    /// the `--tool-call-parser` given, else the format the chat template's instructions use.
    pub fn new(config: &ServerConfig, codec: &TextCodec) -> Result<Self, ServerError> {
        let template = match &config.chat_template {
            None => None,
            Some(path) => {
                let source = std::fs::read_to_string(path).map_err(|e| {
                    ServerError::Config(format!("--chat-template {}: {e}", path.display()))
                })?;
                Some(
                    codec
                        .compile_template(&source, path)
                        .map_err(|e| ServerError::Config(format!("--chat-template: {e}")))?,
                )
            }
        };
        let tool_format = match (config.enable_auto_tool_choice, config.tool_call_parser) {
            (false, Some(_)) => {
                return Err(ServerError::Config(
                    "--tool-call-parser needs --enable-auto-tool-choice (as in vLLM)".into(),
                ))
            }
            (false, None) => None,
            (true, Some(f)) => Some(f),
            (true, None) => {
                let source = match &template {
                    Some(t) => t.source(),
                    None => codec
                        .chat_template()
                        .map(ChatTemplate::source)
                        .unwrap_or(""),
                };
                Some(ToolFormat::detect(source).ok_or_else(|| {
                    ServerError::Config(format!(
                        "--enable-auto-tool-choice: the chat template's tool-call format is not \
                         one fp4forge reads; name it with --tool-call-parser ({})",
                        ToolFormat::ALL.map(|(n, _)| n).join(", ")
                    ))
                })?)
            }
        };
        Ok(Self {
            template,
            tool_format,
            reasoning: config.reasoning_parser,
        })
    }
}

/// The conversation as the chat template sees it: content parts joined with newlines (as vLLM
/// joins them), tool-call arguments as objects (as transformers' templates expect them).
fn template_messages(messages: &[WireMessage]) -> Vec<Value> {
    messages
        .iter()
        .map(|m| {
            let mut out = Map::new();
            out.insert("role".into(), json!(m.role.as_str()));
            let content = match &m.content {
                None => String::new(),
                Some(MessageContent::Text(s)) => s.clone(),
                Some(MessageContent::Parts(_)) => m.text(),
            };
            out.insert("content".into(), Value::String(content));
            if let Some(name) = &m.name {
                out.insert("name".into(), json!(name));
            }
            if let Some(id) = &m.tool_call_id {
                out.insert("tool_call_id".into(), json!(id));
            }
            if let Some(r) = m.reasoning_content.as_ref().or(m.reasoning.as_ref()) {
                out.insert("reasoning_content".into(), json!(r));
                out.insert("reasoning".into(), json!(r));
            }
            if let Some(calls) = &m.tool_calls {
                let calls: Vec<Value> = calls
                    .iter()
                    .map(|c| {
                        // Validation made sure a string here is an object's JSON text.
                        let arguments = match &c.function.arguments {
                            Some(Value::String(s)) if !s.trim().is_empty() => {
                                serde_json::from_str(s).unwrap_or_else(|_| json!({}))
                            }
                            Some(Value::Object(o)) => Value::Object(o.clone()),
                            _ => json!({}),
                        };
                        json!({
                            "id": c.id.clone().unwrap_or_default(),
                            "type": c.kind.clone().unwrap_or_else(|| "function".into()),
                            "function": {"name": c.function.name, "arguments": arguments},
                        })
                    })
                    .collect();
                out.insert("tool_calls".into(), Value::Array(calls));
            }
            Value::Object(out)
        })
        .collect()
}

/// What the chat template gets of `req`: its messages, tools (none when empty), documents and
/// template switches.
pub(crate) fn chat_input(req: &ChatCompletionRequest) -> ChatInput {
    let continue_final = req.continue_final_message == Some(true);
    ChatInput {
        messages: template_messages(req.messages.as_deref().unwrap_or_default()),
        tools: req.tools.clone().filter(|t| !t.is_empty()),
        documents: req
            .documents
            .clone()
            .map(|d| d.into_iter().map(Value::Object).collect()),
        add_generation_prompt: req.add_generation_prompt.unwrap_or(!continue_final),
        continue_final_message: continue_final,
        kwargs: req.chat_template_kwargs.clone().unwrap_or_default(),
    }
}

/// Renders the request's conversation and tokenizes it (the template writes any BOS itself,
/// unless `add_special_tokens` asks the tokenizer for it); returns the prompt text too (the
/// reasoning parser reads how it ends).
pub(crate) async fn render_prompt(
    state: &Arc<AppState>,
    req: &ChatCompletionRequest,
    input: ChatInput,
) -> Result<(String, Vec<u32>), ApiError> {
    // The rendered conversation holds at least the messages' text.
    let bytes = req.messages.iter().flatten().map(|m| m.text().len()).sum();
    check_prompt_bytes(bytes, state, "messages", "the conversation")?;
    let request_template = req.chat_template.clone();
    let add_special = req.add_special_tokens.unwrap_or(false);
    let setup = state.clone();
    with_codec(state, move |codec| {
        let refused = |e: EngineError| match e {
            EngineError::NoChatTemplate => ApiError::field(
                "messages",
                "this model has no chat template; use /v1/completions with a prompt, or pass \
                 `chat_template`",
            ),
            EngineError::ChatTemplate { reason, .. } => ApiError::field(
                "chat_template",
                format!("the request's chat template does not compile: {reason}"),
            ),
            other => ApiError::field(
                "messages",
                format!("the chat template refused the messages: {other}"),
            ),
        };
        let text = match &request_template {
            Some(source) => codec
                .compile_template(source, Path::new("request chat_template"))
                .and_then(|t| t.render_input(&input)),
            None => match &setup.chat.template {
                Some(t) => t.render_input(&input),
                None => codec.chat_template().and_then(|t| t.render_input(&input)),
            },
        }
        .map_err(refused)?;
        let ids = codec
            .encode(&text, add_special)
            .map_err(|e| ApiError::field("messages", format!("cannot tokenize: {e}")))?;
        Ok((text, ids))
    })
    .await
}

/// `/v1/chat/completions`: one request's formatting state.
pub(crate) struct Chat {
    /// Whether logprobs were asked for.
    logprobs: bool,
    /// Each choice's parsers (`None`: the text is all content).
    parsers: Vec<Option<ChatParsers>>,
    /// What goes into the reply.
    reply: Reply,
}

/// What a chat reply includes of what the parsers found.
#[derive(Debug, Clone, Copy)]
struct Reply {
    /// Whether reasoning goes into the response (`include_reasoning`).
    include_reasoning: bool,
    /// At most one tool call per message (`parallel_tool_calls: false`).
    single_call: bool,
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
        let tools = req.tools.clone().filter(|t| !t.is_empty());
        let tool_choice = req.tool_choice();
        let parse_tools = match (&tools, &tool_choice, state.chat.tool_format) {
            (Some(_), ToolChoice::Auto, Some(format)) => Some(format),
            (Some(_), ToolChoice::Auto, None) => {
                return Err(ApiError::field(
                    "tools",
                    "\"auto\" tool choice needs the server started with \
                     --enable-auto-tool-choice (and --tool-call-parser)",
                ))
            }
            _ => None,
        };
        let input = chat_input(&req);
        let (prompt_text, prompt) = render_prompt(state, &req, input).await?;
        check_prompt(&prompt, state, "messages", "the rendered conversation")?;
        let prompts = vec![common.truncated(prompt)];
        let max_tokens = max_tokens(req.max_tokens_field(), state, &prompts, None, 1)?;
        let mut specs = choice_specs(prompts, common, state, max_tokens, logprobs, None, false)?;
        let single_call = req.parallel_tool_calls == Some(false);
        // Forced tool calls are constrained to their JSON (validation made sure that no other
        // constraint was asked for).
        let forced = match (&tool_choice, &tools) {
            (ToolChoice::Required, Some(t)) => Some(ForcedCalls::required(t.clone(), single_call)),
            (ToolChoice::Function(name), Some(t)) => Some(ForcedCalls::named(name, t.clone())),
            _ => None,
        };
        let constraint = match &forced {
            Some(f) => Some(Constrained {
                field: "tool_choice".into(),
                constraint: OutputConstraint::JsonSchema(f.schema()),
            }),
            None => req.structured().constraint()?,
        };
        // A constrained text is all content (or all forced calls): no reasoning to split.
        let free = constraint.is_none();
        constrain(state, constraint, &mut specs).await?;
        let parsers: Vec<Option<ChatParsers>> = specs
            .iter()
            .map(|_| {
                if let Some(f) = &forced {
                    return Some(ChatParsers::forced(f.clone()));
                }
                let p = ChatParsers::new(
                    &prompt_text,
                    state.chat.reasoning,
                    parse_tools.map(|f| (f, tools.clone().unwrap_or_default())),
                );
                (free && p.active()).then_some(p)
            })
            .collect();
        for (spec, p) in specs.iter_mut().zip(&parsers) {
            // The parsers read the tags the tokenizer may call special.
            spec.keep_special |= p.is_some();
        }
        let endpoint = Self {
            logprobs: logprobs.is_some(),
            parsers,
            reply: Reply {
                include_reasoning: req.include_reasoning != Some(false),
                single_call,
            },
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
                    ..ChatDelta::default()
                },
                logprobs: None,
                finish_reason: None,
                stop_reason: None,
            })
            .collect()
    }

    fn chunk(&mut self, state: &AppState, update: Update) -> Option<ChatChunkChoice> {
        match update {
            Update::Piece { choice, piece } => {
                let logprobs = self.logprobs.then(|| ChatLogprobs {
                    content: content_logprobs(&state.codec, &piece),
                });
                let delta = match self.parsers.get_mut(choice).and_then(Option::as_mut) {
                    Some(p) => self.reply.delta(p.push(&piece.text)),
                    None => ChatDelta {
                        content: Some(piece.text),
                        ..ChatDelta::default()
                    },
                };
                if delta == ChatDelta::default() && logprobs.is_none() {
                    return None;
                }
                Some(ChatChunkChoice {
                    index: choice as u32,
                    logprobs,
                    delta,
                    finish_reason: None,
                    stop_reason: None,
                })
            }
            Update::Finished {
                choice,
                reason,
                stop_reason,
            } => {
                let (delta, called) = match self.parsers.get_mut(choice).and_then(Option::as_mut) {
                    Some(p) => {
                        let events = p.finish();
                        let called = p.called();
                        (self.reply.delta(events), called)
                    }
                    None => (ChatDelta::default(), false),
                };
                Some(ChatChunkChoice {
                    index: choice as u32,
                    delta,
                    logprobs: None,
                    finish_reason: Some(finish_reason(reason, called).to_string()),
                    stop_reason,
                })
            }
        }
    }

    fn response(
        mut self,
        state: &AppState,
        id: String,
        created: u64,
        choices: Vec<Collected>,
        usage: Usage,
    ) -> ChatCompletionResponse {
        // one prompt: its choices' prompt logprobs are the same
        let prompt_logprobs = choices.first().and_then(|c| c.prompt_logprobs.clone());
        let choices = choices
            .into_iter()
            .enumerate()
            .map(|(i, c)| {
                let text: String = c.pieces.iter().map(|p| p.text.as_str()).collect();
                let (message, called) = match self.parsers.get_mut(i).and_then(Option::as_mut) {
                    Some(p) => {
                        let mut parsed = ParsedMessage::default();
                        parsed.extend(p.push(&text));
                        parsed.extend(p.finish());
                        let called = p.called();
                        (self.reply.message(parsed.tidy()), called)
                    }
                    None => (
                        AssistantMessage {
                            role: "assistant".into(),
                            content: Some(text),
                            ..AssistantMessage::default()
                        },
                        false,
                    ),
                };
                ChatChoice {
                    index: i as u32,
                    message,
                    logprobs: self.logprobs.then(|| ChatLogprobs {
                        content: c
                            .pieces
                            .iter()
                            .flat_map(|p| content_logprobs(&state.codec, p))
                            .collect(),
                    }),
                    finish_reason: c.finish.map(|r| finish_reason(r, called).to_string()),
                    stop_reason: c.stop_reason,
                }
            })
            .collect();
        ChatCompletionResponse {
            id,
            object: "chat.completion".into(),
            created,
            model: state.model_name.clone(),
            choices,
            usage: Some(usage.wire()),
            prompt_logprobs,
        }
    }
}

/// `tool_calls` where a message that called tools ended naturally (as vLLM reports it).
fn finish_reason(reason: &'static str, called: bool) -> &'static str {
    if called && reason == "stop" {
        "tool_calls"
    } else {
        reason
    }
}

impl Reply {
    /// The stream delta of `events` (reasoning, content and tool-call parts together).
    fn delta(&self, events: Vec<Event>) -> ChatDelta {
        let mut delta = ChatDelta::default();
        for e in events {
            match e {
                Event::Reasoning(t) if self.include_reasoning => delta
                    .reasoning_content
                    .get_or_insert_with(String::new)
                    .push_str(&t),
                Event::Reasoning(_) => {}
                Event::Content(t) => delta.content.get_or_insert_with(String::new).push_str(&t),
                Event::ToolCall { index, .. } | Event::ToolArgs { index, .. }
                    if self.single_call && index > 0 => {}
                Event::ToolCall { index, id, name } => delta.tool_calls.push(ToolCallDelta {
                    index: index as u32,
                    id: Some(id),
                    kind: Some("function".into()),
                    function: FunctionCallDelta {
                        name: Some(name),
                        arguments: Some(String::new()),
                    },
                }),
                Event::ToolArgs { index, fragment } => match delta.tool_calls.last_mut() {
                    Some(last) if last.index == index as u32 => last
                        .function
                        .arguments
                        .get_or_insert_with(String::new)
                        .push_str(&fragment),
                    _ => delta.tool_calls.push(ToolCallDelta {
                        index: index as u32,
                        function: FunctionCallDelta {
                            name: None,
                            arguments: Some(fragment),
                        },
                        ..ToolCallDelta::default()
                    }),
                },
            }
        }
        delta
    }

    /// The response message of a parsed generation.
    fn message(&self, mut parsed: ParsedMessage) -> AssistantMessage {
        if self.single_call {
            parsed.tool_calls.truncate(1);
        }
        AssistantMessage {
            role: "assistant".into(),
            content: parsed.content,
            reasoning_content: parsed.reasoning.filter(|_| self.include_reasoning),
            tool_calls: parsed
                .tool_calls
                .into_iter()
                .map(|c| ToolCall {
                    id: c.id,
                    kind: "function".into(),
                    function: FunctionCall {
                        name: c.name,
                        arguments: c.arguments,
                    },
                })
                .collect(),
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
