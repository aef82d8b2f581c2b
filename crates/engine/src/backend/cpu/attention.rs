//! Causal attention over a [`HostKvLayer`] on the CPU, in f32.
//!
//! The chunk's keys and values are first rounded to the cache's storage type (so prefill and
//! step-by-step decode see identical keys). Query `t` (position `p = pos0 + t`) attends to
//! positions `first_visible(p) ..= p`; scores are `q · k · scale`, softmax in f32 with the max
//! subtracted. Finally the chunk is committed to the cache (ring layers keep only its last
//! `window` rows).
//!
//! One query (decode): each key and value is read where it is stored (bf16 rows widened in
//! registers, each key once for all query heads of its group, the values summed in registers),
//! never copied: the cache is not converted to f32 per step; the softmax takes a vector `e^x`
//! ([`kernels::softmax_scaled`], also for prefill). Several queries
//! (prefill): per KV head the visible keys and values are decoded to f32 once and shared by the
//! query heads of its group and every query of the chunk; scores come from 4-key × 3-query
//! register tiles and each output row is summed in registers while the values stream past.

use rayon::prelude::*;

use super::kernels::{self, Isa};
use super::kv::{HostKvLayer, KvChunk, KvRow};
use super::tensor::CpuTensor;
use crate::ir::AttentionParams;

/// Queries per parallel task in prefill.
const QUERIES_PER_TASK: usize = 16;
/// Below this many multiply-adds a decode step's heads run on one thread.
const SERIAL_DECODE_BELOW: usize = 1 << 16;

pub(crate) fn attention(
    isa: Isa,
    q: &CpuTensor,
    k: &CpuTensor,
    v: &CpuTensor,
    cache: &mut HostKvLayer,
    p: &AttentionParams,
) -> CpuTensor {
    let t = q.rows();
    let d = p.head_dim;
    let group = p.heads / p.kv_heads.max(1);
    let chunk = cache.stage(k.data(), v.data(), t);
    let per_head: Vec<Vec<f32>> = if t == 1 {
        let work = (chunk.pos0 + 1) * p.heads * d;
        let head = |kh| decode_head(isa, q.row(0), cache, &chunk, p, kh);
        if work < SERIAL_DECODE_BELOW {
            (0..p.kv_heads).map(head).collect()
        } else {
            (0..p.kv_heads).into_par_iter().map(head).collect()
        }
    } else {
        (0..p.kv_heads)
            .into_par_iter()
            .map(|kh| prefill_head(isa, q, cache, &chunk, p, kh))
            .collect()
    };
    cache.commit(chunk);

    let cols = p.heads * d;
    let mut out = vec![0f32; t * cols];
    for (kh, ho) in per_head.iter().enumerate() {
        for tq in 0..t {
            let src = &ho[tq * group * d..(tq + 1) * group * d];
            out[tq * cols + kh * group * d..tq * cols + (kh + 1) * group * d].copy_from_slice(src);
        }
    }
    CpuTensor::new(t, cols, out)
}

/// The rows as bf16 bits, if all of them are stored as bf16.
fn bf16_rows<'a>(rows: &[KvRow<'a>]) -> Option<Vec<&'a [u16]>> {
    rows.iter()
        .map(|r| match *r {
            KvRow::Bf16(b) => Some(b),
            _ => None,
        })
        .collect()
}

/// One query's attention for the heads of KV head `kh`: `[group · d]`. The visible keys and
/// values are read where they are stored: bf16 rows widened in registers, each key once for all
/// query heads of the group, the values summed in registers 64 columns at a time; f32 and fp8
/// rows (other cache types) through f32.
fn decode_head(
    isa: Isa,
    q: &[f32],
    cache: &HostKvLayer,
    chunk: &KvChunk,
    p: &AttentionParams,
    kh: usize,
) -> Vec<f32> {
    let d = p.head_dim;
    let group = p.heads / p.kv_heads.max(1);
    let pos = chunk.pos0;
    let first = cache.first_visible(pos);
    let n = pos + 1 - first;
    let qs: Vec<&[f32]> = (kh * group..(kh + 1) * group)
        .map(|h| &q[h * d..(h + 1) * d])
        .collect();
    let keys: Vec<KvRow<'_>> = (first..=pos)
        .map(|j| cache.row(chunk, j, kh, false))
        .collect();
    let values: Vec<KvRow<'_>> = (first..=pos)
        .map(|j| cache.row(chunk, j, kh, true))
        .collect();
    let mut scores = vec![0f32; group * n];
    match bf16_rows(&keys) {
        Some(rows) => kernels::bf16_rows_scores(isa, &rows, &qs, &mut scores),
        None => {
            let mut tmp = vec![0f32; d];
            for (j, key) in keys.iter().enumerate() {
                let row = match *key {
                    KvRow::F32(r) => r,
                    other => {
                        other.decode(&mut tmp);
                        &tmp[..]
                    }
                };
                for (g, x) in qs.iter().enumerate() {
                    scores[g * n + j] = kernels::dot(isa, row, x);
                }
            }
        }
    }
    for s in scores.chunks_mut(n.max(1)) {
        kernels::softmax_scaled(isa, s, p.scale);
    }
    let mut out = vec![0f32; group * d];
    match bf16_rows(&values) {
        Some(rows) => {
            for (o, s) in out.chunks_mut(d).zip(scores.chunks(n.max(1))) {
                kernels::bf16_rows_weighted_sum(isa, o, s, &rows);
            }
        }
        None => {
            let mut rows = vec![0f32; n * d];
            for (value, r) in values.iter().zip(rows.chunks_mut(d)) {
                value.decode(r);
            }
            for (o, s) in out.chunks_mut(d).zip(scores.chunks(n.max(1))) {
                kernels::weighted_sum(isa, o, s, &rows, d);
            }
        }
    }
    out
}

/// Every query of the chunk for the heads of KV head `kh`: `[t, group · d]`.
fn prefill_head(
    isa: Isa,
    q: &CpuTensor,
    cache: &HostKvLayer,
    chunk: &KvChunk,
    p: &AttentionParams,
    kh: usize,
) -> Vec<f32> {
    let t = q.rows();
    let d = p.head_dim;
    let group = p.heads / p.kv_heads.max(1);
    let pos0 = chunk.pos0;
    let first = cache.first_visible(pos0);
    let n_keys = pos0 + t - first;
    let mut keys = vec![0f32; n_keys * d];
    let mut vals = vec![0f32; n_keys * d];
    for j in 0..n_keys {
        let pos = first + j;
        cache.decode(chunk, pos, kh, false, &mut keys[j * d..(j + 1) * d]);
        cache.decode(chunk, pos, kh, true, &mut vals[j * d..(j + 1) * d]);
    }
    let key = |j: usize| &keys[j * d..(j + 1) * d];
    let mut out = vec![0f32; t * group * d];
    let work = |(c, o): (usize, &mut [f32])| {
        let rows = o.len() / (group * d);
        let tq0 = c * QUERIES_PER_TASK;
        // The block's (query, head) rows and the keys any of them sees.
        let qrows: Vec<(usize, &[f32])> = (0..rows)
            .flat_map(|r| {
                (0..group).map(move |g| {
                    let h = kh * group + g;
                    (tq0 + r, &q.row(tq0 + r)[h * d..(h + 1) * d])
                })
            })
            .collect();
        let lo = cache.first_visible(pos0 + tq0) - first;
        let hi = pos0 + tq0 + rows - first;
        let width = hi - lo;
        let mut scores = vec![0f32; qrows.len() * width];
        let mut i = 0;
        while i + 3 <= qrows.len() {
            let xs = [0, 1, 2].map(|u| qrows[i + u].1);
            let mut j = 0;
            while j + 4 <= width {
                let s = kernels::dot4xt::<3>(isa, [0, 1, 2, 3].map(|k| key(lo + j + k)), xs);
                for (u, su) in s.into_iter().enumerate() {
                    scores[(i + u) * width + j..(i + u) * width + j + 4].copy_from_slice(&su);
                }
                j += 4;
            }
            for j in j..width {
                for (u, x) in xs.iter().enumerate() {
                    scores[(i + u) * width + j] = kernels::dot(isa, key(lo + j), x);
                }
            }
            i += 3;
        }
        for (i, (_, x)) in qrows.iter().enumerate().skip(i) {
            for j in 0..width {
                scores[i * width + j] = kernels::dot(isa, key(lo + j), x);
            }
        }
        for (i, &(tq, _)) in qrows.iter().enumerate() {
            // This query's visible keys within the block's range.
            let pos = pos0 + tq;
            let (a, b) = (cache.first_visible(pos) - first - lo, pos - first + 1 - lo);
            let s = &mut scores[i * width + a..i * width + b];
            kernels::softmax_scaled(isa, s, p.scale);
            let (r, g) = (tq - tq0, i % group);
            let oh = &mut o[(r * group + g) * d..(r * group + g + 1) * d];
            kernels::weighted_sum(isa, oh, s, &vals[(lo + a) * d..], d);
        }
    };
    if t >= 2 * QUERIES_PER_TASK {
        out.par_chunks_mut(QUERIES_PER_TASK * group * d)
            .enumerate()
            .for_each(work);
    } else {
        out.chunks_mut(QUERIES_PER_TASK * group * d)
            .enumerate()
            .for_each(work);
    }
    out
}
