//! Passes over sessions of one model: the one place that checks what may be appended, runs
//! [`forward`] and keeps each session's position and health.
//!
//! A continuous-batching scheduler calls [`Model::forward_batch`] once per engine step: each
//! session contributes its own new tokens (one for a decode step, a prompt chunk while
//! prefilling); all of them go through the network together, so the weights are read once per
//! step however many sequences are running. A [`Session`]'s own prefill and steps are the same
//! pass with a batch of one.

use crate::backend::{Backend, SampleRequest};
use crate::error::{EngineError, Result};
use crate::forward::forward;
use crate::ir::{SeqChunk, Want};
use crate::model::Model;
use crate::sampling::Sampler;
use crate::session::{Logits, Output, Session};

impl<B: Backend> Model<B> {
    /// Errors unless `ids` can be appended to `session`: a session of this model that has not
    /// failed, at least one token, every id in the vocabulary, room in the context.
    pub(crate) fn check_append(&self, session: &Session<'_, B>, ids: &[u32]) -> Result<()> {
        if !std::ptr::eq(session.model, self) {
            return Err(EngineError::InvalidInput(
                "a session of another model".into(),
            ));
        }
        if session.broken {
            return Err(EngineError::InvalidInput(
                "the session failed earlier and its cache is inconsistent; reset it".into(),
            ));
        }
        if ids.is_empty() {
            return Err(EngineError::InvalidInput("no tokens given".into()));
        }
        let info = self.info();
        if let Some(&t) = ids.iter().find(|&&t| t as usize >= info.vocab_size) {
            return Err(EngineError::TokenOutOfRange {
                token: t,
                vocab_size: info.vocab_size,
            });
        }
        if session.position + ids.len() > info.max_context {
            return Err(EngineError::ContextOverflow {
                position: session.position,
                adding: ids.len(),
                max_context: info.max_context,
            });
        }
        Ok(())
    }

    /// One pass: session `i` appends `tokens[i]` and gets the logits `wants[i]` asks for, left
    /// on the backend. Checks everything first ([`Self::check_append`]); a failure inside the
    /// pass marks every session of it broken (their caches may hold part of it).
    pub(crate) fn pass(
        &self,
        sessions: &mut [&mut Session<'_, B>],
        tokens: &[&[u32]],
        wants: &[Want],
    ) -> Result<Vec<Option<B::Tensor>>> {
        if sessions.len() != tokens.len() || sessions.len() != wants.len() {
            return Err(EngineError::InvalidInput(format!(
                "a pass of {} sessions, {} token lists, {} logit requests",
                sessions.len(),
                tokens.len(),
                wants.len()
            )));
        }
        if sessions.is_empty() {
            return Ok(Vec::new());
        }
        for (s, ids) in sessions.iter().zip(tokens) {
            self.check_append(s, ids)?;
        }
        let b = self.backend();
        let net = self.decoder();
        let mut chunks: Vec<SeqChunk<'_, B>> = sessions
            .iter_mut()
            .zip(tokens)
            .zip(wants)
            .map(|((s, ids), &want)| SeqChunk {
                pos0: s.position,
                kv: s.cache.layers_mut(),
                ids,
                want,
            })
            .collect();
        let result = b.execute(|| forward(b, net, &mut chunks));
        drop(chunks);
        match result {
            Ok(out) => {
                for (s, ids) in sessions.iter_mut().zip(tokens) {
                    s.position += ids.len();
                }
                Ok(out)
            }
            Err(e) => {
                for s in sessions.iter_mut() {
                    s.broken = true;
                }
                Err(e)
            }
        }
    }

    /// Runs one pass over several sessions of this model: session `i` appends `tokens[i]` (its
    /// next token(s), at least one; the caller bounds a prompt chunk's length) and gets back the
    /// logits `wants[i]` asks for (`None` for [`Want::None`]). Errors: lengths that differ, a
    /// session of another model or one that failed earlier, no tokens, a token outside the
    /// vocabulary, a sequence past the context. A failure inside the pass leaves every session
    /// of the batch broken (reset them).
    pub fn forward_batch(
        &self,
        sessions: &mut [&mut Session<'_, B>],
        tokens: &[&[u32]],
        wants: &[Want],
    ) -> Result<Vec<Option<Logits>>> {
        let mut samplers: Vec<Option<&mut Sampler>> = wants.iter().map(|_| None).collect();
        Ok(self
            .forward_batch_sampled(sessions, tokens, wants, &mut samplers)?
            .into_iter()
            .map(|o| match o {
                Output::Logits(l) => Some(l),
                Output::None | Output::Token(_) => None,
            })
            .collect())
    }

    /// [`Self::forward_batch`] where a session may have its next token picked instead of
    /// getting its logits: one with `samplers[i]` set (it must want [`Want::Last`]) gets
    /// [`Output::Token`], picked by the backend where it samples those parameters itself (only
    /// the token id leaves the device), else on the host from the downloaded logits, with the
    /// same draw either way (a seed gives the same tokens). The others get
    /// [`Output::Logits`], or [`Output::None`] for [`Want::None`].
    pub fn forward_batch_sampled(
        &self,
        sessions: &mut [&mut Session<'_, B>],
        tokens: &[&[u32]],
        wants: &[Want],
        samplers: &mut [Option<&mut Sampler>],
    ) -> Result<Vec<Output>> {
        if samplers.len() != wants.len() {
            return Err(EngineError::InvalidInput(format!(
                "a pass of {} logit requests and {} samplers",
                wants.len(),
                samplers.len()
            )));
        }
        if let Some(i) = (0..wants.len()).find(|&i| samplers[i].is_some() && wants[i] != Want::Last)
        {
            return Err(EngineError::InvalidInput(format!(
                "session {i} of the pass has a sampler but wants {:?} logits (a sampler picks \
                 from the last token's)",
                wants[i]
            )));
        }
        let b = self.backend();
        let vocab = self.info().vocab_size;
        let tensors = self.pass(sessions, tokens, wants)?;
        // every sampled session's draw, in session order, then all of them picked at once
        let draws: Vec<Option<f64>> = samplers
            .iter_mut()
            .zip(&tensors)
            .map(|(s, t)| s.as_mut().filter(|_| t.is_some()).and_then(|s| s.draw()))
            .collect();
        let requests: Vec<SampleRequest<'_, B::Tensor>> = tensors
            .iter()
            .zip(samplers.iter())
            .zip(&draws)
            .filter_map(|((t, s), &u)| {
                Some(SampleRequest {
                    logits: t.as_ref()?,
                    params: s.as_ref()?.params(),
                    u,
                })
            })
            .collect();
        let mut picked = b.sample(&requests)?.into_iter();
        drop(requests);
        tensors
            .into_iter()
            .zip(samplers.iter_mut())
            .zip(draws)
            .map(|((t, sampler), u)| {
                let Some(t) = t else { return Ok(Output::None) };
                if let Some(sampler) = sampler {
                    return Ok(Output::Token(match picked.next().flatten() {
                        Some(next) => next,
                        None => sampler.pick(&b.download(&t)?, u),
                    }));
                }
                let data = b.download(&t)?;
                Ok(Output::Logits(Logits {
                    rows: data.len() / vocab.max(1),
                    vocab,
                    data,
                }))
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
        let wants = vec![Want::Last; tokens.len()];
        Ok(self
            .forward_batch(sessions, &lists, &wants)?
            .into_iter()
            .map(|l| l.map(|l| l.data).unwrap_or_default())
            .collect())
    }
}
