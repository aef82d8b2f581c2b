//! The entry points of kernels/gemv.cu: the one-token GEMVs and several linears of one input in
//! one launch (host side: `linear.rs`).

use super::DevPtr;
use crate::backend::cuda::Segs;

kernels! {
    group gemv;

    /// `y = resid + x · Wᵀ + bias` for `t` tokens, one output row per warp (`N` rows of `K`
    /// inputs, `fmt` the weight's encoding; `bias`, `resid` may be null).
    linear => LinearArgs {
        fmt: i32, w: DevPtr<u8>, scales: DevPtr<u8>, inv_g: f32, x: DevPtr<f32>, y: DevPtr<f32>,
        bias: DevPtr<f32>, resid: DevPtr<f32>, n: i32, k: i32, t: i32,
    }
    /// One token's `y = resid + x · Wᵀ + bias` with 1, 2, 4, 8 rows per warp.
    gemv1 ["gemv1_r1", "gemv1_r2", "gemv1_r4", "gemv1_r8"] => Gemv1Args {
        fmt: i32, w: DevPtr<u8>, scales: DevPtr<u8>, inv_g: f32, x: DevPtr<f32>, y: DevPtr<f32>,
        bias: DevPtr<f32>, resid: DevPtr<f32>, n: i32, k: i32,
    }
    /// One token's NVFP4 GEMV with K split over 1, 2, 4, 8 warps; 2 then 3 blocks per SM.
    gemv_nv [
        "gemv_nv_k1_b2", "gemv_nv_k2_b2", "gemv_nv_k4_b2", "gemv_nv_k8_b2",
        "gemv_nv_k1_b3", "gemv_nv_k2_b3", "gemv_nv_k4_b3", "gemv_nv_k8_b3",
    ] => GemvNvArgs {
        w: DevPtr<u8>, scales: DevPtr<u8>, inv_g: f32, x: DevPtr<f32>, y: DevPtr<f32>,
        bias: DevPtr<f32>, resid: DevPtr<f32>, n: i32, k: i32,
    }
    /// One token's NVFP4 GEMV on tensor cores (K % 128 == 0), `ks` warps per 16-row tile.
    gemv_mma => GemvMmaArgs {
        w: DevPtr<u8>, scales: DevPtr<u8>, inv_g: f32, x: DevPtr<f32>, y: DevPtr<f32>,
        bias: DevPtr<f32>, resid: DevPtr<f32>, n: i32, k: i32, ks: i32,
    }
    /// Up to six linears of one token's `x` (`K` inputs) in one launch.
    linear_multi2 => LinearMulti2Args { segs: Segs, x: DevPtr<f32>, k: i32, mma: i32 }
}
