//! The entry points of kernels/prefill.cu: the tiled matrix-matrix kernels of multi-token linears
//! (f32 FMA, and tensor cores: `gemm_mma`, whose tiled core the grouped MoE kernels share) and the
//! embedding lookup (host side: `gemv.rs`, `../mod.rs`, `../decode.rs`).

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
    /// step).
    gemm_mma ["gemm_mma", "gemm_mma_deep"] => GemmMmaArgs {
        fmt: i32, w: DevPtr<u8>, scales: DevPtr<u8>, inv_g: f32, x: DevPtr<f32>, y: DevPtr<f32>,
        bias: DevPtr<f32>, resid: DevPtr<f32>, n: i32, k: i32, t: i32, kc: i32,
        part: DevPtr<f32>, xds: DevPtr<f32>,
    }
    /// `y = resid + bias + gscale · Σ_z part[z]` over `gemm_mma`'s K splits, in order (`xds` as
    /// given to `gemm_mma`).
    gemm_splitk_reduce => GemmSplitkReduceArgs {
        part: DevPtr<f32>, splits: i32, y: DevPtr<f32>, bias: DevPtr<f32>, resid: DevPtr<f32>,
        fmt: i32, inv_g: f32, n: i32, t: i32, xds: DevPtr<f32>,
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
