//! Turning token ids into the text a client sees, one token at a time.
//!
//! [`Detokenizer`] gives each token its own piece of text such that the pieces concatenate to
//! the decoded sequence: it decodes a short window (the previous token(s) plus the new one) and
//! keeps the difference, so a tokenizer that strips a leading space or joins bytes into one
//! character still yields the right text; a token that ends inside a multi-byte character gets
//! an empty piece and the token that completes it gets the character. Pieces are what the
//! logprobs' `tokens` show and `text_offset` counts (in characters).
//!
//! [`ChoiceText`] assembles one choice's generated text from those pieces: it cuts the text at
//! the first stop string, and while streaming holds back a tail that might be the start of one,
//! so a client never receives text that a stop string later removes. What it releases is always
//! a run of whole tokens, so text and per-token logprobs stay aligned.

use std::collections::VecDeque;
use std::sync::Arc;

use fp4forge_engine::{EngineError, TextCodec, TokenLogprob};

/// Tokens of prompt context a generation's detokenizer starts from.
const CONTEXT_TOKENS: usize = 4;

/// Incremental detokenization of one sequence.
pub(crate) struct Detokenizer {
    codec: Arc<TextCodec>,
    ids: Vec<u32>,
    prefix: usize,
    read: usize,
    keep_special: bool,
}

impl Detokenizer {
    /// A detokenizer whose first pieces follow `context` (not itself emitted).
    pub fn new(codec: Arc<TextCodec>, context: &[u32], keep_special: bool) -> Self {
        let context = &context[context.len().saturating_sub(CONTEXT_TOKENS)..];
        Self {
            codec,
            ids: context.to_vec(),
            prefix: 0,
            read: context.len(),
            keep_special,
        }
    }

    fn decode(&self, ids: &[u32]) -> Result<String, EngineError> {
        if ids.is_empty() {
            return Ok(String::new());
        }
        self.codec.decode(ids, self.keep_special)
    }

    /// The text `id` adds (empty while it ends inside a character).
    pub fn push(&mut self, id: u32) -> Result<String, EngineError> {
        self.ids.push(id);
        let before = self.decode(&self.ids[self.prefix..self.read])?;
        let now = self.decode(&self.ids[self.prefix..])?;
        if now.len() > before.len() && !now.ends_with('\u{FFFD}') {
            let piece = match now.strip_prefix(before.as_str()) {
                Some(rest) => rest.to_string(),
                // A decoder that rewrites earlier text: keep the characters past the old length.
                None => now.chars().skip(before.chars().count()).collect(),
            };
            self.prefix = self.read;
            self.read = self.ids.len();
            // Keep the window short: only ids from `prefix` on are ever decoded again.
            if self.prefix > 64 {
                self.ids.drain(..self.prefix);
                self.read -= self.prefix;
                self.prefix = 0;
            }
            Ok(piece)
        } else {
            Ok(String::new())
        }
    }

    /// Text still held back at the end (an unfinished character, shown as U+FFFD).
    pub fn finish(&mut self) -> Result<String, EngineError> {
        if self.read >= self.ids.len() {
            return Ok(String::new());
        }
        let before = self.decode(&self.ids[self.prefix..self.read])?;
        let now = self.decode(&self.ids[self.prefix..])?;
        self.prefix = self.read;
        self.read = self.ids.len();
        Ok(match now.strip_prefix(before.as_str()) {
            Some(rest) => rest.to_string(),
            None => now.chars().skip(before.chars().count()).collect(),
        })
    }
}

/// Bytes at the end of `text` that are a proper prefix of `pattern` (0 if none): text that may
/// still turn out to be `pattern` once more arrives, so it is held back.
pub(crate) fn partial_match_len(text: &str, pattern: &str) -> usize {
    pattern
        .char_indices()
        .skip(1)
        .map(|(i, _)| i)
        .filter(|&i| text.ends_with(&pattern[..i]))
        .max()
        .unwrap_or(0)
}

/// One generated (or echoed) token as a client sees it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TextToken {
    /// Its id.
    pub id: u32,
    /// Its piece of the text.
    pub text: String,
    /// Its log-probabilities, when asked for (`None` for a prompt's first token).
    pub logprob: Option<TokenLogprob>,
}

/// Text released to the client, with the tokens that make it up.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Piece {
    /// The text (the tokens' texts, concatenated).
    pub text: String,
    /// The tokens.
    pub tokens: Vec<TextToken>,
}

impl Piece {
    /// Whether there is nothing to send.
    pub fn is_empty(&self) -> bool {
        self.text.is_empty() && self.tokens.is_empty()
    }
}

/// The echoed prompt as text and tokens: one piece per token, `logprobs[i]` attached to token
/// `i` when given.
pub(crate) fn prompt_piece(
    codec: &Arc<TextCodec>,
    ids: &[u32],
    mut logprobs: Vec<Option<TokenLogprob>>,
) -> Result<Piece, EngineError> {
    let mut d = Detokenizer::new(codec.clone(), &[], true);
    let mut piece = Piece::default();
    logprobs.resize(ids.len(), None);
    for (&id, lp) in ids.iter().zip(logprobs) {
        let text = d.push(id)?;
        piece.text.push_str(&text);
        piece.tokens.push(TextToken {
            id,
            text,
            logprob: lp,
        });
    }
    let tail = d.finish()?;
    if let Some(last) = piece.tokens.last_mut() {
        last.text.push_str(&tail);
    }
    piece.text.push_str(&tail);
    Ok(piece)
}

/// One choice's generated text: stop strings, hold-back, whole-token releases.
pub(crate) struct ChoiceText {
    detok: Detokenizer,
    stops: Vec<String>,
    longest_stop: usize,
    min_tokens: usize,
    text: String,
    released: usize,
    /// Tokens not yet released, with their byte span in `text`.
    pending: VecDeque<(TextToken, usize, usize)>,
    tokens: usize,
    stopped: bool,
    /// Keep the matched stop string in the text.
    include_stop: bool,
    /// The stop string that ended the text.
    matched: Option<String>,
}

/// The largest char boundary of `s` at or below `i`.
fn floor_boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

impl ChoiceText {
    /// Text generated after `prompt`, cut at the first of `stops` once `min_tokens` tokens
    /// were generated (kept in the text with `include_stop`); special tokens are dropped unless
    /// `keep_special`.
    pub fn new(
        codec: Arc<TextCodec>,
        prompt: &[u32],
        stops: Vec<String>,
        min_tokens: usize,
        keep_special: bool,
        include_stop: bool,
    ) -> Self {
        Self {
            detok: Detokenizer::new(codec, prompt, keep_special),
            longest_stop: stops.iter().map(String::len).max().unwrap_or(0),
            stops,
            min_tokens,
            text: String::new(),
            released: 0,
            pending: VecDeque::new(),
            tokens: 0,
            stopped: false,
            include_stop,
            matched: None,
        }
    }

    /// The stop string that ended the text, if one did.
    pub fn matched_stop(&self) -> Option<&str> {
        self.matched.as_deref()
    }

    /// Whether a stop string ended the text.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Generated tokens taken in (the one that completed a stop string included).
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Takes in a generated token; returns what can be released now. After a stop string
    /// matched ([`Self::stopped`]), further tokens are ignored.
    pub fn push(&mut self, id: u32, logprob: Option<TokenLogprob>) -> Result<Piece, EngineError> {
        if self.stopped {
            return Ok(Piece::default());
        }
        self.tokens += 1;
        let piece = self.detok.push(id)?;
        let start = self.text.len();
        self.text.push_str(&piece);
        let end = self.text.len();
        self.pending.push_back((
            TextToken {
                id,
                text: piece,
                logprob,
            },
            start,
            end,
        ));
        if !self.stops.is_empty() && self.tokens >= self.min_tokens && end > start {
            let from = floor_boundary(&self.text, start.saturating_sub(self.longest_stop));
            let hit = self
                .stops
                .iter()
                .filter_map(|s| self.text[from..].find(s.as_str()).map(|i| (from + i, s)))
                .min_by_key(|h| h.0);
            if let Some((m, stop)) = hit {
                let stop = stop.clone();
                // The text ends where the stop string starts (or ends, with `include_stop`).
                let m = if self.include_stop { m + stop.len() } else { m };
                self.matched = Some(stop);
                let m = m.max(self.released);
                self.text.truncate(m);
                self.stopped = true;
                return Ok(self.release_until(m, true, 0));
            }
        }
        // Tokens with no text yet at the end may still get some (an unfinished character):
        // they wait for the next token, or for `finish`.
        let len = self.text.len();
        let waiting = self
            .pending
            .iter()
            .rev()
            .take_while(|(_, s, e)| *s == len && *e == len)
            .count();
        let hold = self.held_back();
        Ok(self.release_until(len - hold, false, waiting))
    }

    /// Bytes at the end of the text that could begin a stop string.
    fn held_back(&self) -> usize {
        let t = &self.text[self.released..];
        self.stops
            .iter()
            .map(|s| partial_match_len(t, s))
            .max()
            .unwrap_or(0)
    }

    /// Releases the pending tokens that end by `limit` (with `clip`, every token starting
    /// before it, cut at it), keeping the last `keep` pending.
    fn release_until(&mut self, limit: usize, clip: bool, keep: usize) -> Piece {
        let mut out = Piece::default();
        let mut upto = self.released;
        while self.pending.len() > keep {
            let Some((_, start, end)) = self.pending.front() else {
                break;
            };
            let (start, end) = (*start, *end);
            let take = end <= limit || (clip && start < limit);
            if !take {
                break;
            }
            let (mut tok, _, _) = self.pending.pop_front().expect("front exists");
            if end > limit {
                tok.text.truncate(limit - start);
            }
            upto = end.min(limit);
            out.tokens.push(tok);
        }
        if clip {
            self.pending.clear();
            upto = limit;
        }
        out.text = self.text[self.released..upto].to_string();
        self.released = upto;
        out
    }

    /// The generation ended without a stop string: releases everything left.
    pub fn finish(&mut self) -> Result<Piece, EngineError> {
        if self.stopped {
            return Ok(Piece::default());
        }
        let tail = self.detok.finish()?;
        if !tail.is_empty() {
            self.text.push_str(&tail);
            if let Some((tok, _, end)) = self.pending.back_mut() {
                tok.text.push_str(&tail);
                *end = self.text.len();
            }
        }
        let mut out = self.release_until(self.text.len(), false, 0);
        // A tail after every token was released: text without a token.
        if self.released < self.text.len() {
            out.text.push_str(&self.text[self.released..]);
            self.released = self.text.len();
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_tiny_model as tiny_model;

    fn codec() -> (tempfile::TempDir, Arc<TextCodec>) {
        let tmp = tempfile::tempdir().unwrap();
        tiny_model::write_text_files(tmp.path()).unwrap();
        let codec = TextCodec::load(tmp.path()).unwrap();
        (tmp, Arc::new(codec))
    }

    fn run(codec: &Arc<TextCodec>, text: &str, stops: &[&str], min: usize) -> (Vec<Piece>, bool) {
        let ids = codec.encode(text, false).unwrap();
        let mut c = ChoiceText::new(
            codec.clone(),
            &[],
            stops.iter().map(|s| s.to_string()).collect(),
            min,
            false,
            false,
        );
        let mut out = Vec::new();
        for id in ids {
            out.push(c.push(id, None).unwrap());
            if c.stopped() {
                return (out, true);
            }
        }
        out.push(c.finish().unwrap());
        (out, false)
    }

    fn joined(pieces: &[Piece]) -> String {
        pieces.iter().map(|p| p.text.as_str()).collect()
    }

    #[test]
    fn pieces_spell_the_text_and_tokens_spell_the_pieces() {
        let (_t, codec) = codec();
        for text in [
            "Hello world! How are you today?",
            "héllo wörld 日本 ✓",
            "a\u{1F600}b",
        ] {
            let (pieces, stopped) = run(&codec, text, &[], 0);
            assert!(!stopped);
            assert_eq!(joined(&pieces), text);
            for p in &pieces {
                let toks: String = p.tokens.iter().map(|t| t.text.as_str()).collect();
                assert_eq!(toks, p.text);
            }
            let n: usize = pieces.iter().map(|p| p.tokens.len()).sum();
            assert_eq!(n, codec.encode(text, false).unwrap().len());
        }
    }

    #[test]
    fn a_stop_string_cuts_the_text_and_nothing_past_it_is_released() {
        let (_t, codec) = codec();
        let text = "Hello world! How are you today?";
        for stop in ["are", " you t", "?", "Hello", "w"] {
            let (pieces, stopped) = run(&codec, text, &[stop, "zzz"], 0);
            assert!(stopped, "{stop}");
            assert_eq!(joined(&pieces), &text[..text.find(stop).unwrap()], "{stop}");
        }
        // Not present: everything, after a held-back tail is finally released.
        let (pieces, stopped) = run(&codec, text, &["today!"], 0);
        assert!(!stopped);
        assert_eq!(joined(&pieces), text);
    }

    #[test]
    fn held_back_text_is_a_prefix_of_a_stop_string() {
        let (_t, codec) = codec();
        let ids = codec.encode("one two three", false).unwrap();
        let mut c = ChoiceText::new(
            codec.clone(),
            &[],
            vec![" two three!".into()],
            0,
            false,
            false,
        );
        let mut released = String::new();
        for id in ids {
            released.push_str(&c.push(id, None).unwrap().text);
        }
        // " two three" could still become the stop string: held back.
        assert_eq!(released, "one");
        released.push_str(&c.finish().unwrap().text);
        assert_eq!(released, "one two three");
    }

    #[test]
    fn stop_strings_wait_for_min_tokens() {
        let (_t, codec) = codec();
        let text = "Hello world! How are you today?";
        let (pieces, stopped) = run(&codec, text, &["Hello"], 1000);
        assert!(!stopped);
        assert_eq!(joined(&pieces), text);
    }
}
