//! GPU tests of the CUDA backend (feature `cuda`). They need a CUDA device, so they are
//! `#[ignore]`d: `scripts/gpu-tests.sh` runs them on the GPU machine with `--ignored`.
//!
//! * kernels: NVFP4 / bf16 / f32 GEMV, multi-token linear and tiled prefill GEMM against an f64
//!   matmul of the format crate's dequantization (tolerance as the CPU kernels' test:
//!   `1e-5 · Σ|w·x| + 1e-6`).
//! * tiny Laguna (bf16, stock NVFP4, lean NVFP4; f32 KV): per-position logits of a 600-token
//!   prefill (crosses the 512 sliding window) against the CPU backend (`1e-4`: both compute in
//!   f32 from the same weights, only summation order differs) and against transformers'
//!   reference logits (`1e-4`, as the CPU test), plus prefill in 128-token chunks and
//!   token-by-token decode of the last positions.
//! * attention: decode and prefill over bf16 / fp8 caches against the CPU backend (`1e-4`), the
//!   prefill attention on tensor cores (`attn_flash_*`) also against the CUDA-core kernels.
//! * greedy generation: 256 tokens, GPU vs CPU, token for token (bf16 KV on both).
//! * sampling and log-probabilities on the device vs the host's (`Backend::sample`,
//!   `Backend::logprobs`), and a pass that scores a prompt chunk and a picked token
//!   (`Model::forward_batch_scored`).
//! * SmolLM2 (`assets/smollm2-hf` or `assets/smollm2-nvfp4`, if present): logits vs CPU and
//!   256 greedy tokens.
#![cfg(feature = "cuda")]

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use common::{max_abs, max_abs_diff, values};
use fp4forge_engine::backend::cuda::CudaOptions;
use fp4forge_engine::{
    Backend, CpuBackend, CudaBackend, GenerateOptions, KvDtype, LinearWeight, Model, ModelOptions,
    Want,
};
use fp4forge_format::{
    dequantize_f32, quantize, Dtype, Nvfp4View, SafetensorsFile, SourceDtype, WeightView,
};

fn gpu() -> CudaBackend {
    static B: OnceLock<CudaBackend> = OnceLock::new();
    B.get_or_init(|| CudaBackend::new(0).expect("CUDA device 0"))
        .clone()
}

/// Caps the persistent MoE kernels' grid at `blocks` (0: as many as are resident), so that tests
/// at small shapes make each block walk several groups and items, as at full size.
fn set_persistent_grid(b: &CudaBackend, blocks: usize) {
    b.set_options(CudaOptions {
        persist_grid: blocks,
        ..b.options()
    });
}

/// Sets the attended keys up to which head_dim-128 decode attention takes its short-span variant
/// (`None`: the default; `Some(0)`: never), so tests cover both variants.
fn set_attn_short_keys(b: &CudaBackend, keys: Option<usize>) {
    b.set_options(CudaOptions {
        attn_short_keys: keys.unwrap_or(CudaOptions::default().attn_short_keys),
        ..b.options()
    });
}

/// Switches the prefill attention on tensor cores (`attn_flash_*`) on or off.
fn set_flash_attention(b: &CudaBackend, on: bool) {
    b.set_options(CudaOptions {
        flash_attention: on,
        ..b.options()
    });
}

fn check_linear(w: LinearWeight, dense: &[f32], label: &str) {
    let b = gpu();
    let (rows, cols) = (w.rows(), w.cols());
    let nvfp4 = w.nvfp4_view().is_some();
    let lin = b.load_linear(label, w).unwrap();
    // 1: decode GEMV; 3, 9, 16 (bf16 and NVFP4 with K % 128 == 0): the few-token tensor-core
    // GEMV `gemv_mt` (9, 16: two token blocks, the second partial at 9), then 3, 9 with it off:
    // `gemm_mma` for bf16 and NVFP4 with K % 32 == 0 (column groups skipped), as at 70, 130
    // (partial token tiles; NVFP4 with K % 64 == 0 on an sm_90 device: `gemm_h16`, also at 300,
    // there also its one-block variant, and at 130 with it off: `gemm_mma`'s f16 path; `gemv_mt`'s
    // one-block variant at 3 and 9, its 16-token grid rows at 9 and 30; NVFP4 at 9 and 30 again on
    // `gemv_mt_wide`, its own K split; NVFP4 at 3, 17 and 32 on `gemm_h16_t32` and at 70 on
    // `gemm_h16` with `h16_few_min` set); else the `linear` kernel
    // below 16 tokens and `gemm_tiled` from 16; 3, 9 and 70 again with both tensor-core paths off
    // (`linear`, `gemm_tiled`)
    let mma_on = b.options();
    let few = mma_on.few_token_max;
    // (h16_few: CudaOptions::h16_few_min, NVFP4 of that many tokens up to 32 on gemm_h16_t32)
    for (t, mma_gemm, few_token_max, h16_gemm, one_block, wide, h16_few) in [
        (1usize, true, few, true, false, false, 0),
        (3, true, few, true, false, false, 0),
        (9, true, few, true, false, false, 0),
        (3, true, few, true, true, false, 0),
        (9, true, few, true, true, false, 0),
        (16, true, few, true, false, false, 0),
        (30, true, few, true, false, false, 0),
        (9, true, few, true, false, true, 0),
        (30, true, few, true, false, true, 0),
        (3, true, few, true, false, false, 2),
        (17, true, few, true, false, false, 9),
        (32, true, few, true, false, false, 17),
        (3, true, 0, true, false, false, 0),
        (9, true, 0, true, false, false, 0),
        (70, true, few, true, false, false, 0),
        (70, true, few, true, false, false, 2),
        (130, true, few, true, false, false, 0),
        (300, true, few, true, false, false, 0),
        (300, true, few, true, true, false, 0),
        (130, true, few, false, false, false, 0),
        (3, false, 0, true, false, false, 0),
        (9, false, 0, true, false, false, 0),
        (70, false, few, true, false, false, 0),
    ] {
        b.set_options(CudaOptions {
            mma_gemm,
            few_token_max,
            h16_gemm,
            h16_one_block: one_block,
            mt_one_block: one_block,
            // (gemv_mt_nv_b1 at 3 and 9 rows; 16 tokens a grid row at 30)
            mt_16_tokens: t == 30 && !wide,
            mt_wide_min_tokens: if wide { 5 } else { 0 },
            h16_few_min: h16_few,
            ..mma_on.clone()
        });
        let x = values(t * cols, 7 + t as u64, 4.0);
        let xt = b.upload(t, cols, &x).unwrap();
        let (wide_before, h16_before) = (b.wide_linears(), b.few_h16_linears());
        let mut got = b.download(&b.linear(&xt, &lin, None).unwrap()).unwrap();
        assert_eq!(
            b.wide_linears() > wide_before,
            wide && nvfp4 && cols % 128 == 0,
            "{label} t={t}: gemv_mt_wide launched or not"
        );
        assert_eq!(
            b.few_h16_linears() > h16_before,
            h16_few > 0 && t <= 32 && nvfp4 && cols % 64 == 0 && b.h16_gemm_runs(),
            "{label} t={t}: gemm_h16_t32 launched or not"
        );
        if t == 1 && CudaBackend::linear_multi_applies(cols) {
            // the same rows by the several-linears-in-one-launch kernel (q/k/v/gate of a decode
            // step): two segments of the same weight, each checked
            let ys = b.linear_multi(&xt, &[&lin, &lin]).unwrap();
            for y in &ys {
                got.extend(b.download(y).unwrap());
            }
        }
        // output row o: token o (and for one token, o > 0: the linear_multi segments)
        for o in 0..got.len() / rows {
            let tok = o % t;
            for r in 0..rows {
                let (mut want, mut mag) = (0f64, 0f64);
                for k in 0..cols {
                    let p = f64::from(dense[r * cols + k]) * f64::from(x[tok * cols + k]);
                    want += p;
                    mag += p.abs();
                }
                let g = f64::from(got[o * rows + r]);
                assert!(
                    (g - want).abs() <= 1e-5 * mag + 1e-6,
                    "{label} t={t} [{tok},{r}] (output {o}): {g} vs {want}"
                );
            }
        }
    }
    // gemv_mt's NVFP4 kernels differ in how many tokens and chunks a grid row holds, not in any
    // token's arithmetic: the same bits
    for t in [2usize, 3, 4, 9, 16, 30] {
        let x = values(t * cols, 70 + t as u64, 4.0);
        let xt = b.upload(t, cols, &x).unwrap();
        let run = |mt_one_block: bool, mt_16_tokens: bool, mt_4_tokens: bool| {
            b.set_options(CudaOptions {
                mt_one_block,
                mt_16_tokens,
                mt_4_tokens,
                // (the deep variants and the interleaved grid are compared with these below)
                mt_deep: false,
                mt_interleave: false,
                ..mma_on.clone()
            });
            b.download(&b.linear(&xt, &lin, None).unwrap()).unwrap()
        };
        // the deep variants (a warp's whole run of chunks in flight, B fetched 3 chunks
        // ahead) where the grid is at most one block a SM (at most 8 tokens: one grid row), and
        // at any grid with `mt_deep_all`, both with 4 tokens a grid row and with 8
        let deep = |mt_4_tokens: bool, mt_deep_all: bool| {
            b.set_options(CudaOptions {
                mt_deep: true,
                mt_deep_all,
                mt_4_tokens,
                ..mma_on.clone()
            });
            let before = b.deep_linears();
            let y = b.download(&b.linear(&xt, &lin, None).unwrap()).unwrap();
            (y, b.deep_linears() > before)
        };
        let two_blocks = run(false, false, false);
        if nvfp4 && cols % 128 == 0 && t >= 5 {
            // gemv_mt_wide (128-row blocks, B in shared memory, K split over blocks): with
            // gemv_mt's K split, gemv_mt_nv's bits (where that split leaves it 4 chunks or fewer)
            // (the output at a fixed K split, gemv_mt_wide on or off, and whether it ran)
            let split = |ks: usize, wide: bool| {
                b.set_options(CudaOptions {
                    mt_k_split: Some(ks),
                    mt_wide_min_tokens: if wide { 5 } else { 0 },
                    mt_deep: false,
                    ..mma_on.clone()
                });
                let before = b.wide_linears();
                let y = b.download(&b.linear(&xt, &lin, None).unwrap()).unwrap();
                (y, b.wide_linears() > before)
            };
            let mut wide_runs = 0;
            for ks in [1usize, 2, 4, 8] {
                let (want, went_wide) = split(ks, false);
                assert!(!went_wide, "{label} t={t}: gemv_mt_wide while off");
                let (got, ran) = split(ks, true);
                if ran {
                    wide_runs += 1;
                    assert_eq!(want, got, "{label} t={t}: gemv_mt_wide, K split {ks}");
                }
            }
            assert!(wide_runs > 0, "{label} t={t}: no gemv_mt_wide launch");
            if cols / 128 >= 16 {
                // 16 splits (two batches of the last block's loads in flight): as close to
                // gemv_mt as another order of the same sums
                let (got, ran) = split(16, true);
                assert!(ran, "{label} t={t}: 16 splits not wide");
                let scale = max_abs(&two_blocks);
                let d = max_abs_diff(&two_blocks, &got);
                assert!(
                    d <= 1e-5 * scale,
                    "{label} t={t}: gemv_mt_wide, 16 splits: {d:e} of {scale}"
                );
            }
        }
        if nvfp4 && cols % 128 == 0 {
            // (a grid has at most one block per 16-row tile)
            let one_wave = t <= 8 && rows.div_ceil(16) <= b.sm_count();
            for (four, all) in [(false, false), (true, false), (false, true), (true, true)] {
                if !(one_wave || all) {
                    continue;
                }
                let (y, ran) = deep(four, all);
                let what = format!("4 tokens a row: {four}, any grid: {all}");
                assert!(ran, "{label} t={t}: no deep gemv_mt launch ({what})");
                assert_eq!(two_blocks, y, "{label} t={t}: deep gemv_mt ({what})");
            }
        }
        assert_eq!(
            two_blocks,
            run(true, false, false),
            "{label} t={t}: gemv_mt_nv_b1"
        );
        if t > 8 {
            // (several grid rows: each block of weight rows' grid rows side by side)
            b.set_options(CudaOptions {
                mt_interleave: true,
                mt_deep: false,
                ..mma_on.clone()
            });
            let interleaved = b.download(&b.linear(&xt, &lin, None).unwrap()).unwrap();
            assert_eq!(
                two_blocks, interleaved,
                "{label} t={t}: gemv_mt interleaved"
            );
            assert_eq!(
                two_blocks,
                run(false, true, false),
                "{label} t={t}: gemv_mt_nv16"
            );
        } else {
            assert_eq!(
                two_blocks,
                run(false, false, true),
                "{label} t={t}: gemv_mt_nv4"
            );
        }
    }
    // a K split's sums added by each tile's last block (`splitk_last`): gemm_splitk_reduce's
    // bits; at 9 tokens (gemm_mma, one tile of tokens) every bf16 / NVFP4 weight of 512+
    // columns splits K; at 70 and 130 NVFP4 runs on gemm_h16 where it can
    for t in [9usize, 70, 130] {
        let x = values(t * cols, 90 + t as u64, 4.0);
        let xt = b.upload(t, cols, &x).unwrap();
        let run = |splitk_last: bool| {
            b.set_options(CudaOptions {
                splitk_last,
                few_token_max: 0,
                ..mma_on.clone()
            });
            let before = b.splitk_last_launches();
            let y = b.download(&b.linear(&xt, &lin, None).unwrap()).unwrap();
            (y, b.splitk_last_launches() > before)
        };
        let (want, ran_off) = run(false);
        assert!(!ran_off, "{label} t={t}: splits added by tiles while off");
        let (got, ran) = run(true);
        if t == 9 {
            let splits = !label.starts_with("f32") && cols % 32 == 0 && cols >= 512;
            assert_eq!(
                ran, splits,
                "{label} t={t}: splits added by the tiles' last blocks"
            );
        }
        if ran {
            assert_eq!(
                want, got,
                "{label} t={t}: splits added by the tiles' last blocks"
            );
        }
    }
    b.set_options(mma_on);
    println!("{label}: ok");
}

#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-tests.sh)"]
fn gpu_linear_kernels_match_f64_matmul() {
    for (rows, cols) in [
        (1024, 3072),
        (3072, 1024),
        (100, 96),
        (37, 80),
        (300, 1040),
        (5, 16),
        (40, 1152),
        (256, 256),
    ] {
        let w = values(rows * cols, rows as u64 * 31 + cols as u64, 0.2);
        let bits: Vec<u16> = w
            .iter()
            .map(|x| half::bf16::from_f32(*x).to_bits())
            .collect();
        let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
        let q = quantize(&WeightView::new("w", SourceDtype::Bf16, rows, cols, &bytes).unwrap())
            .unwrap();
        let dense = dequantize_f32(&Nvfp4View::of(&q));
        check_linear(
            LinearWeight::from_nvfp4(&q, None),
            &dense,
            &format!("nvfp4 {rows}x{cols}"),
        );
        let bf: Vec<f32> = bits
            .iter()
            .map(|b| half::bf16::from_bits(*b).to_f32())
            .collect();
        check_linear(
            LinearWeight::from_bf16_bits(rows, cols, &bits),
            &bf,
            &format!("bf16 {rows}x{cols}"),
        );
        check_linear(
            LinearWeight::from_f32(rows, cols, &w),
            &w,
            &format!("f32 {rows}x{cols}"),
        );
    }
}

/// The element-wise ops of [`Backend`] on host data, for comparing backends op by op: each
/// uploads its operands, runs the op and downloads the result.
trait ElementwiseOn {
    fn rms_norm_of(&self, rows: usize, cols: usize, x: &[f32], w: &[f32], width: usize)
        -> Vec<f32>;
    /// `Backend::norm_rope` of `x` (`[rows, cols]`; `norm`: the per-head norm's weight, eps
    /// 1e-6).
    fn norm_rope_of(
        &self,
        x: (usize, usize, &[f32]),
        norm: Option<&[f32]>,
        spec: &fp4forge_engine::rope::RopeSpec,
        head_dim: usize,
        pos0: usize,
    ) -> Vec<f32>;
    fn softplus_gate_of(
        &self,
        rows: usize,
        heads: usize,
        group: usize,
        x: &[f32],
        gate: &[f32],
    ) -> Vec<f32>;
    fn add_scaled_of(&self, rows: usize, cols: usize, y: &[f32], alpha: f32, x: &[f32])
        -> Vec<f32>;
}

impl<B: Backend> ElementwiseOn for B {
    fn rms_norm_of(
        &self,
        rows: usize,
        cols: usize,
        x: &[f32],
        w: &[f32],
        width: usize,
    ) -> Vec<f32> {
        let x = self.upload(rows, cols, x).unwrap();
        let w = self.upload(1, width, w).unwrap();
        self.download(&self.rms_norm(&x, &w, 1e-6, width).unwrap())
            .unwrap()
    }

    fn norm_rope_of(
        &self,
        (rows, cols, x): (usize, usize, &[f32]),
        norm: Option<&[f32]>,
        spec: &fp4forge_engine::rope::RopeSpec,
        head_dim: usize,
        pos0: usize,
    ) -> Vec<f32> {
        let mut x = self.upload(rows, cols, x).unwrap();
        let w = norm.map(|w| self.upload(1, head_dim, w).unwrap());
        let rope = self.load_rope(spec).unwrap();
        self.norm_rope(&mut x, w.as_ref(), 1e-6, &rope, (head_dim, pos0))
            .unwrap();
        self.download(&x).unwrap()
    }

    fn softplus_gate_of(
        &self,
        rows: usize,
        heads: usize,
        group: usize,
        x: &[f32],
        gate: &[f32],
    ) -> Vec<f32> {
        let mut x = self.upload(rows, heads * group, x).unwrap();
        self.softplus_gate(&mut x, &self.upload(rows, heads, gate).unwrap())
            .unwrap();
        self.download(&x).unwrap()
    }

    fn add_scaled_of(
        &self,
        rows: usize,
        cols: usize,
        y: &[f32],
        alpha: f32,
        x: &[f32],
    ) -> Vec<f32> {
        let mut y = self.upload(rows, cols, y).unwrap();
        self.add_scaled(&mut y, alpha, &self.upload(rows, cols, x).unwrap())
            .unwrap();
        self.download(&y).unwrap()
    }
}

/// A prefill's element-wise ops and residual adds, GPU vs CPU, at the shapes each kernel variant
/// takes: RMSNorm of narrow groups (per-head q/k norms: a warp each) and wide ones (hidden
/// states: a block each, also widths not a multiple of 4), rope (full and partial rotary slices,
/// the widest one the kernel takes) and the per-head norm and rope in one pass (`norm_rope`:
/// also bit for bit against the norm, then the rope), the softplus gate and `add_scaled` (four values a thread as
/// a float4 and element by element), `linears` of three NVFP4 weights sharing their rows' scales
/// and f16 parts (bit for bit against `linear` of each, and against the CPU), `linear_add` (the
/// add in the GEMM's epilogue; also against `linear` + `add_scaled` on the GPU) and
/// `gated_linear_add` (bit for bit against `softplus_gate` + `linear_add` on the GPU).
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-tests.sh)"]
fn gpu_elementwise_ops_and_residual_adds_match_cpu() {
    let gpu = gpu();
    let cpu = CpuBackend::new();
    let close = |label: &str, g: &[f32], c: &[f32], tol: f32| {
        let worst = max_abs_diff(g, c);
        println!("{label}: max |gpu - cpu| {worst:.3e}");
        assert!(worst <= tol * (1.0 + max_abs(c)), "{label}: {worst}");
    };
    for (rows, cols, width) in [
        (37usize, 64 * 128, 128usize),
        (9, 48, 16),
        (3, 1024, 512),
        (5, 2048, 2048),
        (4, 60, 6),
        (3, 1000, 1000),
    ] {
        let x = values(rows * cols, (rows * cols + width) as u64, 6.0);
        let w = values(width, width as u64, 2.0);
        let norm = |b: &dyn ElementwiseOn| b.rms_norm_of(rows, cols, &x, &w, width);
        let label = format!("rms_norm {rows}x{cols} width {width}");
        close(&label, &norm(&gpu), &norm(&cpu), 1e-6);
    }
    for (t, heads, hd, rdim, pos0) in [
        (7usize, 64usize, 128usize, 128usize, 0usize),
        (5, 48, 128, 64, 9000),
        (4, 3, 16, 8, 3),
        (3, 2, 512, 512, 100_000),
    ] {
        let spec = fp4forge_engine::rope::RopeSpec {
            inv_freq: fp4forge_engine::rope::default_inv_freq(10_000.0, rdim),
            rotary_dim: rdim,
            attention_factor: 1.25,
        };
        let x = values(t * heads * hd, (t * heads + rdim) as u64, 4.0);
        let w = values(hd, hd as u64 + 5, 2.0);
        let label = format!("{t} rows, {heads} heads of {hd}, rotary {rdim}, from {pos0}");
        let rope = |b: &dyn ElementwiseOn, norm| {
            b.norm_rope_of((t, heads * hd, &x), norm, &spec, hd, pos0)
        };
        close(
            &format!("rope {label}"),
            &rope(&gpu, None),
            &rope(&cpu, None),
            1e-6,
        );
        let fused = rope(&gpu, Some(&w));
        close(
            &format!("norm_rope {label}"),
            &fused,
            &rope(&cpu, Some(&w)),
            1e-6,
        );
        // the norm and the rope in one pass give the bits of the norm, then the rope
        let normed = gpu.rms_norm_of(t, heads * hd, &x, &w, hd);
        let apart = gpu.norm_rope_of((t, heads * hd, &normed), None, &spec, hd, pos0);
        assert!(
            fused
                .iter()
                .zip(&apart)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "norm_rope {label}: not the bits of rms_norm then rope"
        );
    }
    for (rows, heads, group) in [(6usize, 64usize, 128usize), (5, 3, 6), (3, 7, 4)] {
        let x = values(rows * heads * group, (heads * group) as u64, 4.0);
        // (gates from -30 to 30: both sides of softplus' threshold of 20)
        let gate = values(rows * heads, group as u64, 60.0);
        let gated = |b: &dyn ElementwiseOn| b.softplus_gate_of(rows, heads, group, &x, &gate);
        let label = format!("softplus_gate {rows}x{heads} groups of {group}");
        close(&label, &gated(&gpu), &gated(&cpu), 1e-6);
    }
    for (rows, cols) in [(3usize, 5usize), (4, 64), (1, 7)] {
        let y = values(rows * cols, cols as u64, 3.0);
        let x = values(rows * cols, rows as u64 + 99, 3.0);
        let add = |b: &dyn ElementwiseOn| b.add_scaled_of(rows, cols, &y, 0.5, &x);
        close(
            &format!("add_scaled {rows}x{cols}"),
            &add(&gpu),
            &add(&cpu),
            1e-7,
        );
    }
    // q/k/v-like NVFP4 weights at the row counts of a few-token step and of prefills (40:
    // gemm_mma; 300: gemm_h16 where the device runs it, x's f16 parts shared too, all three in
    // one launch: row counts that end inside a 128-row tile, so segments' last tiles are partial)
    let (k, outs) = (256usize, [300usize, 100, 72]);
    let ws: Vec<LinearWeight> = outs
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let bits = bf16_bits(n * k, 500 + i as u64);
            let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
            let view = WeightView::new("w", SourceDtype::Bf16, n, k, &bytes).unwrap();
            LinearWeight::from_nvfp4(&quantize(&view).unwrap(), None)
        })
        .collect();
    let (gl, cl) = (loaded(&gpu, &ws), loaded(&cpu, &ws));
    for t in [3usize, 40, 300] {
        let x = values(t * k, t as u64, 8.0);
        let (gx, cx) = (gpu.upload(t, k, &x).unwrap(), cpu.upload(t, k, &x).unwrap());
        let parts: Vec<_> = gl.iter().map(|w| (w, None)).collect();
        let together = gpu.linears(&gx, &parts).unwrap();
        for (i, (w, c)) in gl.iter().zip(&cl).enumerate() {
            let alone = gpu.download(&gpu.linear(&gx, w, None).unwrap()).unwrap();
            let both = gpu.download(&together[i]).unwrap();
            assert_eq!(alone, both, "linears vs linear, {t} rows, weight {i}");
            let want = cpu.download(&cpu.linear(&cx, c, None).unwrap()).unwrap();
            close(&format!("linears {t} rows, weight {i}"), &both, &want, 1e-5);
        }
        let n = outs[0];
        let y = values(t * n, t as u64 + 7, 5.0);
        let mut fused = gpu.upload(t, n, &y).unwrap();
        gpu.linear_add(&mut fused, &gx, &gl[0], None).unwrap();
        let mut apart = gpu.upload(t, n, &y).unwrap();
        let h = gpu.linear(&gx, &gl[0], None).unwrap();
        gpu.add_scaled(&mut apart, 1.0, &h).unwrap();
        let fused = gpu.download(&fused).unwrap();
        // (the epilogue may fuse the scale and the add: one rounding instead of two)
        let apart = gpu.download(&apart).unwrap();
        close(
            &format!("linear_add vs linear + add, {t} rows"),
            &fused,
            &apart,
            1e-6,
        );
        let mut c = cpu.upload(t, n, &y).unwrap();
        cpu.linear_add(&mut c, &cx, &cl[0], None).unwrap();
        close(
            &format!("linear_add {t} rows"),
            &fused,
            &cpu.download(&c).unwrap(),
            1e-5,
        );
        // the gated projection (4 gate values a row, each over 64 columns; at 300 rows the gate
        // applied inside x's split on gemm_h16): the same bits as softplus_gate + linear_add
        let g = values(t * 4, t as u64 + 9, 3.0);
        let gated = |b: &CudaBackend| {
            let mut out = b.upload(t, n, &y).unwrap();
            let gate = b.upload(t, 4, &g).unwrap();
            b.gated_linear_add(&mut out, b.upload(t, k, &x).unwrap(), &gate, &gl[0], None)
                .unwrap();
            b.download(&out).unwrap()
        };
        let fused = gated(&gpu);
        let mut apart = gpu.upload(t, n, &y).unwrap();
        let mut gx2 = gpu.upload(t, k, &x).unwrap();
        gpu.softplus_gate(&mut gx2, &gpu.upload(t, 4, &g).unwrap())
            .unwrap();
        gpu.linear_add(&mut apart, &gx2, &gl[0], None).unwrap();
        assert_eq!(
            fused,
            gpu.download(&apart).unwrap(),
            "gated_linear_add vs softplus_gate + linear_add, {t} rows"
        );
        let mut c = cpu.upload(t, n, &y).unwrap();
        cpu.gated_linear_add(
            &mut c,
            cx.clone(),
            &cpu.upload(t, 4, &g).unwrap(),
            &cl[0],
            None,
        )
        .unwrap();
        close(
            &format!("gated_linear_add {t} rows"),
            &fused,
            &cpu.download(&c).unwrap(),
            1e-5,
        );
    }
}

/// `n` bf16 values (as bits) of weight scale, from `seed`.
fn bf16_bits(n: usize, seed: u64) -> Vec<u16> {
    values(n, seed, 0.2)
        .iter()
        .map(|x| half::bf16::from_f32(*x).to_bits())
        .collect()
}

/// `ws` resident on `b`.
fn loaded<B: Backend>(b: &B, ws: &[LinearWeight]) -> Vec<B::Linear> {
    ws.iter()
        .map(|w| b.load_linear("w", w.clone()).unwrap())
        .collect()
}

/// `x_split_h16` (a prompt's x split into `gemm_h16`'s f16 parts and their row scales) gives
/// the same bits at 1, 2, 4 and 8 warps a row and at the device's own pick
/// (`CudaOptions::split_row_warps` 0): NVFP4 linears of 70 and 130 tokens over rows of 256,
/// 2,304 (beyond a warp's registers: read twice at one warp a row, once at two) and 8,192
/// values, and the gated projection (the gate applied inside the split).
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-tests.sh)"]
fn gpu_x_split_warps_change_no_bit() {
    let gpu = gpu();
    if !gpu.h16_gemm_runs() {
        println!("gemm_h16 does not run on this device: nothing to compare");
        return;
    }
    let defaults = gpu.options();
    let n = 64;
    for (k, tokens) in [
        (256usize, &[70usize, 130][..]),
        (2304, &[70]),
        (8192, &[70]),
    ] {
        let bits = bf16_bits(n * k, 900 + k as u64);
        let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
        let view = WeightView::new("w", SourceDtype::Bf16, n, k, &bytes).unwrap();
        let w = loaded(
            &gpu,
            &[LinearWeight::from_nvfp4(&quantize(&view).unwrap(), None)],
        )
        .remove(0);
        for &t in tokens {
            let x = values(t * k, 31 + t as u64, 8.0);
            let g = values(t * 4, 57 + t as u64, 3.0);
            let zeros = vec![0.0f32; t * n];
            let run = |wpr: usize| {
                gpu.set_options(CudaOptions {
                    split_row_warps: wpr,
                    ..defaults.clone()
                });
                let gx = gpu.upload(t, k, &x).unwrap();
                let plain = gpu.download(&gpu.linear(&gx, &w, None).unwrap()).unwrap();
                let mut out = gpu.upload(t, n, &zeros).unwrap();
                let gate = gpu.upload(t, 4, &g).unwrap();
                gpu.gated_linear_add(&mut out, gx, &gate, &w, None).unwrap();
                (plain, gpu.download(&out).unwrap())
            };
            let one = run(1);
            assert!(one.0.iter().chain(&one.1).all(|v| v.is_finite()));
            assert!(one.0 != one.1, "the gate changes the projection");
            let differ = |a: &[f32], b: &[f32]| a.iter().zip(b).filter(|(x, y)| x != y).count();
            for wpr in [2, 4, 8, 0] {
                let got = run(wpr);
                for (what, a, b) in [("linear", &got.0, &one.0), ("gated", &got.1, &one.1)] {
                    assert!(
                        a == b,
                        "{what}, k {k}, {t} tokens, {wpr} warps a row: {} of {} values differ",
                        differ(a, b),
                        b.len()
                    );
                }
            }
            println!(
                "x_split_h16, k {k}, {t} tokens: the same bits at 1, 2, 4, 8 warps a row and {} (the device's pick)",
                gpu.split_row_warps(t, k)
            );
        }
    }
    gpu.set_options(defaults);
}

/// A prompt's bf16 weights of one input (the MoE router and the shared expert's gate and up: 256,
/// 1,024 and 1,024 rows) in one `gemm_mma_segs` launch (`CudaOptions::mma_merged`), none split
/// over K, where each alone splits K: each output against `linear` of its weight alone on the GPU
/// (a K split: another summation order) and against the CPU; and with the option off, not
/// merged.
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-tests.sh)"]
fn gpu_merged_bf16_linears_match_each_alone() {
    let gpu = gpu();
    let cpu = CpuBackend::new();
    let (t, k) = (1100usize, 512usize);
    let ws: Vec<LinearWeight> = [256usize, 1024, 1024]
        .iter()
        .enumerate()
        .map(|(i, &n)| LinearWeight::from_bf16_bits(n, k, &bf16_bits(n * k, 900 + i as u64)))
        .collect();
    let (gl, cl) = (loaded(&gpu, &ws), loaded(&cpu, &ws));
    let x = values(t * k, 77, 4.0);
    let (gx, cx) = (gpu.upload(t, k, &x).unwrap(), cpu.upload(t, k, &x).unwrap());
    let parts: Vec<_> = gl.iter().map(|w| (w, None)).collect();
    let defaults = gpu.options();
    for merged in [true, false] {
        gpu.set_options(CudaOptions {
            mma_merged: merged,
            ..defaults.clone()
        });
        let before = gpu.merged_bf16_linears();
        let together = gpu.linears(&gx, &parts).unwrap();
        assert_eq!(
            gpu.merged_bf16_linears() - before,
            if merged { 3 } else { 0 },
            "merged {merged}: linears in gemm_mma_segs"
        );
        for (i, (w, c)) in gl.iter().zip(&cl).enumerate() {
            let both = gpu.download(&together[i]).unwrap();
            let alone = gpu.download(&gpu.linear(&gx, w, None).unwrap()).unwrap();
            let want = cpu.download(&cpu.linear(&cx, c, None).unwrap()).unwrap();
            for (label, other) in [("linear alone", &alone), ("the CPU", &want)] {
                let worst = max_abs_diff(&both, other);
                println!("merged {merged}, weight {i}: max |linears - {label}| {worst:.3e}");
                assert!(
                    worst <= 1e-5 * (1.0 + max_abs(other)),
                    "merged {merged}, weight {i} vs {label}: {worst}"
                );
            }
        }
    }
    gpu.set_options(defaults);
}

/// NVFP4 routed experts (gate/up, down, weighted sum) through the `Backend` trait, GPU vs CPU, at a
/// shape where K % 128 == 0 (hidden 256, inter 128: the tensor-core decode path), one where it
/// is not (hidden 96) and one of 40 experts: 1 to 3,000 tokens, top-3 of sigmoid-scored experts.
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-tests.sh)"]
fn gpu_nvfp4_experts_match_cpu() {
    use fp4forge_engine::{ExpertWeights, RouterParams, RouterScoring};
    let gpu = gpu();
    let cpu = CpuBackend::new();
    let nvfp4 = |rows: usize, cols: usize, seed: u64| {
        let w = values(rows * cols, seed, 0.2);
        let bytes: Vec<u8> = w
            .iter()
            .flat_map(|x| half::bf16::from_f32(*x).to_bits().to_le_bytes())
            .collect();
        let q = quantize(&WeightView::new("w", SourceDtype::Bf16, rows, cols, &bytes).unwrap())
            .unwrap();
        LinearWeight::from_nvfp4(&q, None)
    };
    // (40 experts: moe_align's prefix sums across warps)
    for (hidden, inter, n) in [(256usize, 128usize, 8usize), (96, 64, 8), (256, 64, 40)] {
        let make = || {
            (0..n as u64)
                .map(|e| ExpertWeights {
                    gate: nvfp4(inter, hidden, 100 + e),
                    up: nvfp4(inter, hidden, 200 + e),
                    down: nvfp4(hidden, inter, 300 + e),
                })
                .collect::<Vec<_>>()
        };
        let ge = gpu.load_experts("experts", make()).unwrap();
        let ce = cpu.load_experts("experts", make()).unwrap();
        let params = RouterParams {
            top_k: 3,
            scoring: RouterScoring::Sigmoid,
            normalize: true,
            logit_softcap: 0.0,
        };
        // (grid 0: as many persistent blocks as are resident, i.e. one group each at these
        // shapes; 5: each block walks several groups and items, as at full size)
        // (3, 10 tokens at hidden 256: grouped a few items per tile, 10 x 3 items = several
        // tiles for some experts; 40, 200 tokens: grouped by expert on the tiled GEMM, 200 x 3
        // items = several tiles per expert, the last partial, at hidden 256 on sm_90 on
        // gemm_h16's core; each also compared with the per-item kernels, and 40, 200 with the
        // grouped kernels of gemm_mma's core)
        // (3000 tokens: 9,000 items, more than moe_align's first round of loads)
        // (the few-items path from 2 tokens here, whatever its default threshold; no L2
        // prefetch but where a comparison below turns it on for every row count)
        gpu.set_options(CudaOptions {
            few_moe_min_tokens: 2,
            l2_prefetch_rows: 0,
            ..gpu.options()
        });
        for (t, grid) in [
            (1usize, 0usize),
            (1, 5),
            (3, 0),
            (10, 0),
            (40, 0),
            (200, 0),
            (3000, 0),
        ] {
            set_persistent_grid(&gpu, grid);
            let x = values(t * hidden, 11 + t as u64, 3.0);
            let logits = values(t * n, 17 + t as u64, 2.0);
            let got = route_and_experts(&gpu, &ge, &params, t, &x, &logits);
            let want = route_and_experts(&cpu, &ce, &params, t, &x, &logits);
            let scale = max_abs(&want);
            let d = max_abs_diff(&got, &want);
            println!(
                "experts hidden {hidden} inter {inter} t {t} grid {grid}: max |Δ| {d:.3e} (max |y| {scale:.3})"
            );
            assert!(
                d <= 1e-4 * scale.max(1.0),
                "hidden {hidden} t {t} grid {grid}: {d} vs scale {scale}"
            );
            if t >= 2 {
                // (per item on `experts_gate_up2` / `experts_down2`, the kernels with the shared
                // expert's CUDA-core path: the tensor-core-only ones are compared below)
                gpu.set_options(CudaOptions {
                    grouped_moe: false,
                    item_tc: false,
                    gate_up_tc: false,
                    ..gpu.options()
                });
                let per_item = route_and_experts(&gpu, &ge, &params, t, &x, &logits);
                // (the down projection's four-blocks-a-SM kernel: the same arithmetic)
                gpu.set_options(CudaOptions {
                    down_four_blocks: true,
                    ..gpu.options()
                });
                let four = route_and_experts(&gpu, &ge, &params, t, &x, &logits);
                assert_eq!(four, per_item, "per-item down at four blocks a SM, t {t}");
                // (and in blocks of eight warps: the same arithmetic per row)
                gpu.set_options(CudaOptions {
                    down_four_blocks: false,
                    down_eight_warps: true,
                    ..gpu.options()
                });
                let eight = route_and_experts(&gpu, &ge, &params, t, &x, &logits);
                assert_eq!(
                    eight, per_item,
                    "per-item down in blocks of eight warps, t {t}"
                );
                // (the tensor-core-only kernels where they apply, the down projection's at inter
                // % 128 == 0, the gate/up's at hidden % 128 == 0: the same arithmetic)
                gpu.set_options(CudaOptions {
                    down_eight_warps: false,
                    item_tc: true,
                    gate_up_tc: true,
                    ..gpu.options()
                });
                let before = gpu.tc_item_launches();
                let tc = route_and_experts(&gpu, &ge, &params, t, &x, &logits);
                assert_eq!(
                    gpu.tc_item_launches() - before,
                    usize::from(inter % 128 == 0) + usize::from(hidden % 128 == 0),
                    "tensor-core-only launches, hidden {hidden} inter {inter}"
                );
                assert_eq!(
                    tc, per_item,
                    "per-item on the tensor-core-only kernels, t {t}"
                );
                gpu.set_options(CudaOptions {
                    item_tc: CudaOptions::default().item_tc,
                    gate_up_tc: CudaOptions::default().gate_up_tc,
                    ..gpu.options()
                });
                // (the gate/up blocks prefetching the items' down weights into L2: a hint, the
                // same results; the top-k's own prefetch runs in the batched-step test below)
                gpu.set_options(CudaOptions {
                    down_eight_warps: false,
                    l2_prefetch_rows: 1,
                    ..gpu.options()
                });
                let prefetched = route_and_experts(&gpu, &ge, &params, t, &x, &logits);
                assert_eq!(prefetched, per_item, "per-item with L2 prefetch, t {t}");
                // (grouped: a few items per tile with each block prefetching the weights of the
                // block a wave later, or the tiled GEMMs, which do not prefetch)
                gpu.set_options(CudaOptions {
                    grouped_moe: true,
                    ..gpu.options()
                });
                let grouped_prefetched = route_and_experts(&gpu, &ge, &params, t, &x, &logits);
                assert_eq!(grouped_prefetched, got, "grouped with L2 prefetch, t {t}");
                gpu.set_options(CudaOptions {
                    l2_prefetch_rows: 0,
                    ..gpu.options()
                });
                let d = max_abs_diff(&got, &per_item);
                println!("  grouped vs per-item kernels: max |Δ| {d:.3e}");
                assert!(d <= 1e-4 * scale.max(1.0), "grouped vs per-item t {t}: {d}");
                if hidden % 128 == 0 && inter % 128 == 0 && t * 3 <= 4 * n {
                    // a few items per tile (hidden and inter multiples of 128: inter 64 runs
                    // grouped on the tiled GEMM): the per-item tensor-core arithmetic, bit for bit
                    assert_eq!(d, 0.0, "few items per tile vs per-item t {t}");
                    // (and at three blocks a SM, 2 chunk slots a lane, the default, against two
                    // blocks a SM at 4: the same arithmetic; grids of a half and a quarter of the
                    // tiles bound, so that blocks take several tiles each; on tiles of 4 items,
                    // which these variants are)
                    for (three, divisor) in [(false, 2), (true, 4), (false, 4)] {
                        gpu.set_options(CudaOptions {
                            few_three_blocks: three,
                            few_grid_divisor: divisor,
                            few_tile8_items: 0,
                            ..gpu.options()
                        });
                        let before = gpu.few_b3_launches();
                        let variant = route_and_experts(&gpu, &ge, &params, t, &x, &logits);
                        assert_eq!(
                            gpu.few_b3_launches() - before,
                            2 * usize::from(three),
                            "few-items-per-tile launches at three blocks a SM, t {t}"
                        );
                        assert_eq!(
                            variant, got,
                            "few items per tile, three blocks a SM {three}, grid 1/{divisor}, t {t}"
                        );
                    }
                    gpu.set_options(CudaOptions {
                        few_three_blocks: CudaOptions::default().few_three_blocks,
                        few_grid_divisor: CudaOptions::default().few_grid_divisor,
                        few_tile8_items: CudaOptions::default().few_tile8_items,
                        ..gpu.options()
                    });
                }
                if hidden % 128 == 0 && inter % 128 == 0 && (t * 3 <= 4 * n || t == 40) {
                    // tiles of up to 8 items (two column groups of the mma), at the few-items
                    // kernels' counts (10 tokens: some experts hold more than 4 items) and at
                    // 15 items per expert (40 tokens, taken off the tiled GEMM): the per-item
                    // tensor-core arithmetic, bit for bit, as tiles of 4
                    gpu.set_options(CudaOptions {
                        few_items_per_expert: 16,
                        few_tile8_items: 0,
                        ..gpu.options()
                    });
                    let four = route_and_experts(&gpu, &ge, &params, t, &x, &logits);
                    gpu.set_options(CudaOptions {
                        few_tile8_items: 1,
                        ..gpu.options()
                    });
                    let before = gpu.few_tile8_launches();
                    let eight = route_and_experts(&gpu, &ge, &params, t, &x, &logits);
                    assert_eq!(
                        gpu.few_tile8_launches() - before,
                        2,
                        "launches on tiles of 8 items, t {t}"
                    );
                    assert_eq!(four, per_item, "few items per tile of 4 vs per-item t {t}");
                    assert_eq!(eight, per_item, "few items per tile of 8 vs per-item t {t}");
                    gpu.set_options(CudaOptions {
                        few_items_per_expert: CudaOptions::default().few_items_per_expert,
                        few_tile8_items: CudaOptions::default().few_tile8_items,
                        ..gpu.options()
                    });
                }
            }
            if t >= 40 {
                // grouped on gemm_h16's core (hidden 256 on sm_90) vs on gemm_mma's
                gpu.set_options(CudaOptions {
                    h16_gemm: false,
                    ..gpu.options()
                });
                let mma = route_and_experts(&gpu, &ge, &params, t, &x, &logits);
                gpu.set_options(CudaOptions {
                    h16_gemm: true,
                    ..gpu.options()
                });
                let d = max_abs_diff(&got, &mma);
                println!("  grouped, h16 core vs mma kernels: max |Δ| {d:.3e}");
                assert!(d <= 1e-4 * scale.max(1.0), "h16 vs mma grouped t {t}: {d}");
            }
        }
        set_persistent_grid(&gpu, 0);
        // a token whose router logits are NaN (activations gone NaN upstream): valid experts
        // with NaN weights, so its output is NaN as on the CPU, the other tokens' unchanged,
        // and no item reads past the experts (one token: the persistent kernels; 3: a few per
        // tile; 40: grouped)
        for t in [1usize, 3, 40] {
            let x = values(t * hidden, 31 + t as u64, 3.0);
            let mut logits = values(t * n, 37 + t as u64, 2.0);
            let bad = t / 2;
            logits[bad * n..(bad + 1) * n].fill(f32::NAN);
            let got = route_and_experts(&gpu, &ge, &params, t, &x, &logits);
            let want = route_and_experts(&cpu, &ce, &params, t, &x, &logits);
            for tok in 0..t {
                let (g, w) = (
                    &got[tok * hidden..(tok + 1) * hidden],
                    &want[tok * hidden..(tok + 1) * hidden],
                );
                if tok == bad {
                    assert!(g.iter().all(|v| v.is_nan()), "t {t}: NaN-routed token");
                    assert!(w.iter().all(|v| v.is_nan()), "t {t}: the CPU's NaN token");
                } else {
                    let d = max_abs_diff(g, w);
                    assert!(d <= 1e-4 * max_abs(w).max(1.0), "t {t} token {tok}: {d}");
                }
            }
        }
        gpu.set_options(CudaOptions {
            few_moe_min_tokens: CudaOptions::default().few_moe_min_tokens,
            ..gpu.options()
        });
    }
}

/// The experts' output for tokens `x` routed by `logits` (top-k scaled by 2.5) on backend `b`.
fn route_and_experts<B: Backend>(
    b: &B,
    experts: &B::Experts,
    params: &fp4forge_engine::RouterParams,
    t: usize,
    x: &[f32],
    logits: &[f32],
) -> Vec<f32> {
    let r = b
        .route(
            &b.upload(t, logits.len() / t, logits).unwrap(),
            None,
            params,
            2.5,
        )
        .unwrap();
    let xt = b.upload(t, x.len() / t, x).unwrap();
    b.download(&b.experts(&xt, &r, experts).unwrap()).unwrap()
}

/// Attention through the `Backend` trait, GPU vs CPU, on bf16 and fp8 caches (fp8 with k/v scales)
/// at the shapes the decode kernel specialises (head_dim 64 and 128, 3 and 6 query heads per kv
/// head), full and sliding (window 512): a prefill in chunks to ~2,100 positions, then decode.
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-tests.sh)"]
fn gpu_attention_matches_cpu_on_bf16_and_fp8_caches() {
    let gpu = gpu();
    let cpu = CpuBackend::new();
    let caches = [(KvDtype::Bf16, 1.0, 1.0), (KvDtype::Fp8E4m3, 0.05, 0.02)];
    // (head_dim 128 decode steps over bf16 caches: the short-span kernel variant by default,
    // the occupancy-capped one with the threshold at 0)
    for (heads, kvh, d, short_keys) in [
        (48usize, 8usize, 128usize, None),
        (48, 8, 128, Some(0usize)),
        (9, 3, 64, None),
        (6, 2, 128, None),
    ] {
        set_attn_short_keys(&gpu, short_keys);
        for (window, (dtype, k_scale, v_scale)) in [None, Some(512usize)]
            .into_iter()
            .flat_map(|w| caches.map(|c| (w, c)))
        {
            let spec = fp4forge_engine::KvLayerSpec {
                kv_heads: kvh,
                head_dim: d,
                window,
                dtype,
                k_scale,
                v_scale,
            };
            let p = fp4forge_engine::AttentionParams {
                heads,
                kv_heads: kvh,
                head_dim: d,
                scale: 1.0 / (d as f32).sqrt(),
            };
            let mut gc = gpu.new_kv_layer(&spec).unwrap();
            let mut cc = cpu.new_kv_layer(&spec).unwrap();
            let (mut pos, mut worst) = (0usize, 0f32);
            let chunks = [512usize, 512, 512, 512, 70, 1, 1, 1, 1, 1, 1, 1, 1];
            for (i, &t) in chunks.iter().enumerate() {
                let seed = (heads * 1000 + d + i) as u64 + window.unwrap_or(0) as u64;
                let q = values(t * heads * d, seed, 4.0);
                let k = values(t * kvh * d, seed + 1, 4.0);
                let v = values(t * kvh * d, seed + 2, 2.0);
                let go = gpu
                    .attention(
                        &gpu.upload(t, heads * d, &q).unwrap(),
                        &gpu.upload(t, kvh * d, &k).unwrap(),
                        &gpu.upload(t, kvh * d, &v).unwrap(),
                        &mut gc,
                        &p,
                    )
                    .unwrap();
                let co = cpu
                    .attention(
                        &cpu.upload(t, heads * d, &q).unwrap(),
                        &cpu.upload(t, kvh * d, &k).unwrap(),
                        &cpu.upload(t, kvh * d, &v).unwrap(),
                        &mut cc,
                        &p,
                    )
                    .unwrap();
                let (g, c) = (gpu.download(&go).unwrap(), cpu.download(&co).unwrap());
                for (a, b) in g.iter().zip(&c) {
                    worst = worst.max((a - b).abs());
                }
                pos += t;
            }
            println!("attention {dtype:?} heads {heads}/{kvh} d {d} window {window:?} short-span threshold {short_keys:?}: {pos} positions, max |gpu - cpu| {worst:.3e}");
            assert!(
                worst < 1e-4,
                "{dtype:?} heads {heads}/{kvh} d {d} window {window:?}: {worst}"
            );
        }
    }
    set_attn_short_keys(&gpu, None);
}

/// Decode attention of several sequences in one pass (`Backend::attention_chunks` over one-token
/// chunks: the rope, the attention and the append in one `attn_dec_batch` launch, on the CUDA-core
/// kernels: `CudaOptions::attn_mma` 0) gives what the CPU backend gives (1e-4, as above), step
/// after step over the rows the batch appended: bf16 and fp8 caches (fp8 with k/v scales),
/// head_dim 64 and 128, full and sliding (a 64-key ring that some sequences have wrapped and
/// others not), sequences at 1 to 300 positions. With
/// `CudaOptions::attn_g8` (a kv head's whole group of query heads in one block) the outputs of
/// head_dim 128 are the same bits as without (the same key splits), also at Laguna-XS's 6 and 8
/// query heads per kv head (two blocks of at most 4 without it), and the `_g8` kernels ran; with
/// `CudaOptions::attn_mma` (the tensor-core kernels) the outputs of head_dim 128 are the CPU's
/// within the same bound, and those kernels ran.
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-tests.sh)"]
fn gpu_batched_decode_attention_matches_cpu_on_bf16_and_fp8_caches() {
    let gpu = gpu();
    let cpu = CpuBackend::new();
    // (the CUDA-core kernels first; the tensor-core ones below)
    let original = gpu.options();
    let defaults = CudaOptions {
        attn_mma: 0,
        ..original.clone()
    };
    gpu.set_options(defaults.clone());
    let lens = [1usize, 17, 70, 130, 300];
    let s = lens.len();
    let [bf16, fp8] = FLASH_CACHES;
    for ((heads, kvh, d), window, cache) in [
        ((9usize, 3usize, 64usize), None, bf16),
        ((9, 3, 64), Some(64usize), fp8),
        ((6, 2, 128), None, fp8),
        ((6, 2, 128), Some(64), bf16),
        ((6, 2, 128), Some(64), fp8),
        ((48, 8, 128), None, bf16),
        ((64, 8, 128), Some(64), fp8),
    ] {
        let (spec, p) = flash_spec((heads, kvh, d), window, cache);
        let dtype = cache.0;
        let rope = fp4forge_engine::rope::RopeSpec {
            inv_freq: fp4forge_engine::rope::default_inv_freq(10_000.0, d / 2),
            rotary_dim: d / 2,
            attention_factor: 1.0,
        };
        let (grope, crope) = (gpu.load_rope(&rope).unwrap(), cpu.load_rope(&rope).unwrap());
        let label = format!("{dtype:?} heads {heads}/{kvh} d {d} window {window:?}");
        // each sequence's prompt into its GPU and its CPU cache
        let prompts: Vec<_> = lens
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let seed = 11 * i as u64 + d as u64;
                let q = values(n * heads * d, seed, 4.0);
                let k = values(n * kvh * d, seed + 1, 4.0);
                let v = values(n * kvh * d, seed + 2, 2.0);
                (q, k, v, n)
            })
            .collect();
        let mut gcaches: Vec<_> = prompts
            .iter()
            .map(|(q, k, v, n)| cache_after(&gpu, &spec, &p, (q, k, v), *n))
            .collect();
        // (the same caches for the g8 and the tensor-core kernels, head_dim 128)
        let mut g8caches: Vec<_> = prompts
            .iter()
            .filter(|_| d == 128)
            .map(|(q, k, v, n)| cache_after(&gpu, &spec, &p, (q, k, v), *n))
            .collect();
        let mut mma_caches: Vec<_> = prompts
            .iter()
            .filter(|_| d == 128)
            .map(|(q, k, v, n)| cache_after(&gpu, &spec, &p, (q, k, v), *n))
            .collect();
        let mut ccaches: Vec<_> = prompts
            .iter()
            .map(|(q, k, v, n)| cache_after(&cpu, &spec, &p, (q, k, v), *n))
            .collect();
        for step in 0..3 {
            let seed = 1000 + 10 * step as u64 + d as u64;
            let q = values(s * heads * d, seed, 4.0);
            let k = values(s * kvh * d, seed + 1, 4.0);
            let v = values(s * kvh * d, seed + 2, 2.0);
            let pos: Vec<usize> = lens.iter().map(|n| n + step).collect();
            let before = gpu.batched_attention_rows();
            let got = decode_pass(&gpu, &grope, &mut gcaches, &pos, (&q, &k, &v), &p);
            assert_eq!(
                gpu.batched_attention_rows() - before,
                s,
                "{label}: the sequences did not attend in one batched launch"
            );
            let want = decode_pass(&cpu, &crope, &mut ccaches, &pos, (&q, &k, &v), &p);
            let worst = max_abs_diff(&got, &want);
            println!("batched decode attention {label}, step {step}: max |gpu - cpu| {worst:.3e}");
            assert!(worst < 1e-4, "{label}, step {step}: {worst}");
            if d == 128 {
                gpu.set_options(CudaOptions {
                    attn_g8: 2,
                    ..defaults.clone()
                });
                let before = gpu.g8_attention_rows();
                let g8 = decode_pass(&gpu, &grope, &mut g8caches, &pos, (&q, &k, &v), &p);
                let ran = gpu.g8_attention_rows() - before;
                gpu.set_options(defaults.clone());
                assert_eq!(ran, s, "{label}: the g8 kernels did not run");
                assert!(
                    got.iter().zip(&g8).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{label}, step {step}: attn_g8 changed the output (max diff {:.3e})",
                    max_abs_diff(&got, &g8)
                );
                // the tensor-core kernels: other bits, the CPU's values within the same bound
                gpu.set_options(CudaOptions {
                    attn_mma: 1,
                    ..defaults.clone()
                });
                let before = gpu.mma_attention_rows();
                let mma = decode_pass(&gpu, &grope, &mut mma_caches, &pos, (&q, &k, &v), &p);
                let ran = gpu.mma_attention_rows() - before;
                gpu.set_options(defaults.clone());
                assert_eq!(ran, s, "{label}: the tensor-core kernels did not run");
                let worst = max_abs_diff(&mma, &want);
                println!("  on tensor cores: max |gpu - cpu| {worst:.3e}");
                assert!(worst < 1e-4, "{label}, step {step}, tensor cores: {worst}");
            }
        }
    }
    gpu.set_options(original);
}

/// A fresh cache of `spec` after `Backend::attention` of an `n`-row chunk `q`, `k`, `v`.
fn cache_after<B: Backend>(
    b: &B,
    spec: &fp4forge_engine::KvLayerSpec,
    p: &fp4forge_engine::AttentionParams,
    (q, k, v): (&[f32], &[f32], &[f32]),
    n: usize,
) -> B::KvLayer {
    let mut cache = b.new_kv_layer(spec).unwrap();
    let up = |x: &[f32]| b.upload(n, x.len() / n, x).unwrap();
    b.attention(&up(q), &up(k), &up(v), &mut cache, p).unwrap();
    cache
}

/// One decode pass of the sequences of `caches` (sequence `i` at position `pos[i]`, its query,
/// key and value rows row `i` of `q`, `k`, `v`) through `Backend::attention_chunks`: the outputs.
fn decode_pass<B: Backend>(
    b: &B,
    rope: &B::Rope,
    caches: &mut [B::KvLayer],
    pos: &[usize],
    (q, k, v): (&[f32], &[f32], &[f32]),
    p: &fp4forge_engine::AttentionParams,
) -> Vec<f32> {
    use fp4forge_engine::ir::AttnChunk;
    let n = caches.len();
    let up = |x: &[f32]| b.upload(n, x.len() / n, x).unwrap();
    let mut chunks: Vec<AttnChunk<'_, B>> = caches
        .iter_mut()
        .zip(pos)
        .map(|(kv, &pos0)| AttnChunk { pos0, rows: 1, kv })
        .collect();
    let out = b
        .attention_chunks(
            (up(q), up(k), &up(v)),
            fp4forge_engine::backend::HeadNorms::none(),
            rope,
            &mut chunks,
            p,
        )
        .unwrap();
    b.download(&out).unwrap()
}

/// The outputs of `Backend::attention` over a fresh cache of `spec` for chunks of `chunks` rows
/// (one after the other: the first at position 0), all concatenated; inputs from `seed`.
fn attention_chunks<B: Backend>(
    b: &B,
    spec: &fp4forge_engine::KvLayerSpec,
    p: &fp4forge_engine::AttentionParams,
    chunks: &[usize],
    seed: u64,
) -> Vec<f32> {
    let (heads, kvh, d) = (p.heads, p.kv_heads, p.head_dim);
    let mut cache = b.new_kv_layer(spec).unwrap();
    let mut outs = Vec::new();
    for (i, &t) in chunks.iter().enumerate() {
        let seed = seed + 3 * i as u64;
        let q = values(t * heads * d, seed, 4.0);
        let k = values(t * kvh * d, seed + 1, 4.0);
        let v = values(t * kvh * d, seed + 2, 2.0);
        let o = b
            .attention(
                &b.upload(t, heads * d, &q).unwrap(),
                &b.upload(t, kvh * d, &k).unwrap(),
                &b.upload(t, kvh * d, &v).unwrap(),
                &mut cache,
                p,
            )
            .unwrap();
        outs.extend(b.download(&o).unwrap());
    }
    outs
}

/// The shapes of the prefill attention tests: (query heads, kv heads, head_dim) with 6, 8, 3, 1
/// and 6 query heads per kv head (2, 4, 1, 1, 2 heads per `attn_flash` block), and the caches
/// (type, k scale, v scale).
const FLASH_SHAPES: [(usize, usize, usize); 5] = [
    (48, 8, 128),
    (64, 8, 128),
    (9, 3, 64),
    (4, 4, 64),
    (12, 2, 64),
];
const FLASH_CACHES: [(KvDtype, f32, f32); 2] =
    [(KvDtype::Bf16, 1.0, 1.0), (KvDtype::Fp8E4m3, 0.05, 0.02)];

fn flash_spec(
    (heads, kvh, d): (usize, usize, usize),
    window: Option<usize>,
    (dtype, k_scale, v_scale): (KvDtype, f32, f32),
) -> (
    fp4forge_engine::KvLayerSpec,
    fp4forge_engine::AttentionParams,
) {
    let spec = fp4forge_engine::KvLayerSpec {
        kv_heads: kvh,
        head_dim: d,
        window,
        dtype,
        k_scale,
        v_scale,
    };
    let p = fp4forge_engine::AttentionParams {
        heads,
        kv_heads: kvh,
        head_dim: d,
        scale: 1.0 / (d as f32).sqrt(),
    };
    (spec, p)
}

/// Prefill attention on tensor cores (`attn_flash_*`: chunks of 16+ rows over bf16 / fp8
/// caches) against the CPU backend, as `gpu_attention_matches_cpu_on_bf16_and_fp8_caches`: chunks
/// of 16 to 300 rows from position 0 and after earlier chunks (and a decode step), at
/// `FLASH_SHAPES`, full layers and windows smaller than a chunk (64, and 40: below the 64-key
/// tile) and larger (512; a 300-row chunk after 16 rows does not wrap it, later ones do).
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-tests.sh)"]
fn gpu_flash_attention_matches_cpu() {
    let gpu = gpu();
    let cpu = CpuBackend::new();
    set_flash_attention(&gpu, true);
    let chunks = [16usize, 300, 17, 1, 64, 100, 31, 250];
    for shape in FLASH_SHAPES {
        for window in [None, Some(64usize), Some(40), Some(512)] {
            for cache in FLASH_CACHES {
                let (spec, p) = flash_spec(shape, window, cache);
                let seed = (shape.0 * 1000 + shape.2) as u64 + window.unwrap_or(0) as u64;
                let g = attention_chunks(&gpu, &spec, &p, &chunks, seed);
                let c = attention_chunks(&cpu, &spec, &p, &chunks, seed);
                let worst = max_abs_diff(&g, &c);
                println!(
                    "flash attention {:?} heads {}/{} d {} window {window:?}: max |gpu - cpu| {worst:.3e}",
                    cache.0, shape.0, shape.1, shape.2
                );
                assert!(
                    worst < 1e-4,
                    "{:?} {shape:?} window {window:?}: {worst}",
                    cache.0
                );
            }
        }
    }
}

/// The prefill attention on tensor cores against the `attn_*` kernels (`FP4FORGE_CUDA_FLASH=0`)
/// on the same inputs (two shapes, bf16 and fp8, full and sliding; a 600-row chunk, then 16 and
/// 70 rows: on full layers those two run in two key splits merged by `attn_combine`). Small enough
/// for compute-sanitizer (scripts/gpu-tests.sh runs it under racecheck and memcheck).
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-tests.sh)"]
fn gpu_flash_attention_matches_the_cuda_core_kernel() {
    let gpu = gpu();
    let chunks = [600usize, 16, 70];
    for shape in [FLASH_SHAPES[0], FLASH_SHAPES[2]] {
        for window in [None, Some(64usize)] {
            for cache in FLASH_CACHES {
                let (spec, p) = flash_spec(shape, window, cache);
                set_flash_attention(&gpu, true);
                let flash = attention_chunks(&gpu, &spec, &p, &chunks, 7);
                set_flash_attention(&gpu, false);
                let old = attention_chunks(&gpu, &spec, &p, &chunks, 7);
                set_flash_attention(&gpu, true);
                let worst = max_abs_diff(&flash, &old);
                println!(
                    "flash vs attn_* {:?} heads {}/{} d {} window {window:?}: max diff {worst:.3e}",
                    cache.0, shape.0, shape.1, shape.2
                );
                assert!(
                    worst < 1e-4,
                    "{:?} {shape:?} window {window:?}: {worst}",
                    cache.0
                );
            }
        }
    }
}

/// The engine crate's folder: `FP4FORGE_ENGINE_DIR` (a test binary carried to another machine)
/// or where it was built.
fn engine_dir() -> PathBuf {
    std::env::var_os("FP4FORGE_ENGINE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

fn fixtures() -> PathBuf {
    engine_dir().join("tests/fixtures")
}

fn read_f32(f: &SafetensorsFile, name: &str) -> Option<Vec<f32>> {
    let info = f.info(name)?;
    assert_eq!(info.dtype, Dtype::F32, "{name}");
    Some(
        f.bytes(name)
            .unwrap()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect(),
    )
}

fn read_ids(f: &SafetensorsFile, name: &str) -> Vec<u32> {
    f.bytes(name)
        .unwrap()
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32)
        .collect()
}

/// Max |diff|, asserting equal argmax per position and max |diff| ≤ tol.
fn compare(label: &str, got: &[f32], want: &[f32], vocab: usize, tol: f32) -> f32 {
    assert_eq!(got.len(), want.len(), "{label}: shapes");
    let mut worst = 0f32;
    for (p, (g, w)) in got.chunks(vocab).zip(want.chunks(vocab)).enumerate() {
        let d = g
            .iter()
            .zip(w)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        worst = worst.max(d);
        assert_eq!(
            fp4forge_engine::sampling::argmax(g),
            fp4forge_engine::sampling::argmax(w),
            "{label}: top-1 differs at position {p} (max |diff| {d})"
        );
        assert!(d <= tol, "{label}: position {p}: max |diff| {d} > {tol}");
    }
    worst
}

fn tiny_laguna(variant: &str) {
    let dir = fixtures().join(format!("tiny-laguna-{variant}"));
    let lf = dir.join("logits.safetensors");
    if !lf.is_file() {
        println!("SKIP tiny-laguna-{variant}: {} missing", lf.display());
        return;
    }
    let f = SafetensorsFile::open(&lf).unwrap();
    let ids = read_ids(&f, "input_ids");
    let reference = read_f32(&f, "logits_exact_dequant")
        .or_else(|| read_f32(&f, "logits"))
        .unwrap();
    let opts = ModelOptions::new().kv_dtype(KvDtype::F32);
    let cpu = Model::load(&dir, opts.clone()).unwrap();
    let vocab = cpu.info().vocab_size;
    let want_cpu = cpu.new_session().unwrap().prefill_all(&ids).unwrap().data;
    for chunk in [fp4forge_engine::DEFAULT_PREFILL_CHUNK, 128] {
        let model =
            Model::load_with_backend(&dir, opts.clone().prefill_chunk(chunk), gpu()).unwrap();
        let got = model.new_session().unwrap().prefill_all(&ids).unwrap().data;
        let d_cpu = compare(
            &format!("{variant} gpu vs cpu"),
            &got,
            &want_cpu,
            vocab,
            1e-4,
        );
        let d_ref = compare(
            &format!("{variant} gpu vs transformers"),
            &got,
            &reference,
            vocab,
            1e-4,
        );
        println!(
            "tiny-laguna-{variant} chunk {chunk}: {} positions, max |gpu - cpu| {d_cpu:.3e}, \
             max |gpu - transformers| {d_ref:.3e}",
            ids.len()
        );
    }
    // Decode path: prefill all but the last 40 positions, then one token at a time.
    let model = Model::load_with_backend(&dir, opts, gpu()).unwrap();
    let mut s = model.new_session().unwrap();
    let split = ids.len() - 40;
    s.prefill(&ids[..split]).unwrap();
    let mut got = Vec::new();
    for &t in &ids[split..] {
        got.extend(s.step(t).unwrap());
    }
    let d = compare(
        &format!("{variant} gpu decode vs cpu"),
        &got,
        &want_cpu[split * vocab..],
        vocab,
        1e-4,
    );
    println!("tiny-laguna-{variant} decode of 40 steps: max |gpu - cpu| {d:.3e}");
}

#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-tests.sh)"]
fn gpu_tiny_laguna_bf16_logits() {
    tiny_laguna("bf16");
}

#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-tests.sh)"]
fn gpu_tiny_laguna_stock_logits() {
    tiny_laguna("stock");
}

#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-tests.sh)"]
fn gpu_tiny_laguna_lean_logits() {
    tiny_laguna("lean");
}

fn greedy_agree(dir: &Path, prompt: &[u32], n: usize, kv: KvDtype) {
    let opts = ModelOptions::new().kv_dtype(kv);
    let go = GenerateOptions {
        max_tokens: n,
        ..Default::default()
    };
    let cpu = Model::load_with_backend(dir, opts.clone(), CpuBackend::new()).unwrap();
    let want = cpu
        .new_session()
        .unwrap()
        .generate(prompt, &go, |_| true)
        .unwrap();
    let model = Model::load_with_backend(dir, opts, gpu()).unwrap();
    let got = model
        .new_session()
        .unwrap()
        .generate(prompt, &go, |_| true)
        .unwrap();
    let agree = got
        .tokens
        .iter()
        .zip(&want.tokens)
        .take_while(|(a, b)| a == b)
        .count();
    println!(
        "{} ({kv:?} KV): greedy {} tokens, GPU and CPU agree on the first {agree} (GPU {:.1} tok/s \
         decode)",
        dir.display(),
        want.tokens.len(),
        got.stats.decode_tokens_per_second()
    );
    assert_eq!(got.tokens, want.tokens, "greedy tokens differ");
}

#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-tests.sh)"]
fn gpu_forked_sessions_continue_like_fresh_ones() {
    // Backend::kv_fork on device memory (the server's prefix cache): a copy of a prefix continues
    // like a fresh prefill of it, the original is untouched, a wrapped ring copies only whole.
    let dir = fixtures().join("tiny-laguna-lean");
    let f = SafetensorsFile::open(dir.join("logits.safetensors")).unwrap();
    let ids = read_ids(&f, "input_ids");
    let model =
        Model::load_with_backend(&dir, ModelOptions::new().kv_dtype(KvDtype::Bf16), gpu()).unwrap();
    let vocab = model.info().vocab_size;
    let fresh = |prefix: &[u32], rest: &[u32]| {
        let mut s = model.new_session().unwrap();
        s.prefill(prefix).unwrap();
        s.prefill_all(rest).unwrap().data
    };
    let mut s = model.new_session().unwrap();
    s.prefill(&ids[..300]).unwrap();
    // The paged cache shares the full layers' blocks wholly below 200 and copies the partial
    // last block (positions 192..200) and the sliding layers' rings.
    let before = model.kv_memory().used;
    let mut forked = s.fork(200).unwrap().unwrap();
    let taken = model.kv_memory().used - before;
    let block = |spec: &fp4forge_engine::KvLayerSpec| 2 * 64 * spec.row_width() * 2;
    let copied: usize = model
        .kv_specs()
        .iter()
        .map(|spec| match spec.window {
            None => block(spec),
            Some(w) => 200usize.min(w).div_ceil(64) * block(spec),
        })
        .sum();
    assert_eq!(taken, copied, "bytes the fork took");
    assert!(taken < s.kv_bytes(), "{taken} of {}", s.kv_bytes());
    let got = forked.prefill_all(&ids[300..340]).unwrap().data;
    let d = compare(
        "fork",
        &got,
        &fresh(&ids[..200], &ids[300..340]),
        vocab,
        1e-5,
    );
    let got = s.prefill_all(&ids[300..310]).unwrap().data;
    let d_orig = compare(
        "original",
        &got,
        &fresh(&ids[..300], &ids[300..310]),
        vocab,
        1e-5,
    );
    // past the 512-key window the sliding rings have wrapped
    s.prefill(&ids[310..]).unwrap();
    let n = s.position();
    assert!(s.fork(n - 1).unwrap().is_none());
    let mut whole = s.fork(n).unwrap().unwrap();
    let (a, b) = (whole.step(3).unwrap(), s.step(3).unwrap());
    let d_ring = compare("wrapped copy", &a, &b, vocab, 1e-5);
    println!("fork: max |Δ| {d:.3e} (copy), {d_orig:.3e} (original), {d_ring:.3e} (wrapped ring)");
}

#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-tests.sh)"]
fn gpu_paged_kv_cache_stays_within_its_cap_and_gives_blocks_back() {
    // A backend of its own: the cap is its pool's.
    let backend = CudaBackend::new(0).unwrap();
    let dir = fixtures().join("tiny-laguna-lean");
    let f = SafetensorsFile::open(dir.join("logits.safetensors")).unwrap();
    let ids = read_ids(&f, "input_ids");
    let model = Model::load_with_backend(&dir, ModelOptions::new(), backend.clone()).unwrap();
    let vocab = model.info().vocab_size;
    let mut alone = model.new_session().unwrap();
    let want = alone.prefill(&ids[..130]).unwrap();
    let one = alone.kv_bytes();
    assert_eq!(one, model.kv_memory().used);
    assert_eq!(alone.kv_growth_bytes(0), 0);
    drop(alone);
    assert_eq!(
        model.kv_memory().used,
        0,
        "a dropped session gives its blocks back"
    );
    // room for two such sequences: the third fails with an error that names the cap
    backend.set_kv_budget(Some(2 * one));
    let mem = model.kv_memory();
    assert_eq!(mem.capacity, Some(2 * one));
    let mut a = model.new_session().unwrap();
    let mut b = model.new_session().unwrap();
    assert_eq!(a.kv_growth_bytes(130), one);
    let got = a.prefill(&ids[..130]).unwrap();
    b.prefill(&ids[..130]).unwrap();
    let d = max_abs_diff(&got, &want);
    assert!(
        d <= 1e-5 * max_abs(&want).max(1.0),
        "recycled blocks: |Δ| {d}"
    );
    assert_eq!(model.kv_memory().available, Some(0));
    let mut c = model.new_session().unwrap();
    let err = c.prefill(&ids[..130]).unwrap_err().to_string();
    assert!(err.contains("KV cache full"), "{err}");
    drop((a, b, c));
    assert_eq!(model.kv_memory().used, 0);
    let mut c = model.new_session().unwrap();
    let again = c.prefill(&ids[..130]).unwrap();
    assert_eq!(again.len(), vocab);
    let d = max_abs_diff(&again, &want);
    assert!(
        d <= 1e-5 * max_abs(&want).max(1.0),
        "after the failure: |Δ| {d}"
    );
}

#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-tests.sh)"]
fn gpu_tiny_laguna_greedy_256_tokens_match_cpu() {
    for variant in ["bf16", "lean"] {
        let dir = fixtures().join(format!("tiny-laguna-{variant}"));
        let f = SafetensorsFile::open(dir.join("logits.safetensors")).unwrap();
        let ids = read_ids(&f, "input_ids");
        greedy_agree(&dir, &ids[..32], 256, KvDtype::Bf16);
        greedy_agree(&dir, &ids[..32], 256, KvDtype::Fp8E4m3);
    }
}

#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-tests.sh)"]
fn gpu_smollm2_logits_and_greedy() {
    let root = engine_dir().join("../..");
    let fixture = fixtures().join("smollm2-logits.safetensors");
    for name in ["smollm2-nvfp4", "smollm2-hf"] {
        let dir = root.join("assets").join(name);
        if !dir.join("config.json").is_file() {
            println!("SKIP {name}: {} not present", dir.display());
            continue;
        }
        let f = SafetensorsFile::open(&fixture).unwrap();
        let ids = read_ids(&f, "input_ids_0");
        let opts = ModelOptions::new().kv_dtype(KvDtype::F32);
        let cpu = Model::load(&dir, opts.clone()).unwrap();
        let vocab = cpu.info().vocab_size;
        let want = cpu.new_session().unwrap().prefill_all(&ids).unwrap().data;
        let model = Model::load_with_backend(&dir, opts, gpu()).unwrap();
        let got = model.new_session().unwrap().prefill_all(&ids).unwrap().data;
        let d = compare(&format!("{name} gpu vs cpu"), &got, &want, vocab, 2e-3);
        println!("{name}: {} positions, max |gpu - cpu| {d:.3e}", ids.len());
        greedy_agree(&dir, &ids, 256, KvDtype::Bf16);
    }
}

/// Largest |a − b| relative to the largest |b|.
fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    max_abs_diff(a, b) / max_abs(b).max(1e-30)
}

/// Synthetic Laguna checkpoints in `dir`: the tiny preset (head_dim 16) stock and lean, and the
/// tiny preset widened to hidden 256 with head_dim 64 and 128, MoE width 128 and a 128-key
/// window, stock and lean.
fn synthetic_laguna_variants(dir: &Path) -> Vec<(&'static str, PathBuf)> {
    let tiny_stock = common::tiny_laguna(dir, "tiny-stock", true);
    let tiny_lean = common::lean_build(&tiny_stock, &dir.join("tiny-lean"));
    let mut variants = vec![("tiny stock", tiny_stock), ("tiny lean", tiny_lean)];
    for (d, name) in [(64, "wide d64"), (128, "wide d128")] {
        let (stock, lean) = widened_laguna(dir, &format!("wide-d{d}"), 256, d);
        variants.push((name, stock));
        variants.push((name, lean));
    }
    variants
}

/// The tiny synthetic Laguna widened to `hidden` values with heads of `head_dim`, a 128-key
/// window and 128-wide experts: its stock NVFP4 checkpoint and lean build under `dir/name-*`.
fn widened_laguna(dir: &Path, name: &str, hidden: usize, head_dim: usize) -> (PathBuf, PathBuf) {
    use fp4forge_builder::build::NoProgress;
    use fp4forge_builder::synth::{Preset, SynthBuilder};
    let mut cfg = Preset::Tiny.config();
    for (key, v) in [
        ("hidden_size", hidden),
        ("head_dim", head_dim),
        ("moe_intermediate_size", 128),
        ("shared_expert_intermediate_size", 128),
        ("intermediate_size", 256),
        ("sliding_window", 128),
    ] {
        cfg.insert(key.into(), serde_json::json!(v));
    }
    let b = SynthBuilder::new().seed(11).stock_nvfp4(true);
    let plan = b.plan(&cfg, name).unwrap();
    let stock = dir.join(format!("{name}-stock"));
    b.write(&plan, &stock, &NoProgress).unwrap();
    let lean = common::lean_build(&stock, &dir.join(format!("{name}-lean")));
    (stock, lean)
}

/// The knobs a variant of a batched step turns on (`few`: the routed experts a few items per
/// tile from 2 rows).
#[derive(Clone, Copy, Default)]
struct Knobs {
    norm_stage: bool,
    l2_prefetch: bool,
    reduce_norm: bool,
    router_topk: bool,
    mt_mixed: bool,
    mt_mixed8: bool,
    router_shared: bool,
    moe_staged: bool,
    item_staged: bool,
    few: bool,
    /// The few-items-per-tile experts' grid rows: the tiles bound / this (0 as 1: one tile a
    /// block, no block looping).
    few_grid: usize,
}

/// A batched step's norms staging their rows for `gemv_mt` (`FP4FORGE_CUDA_NORM_STAGE`) change
/// no bit of its logits, and neither do the weights' L2 prefetches (`FP4FORGE_CUDA_L2_PREFETCH`:
/// the top-k on k blocks a token, the gate/up blocks' and `gemv_mt`'s prefetches): the same step
/// of 5 sessions (forks) with and without each, and with each MoE layer's sum running the next
/// norm (`FP4FORGE_CUDA_REDUCE_NORM`, counted) and each router running its top-k as its
/// launch's tail (`FP4FORGE_CUDA_ROUTER_TOPK`, counted; not at a step whose top-k prefetches),
/// and NVFP4 q/k/v with the bf16 gate in one launch (`FP4FORGE_CUDA_MT_MIXED`, counted; up to
/// 4 rows, and past 4 with `FP4FORGE_CUDA_MT_MIXED8`), and the few-items-per-tile experts taking
/// their input as the norm staged it (`FP4FORGE_CUDA_MOE_STAGED`, counted), their items grouped
/// by expert in the router's top-k tail (counted) and their shared expert's gate and up run in
/// the router's launch (`FP4FORGE_CUDA_ROUTER_SHARED`, counted) and their launches over half
/// and a third of the tiles bound's grid rows (`FP4FORGE_CUDA_FEW_GRID`: blocks looping over
/// tiles, against one tile a block; all against those experts without, as they run from 2 rows
/// here), and the per-item experts
/// reading their input as the norm staged it (`FP4FORGE_CUDA_ITEM_STAGED`, counted), on the
/// fused batched step of 5 and of 3 rows (mt_mixed8, router_shared, moe_staged and few_grid
/// also of 12: two grid rows of `gemv_mt`), at widths that norm on a warp (256), on
/// `rms_norm`'s block of 128 threads (640) and of 512 (2,048, Laguna-XS's), stock (bf16 q/k/v:
/// the bf16 staging) and lean (NVFP4).
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-tests.sh)"]
fn gpu_norm_stage_and_l2_prefetch_change_no_bit_of_a_batched_step() {
    let tmp = tempfile::tempdir().unwrap();
    let backend = gpu();
    let defaults = backend.options();
    for hidden in [256usize, 640, 2048] {
        let (stock, lean) = widened_laguna(tmp.path(), &format!("h{hidden}"), hidden, 128);
        for dir in [stock, lean] {
            let label = format!("{}", dir.file_name().unwrap().to_string_lossy());
            let config: serde_json::Value =
                serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
            let moe_layers = config["mlp_layer_types"]
                .as_array()
                .expect("Laguna's mlp_layer_types")
                .iter()
                .filter(|t| *t == "sparse")
                .count();
            assert!(moe_layers > 0, "{label}: no MoE layer");
            let opts = ModelOptions::new().kv_dtype(KvDtype::Bf16);
            let model = Model::load_with_backend(&dir, opts, backend.clone()).unwrap();
            let vocab = model.info().vocab_size as u32;
            // (the first 5 for the steps of 5 and 3 rows, all 12 for the step of two grid rows)
            let sessions: Vec<_> = (0..12usize)
                .map(|i| {
                    let mut s = model.new_session().unwrap();
                    let len = if i < 5 { 20 + 37 * i } else { 3 + 9 * i };
                    s.prefill(&common::token_ids(len, vocab, 3 + i as u64))
                        .unwrap();
                    s
                })
                .collect();
            let toks: Vec<u32> = (0..12u32).map(|i| (5 * i + 1) % vocab).collect();
            let layers = config["num_hidden_layers"]
                .as_u64()
                .expect("num_hidden_layers") as usize;
            let lean = label.ends_with("lean");
            // a step of the first `rows` sessions with `knobs`
            let run = |rows: usize, knobs: Knobs| -> Vec<Vec<f32>> {
                let Knobs {
                    norm_stage,
                    l2_prefetch,
                    reduce_norm,
                    router_topk,
                    mt_mixed,
                    mt_mixed8,
                    router_shared,
                    moe_staged,
                    item_staged,
                    few,
                    few_grid,
                } = knobs;
                backend.set_options(CudaOptions {
                    norm_stage,
                    reduce_norm,
                    router_topk,
                    mt_mixed,
                    mt_mixed8,
                    router_shared,
                    moe_staged,
                    item_staged,
                    l2_prefetch_rows: usize::from(l2_prefetch),
                    few_moe_min_tokens: if few { 2 } else { defaults.few_moe_min_tokens },
                    few_grid_divisor: few_grid.max(1),
                    ..defaults.clone()
                });
                let counts = |b: &CudaBackend| {
                    [
                        b.sums_with_norm(),
                        b.routed_in_router(),
                        b.mixed_linears(),
                        b.moe_inputs_staged(),
                        b.grouped_in_router(),
                        b.shared_in_router(),
                    ]
                };
                let before = counts(&backend);
                let mut forks: Vec<_> = sessions[..rows]
                    .iter()
                    .map(|s| s.fork(s.position()).unwrap().unwrap())
                    .collect();
                let mut refs: Vec<_> = forks.iter_mut().collect();
                let slices: Vec<&[u32]> = toks[..rows].iter().map(std::slice::from_ref).collect();
                let steps_before = backend.fused_decode_steps();
                let logits: Vec<Vec<f32>> = model
                    .forward_batch(&mut refs, &slices, &vec![Want::Last; rows])
                    .unwrap()
                    .into_iter()
                    .map(|l| l.unwrap().data)
                    .collect();
                let fused = backend.fused_decode_steps() - steps_before;
                assert_eq!(
                    fused, rows,
                    "{label}: the step did not run on the fused sequence"
                );
                let after = counts(&backend);
                let ran: Vec<usize> = (0..after.len()).map(|i| after[i] - before[i]).collect();
                // every MoE layer's sum runs the next norm where both options are on; every MoE
                // layer's router runs its top-k where it is on (bf16 routers on staged rows,
                // nothing prefetched); every layer's q/k/v and gate run in one launch where
                // it is on (lean: NVFP4 q/k/v, up to 4 rows, more with mt_mixed8); every MoE
                // layer's router also runs the shared expert's gate and up where that is on
                // (staged rows, the top-k in its own launch, a few items per tile); every MoE
                // layer's experts take
                // their input as the norm staged it where it is on and they run a few items
                // per tile (and the shared expert's down its input as the SiLU product staged
                // it: Laguna has one in every MoE layer), and then the router's top-k also
                // groups the items; or, with item_staged, where they run one grid row per item
                // (once a layer)
                let on = |yes: bool, count: usize| if yes { count } else { 0 };
                let routed = norm_stage && router_topk && !l2_prefetch;
                let want = [
                    on(norm_stage && reduce_norm, moe_layers),
                    on(routed, moe_layers),
                    on(mt_mixed && lean && (rows <= 4 || mt_mixed8), layers),
                    on(norm_stage && moe_staged && few, 2 * moe_layers)
                        + on(norm_stage && item_staged && !few, moe_layers),
                    on(routed && few, moe_layers),
                    on(norm_stage && router_shared && !routed && few, moe_layers),
                ];
                assert_eq!(
                    ran, want,
                    "{label}, {rows} rows: sums that ran the next norm, routers that ran the \
                     top-k, layers whose q/k/v and gate ran in one launch, MoE layers whose \
                     experts took staged rows, routers that grouped the items, routers that ran \
                     the shared expert's gate and up"
                );
                logits
            };
            let staged = Knobs {
                norm_stage: true,
                ..Knobs::default()
            };
            let few = Knobs {
                few: true,
                ..staged
            };
            for rows in [5, 3] {
                let apart = run(rows, Knobs::default());
                for (variant, name) in [
                    (staged, "norm_stage"),
                    (
                        Knobs {
                            l2_prefetch: true,
                            ..Knobs::default()
                        },
                        "l2_prefetch",
                    ),
                    (
                        Knobs {
                            reduce_norm: true,
                            ..staged
                        },
                        "reduce_norm",
                    ),
                    (
                        Knobs {
                            item_staged: true,
                            ..staged
                        },
                        "item_staged",
                    ),
                    (
                        Knobs {
                            router_topk: true,
                            ..staged
                        },
                        "router_topk",
                    ),
                    (
                        Knobs {
                            router_topk: true,
                            l2_prefetch: true,
                            ..staged
                        },
                        "router_topk at a prefetching step",
                    ),
                    (
                        Knobs {
                            mt_mixed: true,
                            ..Knobs::default()
                        },
                        "mt_mixed",
                    ),
                    (
                        Knobs {
                            mt_mixed: true,
                            mt_mixed8: true,
                            ..staged
                        },
                        "mt_mixed8",
                    ),
                    (
                        Knobs {
                            reduce_norm: true,
                            router_topk: true,
                            mt_mixed: true,
                            ..staged
                        },
                        "all of them",
                    ),
                ] {
                    assert_eq!(
                        apart,
                        run(rows, variant),
                        "{label}, {rows} rows: {name} changed the logits"
                    );
                }
                // the few-items-per-tile experts (their own arithmetic for the shared expert),
                // with and without their input staged by the norm and their items grouped by
                // the router's launch
                let apart = run(rows, few);
                for (variant, name) in [
                    (
                        Knobs {
                            moe_staged: true,
                            ..few
                        },
                        "moe_staged",
                    ),
                    (
                        Knobs {
                            router_topk: true,
                            ..few
                        },
                        "router_topk with the few-items-per-tile experts",
                    ),
                    (
                        Knobs {
                            moe_staged: true,
                            reduce_norm: true,
                            router_topk: true,
                            ..few
                        },
                        "moe_staged, reduce_norm and router_topk",
                    ),
                    (
                        Knobs {
                            router_shared: true,
                            ..few
                        },
                        "router_shared",
                    ),
                    (
                        Knobs {
                            moe_staged: true,
                            router_shared: true,
                            mt_mixed: true,
                            mt_mixed8: true,
                            ..few
                        },
                        "moe_staged, router_shared and mt_mixed8",
                    ),
                    (
                        Knobs { few_grid: 2, ..few },
                        "half the tiles bound's grid rows (the default)",
                    ),
                    (
                        Knobs { few_grid: 3, ..few },
                        "a third of the tiles bound's grid rows",
                    ),
                ] {
                    assert_eq!(
                        apart,
                        run(rows, variant),
                        "{label}, {rows} rows: {name} changed the logits"
                    );
                }
            }
            // 12 rows: two grid rows of gemv_mt, side by side (`mt_interleave`, the default):
            // gemv_mt_mixed8's choice of path by the interleaved block index, and the router's
            // launch with the shared expert's gate and up over both grid rows
            let all = Knobs {
                mt_mixed: true,
                mt_mixed8: true,
                router_shared: true,
                moe_staged: true,
                few_grid: 3,
                ..few
            };
            assert_eq!(
                run(12, few),
                run(12, all),
                "{label}, 12 rows: mt_mixed8, router_shared and few_grid changed the logits"
            );
            println!(
                "{label}: the same bits with and without norm_stage, l2_prefetch, reduce_norm, \
                 router_topk, mt_mixed, mt_mixed8, router_shared, moe_staged, item_staged, \
                 few_grid (5 and 3 rows; mt_mixed8, router_shared, moe_staged, few_grid at 12)"
            );
        }
    }
    backend.set_options(defaults);
}

/// One configuration of [`gpu_batched_steps_match_each_sequence_alone`].
#[derive(Clone, Copy)]
struct BatchedRun {
    kv: KvDtype,
    sessions: usize,
    /// The attention of a batched step in one launch (else sequence by sequence).
    batched: bool,
    /// The fused batched step (else the generic ops).
    fused: bool,
    /// The routed experts grouped a few items per expert tile from 2 rows, with the shared
    /// expert on the multi-token linears, as from 32 rows at full size.
    few: bool,
    /// The norms staging their rows for gemv_mt, the MoE sums running the next norm, the
    /// routers their top-k and, at 35 sessions, the few-items-per-tile experts taking their
    /// input as the norm staged it.
    stage: bool,
    /// The NVFP4 linears of 2-32 rows on gemm_h16_t32.
    h16: bool,
    /// The attention on tensor cores (head_dim 128).
    mma: bool,
    /// The shared expert on gemv_mt beside the per-item routed experts from 2 rows.
    shared_mt: bool,
    /// Every attention row in one key split: the kernel applies the per-head gate itself, so
    /// each launch of at most 32 sequences must read its own rows of it (the rule Laguna-XS's
    /// 8 kv heads meet at 33+ sequences, where the test model's 2 split their keys).
    one_split: bool,
    /// The MoE's input norm inside the router's launch (`norm_gemv_bf16`) at up to 4 rows.
    norm_router: bool,
}

impl Default for BatchedRun {
    fn default() -> Self {
        Self {
            kv: KvDtype::Bf16,
            sessions: 5,
            batched: true,
            fused: true,
            few: false,
            stage: false,
            h16: false,
            mma: false,
            shared_mt: false,
            one_split: false,
            norm_router: false,
        }
    }
}

/// A batched decode step (several sessions in one pass: the fused sequence over all rows where
/// the caches are bf16, else stacked linears, experts grouped over the batch, every sequence's
/// attention in one launch; the generic ops also with the fused sequence off) gives each
/// sequence the logits it gets stepping alone (the fused single-token step) from the same cache
/// (1e-4 of the logit range for at least 95% of them, none off by more than 1e-2: see the
/// assertion for the routers' near-ties), step after step, the batch's own appended rows read by the next
/// steps: sessions at different positions (1 to 300 prompt tokens: full-attention splits, sliding
/// rings before and after wrapping), 5 sessions and 35 (more than one launch's 32), some passes
/// with one session appending a 3-token chunk among the decoding ones, with the one-launch
/// attention and with it off, on bf16 and fp8 caches (both on the fused batched step), with
/// the attention of 128-wide heads on tensor cores (`CudaOptions::attn_mma`), with the shared
/// expert on `gemv_mt` beside the per-item experts (`CudaOptions::shared_mt_min_rows`: their
/// down projection then on its tensor-core-only kernel, `CudaOptions::item_tc`), and with
/// 35 sessions' attention in one key split (each launch's own gate rows), and with 4 sessions'
/// MoE input norm inside the router's launch (`CudaOptions::norm_router_rows`); the
/// configurations in [`BatchedRun`] (`FP4FORGE_TEST_ONLY`: only those whose label contains it).
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-tests.sh)"]
fn gpu_batched_steps_match_each_sequence_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let backend = gpu();
    let mut failures = Vec::new();
    let mut fused_rows = 0;
    let mut fused_fp8_rows = 0;
    let only = std::env::var("FP4FORGE_TEST_ONLY").ok();
    let base = BatchedRun::default();
    let runs = [
        base,
        BatchedRun {
            sessions: 35,
            ..base
        },
        BatchedRun {
            fused: false,
            ..base
        },
        BatchedRun {
            sessions: 35,
            fused: false,
            ..base
        },
        BatchedRun {
            batched: false,
            ..base
        },
        BatchedRun { few: true, ..base },
        BatchedRun {
            stage: true,
            ..base
        },
        BatchedRun {
            sessions: 35,
            stage: true,
            ..base
        },
        BatchedRun { h16: true, ..base },
        BatchedRun {
            kv: KvDtype::Fp8E4m3,
            ..base
        },
        BatchedRun {
            sessions: 35,
            mma: true,
            ..base
        },
        BatchedRun {
            kv: KvDtype::Fp8E4m3,
            mma: true,
            ..base
        },
        BatchedRun {
            shared_mt: true,
            ..base
        },
        BatchedRun {
            stage: true,
            shared_mt: true,
            ..base
        },
        BatchedRun {
            sessions: 35,
            one_split: true,
            ..base
        },
        BatchedRun {
            sessions: 4,
            norm_router: true,
            ..base
        },
    ];
    for (name, dir) in synthetic_laguna_variants(tmp.path()) {
        for run in runs {
            let BatchedRun {
                kv,
                sessions,
                batched,
                fused,
                few,
                stage,
                h16,
                mma,
                shared_mt,
                one_split,
                norm_router,
            } = run;
            backend.set_options(CudaOptions {
                h16_few_min: if h16 { 2 } else { 0 },
                attn_mma: usize::from(mma),
                batched_attention: batched,
                fused_batch: fused,
                norm_stage: stage,
                reduce_norm: stage,
                router_topk: stage,
                moe_staged: stage,
                few_moe_min_tokens: if few {
                    2
                } else {
                    CudaOptions::default().few_moe_min_tokens
                },
                shared_mt_min_rows: usize::from(shared_mt) * 2,
                norm_router_rows: usize::from(norm_router) * 4,
                attn_split_min_keys: if one_split {
                    1 << 20
                } else {
                    CudaOptions::default().attn_split_min_keys
                },
                ..backend.options()
            });
            let label = format!(
                "{name} {} {kv:?} {sessions} sessions{}{}{}{}{}{}{}{}{}",
                dir.file_name().unwrap().to_string_lossy(),
                if batched { "" } else { " (one launch off)" },
                if fused { "" } else { " (generic ops)" },
                if few { " (few-per-tile experts)" } else { "" },
                if stage {
                    " (norms staging rows, sums norming, routers routing)"
                } else {
                    ""
                },
                if h16 {
                    " (NVFP4 linears on gemm_h16_t32)"
                } else {
                    ""
                },
                if mma {
                    " (attention on tensor cores)"
                } else {
                    ""
                },
                if shared_mt {
                    " (shared expert on gemv_mt)"
                } else {
                    ""
                },
                if one_split { " (one key split)" } else { "" },
                if norm_router {
                    " (norm in the router)"
                } else {
                    ""
                }
            );
            // (FP4FORGE_TEST_ONLY: only the configurations whose label contains it, e.g. to run
            // one on the emulated GPU, where the whole test takes over half an hour)
            if only.as_ref().is_some_and(|o| !label.contains(o.as_str())) {
                continue;
            }
            let opts = ModelOptions::new().kv_dtype(kv);
            let model = Model::load_with_backend(&dir, opts, backend.clone()).unwrap();
            let vocab = model.info().vocab_size as u32;
            let h16_before = backend.few_h16_linears();
            let mma_before = backend.mma_attention_rows();
            let shared_mt_before = backend.shared_on_mt();
            let tc_before = backend.tc_item_launches();
            let norm_router_before = backend.routers_with_norm();
            let mut ss: Vec<_> = (0..sessions)
                .map(|i| {
                    let mut s = model.new_session().unwrap();
                    let n = [300, 1, 17, 129, 200][i % 5] + i / 5;
                    s.prefill(&common::token_ids(n, vocab, 7 + i as u64))
                        .unwrap();
                    s
                })
                .collect();
            let mut diffs = Vec::new();
            for step in 0..12u32 {
                let toks: Vec<u32> = (0..sessions as u32)
                    .map(|i| (17 * i + 31 * step + 3) % vocab)
                    .collect();
                // (every 4th step, session 1 appends a 3-token chunk in the same pass: the
                // decoding sequences around it still go together)
                let lists: Vec<Vec<u32>> = toks
                    .iter()
                    .enumerate()
                    .map(|(i, &t)| {
                        if i == 1 && step % 4 == 3 {
                            vec![t, (t + 1) % vocab, (t + 2) % vocab]
                        } else {
                            vec![t]
                        }
                    })
                    .collect();
                let alone: Vec<Vec<f32>> = ss
                    .iter()
                    .zip(&lists)
                    .map(|(s, l)| {
                        let mut copy = s.fork(s.position()).unwrap().unwrap();
                        copy.prefill(l).unwrap()
                    })
                    .collect();
                let mut refs: Vec<_> = ss.iter_mut().collect();
                let slices: Vec<&[u32]> = lists.iter().map(Vec::as_slice).collect();
                let wants = vec![Want::Last; sessions];
                let before = backend.fused_decode_steps();
                let got: Vec<Vec<f32>> = model
                    .forward_batch(&mut refs, &slices, &wants)
                    .unwrap()
                    .into_iter()
                    .map(|l| l.unwrap().data)
                    .collect();
                let used = backend.fused_decode_steps() - before;
                if used > 0 {
                    assert!(fused && used == sessions, "{label}: {used} rows fused");
                    fused_rows += used;
                    if kv == KvDtype::Fp8E4m3 {
                        fused_fp8_rows += used;
                    }
                }
                for (g, w) in got.iter().zip(&alone) {
                    diffs.push(rel_diff(g, w));
                }
            }
            let d = diffs.iter().copied().fold(0f32, f32::max);
            let over = diffs.iter().filter(|&&x| x.is_nan() || x > 1e-4).count();
            println!(
                "{label}: batched vs alone max {d:.2e} of the logit range, {over} of {} over 1e-4",
                diffs.len()
            );
            // (the widened lean checkpoints' attention is NVFP4 with K % 64 == 0)
            let lean = dir
                .file_name()
                .is_some_and(|n| n.to_string_lossy().contains("lean"));
            if mma && name == "wide d128" {
                assert!(
                    backend.mma_attention_rows() > mma_before,
                    "{label}: no attention on tensor cores"
                );
            }
            // (the tiny preset's widths are below gemv_mt's 128-wide chunks)
            if shared_mt && name.starts_with("wide") {
                assert!(
                    backend.shared_on_mt() > shared_mt_before,
                    "{label}: no shared expert on gemv_mt"
                );
                // (the routed experts' down projection then on its tensor-core-only kernel:
                // `item_tc` on by default, the wide checkpoints' experts 128 wide)
                assert!(
                    backend.tc_item_launches() > tc_before,
                    "{label}: no down projection on experts_down2_tc"
                );
            }
            // (the tiny preset's hidden width is below the kernel's 256-wide rows)
            if norm_router && name.starts_with("wide") {
                assert!(
                    backend.routers_with_norm() > norm_router_before,
                    "{label}: no norm in the router's launch"
                );
            }
            if h16 && lean && name.starts_with("wide") && backend.h16_gemm_runs() {
                assert!(
                    backend.few_h16_linears() > h16_before,
                    "{label}: no linear on gemm_h16_t32"
                );
            }
            // Summation order alone moves a logit by ~1e-6 of the range; where it moves a
            // random router's score across a near-tie, another expert is picked for that token
            // and layer (measured up to ~1e-3 of the range, also between the per-sequence ops
            // and the fused step, neither of them batched). A wrong row, position or cache
            // would move every sequence of every step, by far more.
            if d.is_nan() || d > 1e-2 || over * 20 > diffs.len() {
                failures.push(format!("{label}: max {d:.2e}, {over} over 1e-4"));
            }
        }
    }
    backend.set_options(CudaOptions {
        batched_attention: true,
        fused_batch: true,
        h16_few_min: 0,
        attn_mma: CudaOptions::default().attn_mma,
        norm_stage: CudaOptions::default().norm_stage,
        reduce_norm: CudaOptions::default().reduce_norm,
        router_topk: CudaOptions::default().router_topk,
        moe_staged: CudaOptions::default().moe_staged,
        few_moe_min_tokens: CudaOptions::default().few_moe_min_tokens,
        shared_mt_min_rows: CudaOptions::default().shared_mt_min_rows,
        norm_router_rows: CudaOptions::default().norm_router_rows,
        attn_split_min_keys: CudaOptions::default().attn_split_min_keys,
        ..backend.options()
    });
    assert!(failures.is_empty(), "batched steps differ: {failures:#?}");
    println!("{fused_rows} rows decoded on the fused batched step");
    assert!(fused_rows > 0, "no batched step took the fused sequence");
    assert!(
        only.is_some() || fused_fp8_rows > 0,
        "no batched step over fp8 caches took the fused sequence"
    );
}

/// The model path's fused decode step (`backend/cuda/decode.rs`: q/k/v/gate in one launch,
/// attention doing the q/k norms, rope and KV append, the post-norm inside the router, persistent
/// MoE with the shared expert, the next norm in the experts' sum) gives the logits of the generic
/// ops on the same GPU from the same cache (1e-4 of the logit range), step after step with the
/// sliding rings wrapping, and a whole decode on f32 caches gives the CPU backend's:
/// synthetic Laguna checkpoints (stock NVFP4 and the lean build) at the tiny preset (head_dim 16:
/// the separate norm/rope launch and the per-item experts) and widened to hidden 256 with
/// head_dim 64 and 128 and a 128-key window (the fused attention, merging its key splits itself,
/// and the persistent MoE kernels, also on a grid capped at 5 blocks), on bf16, f32 and fp8 KV
/// caches.
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-tests.sh)"]
fn gpu_model_fused_decode_matches_generic_ops_and_cpu() {
    let tmp = tempfile::tempdir().unwrap();
    let variants = synthetic_laguna_variants(tmp.path());
    // (300 + 40 positions: the full layers' decode attention runs in 5-6 key splits, the
    // 128-key sliding windows (16 on the tiny preset) in 2 and wrap)
    let (prompt, steps) = (300, 40);
    let backend = gpu();
    let mut failures = Vec::new();
    for (name, dir) in &variants {
        for kv in [KvDtype::Bf16, KvDtype::F32, KvDtype::Fp8E4m3] {
            let opts = ModelOptions::new().kv_dtype(kv);
            let label = format!(
                "{name} {} {kv:?}",
                dir.file_name().unwrap().to_string_lossy()
            );
            let model = Model::load_with_backend(dir, opts.clone(), backend.clone()).unwrap();
            let ids = common::token_ids(prompt + steps, model.info().vocab_size as u32, 5);
            for grid in [0, 5] {
                set_persistent_grid(&backend, grid);
                // Each step twice from the same cache: the fused step on a copy of the session
                // (its cache), then the generic ops on the session itself.
                let mut s = model.new_session().unwrap();
                s.prefill(&ids[..prompt]).unwrap();
                let (mut d, before) = (0f32, backend.fused_decode_steps());
                for &t in &ids[prompt..] {
                    let mut copy = s.fork(s.position()).unwrap().unwrap();
                    let fused = copy.step(t).unwrap();
                    backend.set_fused_decode(false);
                    let generic = s.step(t);
                    backend.set_fused_decode(true);
                    d = d.max(rel_diff(&fused, &generic.unwrap()));
                }
                let used = backend.fused_decode_steps() - before;
                set_persistent_grid(&backend, 0);
                assert_eq!(used, steps, "{label}: steps on the fused path");
                println!("{label} grid {grid}: fused vs generic ops {d:.2e} of the logit range");
                // Both paths append the step's own k and v to the cache they then attend over:
                // where their f32 values differ in the last bits (summation order, a residual
                // added in an epilogue or apart) and lie on a rounding boundary of the cache's
                // type, the entry rounds the other way. On e4m3 (3 mantissa bits) that moves it
                // 16x as far as on bf16 (7), so fp8 caches get 16x the bound (a flip on the tiny
                // stock model measured 1.57e-4 on the H200, 2026-12-04).
                let bound = if kv == KvDtype::Fp8E4m3 { 1.6e-3 } else { 1e-4 };
                if d.is_nan() || d > bound {
                    failures.push(format!("{label} grid {grid}: fused vs generic {d:.2e}"));
                }
            }
            // Whole decodes on each path accumulate their own caches: on bf16 / fp8 caches an
            // entry rounds differently where the f32 value lies on a rounding boundary up to
            // summation order, and the random routers amplify such a flip (up to ~0.4 of the
            // logit range seen at the widest model); on f32 caches only summation order
            // remains, so the fused decode is compared with the CPU backend's there.
            if kv == KvDtype::F32 {
                let cpu = decode_steps(&Model::load(dir, opts).unwrap(), prompt, steps);
                let d = rel_diff(&decode_steps(&model, prompt, steps), &cpu);
                println!("{label}: fused decode vs CPU {d:.2e} of the logit range");
                if d.is_nan() || d > 1e-4 {
                    failures.push(format!("{label}: fused vs CPU {d:.2e}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "fused decode differs: {failures:#?}");
}

/// Logits of `steps` single-token steps after a `prompt`-token prefill (seeded token ids).
fn decode_steps<B: Backend>(m: &Model<B>, prompt: usize, steps: usize) -> Vec<f32> {
    let ids = common::token_ids(prompt + steps, m.info().vocab_size as u32, 5);
    let mut s = m.new_session().unwrap();
    s.prefill(&ids[..prompt]).unwrap();
    ids[prompt..]
        .iter()
        .flat_map(|&t| s.step(t).unwrap())
        .collect()
}

/// Sampling on the device (`sample_logits`, `sample_sorted`) picks exactly the host `Sampler`'s
/// token for the same draw: greedy, and temperature with top-k (2..256: `sample_logits`; 0, the
/// whole vocabulary, and 257 or 300: `sample_sorted`, which walks the rows of top-k 0 and
/// top-p 1 in index order) and top-p, over a 100,352-entry vocabulary
/// and two small ones, with ties (repeated values: the lower index first), NaN (never picked) and
/// -inf entries, and two rows of few distinct values (values in steps of 0.5: many keys equal to
/// the k-th; all 5,000 equal: more keys reach the threads' k-th largest than the kernel gathers,
/// so its radix select runs); all rows of all vocabularies and parameters in one call (one
/// launch a kernel), so each block reads its own row's logits and parameters.
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-tests.sh)"]
fn gpu_sampling_picks_the_host_samplers_token() {
    use fp4forge_engine::{SampleRequest, Sampler, SamplingParams};
    let b = gpu();
    let mut tensors = Vec::new();
    let mut hosts = Vec::new();
    for (n, seed) in [
        (100_352usize, 1u64),
        (300, 2),
        (40, 3),
        (3_000, 4),
        (5_000, 5),
    ] {
        let mut logits = values(n, seed, 6.0);
        match seed {
            4 => logits
                .iter_mut()
                .for_each(|l| *l = (*l * 2.0).round() / 2.0),
            5 => logits.fill(1.5),
            _ => {}
        }
        // ties: every 7th value repeats its predecessor; a few NaN and -inf entries
        for i in (7..n).step_by(7) {
            logits[i] = logits[i - 1];
        }
        for i in (5..n).step_by(97) {
            logits[i] = f32::NAN;
        }
        for i in (11..n).step_by(89) {
            logits[i] = f32::NEG_INFINITY;
        }
        tensors.push(b.upload(1, n, &logits).unwrap());
        hosts.push(logits);
    }
    let params: Vec<SamplingParams> = [
        (0.0, 0, 1.0),
        (0.7, 1, 1.0),
        (0.7, 20, 1.0),
        (1.0, 256, 0.9),
        (1.3, 2, 0.5),
        (1.0, 50, 1.0),
        (0.05, 8, 0.95),
        (1.0, 257, 1.0),
        (1.0, 0, 1.0),
        (0.8, 0, 0.9),
        (1.5, 300, 0.5),
    ]
    .into_iter()
    .map(|(temperature, top_k, top_p)| SamplingParams {
        temperature,
        top_k,
        top_p,
        seed: 9,
    })
    .collect();
    // (vocabulary, parameters, draw, host pick) of every row, interleaved
    let mut rows = Vec::new();
    for (v, logits) in hosts.iter().enumerate() {
        for (p, params) in params.iter().enumerate() {
            let mut sampler = Sampler::new(*params);
            // (fewer draws where each sorts or walks the whole row: the emulated GPU's time)
            let whole_row = params.top_k == 0 || params.top_k > 256;
            let draws = match (whole_row, logits.len() > 10_000) {
                (false, _) => 200,
                (true, false) => 40,
                (true, true) => 8,
            };
            for _ in 0..draws {
                let u = sampler.draw();
                rows.push((v, p, u, sampler.pick(logits, u)));
            }
        }
    }
    rows.sort_by_key(|&(v, p, _, host)| (host % 5, v, p));
    let requests: Vec<SampleRequest<'_, _>> = rows
        .iter()
        .map(|&(v, p, u, _)| SampleRequest {
            logits: &tensors[v],
            params: &params[p],
            u,
        })
        .collect();
    let dev = b.sample(&requests).unwrap();
    assert_eq!(dev.len(), rows.len());
    for (&(v, p, u, host), dev) in rows.iter().zip(dev) {
        let what = format!("n {} {:?} u {u:?}", hosts[v].len(), params[p]);
        assert_eq!(dev, Some(host), "{what}");
    }
    assert!(b.sample(&[]).unwrap().is_empty());
    println!(
        "device sampling: {} picks in one call equal the host sampler's",
        rows.len()
    );
}

/// Log-probabilities scored on the device (`Backend::logprobs`, one `row_logprobs` launch for
/// every row of every request) equal the host's `token_logprob` of the same logits: the
/// target's log-probability (the same f32 but for f64 summation order: 2e-6 here), its rank
/// and the top places' ids exactly, with ties (the lower id first), NaN (counted as -inf) and
/// -inf logits, targets outside the vocabulary, rows not scored (targets shorter than the
/// rows), a row of all -inf and top beyond the vocabulary; more than 64 alternatives are left
/// to the host (`None` for that request alone).
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-tests.sh)"]
fn gpu_logprobs_equal_the_hosts() {
    use fp4forge_engine::{token_logprob, LogprobRequest};
    let b = gpu();
    let mut tensors = Vec::new();
    let mut hosts = Vec::new();
    for (rows, n, seed) in [
        (3usize, 100_352usize, 1u64),
        (5, 300, 2),
        (2, 40, 3),
        (1, 8, 4),
    ] {
        let mut logits = values(rows * n, seed, 6.0);
        for i in (7..rows * n).step_by(7) {
            logits[i] = logits[i - 1];
        }
        for i in (5..rows * n).step_by(97) {
            logits[i] = f32::NAN;
        }
        for i in (11..rows * n).step_by(89) {
            logits[i] = f32::NEG_INFINITY;
        }
        if n == 8 {
            logits.fill(f32::NEG_INFINITY);
        }
        tensors.push(b.upload(rows, n, &logits).unwrap());
        hosts.push((rows, n, logits));
    }
    // (tensor, targets, top)
    let asks: Vec<(usize, Vec<u32>, usize)> = vec![
        (0, vec![6, 7, 99_999], 20),
        (1, vec![0, 5, 7, 299, 300], 5),
        (1, vec![14], 0),
        (2, vec![1], 64),
        (2, vec![], 3),
        (3, vec![2], 10),
        (0, vec![3], 65),
    ];
    let requests: Vec<LogprobRequest<'_, _>> = asks
        .iter()
        .map(|(t, targets, top)| LogprobRequest {
            logits: &tensors[*t],
            targets,
            top: *top,
        })
        .collect();
    let dev = b.logprobs(&requests).unwrap();
    assert_eq!(dev.len(), asks.len());
    let mut rows_checked = 0;
    for ((t, targets, top), dev) in asks.iter().zip(dev) {
        let (_, n, logits) = &hosts[*t];
        if *top > 64 {
            assert_eq!(dev, None, "top {top}: the host's");
            continue;
        }
        let dev = dev.expect("scored on the device");
        assert_eq!(dev.len(), targets.len());
        for (r, (&target, got)) in targets.iter().zip(&dev).enumerate() {
            let want = token_logprob(&logits[r * n..(r + 1) * n], target, *top);
            let what = format!("n {n} row {r} target {target} top {top}");
            assert_eq!(got.rank, want.rank, "{what}");
            let close =
                |a: f32, b: f32| a == b || (a - b).abs() <= 2e-6 || (a.is_nan() && b.is_nan());
            assert!(
                close(got.logprob, want.logprob),
                "{what}: {} vs {}",
                got.logprob,
                want.logprob
            );
            assert_eq!(got.top.len(), want.top.len(), "{what}");
            for (g, w) in got.top.iter().zip(&want.top) {
                assert_eq!(g.0, w.0, "{what}: {:?} vs {:?}", got.top, want.top);
                assert!(close(g.1, w.1), "{what}: {:?} vs {:?}", got.top, want.top);
            }
            rows_checked += 1;
        }
    }
    assert!(b.logprobs(&[]).unwrap().is_empty());
    println!("device logprobs: {rows_checked} rows in one call equal the host's");
}

/// A pass of the tiny Laguna on the GPU that scores a prompt chunk and a sampled decode step
/// on the device gives the scores the host computes from the same pass's downloaded logits.
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-tests.sh)"]
fn gpu_model_scores_prompts_and_picks_on_the_device() {
    use fp4forge_engine::{token_logprob, LogprobSpec, Output, Sampler, SamplingParams};
    let tmp = tempfile::tempdir().unwrap();
    let dir = common::tiny_laguna(tmp.path(), "tiny-lean", true);
    let model =
        Model::load_with_backend(&dir, ModelOptions::new().kv_dtype(KvDtype::F32), gpu()).unwrap();
    let vocab = model.info().vocab_size;
    let prompt: Vec<u32> = (0..40).map(|i| (i * 37 % vocab) as u32).collect();
    let params = SamplingParams {
        temperature: 0.8,
        top_k: 0,
        top_p: 1.0,
        seed: 3,
    };
    let mut a = model.new_session().unwrap();
    let mut a2 = model.new_session().unwrap();
    let all = a2.prefill_all(&prompt).unwrap();
    let mut s = model.new_session().unwrap();
    s.prefill(&prompt[..10]).unwrap();
    let mut s2 = model.new_session().unwrap();
    s2.prefill(&prompt[..10]).unwrap();
    let dec = s2.step(prompt[10]).unwrap();
    let mut sampler = Sampler::new(params);
    let mut ref_sampler = Sampler::new(params);
    let out = model
        .forward_batch_scored(
            &mut [&mut a, &mut s],
            &[&prompt[..], &prompt[10..11]],
            &[Want::All, Want::Last],
            &mut [None, Some(&mut sampler)],
            &[
                Some(LogprobSpec {
                    targets: &prompt[1..],
                    top: 4,
                }),
                Some(LogprobSpec {
                    targets: &[],
                    top: 2,
                }),
            ],
        )
        .unwrap();
    let Output::Scored {
        logprobs,
        logits: Some(last),
        ..
    } = &out[0]
    else {
        panic!("{:?}", out[0]);
    };
    assert_eq!(logprobs.len(), prompt.len() - 1);
    assert_eq!(last.rows, 1);
    for (r, lp) in logprobs.iter().enumerate() {
        let want = token_logprob(all.row(r), prompt[r + 1], 4);
        assert!((lp.logprob - want.logprob).abs() <= 1e-4, "row {r}");
    }
    let picked = ref_sampler.sample(&dec);
    let Output::Scored {
        token: Some(t),
        logprobs,
        ..
    } = &out[1]
    else {
        panic!("{:?}", out[1]);
    };
    assert_eq!(*t, picked);
    let want = token_logprob(&dec, picked, 2);
    assert!((logprobs[0].logprob - want.logprob).abs() <= 1e-4);
}
