//! The benchmark's report: plain data that serializes as JSON and prints as tables.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::stats::{nan_if_null, Percentiles};
use crate::table::{num, Table};

/// Single-stream results at one prompt length.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContextResult {
    /// The prompt length asked for, in tokens.
    pub context: usize,
    /// The prompt length the server counted (`usage.prompt_tokens`, median over repetitions).
    pub prompt_tokens: u64,
    /// Tokens generated per request (median; less than `max_tokens` means the server stopped
    /// early, e.g. at EOS without `ignore_eos`).
    pub completion_tokens: u64,
    /// Measured requests.
    pub repetitions: usize,
    /// Time to first token, ms.
    pub ttft_ms: Percentiles,
    /// Prefill speed: prompt tokens ÷ TTFT (median over repetitions), tokens/s.
    #[serde(deserialize_with = "nan_if_null")]
    pub prefill_tok_s: f64,
    /// Decode speed: (completion tokens − 1) ÷ (last token time − first token time), median over
    /// repetitions, tokens/s.
    #[serde(deserialize_with = "nan_if_null")]
    pub decode_tok_s: f64,
    /// Slowest repetition's decode speed, tokens/s.
    #[serde(deserialize_with = "nan_if_null")]
    pub decode_tok_s_min: f64,
    /// Fastest repetition's decode speed, tokens/s.
    #[serde(deserialize_with = "nan_if_null")]
    pub decode_tok_s_max: f64,
    /// Time per output token after the first, one value per request, ms.
    pub tpot_ms: Percentiles,
    /// Inter-token latency: gaps between streamed chunks, pooled over requests, ms.
    pub itl_ms: Percentiles,
    /// Why this length could not be measured (e.g. longer than the server's context).
    pub error: Option<String>,
}

/// Results at one concurrency level.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepPoint {
    /// Streams in flight.
    pub concurrency: usize,
    /// Requests that completed.
    pub requests: usize,
    /// Requests that failed.
    pub failed: usize,
    /// Prompt tokens per request (median, as the server counted).
    pub prompt_tokens: u64,
    /// Wall time of the level, s.
    pub wall_s: f64,
    /// Aggregate generated tokens per second over the level's wall time.
    #[serde(deserialize_with = "nan_if_null")]
    pub output_tok_s: f64,
    /// Aggregate prompt + generated tokens per second.
    #[serde(deserialize_with = "nan_if_null")]
    pub total_tok_s: f64,
    /// Completed requests per second.
    #[serde(deserialize_with = "nan_if_null")]
    pub requests_per_s: f64,
    /// Median decode speed of one stream (1 / TPOT), tokens/s.
    #[serde(deserialize_with = "nan_if_null")]
    pub stream_decode_tok_s: f64,
    /// Time to first token, ms.
    pub ttft_ms: Percentiles,
    /// Time per output token, ms.
    pub tpot_ms: Percentiles,
    /// Inter-token latency, ms.
    pub itl_ms: Percentiles,
    /// The first error message, if any request failed.
    pub error: Option<String>,
}

/// Everything `fp4forge bench` measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    /// The server's `/v1` base URL.
    pub url: String,
    /// The model name sent.
    pub model: String,
    /// How prompts were sized.
    pub prompts: String,
    /// Tokens generated per request.
    pub max_tokens: u32,
    /// Whether `ignore_eos`/`min_tokens` were sent.
    pub ignore_eos: bool,
    /// Measured requests per prompt length; requests per stream in the sweep.
    pub repetitions: usize,
    /// Unmeasured warm-up requests.
    pub warmup: usize,
    /// Prompt length used in the concurrency sweep.
    pub sweep_context: usize,
    /// Single-stream results per prompt length.
    pub contexts: Vec<ContextResult>,
    /// Concurrency sweep.
    pub sweep: Vec<SweepPoint>,
}

fn err_cell(e: &Option<String>) -> String {
    match e {
        Some(m) => {
            let short: String = m.chars().take(60).collect();
            format!("error: {short}")
        }
        None => String::new(),
    }
}

impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "server   {}  model {}", self.url, self.model)?;
        writeln!(f, "prompts  {}", self.prompts)?;
        writeln!(
            f,
            "decode   {} tokens/request{}, {} repetitions, {} warm-up",
            self.max_tokens,
            if self.ignore_eos { " (ignore_eos)" } else { "" },
            self.repetitions,
            self.warmup
        )?;
        if !self.contexts.is_empty() {
            writeln!(f, "\nSingle stream")?;
            let mut t = Table::new([
                "context",
                "prompt",
                "gen",
                "TTFT p50 ms",
                "prefill tok/s",
                "decode tok/s",
                "min..max",
                "TPOT p50 ms",
                "ITL p50",
                "p90",
                "p99",
                "",
            ]);
            for c in &self.contexts {
                if c.repetitions == 0 {
                    t.row([
                        c.context.to_string(),
                        String::new(),
                        String::new(),
                        String::new(),
                        String::new(),
                        String::new(),
                        String::new(),
                        String::new(),
                        String::new(),
                        String::new(),
                        String::new(),
                        err_cell(&c.error),
                    ]);
                    continue;
                }
                t.row([
                    c.context.to_string(),
                    c.prompt_tokens.to_string(),
                    c.completion_tokens.to_string(),
                    num(c.ttft_ms.p50, 1),
                    num(c.prefill_tok_s, 0),
                    num(c.decode_tok_s, 1),
                    format!(
                        "{}..{}",
                        num(c.decode_tok_s_min, 1),
                        num(c.decode_tok_s_max, 1)
                    ),
                    num(c.tpot_ms.p50, 2),
                    num(c.itl_ms.p50, 2),
                    num(c.itl_ms.p90, 2),
                    num(c.itl_ms.p99, 2),
                    err_cell(&c.error),
                ]);
            }
            write!(f, "{t}")?;
        }
        if !self.sweep.is_empty() {
            writeln!(
                f,
                "\nConcurrency sweep (prompt {} tokens)",
                self.sweep_context
            )?;
            let mut t = Table::new([
                "streams",
                "reqs",
                "fail",
                "out tok/s",
                "total tok/s",
                "req/s",
                "stream tok/s",
                "TTFT p50 ms",
                "p99",
                "TPOT p50 ms",
                "p99",
                "ITL p99 ms",
                "",
            ]);
            for p in &self.sweep {
                t.row([
                    p.concurrency.to_string(),
                    p.requests.to_string(),
                    p.failed.to_string(),
                    num(p.output_tok_s, 1),
                    num(p.total_tok_s, 1),
                    num(p.requests_per_s, 2),
                    num(p.stream_decode_tok_s, 1),
                    num(p.ttft_ms.p50, 1),
                    num(p.ttft_ms.p99, 1),
                    num(p.tpot_ms.p50, 2),
                    num(p.tpot_ms.p99, 2),
                    num(p.itl_ms.p99, 2),
                    err_cell(&p.error),
                ]);
            }
            write!(f, "{t}")?;
        }
        Ok(())
    }
}
