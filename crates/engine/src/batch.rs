//! Batched forward passes over several sessions of one model: what a continuous-batching
//! scheduler calls once per engine step.
//!
//! Each session contributes its own new tokens (one for a decode step, a prompt chunk while
//! prefilling); all of them go through the network together, so the weights are read once per
//! step however many sequences are running. Attention stays per session, against its own KV
//! cache. The logits are those of running each session alone, up to f32 summation order.

use crate::backend::Backend;
use crate::error::{EngineError, Result};
use crate::model::Model;
use crate::models::decoder::{BatchSeq, Wanted};
use crate::session::{Logits, Session};

/// Which logits a session wants back from [`Model::forward_batch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WantLogits {
    /// None (a prefill chunk that is not the prompt's last).
    None,
    /// Its last new token's (decode, or a prompt's last chunk).
    Last,
    /// Every new token's (prompt scoring).
    All,
}

impl<B: Backend> Model<B> {
    /// Runs one pass over several sessions of this model: session `i` appends `tokens[i]` (its
    /// next token(s), at least one; the caller bounds a prompt chunk's length) and gets back the
    /// logits `wanted[i]` asks for (`None` for [`WantLogits::None`]). Errors: lengths that
    /// differ, a session of another model or one that failed earlier, no tokens, a token outside
    /// the vocabulary, a sequence past the context. A failure inside the pass leaves every
    /// session of the batch broken (reset them).
    pub fn forward_batch(
        &self,
        sessions: &mut [&mut Session<'_, B>],
        tokens: &[&[u32]],
        wanted: &[WantLogits],
    ) -> Result<Vec<Option<Logits>>> {
        if sessions.len() != tokens.len() || sessions.len() != wanted.len() {
            return Err(EngineError::InvalidInput(format!(
                "forward_batch: {} sessions, {} token lists, {} logit requests",
                sessions.len(),
                tokens.len(),
                wanted.len()
            )));
        }
        if sessions.is_empty() {
            return Ok(Vec::new());
        }
        let info = self.info();
        for (s, ids) in sessions.iter().zip(tokens) {
            if !std::ptr::eq(s.model, self) {
                return Err(EngineError::InvalidInput(
                    "forward_batch: a session of another model".into(),
                ));
            }
            if s.broken {
                return Err(EngineError::InvalidInput(
                    "the session failed earlier and its cache is inconsistent; reset it".into(),
                ));
            }
            if ids.is_empty() {
                return Err(EngineError::InvalidInput("no tokens given".into()));
            }
            if let Some(&t) = ids.iter().find(|&&t| t as usize >= info.vocab_size) {
                return Err(EngineError::TokenOutOfRange {
                    token: t,
                    vocab_size: info.vocab_size,
                });
            }
            if s.position + ids.len() > info.max_context {
                return Err(EngineError::ContextOverflow {
                    position: s.position,
                    adding: ids.len(),
                    max_context: info.max_context,
                });
            }
        }
        let b = self.backend();
        let decoder = self.decoder();
        let mut seqs: Vec<BatchSeq<'_, B>> = sessions
            .iter_mut()
            .zip(tokens)
            .zip(wanted)
            .map(|((s, ids), w)| BatchSeq {
                pos0: s.position,
                kv: s.cache.layers_mut(),
                ids,
                wanted: match w {
                    WantLogits::None => Wanted::None,
                    WantLogits::Last => Wanted::Last,
                    WantLogits::All => Wanted::All,
                },
            })
            .collect();
        let result = b.execute(|| decoder.forward_batch(b, &mut seqs));
        drop(seqs);
        let tensors = match result {
            Ok(t) => t,
            Err(e) => {
                for s in sessions.iter_mut() {
                    s.broken = true;
                }
                return Err(e);
            }
        };
        for (s, ids) in sessions.iter_mut().zip(tokens) {
            s.position += ids.len();
        }
        let vocab = info.vocab_size;
        tensors
            .into_iter()
            .map(|t| {
                t.map(|t| {
                    let data = b.download(&t)?;
                    Ok(Logits {
                        rows: data.len() / vocab.max(1),
                        vocab,
                        data,
                    })
                })
                .transpose()
            })
            .collect()
    }

    /// One decode step for several sessions in one pass: session `i` appends `tokens[i]`;
    /// returns each one's logits (`vocab` values), as [`Session::step`] would.
    pub fn step_batch(
        &self,
        sessions: &mut [&mut Session<'_, B>],
        tokens: &[u32],
    ) -> Result<Vec<Vec<f32>>> {
        let lists: Vec<&[u32]> = tokens.iter().map(std::slice::from_ref).collect();
        let wanted = vec![WantLogits::Last; tokens.len()];
        Ok(self
            .forward_batch(sessions, &lists, &wanted)?
            .into_iter()
            .map(|l| l.map(|l| l.data).unwrap_or_default())
            .collect())
    }
}
