//! A session: one sequence's KV cache and position, against a borrowed model.

use crate::backend::{Backend, CpuBackend};
use crate::error::{EngineError, Result};
use crate::ir::Want;
use crate::kv_cache::KvCache;
use crate::logprobs::TokenLogprob;
use crate::model::Model;
use crate::sampling::Sampler;

/// Logits of several positions, row-major `[rows, vocab]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Logits {
    /// Positions.
    pub rows: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// `rows * vocab` values.
    pub data: Vec<f32>,
}

/// What one session gets back from [`Model::forward_batch_sampled`].
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// Nothing ([`Want::None`]).
    None,
    /// The logits it wanted.
    Logits(Logits),
    /// Its next token, picked by its sampler.
    Token(u32),
    /// The log-probabilities it wanted ([`LogprobSpec`](crate::LogprobSpec)), computed where
    /// the logits are: with a sampler, the picked `token` and its one score; without, one score
    /// per target and the `logits` of the rows past the targets (`None`: no such rows).
    Scored {
        /// The picked token (with a sampler).
        token: Option<u32>,
        /// One per scored row, in row order.
        logprobs: Vec<TokenLogprob>,
        /// The rows that were not scored.
        logits: Option<Logits>,
    },
}

impl Logits {
    /// The logits of row `i`.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.vocab..(i + 1) * self.vocab]
    }
}

/// One sequence being processed: feed it a prompt ([`prefill`](Self::prefill)), then one token
/// at a time ([`step`](Self::step)).
pub struct Session<'m, B: Backend = CpuBackend> {
    pub(crate) model: &'m Model<B>,
    pub(crate) cache: KvCache<B>,
    pub(crate) position: usize,
    pub(crate) broken: bool,
}

impl<'m, B: Backend> Session<'m, B> {
    pub(crate) fn new(model: &'m Model<B>) -> Result<Self> {
        Ok(Self {
            model,
            cache: KvCache::new(model.backend(), model.kv_specs())?,
            position: 0,
            broken: false,
        })
    }

    /// The model.
    pub fn model(&self) -> &'m Model<B> {
        self.model
    }

    /// Tokens in the sequence so far.
    pub fn position(&self) -> usize {
        self.position
    }

    /// Bytes held by the KV cache.
    pub fn kv_bytes(&self) -> usize {
        self.cache.bytes(self.model.backend())
    }

    /// Bytes the KV cache takes on top of what it holds to hold `extra` more tokens (what the
    /// next pass of that many tokens allocates; 0 where it has room).
    pub fn kv_growth_bytes(&self, extra: usize) -> usize {
        self.cache
            .growth_bytes(self.model.backend(), self.position + extra)
    }

    /// Bytes held by layer `layer`'s KV cache.
    pub fn layer_kv_bytes(&self, layer: usize) -> usize {
        self.cache.layer_bytes(self.model.backend(), layer)
    }

    /// Empties the sequence (a fresh cache).
    pub fn reset(&mut self) -> Result<()> {
        self.cache = KvCache::new(self.model.backend(), self.model.kv_specs())?;
        self.position = 0;
        self.broken = false;
        Ok(())
    }

    /// Whether [`fork`](Self::fork) can copy the first `len` tokens: a sound session, `len` at
    /// most the position, and no sliding-window ring wrapped unless `len` is the whole sequence.
    pub fn can_fork(&self, len: usize) -> bool {
        let wrapped = |w: Option<usize>| w.is_some_and(|w| self.position > w);
        !self.broken
            && len <= self.position
            && (len == self.position || !self.model.kv_specs().iter().any(|s| wrapped(s.window)))
    }

    /// A new session holding a copy of the first `len` tokens of this one (their keys and
    /// values), so a request that shares them continues from there without recomputing them;
    /// this session is unchanged. `None` when that is impossible: `len` past the position, a
    /// failed session, or a sliding-window layer whose ring has wrapped (it no longer holds the
    /// keys before the window) unless `len` is the whole sequence.
    pub fn fork(&self, len: usize) -> Result<Option<Self>> {
        if !self.can_fork(len) {
            return Ok(None);
        }
        Ok(Some(Self {
            model: self.model,
            cache: self.cache.fork(self.model.backend(), len)?,
            position: len,
            broken: false,
        }))
    }

    /// Appends `tokens` and returns the logits of the last one (`vocab` values).
    pub fn prefill(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let out = self.run(tokens, false)?;
        Ok(out.data)
    }

    /// Appends `tokens` and returns the logits of every one of them (for tests and evaluation).
    pub fn prefill_all(&mut self, tokens: &[u32]) -> Result<Logits> {
        self.run(tokens, true)
    }

    /// Appends one token and returns its logits.
    pub fn step(&mut self, token: u32) -> Result<Vec<f32>> {
        self.prefill(&[token])
    }

    /// Appends one token and picks the next one with `sampler`: on the backend where it
    /// samples these parameters itself (only the token id leaves the device), else on the host
    /// from the downloaded logits. The same draw either way, so a seed gives the same tokens.
    pub fn step_sampled(&mut self, token: u32, sampler: &mut Sampler) -> Result<u32> {
        let model = self.model;
        let out = model.forward_batch_sampled(
            &mut [self],
            &[&[token]],
            &[Want::Last],
            &mut [Some(sampler)],
        )?;
        match out.as_slice() {
            [Output::Token(next)] => Ok(*next),
            _ => Err(EngineError::InvalidInput(
                "the step returned no token".into(),
            )),
        }
    }

    /// This session as a batch of one: appends `tokens`, returns the logits `want`ed.
    fn pass(&mut self, tokens: &[u32], want: Want) -> Result<Option<B::Tensor>> {
        let model = self.model;
        let mut out = model.pass(&mut [self], &[tokens], &[want])?;
        Ok(out.pop().flatten())
    }

    fn run(&mut self, tokens: &[u32], all: bool) -> Result<Logits> {
        // The whole prompt is checked before its first chunk runs.
        self.model.check_append(self, tokens)?;
        let vocab = self.model.info().vocab_size;
        let b = self.model.backend();
        let chunk = self.model.options().prefill_chunk;
        let mut data = Vec::with_capacity(if all { tokens.len() * vocab } else { vocab });
        let mut last = Vec::new();
        for (i, piece) in tokens.chunks(chunk).enumerate() {
            let is_last = (i + 1) * chunk >= tokens.len();
            let want = match (all, is_last) {
                (true, _) => Want::All,
                (false, true) => Want::Last,
                (false, false) => Want::None,
            };
            if let Some(logits) = self.pass(piece, want)? {
                let host = b.download(&logits)?;
                if all {
                    data.extend_from_slice(&host);
                } else {
                    last = host;
                }
            }
        }
        if !all {
            data = last;
        }
        let rows = data.len() / vocab.max(1);
        Ok(Logits { rows, vocab, data })
    }
}
