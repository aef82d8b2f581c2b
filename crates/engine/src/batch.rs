//! Passes over sessions of one model: the one place that checks what may be appended, runs
//! [`forward`] and keeps each session's position and health.
//!
//! A continuous-batching scheduler calls [`Model::forward_batch`] once per engine step: each
//! session contributes its own new tokens (one for a decode step, a prompt chunk while
//! prefilling); all of them go through the network together, so the weights are read once per
//! step however many sequences are running. A [`Session`]'s own prefill and steps are the same
//! pass with a batch of one.

use crate::backend::{Backend, LogprobRequest, SampleRequest};
use crate::error::{EngineError, Result};
use crate::forward::forward;
use crate::ir::{SeqChunk, Want};
use crate::logprobs::{token_logprob, LogprobSpec, TokenLogprob};
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
                Output::None | Output::Token(_) | Output::Scored { .. } => None,
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
        let none = vec![None; wants.len()];
        self.forward_batch_scored(sessions, tokens, wants, samplers, &none)
    }

    /// [`Self::forward_batch_sampled`] where a session may also want log-probabilities
    /// (`logprobs[i]`): it gets [`Output::Scored`], the scores computed by the backend where it
    /// scores them itself (all sessions' in one call: only the scores leave the device, never a
    /// scored row's logits), else on the host from the downloaded logits. With a sampler the
    /// picked token is scored; without, row `r` scores `targets[r]` and the rows past the
    /// targets come back as logits (a prompt's last row, whose next token is not known yet).
    pub fn forward_batch_scored(
        &self,
        sessions: &mut [&mut Session<'_, B>],
        tokens: &[&[u32]],
        wants: &[Want],
        samplers: &mut [Option<&mut Sampler>],
        logprobs: &[Option<LogprobSpec<'_>>],
    ) -> Result<Vec<Output>> {
        if samplers.len() != wants.len() || logprobs.len() != wants.len() {
            return Err(EngineError::InvalidInput(format!(
                "a pass of {} logit requests, {} samplers and {} logprob requests",
                wants.len(),
                samplers.len(),
                logprobs.len()
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
        let n = tensors.len();
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
        // the picks the backend left to the host, from downloaded logits (kept for their scores)
        let mut host: Vec<Option<Vec<f32>>> = vec![None; n];
        let mut chosen: Vec<Option<u32>> = vec![None; n];
        for (i, ((t, sampler), &u)) in tensors
            .iter()
            .zip(samplers.iter_mut())
            .zip(&draws)
            .enumerate()
        {
            let (Some(t), Some(sampler)) = (t, sampler) else {
                continue;
            };
            chosen[i] = Some(match picked.next().flatten() {
                Some(next) => next,
                None => {
                    let data = b.download(t)?;
                    let next = sampler.pick(&data, u);
                    host[i] = Some(data);
                    next
                }
            });
        }
        // the scored rows' targets: a sampled session's pick, else its spec's targets
        let picks: Vec<[u32; 1]> = chosen.iter().map(|c| [c.unwrap_or(0)]).collect();
        let targets: Vec<&[u32]> = (0..n)
            .map(|i| match (&tensors[i], logprobs[i]) {
                (Some(_), Some(_)) if chosen[i].is_some() => &picks[i][..],
                (Some(t), Some(spec)) => &spec.targets[..spec.targets.len().min(b.dims(t).0)],
                _ => &[][..],
            })
            .collect();
        let mut scores: Vec<Option<Vec<TokenLogprob>>> = vec![None; n];
        {
            let (mut asks, mut of) = (Vec::new(), Vec::new());
            for i in 0..n {
                if let (Some(t), Some(spec)) = (&tensors[i], logprobs[i]) {
                    if host[i].is_none() && !targets[i].is_empty() {
                        asks.push(LogprobRequest {
                            logits: t,
                            targets: targets[i],
                            top: spec.top,
                        });
                        of.push(i);
                    }
                }
            }
            if !asks.is_empty() {
                for (i, s) in of.into_iter().zip(b.logprobs(&asks)?) {
                    scores[i] = s;
                }
            }
        }
        let mut out = Vec::with_capacity(n);
        for (i, t) in tensors.into_iter().enumerate() {
            let Some(t) = t else {
                out.push(Output::None);
                continue;
            };
            let rows = b.dims(&t).0;
            let Some(spec) = logprobs[i] else {
                out.push(match chosen[i] {
                    Some(next) => Output::Token(next),
                    None => {
                        let data = b.download(&t)?;
                        Output::Logits(Logits {
                            rows: data.len() / vocab.max(1),
                            vocab,
                            data,
                        })
                    }
                });
                continue;
            };
            let scored = targets[i].len();
            let (lps, mut kept) = match scores[i].take() {
                Some(lps) => (lps, None),
                None => {
                    // (downloaded already where the host picked the token)
                    let d = match host[i].take() {
                        Some(d) => d,
                        None => b.download(&t)?,
                    };
                    let lps = (0..scored)
                        .map(|r| {
                            let row = &d[r * vocab..(r + 1) * vocab];
                            token_logprob(row, targets[i][r], spec.top)
                        })
                        .collect();
                    (lps, Some(d))
                }
            };
            let logits = if chosen[i].is_none() && scored < rows {
                let d = match kept.take() {
                    Some(d) => d[scored * vocab..].to_vec(),
                    None => b.download(&b.rows(&t, scored, rows - scored)?)?,
                };
                Some(Logits {
                    rows: rows - scored,
                    vocab,
                    data: d,
                })
            } else {
                None
            };
            out.push(Output::Scored {
                token: chosen[i],
                logprobs: lps,
                logits,
            });
        }
        Ok(out)
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
