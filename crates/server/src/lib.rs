//! fp4forge-server: an OpenAI-compatible HTTP API over the fp4forge engine.
//!
//! # The life of a request
//!
//! ```text
//! connection (hyper, TCP_NODELAY) at most --max-connections (503), headers within their timeout
//!                               and size (else closed, or a 4xx with OpenAI's error body)
//! HTTP (axum)                   body ≤ limit (413) within its timeout (408), read into an
//!                               `fp4forge-api` request (unknown and unimplemented fields
//!                               refused by name) and validated: a bad request is a 4xx with
//!                               OpenAI's error body, never a panic
//! handler (one, over the        prompt → token ids (tokenizer.json; chat: the chat template),
//!   `Endpoint` trait)           n choices per prompt → sequences, submitted to the engine queue
//!                               (429 when full)
//! engine thread (scheduler)     owns the Model and one Session (KV cache) per running sequence;
//!                               each step admits waiting sequences, prefills prompt chunks and
//!                               advances EVERY decoding sequence by one token in ONE batched
//!                               forward pass (continuous batching), samples, sends tokens back
//! handler                       tokens → text pieces (incremental detokenization, stop strings,
//!                               logprobs, text offsets) → one JSON response or SSE chunks
//! client gone                   the response stream / future is dropped → its channel closes →
//!                               the scheduler drops the sequence at its next step
//! ```
//!
//! Endpoints: `GET /v1/models`, `POST /v1/completions`, `POST /v1/chat/completions`,
//! `GET /health`, `GET /metrics` (Prometheus text). Start one with [`Server::bind`] and
//! [`Server::run`]; [`shutdown_signal`] is SIGINT/SIGTERM.
#![deny(missing_docs)]

mod api_error;
mod auth;
mod chat;
mod completions;
mod config;
mod conn;
mod cors;
mod endpoint;
mod error;
mod generation;
mod handler;
mod http;
mod logprobs;
mod logs;
mod metrics;
pub mod parsers;
mod prefix_cache;
mod request;
mod scheduler;
mod server;
mod state;
mod stream;
mod structured;
mod text;
mod tokenize;

#[cfg(test)]
#[path = "../tests/common/tiny_model.rs"]
mod test_tiny_model;

pub use api_error::ApiError;
pub use config::{
    ServerConfig, DEFAULT_BODY_READ_TIMEOUT, DEFAULT_HEADER_READ_TIMEOUT, DEFAULT_MAX_BATCH,
    DEFAULT_MAX_BATCH_GPU, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_CHOICES, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_LOGPROBS, DEFAULT_MAX_QUEUE, DEFAULT_MAX_TOKENS_LIMIT, DEFAULT_PREFILL_BUDGET,
    DEFAULT_PREFILL_BUDGET_GPU, DEFAULT_PREFIX_CACHE_BYTES, DEFAULT_STATS_INTERVAL,
};
pub use cors::parse_list;
pub use error::ServerError;
pub use parsers::{ReasoningFormat, ToolFormat};
pub use server::{shutdown_signal, Server, ABORT_GRACE};
