//! `y = x · Wᵀ` on the CPU for every stored weight encoding, dequantizing inside the loop.
//!
//! Up to [`GEMV_MAX_TOKENS`] tokens (decode, also a batched step of a few sequences; GEMV):
//! output rows are split across threads (several weights on the same input in one parallel
//! region); each task streams its rows of `W` once, one row after the other, against the shared
//! `x` rows (NVFP4: 16-element blocks decoded in registers once for up to 4 tokens, scaled by the
//! block's `fp8 / g` from a 256-entry table), each token's result bit for bit what it gets alone.
//! More tokens (prefill, GEMM): each task decodes 16 rows of `W` to f32 once into a scratch and
//! meets the tokens in blocks of 48 with 4-row × 3-token register tiles, so the decode cost is
//! shared by the whole chunk; with int8 activations (W4A8) an NVFP4 weight's rows meet the
//! tokens four at a time on the decode kernel instead, in row blocks that stay in L1.

use std::borrow::Cow;

use rayon::prelude::*;

use super::kernels::{self, Isa, ScaleLuts};
use super::w4a4;
use super::CpuActivations;
use crate::error::{EngineError, Result};
use crate::weights::LinearWeight;

/// Rows decoded together into the GEMM scratch (16 × 1536 f32: 96 KiB, in L2).
const TILE: usize = 16;
/// Tokens a scratch tile meets at a time (48 × 1536 f32: 288 KiB, in L2 with the tile).
const TOKEN_BLOCK: usize = 48;
/// Below this many weight elements a matmul runs on one thread (scheduling would dominate).
const SERIAL_BELOW: usize = 1 << 15;
/// Below this many weight elements a matmul splits into one task per thread.
const ONE_TASK_PER_THREAD_BELOW: usize = 1 << 21;
/// Most tokens a linear runs as a GEMV ([`gemv_many`]: every weight row read once, NVFP4 rows
/// decoded once, each token's result the single-token one, bit for bit); more take the tiled
/// GEMM. SmolLM2 NVFP4 + lm_head, 2 threads, `batch_decode_speed` ms a step (2026-12-03,
/// 3 alternating runs, GEMV / GEMM): 2 rows 11.1–14.4 / 19.0–21.1, 3 rows 15.9–22.3 /
/// 19.2–22.2, 4 rows 19.5–27.1 / 20.9–25.8, 6 rows 31.5–37.6 / 25.9–29.5 (two decodes a row
/// from 5 tokens).
pub(crate) const GEMV_MAX_TOKENS: usize = 4;

/// A weight as the CPU backend keeps it: the stored encoding, plus for NVFP4 the block scales by
/// fp8 code (`fp8(code) / g`, two 256-entry tables: 2 KiB whatever the matrix size).
#[derive(Debug, Clone)]
pub struct CpuLinear {
    name: String,
    weight: LinearWeight,
    luts: Option<Box<ScaleLuts>>,
    act_global_scale: Option<f32>,
}

impl CpuLinear {
    /// Wraps `weight` after checking its buffers match its shape.
    pub(crate) fn new(name: &str, weight: LinearWeight) -> Result<Self> {
        let (rows, cols) = (weight.rows(), weight.cols());
        let bad = |reason: String| EngineError::Backend {
            backend: "cpu".into(),
            reason: format!("weight `{name}`: {reason}"),
        };
        let n = rows
            .checked_mul(cols)
            .ok_or_else(|| bad(format!("shape [{rows}, {cols}] overflows")))?;
        let (luts, act_global_scale) = match &weight {
            LinearWeight::Bf16 { data, .. } | LinearWeight::F16 { data, .. } => {
                if data.len() != n * 2 {
                    return Err(bad(format!(
                        "{} bytes for [{rows}, {cols}] 16-bit",
                        data.len()
                    )));
                }
                (None, None)
            }
            LinearWeight::F32 { data, .. } => {
                if data.len() != n * 4 {
                    return Err(bad(format!(
                        "{} bytes for [{rows}, {cols}] f32",
                        data.len()
                    )));
                }
                (None, None)
            }
            LinearWeight::Nvfp4 {
                packed,
                scales,
                global_scale,
                input_global_scale,
                ..
            } => {
                if !cols.is_multiple_of(16) || packed.len() != n / 2 || scales.len() != n / 16 {
                    return Err(bad(format!(
                        "NVFP4 buffers ({} packed, {} scale bytes) do not match [{rows}, {cols}]",
                        packed.len(),
                        scales.len()
                    )));
                }
                (
                    Some(Box::new(ScaleLuts::new(*global_scale))),
                    *input_global_scale,
                )
            }
        };
        Ok(Self {
            name: name.to_owned(),
            weight,
            luts,
            act_global_scale,
        })
    }

    /// The weight's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The stored weight.
    pub fn weight(&self) -> &LinearWeight {
        &self.weight
    }

    /// Output dimension.
    pub fn rows(&self) -> usize {
        self.weight.rows()
    }

    /// Input dimension.
    pub fn cols(&self) -> usize {
        self.weight.cols()
    }

    /// Row `r` decoded to f32 into `out` (`cols` values).
    pub(crate) fn decode_row(&self, isa: Isa, r: usize, out: &mut [f32]) {
        let cols = self.cols();
        match &self.weight {
            LinearWeight::Bf16 { data, .. } => {
                kernels::bf16_decode(isa, &data.as_slice()[r * cols * 2..(r + 1) * cols * 2], out)
            }
            LinearWeight::F16 { data, .. } => {
                kernels::f16_decode(isa, &data.as_slice()[r * cols * 2..(r + 1) * cols * 2], out)
            }
            LinearWeight::F32 { data, .. } => {
                kernels::f32_decode(&data.as_slice()[r * cols * 4..(r + 1) * cols * 4], out)
            }
            LinearWeight::Nvfp4 { packed, scales, .. } => kernels::nvfp4_decode(
                isa,
                &packed.as_slice()[r * cols / 2..(r + 1) * cols / 2],
                &scales.as_slice()[r * cols / 16..(r + 1) * cols / 16],
                self.luts(),
                out,
            ),
        }
    }

    fn luts(&self) -> &ScaleLuts {
        static ZERO: ScaleLuts = ScaleLuts {
            full: [0.0; 256],
            half: [0.0; 256],
        };
        self.luts.as_deref().unwrap_or(&ZERO)
    }

    /// `x [t, cols] · Wᵀ → [t, rows]`.
    pub(crate) fn matmul(&self, isa: Isa, act: CpuActivations, x: &[f32], t: usize) -> Vec<f32> {
        let (rows, cols) = (self.rows(), self.cols());
        assert_eq!(x.len(), t * cols, "matmul input shape for `{}`", self.name);
        if t <= GEMV_MAX_TOKENS {
            return gemv_many(isa, act, x, t, &[self]).pop().unwrap_or_default();
        }
        if self.takes_q8(act) {
            return self.matmul_q8(isa, x, t);
        }
        let quantized;
        let x = match self.act_global_scale {
            Some(g) => {
                quantized = w4a4::fake_quantize(x, cols, g);
                &quantized[..]
            }
            None => x,
        };
        let chunk = self.chunk_rows().max(TILE);
        let task = |(i, o): (usize, &mut [f32])| {
            let mut scratch = vec![0f32; TILE * cols];
            let first = i * chunk;
            let n = o.len() / t;
            let mut r = 0;
            while r < n {
                let m = TILE.min(n - r);
                for j in 0..m {
                    self.decode_row(isa, first + r + j, &mut scratch[j * cols..(j + 1) * cols]);
                }
                let xrow = |tok: usize| &x[tok * cols..(tok + 1) * cols];
                // Tokens in blocks that stay in L2 while the tile's rows pass over them.
                for tb in (0..t).step_by(TOKEN_BLOCK) {
                    let te = (tb + TOKEN_BLOCK).min(t);
                    let mut j = 0;
                    while j + 4 <= m {
                        let w4 = [0, 1, 2, 3].map(|k| &scratch[(j + k) * cols..(j + k + 1) * cols]);
                        let mut tok = tb;
                        // 4 rows × 3 tokens per register tile, then the block's other tokens.
                        while tok + 3 <= te {
                            let d = kernels::dot4xt::<3>(isa, w4, [0, 1, 2].map(|u| xrow(tok + u)));
                            for (u, du) in d.into_iter().enumerate() {
                                for (k, v) in du.into_iter().enumerate() {
                                    o[(r + j + k) * t + tok + u] = v;
                                }
                            }
                            tok += 3;
                        }
                        for tok in tok..te {
                            let d = kernels::dot4(isa, w4, xrow(tok));
                            for (k, v) in d.into_iter().enumerate() {
                                o[(r + j + k) * t + tok] = v;
                            }
                        }
                        j += 4;
                    }
                    for j in j..m {
                        let w = &scratch[j * cols..(j + 1) * cols];
                        for tok in tb..te {
                            o[(r + j) * t + tok] = kernels::dot(isa, w, xrow(tok));
                        }
                    }
                }
                r += m;
            }
        };
        row_tasks(rows, t, chunk, task)
    }

    /// Whether this weight multiplies int8 copies of its inputs under `act` (W4A8): an NVFP4
    /// weight that does not quantize its inputs itself (W4A4), with `--cpu-activations int8`.
    fn takes_q8(&self, act: CpuActivations) -> bool {
        act == CpuActivations::Int8
            && self.act_global_scale.is_none()
            && matches!(self.weight, LinearWeight::Nvfp4 { .. })
    }

    /// The W4A8 GEMM: every token quantized to int8 as a decode step quantizes it, then each
    /// task meets its rows in blocks that stay in L1 ([`Q8_BLOCK_BYTES`]) with the tokens four at
    /// a time on the decode kernel, so every token's result is bit for bit the one it gets in a
    /// decode step (a prompt and a step agree, whatever the batch around them).
    fn matmul_q8(&self, isa: Isa, x: &[f32], t: usize) -> Vec<f32> {
        let (rows, cols) = (self.rows(), self.cols());
        let LinearWeight::Nvfp4 { packed, scales, .. } = &self.weight else {
            unreachable!("matmul_q8 runs NVFP4 weights only (takes_q8)");
        };
        let (p, s) = (packed.as_slice(), scales.as_slice());
        let xq: Vec<kernels::Q8Input> = x
            .chunks_exact(cols)
            .map(|row| kernels::q8_input(isa, row))
            .collect();
        let lut = self.luts();
        let block = (Q8_BLOCK_BYTES / (cols / 2 + cols / 16)).clamp(4, 256) / 4 * 4;
        let chunk = self.chunk_rows().max(block);
        let task = |(i, o): (usize, &mut [f32])| {
            let first = i * chunk;
            let n = o.len() / t;
            let mut part = vec![0f32; block * GEMV_MAX_TOKENS];
            for rb in (0..n).step_by(block) {
                let m = block.min(n - rb);
                let (r0, r1) = (first + rb, first + rb + m);
                let (pr, sr) = (
                    &p[r0 * cols / 2..r1 * cols / 2],
                    &s[r0 * cols / 16..r1 * cols / 16],
                );
                for (g, group) in xq.chunks(GEMV_MAX_TOKENS).enumerate() {
                    let tg = group.len();
                    let part = &mut part[..m * tg];
                    rows_dot_q8(isa, pr, sr, cols, lut, group, part);
                    for (r, pr) in part.chunks_exact(tg).enumerate() {
                        let at = (rb + r) * t + g * GEMV_MAX_TOKENS;
                        o[at..at + tg].copy_from_slice(pr);
                    }
                }
            }
        };
        row_tasks(rows, t, chunk, task)
    }

    /// Rows per parallel task of the prefill GEMM: see [`task_rows`].
    fn chunk_rows(&self) -> usize {
        task_rows(self.rows(), self.rows() * self.cols())
    }

    /// `out[i * t + k] = W[r0 + i] · x[k]` for the `t` rows of `x` and `i < out.len() / t`, one
    /// weight row after the other: each thread then reads one sequential stream of weight bytes,
    /// which the hardware prefetcher follows at full memory bandwidth; several rows interleaved
    /// (sharing the loads of `x`, which sits in L1 anyway) measured 1.2–2.5x slower on AMD EPYC
    /// (docs/performance.md). A row meets every token while it is in L1 (NVFP4: decoded once
    /// per 4 tokens); each token's result is the single-token kernel's.
    ///
    /// `xq`: the tokens quantized to int8 ([`kernels::q8_input`]), which an NVFP4 weight then
    /// multiplies instead of `x` (W4A8).
    fn gemv_rows(
        &self,
        isa: Isa,
        r0: usize,
        out: &mut [f32],
        x: &[f32],
        xq: Option<&[kernels::Q8Input]>,
        t: usize,
    ) {
        let cols = self.cols();
        if t == 0 {
            return;
        }
        let xrow = |k: usize| &x[k * cols..(k + 1) * cols];
        match &self.weight {
            LinearWeight::Bf16 { data, .. } => {
                let b = data.as_slice();
                let xin: Vec<_> = (0..t).map(|k| kernels::bf16_input(isa, xrow(k))).collect();
                for (i, o) in out.chunks_exact_mut(t).enumerate() {
                    let row = &b[(r0 + i) * cols * 2..(r0 + i + 1) * cols * 2];
                    for (ok, xk) in o.iter_mut().zip(&xin) {
                        *ok = kernels::bf16_rows_dot::<1>(isa, [row], xk)[0];
                    }
                }
            }
            LinearWeight::F16 { data, .. } => {
                let b = data.as_slice();
                for (i, o) in out.chunks_exact_mut(t).enumerate() {
                    let row = &b[(r0 + i) * cols * 2..(r0 + i + 1) * cols * 2];
                    for (k, ok) in o.iter_mut().enumerate() {
                        *ok = kernels::f16_rows_dot::<1>(isa, [row], xrow(k))[0];
                    }
                }
            }
            LinearWeight::F32 { .. } => {
                let mut scratch = vec![0f32; cols];
                for (i, o) in out.chunks_exact_mut(t).enumerate() {
                    self.decode_row(isa, r0 + i, &mut scratch);
                    for (k, ok) in o.iter_mut().enumerate() {
                        *ok = kernels::dot(isa, &scratch, xrow(k));
                    }
                }
            }
            LinearWeight::Nvfp4 { packed, scales, .. } => {
                let (p, s) = (packed.as_slice(), scales.as_slice());
                let lut = self.luts();
                let row = |r: usize| {
                    (
                        &p[r * cols / 2..(r + 1) * cols / 2],
                        &s[r * cols / 16..(r + 1) * cols / 16],
                    )
                };
                if let Some(xin) = xq {
                    // Every row of the task in one kernel call (at most 4 tokens: one group).
                    let rows = out.len() / t;
                    let (pr, sr) = (
                        &p[r0 * cols / 2..(r0 + rows) * cols / 2],
                        &s[r0 * cols / 16..(r0 + rows) * cols / 16],
                    );
                    rows_dot_q8(isa, pr, sr, cols, lut, xin, out);
                    return;
                }
                // Each row meets the tokens four at a time (decoded once per four).
                let xin: Vec<_> = (0..t).map(|k| kernels::nvfp4_input(isa, xrow(k))).collect();
                for (i, o) in out.chunks_exact_mut(t).enumerate() {
                    let (pr, sr) = row(r0 + i);
                    for (og, xg) in o.chunks_mut(4).zip(xin.chunks(4)) {
                        match xg {
                            [a, b, c, d] => og.copy_from_slice(&kernels::nvfp4_row_dot_tokens(
                                isa,
                                pr,
                                sr,
                                lut,
                                [a, b, c, d],
                            )),
                            [a, b, c] => og.copy_from_slice(&kernels::nvfp4_row_dot_tokens(
                                isa,
                                pr,
                                sr,
                                lut,
                                [a, b, c],
                            )),
                            [a, b] => og.copy_from_slice(&kernels::nvfp4_row_dot_tokens(
                                isa,
                                pr,
                                sr,
                                lut,
                                [a, b],
                            )),
                            [a, ..] => og.copy_from_slice(&kernels::nvfp4_row_dot_tokens(
                                isa,
                                pr,
                                sr,
                                lut,
                                [a],
                            )),
                            [] => {}
                        }
                    }
                }
            }
        }
    }
}

/// Runs `task` over a GEMM's output transposed (`[rows, t]`, so each task owns contiguous
/// memory) in tasks of `chunk` rows (task `i`: rows from `i · chunk`), in parallel where there
/// are several; returns the output as `[t, rows]`.
fn row_tasks(
    rows: usize,
    t: usize,
    chunk: usize,
    task: impl Fn((usize, &mut [f32])) + Send + Sync,
) -> Vec<f32> {
    let mut out_t = vec![0f32; rows * t];
    if chunk >= rows {
        task((0, &mut out_t));
    } else {
        out_t.par_chunks_mut(chunk * t).enumerate().for_each(task);
    }
    let mut out = vec![0f32; t * rows];
    for r in 0..rows {
        for tok in 0..t {
            out[tok * rows + r] = out_t[r * t + tok];
        }
    }
    out
}

/// Packed NVFP4 bytes (codes and scales) of the row block the W4A8 GEMM meets all tokens with
/// before moving on (in L1 with the tokens' int8 copies streaming past).
const Q8_BLOCK_BYTES: usize = 16 << 10;

/// [`kernels::nvfp4_rows_dot_q8`] of the rows `packed`, `scales` with the one to
/// [`GEMV_MAX_TOKENS`] int8 inputs of `group`: `out[r · group.len() + k]`.
fn rows_dot_q8(
    isa: Isa,
    packed: &[u8],
    scales: &[u8],
    cols: usize,
    lut: &ScaleLuts,
    group: &[kernels::Q8Input],
    out: &mut [f32],
) {
    match group {
        [a, b, c, d] => {
            kernels::nvfp4_rows_dot_q8(isa, packed, scales, cols, lut, [a, b, c, d], out)
        }
        [a, b, c] => kernels::nvfp4_rows_dot_q8(isa, packed, scales, cols, lut, [a, b, c], out),
        [a, b] => kernels::nvfp4_rows_dot_q8(isa, packed, scales, cols, lut, [a, b], out),
        [a] => kernels::nvfp4_rows_dot_q8(isa, packed, scales, cols, lut, [a], out),
        _ => unreachable!("int8 inputs go in groups of 1 to GEMV_MAX_TOKENS = 4"),
    }
}

/// Rows per parallel task when `rows` rows of `elements` weight elements in all are split: a
/// multiple of 4; everything in one task for small matrices, one task per thread for mid-sized
/// ones (each extra task is a steal), about four per thread for large ones (balance against a
/// thread that started late).
fn task_rows(rows: usize, elements: usize) -> usize {
    if elements < SERIAL_BELOW {
        return rows.max(1);
    }
    let per_thread = if elements < ONE_TASK_PER_THREAD_BELOW {
        1
    } else {
        4
    };
    let tasks = per_thread * rayon::current_num_threads().max(1);
    (rows.div_ceil(tasks).div_ceil(4) * 4).max(16)
}

/// `x [t, cols] · Wᵀ → [t, rows]` for every weight of `ws` (all of `cols` columns, `t` at most
/// [`GEMV_MAX_TOKENS`]), in one parallel region: the output rows of all weights are split into
/// tasks together, so q/k/v or gate/up cost one fork-join instead of one each.
pub(crate) fn gemv_many(
    isa: Isa,
    act: CpuActivations,
    x: &[f32],
    t: usize,
    ws: &[&CpuLinear],
) -> Vec<Vec<f32>> {
    if t == 0 {
        return vec![Vec::new(); ws.len()];
    }
    // Each weight's input: W4A4 weights see their own NVFP4-quantized copy.
    let inputs: Vec<Cow<'_, [f32]>> = ws
        .iter()
        .map(|w| match w.act_global_scale {
            Some(g) => Cow::Owned(w4a4::fake_quantize(x, w.cols(), g)),
            None => Cow::Borrowed(x),
        })
        .collect();
    // W4A8: the int8 copy of `x`, made once for every NVFP4 weight that reads `x` itself.
    let wants_q8 = |w: &CpuLinear| w.takes_q8(act);
    let cols = ws.first().map_or(0, |w| w.cols());
    let xq: Option<Vec<kernels::Q8Input>> = ws.iter().any(|w| wants_q8(w)).then(|| {
        x.chunks_exact(cols.max(1))
            .map(|row| kernels::q8_input(isa, row))
            .collect()
    });
    // (row-major by weight row: `[rows, t]`; the tasks own contiguous rows)
    let mut outs: Vec<Vec<f32>> = ws.iter().map(|w| vec![0f32; w.rows() * t]).collect();
    let rows: usize = ws.iter().map(|w| w.rows()).sum();
    let elements: usize = ws.iter().map(|w| w.rows() * w.cols()).sum();
    let chunk = task_rows(rows, elements).max(1);
    let mut tasks: Vec<(usize, usize, &mut [f32])> = Vec::new();
    for (wi, out) in outs.iter_mut().enumerate() {
        for (ci, o) in out.chunks_mut(chunk * t).enumerate() {
            tasks.push((wi, ci * chunk, o));
        }
    }
    let run = |(wi, r0, o): (usize, usize, &mut [f32])| {
        let q = xq.as_deref().filter(|_| wants_q8(ws[wi]));
        ws[wi].gemv_rows(isa, r0, o, &inputs[wi], q, t)
    };
    if tasks.len() <= 1 || elements < SERIAL_BELOW {
        tasks.into_iter().for_each(run);
    } else {
        tasks.into_par_iter().for_each(run);
    }
    if t == 1 {
        return outs;
    }
    outs.into_iter()
        .zip(ws)
        .map(|(o, w)| {
            let rows = w.rows();
            let mut y = vec![0f32; t * rows];
            for (r, or) in o.chunks_exact(t).enumerate() {
                for (k, v) in or.iter().enumerate() {
                    y[k * rows + r] = *v;
                }
            }
            y
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::Bytes;

    fn nvfp4(rows: usize, cols: usize, input_global_scale: Option<f32>) -> CpuLinear {
        let packed = (0..rows * cols / 2).map(|i| (i * 97 % 253) as u8).collect();
        let scales = (0..rows * cols / 16)
            .map(|i| (0x30 + i % 24) as u8)
            .collect();
        let weight = LinearWeight::Nvfp4 {
            packed: Bytes::from_vec(packed),
            scales: Bytes::from_vec(scales),
            global_scale: 448.0,
            input_global_scale,
            rows,
            cols,
        };
        CpuLinear::new("w", weight).expect("consistent NVFP4 buffers")
    }

    /// `--cpu-activations int8` changes what NVFP4 weights compute (close to f32), and only
    /// that: bf16 weights and W4A4 modules give the f32 results bit for bit.
    #[test]
    fn int8_activations_touch_only_nvfp4_weights() {
        let (rows, cols) = (24, 96);
        let x: Vec<f32> = (0..8 * cols).map(|i| (i as f32 * 0.731).sin()).collect();
        let w = nvfp4(rows, cols, None);
        let bf16 = CpuLinear::new(
            "b",
            LinearWeight::Bf16 {
                data: Bytes::from_vec(
                    (0..rows * cols)
                        .flat_map(|i| half::bf16::from_f32((i as f32).cos()).to_le_bytes())
                        .collect(),
                ),
                rows,
                cols,
            },
        )
        .expect("bf16 buffer");
        let w4a4 = nvfp4(rows, cols, Some(100.0));
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        let isa = Isa::detect();
        for t in [1, 3] {
            let xs = &x[..t * cols];
            let f = w.matmul(isa, CpuActivations::F32, xs, t);
            let q = w.matmul(isa, CpuActivations::Int8, xs, t);
            assert_ne!(bits(&f), bits(&q), "{t} rows: int8 not taken");
            let scale = f.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (a, b) in f.iter().zip(&q) {
                assert!((a - b).abs() <= 0.02 * scale, "{t} rows: {a} vs {b}");
            }
            for other in [&bf16, &w4a4] {
                assert_eq!(
                    bits(&other.matmul(isa, CpuActivations::F32, xs, t)),
                    bits(&other.matmul(isa, CpuActivations::Int8, xs, t))
                );
            }
        }
        // A prefill-sized input: int8 too, each token's result bit for bit its decode-step one
        // (alone and in a group of four); bf16 and W4A4 the f32 GEMM's.
        let t = 7;
        let q = w.matmul(isa, CpuActivations::Int8, &x[..t * cols], t);
        assert_ne!(
            bits(&q),
            bits(&w.matmul(isa, CpuActivations::F32, &x[..t * cols], t))
        );
        for k in 0..t {
            let alone = w.matmul(isa, CpuActivations::Int8, &x[k * cols..(k + 1) * cols], 1);
            assert_eq!(
                bits(&q[k * rows..(k + 1) * rows]),
                bits(&alone),
                "token {k}"
            );
        }
        let four = w.matmul(isa, CpuActivations::Int8, &x[..4 * cols], 4);
        assert_eq!(bits(&q[..4 * rows]), bits(&four));
        for other in [&bf16, &w4a4] {
            assert_eq!(
                bits(&other.matmul(isa, CpuActivations::F32, &x[..t * cols], t)),
                bits(&other.matmul(isa, CpuActivations::Int8, &x[..t * cols], t))
            );
        }
    }

    /// The W4A8 GEMM over more rows than one L1 block and more tokens than one group of four,
    /// split into parallel tasks: every entry bit for bit its single-token decode result.
    #[test]
    fn int8_gemm_equals_the_decode_rows_across_blocks_and_tasks() {
        let (rows, cols) = (600, 1024);
        let w = nvfp4(rows, cols, None);
        let t = 11;
        let x: Vec<f32> = (0..t * cols).map(|i| (i as f32 * 0.377).cos()).collect();
        let isa = Isa::detect();
        let q = w.matmul(isa, CpuActivations::Int8, &x, t);
        for k in [0, 5, 10] {
            let alone = w.matmul(isa, CpuActivations::Int8, &x[k * cols..(k + 1) * cols], 1);
            assert!(
                q[k * rows..(k + 1) * rows]
                    .iter()
                    .zip(&alone)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "token {k}"
            );
        }
    }
}
