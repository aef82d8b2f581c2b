//! Several sequences in one forward pass (continuous batching).
//!
//! The rows of every sequence are stacked into one activation matrix, so each linear layer, the
//! MLP or MoE and the lm_head stream their weights once for the whole batch (`T = Σ rows`).
//! Attention is the only per-sequence op: each sequence's rows are cut out, rotated at its own
//! positions and attend over its own KV cache; the outputs are stacked again for `o_proj`.
//! Every row is computed exactly as [`Decoder::forward`] computes it alone, up to the f32
//! summation order of the batched (GEMM) and single-row (GEMV) kernels.

use super::{Attention, Decoder, Wanted};
use crate::backend::Backend;
use crate::error::Result;

/// One sequence's part of a batched forward pass.
pub(crate) struct BatchSeq<'a, B: Backend> {
    /// The sequence's KV cache, one store per layer.
    pub kv: &'a mut [B::KvLayer],
    /// Its new tokens (at least one).
    pub ids: &'a [u32],
    /// Positions already in its cache.
    pub pos0: usize,
    /// The logits it wants.
    pub wanted: Wanted,
}

impl<B: Backend> Decoder<B> {
    /// Runs every sequence of `seqs` through the network in one pass, appending to each one's
    /// cache. Returns, per sequence, the logits it wanted (`[rows, vocab]`, `[1, vocab]` or
    /// none).
    pub fn forward_batch(
        &self,
        b: &B,
        seqs: &mut [BatchSeq<'_, B>],
    ) -> Result<Vec<Option<B::Tensor>>> {
        if let [s] = seqs {
            return Ok(vec![self.forward(b, s.kv, s.ids, s.pos0, s.wanted)?]);
        }
        let ids: Vec<u32> = seqs.iter().flat_map(|s| s.ids.iter().copied()).collect();
        let mut x = b.embed(&self.embed, &ids)?;
        for (li, layer) in self.layers.iter().enumerate() {
            self.residual_block(b, layer, &mut x, |a| {
                layer.attn.forward_batch(b, a, seqs, li, self)
            })?;
        }

        // The rows whose logits are wanted, in sequence order: (start in x, rows) per sequence.
        let mut spans = Vec::with_capacity(seqs.len());
        let mut off = 0;
        for s in seqs.iter() {
            let n = s.ids.len();
            spans.push(match s.wanted {
                Wanted::None => None,
                Wanted::Last => Some((off + n - 1, 1)),
                Wanted::All => Some((off, n)),
            });
            off += n;
        }
        let picked: usize = spans.iter().flatten().map(|(_, n)| n).sum();
        if picked == 0 {
            return Ok(seqs.iter().map(|_| None).collect());
        }
        let y = if picked == ids.len() {
            x
        } else {
            let parts = spans
                .iter()
                .flatten()
                .map(|&(start, n)| b.rows(&x, start, n))
                .collect::<Result<Vec<_>>>()?;
            b.concat_rows(&parts.iter().collect::<Vec<_>>())?
        };
        let y = b.rms_norm(&y, &self.norm, self.eps, self.hidden)?;
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        let logits = b.linear(&y, head, None)?;
        let mut out = Vec::with_capacity(seqs.len());
        let mut row = 0;
        for span in spans {
            out.push(match span {
                None => None,
                Some((_, n)) => {
                    let t = b.rows(&logits, row, n)?;
                    row += n;
                    Some(t)
                }
            });
        }
        Ok(out)
    }
}

impl<B: Backend> Attention<B> {
    /// [`Attention::forward`] of layer `layer` for stacked sequences: projections on all rows,
    /// rotation and attention per sequence.
    fn forward_batch(
        &self,
        b: &B,
        a: &B::Tensor,
        seqs: &mut [BatchSeq<'_, B>],
        layer: usize,
        dec: &Decoder<B>,
    ) -> Result<B::Tensor> {
        let d = self.params.head_dim;
        let (q, k, v) = self.qkv(b, a, dec)?;
        let rope = &dec.ropes[self.rope];
        let mut outs = Vec::with_capacity(seqs.len());
        let mut off = 0;
        for s in seqs.iter_mut() {
            let n = s.ids.len();
            let mut qs = b.rows(&q, off, n)?;
            let mut ks = b.rows(&k, off, n)?;
            let vs = b.rows(&v, off, n)?;
            b.rope(&mut qs, rope, d, s.pos0)?;
            b.rope(&mut ks, rope, d, s.pos0)?;
            outs.push(b.attention(&qs, &ks, &vs, &mut s.kv[layer], &self.params)?);
            off += n;
        }
        let mut o = b.concat_rows(&outs.iter().collect::<Vec<_>>())?;
        if let Some(g) = &self.gate {
            let gate = b.linear(a, g, None)?;
            b.softplus_gate(&mut o, &gate)?;
        }
        b.linear(&o, &self.o, self.o_bias.as_ref())
    }
}
