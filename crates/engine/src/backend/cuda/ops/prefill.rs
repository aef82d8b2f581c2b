//! The entry points of kernels/prefill.cu: the tiled matrix-matrix kernels of multi-token linears
//! (f32 FMA, and tensor cores: `gemm_mma`, whose tiled core the grouped MoE kernels share) and the
//! embedding lookup (host side: `gemv.rs`, `../mod.rs`, `../decode.rs`).

use super::gemv::Segs;
use super::DevPtr;

kernels! {
    group prefill;

    /// `y = resid + x · Wᵀ + bias` for `t` tokens in 64 × 64 tiles.
    gemm_tiled => GemmTiledArgs {
        fmt: i32, w: DevPtr<u8>, scales: DevPtr<u8>, inv_g: f32, x: DevPtr<f32>, y: DevPtr<f32>,
        bias: DevPtr<f32>, resid: DevPtr<f32>, n: i32, k: i32, t: i32,
    }
    /// `y = resid + x · Wᵀ + bias` for `t` tokens on tensor cores (bf16 or NVFP4 `W`, K % 32 == 0)
    /// in [`GEMM_MMA_ROWS`] × [`GEMM_MMA_TOKENS`] tiles, 256 threads; grid z: K split in runs of
    /// `kc` 32-wide chunks, each split's raw sums into its slice of `part` (one split: `y`).
    /// `xds`: null, or for NVFP4 on sm_89+ the rows' `row_pow2` scales (the f16 path: x in two
    /// f16 parts). `gemm_mma_deep`: 4 K steps of weights in flight (one tile of tokens: a decode
    /// step). `tickets` (null: none; else one a tile, zero between launches): each tile's last
    /// split to finish adds the splits into `y` (else `gemm_splitk_reduce` does).
    gemm_mma ["gemm_mma", "gemm_mma_deep"] => GemmMmaArgs {
        fmt: i32, w: DevPtr<u8>, scales: DevPtr<u8>, inv_g: f32, x: DevPtr<f32>, y: DevPtr<f32>,
        bias: DevPtr<f32>, resid: DevPtr<f32>, n: i32, k: i32, t: i32, kc: i32,
        part: DevPtr<f32>, xds: DevPtr<f32>, tickets: DevPtr<u32>,
    }
    /// `y_s = x · W_sᵀ` for `t` tokens of each bf16 `W_s` of `segs` in one launch, none split
    /// over K (`k % 32 == 0`): `gemm_mma`'s tiles (grid x: the segments' row tiles, y: the
    /// tokens' tiles), 256 threads.
    gemm_mma_segs => GemmMmaSegsArgs { segs: Segs, x: DevPtr<f32>, k: i32, t: i32 }
    /// `y = resid + bias + gscale · Σ_z part[z]` over `gemm_mma`'s K splits, in order (`xds` as
    /// given to `gemm_mma`).
    gemm_splitk_reduce => GemmSplitkReduceArgs {
        part: DevPtr<f32>, splits: i32, y: DevPtr<f32>, bias: DevPtr<f32>, resid: DevPtr<f32>,
        fmt: i32, inv_g: f32, n: i32, t: i32, xds: DevPtr<f32>,
    }
    /// `y = resid + x · Wᵀ + bias` for `t` tokens of each NVFP4 `W` of `segs` (`k % 64 == 0`;
    /// `bias`, `resid` and a K split: one segment only) on f16 tensor cores with
    /// [`GEMM_H16_STAGES`] K steps in flight, x given as `x_split_h16`'s parts `xh` and `xds` its
    /// rows' scales: [`GEMM_H16_ROWS`] × [`GEMM_H16_TOKENS`] tiles (grid x: the segments' row
    /// tiles), 256 threads, [`GEMM_H16_SMEM`] bytes of dynamic shared memory; grid z: K split in
    /// runs of `kc` (even) 32-wide chunks into `part` (and `tickets`), as `gemm_mma`.
    /// `gemm_h16_b1`: one block a SM with more registers (`CudaOptions::h16_one_block`);
    /// `gemm_h16_t32`: tiles of [`GEMM_H16_FEW_TOKENS`] tokens (a batched decode step's rows:
    /// `CudaOptions::h16_few_min`).
    gemm_h16 ["gemm_h16", "gemm_h16_b1", "gemm_h16_t32"] shared GEMM_H16_SMEM => GemmH16Args {
        segs: Segs, xh: DevPtr<u16>, bias: DevPtr<f32>, resid: DevPtr<f32>, k: i32, t: i32,
        kc: i32, part: DevPtr<f32>, xds: DevPtr<f32>, tickets: DevPtr<u32>,
    }
    /// `xh` = the f16 high parts and remainders of `x · 2^e` (`2^e = 1 / xds[row]`), `t` rows of
    /// `k` values (`k % 32 == 0`), in `gemm_h16`'s fragment order; `xds` null: the rows'
    /// `row_pow2` scales computed first and written to `xds_out`; `gate` (null: none): x times
    /// `softplus(gate[t, k / group])` first (`group % 4 == 0`). `wpr` warps (1, 2, 4 or 8) a
    /// row, 8 / `wpr` rows per block of 256.
    x_split_h16 => XSplitH16Args {
        x: DevPtr<f32>, xds: DevPtr<f32>, t: i32, k: i32, xh: DevPtr<u16>, xds_out: DevPtr<f32>,
        gate: DevPtr<f32>, group: i32, wpr: i32,
    }
    /// `ds[r] = 2^-e` per row of `x` (`k` values, `k % 4 == 0`), `2^e` putting the row's max |x|
    /// in [2^14, 2^15): the scales of the tensor-core GEMMs' f16 path. 8 rows per block of 256.
    row_pow2 => RowPow2Args { x: DevPtr<f32>, rows: i32, k: i32, ds: DevPtr<f32> }
    /// Rows `ids` of the table `w` (`K` columns, `fmt` its encoding), dequantized into `y`.
    embed => EmbedArgs {
        fmt: i32, w: DevPtr<u8>, scales: DevPtr<u8>, inv_g: f32, ids: DevPtr<u32>, y: DevPtr<f32>,
        k: i32,
    }
}

/// Weight rows of one `gemm_mma` block (`GT_BM` in kernels/prefill.cu; also the grouped MoE
/// kernels' tile).
pub(crate) const GEMM_MMA_ROWS: u32 = 128;

/// Tokens of one `gemm_mma` block (`GT_BN`; also the items of one grouped MoE tile).
pub(crate) const GEMM_MMA_TOKENS: u32 = 64;

/// Weight rows of one `gemm_h16` block (`GH_BM` in kernels/prefill.cu).
pub(crate) const GEMM_H16_ROWS: u32 = 128;

/// Tokens of one `gemm_h16` block (`GH_BN`).
pub(crate) const GEMM_H16_TOKENS: u32 = 128;

/// Tokens of one `gemm_h16_t32` block.
pub(crate) const GEMM_H16_FEW_TOKENS: u32 = 32;

/// K steps of `gemm_h16` in flight (`GH_STAGES`).
pub(crate) const GEMM_H16_STAGES: u32 = 3;

/// Dynamic shared memory of a block of `gemm_h16`'s core with tiles of `tokens` rows of x:
/// `GH_STAGES` stages of x's two parts (`tokens` × 64 f16 each), the packed codes (128 rows × 32
/// bytes) and block scales (128 × 4).
pub(crate) const fn gh_smem(tokens: u32) -> u32 {
    GEMM_H16_STAGES * (2 * tokens * 64 * 2 + GEMM_H16_ROWS * 32 + GEMM_H16_ROWS * 4)
}

/// Dynamic shared memory of one `gemm_h16` block.
pub(crate) const GEMM_H16_SMEM: u32 = gh_smem(GEMM_H16_TOKENS);

/// Items of one tile of the grouped experts on `gemm_h16`'s core (`BN` of
/// `experts_*_h16`).
pub(crate) const EXPERTS_H16_ITEMS: u32 = 64;

/// Dynamic shared memory of one `experts_*_h16` block.
pub(crate) const EXPERTS_H16_SMEM: u32 = gh_smem(EXPERTS_H16_ITEMS);
