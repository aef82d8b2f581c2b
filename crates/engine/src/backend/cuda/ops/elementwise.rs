//! The entry points of kernels/elementwise.cu: norms, rope, gates and element-wise arithmetic.

use super::DevPtr;
use crate::backend::cuda::CudaBackend;
use crate::error::Result;

kernels! {
    group elementwise;

    /// `y = w · rmsnorm(x)` per group of `width` values (one block per group).
    rms_norm => RmsNormArgs { x: DevPtr<f32>, w: DevPtr<f32>, y: DevPtr<f32>, width: i32, eps: f32 }
    /// One token: `xn = nw · rmsnorm(x)` and `y = xn · Wᵀ` (BF16 `w`, `N` rows of `K`).
    norm_gemv_bf16 => NormGemvBf16Args {
        w: DevPtr<u16>, x: DevPtr<f32>, nw: DevPtr<f32>, eps: f32, xn: DevPtr<f32>,
        y: DevPtr<f32>, n: i32, k: i32,
    }
    /// Rope over the first `rdim` dims of each head, in place, positions from `pos0`.
    rope => RopeArgs {
        x: DevPtr<f32>, inv_freq: DevPtr<f32>, heads: i32, hd: i32, rdim: i32, attn_factor: f32,
        pos0: i32,
    }
    /// One token's per-head q/k norms and rope, and its k and v rows written into cache `slot`.
    qk_norm_rope => QkNormRopeArgs {
        q: DevPtr<f32>, k: DevPtr<f32>, qn: DevPtr<f32>, kn: DevPtr<f32>, heads: i32, hd: i32,
        eps: f32, inv_freq: DevPtr<f32>, rdim: i32, attn_factor: f32, pos: i32, kt: DevPtr<u64>,
        v: DevPtr<f32>, slot: i64, kv_heads: i32, kv_t: i32, ks: f32, vs: f32,
    }
    /// `x *= softplus(gate[i / group])` over `n` values.
    softplus_gate => SoftplusGateArgs { x: DevPtr<f32>, gate: DevPtr<f32>, n: i64, group: i32 }
    /// `y = silu(g) · u` over `n` values.
    silu_mul => SiluMulArgs { g: DevPtr<f32>, u: DevPtr<f32>, y: DevPtr<f32>, n: i64 }
    /// `y += alpha · x` over `n` values.
    add_scaled => AddScaledArgs { y: DevPtr<f32>, alpha: f32, x: DevPtr<f32>, n: i64 }
}

impl CudaBackend {
    /// `y = silu(g) ⊙ u` over `len` values (`y` may be `g`), one `silu_mul` launch.
    pub(crate) fn silu_mul_raw(
        &self,
        g: DevPtr<f32>,
        u: DevPtr<f32>,
        y: DevPtr<f32>,
        len: usize,
    ) -> Result<()> {
        SiluMulArgs {
            g,
            u,
            y,
            n: len as i64,
        }
        .launch(self, ((len as u32).div_ceil(256), 1, 1), (256, 1, 1))
    }
}
