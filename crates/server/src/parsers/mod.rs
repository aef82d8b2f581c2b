//! What a chat generation says, split the way vLLM's parsers split it: reasoning
//! (`--reasoning-parser`), content, and tool calls (`--tool-call-parser`), piece by piece as the
//! text streams. Reasoning is split off first, so a tool call inside a think block is reasoning,
//! never a call.

pub(crate) mod forced;
pub(crate) mod reasoning;
pub(crate) mod tool_calls;

use serde_json::Value;

pub(crate) use forced::ForcedCalls;
pub use reasoning::ReasoningFormat;
pub use tool_calls::ToolFormat;

use reasoning::ReasoningSplitter;
use tool_calls::{ToolCall, ToolCallSplitter};

/// One part of a chat generation, in order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Event {
    /// Reasoning text.
    Reasoning(String),
    /// Content text.
    Content(String),
    /// A tool call starts: its index in the message, id and function name.
    ToolCall {
        /// Index among the message's calls.
        index: usize,
        /// Its id.
        id: String,
        /// The function.
        name: String,
    },
    /// More of call `index`'s arguments (JSON text; the fragments concatenate to an object).
    ToolArgs {
        /// Index among the message's calls.
        index: usize,
        /// The text.
        fragment: String,
    },
}

/// The parsers of one chat choice.
#[derive(Debug)]
pub(crate) struct ChatParsers {
    reasoning: Option<ReasoningSplitter>,
    tools: Option<ToolCallSplitter>,
    /// Forced calls (`tool_choice` required or named): the text is their JSON, nothing else.
    forced: Option<ForcedCalls>,
}

impl ChatParsers {
    /// Parsers for a choice whose prompt text is `prompt`: reasoning split when `reasoning` is
    /// given, tool calls found (against the request's `tools`) when `tools` is given.
    pub fn new(
        prompt: &str,
        reasoning: Option<ReasoningFormat>,
        tools: Option<(ToolFormat, Vec<Value>)>,
    ) -> Self {
        Self {
            reasoning: reasoning.map(|f| ReasoningSplitter::new(f, prompt)),
            tools: tools.map(|(f, defs)| ToolCallSplitter::new(f, defs, call_id)),
            forced: None,
        }
    }

    /// The parser of a choice whose whole text is forced tool calls' JSON.
    pub fn forced(calls: ForcedCalls) -> Self {
        Self {
            reasoning: None,
            tools: None,
            forced: Some(calls),
        }
    }

    /// Whether any parser is active (the text must then keep the special tokens they read).
    pub fn active(&self) -> bool {
        self.reasoning.is_some() || self.tools.is_some()
    }

    /// Splits the next piece of generated text.
    pub fn push(&mut self, text: &str) -> Vec<Event> {
        if let Some(f) = &mut self.forced {
            return f.push(text, call_id);
        }
        let mut split = Vec::new();
        match &mut self.reasoning {
            Some(r) => r.push(text, &mut split),
            None => split.push(Event::Content(text.to_string())),
        }
        self.route(split)
    }

    /// The end of the generation: whatever was held back.
    pub fn finish(&mut self) -> Vec<Event> {
        if let Some(f) = &mut self.forced {
            return f.finish(call_id);
        }
        let mut split = Vec::new();
        if let Some(r) = &mut self.reasoning {
            r.finish(&mut split);
        }
        let mut out = self.route(split);
        if let Some(t) = &mut self.tools {
            t.finish(&mut out);
        }
        out
    }

    /// Whether a tool call was found (the finish reason becomes `tool_calls`).
    pub fn called(&self) -> bool {
        self.tools.as_ref().is_some_and(ToolCallSplitter::called)
            || self.forced.as_ref().is_some_and(ForcedCalls::called)
    }

    /// Content goes on to the tool-call parser; reasoning does not.
    fn route(&mut self, split: Vec<Event>) -> Vec<Event> {
        let Some(tools) = &mut self.tools else {
            return split;
        };
        let mut out = Vec::new();
        for e in split {
            match e {
                Event::Content(t) => tools.push(&t, &mut out),
                other => out.push(other),
            }
        }
        out
    }
}

/// A new tool call's id.
fn call_id() -> String {
    crate::state::response_id("chatcmpl-tool")
}

/// A whole chat message gathered from its events.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ParsedMessage {
    /// Reasoning, if any was split off.
    pub reasoning: Option<String>,
    /// Content (`None` when only tool calls or reasoning were written).
    pub content: Option<String>,
    /// The tool calls.
    pub tool_calls: Vec<ToolCall>,
}

impl ParsedMessage {
    /// Adds `events` in order.
    pub fn extend(&mut self, events: Vec<Event>) {
        for e in events {
            match e {
                Event::Reasoning(t) => self.reasoning.get_or_insert_with(String::new).push_str(&t),
                Event::Content(t) => self.content.get_or_insert_with(String::new).push_str(&t),
                Event::ToolCall { id, name, .. } => self.tool_calls.push(ToolCall {
                    id,
                    name,
                    arguments: String::new(),
                }),
                Event::ToolArgs { index, fragment } => {
                    if let Some(call) = self.tool_calls.get_mut(index) {
                        call.arguments.push_str(&fragment);
                    }
                }
            }
        }
    }

    /// As vLLM returns it: white-space-only content next to tool calls becomes `None`.
    pub fn tidy(mut self) -> Self {
        if !self.tool_calls.is_empty()
            && self.content.as_deref().is_some_and(|c| c.trim().is_empty())
        {
            self.content = None;
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_possible_tag_start_is_held_back() {
        use crate::text::partial_match_len;
        assert_eq!(partial_match_len("abc<tool", "<tool_call>"), 5);
        assert_eq!(partial_match_len("abc<", "<tool_call>"), 1);
        assert_eq!(partial_match_len("abc", "<tool_call>"), 0);
        assert_eq!(partial_match_len("<tool_call", "<tool_call>"), 10);
    }

    #[test]
    fn laguna_reasoning_then_a_call_streamed_in_pieces() {
        let tools = vec![json!({"type": "function", "function": {"name": "read_file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}})];
        let mut p = ChatParsers::new(
            "<user>x</user>\n<assistant><think>",
            Some(ReasoningFormat::PoolsideV1),
            Some((ToolFormat::PoolsideV1, tools)),
        );
        let text = "I should read <tool_call>it</tool_call> first.</think>Reading.<tool_call>read_file<arg_key>path</arg_key><arg_value>src/main.rs</arg_value></tool_call>";
        let mut msg = ParsedMessage::default();
        for chunk in text.as_bytes().chunks(3) {
            msg.extend(p.push(std::str::from_utf8(chunk).expect("ascii")));
        }
        msg.extend(p.finish());
        assert!(p.called());
        let msg = msg.tidy();
        assert_eq!(
            msg.reasoning.as_deref(),
            Some("I should read <tool_call>it</tool_call> first.")
        );
        assert_eq!(msg.content.as_deref(), Some("Reading."));
        assert_eq!(msg.tool_calls.len(), 1);
        assert_eq!(msg.tool_calls[0].name, "read_file");
        assert_eq!(msg.tool_calls[0].arguments, "{\"path\": \"src/main.rs\"}");
        assert!(msg.tool_calls[0].id.starts_with("chatcmpl-tool-"));
    }
}
