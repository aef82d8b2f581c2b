//! An incremental server-sent-events parser (the WHATWG `text/event-stream` rules that OpenAI
//! streams use): bytes go in as the network delivers them, complete events come out.
//!
//! Lines end in `\n`, `\r\n` or `\r`; `data:` lines accumulate (joined by `\n`), a blank line
//! dispatches the event, lines starting with `:` are comments, one space after the colon is
//! dropped. An event with no `data` line is not dispatched.

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, empty when absent.
    pub event: String,
    /// The `data:` lines joined by `\n`.
    pub data: String,
}

/// The parser state: bytes of the current partial line and the fields of the current event.
#[derive(Debug, Default)]
pub struct SseParser {
    line: Vec<u8>,
    /// The previous byte was `\r`: a following `\n` belongs to the same line end.
    after_cr: bool,
    event: String,
    data: String,
    has_data: bool,
}

impl SseParser {
    /// An empty parser.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds bytes; returns the events completed by them, in order. Invalid UTF-8 in a line is
    /// replaced (U+FFFD), never an error.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        let mut out = Vec::new();
        for &b in bytes {
            match b {
                b'\n' if self.after_cr => self.after_cr = false,
                b'\n' | b'\r' => {
                    self.after_cr = b == b'\r';
                    self.end_line(&mut out);
                }
                _ => {
                    self.after_cr = false;
                    self.line.push(b);
                }
            }
        }
        out
    }

    /// Ends the stream: a last event not followed by a blank line is dispatched (lenient, as
    /// servers that close right after the last `data:` line exist).
    pub fn finish(&mut self) -> Option<SseEvent> {
        let mut out = Vec::new();
        if !self.line.is_empty() {
            self.end_line(&mut out);
        }
        self.end_line(&mut out);
        out.pop()
    }

    fn end_line(&mut self, out: &mut Vec<SseEvent>) {
        let line = String::from_utf8_lossy(&self.line).into_owned();
        self.line.clear();
        if line.is_empty() {
            if self.has_data {
                out.push(SseEvent {
                    event: std::mem::take(&mut self.event),
                    data: std::mem::take(&mut self.data),
                });
            }
            self.event.clear();
            self.data.clear();
            self.has_data = false;
            return;
        }
        if line.starts_with(':') {
            return;
        }
        let (field, value) = match line.find(':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(' ').unwrap_or(v))
            }
            None => (line.as_str(), ""),
        };
        match field {
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "event" => self.event = value.to_string(),
            _ => {} // id, retry and unknown fields do not matter here
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(events: &[SseEvent]) -> Vec<&str> {
        events.iter().map(|e| e.data.as_str()).collect()
    }

    #[test]
    fn splits_events_on_blank_lines() {
        let mut p = SseParser::new();
        let ev = p.push(b"data: {\"a\":1}\n\ndata: {\"b\":2}\n\ndata: [DONE]\n\n");
        assert_eq!(data(&ev), ["{\"a\":1}", "{\"b\":2}", "[DONE]"]);
    }

    #[test]
    fn events_split_across_arbitrary_chunks() {
        let stream =
            b"data: first\r\n\r\n: keep-alive comment\n\nevent: x\ndata: sec\ndata:ond\n\n";
        for cut in 0..stream.len() {
            for cut2 in cut..stream.len() {
                let mut p = SseParser::new();
                let mut ev = p.push(&stream[..cut]);
                ev.extend(p.push(&stream[cut..cut2]));
                ev.extend(p.push(&stream[cut2..]));
                assert_eq!(data(&ev), ["first", "sec\nond"], "cuts {cut} {cut2}");
                assert_eq!(ev[1].event, "x");
            }
        }
    }

    #[test]
    fn carriage_return_line_ends_and_utf8_across_chunks() {
        let mut p = SseParser::new();
        let bytes = "data: é€\r\rdata: b\n\n".as_bytes();
        let mut ev = Vec::new();
        for b in bytes.chunks(1) {
            ev.extend(p.push(b));
        }
        assert_eq!(data(&ev), ["é€", "b"]);
    }

    #[test]
    fn comments_and_dataless_events_are_not_dispatched() {
        let mut p = SseParser::new();
        assert!(p.push(b": ping\n\nevent: noop\n\nid: 3\n\n").is_empty());
        assert_eq!(data(&p.push(b"data\n\n")), [""]);
    }

    #[test]
    fn finish_flushes_an_unterminated_event() {
        let mut p = SseParser::new();
        assert!(p.push(b"data: tail").is_empty());
        assert_eq!(p.finish().map(|e| e.data), Some("tail".to_string()));
        assert_eq!(p.finish(), None);
    }
}
