//! Reasoning parsers (`--reasoning-parser`): split `<think>…</think>` off the generated text.
//!
//! All three read the same tags and differ in where a generation starts and what an unclosed
//! block means:
//!
//! - `poolside_v1` (Laguna) and `qwen3`: the text is reasoning from the start when the prompt
//!   left a think block open (the chat template's generation prompt ends in `<think>`, as Laguna's
//!   does with thinking on); otherwise a `<think>` the model writes first opens one. With thinking
//!   off the prompt closes the block (`</think>`) and everything is content.
//! - `deepseek_r1`: the text is reasoning from the start (its template opens the block) until
//!   `</think>`.
//!
//! `qwen3`, as vLLM's, treats a block the model opened itself but never closed as content
//! (the model did not think, it wrote a tag); the others keep it as reasoning (a generation cut
//! by `max_tokens` mid-thought).

use super::Event;
use crate::text::partial_match_len;

/// The reasoning formats, named as vLLM's `--reasoning-parser` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningFormat {
    /// Laguna (poolside).
    PoolsideV1,
    /// DeepSeek-R1.
    DeepseekR1,
    /// Qwen3.
    Qwen3,
}

impl ReasoningFormat {
    /// Every format with its flag value.
    pub const ALL: [(&'static str, ReasoningFormat); 3] = [
        ("poolside_v1", Self::PoolsideV1),
        ("deepseek_r1", Self::DeepseekR1),
        ("qwen3", Self::Qwen3),
    ];

    /// The format of a flag value, if there is one.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
    }
}

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// Where the reasoning splitter is in the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// At the start: a `<think>` (after white space) may still open a block.
    Start,
    /// Inside a think block.
    Reasoning,
    /// After it (or with none): content.
    Content,
}

/// Splits one generation's text into reasoning and content, piece by piece.
#[derive(Debug)]
pub(crate) struct ReasoningSplitter {
    format: ReasoningFormat,
    state: State,
    /// Text not yet classified (a possible tag's start).
    pending: String,
    /// The block was opened by the model's own `<think>` (not the prompt).
    opened_by_output: bool,
    /// Reasoning of a self-opened block, held until `</think>` (qwen3 only).
    held: String,
}

/// Whether `prompt` ends inside a think block: its last `<think>` is not followed by `</think>`.
pub(crate) fn prompt_opens_block(prompt: &str) -> bool {
    match (prompt.rfind(OPEN), prompt.rfind(CLOSE)) {
        (Some(open), Some(close)) => open > close,
        (Some(_), None) => true,
        _ => false,
    }
}

impl ReasoningSplitter {
    /// A splitter for a generation whose prompt is `prompt`.
    pub fn new(format: ReasoningFormat, prompt: &str) -> Self {
        let state = match format {
            ReasoningFormat::DeepseekR1 => State::Reasoning,
            _ if prompt_opens_block(prompt) => State::Reasoning,
            _ => State::Start,
        };
        Self {
            format,
            state,
            pending: String::new(),
            opened_by_output: false,
            held: String::new(),
        }
    }

    fn reasoning(&mut self, text: &str, out: &mut Vec<Event>) {
        if text.is_empty() {
            return;
        }
        if self.opened_by_output && self.format == ReasoningFormat::Qwen3 {
            self.held.push_str(text);
        } else {
            out.push(Event::Reasoning(text.to_string()));
        }
    }

    /// Classifies `text` (the next piece of the generation).
    pub fn push(&mut self, text: &str, out: &mut Vec<Event>) {
        self.pending.push_str(text);
        loop {
            match self.state {
                State::Content => {
                    let rest = std::mem::take(&mut self.pending);
                    if !rest.is_empty() {
                        out.push(Event::Content(rest));
                    }
                    return;
                }
                State::Start => {
                    let trimmed = self.pending.trim_start();
                    if let Some(after) = trimmed.strip_prefix(OPEN) {
                        self.pending = after.to_string();
                        self.state = State::Reasoning;
                        self.opened_by_output = true;
                    } else if OPEN.starts_with(trimmed) {
                        return; // white space or part of `<think>` so far
                    } else {
                        self.state = State::Content;
                    }
                }
                State::Reasoning => match self.pending.find(CLOSE) {
                    Some(at) => {
                        let before = self.pending[..at].to_string();
                        self.pending.drain(..at + CLOSE.len());
                        self.reasoning(&before, out);
                        if !self.held.is_empty() {
                            out.push(Event::Reasoning(std::mem::take(&mut self.held)));
                        }
                        self.opened_by_output = false;
                        self.state = State::Content;
                    }
                    None => {
                        let keep = partial_match_len(&self.pending, CLOSE);
                        let ready = self.pending[..self.pending.len() - keep].to_string();
                        self.pending.drain(..self.pending.len() - keep);
                        self.reasoning(&ready, out);
                        return;
                    }
                },
            }
        }
    }

    /// The end of the generation: flushes what is held.
    pub fn finish(&mut self, out: &mut Vec<Event>) {
        let rest = std::mem::take(&mut self.pending);
        match self.state {
            State::Reasoning if self.opened_by_output && self.format == ReasoningFormat::Qwen3 => {
                // Never closed: it was content with a tag in front.
                let text = format!("{OPEN}{}{rest}", std::mem::take(&mut self.held));
                out.push(Event::Content(text));
            }
            State::Reasoning => self.reasoning(&rest, out),
            State::Start | State::Content => {
                if !rest.is_empty() {
                    out.push(Event::Content(rest));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(format: ReasoningFormat, prompt: &str, pieces: &[&str]) -> (String, String) {
        let mut s = ReasoningSplitter::new(format, prompt);
        let mut out = Vec::new();
        for p in pieces {
            s.push(p, &mut out);
        }
        s.finish(&mut out);
        let (mut r, mut c) = (String::new(), String::new());
        for e in out {
            match e {
                Event::Reasoning(t) => r.push_str(&t),
                Event::Content(t) => c.push_str(&t),
                other => panic!("{other:?}"),
            }
        }
        (r, c)
    }

    #[test]
    fn laguna_prompt_opens_the_block() {
        let prompt = "<user>hi</user>\n<assistant><think>";
        let pieces = ["Let me", " think.</th", "ink>The answer", " is 4."];
        assert_eq!(
            split(ReasoningFormat::PoolsideV1, prompt, &pieces),
            ("Let me think.".into(), "The answer is 4.".into())
        );
        // Thinking off: the prompt closed the block.
        let off = "<user>hi</user>\n<assistant></think>";
        assert_eq!(
            split(ReasoningFormat::PoolsideV1, off, &["4", "."]),
            (String::new(), "4.".into())
        );
    }

    #[test]
    fn a_block_the_model_opens() {
        let pieces = ["\n<thi", "nk>hm</think>\n\nok"];
        assert_eq!(
            split(ReasoningFormat::Qwen3, "", &pieces),
            ("hm".into(), "\n\nok".into())
        );
        // Never closed: qwen3 calls it content, poolside reasoning (cut mid-thought).
        assert_eq!(
            split(ReasoningFormat::Qwen3, "", &["<think>hm"]),
            (String::new(), "<think>hm".into())
        );
        assert_eq!(
            split(ReasoningFormat::PoolsideV1, "", &["<think>hm"]),
            ("hm".into(), String::new())
        );
        // No tag at all: content.
        assert_eq!(
            split(ReasoningFormat::PoolsideV1, "", &["a <think> b"]),
            (String::new(), "a <think> b".into())
        );
    }

    #[test]
    fn deepseek_starts_in_reasoning() {
        assert_eq!(
            split(ReasoningFormat::DeepseekR1, "", &["x</think>y"]),
            ("x".into(), "y".into())
        );
    }
}
