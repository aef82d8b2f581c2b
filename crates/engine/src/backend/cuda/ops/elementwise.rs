//! The entry points of kernels/elementwise.cu: norms, rope, gates and element-wise arithmetic.

use super::DevPtr;
use crate::backend::cuda::{CudaBackend, CudaTensor};
use crate::error::Result;

kernels! {
    group elementwise;

    /// `y = w · rmsnorm(x)` per group of `width` values (one block per group).
    rms_norm => RmsNormArgs { x: DevPtr<f32>, w: DevPtr<f32>, y: DevPtr<f32>, width: i32, eps: f32 }
    /// [`RmsNormArgs`]' norm of `groups` narrow groups (`width % 4 == 0`, at most
    /// `RMS_NORM_WARP_MAX`), one warp per group, 8 groups per block.
    rms_norm_warp => RmsNormWarpArgs {
        x: DevPtr<f32>, w: DevPtr<f32>, y: DevPtr<f32>, width: i32, eps: f32, groups: i64,
    }
    /// `rows` tokens (at most `NG_ROWS`): `xn = nw · rmsnorm(x)` and `y = xn · Wᵀ` (BF16 `w`,
    /// `N` rows of `K`), each token's bits those of the token alone.
    norm_gemv_bf16 => NormGemvBf16Args {
        w: DevPtr<u16>, x: DevPtr<f32>, nw: DevPtr<f32>, eps: f32, xn: DevPtr<f32>,
        y: DevPtr<f32>, n: i32, k: i32, rows: i32,
    }
    /// Per-head `w · rmsnorm(x)` (`w` null: none; as `rms_norm_warp` computes it) then rope over
    /// the first `rdim` dims of each head, in place, positions from `pos0` (one block per row;
    /// [`norm_rope_takes`] `hd`, `rdim / 2 <= ROPE_HALF_MAX`).
    norm_rope => NormRopeArgs {
        x: DevPtr<f32>, w: DevPtr<f32>, eps: f32, inv_freq: DevPtr<f32>, heads: i32, hd: i32,
        rdim: i32, attn_factor: f32, pos0: i32,
    }
    /// One token's per-head q/k norms and rope, and its k and v rows written into cache `slot`.
    qk_norm_rope => QkNormRopeArgs {
        q: DevPtr<f32>, k: DevPtr<f32>, qn: DevPtr<f32>, kn: DevPtr<f32>, heads: i32, hd: i32,
        eps: f32, inv_freq: DevPtr<f32>, rdim: i32, attn_factor: f32, pos: i32, kt: DevPtr<u64>,
        v: DevPtr<f32>, slot: i64, kv_heads: i32, kv_t: i32, ks: f32, vs: f32,
    }
    /// `x *= softplus(gate[i / group])` over `n` values, four per thread.
    softplus_gate => SoftplusGateArgs { x: DevPtr<f32>, gate: DevPtr<f32>, n: i64, group: i32 }
    /// `rms_norm` of a few rows (one block a row, [`norm_row_threads`] threads: the same bits
    /// as `rms_norm_raw`) that also stages each normed row for `gemv_mt` as `xb_stage` would, for
    /// NVFP4 weights (`xb_nv`, `ds_nv`) and bf16 ones (`xb_bf`, `ds_bf`); null: not that format.
    norm_stage => NormStageArgs {
        x: DevPtr<f32>, w: DevPtr<f32>, y: DevPtr<f32>, k: i32, eps: f32, xb_nv: DevPtr<u32>,
        ds_nv: DevPtr<f32>, xb_bf: DevPtr<u32>, ds_bf: DevPtr<f32>,
    }
    /// `y = silu(g) · u` over `n` values.
    silu_mul => SiluMulArgs { g: DevPtr<f32>, u: DevPtr<f32>, y: DevPtr<f32>, n: i64 }
    /// `silu(g) · u` of each row (`k` values; grid: rows) staged for a bf16 `gemv_mt` (`xb_bf`,
    /// `ds_bf`), as `xb_stage` stages `silu_mul`'s output.
    silu_mul_stage => SiluMulStageArgs {
        g: DevPtr<f32>, u: DevPtr<f32>, k: i32, xb_bf: DevPtr<u32>, ds_bf: DevPtr<f32>,
    }
    /// `y += alpha · x` over `n` values, four per thread.
    add_scaled => AddScaledArgs { y: DevPtr<f32>, alpha: f32, x: DevPtr<f32>, n: i64 }
}

/// Widest group `rms_norm_warp` takes (`128 * RNW_V` in kernels/elementwise.cu).
const RMS_NORM_WARP_MAX: usize = 512;

/// Threads of the block `rms_norm` norms a group of `width` values with (`rms_norm_raw`).
fn norm_block_threads(width: usize) -> u32 {
    if width >= 1024 {
        512
    } else {
        128
    }
}

/// Threads that norm one group of `width` values in `rms_norm_raw`: a warp (`rms_norm_warp`)
/// for narrow groups, else `rms_norm`'s block. `norm_stage` run with as many threads (one warp
/// summing like `rms_norm_warp`'s) gives the same bits.
pub(crate) fn norm_row_threads(width: usize) -> u32 {
    if width.is_multiple_of(4) && width <= RMS_NORM_WARP_MAX {
        32
    } else {
        norm_block_threads(width)
    }
}

/// Most rotated pairs per head the `norm_rope` kernel takes (`ROPE_HALF_MAX`).
pub(crate) const ROPE_HALF_MAX: usize = 256;

/// Whether `norm_rope` takes heads of `head_dim` values (its warp holds a head as
/// `rms_norm_warp` holds a group, so its norm is that kernel's: [`norm_row_threads`] a warp).
pub(crate) fn norm_rope_takes(head_dim: usize) -> bool {
    norm_row_threads(head_dim) == 32
}

/// Threads per block of the element-wise kernels that take four values a thread.
const QUAD_THREADS: u32 = 256;

/// Blocks of `QUAD_THREADS` covering `n` values four per thread.
fn quad_blocks(n: usize) -> u32 {
    (n.div_ceil(4) as u32).div_ceil(QUAD_THREADS)
}

impl CudaBackend {
    /// `y = w · rmsnorm(x)` over each of `groups` consecutive groups of `width` values of `x`
    /// (`y` may not be `x`): narrow groups (per-head norms) one warp each, wide ones (hidden
    /// states) one block each.
    pub(crate) fn rms_norm_raw(
        &self,
        (x, w, y): (DevPtr<f32>, DevPtr<f32>, DevPtr<f32>),
        width: usize,
        groups: usize,
        eps: f32,
    ) -> Result<()> {
        if groups == 0 {
            return Ok(());
        }
        if norm_row_threads(width) == 32 {
            return RmsNormWarpArgs {
                x,
                w,
                y,
                width: width as i32,
                eps,
                groups: groups as i64,
            }
            .launch(self, (groups.div_ceil(8) as u32, 1, 1), (256, 1, 1));
        }
        let threads = norm_block_threads(width);
        RmsNormArgs {
            x,
            w,
            y,
            width: width as i32,
            eps,
        }
        .launch(self, (groups as u32, 1, 1), (threads, 1, 1))
    }

    /// The columns of `x` each value of `gate` gates ([`Backend::softplus_gate`]'s shapes:
    /// one row of gate values per row of x, dividing its width), or an error naming both.
    ///
    /// [`Backend::softplus_gate`]: crate::Backend::softplus_gate
    pub(crate) fn gate_group(&self, x: &CudaTensor, gate: &CudaTensor) -> Result<usize> {
        self.check(
            gate.rows == x.rows && gate.cols > 0 && x.cols.is_multiple_of(gate.cols),
            || {
                format!(
                    "gate {:?} for {:?}",
                    (gate.rows, gate.cols),
                    (x.rows, x.cols)
                )
            },
        )?;
        Ok(x.cols / gate.cols)
    }

    /// `x[i] *= softplus(gate[i / group])` over `len` values of `x` (a per-head output gate:
    /// `group = head_dim`).
    pub(crate) fn softplus_gate_raw(
        &self,
        x: DevPtr<f32>,
        gate: DevPtr<f32>,
        len: usize,
        group: usize,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        SoftplusGateArgs {
            x,
            gate,
            n: len as i64,
            group: group as i32,
        }
        .launch(self, (quad_blocks(len), 1, 1), (QUAD_THREADS, 1, 1))
    }

    /// `y += alpha · x` over `len` values.
    pub(crate) fn add_scaled_raw(
        &self,
        y: DevPtr<f32>,
        alpha: f32,
        x: DevPtr<f32>,
        len: usize,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        AddScaledArgs {
            y,
            alpha,
            x,
            n: len as i64,
        }
        .launch(self, (quad_blocks(len), 1, 1), (QUAD_THREADS, 1, 1))
    }

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
