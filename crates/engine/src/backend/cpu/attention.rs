//! Causal attention over a [`HostKvLayer`] on the CPU, in f32.
//!
//! The chunk's keys and values are first rounded to the cache's storage type (so prefill and
//! step-by-step decode see identical keys), then for each KV head the visible keys and values
//! are decoded once to f32 and shared by the query heads of its group and by every query of the
//! chunk. Query `t` (position `p = pos0 + t`) attends to positions `first_visible(p) ..= p`;
//! scores are `q · k · scale`, softmax in f32 with the max subtracted. Finally the chunk is
//! committed to the cache (ring layers keep only its last `window` rows).

use rayon::prelude::*;

use super::kernels::{self, Isa};
use super::kv::HostKvLayer;
use super::tensor::CpuTensor;
use crate::ir::AttentionParams;

/// Queries per parallel task in prefill.
const QUERIES_PER_TASK: usize = 16;

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
    let pos0 = chunk.pos0;
    let first = cache.first_visible(pos0);
    let n_keys = pos0 + t - first;
    let cache_ref = &*cache;
    let chunk_ref = &chunk;

    // Per KV head: [t, group·d] outputs.
    let per_head: Vec<Vec<f32>> = (0..p.kv_heads)
        .into_par_iter()
        .map(|kh| {
            let mut keys = vec![0f32; n_keys * d];
            let mut vals = vec![0f32; n_keys * d];
            for j in 0..n_keys {
                let pos = first + j;
                cache_ref.decode(chunk_ref, pos, kh, false, &mut keys[j * d..(j + 1) * d]);
                cache_ref.decode(chunk_ref, pos, kh, true, &mut vals[j * d..(j + 1) * d]);
            }
            let mut out = vec![0f32; t * group * d];
            let work = |(c, o): (usize, &mut [f32])| {
                let mut scores = vec![0f32; n_keys];
                let rows = o.len() / (group * d);
                for r in 0..rows {
                    let tq = c * QUERIES_PER_TASK + r;
                    let pos = pos0 + tq;
                    let lo = cache_ref.first_visible(pos) - first;
                    let hi = pos - first + 1;
                    for g in 0..group {
                        let h = kh * group + g;
                        let qv = &q.row(tq)[h * d..(h + 1) * d];
                        let s = &mut scores[lo..hi];
                        let mut max = f32::NEG_INFINITY;
                        for (j, sj) in s.iter_mut().enumerate() {
                            let kj = &keys[(lo + j) * d..(lo + j + 1) * d];
                            *sj = kernels::dot(isa, qv, kj) * p.scale;
                            max = max.max(*sj);
                        }
                        let mut sum = 0f32;
                        for sj in s.iter_mut() {
                            *sj = (*sj - max).exp();
                            sum += *sj;
                        }
                        let inv = 1.0 / sum;
                        let oh = &mut o[(r * group + g) * d..(r * group + g + 1) * d];
                        for (j, &sj) in s.iter().enumerate() {
                            let vj = &vals[(lo + j) * d..(lo + j + 1) * d];
                            kernels::axpy(isa, oh, sj * inv, vj);
                        }
                    }
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
        })
        .collect();

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
