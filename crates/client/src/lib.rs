//! fp4forge-client: speed and quality of any OpenAI-compatible server (ours or vLLM's), measured
//! over HTTP only.
//!
//! # Two questions, one protocol
//!
//! *How fast?* — [`mod@bench`] streams `/v1/completions` and times chunk arrivals: time to first
//! token and prefill speed, decode speed at exact prompt lengths (token-id prompts cut with the
//! model's `tokenizer.json`), inter-token latency percentiles, and aggregate throughput as
//! concurrency grows. Lengths are exact because vLLM's `ignore_eos`/`min_tokens` are sent and
//! counts are read from the final usage chunk.
//!
//! *As good?* — [`eval`] scores tasks through the same endpoint: multiple choice by
//! log-likelihood (`echo: true, max_tokens: 0, logprobs: 1`, the continuation's tokens located by
//! `text_offset`), GSM8K by greedy generation and exact match, WikiText-2 by perplexity, and two
//! endpoints against each other by paired deltas with standard errors and per-token KL.
//!
//! The pieces: [`Client`] (HTTP with timeouts, retries, a bound on requests in flight),
//! [`sse`] (the event-stream parser), [`stats`] (percentiles, standard errors, paired deltas),
//! and plain report structs that serialize to JSON and print as tables.
#![deny(missing_docs)]

pub use fp4forge_api as api;
pub mod bench;
mod client;
mod error;
pub mod eval;
pub mod sse;
pub mod stats;
mod table;

pub use bench::{Bench, BenchConfig, BenchReport, PromptSource};
pub use client::{normalize_base_url, Client, ClientBuilder, StreamChunk, StreamedCompletion};
pub use error::{ClientError, Result};
pub use eval::{evaluate, load_task, Endpoint, EvalOptions, EvalReport, Task, TaskOptions};
