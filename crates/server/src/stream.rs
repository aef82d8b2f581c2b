//! A streamed response, for any [`Endpoint`]: its opening chunks, one chunk per update, an
//! error event, the final usage chunk and `[DONE]`.

use std::sync::Arc;

use axum::body::Bytes;
use fp4forge_api::{StreamChunk, Usage};

use crate::endpoint::Endpoint;
use crate::generation::Generation;
use crate::http::{sse_done, sse_event, FrameSource};
use crate::state::AppState;

/// The event stream of one request to endpoint `E`.
pub(crate) struct ChunkStream<E: Endpoint> {
    endpoint: E,
    generation: Generation,
    state: Arc<AppState>,
    id: String,
    created: u64,
    include_usage: bool,
    started: bool,
    done: bool,
}

impl<E: Endpoint> ChunkStream<E> {
    /// The stream of `generation`, formatted by `endpoint`.
    pub fn new(
        endpoint: E,
        generation: Generation,
        state: Arc<AppState>,
        id: String,
        created: u64,
        include_usage: bool,
    ) -> Self {
        Self {
            endpoint,
            generation,
            state,
            id,
            created,
            include_usage,
            started: false,
            done: false,
        }
    }

    /// One SSE event holding a chunk with `choices` (and `usage` when given).
    fn chunk(&self, choices: Vec<E::Choice>, usage: Option<Usage>) -> Bytes {
        sse_event(&StreamChunk {
            id: self.id.clone(),
            object: E::CHUNK_OBJECT.to_string(),
            created: self.created,
            model: self.state.model_name.clone(),
            choices,
            usage,
        })
    }
}

impl<E: Endpoint> FrameSource for ChunkStream<E> {
    /// The next frames: the opening chunks first (if the endpoint has any), then one chunk per
    /// update, or at the end the usage chunk (if asked for) and `[DONE]`, or an error event and
    /// `[DONE]`; `None` after that.
    async fn next_frames(&mut self) -> Option<Bytes> {
        if self.done {
            return None;
        }
        if !self.started {
            self.started = true;
            let opening = self.endpoint.opening(self.generation.choice_count());
            if !opening.is_empty() {
                let mut out = Vec::new();
                for c in opening {
                    out.extend_from_slice(&self.chunk(vec![c], None));
                }
                return Some(Bytes::from(out));
            }
        }
        loop {
            match self.generation.next().await {
                Some(Ok(updates)) => {
                    let mut out = Vec::new();
                    for u in updates {
                        if let Some(c) = self.endpoint.chunk(&self.state, u) {
                            out.extend_from_slice(&self.chunk(vec![c], None));
                        }
                    }
                    if !out.is_empty() {
                        return Some(Bytes::from(out));
                    }
                }
                Some(Err(e)) => {
                    self.done = true;
                    let mut out = sse_event(&e.body()).to_vec();
                    out.extend_from_slice(&sse_done());
                    return Some(Bytes::from(out));
                }
                None => {
                    self.done = true;
                    let mut out = Vec::new();
                    if self.include_usage {
                        let usage = self.generation.usage().wire();
                        out.extend_from_slice(&self.chunk(Vec::new(), Some(usage)));
                    }
                    out.extend_from_slice(&sse_done());
                    return Some(Bytes::from(out));
                }
            }
        }
    }
}
