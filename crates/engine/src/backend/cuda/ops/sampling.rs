//! The entry points of kernels/sampling.cu: synthetic fills and the next token from logits.

use super::DevPtr;

kernels! {
    group sampling;

    /// `n` seeded synthetic values at `p` (`mode`: 0 random bytes, 1 bf16 in ±`amp`, 2 fp8
    /// e4m3 scales, 3 f32 in ±`amp`).
    fill => FillArgs { p: DevPtr<u8>, n: i64, seed: u64, mode: i32, amp: f32 }
    /// The next token from one row of `n` logits, as the host `Sampler` picks it.
    sample_logits => SampleLogitsArgs {
        logits: DevPtr<f32>, n: i32, temperature: f32, top_k: i32, top_p: f32, u: f64,
        out: DevPtr<u32>,
    }
}
