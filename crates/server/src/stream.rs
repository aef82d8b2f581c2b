//! What streamed chat and completion responses share: the chunk envelope, the loop over the
//! generation's updates, an error event, the final usage chunk and `[DONE]`.

use std::sync::Arc;

use axum::body::Bytes;
use serde_json::{json, Value};

use crate::generation::{Generation, Update};
use crate::http::{sse_done, sse_event};
use crate::state::AppState;

/// The endpoint-independent part of a streamed response; the endpoint turns each update into its
/// choice object.
pub(crate) struct ChunkStream {
    pub generation: Generation,
    pub state: Arc<AppState>,
    pub id: String,
    pub created: u64,
    /// The chunks' `object` (`chat.completion.chunk`, `text_completion`).
    pub object: &'static str,
    pub include_usage: bool,
    pub done: bool,
}

impl ChunkStream {
    /// One SSE event holding a chunk with `choices` (and `usage` when given).
    pub fn chunk(&self, choices: Vec<Value>, usage: Option<Value>) -> Bytes {
        let mut v = json!({
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.state.model_name,
            "choices": choices,
        });
        if let Some(u) = usage {
            v["usage"] = u;
        }
        sse_event(&v)
    }

    /// The next frames: one chunk per update (`choice` builds its choice object), or at the end
    /// the usage chunk (if asked for) and `[DONE]`, or an error event and `[DONE]`; `None` after
    /// that.
    pub async fn next_frames(
        &mut self,
        mut choice: impl FnMut(&AppState, Update) -> Value,
    ) -> Option<Bytes> {
        if self.done {
            return None;
        }
        loop {
            match self.generation.next().await {
                Some(Ok(updates)) => {
                    let mut out = Vec::new();
                    for u in updates {
                        let c = choice(&self.state, u);
                        out.extend_from_slice(&self.chunk(vec![c], None));
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
                        let usage = self.generation.usage().json();
                        out.extend_from_slice(&self.chunk(Vec::new(), Some(usage)));
                    }
                    out.extend_from_slice(&sse_done());
                    return Some(Bytes::from(out));
                }
            }
        }
    }
}
