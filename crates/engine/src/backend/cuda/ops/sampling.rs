//! The entry points of kernels/sampling.cu: synthetic fills, the next token from logits and
//! log-probabilities.

use super::DevPtr;

kernels! {
    group sampling;

    /// `n` seeded synthetic values at `p` (`mode`: 0 random bytes, 1 bf16 in ±`amp`, 2 fp8
    /// e4m3 scales, 3 f32 in ±`amp`).
    fill => FillArgs { p: DevPtr<u8>, n: i64, seed: u64, mode: i32, amp: f32 }
    /// The next token of each of `rows` (one block per row) into `out`, as the host `Sampler`
    /// picks it.
    sample_logits => SampleLogitsArgs { rows: DevPtr<SampleRow>, out: DevPtr<u32> }
    /// The next token of each of `rows` (one block per row, sampled with any top-k: the whole
    /// row sorted in its scratch) into `out`, as the host `Sampler` picks it.
    sample_sorted => SampleSortedArgs { rows: DevPtr<SortedSampleRow>, out: DevPtr<u32> }
    /// The log-probabilities of each of `rows` (one block per row) as the host's
    /// `token_logprob` computes them: the target's into `lp` and `rank`, the top places into
    /// `top_id` / `top_lp`.
    row_logprobs => RowLogprobsArgs {
        rows: DevPtr<LogprobRow>,
        lp: DevPtr<f32>,
        rank: DevPtr<u32>,
        top_id: DevPtr<u32>,
        top_lp: DevPtr<f32>,
    }
}

/// One row for `sample_logits` (`SampleRow` in kernels/sampling.cu; same layout): `n` logits
/// at `logits`, the sampler's parameters (temperature 0 or top-k 1: greedy) and its draw `u`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SampleRow {
    pub logits: DevPtr<f32>,
    pub n: i32,
    pub temperature: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub u: f64,
}

// SAFETY: plain old data matching the C struct's layout (8 + 4 * 4 + 8 bytes, no padding).
unsafe impl cudarc::driver::DeviceRepr for SampleRow {}

/// One row for `sample_sorted` (`SortedSampleRow` in kernels/sampling.cu; same layout): the row
/// and its scratch of [`SORTED_SCRATCH_BYTES`] per logit, 8-byte aligned.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SortedSampleRow {
    pub row: SampleRow,
    pub scratch: DevPtr<u8>,
}

// SAFETY: plain old data matching the C struct's layout (32 + 8 bytes, no padding).
unsafe impl cudarc::driver::DeviceRepr for SortedSampleRow {}

/// Scratch bytes per logit of a `sample_sorted` row: two key and two index buffers of u32,
/// then the candidates' f64 probabilities.
pub(crate) const SORTED_SCRATCH_BYTES: usize = 4 * 4 + 8;

/// Threads of a sampling block (`SAMPLE_THREADS` in kernels/sampling.cu): one part each of the
/// host sampler's parted sums, so as many as it has parts.
pub(crate) const SAMPLE_THREADS: u32 = 1024;
const _: () = assert!(SAMPLE_THREADS as usize == crate::sampling::SUM_PARTS);

/// One row for `row_logprobs` (`LogprobRow` in kernels/sampling.cu; same layout): `n` logits at
/// `logits`, the token it scores, how many of the most likely tokens and the first of their
/// slots in the outputs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct LogprobRow {
    pub logits: DevPtr<f32>,
    pub n: i32,
    pub target: i32,
    pub top: i32,
    pub out: i32,
}

// SAFETY: plain old data matching the C struct's layout (8 + 4 * 4 bytes, no padding).
unsafe impl cudarc::driver::DeviceRepr for LogprobRow {}
