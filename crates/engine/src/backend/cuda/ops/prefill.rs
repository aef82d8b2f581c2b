//! The entry points of kernels/prefill.cu: the tiled matrix-matrix kernel of multi-token linears
//! and the embedding lookup (host side: `gemv.rs`, `../mod.rs`, `../decode.rs`).

use super::DevPtr;

kernels! {
    group prefill;

    /// `y = resid + x · Wᵀ + bias` for `t` tokens in 64 × 64 tiles.
    gemm_tiled => GemmTiledArgs {
        fmt: i32, w: DevPtr<u8>, scales: DevPtr<u8>, inv_g: f32, x: DevPtr<f32>, y: DevPtr<f32>,
        bias: DevPtr<f32>, resid: DevPtr<f32>, n: i32, k: i32, t: i32,
    }
    /// Rows `ids` of the table `w` (`K` columns, `fmt` its encoding), dequantized into `y`.
    embed => EmbedArgs {
        fmt: i32, w: DevPtr<u8>, scales: DevPtr<u8>, inv_g: f32, ids: DevPtr<u32>, y: DevPtr<f32>,
        k: i32,
    }
}
