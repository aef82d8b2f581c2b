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
//! ([`kernels::exp_scaled`]; prefill's [`kernels::softmax_scaled`] too). The visible keys are
//! split into ranges of at most [`DECODE_PART_KEYS`], one task per (KV head, range), so that any
//! number of threads shares a long context's keys evenly (not only as many as there are KV
//! heads), and the ranges' partial softmaxes are merged by their maxima (as flash-decoding does
//! on GPUs); the ranges depend on the context length alone, so the result does not depend on
//! the thread count. Several queries
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
/// Most keys in one part of a decode step's keys (the parts go to the threads as tasks).
const DECODE_PART_KEYS: usize = 512;

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
        let pos = chunk.pos0;
        let first = cache.first_visible(pos);
        let n = pos + 1 - first;
        let parts = n.div_ceil(DECODE_PART_KEYS).max(1);
        // the visible keys in `parts` contiguous ranges, one task per (KV head, range)
        let range = |i: usize| first + i * n / parts..first + (i + 1) * n / parts;
        let task =
            |(kh, i): (usize, usize)| decode_part(isa, q.row(0), cache, &chunk, p, kh, range(i));
        let tasks: Vec<(usize, usize)> = (0..p.kv_heads)
            .flat_map(|kh| (0..parts).map(move |i| (kh, i)))
            .collect();
        let done: Vec<DecodePart> = if n * p.heads * d < SERIAL_DECODE_BELOW {
            tasks.into_iter().map(task).collect()
        } else {
            tasks.into_par_iter().map(task).collect()
        };
        done.chunks(parts).map(|ps| merge_parts(ps, d)).collect()
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

/// One query's attention for the heads of one KV head over a range of its keys, before the
/// division by the softmax's sum: per query head of the group the range's largest scaled score,
/// the sum of `e^(score − max)` and `Σ e^(score − max) · value` (`[group · d]`).
struct DecodePart {
    max: Vec<f32>,
    sum: Vec<f32>,
    out: Vec<f32>,
}

/// A query's attention output for the heads of one KV head, `[group · d]`, from the parts of its
/// keys: each part weighted by `e^(its max − the max)`, divided by the weighted sums' total.
fn merge_parts(parts: &[DecodePart], d: usize) -> Vec<f32> {
    let group = parts.first().map_or(0, |p| p.max.len());
    let mut out = vec![0f32; group * d];
    for (g, o) in out.chunks_mut(d).enumerate() {
        let m = parts.iter().fold(f32::NEG_INFINITY, |m, p| m.max(p.max[g]));
        let mut total = 0f32;
        for part in parts {
            let w = (part.max[g] - m).exp();
            total += w * part.sum[g];
            for (x, &y) in o.iter_mut().zip(&part.out[g * d..(g + 1) * d]) {
                *x += w * y;
            }
        }
        let inv = 1.0 / total;
        for x in o.iter_mut() {
            *x *= inv;
        }
    }
    out
}

/// One query's attention for the heads of KV head `kh` over the keys at `keys` (positions, all
/// visible to it): see [`DecodePart`]. The keys and values are read where they are stored: bf16
/// rows widened in registers, each key once for all query heads of the group, the values summed
/// in registers 64 columns at a time; f32 and fp8 rows (other cache types) through f32.
fn decode_part(
    isa: Isa,
    q: &[f32],
    cache: &HostKvLayer,
    chunk: &KvChunk,
    p: &AttentionParams,
    kh: usize,
    keys: std::ops::Range<usize>,
) -> DecodePart {
    let d = p.head_dim;
    let group = p.heads / p.kv_heads.max(1);
    let n = keys.len();
    let qs: Vec<&[f32]> = (kh * group..(kh + 1) * group)
        .map(|h| &q[h * d..(h + 1) * d])
        .collect();
    let row = |j: usize, value: bool| cache.row(chunk, j, kh, value);
    // the keys' or values' rows as bf16 bits, if they are stored as bf16
    let bf16 = |value: bool| -> Option<Vec<&[u16]>> {
        keys.clone()
            .map(|j| match row(j, value) {
                KvRow::Bf16(b) => Some(b),
                _ => None,
            })
            .collect()
    };
    let mut scores = vec![0f32; group * n];
    match bf16(false) {
        Some(rows) => kernels::bf16_rows_scores(isa, &rows, &qs, &mut scores),
        None => {
            let mut tmp = vec![0f32; d];
            for (j, pos) in keys.clone().enumerate() {
                let row = match row(pos, false) {
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
    let (mut max, mut sum) = (vec![0f32; group], vec![0f32; group]);
    for (g, s) in scores.chunks_mut(n.max(1)).enumerate() {
        (max[g], sum[g]) = kernels::exp_scaled(isa, s, p.scale);
    }
    let mut out = vec![0f32; group * d];
    match bf16(true) {
        Some(rows) => kernels::bf16_rows_weighted_sum(isa, &mut out, d, &scores, &rows),
        None => {
            let mut rows = vec![0f32; n * d];
            for (pos, r) in keys.zip(rows.chunks_mut(d)) {
                row(pos, true).decode(r);
            }
            for (o, s) in out.chunks_mut(d).zip(scores.chunks(n.max(1))) {
                kernels::weighted_sum(isa, o, s, &rows, d);
            }
        }
    }
    DecodePart { max, sum, out }
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::backend::cpu::kv::HostKvAccount;
    use crate::ir::{KvDtype, KvLayerSpec};

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let x = (i as u32)
                    .wrapping_mul(2_654_435_761)
                    .wrapping_add(seed * 97)
                    % 2001;
                x as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    /// A decode step's attention, its keys in ranges of at most 512 (2 or 3 here) for 3 KV
    /// heads, equals the softmax-weighted sum computed in f64 from the cache's own rows, and is
    /// the same to the bit on one thread and on two: bf16, f32 and fp8 caches, a full layer and
    /// a 600-key sliding window past its wrap.
    #[test]
    fn decode_attention_over_key_ranges_matches_f64() {
        let (kv_heads, group, d) = (3usize, 3usize, 64usize);
        let p = AttentionParams {
            heads: kv_heads * group,
            kv_heads,
            head_dim: d,
            scale: 0.125,
        };
        let pools = [1, 2].map(|n| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .unwrap()
        });
        for dtype in [KvDtype::Bf16, KvDtype::F32, KvDtype::Fp8E4m3] {
            for window in [None, Some(600)] {
                let spec = KvLayerSpec {
                    kv_heads,
                    head_dim: d,
                    window,
                    dtype,
                    k_scale: 0.5,
                    v_scale: 0.5,
                };
                let mut cache = HostKvLayer::new(&spec, Arc::new(HostKvAccount::default()));
                let mut twin = HostKvLayer::new(&spec, Arc::new(HostKvAccount::default()));
                let cols = kv_heads * d;
                let mut pos = 0;
                for (step, rows) in [700usize, 1, 600, 1].into_iter().enumerate() {
                    let k = CpuTensor::new(rows, cols, values(rows * cols, 10 + step as u32));
                    let v = CpuTensor::new(rows, cols, values(rows * cols, 20 + step as u32));
                    let q = CpuTensor::new(rows, p.heads * d, values(rows * p.heads * d, 30));
                    cache.charge(pos + rows).unwrap();
                    twin.charge(pos + rows).unwrap();
                    let isa = Isa::detect();
                    let got = pools[1].install(|| attention(isa, &q, &k, &v, &mut cache, &p));
                    let alone = pools[0].install(|| attention(isa, &q, &k, &v, &mut twin, &p));
                    assert_eq!(
                        got.data(),
                        alone.data(),
                        "{dtype:?} {window:?}: 2 threads vs 1"
                    );
                    pos += rows;
                    if rows != 1 {
                        continue;
                    }
                    // the reference reads the committed rows (the step's own included)
                    let chunk = cache.stage(&[], &[], 0);
                    let first = cache.first_visible(pos - 1);
                    let (mut kr, mut vr) = (vec![0f32; d], vec![0f32; d]);
                    for h in 0..p.heads {
                        let kh = h / group;
                        let qh = &q.data()[h * d..(h + 1) * d];
                        let mut scores = Vec::new();
                        let mut rows = Vec::new();
                        for j in first..pos {
                            cache.decode(&chunk, j, kh, false, &mut kr);
                            cache.decode(&chunk, j, kh, true, &mut vr);
                            let s: f64 =
                                kr.iter().zip(qh).map(|(&a, &b)| a as f64 * b as f64).sum();
                            scores.push(s * p.scale as f64);
                            rows.push(vr.clone());
                        }
                        let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                        let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                        let total: f64 = w.iter().sum();
                        for c in 0..d {
                            let want: f64 = w
                                .iter()
                                .zip(&rows)
                                .map(|(w, r)| w * r[c] as f64)
                                .sum::<f64>()
                                / total;
                            let g = got.data()[h * d + c] as f64;
                            assert!(
                                (g - want).abs() < 1e-5,
                                "{dtype:?} window {window:?} at {pos} head {h} col {c}: {g} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }
}
