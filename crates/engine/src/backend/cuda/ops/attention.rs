//! The entry points of kernels/attention.cu: the KV append, prefill and decode attention and
//! the merge of key splits (host side: `attention.rs`).

use super::DevPtr;
use crate::backend::cuda::AttnPrep;

kernels! {
    group attention;

    /// Rows `k`, `v` of `t` tokens (`width` values each) into the cache from position `pos0`.
    kv_append => KvAppendArgs {
        kc: DevPtr<u8>, vc: DevPtr<u8>, k: DevPtr<f32>, v: DevPtr<f32>, t: i32, pos0: i32,
        window: i32, width: i32, kv_t: i32, ks: f32, vs: f32,
    }
    /// Attention of `t` query rows over a cache of f32, fp8 or bf16 values (`3 · kv_t +
    /// head-dim class`: d ≤ 32, 64, 128).
    attn [
        "attn_f32_1", "attn_f32_2", "attn_f32_4",
        "attn_fp8_1", "attn_fp8_2", "attn_fp8_4",
        "attn_bf16_1", "attn_bf16_2", "attn_bf16_4",
    ] => AttnArgs {
        q: DevPtr<f32>, kch: DevPtr<f32>, vch: DevPtr<f32>, kc: DevPtr<u8>, vc: DevPtr<u8>,
        out: DevPtr<f32>, part_o: DevPtr<f32>, part_ml: DevPtr<f32>, t: i32, heads: i32, kvh: i32,
        d: i32, scale: f32, pos0: i32, window: i32, splits: i32, ngroups: i32, ks: f32, vs: f32,
    }
    /// One token's attention over a bf16 cache: head_dim 64, 128, and 128 for short spans.
    attn_dec ["attn_dec_bf16_64", "attn_dec_bf16_128", "attn_dec_bf16_128_short"] => AttnDecArgs {
        q: DevPtr<f32>, kch: DevPtr<f32>, vch: DevPtr<f32>, kc: DevPtr<u16>, vc: DevPtr<u16>,
        out: DevPtr<f32>, part_o: DevPtr<f32>, part_ml: DevPtr<f32>, heads: i32, kvh: i32,
        scale: f32, pos0: i32, window: i32, splits: i32, ngroups: i32, pp: AttnPrep,
    }
    /// The merge of `splits` partial results per head (and `softplus(gate)` where not null).
    attn_combine => AttnCombineArgs {
        part_o: DevPtr<f32>, part_ml: DevPtr<f32>, out: DevPtr<f32>, gate: DevPtr<f32>,
        heads: i32, d: i32, splits: i32,
    }
}
