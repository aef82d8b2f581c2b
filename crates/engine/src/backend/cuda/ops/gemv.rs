//! Linears (kernels/gemv.cu, host side): the one-token GEMVs (bf16, NVFP4 on CUDA cores and on
//! tensor cores), several linears of one input in one launch (`linear_multi2`), the fused
//! epilogues that follow them, and the launch geometry of each; `gemv_raw` also dispatches
//! multi-token linears: a few tokens (a batched decode step) to `gemv_mt` (tensor cores, each
//! weight row read once for 8 tokens), more to `gemm_mma` (tensor cores, K split across blocks
//! when the tiles are few) or `gemm_tiled` (kernels/prefill.cu), and `norm_gemv_raw` launches
//! `norm_gemv_bf16` (kernels/elementwise.cu).

use crate::backend::cuda::*;

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
    /// Each row of `x` (`k` values) as tensor-core B entries for weights of format `fmt` (`xb`:
    /// `k` u32 per row for NVFP4, `3 k / 2` for bf16) and its power-of-two scale (`ds`): grid
    /// (rows), 256 threads.
    xb_stage => XbStageArgs { x: DevPtr<f32>, k: i32, fmt: i32, xb: DevPtr<u32>, ds: DevPtr<f32> }
    /// A few tokens' `y = resid + x · Wᵀ + bias` on tensor cores for each linear of `segs` (all
    /// bf16 or all NVFP4, K % 128 == 0, `x` staged by `xb_stage`; `bias`, `resid`: one segment
    /// only): grid (the segments' 16-row tile blocks, ⌈t / tokens a grid row⌉), `ks` warps per
    /// tile. One kernel per format: `gemv_mt_bf16`, `gemv_mt_nv` (two blocks a SM),
    /// `gemv_mt_nv_b1` (one, more loads in flight: `CudaOptions::mt_one_block`) and
    /// `gemv_mt_nv16` (16 tokens a grid row instead of 8: `CudaOptions::mt_16_tokens`) and
    /// `gemv_mt_nv4` (4 tokens a grid row, three blocks a SM: `CudaOptions::mt_4_tokens`);
    /// `gemv_mt_nv4_deep` and `gemv_mt_nv_deep` (`CudaOptions::mt_deep`: their bits, with a
    /// warp's whole run of chunks in flight, for grids of at most one block a SM).
    gemv_mt [
        "gemv_mt_bf16", "gemv_mt_nv", "gemv_mt_nv_b1", "gemv_mt_nv16", "gemv_mt_nv4",
        "gemv_mt_nv4_deep", "gemv_mt_nv_deep",
    ] => GemvMtArgs {
        segs: Segs, xb: DevPtr<u32>, xds: DevPtr<f32>, bias: DevPtr<f32>, resid: DevPtr<f32>,
        k: i32, t: i32, ks: i32,
    }
    /// One input's NVFP4 linears (`nv`) and bf16 linears (`bf`) in one launch, each path with
    /// its own staged input and K split: `gemv_mt_mixed4` (at most four tokens: `gemv_mt_nv4`'s
    /// and `gemv_mt_bf16`'s paths, `bf`'s blocks numbered on from `nv`'s) and `gemv_mt_mixed8`
    /// (5 to 32 tokens: `gemv_mt_nv`'s and `gemv_mt_bf16`'s, `nv`'s blocks numbered on from
    /// `bf`'s).
    gemv_mt_mixed ["gemv_mt_mixed4", "gemv_mt_mixed8"] => GemvMtMixedArgs {
        nv: Segs, bf: Segs, xb_nv: DevPtr<u32>, xds_nv: DevPtr<f32>, xb_bf: DevPtr<u32>,
        xds_bf: DevPtr<f32>, k: i32, t: i32, ks_nv: i32, ks_bf: i32,
    }
    /// 5 to 32 tokens' `y = resid + x · Wᵀ + bias` for each NVFP4 linear of `segs` (`x`
    /// staged by `xb_stage`; `bias`, `resid`: one segment only): grid (the segments' 128-row
    /// blocks, K splits), 256 threads; each block's run of chunks of B for all tokens in shared
    /// memory ([`MT_WIDE_SMEM`] at most); with 2+ splits the partial sums in `part` (`splits ×
    /// t × 128 · blocks` f32) and a ticket a row block in `tickets` (zero before, zero after).
    gemv_mt_wide shared MT_WIDE_SMEM => GemvMtWideArgs {
        segs: Segs, xb: DevPtr<u32>, xds: DevPtr<f32>, bias: DevPtr<f32>, resid: DevPtr<f32>,
        k: i32, t: i32, part: DevPtr<f32>, tickets: DevPtr<u32>,
    }
    /// Up to six linears of one token's `x` (`K` inputs) in one launch.
    linear_multi2 => LinearMulti2Args { segs: Segs, x: DevPtr<f32>, k: i32, mma: i32 }
}

/// Warps per block of the GEMV kernels (one warp per output row).
pub(crate) const GEMV_WARPS: u32 = 4;

/// Tokens per warp of the `linear` kernel (`TB` in the source).
pub(crate) const GEMV_TOKENS: usize = 4;

/// Output rows and tokens of one `gemm_tiled` block (`GM_BM`, `GM_BN` in the source).
pub(crate) const GEMM_ROWS: u32 = 64;
pub(crate) const GEMM_TOKENS: u32 = 64;

/// K splits of a `gemm_mma` launch of `tiles` output tiles over `chunks` 32-wide K chunks: a
/// power of two that brings the grid to at least two blocks per SM (a batched decode step's few
/// tokens make few tiles, each streaming its weight rows alone), keeping at least
/// [`GEMM_SPLIT_MIN_CHUNKS`] chunks per split.
pub(crate) fn gemm_k_splits(tiles: usize, chunks: usize, sms: usize) -> usize {
    let mut splits = 1;
    while tiles * splits < 2 * sms && chunks / (2 * splits) >= GEMM_SPLIT_MIN_CHUNKS {
        splits *= 2;
    }
    splits
}

/// `gemm_h16_t32`'s place among `gemm_h16`'s variants.
const H16_FEW_VARIANT: usize = 2;

/// Fewest 32-wide K chunks per split of `gemm_mma` (the pipeline's ramp costs a few).
pub(crate) const GEMM_SPLIT_MIN_CHUNKS: usize = 8;

/// Fewest tokens for which a multi-token linear uses `gemm_tiled` (fewer: the `linear` GEMV).
pub(crate) const GEMM_MIN_TOKENS: usize = 16;

/// Fewest tokens for which a multi-token linear uses `gemm_mma` where it applies: a batched
/// decode step's 2+ rows too where `gemv_mt` does not apply (K % 128 != 0; its 8-token column
/// groups past the last token are skipped, and one tile of tokens streams its weights with 4 K
/// steps in flight: `gemm_mma_deep`). The H200, lean Laguna-XS, 2026-12-02 (ncu, 4 sequences):
/// the `linear` kernel took 11.5 of a step's 16.2 ms of kernels.
pub(crate) const GEMM_MMA_MIN_TOKENS: usize = 2;

/// Most tokens of a bf16 / NVFP4 linear on the few-token tensor-core GEMV (`gemv_mt`, each weight
/// read once per 8 tokens; more tokens: `gemm_mma`), unless overridden
/// (`CudaOptions::few_token_max`).
pub const GEMV_MT_MAX_TOKENS: usize = 32;

/// Most tokens of a `gemv_mt_wide` launch (`4 · MT_WIDE_GROUPS` in the source).
pub(crate) const MT_WIDE_TOKENS: usize = 32;
/// Fewest tokens of a `gemv_mt_wide` launch: up to 4, `gemv_mt_nv4` (and `gemv_mt_mixed4`) stay.
pub(crate) const MT_WIDE_MIN_TOKENS: usize = 5;
/// Most chunks of one K split of `gemv_mt_wide` (`MT_WIDE_RUN` in the source).
pub(crate) const MT_WIDE_RUN: usize = 4;
/// Output rows of a `gemv_mt_wide` block.
pub(crate) const MT_WIDE_ROWS: usize = 128;
/// `gemv_mt_wide`'s dynamic shared memory: a run's B entries for its most tokens (512 bytes a
/// token a chunk).
pub(crate) const MT_WIDE_SMEM: u32 = (MT_WIDE_TOKENS * MT_WIDE_RUN * 512) as u32;
/// Tickets of the launches whose last block adds their K splits (`Inner::split_tickets`): a
/// `gemv_mt_wide` row block (512 Ki rows in all) or a `gemm_mma` / `gemm_h16` tile.
pub(crate) const SPLIT_TICKETS: usize = 4096;

/// Tokens per grid row of `gemv_mt` (`MT_TOKENS` in the source).
const GEMV_MT_TOKENS: usize = 8;

/// Tokens per grid row of `gemv_mt_nv16` (`CudaOptions::mt_16_tokens`, NVFP4 past
/// [`GEMV_MT_TOKENS`] tokens).
const GEMV_MT16_TOKENS: usize = 16;

/// Tokens per grid row of `gemv_mt_nv4` (`CudaOptions::mt_4_tokens`, NVFP4 up to this many
/// tokens).
const GEMV_MT4_TOKENS: usize = 4;

/// Rows per warp of `linear_multi2` (`MULTI_R`) outside its tensor-core path.
pub(crate) const EXPERT_ROWS: u32 = 4;

/// Warps per block of `linear_multi2` (its tensor-core path: 4 tiles of 16 rows, 2 warps each).
pub(crate) const MULTI_WARPS: u32 = 8;

/// Warps per block (`NVW`) and rows per row group (`NV_R`) of the NVFP4 decode GEMV.
pub(crate) const NV_WARPS: u32 = 8;
pub(crate) const NV_ROWS: usize = 2;

/// Largest K of the NVFP4 decode GEMV (`XS_MAX`: x is staged in shared memory).
pub(crate) const NV_MAX_K: usize = 9216;

/// Resident blocks per SM of the NVFP4 decode GEMV (`__launch_bounds__`).
pub(crate) const NV_BLOCKS_PER_SM: usize = 2;

/// One linear of a `linear_multi2` launch (`Seg` in kernels/gemv.cu; layout identical).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct Seg {
    w: DevPtr<u8>,
    scales: DevPtr<u8>,
    y: DevPtr<f32>,
    inv_g: f32,
    fmt: i32,
    n: i32,
    block0: i32,
}

/// The segments of a `linear_multi2` launch (`Segs` in kernels/gemv.cu; layout identical): segment
/// `s` covers the blocks from its `block0` to the next one's.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct Segs {
    s: [Seg; 6],
    n: i32,
    /// `gemv_mt`: its blocks prefetch their weight rows into L2 (`CudaOptions::l2_prefetch_rows`).
    l2_prefetch: i32,
    /// `gemv_mt`: blocks in launch order take one block of weight rows' grid rows side by side
    /// (`CudaOptions::mt_interleave`).
    interleave: i32,
}

// SAFETY: plain old data matching the C structs.
unsafe impl DeviceRepr for Segs {}

impl Segs {
    /// The segments of `parts` (at most six: each weight's blocks one after another, into its
    /// own output), a block covering `rows_per_block(w)` output rows of `w`; and the blocks in
    /// all.
    fn of(
        b: &CudaBackend,
        parts: &[(&CudaLinear, DevPtr<f32>)],
        rows_per_block: impl Fn(&CudaLinear) -> usize,
    ) -> (Self, u32) {
        let mut segs = Segs::default();
        let mut block0 = 0u32;
        for (i, (w, y)) in parts.iter().enumerate() {
            segs.s[i] = Seg {
                w: b.ptr(&w.data),
                scales: w.scales_ptr(b),
                y: *y,
                inv_g: w.inv_g,
                fmt: w.fmt,
                n: w.rows as i32,
                block0: block0 as i32,
            };
            block0 += w.rows.div_ceil(rows_per_block(w)) as u32;
        }
        segs.n = parts.len() as i32;
        (segs, block0)
    }

    /// The same segments with their blocks numbered from `first` on (after another launch's
    /// blocks, in one grid).
    fn shifted(mut self, first: u32) -> Self {
        for s in &mut self.s[..self.n as usize] {
            s.block0 += first as i32;
        }
        self
    }
}

/// Up to [`MultiLinear::MAX`] linears of one input vector (one token) in one launch
/// (`linear_multi2`): q/k/v/gate, or an MLP's gate and up.
#[derive(Clone, Copy)]
pub(crate) struct MultiLinear {
    segs: Segs,
    blocks: u32,
    k: usize,
}

impl MultiLinear {
    /// Most linears in one launch.
    pub(crate) const MAX: usize = 6;

    /// `y_i = x · W_iᵀ` for each `(W_i, y_i)` of `parts`; every `W_i` takes `k` inputs and
    /// `CudaBackend::linear_multi_applies(k)` holds.
    pub(crate) fn new(
        b: &CudaBackend,
        parts: &[(&CudaLinear, DevPtr<f32>)],
        k: usize,
    ) -> Result<Self> {
        b.check(
            CudaBackend::linear_multi_applies(k)
                && !parts.is_empty()
                && parts.len() <= Self::MAX
                && parts.iter().all(|(w, _)| w.cols == k),
            || format!("linear_multi: {} linears of {k} inputs", parts.len()),
        )?;
        let (segs, blocks) = Segs::of(b, parts, |w| b.multi_rows_per_block(w, k) as usize);
        Ok(Self { segs, blocks, k })
    }
}

/// Work fused into a decode kernel's last block (`Epi` in kernels/common.cu; layout identical): kind 0
/// none, 1 `out = rmsnorm(x) · w` of one row of `n` values.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct Epi {
    counter: DevPtr<u32>,
    pub(crate) x: DevPtr<f32>,
    pub(crate) w: DevPtr<f32>,
    pub(crate) out: DevPtr<f32>,
    pub(crate) eps: f32,
    pub(crate) kind: i32,
    pub(crate) n: i32,
    _pad: i32,
}

// SAFETY: plain old data matching the C struct's layout.
unsafe impl DeviceRepr for Epi {}

impl Epi {
    /// `out = rmsnorm(x) · w` over `n` values.
    pub(crate) fn norm(
        b: &CudaBackend,
        x: DevPtr<f32>,
        w: DevPtr<f32>,
        out: DevPtr<f32>,
        n: usize,
        eps: f32,
    ) -> Self {
        Self {
            counter: b.ptr(&b.inner.counters),
            x,
            w,
            out,
            eps,
            kind: 1,
            n: n as i32,
            _pad: 0,
        }
    }

    /// Whether a kernel of `threads` threads per block can run it in its last block (`EPI_V`
    /// float4s per thread).
    pub(crate) fn fusable(&self, threads: usize) -> bool {
        self.kind == 1 && self.n % 4 == 0 && (self.n as usize) <= 32 * threads
    }
}

/// Columns of one chunk of the tensor-core NVFP4 GEMV (a lane's 16 bytes of a row = 32 columns).
pub(crate) const MMA_CHUNK: usize = 128;

/// Chunks of x one warp of `gemv_mma` stages for itself (`XW_CHUNKS`).
pub(crate) const MMA_WARP_CHUNKS: usize = 9;

/// K split (warps per 16-row tile: 1, 2, 4, 8) of `gemv_mma` for `rows x cols`: the smallest
/// that leaves each warp at most 8 chunks, then larger while the grid has fewer blocks than
/// `target` (the SMs; for `gemv_mt`, times `CudaOptions::mt_blocks_per_sm`) and each warp keeps
/// at least 2 chunks.
pub(crate) fn mma_split(rows: usize, cols: usize, target: usize) -> usize {
    let chunks = cols / MMA_CHUNK;
    let tiles = rows.div_ceil(16);
    let mut ks = 1;
    while ks < 8 && chunks > 8 * ks {
        ks *= 2;
    }
    while ks < 8 && chunks >= 4 * ks && tiles.div_ceil(NV_WARPS as usize / ks) < target {
        ks *= 2;
    }
    ks
}

/// K splits of a `gemv_mt_wide` launch of `blocks` row blocks over `chunks` chunks: the fewest
/// that keep each split within [`MT_WIDE_RUN`] chunks, doubled while the grid then still fits
/// in one wave of `target` blocks (two a SM) and each split keeps 2+ chunks.
pub(crate) fn wide_split(blocks: usize, chunks: usize, target: usize) -> usize {
    let mut splits = 1;
    while chunks.div_ceil(splits) > MT_WIDE_RUN {
        splits *= 2;
    }
    while chunks / (2 * splits) >= 2 && blocks * 2 * splits <= target {
        splits *= 2;
    }
    splits
}

/// `(kernel index, K split)` of the NVFP4 decode GEMV for `rows x cols`: the smallest split of K
/// over warps (1, 2, 4, 8) that gives at least ~32 row-group warps per SM, while every warp keeps
/// at least one 32-element chunk per lane.
pub(crate) fn nv_split(rows: usize, cols: usize, sms: usize) -> (usize, usize) {
    let chunks = cols / 32;
    let warps = rows.div_ceil(NV_ROWS);
    let target = 32 * sms;
    let mut best = (0, 1);
    for (i, ks) in [1usize, 2, 4, 8].into_iter().enumerate() {
        if ks > 1 && chunks < 32 * ks {
            break;
        }
        best = (i, ks);
        if warps * ks >= target {
            break;
        }
    }
    best
}

/// The input of a `gemv_mt` launch: rows of f32 values (staged by an `xb_stage` launch first)
/// or rows already staged for the weights' format ([`StagedRows`]: entries, scales).
#[derive(Clone, Copy)]
pub(crate) enum MtInput {
    /// `t` rows of `K` values.
    Rows(DevPtr<f32>),
    /// B entries and row scales in `xb_stage`'s layout for the weights' format.
    Staged(DevPtr<u32>, DevPtr<f32>),
}

/// `gemv_mt_bf16`'s place in `gemv_mt`'s table.
const MT_BF16_VARIANT: usize = 0;
/// `gemv_mt_nv`'s place in `gemv_mt`'s table.
const MT_NV_VARIANT: usize = 1;
/// `gemv_mt_nv4`'s place in `gemv_mt`'s table.
const MT_NV4_VARIANT: usize = 4;
/// `gemv_mt_nv4_deep`'s place in `gemv_mt`'s table.
const MT_NV4_DEEP_VARIANT: usize = 5;
/// `gemv_mt_nv_deep`'s place in `gemv_mt`'s table.
const MT_NV_DEEP_VARIANT: usize = 6;

/// A `gemv_mt` launch's geometry ([`CudaBackend::gemv_mt_plan`]): its segments, staged input,
/// K split, kernel variant (`gemv_mt`'s table order) and grid.
pub(crate) struct MtPlan {
    pub segs: Segs,
    pub xb: DevPtr<u32>,
    pub xds: DevPtr<f32>,
    /// The input staged for this launch (where it came as rows), alive until the launch.
    _staged: Option<(CudaSlice<u32>, CudaSlice<f32>)>,
    /// `K`: the weights' columns.
    pub cols: i32,
    /// Warps per 16-row tile.
    pub ks: i32,
    pub variant: usize,
    pub grid: (u32, u32, u32),
}

/// A few rows of one input staged for `gemv_mt` by the norm that produced them (`norm_stage`),
/// per weight format: B entries and row scales, as `xb_stage` would write them.
#[derive(Default)]
pub(crate) struct StagedRows {
    /// For NVFP4 weights (`K` u32 a row).
    pub nv: Option<(CudaSlice<u32>, CudaSlice<f32>)>,
    /// For bf16 weights (`3 K / 2` u32 a row).
    pub bf: Option<(CudaSlice<u32>, CudaSlice<f32>)>,
}

impl StagedRows {
    /// The staged rows for weights of format `fmt` (3: NVFP4, 2: bf16), if staged.
    pub(crate) fn of(&self, b: &CudaBackend, fmt: i32) -> Option<MtInput> {
        let s = match fmt {
            3 => self.nv.as_ref(),
            2 => self.bf.as_ref(),
            _ => None,
        };
        s.map(|(xb, xds)| MtInput::Staged(b.ptr(xb), b.ptr(xds)))
    }

    /// The kernels' operands: (B entries, row scales) for NVFP4, then for bf16; null where that
    /// format is not staged.
    pub(crate) fn ptrs(&self, b: &CudaBackend) -> [(DevPtr<u32>, DevPtr<f32>); 2] {
        let ptrs = |s: &Option<(CudaSlice<u32>, CudaSlice<f32>)>| {
            s.as_ref().map_or((DevPtr::NULL, DevPtr::NULL), |(xb, ds)| {
                (b.ptr(xb), b.ptr(ds))
            })
        };
        [ptrs(&self.nv), ptrs(&self.bf)]
    }
}

/// The operands of one `gemv_raw` call: `y = resid + x · Wᵀ + bias` for `t` tokens (`bias`,
/// `resid` may be null; `resid` may be `y`).
#[derive(Clone, Copy)]
pub(crate) struct Gemv {
    pub x: DevPtr<f32>,
    pub y: DevPtr<f32>,
    pub bias: DevPtr<f32>,
    pub resid: DevPtr<f32>,
    pub t: usize,
    /// The `row_pow2` scales of x's rows where the caller computed them once for several
    /// weights ([`CudaBackend::shared_input`]); null: computed here where needed.
    pub xds: DevPtr<f32>,
    /// x's f16 parts for `gemm_h16` (`x_split_h16` with `xds`) where the caller split x once
    /// for several weights; null: split here where needed.
    pub xh: DevPtr<u16>,
}

/// x's rows prepared once for several weights that read the same input (q/k/v of a prompt): the
/// `row_pow2` scales where two or more of them run on a tensor-core GEMM's f16 path, x's f16
/// parts where two or more run on `gemm_h16` ([`CudaBackend::shared_input`]).
#[derive(Default)]
pub(crate) struct SharedInput {
    xds: Option<CudaSlice<f32>>,
    xh: Option<CudaSlice<u16>>,
}

impl SharedInput {
    /// `g` reading the shared scales and parts (where there are any).
    pub(crate) fn onto(&self, b: &CudaBackend, mut g: Gemv) -> Gemv {
        g.xds = self.xds.as_ref().map_or(DevPtr::NULL, |d| b.ptr(d));
        g.xh = self.xh.as_ref().map_or(DevPtr::NULL, |d| b.ptr(d));
        g
    }
}

impl Gemv {
    /// `y = resid + x · Wᵀ` for `t` tokens (no bias; `resid` null: none).
    pub(crate) fn rows(x: DevPtr<f32>, y: DevPtr<f32>, resid: DevPtr<f32>, t: usize) -> Self {
        Self {
            x,
            y,
            bias: DevPtr::NULL,
            resid,
            t,
            xds: DevPtr::NULL,
            xh: DevPtr::NULL,
        }
    }
}

/// The operands of one `norm_gemv_raw` call (`rows` tokens, one after another in `x`, `xn` and
/// `y`): `xn = norm_w · rmsnorm(x)` (epsilon `eps`) and `y = xn · Wᵀ`.
#[derive(Clone, Copy)]
pub(crate) struct NormGemv {
    pub x: DevPtr<f32>,
    pub norm_w: DevPtr<f32>,
    pub eps: f32,
    pub xn: DevPtr<f32>,
    pub y: DevPtr<f32>,
    pub rows: usize,
}

/// Most tokens of one `norm_gemv_raw` call (`NG_ROWS` in kernels/elementwise.cu).
pub(crate) const NORM_GEMV_MAX_ROWS: usize = 4;

/// Most normed values (tokens · columns) one `norm_gemv_raw` call holds (`NG_XS`).
const NORM_GEMV_MAX_VALUES: usize = 8192;

impl CudaBackend {
    /// Runs an epilogue as its own launch (for `rows` rows).
    pub(crate) fn epilogue_launch(&self, epi: &Epi, rows: usize) -> Result<()> {
        if epi.kind == 0 {
            return Ok(());
        }
        self.rms_norm_raw((epi.x, epi.w, epi.out), epi.n as usize, rows, epi.eps)
    }

    /// [`epilogue_launch`](Self::epilogue_launch) of a norm over `rows` rows (2+) that also
    /// stages them for `gemv_mt` for each weight format of `formats` (`norm_stage`: the norm's
    /// bits, then what `xb_stage` makes of them), where [`stage_buffers`](Self::stage_buffers)
    /// gives buffers; else the norm alone, nothing staged.
    pub(crate) fn norm_staged(
        &self,
        epi: &Epi,
        rows: usize,
        formats: &[i32],
    ) -> Result<StagedRows> {
        let Some(staged) = self.stage_buffers(epi, rows, formats)? else {
            self.epilogue_launch(epi, rows)?;
            return Ok(StagedRows::default());
        };
        let [(xb_nv, ds_nv), (xb_bf, ds_bf)] = staged.ptrs(self);
        ops::elementwise::NormStageArgs {
            x: epi.x,
            w: epi.w,
            y: epi.out,
            k: epi.n,
            eps: epi.eps,
            xb_nv,
            ds_nv,
            xb_bf,
            ds_bf,
        }
        .launch(
            self,
            (rows as u32, 1, 1),
            (ops::elementwise::norm_row_threads(epi.n as usize), 1, 1),
        )?;
        Ok(staged)
    }

    /// Buffers for `rows` rows normed by `epi` staged for `gemv_mt` in each weight format of
    /// `formats`, where a norm stages its rows: `CudaOptions::norm_stage` on, a norm epilogue of
    /// 2+ rows of `gemv_mt`'s width (`K % 128 == 0`, `K <= NV_MAX_K`) and a format to stage for;
    /// `None` where not.
    pub(crate) fn stage_buffers(
        &self,
        epi: &Epi,
        rows: usize,
        formats: &[i32],
    ) -> Result<Option<StagedRows>> {
        let k = epi.n as usize;
        let (nv, bf) = (formats.contains(&3), formats.contains(&2));
        if epi.kind != 1
            || rows < 2
            || !(nv || bf)
            || !self.opts().norm_stage
            || !k.is_multiple_of(MMA_CHUNK)
            || k > NV_MAX_K
        {
            return Ok(None);
        }
        let stage =
            |on: bool, per_row: usize| -> Result<Option<(CudaSlice<u32>, CudaSlice<f32>)>> {
                Ok(if on {
                    Some((
                        self.alloc_unset::<u32>(rows * per_row)?,
                        self.alloc_unset::<f32>(rows)?,
                    ))
                } else {
                    None
                })
            };
        Ok(Some(StagedRows {
            nv: stage(nv, k)?,
            bf: stage(bf, 3 * k / 2)?,
        }))
    }

    /// The weight formats of `parts` that `t` tokens run on `gemv_mt` (each once, ascending).
    pub(crate) fn gemv_mt_formats(
        &self,
        parts: &[(&CudaLinear, DevPtr<f32>)],
        t: usize,
    ) -> Vec<i32> {
        let mut formats: Vec<i32> = parts
            .iter()
            .filter(|(w, _)| self.gemv_mt_applies(w, t))
            .map(|(w, _)| w.fmt)
            .collect();
        formats.sort_unstable();
        formats.dedup();
        formats
    }

    /// Whether `norm_gemv_raw` takes `w` for `rows` tokens: BF16, `cols` a multiple of 256 and
    /// at most 4,096, `rows` from 1 to [`NORM_GEMV_MAX_ROWS`] and `rows · cols` at most 8,192.
    pub(crate) fn norm_gemv_applies(w: &CudaLinear, rows: usize) -> bool {
        w.fmt == 2
            && w.cols.is_multiple_of(256)
            && w.cols <= 4096
            && (1..=NORM_GEMV_MAX_ROWS).contains(&rows)
            && rows * w.cols <= NORM_GEMV_MAX_VALUES
    }

    /// `a.rows` tokens: `xn = norm_w * rmsnorm(x)` (written to `xn`) and `y = xn · Wᵀ`, in one
    /// launch (`norm_gemv_bf16`; `norm_gemv_applies(w, a.rows)` must hold).
    pub(crate) fn norm_gemv_raw(&self, w: &CudaLinear, a: NormGemv) -> Result<()> {
        self.check(Self::norm_gemv_applies(w, a.rows), || {
            format!(
                "norm_gemv: {} is not BF16 with columns a multiple of 256 up to 4,096, or {} \
                 tokens are more than it holds",
                w.name, a.rows
            )
        })?;
        const WARPS: usize = 4; // NG_WARPS
        ops::elementwise::NormGemvBf16Args {
            w: self.ptr(&w.data).cast(),
            x: a.x,
            nw: a.norm_w,
            eps: a.eps,
            xn: a.xn,
            y: a.y,
            n: w.rows as i32,
            k: w.cols as i32,
            rows: a.rows as i32,
        }
        .launch(
            self,
            (w.rows.div_ceil(WARPS) as u32, 1, 1),
            (32 * WARPS as u32, 1, 1),
        )
    }

    /// [`Backend::linear`](crate::Backend::linear) with x's rows prepared once for several
    /// weights (`shared`: see [`SharedInput`]).
    pub(crate) fn linear_rows(
        &self,
        x: &CudaTensor,
        w: &CudaLinear,
        bias: Option<&CudaTensor>,
        shared: &SharedInput,
    ) -> Result<CudaTensor> {
        let y = self.tensor(x.rows, w.rows)?;
        self.linear_to(x, w, bias, (self.ptr(&y.buf), DevPtr::NULL), shared)?;
        Ok(y)
    }

    /// [`Backend::linear_add`](crate::Backend::linear_add): `y += x · Wᵀ (+ bias)`, the add in
    /// the linear's epilogue.
    pub(crate) fn linear_add_rows(
        &self,
        y: &mut CudaTensor,
        x: &CudaTensor,
        w: &CudaLinear,
        bias: Option<&CudaTensor>,
    ) -> Result<()> {
        self.check(y.rows == x.rows && y.cols == w.rows, || {
            format!(
                "`{}` ({} outputs) added into {} x {} for {} rows",
                w.name, w.rows, y.rows, y.cols, x.rows
            )
        })?;
        let y = self.ptr(&y.buf);
        self.linear_to(x, w, bias, (y, y), &SharedInput::default())
    }

    /// [`Backend::gated_linear_add`](crate::Backend::gated_linear_add): where `w` runs on
    /// `gemm_h16` (and the gate's groups are multiples of 4), the gate applied inside x's split
    /// (`x_split_h16`: x read twice, never written back); elsewhere `softplus_gate`, then
    /// [`linear_add_rows`](Self::linear_add_rows). The same bits either way.
    pub(crate) fn gated_linear_add_rows(
        &self,
        y: &mut CudaTensor,
        x: CudaTensor,
        gate: &CudaTensor,
        w: &CudaLinear,
        bias: Option<&CudaTensor>,
    ) -> Result<()> {
        let group = self.gate_group(&x, gate)?;
        let fused = x.rows > 0
            && x.cols == w.cols
            && y.rows == x.rows
            && y.cols == w.rows
            && group.is_multiple_of(4)
            && self.gemm_h16_takes(w, x.rows);
        if fused {
            let gate = Some((self.ptr(&gate.buf), group));
            let (xds, xh) = self.scale_split_h16(self.ptr(&x.buf), gate, x.rows, x.cols)?;
            let shared = SharedInput {
                xds: Some(xds),
                xh: Some(xh),
            };
            let y = self.ptr(&y.buf);
            return self.linear_to(&x, w, bias, (y, y), &shared);
        }
        self.softplus_gate_raw(
            self.ptr(&x.buf),
            self.ptr(&gate.buf),
            x.rows * x.cols,
            group,
        )?;
        self.linear_add_rows(y, &x, w, bias)
    }

    /// `y = resid + x · Wᵀ (+ bias)` for the rows of `x` into `(y, resid)` (resid null: none; it
    /// may be `y`), after checking the shapes.
    fn linear_to(
        &self,
        x: &CudaTensor,
        w: &CudaLinear,
        bias: Option<&CudaTensor>,
        (y, resid): (DevPtr<f32>, DevPtr<f32>),
        shared: &SharedInput,
    ) -> Result<()> {
        self.check(x.cols == w.cols, || {
            format!("`{}` takes {} inputs, got {}", w.name, w.cols, x.cols)
        })?;
        if let Some(b) = bias {
            self.check(b.rows * b.cols == w.rows, || {
                format!("bias for `{}`", w.name)
            })?;
        }
        if x.rows == 0 {
            return Ok(());
        }
        let mut g = Gemv::rows(self.ptr(&x.buf), y, resid, x.rows);
        g.bias = bias.map_or(DevPtr::NULL, |b| self.ptr(&b.buf));
        self.gemv_raw(w, shared.onto(self, g))
    }

    /// `y = resid + x · Wᵀ + bias` over the operands of `g` (see [`Gemv`]).
    pub(crate) fn gemv_raw(&self, w: &CudaLinear, g: Gemv) -> Result<()> {
        let Gemv {
            x,
            y,
            bias,
            resid,
            t,
            xds: given_xds,
            xh: _,
        } = g;
        let fast =
            (w.fmt == 3 && w.cols.is_multiple_of(32)) || (w.fmt == 2 && w.cols.is_multiple_of(8));
        let (legacy, mma_ks, nv_ks, nv_grid_per_sm, nv_blocks_per_sm, tiled, mma_gemm) = {
            let o = self.opts();
            (
                o.legacy_gemv,
                o.mma_k_split,
                o.nv_k_split,
                o.nv_grid_per_sm,
                o.nv_blocks_per_sm,
                o.tiled_prefill,
                o.mma_gemm,
            )
        };
        if t == 1
            && w.fmt == 3
            && self.inner.mma
            && w.cols.is_multiple_of(MMA_CHUNK)
            && w.cols <= NV_MAX_K
            && !legacy
        {
            // (each warp stages at most MMA_WARP_CHUNKS chunks of x: an override is raised to that)
            let chunks = w.cols / MMA_CHUNK;
            let ks = mma_ks
                .map(|k| {
                    let mut k = k;
                    while chunks.div_ceil(k) > MMA_WARP_CHUNKS {
                        k *= 2;
                    }
                    k
                })
                .unwrap_or_else(|| mma_split(w.rows, w.cols, self.inner.sms));
            let blocks = w.rows.div_ceil(16 * (NV_WARPS as usize / ks));
            return ops::gemv::GemvMmaArgs {
                w: self.ptr(&w.data),
                scales: w.scales_ptr(self),
                inv_g: w.inv_g,
                x,
                y,
                bias,
                resid,
                n: w.rows as i32,
                k: w.cols as i32,
                ks: ks as i32,
            }
            .launch(self, (blocks as u32, 1, 1), (32 * NV_WARPS, 1, 1));
        }
        if t == 1 && fast && w.fmt == 3 && w.cols <= NV_MAX_K && !legacy {
            let (mut ki, mut ks) = nv_split(w.rows, w.cols, self.inner.sms);
            if let Some(f) = nv_ks {
                ks = f;
                ki = f.trailing_zeros() as usize;
            }
            let tile = (NV_WARPS as usize / ks) * NV_ROWS;
            // persistent blocks (as many as are resident), each staging x in shared memory once;
            // `grid_per_sm` 0: one block per tile.
            let tiles = w.rows.div_ceil(tile);
            let blocks = match nv_grid_per_sm {
                0 => tiles,
                g => tiles.min(g * self.inner.sms),
            };
            let ki = ki + if nv_blocks_per_sm == 3 { 4 } else { 0 };
            let grid = (blocks as u32, 1, 1);
            return ops::gemv::GemvNvArgs {
                w: self.ptr(&w.data),
                scales: w.scales_ptr(self),
                inv_g: w.inv_g,
                x,
                y,
                bias,
                resid,
                n: w.rows as i32,
                k: w.cols as i32,
            }
            .launch(self, ki, grid, (32 * NV_WARPS, 1, 1));
        }
        if t == 1 && fast && !legacy {
            // Rows per warp: as many as keep >= 16 warps per SM busy (x is reused across them).
            let target = 16 * self.inner.sms;
            let (ri, r) = [(3usize, 8usize), (2, 4), (1, 2)]
                .into_iter()
                .find(|&(_, r)| w.rows / r >= target)
                .unwrap_or((0, 1));
            let grid = ((w.rows as u32).div_ceil(GEMV_WARPS * r as u32), 1, 1);
            return ops::gemv::Gemv1Args {
                fmt: w.fmt,
                w: self.ptr(&w.data),
                scales: w.scales_ptr(self),
                inv_g: w.inv_g,
                x,
                y,
                bias,
                resid,
                n: w.rows as i32,
                k: w.cols as i32,
            }
            .launch(self, ri, grid, (32 * GEMV_WARPS, 1, 1));
        }
        if self.gemv_mt_applies(w, t) {
            return self.gemv_mt(&[(w, y)], MtInput::Rows(x), t, bias, resid);
        }
        if self.gemm_h16_takes(w, t) {
            return self.gemm_h16(w, g);
        }
        if Self::gemm_mma_takes(w, t, tiled && mma_gemm && self.inner.sm80) {
            let tiles = (
                (w.rows as u32).div_ceil(GEMM_MMA_ROWS),
                (t as u32).div_ceil(GEMM_MMA_TOKENS),
            );
            let chunks = w.cols / 32;
            let splits = gemm_k_splits((tiles.0 * tiles.1) as usize, chunks, self.inner.sms);
            let kc = chunks.div_ceil(splits);
            let splits = chunks.div_ceil(kc);
            // (every split writes all of its slice)
            let part = if splits > 1 {
                Some(self.alloc_unset(splits * t * w.rows)?)
            } else {
                None
            };
            let tickets = self.splitk_tickets(splits, (tiles.0 * tiles.1) as usize);
            let own = if given_xds.is_null() {
                self.row_scales_for_f16_mma(w.fmt, x, t, w.cols)?
            } else {
                None
            };
            let xds_ptr = match &own {
                Some(d) => self.ptr(d),
                None if self.f16_mma_applies(w.fmt, w.cols) => given_xds,
                None => DevPtr::NULL,
            };
            ops::prefill::GemmMmaArgs {
                fmt: w.fmt,
                w: self.ptr(&w.data),
                scales: w.scales_ptr(self),
                inv_g: w.inv_g,
                x,
                y,
                bias,
                resid,
                n: w.rows as i32,
                k: w.cols as i32,
                t: t as i32,
                kc: kc as i32,
                part: part.as_ref().map_or(DevPtr::NULL, |p| self.ptr(p)),
                xds: xds_ptr,
                tickets,
            }
            .launch(
                self,
                usize::from(tiles.1 == 1),
                (tiles.0, tiles.1, splits as u32),
                (256, 1, 1),
            )?;
            if let (Some(part), true) = (&part, tickets.is_null()) {
                self.gemm_splitk_reduce(w, g, self.ptr(part), splits, xds_ptr)?;
            }
            return Ok(());
        }
        if t >= GEMM_MIN_TOKENS && w.cols.is_multiple_of(32) && tiled {
            let grid = (
                (w.rows as u32).div_ceil(GEMM_ROWS),
                (t as u32).div_ceil(GEMM_TOKENS),
                1,
            );
            return ops::prefill::GemmTiledArgs {
                fmt: w.fmt,
                w: self.ptr(&w.data),
                scales: w.scales_ptr(self),
                inv_g: w.inv_g,
                x,
                y,
                bias,
                resid,
                n: w.rows as i32,
                k: w.cols as i32,
                t: t as i32,
            }
            .launch(self, grid, (256, 1, 1));
        }
        let grid = (
            (w.rows as u32).div_ceil(GEMV_WARPS),
            t.div_ceil(GEMV_TOKENS) as u32,
            1,
        );
        ops::gemv::LinearArgs {
            fmt: w.fmt,
            w: self.ptr(&w.data),
            scales: w.scales_ptr(self),
            inv_g: w.inv_g,
            x,
            y,
            bias,
            resid,
            n: w.rows as i32,
            k: w.cols as i32,
            t: t as i32,
        }
        .launch(self, grid, (32 * GEMV_WARPS, 1, 1))
    }

    /// `y = resid + bias + Σ part` of `g` over `splits` K splits of `gemm_mma` or `gemm_h16` of
    /// `w` (`xds`: the scales the splits ran with, null on gemm_mma's bf16 path).
    fn gemm_splitk_reduce(
        &self,
        w: &CudaLinear,
        g: Gemv,
        part: DevPtr<f32>,
        splits: usize,
        xds: DevPtr<f32>,
    ) -> Result<()> {
        let n = g.t * w.rows;
        ops::prefill::GemmSplitkReduceArgs {
            part,
            splits: splits as i32,
            y: g.y,
            bias: g.bias,
            resid: g.resid,
            fmt: w.fmt,
            inv_g: w.inv_g,
            n: w.rows as i32,
            t: g.t as i32,
            xds,
        }
        .launch(self, ((n as u32).div_ceil(256), 1, 1), (256, 1, 1))
    }

    /// Whether `t` tokens of `w` run on `gemm_h16`: where `gemm_mma` would take its f16 path
    /// (NVFP4, tensor cores) for more than one tile of its tokens (or
    /// [`h16_few`](Self::h16_few)), where [`gemm_h16_able`](Self::gemm_h16_able).
    fn gemm_h16_takes(&self, w: &CudaLinear, t: usize) -> bool {
        (t > GEMM_MMA_TOKENS as usize || self.h16_few(w, t))
            && self.gemm_h16_able(w)
            && self.gemm_mma_f16_applies(w, t)
    }

    /// Whether `gemm_h16` can take `w` at all: K % 64 == 0, the codes 16-byte and the scales
    /// 4-byte aligned (its `cp.async` copies), the device able (`Inner::h16_gemm`) and
    /// `CudaOptions::h16_gemm` on.
    fn gemm_h16_able(&self, w: &CudaLinear) -> bool {
        self.inner.h16_gemm
            && self.opts().h16_gemm
            && w.cols.is_multiple_of(64)
            && self.ptr(&w.data).aligned(16)
            && w.scales_ptr(self).aligned(4)
    }

    /// Whether `t` tokens of `w` go to `gemm_h16_t32` instead of `gemv_mt`: NVFP4, `t` from
    /// `CudaOptions::h16_few_min` (at least 2; 0: never) to [`GEMM_H16_FEW_TOKENS`].
    fn h16_few(&self, w: &CudaLinear, t: usize) -> bool {
        let min = self.opts().h16_few_min;
        w.fmt == 3 && min > 0 && t >= min.max(2) && t <= GEMM_H16_FEW_TOKENS as usize
    }

    /// `gemm_h16`'s variant and tokens a tile for `t` tokens of `w`: `gemm_h16_t32` where
    /// [`h16_few`](Self::h16_few), else `gemm_h16` (or `gemm_h16_b1`,
    /// `CudaOptions::h16_one_block`).
    fn h16_variant(&self, w: &CudaLinear, t: usize) -> (usize, usize) {
        if self.h16_few(w, t) {
            (H16_FEW_VARIANT, GEMM_H16_FEW_TOKENS as usize)
        } else {
            (
                usize::from(self.opts().h16_one_block),
                GEMM_H16_TOKENS as usize,
            )
        }
    }

    /// Counts a launch of `gemm_h16`'s `variant` if it is `gemm_h16_t32`
    /// ([`few_h16_linears`](Self::few_h16_linears)).
    fn count_h16_few(&self, variant: usize) {
        if variant == H16_FEW_VARIANT {
            self.inner
                .few_h16_linears
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// `gemv_raw` on `gemm_h16` (where [`gemm_h16_takes`](Self::gemm_h16_takes)): x split into
    /// its f16 parts once (`x_split_h16`), then the GEMM, K split as `gemm_mma` splits it (in
    /// even runs of 32-wide chunks: its steps are 64 wide).
    fn gemm_h16(&self, w: &CudaLinear, g: Gemv) -> Result<()> {
        let (t, k) = (g.t, w.cols);
        // (where x's parts are given, so are its scales: SharedInput)
        let (own_xds, own_xh) = match (g.xds.is_null(), g.xh.is_null()) {
            (_, false) => (None, None),
            (true, true) => {
                let (xds, xh) = self.scale_split_h16(g.x, None, t, k)?;
                (Some(xds), Some(xh))
            }
            (false, true) => (None, Some(self.split_h16(g.x, g.xds, t, k)?)),
        };
        let xds = own_xds.as_ref().map_or(g.xds, |d| self.ptr(d));
        let xh = own_xh.as_ref().map_or(g.xh, |d| self.ptr(d));
        let (segs, row_tiles) = Segs::of(self, &[(w, g.y)], |_| GEMM_H16_ROWS as usize);
        let (variant, tile) = self.h16_variant(w, t);
        let token_tiles = t.div_ceil(tile) as u32;
        let chunks = k / 32;
        let splits = gemm_k_splits((row_tiles * token_tiles) as usize, chunks, self.inner.sms);
        let kc = chunks.div_ceil(splits).next_multiple_of(2);
        let splits = chunks.div_ceil(kc);
        let part = if splits > 1 {
            Some(self.alloc_unset(splits * t * w.rows)?)
        } else {
            None
        };
        let tickets = self.splitk_tickets(splits, (row_tiles * token_tiles) as usize);
        ops::prefill::GemmH16Args {
            segs,
            xh,
            bias: g.bias,
            resid: g.resid,
            k: k as i32,
            t: t as i32,
            kc: kc as i32,
            part: part.as_ref().map_or(DevPtr::NULL, |p| self.ptr(p)),
            xds,
            tickets,
        }
        .launch(
            self,
            variant,
            (row_tiles, token_tiles, splits as u32),
            (256, 1, 1),
        )?;
        self.count_h16_few(variant);
        match &part {
            Some(part) if tickets.is_null() => {
                self.gemm_splitk_reduce(w, g, self.ptr(part), splits, xds)
            }
            _ => Ok(()),
        }
    }

    /// The tickets of a `gemm_mma` / `gemm_h16` launch of `tiles` tiles split `splits` ways
    /// over K whose tiles' last blocks add the splits (`CudaOptions::splitk_last`; counted in
    /// `splitk_last_launches`); null where they do not (one split, the option off, more tiles
    /// than [`SPLIT_TICKETS`]): `gemm_splitk_reduce` adds them.
    fn splitk_tickets(&self, splits: usize, tiles: usize) -> DevPtr<u32> {
        if splits < 2 || tiles > SPLIT_TICKETS || !self.opts().splitk_last {
            return DevPtr::NULL;
        }
        self.inner
            .splitk_last_launches
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.ptr(&self.inner.split_tickets)
    }

    /// [`Backend::linears`](crate::Backend::linears): x's rows prepared once for the weights
    /// that share them ([`shared_input`](Self::shared_input)); those of them on `gemm_h16`
    /// without a bias in one launch where their row tiles together fill the device without a K
    /// split (q/k/v of a prompt: k and v alone would each split K and reduce), unless
    /// `CudaOptions::h16_merged` is off; the others one by one.
    pub(crate) fn linears_rows(
        &self,
        x: &CudaTensor,
        ws: &[(&CudaLinear, Option<&CudaTensor>)],
    ) -> Result<Vec<CudaTensor>> {
        let weights: Vec<&CudaLinear> = ws.iter().map(|&(w, _)| w).collect();
        let (ptr, t, k) = (self.ptr(&x.buf), x.rows, x.cols);
        let shared = self.shared_input(&weights, (ptr, t, k))?;
        let mut outs: Vec<Option<CudaTensor>> = ws.iter().map(|_| None).collect();
        if let (Some(xds), Some(xh)) = (&shared.xds, &shared.xh) {
            let merged: Vec<usize> = (0..ws.len())
                .filter(|&i| {
                    ws[i].1.is_none() && ws[i].0.cols == k && self.gemm_h16_takes(ws[i].0, t)
                })
                .take(MultiLinear::MAX)
                .collect();
            let row_tiles: usize = merged
                .iter()
                .map(|&i| ws[i].0.rows.div_ceil(GEMM_H16_ROWS as usize))
                .sum();
            let (variant, tile) = merged.first().map_or((0, GEMM_H16_TOKENS as usize), |&i| {
                self.h16_variant(ws[i].0, t)
            });
            let tiles = row_tiles * t.div_ceil(tile);
            if self.opts().h16_merged
                && merged.len() >= 2
                && gemm_k_splits(tiles, k / 32, self.inner.sms) == 1
            {
                let (segs, row_tiles) =
                    self.merged_segs(ws, &merged, (t, &mut outs), GEMM_H16_ROWS as usize)?;
                ops::prefill::GemmH16Args {
                    segs,
                    xh: self.ptr(xh),
                    bias: DevPtr::NULL,
                    resid: DevPtr::NULL,
                    k: k as i32,
                    t: t as i32,
                    kc: (k / 32).next_multiple_of(2) as i32,
                    part: DevPtr::NULL,
                    xds: self.ptr(xds),
                    tickets: DevPtr::NULL,
                }
                .launch(
                    self,
                    variant,
                    (row_tiles, t.div_ceil(tile) as u32, 1),
                    (256, 1, 1),
                )?;
                self.count_h16_few(variant);
            }
        }
        self.merged_bf16_rows(x, ws, &mut outs)?;
        ws.iter()
            .zip(outs)
            .map(|(&(w, bias), out)| match out {
                Some(y) => Ok(y),
                None => self.linear_rows(x, w, bias, &shared),
            })
            .collect()
    }

    /// The segments of one launch over the weights `merged` (indices into `ws`), each into a new
    /// output of `t` rows put in its place of `outs`, a block covering `rows_per_block` rows;
    /// and the blocks in all.
    fn merged_segs(
        &self,
        ws: &[(&CudaLinear, Option<&CudaTensor>)],
        merged: &[usize],
        (t, outs): (usize, &mut [Option<CudaTensor>]),
        rows_per_block: usize,
    ) -> Result<(Segs, u32)> {
        let mut parts = Vec::with_capacity(merged.len());
        for &i in merged {
            let y = self.tensor(t, ws[i].0.rows)?;
            parts.push((ws[i].0, self.ptr(&y.buf)));
            outs[i] = Some(y);
        }
        Ok(Segs::of(self, &parts, |_| rows_per_block))
    }

    /// [`linears_rows`](Self::linears_rows)' bf16 weights of `ws` without a bias that `gemv_raw`
    /// would run on `gemm_mma` (a prompt's MoE router and shared expert's gate and up), into
    /// `outs`, in one `gemm_mma_segs` launch where their row tiles together fill the device
    /// without a K split and some of them alone would split K (and add the splits in a launch of
    /// its own), where `CudaOptions::mma_merged` is on; otherwise nothing.
    fn merged_bf16_rows(
        &self,
        x: &CudaTensor,
        ws: &[(&CudaLinear, Option<&CudaTensor>)],
        outs: &mut [Option<CudaTensor>],
    ) -> Result<()> {
        if !self.opts().mma_merged {
            return Ok(());
        }
        let (t, k) = (x.rows, x.cols);
        let merged: Vec<usize> = (0..ws.len())
            .filter(|&i| {
                let w = ws[i].0;
                outs[i].is_none()
                    && ws[i].1.is_none()
                    && w.fmt == 2
                    && w.cols == k
                    && self.gemm_mma_runs(w, t)
            })
            .take(MultiLinear::MAX)
            .collect();
        let chunks = k / 32;
        let token_tiles = t.div_ceil(GEMM_MMA_TOKENS as usize);
        let tiles = |w: &CudaLinear| w.rows.div_ceil(GEMM_MMA_ROWS as usize) * token_tiles;
        let all: usize = merged.iter().map(|&i| tiles(ws[i].0)).sum();
        let sms = self.inner.sms;
        if merged.len() < 2
            || gemm_k_splits(all, chunks, sms) > 1
            || merged
                .iter()
                .all(|&i| gemm_k_splits(tiles(ws[i].0), chunks, sms) == 1)
        {
            return Ok(());
        }
        let (segs, row_tiles) = self.merged_segs(ws, &merged, (t, outs), GEMM_MMA_ROWS as usize)?;
        ops::prefill::GemmMmaSegsArgs {
            segs,
            x: self.ptr(&x.buf),
            k: k as i32,
            t: t as i32,
        }
        .launch(self, (row_tiles, token_tiles as u32, 1), (256, 1, 1))?;
        self.inner
            .merged_bf16_linears
            .fetch_add(merged.len(), std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Linears run in `gemm_mma_segs` launches ([`linears_rows`](Self::linears_rows): several
    /// bf16 weights on one prompt's rows) on this backend (and its clones) so far.
    pub fn merged_bf16_linears(&self) -> usize {
        self.inner
            .merged_bf16_linears
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// x's f16 parts for `gemm_h16`: `t` rows of `k` values (`k % 32 == 0`) times their
    /// `row_pow2` factors (`xds`), split by `x_split_h16`.
    pub(crate) fn split_h16(
        &self,
        x: DevPtr<f32>,
        xds: DevPtr<f32>,
        t: usize,
        k: usize,
    ) -> Result<CudaSlice<u16>> {
        let xh = self.alloc_unset::<u16>(2 * t * k)?;
        self.launch_split_h16(
            x,
            (xds, DevPtr::NULL),
            (DevPtr::NULL, 0),
            t,
            k,
            self.ptr(&xh),
        )?;
        Ok(xh)
    }

    /// The `row_pow2` scales of `t` rows of `k` values (`k % 32 == 0`) and the rows' f16 parts
    /// for `gemm_h16` ([`split_h16`](Self::split_h16) with the scales computed in the same
    /// launch: x read from memory twice instead of three times). `gate` `(g, group)`: of x times
    /// `softplus(g[t, j / group])` (`group % 4 == 0`; `softplus_gate`'s products, never written
    /// back).
    pub(crate) fn scale_split_h16(
        &self,
        x: DevPtr<f32>,
        gate: Option<(DevPtr<f32>, usize)>,
        t: usize,
        k: usize,
    ) -> Result<(CudaSlice<f32>, CudaSlice<u16>)> {
        let xds = self.alloc_unset::<f32>(t)?;
        let xh = self.alloc_unset::<u16>(2 * t * k)?;
        let gate = gate.unwrap_or((DevPtr::NULL, 0));
        self.launch_split_h16(x, (DevPtr::NULL, self.ptr(&xds)), gate, t, k, self.ptr(&xh))?;
        Ok((xds, xh))
    }

    /// `x_split_h16` over `t` rows of `k` values into `xh`, with the scales given (`xds.0`) or
    /// computed into `xds.1`, and the gate `(gate, group)` (null: none).
    fn launch_split_h16(
        &self,
        x: DevPtr<f32>,
        (xds, xds_out): (DevPtr<f32>, DevPtr<f32>),
        (gate, group): (DevPtr<f32>, usize),
        t: usize,
        k: usize,
        xh: DevPtr<u16>,
    ) -> Result<()> {
        let wpr = self.split_row_warps(t, k);
        ops::prefill::XSplitH16Args {
            x,
            xds,
            t: t as i32,
            k: k as i32,
            xh,
            xds_out,
            gate,
            group: group as i32,
            wpr: wpr as i32,
        }
        .launch(self, ((t * wpr).div_ceil(8) as u32, 1, 1), (256, 1, 1))
    }

    /// Warps a row of `x_split_h16` over `t` rows of `k` values: `CudaOptions::split_row_warps`
    /// where it is set, else the fewest of 1, 2, 4 and 8 whose blocks (8 rows a block at one
    /// warp a row) cover the device's SMs, at most one a 128 values.
    pub fn split_row_warps(&self, t: usize, k: usize) -> usize {
        let set = self.opts().split_row_warps;
        if set > 0 {
            return set;
        }
        let mut pick = 1;
        for w in [1, 2, 4, 8]
            .into_iter()
            .take_while(|&w| w == 1 || w * 128 <= k)
        {
            pick = w;
            if (t * w).div_ceil(8) >= self.sm_count() {
                break;
            }
        }
        pick
    }

    /// The `row_pow2` scales of the `rows` rows of `x` (`cols` values each) where the tensor-core
    /// GEMMs (`gemm_mma`, the grouped experts) take their f16 path: NVFP4 weights (`fmt` 3) on
    /// sm_89+ (f16 weights from fp8 conversions); `None` otherwise (the bf16 path, three parts).
    pub(crate) fn row_scales_for_f16_mma(
        &self,
        fmt: i32,
        x: DevPtr<f32>,
        rows: usize,
        cols: usize,
    ) -> Result<Option<CudaSlice<f32>>> {
        if rows == 0 || !self.f16_mma_applies(fmt, cols) {
            return Ok(None);
        }
        let ds = self.alloc_unset::<f32>(rows)?;
        ops::prefill::RowPow2Args {
            x,
            rows: rows as i32,
            k: cols as i32,
            ds: self.ptr(&ds),
        }
        .launch(self, ((rows as u32).div_ceil(8), 1, 1), (256, 1, 1))?;
        Ok(Some(ds))
    }

    /// Whether the tensor-core GEMMs take their f16 path for weights of format `fmt` with `cols`
    /// inputs: NVFP4 on sm_89+ (tensor cores on), `cols % 4 == 0` (`row_pow2`'s rows).
    pub(crate) fn f16_mma_applies(&self, fmt: i32, cols: usize) -> bool {
        fmt == 3 && self.inner.mma && cols.is_multiple_of(4)
    }

    /// Whether `gemm_mma` takes `t` tokens of `w` (bf16 or NVFP4, K % 32 == 0) where the
    /// tensor-core GEMM is `on` (switched on, sm_80+); `gemv_raw` asks it after the one-token
    /// and few-token paths declined.
    fn gemm_mma_takes(w: &CudaLinear, t: usize, on: bool) -> bool {
        on && t >= GEMM_MMA_MIN_TOKENS && w.cols.is_multiple_of(32) && (w.fmt == 2 || w.fmt == 3)
    }

    /// Whether `gemv_raw` runs `t` tokens of `w` on `gemm_mma`'s f16 path (so needs the rows'
    /// `row_pow2` scales).
    fn gemm_mma_f16_applies(&self, w: &CudaLinear, t: usize) -> bool {
        self.gemm_mma_runs(w, t) && self.f16_mma_applies(w.fmt, w.cols)
    }

    /// Whether `gemv_raw` runs `t` tokens of `w` on `gemm_mma` (or, for NVFP4 there, on
    /// `gemm_h16`): the few-token GEMV declines and the tensor-core GEMM is on.
    fn gemm_mma_runs(&self, w: &CudaLinear, t: usize) -> bool {
        let on = {
            let o = self.opts();
            o.tiled_prefill && o.mma_gemm && self.inner.sm80
        };
        !self.gemv_mt_applies(w, t) && Self::gemm_mma_takes(w, t, on)
    }

    /// The `t` rows of `x` (`cols` values each) prepared once for those of `ws` (of `cols`
    /// inputs: q/k/v of one input) that need it, to be handed to each through
    /// [`SharedInput::onto`]: the `row_pow2` scales where two or more run on a tensor-core
    /// GEMM's f16 path, and x's f16 parts where two or more of those run on `gemm_h16`. Where
    /// fewer do, each prepares its own.
    pub(crate) fn shared_input(
        &self,
        ws: &[&CudaLinear],
        (x, t, cols): (DevPtr<f32>, usize, usize),
    ) -> Result<SharedInput> {
        let takers: Vec<&CudaLinear> = ws
            .iter()
            .copied()
            .filter(|w| w.cols == cols && self.gemm_mma_f16_applies(w, t))
            .collect();
        let [first, _, ..] = takers[..] else {
            return Ok(SharedInput::default());
        };
        if takers.iter().filter(|w| self.gemm_h16_takes(w, t)).count() >= 2 {
            let (xds, xh) = self.scale_split_h16(x, None, t, cols)?;
            return Ok(SharedInput {
                xds: Some(xds),
                xh: Some(xh),
            });
        }
        let xds = self.row_scales_for_f16_mma(first.fmt, x, t, cols)?;
        Ok(SharedInput { xds, xh: None })
    }

    /// Whether `t` tokens of `w` run on the few-token tensor-core GEMV (`gemv_mt`): 2 to
    /// `CudaOptions::few_token_max` tokens, a bf16 (sm_80+) or NVFP4 (sm_89+, tensor cores on)
    /// weight with `cols % 128 == 0`, `cols <= NV_MAX_K`, the legacy GEMV off.
    pub(crate) fn gemv_mt_applies(&self, w: &CudaLinear, t: usize) -> bool {
        let (legacy, few_max) = {
            let o = self.opts();
            (o.legacy_gemv, o.few_token_max)
        };
        t >= 2
            && t <= few_max
            && !legacy
            && ((w.fmt == 3 && self.inner.mma) || (w.fmt == 2 && self.inner.sm80))
            && w.cols.is_multiple_of(MMA_CHUNK)
            && w.cols <= NV_MAX_K
            && !(self.h16_few(w, t) && self.gemm_h16_able(w))
    }

    /// `y_i = resid + x · W_iᵀ + bias` for `t` tokens and each `(W_i, y_i)` of `parts` (at most
    /// [`MultiLinear::MAX`], one format, one width, [`gemv_mt_applies`](Self::gemv_mt_applies)
    /// to each; `bias`, `resid` only with one part) on the few-token tensor-core GEMV: the tokens'
    /// rows staged once as B operands (`xb_stage`), then one `gemv_mt` launch reading every
    /// weight row once per [`GEMV_MT_TOKENS`] tokens (`gemv_mma`'s tiles and K split). Per
    /// token the precision of the one-token path: NVFP4 as `gemv_mma` (x as f16 high parts and
    /// remainders), bf16 as `gemm_mma` (x as three bf16 parts, 24 significant bits).
    pub(crate) fn gemv_mt(
        &self,
        parts: &[(&CudaLinear, DevPtr<f32>)],
        x: MtInput,
        t: usize,
        bias: DevPtr<f32>,
        resid: DevPtr<f32>,
    ) -> Result<()> {
        if let Some(splits) = self.wide_splits(parts, t) {
            let (xb, xds, _staged) = self.mt_input(parts, x, t, bias, resid)?;
            let (segs, blocks) = Segs::of(self, parts, |_| MT_WIDE_ROWS);
            // (every split writes all of its rows' sums)
            let part = if splits > 1 {
                Some(self.alloc_unset::<f32>(splits * t * MT_WIDE_ROWS * blocks as usize)?)
            } else {
                None
            };
            ops::gemv::GemvMtWideArgs {
                segs,
                xb,
                xds,
                bias,
                resid,
                k: parts[0].0.cols as i32,
                t: t as i32,
                part: part.as_ref().map_or(DevPtr::NULL, |p| self.ptr(p)),
                tickets: self.ptr(&self.inner.split_tickets),
            }
            .launch(self, (blocks, splits as u32, 1), (32 * NV_WARPS, 1, 1))?;
            self.inner
                .wide_linears
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Ok(());
        }
        let plan = self.gemv_mt_plan(parts, x, t, bias, resid)?;
        ops::gemv::GemvMtArgs {
            segs: plan.segs,
            xb: plan.xb,
            xds: plan.xds,
            bias,
            resid,
            k: plan.cols,
            t: t as i32,
            ks: plan.ks,
        }
        .launch(self, plan.variant, plan.grid, (32 * NV_WARPS, 1, 1))?;
        if matches!(plan.variant, MT_NV4_DEEP_VARIANT | MT_NV_DEEP_VARIANT) {
            self.inner
                .deep_linears
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(())
    }

    /// [`gemv_mt`](Self::gemv_mt) of one input's NVFP4 linears `nv` and bf16 linears `bf` in
    /// one launch, the input staged for each format (`nv_x`, `bf_x`): up to 4 tokens on
    /// `gemv_mt_mixed4` (`gemv_mt_nv4`'s path), more on `gemv_mt_mixed8` (`gemv_mt_nv`'s, the
    /// bf16 blocks first); where [`gemv_mt_mixed_applies`](Self::gemv_mt_mixed_applies); the
    /// bits of the two launches.
    pub(crate) fn gemv_mt_mixed(
        &self,
        (nv, nv_x): (&[(&CudaLinear, DevPtr<f32>)], MtInput),
        (bf, bf_x): (&[(&CudaLinear, DevPtr<f32>)], MtInput),
        t: usize,
    ) -> Result<()> {
        let pn = self.gemv_mt_plan(nv, nv_x, t, DevPtr::NULL, DevPtr::NULL)?;
        let pb = self.gemv_mt_plan(bf, bf_x, t, DevPtr::NULL, DevPtr::NULL)?;
        let four = t <= GEMV_MT4_TOKENS;
        self.check(
            // (the deep variants have their plain kernel's bits)
            if four {
                matches!(pn.variant, MT_NV4_VARIANT | MT_NV4_DEEP_VARIANT)
            } else {
                matches!(pn.variant, MT_NV_VARIANT | MT_NV_DEEP_VARIANT)
            } && pb.variant == MT_BF16_VARIANT
                && pn.cols == pb.cols
                && pn.grid.1 == pb.grid.1,
            || format!("gemv_mt_mixed of {t} tokens"),
        )?;
        // (four tokens: the NVFP4 blocks first; more: the few bf16 blocks first, beside q/k/v's
        // first wave)
        let (variant, nv_segs, bf_segs) = if four {
            (0, pn.segs, pb.segs.shifted(pn.grid.0))
        } else {
            (1, pn.segs.shifted(pb.grid.0), pb.segs)
        };
        ops::gemv::GemvMtMixedArgs {
            nv: nv_segs,
            bf: bf_segs,
            xb_nv: pn.xb,
            xds_nv: pn.xds,
            xb_bf: pb.xb,
            xds_bf: pb.xds,
            k: pn.cols,
            t: t as i32,
            ks_nv: pn.ks,
            ks_bf: pb.ks,
        }
        .launch(
            self,
            variant,
            (pn.grid.0 + pb.grid.0, pn.grid.1, 1),
            (32 * NV_WARPS, 1, 1),
        )?;
        self.inner
            .mixed_linears
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// The K splits of `gemv_mt_wide` for `t` tokens of `parts` (the first part's format and
    /// width; [`mt_input`](Self::mt_input) checks the others), or `None` where it does not run them: the
    /// device unable ([`Inner::mt_wide`]), switched off or below its tokens
    /// (`CudaOptions::mt_wide_min_tokens`, at least [`MT_WIDE_MIN_TOKENS`]), more than
    /// [`MT_WIDE_TOKENS`], not NVFP4, more row blocks than tickets, or a fixed K split
    /// (`CudaOptions::mt_k_split`, as `gemv_mt`'s: then the bits of `gemv_mt_nv`) that leaves a
    /// split more than [`MT_WIDE_RUN`] chunks.
    fn wide_splits(&self, parts: &[(&CudaLinear, DevPtr<f32>)], t: usize) -> Option<usize> {
        let (min, fixed) = {
            let o = self.opts();
            (o.mt_wide_min_tokens, o.mt_k_split)
        };
        let (fmt, cols) = parts.first().map(|(w, _)| (w.fmt, w.cols))?;
        if !self.inner.mt_wide
            || min == 0
            || t < min.max(MT_WIDE_MIN_TOKENS)
            || t > MT_WIDE_TOKENS
            || fmt != 3
        {
            return None;
        }
        let blocks: usize = parts
            .iter()
            .map(|(w, _)| w.rows.div_ceil(MT_WIDE_ROWS))
            .sum();
        let chunks = cols / MMA_CHUNK;
        let splits = fixed.unwrap_or_else(|| wide_split(blocks, chunks, 2 * self.inner.sms));
        (blocks <= SPLIT_TICKETS && splits <= chunks && chunks.div_ceil(splits) <= MT_WIDE_RUN)
            .then_some(splits)
    }

    /// Whether [`gemv_mt_mixed`](Self::gemv_mt_mixed) runs one input's NVFP4 linears `nv` and
    /// its bf16 linears of `t` tokens (each on `gemv_mt`): switched on (`CudaOptions::mt_mixed`)
    /// and the NVFP4 ones on `gemv_mt_nv4` (at most four tokens), or, past four tokens, on
    /// `gemv_mt_nv` (or its deep variant) where `CudaOptions::mt_mixed8` is on.
    pub(crate) fn gemv_mt_mixed_applies(
        &self,
        nv: &[(&CudaLinear, DevPtr<f32>)],
        t: usize,
    ) -> bool {
        let (on, four, eight) = {
            let o = self.opts();
            (
                o.mt_mixed,
                o.mt_4_tokens,
                o.mt_mixed8 && !o.mt_16_tokens && !o.mt_one_block,
            )
        };
        on && if t <= GEMV_MT4_TOKENS {
            four
        } else {
            eight && self.wide_splits(nv, t).is_none()
        }
    }

    /// The geometry of a [`gemv_mt`](Self::gemv_mt) launch (its checks, its input staged where
    /// it is given as rows).
    pub(crate) fn gemv_mt_plan(
        &self,
        parts: &[(&CudaLinear, DevPtr<f32>)],
        x: MtInput,
        t: usize,
        bias: DevPtr<f32>,
        resid: DevPtr<f32>,
    ) -> Result<MtPlan> {
        let (fmt, cols) = parts.first().map_or((0, 0), |(w, _)| (w.fmt, w.cols));
        let (xb, xds, staged) = self.mt_input(parts, x, t, bias, resid)?;
        let rows: usize = parts.iter().map(|(w, _)| w.rows).sum();
        let (one_block, sixteen, four, deep, deep_all) = {
            let o = self.opts();
            (
                o.mt_one_block,
                o.mt_16_tokens,
                o.mt_4_tokens,
                o.mt_deep,
                o.mt_deep_all,
            )
        };
        let sms = self.inner.sms;
        let ks = self.mt_k_split(rows, cols);
        let tile_rows = 16 * (NV_WARPS as usize / ks);
        let (mut segs, block0) = Segs::of(self, parts, |_| tile_rows);
        segs.l2_prefetch = i32::from(self.l2_prefetch(t));
        segs.interleave = i32::from(self.opts().mt_interleave);
        let (variant, per_grid_row) = match fmt {
            2 => (MT_BF16_VARIANT, GEMV_MT_TOKENS),
            _ if sixteen && t > GEMV_MT_TOKENS => (3, GEMV_MT16_TOKENS),
            _ if four && t <= GEMV_MT4_TOKENS => (MT_NV4_VARIANT, GEMV_MT4_TOKENS),
            _ if one_block => (2, GEMV_MT_TOKENS),
            _ => (MT_NV_VARIANT, GEMV_MT_TOKENS),
        };
        // a grid of at most one block a SM (any, with `mt_deep_all`): each warp's whole run of
        // chunks in flight
        let grid_rows = t.div_ceil(per_grid_row);
        let go_deep = deep && (deep_all || block0 as usize * grid_rows <= sms);
        let variant = match variant {
            MT_NV4_VARIANT if go_deep => MT_NV4_DEEP_VARIANT,
            MT_NV_VARIANT if go_deep => MT_NV_DEEP_VARIANT,
            v => v,
        };
        Ok(MtPlan {
            segs,
            xb,
            xds,
            _staged: staged,
            cols: cols as i32,
            ks: ks as i32,
            variant,
            grid: (block0, grid_rows as u32, 1),
        })
    }

    /// The K split (warps a 16-row tile) of a `gemv_mt` launch of `rows` weight rows (all its
    /// parts') of `cols` columns: `CudaOptions::mt_k_split`, else [`mma_split`]'s aimed at
    /// `CudaOptions::mt_blocks_per_sm` blocks a SM.
    pub(crate) fn mt_k_split(&self, rows: usize, cols: usize) -> usize {
        let (fixed, fill) = {
            let o = self.opts();
            (o.mt_k_split, o.mt_blocks_per_sm)
        };
        fixed.unwrap_or_else(|| mma_split(rows, cols, fill.max(1) * self.inner.sms))
    }

    /// The checks of a `gemv_mt` launch of `parts` over `t` tokens (one format and width, each
    /// [`gemv_mt_applies`](Self::gemv_mt_applies), `bias` and `resid` with one part only) and
    /// its staged input: B entries, row scales and the buffers staged here (where `x` came as
    /// rows), alive until the launch.
    #[allow(clippy::type_complexity)]
    fn mt_input(
        &self,
        parts: &[(&CudaLinear, DevPtr<f32>)],
        x: MtInput,
        t: usize,
        bias: DevPtr<f32>,
        resid: DevPtr<f32>,
    ) -> Result<(
        DevPtr<u32>,
        DevPtr<f32>,
        Option<(CudaSlice<u32>, CudaSlice<f32>)>,
    )> {
        let (fmt, cols) = parts.first().map_or((0, 0), |(w, _)| (w.fmt, w.cols));
        self.check(
            !parts.is_empty()
                && parts.len() <= MultiLinear::MAX
                && (parts.len() == 1 || (bias.is_null() && resid.is_null()))
                && parts
                    .iter()
                    .all(|(w, _)| w.fmt == fmt && w.cols == cols && self.gemv_mt_applies(w, t)),
            || format!("gemv_mt: {} linears of {t} tokens", parts.len()),
        )?;
        Ok(match x {
            MtInput::Staged(xb, xds) => (xb, xds, None),
            MtInput::Rows(x) => {
                let own = self.stage_rows(x, t, cols, fmt)?;
                (self.ptr(&own.0), self.ptr(&own.1), Some(own))
            }
        })
    }

    /// `t` rows of `x` (`cols` values each) staged as `gemv_mt`'s B operands for weights of
    /// format `fmt` (`xb_stage`): the entries (K u32 a row for NVFP4: f16 high parts and
    /// remainders; 3 K / 2 for bf16: three bf16 parts) and the rows' scales.
    pub(crate) fn stage_rows(
        &self,
        x: DevPtr<f32>,
        t: usize,
        cols: usize,
        fmt: i32,
    ) -> Result<(CudaSlice<u32>, CudaSlice<f32>)> {
        let per_row = if fmt == 2 { 3 * cols / 2 } else { cols };
        let xb = self.alloc_unset::<u32>(t * per_row)?;
        let xds = self.alloc_unset::<f32>(t)?;
        ops::gemv::XbStageArgs {
            x,
            k: cols as i32,
            fmt,
            xb: self.ptr(&xb),
            ds: self.ptr(&xds),
        }
        .launch(self, (t as u32, 1, 1), (256, 1, 1))?;
        Ok((xb, xds))
    }

    /// Whether `linear_multi` takes inputs of width `k` (`K % 32 == 0`, `K <= XS_MAX`).
    pub fn linear_multi_applies(k: usize) -> bool {
        k > 0 && k.is_multiple_of(32) && k <= NV_MAX_K
    }

    /// `x · W_iᵀ` for each of `ws` (at most 6, all of `x`'s width, which
    /// `linear_multi_applies`) over one token `x` (`[1, cols]`), in one launch: the q/k/v/gate
    /// projections of a decode step.
    pub fn linear_multi(&self, x: &CudaTensor, ws: &[&CudaLinear]) -> Result<Vec<CudaTensor>> {
        self.check(x.rows == 1, || {
            format!("linear_multi of {} tokens (one only)", x.rows)
        })?;
        let ys = ws
            .iter()
            .map(|w| self.tensor(1, w.rows))
            .collect::<Result<Vec<_>>>()?;
        let parts: Vec<(&CudaLinear, DevPtr<f32>)> = ws
            .iter()
            .zip(&ys)
            .map(|(w, y)| (*w, self.ptr(&y.buf)))
            .collect();
        self.linear_multi_raw(&MultiLinear::new(self, &parts, x.cols)?, self.ptr(&x.buf))?;
        Ok(ys)
    }

    /// The linears of `m` over one token's `x` in one launch (`linear_multi2`).
    pub(crate) fn linear_multi_raw(&self, m: &MultiLinear, x: DevPtr<f32>) -> Result<()> {
        ops::gemv::LinearMulti2Args {
            segs: m.segs,
            x,
            k: m.k as i32,
            mma: i32::from(self.inner.mma),
        }
        .launch(self, (m.blocks, 1, 1), (32 * MULTI_WARPS, 1, 1))
    }

    /// Output rows of one `linear_multi2` block for the segment of weight `w` (input width `k`):
    /// 64 on the tensor-core path, `MULTI_WARPS · MULTI_R` otherwise.
    pub(crate) fn multi_rows_per_block(&self, w: &CudaLinear, k: usize) -> u32 {
        if self.inner.mma && w.fmt == 3 && k.is_multiple_of(MMA_CHUNK) && k <= NV_MAX_K {
            64
        } else {
            MULTI_WARPS * EXPERT_ROWS
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A decode batch's few tiles are split along K up to two blocks per SM, never below
    /// the minimum run of chunks; prefill-sized grids are not split.
    #[test]
    fn gemm_k_splits_fill_the_device() {
        // o_proj of 32 tokens: 16 tiles, K 8192 = 256 chunks, 132 SMs
        assert_eq!(gemm_k_splits(16, 256, 132), 32);
        // a router of 256 rows over K 2048 (64 chunks): at most 64 / 8 splits
        assert_eq!(gemm_k_splits(2, 64, 132), 8);
        // 2048 tokens x 2048 rows: 512 tiles, no split
        assert_eq!(gemm_k_splits(512, 64, 132), 1);
        assert_eq!(gemm_k_splits(1, 8, 132), 1);
    }

    /// `gemv_mt_wide`'s K split keeps every split within its shared memory's run of chunks,
    /// fills one wave where the rows alone do not, and leaves each split 2+ chunks.
    #[test]
    fn wide_split_keeps_each_run_within_its_shared_memory() {
        // XS's q/k/v (80 row blocks of 128 over K 2048: 16 chunks) and o (16 over 8192: 64) on 132 SMs
        assert_eq!(wide_split(80, 16, 264), 4);
        assert_eq!(wide_split(16, 64, 264), 16);
        // a few rows over a short K: split while the wave has room and runs keep 2 chunks
        assert_eq!(wide_split(2, 16, 264), 8);
        assert_eq!(wide_split(1, 2, 264), 1);
        for chunks in 1..=72 {
            for blocks in [1, 16, 80, 784] {
                let s = wide_split(blocks, chunks, 264);
                assert!(
                    chunks.div_ceil(s) <= MT_WIDE_RUN,
                    "{blocks} x {chunks}: {s}"
                );
                assert!(s <= chunks, "{blocks} x {chunks}: {s}");
                assert!(s == 1 || chunks / s >= 2 || chunks.div_ceil(s / 2) > MT_WIDE_RUN);
            }
        }
    }

    /// `gemv_mma` stages each warp's chunks of x in a region of `MMA_WARP_CHUNKS`: the split
    /// must keep every warp within it for every K the kernel takes.
    #[test]
    fn mma_split_keeps_each_warp_within_its_staging_region() {
        for cols in (MMA_CHUNK..=NV_MAX_K).step_by(MMA_CHUNK) {
            for rows in [16, 100, 1024, 3072, 6144, 100_352] {
                for sms in [1, 78, 132] {
                    let ks = mma_split(rows, cols, sms);
                    assert!([1, 2, 4, 8].contains(&ks));
                    assert!(
                        (cols / MMA_CHUNK).div_ceil(ks) <= MMA_WARP_CHUNKS,
                        "{rows} x {cols} on {sms} SMs: split {ks}"
                    );
                }
            }
        }
    }

    /// `nv_split` splits K over 1, 2, 4 or 8 warps (its index among them returned with it),
    /// never below 32 chunks of 32 per warp, and stops splitting once the row warps × split
    /// cover 32 warps per SM.
    #[test]
    fn nv_split_keeps_whole_chunks_per_warp() {
        for cols in [32, 512, 1024, 2048, 3072, 8192, 9216] {
            for rows in [1, 72, 1024, 3072, 9216, 100_352] {
                for sms in [1, 78, 132] {
                    let (i, ks) = nv_split(rows, cols, sms);
                    assert_eq!([1, 2, 4, 8][i], ks);
                    assert!(ks == 1 || cols / 32 >= 32 * ks, "{rows} x {cols}: {ks}");
                    if ks > 1 {
                        // the next smaller split did not reach the target yet
                        assert!(rows.div_ceil(NV_ROWS) * (ks / 2) < 32 * sms);
                    }
                }
            }
        }
    }
}
