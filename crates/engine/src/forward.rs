//! The one forward pass: many sequences' chunks through a [`Decoder`] at once.
//!
//! Every caller goes through [`forward`]: a session's prompt chunk or decode step is a batch of
//! one, a continuous-batching step stacks every running sequence's new tokens, and a
//! speculative verification is a chunk of draft tokens. The rows of all chunks form one
//! activation matrix, so each linear layer, the MLP or MoE and the lm_head stream their weights
//! once per pass (`T = Σ rows`). Attention is the only per-sequence op: each chunk's rows are
//! rotated at its own positions and attend over its own KV cache; the outputs are stacked again
//! for `o_proj`. Every row is computed as it would be alone, up to the f32 summation order of
//! the batched (GEMM) and single-row (GEMV) kernels.
//!
//! A backend may recognise a whole pass it runs its own way (fused launches on fixed buffers):
//! [`Backend::fused_pass`] is asked first and the generic ops below run only where it declines.

use crate::backend::Backend;
use crate::error::{EngineError, Result};
use crate::ir::{
    Attention, AttentionParams, AttnChunk, Decoder, HeadNorms, Layer, Mlp, Moe, SeqChunk, SwiGlu,
    Want,
};

/// Runs every chunk of `seqs` through `net` in one pass, appending to each one's cache. Returns,
/// per chunk, the logits it wanted: `[rows, vocab]` for [`Want::All`], `[1, vocab]` for
/// [`Want::Last`], `None` for [`Want::None`]. A failure can leave the caches holding part of the
/// pass.
pub fn forward<B: Backend>(
    b: &B,
    net: &Decoder<B>,
    seqs: &mut [SeqChunk<'_, B>],
) -> Result<Vec<Option<B::Tensor>>> {
    if let Some(out) = b.fused_pass(net, seqs)? {
        return Ok(out);
    }
    let stacked: Vec<u32>;
    let ids = match seqs {
        [s] => s.ids,
        _ => {
            stacked = seqs.iter().flat_map(|s| s.ids.iter().copied()).collect();
            &stacked
        }
    };
    let mut x = b.embed(&net.embed, ids)?;
    for (li, layer) in net.layers.iter().enumerate() {
        residual_block(b, net, layer, &mut x, |a, x| {
            attention(b, net, &layer.attn, (a, x), seqs, li)
        })?;
    }
    logits(b, net, x, seqs)
}

/// One layer on the residual stream `x`: `x += attention(norm(x))`, then
/// `x += mlp(post_norm(x))`; `attention` adds its output for the normed rows (its first
/// argument) to the stream (its second).
fn residual_block<B: Backend>(
    b: &B,
    net: &Decoder<B>,
    layer: &Layer<B>,
    x: &mut B::Tensor,
    attention: impl FnOnce(&B::Tensor, &mut B::Tensor) -> Result<()>,
) -> Result<()> {
    let a = b.rms_norm(x, &layer.input_norm, net.eps, net.hidden)?;
    attention(&a, x)?;
    let m = b.rms_norm(x, &layer.post_norm, net.eps, net.hidden)?;
    match &layer.mlp {
        Mlp::Dense(mlp) => swiglu_add(b, mlp, &m, x),
        Mlp::Moe(moe) => {
            let h = mixture(b, moe, &m)?;
            b.add_scaled(x, 1.0, &h)
        }
    }
}

/// Layer `layer`'s attention over the stacked rows `a`, added to the residual stream `x`:
/// projections (and q/k norms) on all rows, rotation and attention per chunk, gate and `o_proj`
/// on all rows.
fn attention<B: Backend>(
    b: &B,
    net: &Decoder<B>,
    attn: &Attention<B>,
    (a, x): (&B::Tensor, &mut B::Tensor),
    seqs: &mut [SeqChunk<'_, B>],
    layer: usize,
) -> Result<()> {
    // q, k, v (and the output gate) read the same rows: one call.
    let mut ws = vec![
        (&attn.q, attn.q_bias.as_ref()),
        (&attn.k, attn.k_bias.as_ref()),
        (&attn.v, attn.v_bias.as_ref()),
    ];
    if let Some(g) = &attn.gate {
        ws.push((g, None));
    }
    let mut outs = linears(b, a, &ws)?;
    let gate = if attn.gate.is_some() {
        outs.pop()
    } else {
        None
    };
    let [q, k, v] = exactly(b, outs)?;
    let norms = HeadNorms {
        q: attn.q_norm.as_ref(),
        k: attn.k_norm.as_ref(),
        eps: net.eps,
    };
    let rope = &net.ropes[attn.rope];
    let mut chunks: Vec<AttnChunk<'_, B>> = seqs
        .iter_mut()
        .map(|s| AttnChunk {
            pos0: s.pos0,
            rows: s.ids.len(),
            kv: &mut s.kv[layer],
        })
        .collect();
    let o = b.attention_chunks((q, k, &v), norms, rope, &mut chunks, &attn.params)?;
    match &gate {
        Some(gate) => b.gated_linear_add(x, o, gate, &attn.o, attn.o_bias.as_ref()),
        None => b.linear_add(x, &o, &attn.o, attn.o_bias.as_ref()),
    }
}

/// [`Backend::attention_chunks`] chunk by chunk (its default): q and k normed per head, each
/// chunk's rows rotated at its own positions and attending over its own cache, the outputs
/// stacked again. One chunk's rows are the whole matrix (no copies; norm and rope in one
/// [`Backend::norm_rope`]); several are normed together, then copied out and joined.
pub fn attention_each<B: Backend>(
    b: &B,
    (mut q, mut k, v): (B::Tensor, B::Tensor, &B::Tensor),
    norms: HeadNorms<'_, B>,
    rope: &B::Rope,
    chunks: &mut [AttnChunk<'_, B>],
    params: &AttentionParams,
) -> Result<B::Tensor> {
    let d = params.head_dim;
    if let [c] = chunks {
        b.norm_rope(&mut q, norms.q, norms.eps, rope, (d, c.pos0))?;
        b.norm_rope(&mut k, norms.k, norms.eps, rope, (d, c.pos0))?;
        return b.attention(&q, &k, v, c.kv, params);
    }
    let (q, k) = head_normed(b, q, k, norms, d)?;
    let mut outs = Vec::with_capacity(chunks.len());
    let mut off = 0;
    for c in chunks.iter_mut() {
        outs.push(attend_rows(b, (&q, &k, v), off, rope, c, params)?);
        off += c.rows;
    }
    b.concat_rows(&outs.iter().collect::<Vec<_>>())
}

/// `q` and `k` with their per-head norms applied (each side that has one).
pub fn head_normed<B: Backend>(
    b: &B,
    q: B::Tensor,
    k: B::Tensor,
    norms: HeadNorms<'_, B>,
    head_dim: usize,
) -> Result<(B::Tensor, B::Tensor)> {
    let norm = |x: B::Tensor, w: Option<&B::Tensor>| match w {
        Some(w) => b.rms_norm(&x, w, norms.eps, head_dim),
        None => Ok(x),
    };
    Ok((norm(q, norms.q)?, norm(k, norms.k)?))
}

/// One chunk of [`attention_each`]: its rows `row..row + c.rows` of the stacked `q`, `k`, `v`
/// copied out, rotated at its positions, attending over (and appended to) its cache.
pub fn attend_rows<B: Backend>(
    b: &B,
    (q, k, v): (&B::Tensor, &B::Tensor, &B::Tensor),
    row: usize,
    rope: &B::Rope,
    c: &mut AttnChunk<'_, B>,
    params: &AttentionParams,
) -> Result<B::Tensor> {
    let d = params.head_dim;
    let mut qs = b.rows(q, row, c.rows)?;
    let mut ks = b.rows(k, row, c.rows)?;
    let vs = b.rows(v, row, c.rows)?;
    b.rope(&mut qs, rope, d, c.pos0)?;
    b.rope(&mut ks, rope, d, c.pos0)?;
    b.attention(&qs, &ks, &vs, c.kv, params)
}

/// `y += down(silu(gate x) ⊙ up x)`.
fn swiglu_add<B: Backend>(b: &B, mlp: &SwiGlu<B>, x: &B::Tensor, y: &mut B::Tensor) -> Result<()> {
    let [g, u] = exactly(b, linears(b, x, &[(&mlp.gate, None), (&mlp.up, None)])?)?;
    swiglu_down_add(b, mlp, (&g, &u), y)
}

/// `y += down(silu(g) ⊙ u)`: [`swiglu_add`] after its gate and up projections `g`, `u`.
fn swiglu_down_add<B: Backend>(
    b: &B,
    mlp: &SwiGlu<B>,
    (g, u): (&B::Tensor, &B::Tensor),
    y: &mut B::Tensor,
) -> Result<()> {
    let a = b.silu_mul(g, u)?;
    b.linear_add(y, &a, &mlp.down, None)
}

/// [`Backend::linears`], checked to give one output per weight.
fn linears<B: Backend>(
    b: &B,
    x: &B::Tensor,
    ws: &[(&B::Linear, Option<&B::Tensor>)],
) -> Result<Vec<B::Tensor>> {
    let out = b.linears(x, ws)?;
    if out.len() != ws.len() {
        return Err(mismatch(b, out.len(), ws.len()));
    }
    Ok(out)
}

/// `outs` as an array of `N`.
fn exactly<B: Backend, const N: usize>(b: &B, outs: Vec<B::Tensor>) -> Result<[B::Tensor; N]> {
    let n = outs.len();
    outs.try_into().map_err(|_| mismatch(b, n, N))
}

fn mismatch<B: Backend>(b: &B, got: usize, want: usize) -> EngineError {
    EngineError::Backend {
        backend: b.name(),
        reason: format!("linears gave {got} outputs for {want} weights"),
    }
}

/// The routed experts' weighted sum (plus the shared expert) of each row.
fn mixture<B: Backend>(b: &B, moe: &Moe<B>, x: &B::Tensor) -> Result<B::Tensor> {
    // the router and the shared expert's gate and up read the same rows: one call
    let mut ws = vec![(&moe.router, None)];
    if let Some(shared) = &moe.shared {
        ws.extend([(&shared.gate, None), (&shared.up, None)]);
    }
    let mut outs = linears(b, x, &ws)?.into_iter();
    let logits = outs.next().ok_or_else(|| mismatch(b, 0, ws.len()))?;
    let routing = b.route(
        &logits,
        moe.selection_bias.as_ref(),
        &moe.params,
        moe.routed_scale,
    )?;
    let mut out = b.experts(x, &routing, &moe.experts)?;
    if let (Some(shared), Some(g), Some(u)) = (&moe.shared, outs.next(), outs.next()) {
        swiglu_down_add(b, shared, (&g, &u), &mut out)?;
    }
    Ok(out)
}

/// The final norm and lm_head over only the rows some chunk wants, split back per chunk.
fn logits<B: Backend>(
    b: &B,
    net: &Decoder<B>,
    x: B::Tensor,
    seqs: &[SeqChunk<'_, B>],
) -> Result<Vec<Option<B::Tensor>>> {
    // The wanted rows of each chunk: (start in x, rows).
    let mut spans = Vec::with_capacity(seqs.len());
    let mut off = 0;
    for s in seqs {
        let n = s.ids.len();
        spans.push(match s.want {
            Want::None => None,
            Want::Last => Some((off + n - 1, 1)),
            Want::All => Some((off, n)),
        });
        off += n;
    }
    let picked: usize = spans.iter().flatten().map(|(_, n)| n).sum();
    if picked == 0 {
        return Ok(seqs.iter().map(|_| None).collect());
    }
    let y = if picked == off {
        x
    } else {
        let mut parts = spans
            .iter()
            .flatten()
            .map(|&(start, n)| b.rows(&x, start, n))
            .collect::<Result<Vec<_>>>()?;
        match parts.len() {
            1 => parts.remove(0),
            _ => b.concat_rows(&parts.iter().collect::<Vec<_>>())?,
        }
    };
    let y = b.rms_norm(&y, &net.norm, net.eps, net.hidden)?;
    let head = net.lm_head.as_ref().unwrap_or(&net.embed);
    let mut all = Some(b.linear(&y, head, None)?);
    let wanting = spans.iter().flatten().count();
    let mut out = Vec::with_capacity(seqs.len());
    let mut row = 0;
    for span in spans {
        out.push(match span {
            None => None,
            // The only chunk that wants logits takes the whole matrix.
            Some(_) if wanting == 1 => all.take(),
            Some((_, n)) => {
                let t = all.as_ref().map(|l| b.rows(l, row, n)).transpose()?;
                row += n;
                t
            }
        });
    }
    Ok(out)
}
