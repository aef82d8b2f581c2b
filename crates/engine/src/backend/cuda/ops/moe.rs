//! Mixture of experts (kernels/moe.cu, host side): expert weights in arenas, the router's
//! top-k, the routed and shared experts of one or more tokens (persistent kernels for one token,
//! grouped by expert on tensor cores for many, one grid row per (token, expert) pair otherwise).

use crate::backend::cuda::*;

kernels! {
    group moe;

    /// The router's top-`k` of `n` expert logits per token (one warp per token); with
    /// `pf.items`, grid (tokens, `k`): block (t, q) also prefetches token t's q-th expert.
    route => RouteArgs {
        logits: DevPtr<f32>, bias: DevPtr<f32>, n: i32, k: i32, softmax: i32, normalize: i32,
        softcap: f32, scale: f32, sel: DevPtr<i32>, wts: DevPtr<f32>, pf: ExpertPrefetch,
    }
    /// The router's bf16 `gemv_mt` over `t` staged rows into its segment's output, then the
    /// top-`k` of its `n` logits per token (`route`'s bits) by the block that finishes last
    /// (`ticket`: zero between launches); `bn` > 0: that block then also groups the items by
    /// expert in tiles of up to `bn` (`moe_align`'s `order`, `tiles`, `ntiles`).
    gemv_mt_bf16_topk => GemvMtBf16TopkArgs {
        segs: Segs, xb: DevPtr<u32>, xds: DevPtr<f32>, cols: i32, t: i32, ks: i32,
        bias: DevPtr<f32>, n: i32, k: i32, softmax: i32, normalize: i32, softcap: f32,
        scale: f32, sel: DevPtr<i32>, wts: DevPtr<f32>, ticket: DevPtr<u32>, bn: i32,
        order: DevPtr<i32>, tiles: DevPtr<i32>, ntiles: DevPtr<i32>,
    }
    /// Gate/up (SiLU · up into `h`) of each (token, expert) item, one grid row per item.
    /// With `dpf.items`, its blocks then prefetch their share of the routed items' down
    /// projections (of `experts`) into L2; with `ahead`, first the gate/up rows of the block
    /// that many grid rows later (routed items from `gu_prefetched` on). With `xbs` (else null),
    /// the routed items read x's rows as already staged for NVFP4 (`xbs`, scales `xds`).
    /// `experts_gate_up2_tc`: the tensor-core path alone (routed items, NVFP4) at 2 chunk slots a
    /// lane, three blocks a SM (`CudaOptions::gate_up_tc`).
    experts_gate_up2 ["experts_gate_up2", "experts_gate_up2_tc"] => ExpertsGateUp2Args {
        gate: ExpertProj, up: ExpertProj, sgate: ExpertProj, sup: ExpertProj, has_shared: i32,
        shared_inter: i32, sel: DevPtr<i32>, k: i32, t: i32, x: DevPtr<f32>, h: DevPtr<f32>,
        inter: i32, hidden: i32, mma: i32, experts: i32, dpf: ExpertPrefetch, ahead: i32,
        gu_prefetched: i32, xbs: DevPtr<u32>, xds: DevPtr<f32>,
    }
    /// Down of each item into its row of `part` (weighted), one grid row per item, 128 threads.
    /// `experts_down2_b4`: four blocks a SM (`CudaOptions::down_four_blocks`);
    /// `experts_down2_w8`: blocks of 8 warps, 256 threads (`CudaOptions::down_eight_warps`);
    /// `experts_down2_tc`: the tensor-core path alone (routed items, NVFP4, `inter` at most
    /// [`DOWN_TC_MAX_INTER`]), five blocks a SM (`CudaOptions::item_tc`).
    experts_down2 ["experts_down2", "experts_down2_b4", "experts_down2_w8", "experts_down2_tc"] => ExpertsDown2Args {
        down: ExpertProj, sdown: ExpertProj, shared_inter: i32, sel: DevPtr<i32>,
        wts: DevPtr<f32>, k: i32, t: i32, h: DevPtr<f32>, inter: i32, part: DevPtr<f32>,
        hidden: i32, mma: i32,
    }
    /// One token's gate/up on persistent blocks (the top-k first where `route` asks for it).
    experts_gate_up_p => ExpertsGateUpPArgs {
        gate: ExpertProj, up: ExpertProj, sgate: ExpertProj, sup: ExpertProj, has_shared: i32,
        shared_inter: i32, sel: DevPtr<i32>, wts: DevPtr<f32>, k: i32, x: DevPtr<f32>,
        h: DevPtr<f32>, inter: i32, hidden: i32, route: Route,
    }
    /// One token's down on persistent blocks.
    experts_down_p => ExpertsDownPArgs {
        down: ExpertProj, sdown: ExpertProj, has_shared: i32, shared_inter: i32,
        sel: DevPtr<i32>, wts: DevPtr<f32>, k: i32, h: DevPtr<f32>, inter: i32,
        part: DevPtr<f32>, hidden: i32,
    }
    /// Groups the routed items by expert: `order` (items expert by expert), `tiles` (4 ints per
    /// tile of up to `bn` items of one expert), `ntiles`. One block of 1024.
    moe_align => MoeAlignArgs {
        sel: DevPtr<i32>, items: i32, e: i32, bn: i32, order: DevPtr<i32>, tiles: DevPtr<i32>,
        ntiles: DevPtr<i32>,
    }
    /// Gate/up (SiLU · up into `h`) of every tile of up to [`FEW_TILE_ITEMS`] items on the decode
    /// GEMV's tensor-core core: grid (⌈inter / 16⌉, at most the tiles bound: a block takes
    /// tiles `blockIdx.y`, `+ gridDim.y`, ... below the count), 256 threads; `ahead` > 0: each
    /// block prefetches the weight rows of the tile that many tiles later into L2.
    /// `experts_gate_up_mt3`: 2 chunk slots a lane, three blocks a SM
    /// (`CudaOptions::few_three_blocks`); `experts_gate_up_mt8`: tiles of up to
    /// [`FEW_TILE8_ITEMS`] items (`CudaOptions::few_tile8_items`).
    experts_gate_up_mt ["experts_gate_up_mt", "experts_gate_up_mt3", "experts_gate_up_mt8"] => ExpertsGateUpMtArgs {
        gate: ExpertProj, up: ExpertProj, tiles: DevPtr<i32>, ntiles: DevPtr<i32>,
        order: DevPtr<i32>, k: i32, xb: DevPtr<u32>, xds: DevPtr<f32>, h: DevPtr<f32>,
        inter: i32, hidden: i32, ahead: i32,
    }
    /// Down (weighted, into each item's row of `part`) of every tile of up to
    /// [`FEW_TILE_ITEMS`] items: grid (⌈hidden / 64⌉, at most the tiles bound), 256 threads;
    /// the tiles, `ahead` and the variant as `experts_gate_up_mt`'s.
    experts_down_mt ["experts_down_mt", "experts_down_mt3", "experts_down_mt8"] => ExpertsDownMtArgs {
        down: ExpertProj, tiles: DevPtr<i32>, ntiles: DevPtr<i32>, order: DevPtr<i32>,
        wts: DevPtr<f32>, hb: DevPtr<u32>, hds: DevPtr<f32>, part: DevPtr<f32>, inter: i32,
        hidden: i32, ahead: i32,
    }
    /// Gate/up (SiLU · up into `h`) of every tile of items on tensor cores: grid
    /// (⌈inter / 64⌉, tiles bound); `xds`: null, or the token rows' `row_pow2` scales (the f16
    /// path of NVFP4 weights).
    experts_gate_up_mma => ExpertsGateUpMmaArgs {
        gate: ExpertProj, up: ExpertProj, tiles: DevPtr<i32>, ntiles: DevPtr<i32>,
        order: DevPtr<i32>, k: i32, x: DevPtr<f32>, h: DevPtr<f32>, inter: i32, hidden: i32,
        xds: DevPtr<f32>,
    }
    /// Down (weighted, into each item's row of `part`) of every tile of items on tensor cores:
    /// grid (⌈hidden / 128⌉, tiles bound); `hds`: null, or the item rows' `row_pow2` scales.
    experts_down_mma => ExpertsDownMmaArgs {
        down: ExpertProj, tiles: DevPtr<i32>, ntiles: DevPtr<i32>, order: DevPtr<i32>,
        wts: DevPtr<f32>, h: DevPtr<f32>, part: DevPtr<f32>, inter: i32, hidden: i32,
        hds: DevPtr<f32>,
    }
    /// [`experts_gate_up_mma`](ExpertsGateUpMmaArgs)'s product on `gemm_h16`'s core (NVFP4, sm_90):
    /// x given as `x_split_h16`'s parts `xh` (`t` token rows) with their scales `xds`; tiles of
    /// [`EXPERTS_H16_ITEMS`] items, grid (⌈inter / 64⌉, tiles bound), 256 threads.
    experts_gate_up_h16 shared EXPERTS_H16_SMEM => ExpertsGateUpH16Args {
        gate: ExpertProj, up: ExpertProj, tiles: DevPtr<i32>, ntiles: DevPtr<i32>,
        order: DevPtr<i32>, k: i32, xh: DevPtr<u16>, t: i32, h: DevPtr<f32>, inter: i32,
        hidden: i32, xds: DevPtr<f32>,
    }
    /// [`experts_down_mma`](ExpertsDownMmaArgs)'s product on `gemm_h16`'s core: h given as its
    /// parts `hh` (`items` rows) with their scales `hds`; grid (⌈hidden / 128⌉, tiles bound).
    experts_down_h16 shared EXPERTS_H16_SMEM => ExpertsDownH16Args {
        down: ExpertProj, tiles: DevPtr<i32>, ntiles: DevPtr<i32>, order: DevPtr<i32>,
        wts: DevPtr<f32>, hh: DevPtr<u16>, items: i32, part: DevPtr<f32>, inter: i32,
        hidden: i32, hds: DevPtr<f32>,
    }
    /// `out = resid + Σ part` in item order, then the epilogue `epi` in the last block.
    experts_reduce => ExpertsReduceArgs {
        part: DevPtr<f32>, k: i32, t: i32, has_shared: i32, out: DevPtr<f32>, resid: DevPtr<f32>,
        hidden: i32, epi: Epi,
    }
    /// `experts_reduce`'s sum of each token's row (one block a row), then `norm_stage` of that
    /// row: `y = rmsnorm(out) · w`, staged for `gemv_mt` (`xb_*`, `ds_*`; null: not that format).
    experts_reduce_norm_stage => ExpertsReduceNormStageArgs {
        part: DevPtr<f32>, k: i32, t: i32, has_shared: i32, out: DevPtr<f32>, resid: DevPtr<f32>,
        hidden: i32, w: DevPtr<f32>, y: DevPtr<f32>, eps: f32, xb_nv: DevPtr<u32>,
        ds_nv: DevPtr<f32>, xb_bf: DevPtr<u32>, ds_bf: DevPtr<f32>,
    }
}

/// Fewest tokens whose routed experts run grouped by expert (`experts_grouped`).
pub(crate) const GROUPED_MOE_MIN_TOKENS: usize = 16;

/// Routed items grouped by expert (`moe_align`'s output): `order` lists the items expert by
/// expert, `tiles` holds 4 ints per tile (expert, first index into `order`, items, 0) for the
/// `ntiles` tiles it made, at most `max_tiles`, of up to `per_tile` items each.
pub(crate) struct ExpertTiles {
    order: CudaSlice<i32>,
    tiles: CudaSlice<i32>,
    ntiles: CudaSlice<i32>,
    max_tiles: usize,
    per_tile: usize,
}

/// Items per tile of the few-items-per-expert kernels (`MT_BN` in kernels/moe.cu).
pub(crate) const FEW_TILE_ITEMS: usize = 4;

/// Items per tile of their `_mt8` variants (`CudaOptions::few_tile8_items`: two column groups of
/// the mma, 2 `MT_BN`).
pub(crate) const FEW_TILE8_ITEMS: usize = 8;

/// Fewest routed items per expert (on average over all experts) for which the few-items-per-tile
/// experts take tiles of [`FEW_TILE8_ITEMS`] (`CudaOptions::few_tile8_items`): prompts of 96-128
/// tokens of Laguna-XS (3-4 items an expert). H100, 2026-12-08, two rounds each (ms a prefill):
/// at 3, 96 tokens 23.85 → 23.50 and 128 tokens 28.00 → 27.10 (call 2), at 4, 128 tokens
/// 27.90 → 26.70 (call 1); 64 tokens (2 an expert) unchanged at 4.
pub(crate) const FEW_TILE8_MIN_ITEMS: usize = 3;

/// Most routed items per expert (on average over all experts) for which several tokens' experts
/// run grouped a few items per tile (`experts_grouped_few`) rather than on the tiled GEMM
/// (`CudaOptions::few_items_per_expert`).
pub(crate) const FEW_ITEMS_PER_EXPERT: usize = 4;

/// Fewest tokens whose routed experts run grouped a few items per tile (`experts_grouped_few`;
/// fewer: per item). The H200, lean Laguna-XS, 2026-12-03 (`batch_decode_speed`, ms per step,
/// grouped / per item): 2 rows 9.36 / 6.95, 16 rows 13.03 / 12.66, 32 rows 17.88 / 20.12,
/// 64 rows 23.66 / 32.89.
pub(crate) const FEW_MOE_MIN_TOKENS: usize = 32;

/// Fewest rows of a batched step whose per-item routed experts leave the shared expert to
/// `gemv_mt` ([`CudaBackend::shared_mt_applies`]), so that their down projection runs on its
/// tensor-core-only kernel (`CudaOptions::item_tc`). An H100, lean Laguna-XS, 2026-12-07 (two
/// rounds each, ms a step): per item / on `gemv_mt` 4 rows 4.45 / 4.58, 16 rows 10.79 / 10.52
/// (third session); per item / on `gemv_mt` / on `gemv_mt` with the down on `experts_down2_tc`:
/// 4 rows 4.41 / 4.53 / 4.44, 8 rows 6.58 / 6.58 / 6.35, 16 rows 10.57 / 10.61 / 10.16 (fourth
/// session). An H200, 2026-12-07 (fifth session, two rounds), the defaults of `526371a` / the
/// routed gate/up on its tensor-core-only kernel too (`CudaOptions::gate_up_tc`) / that and the
/// shared expert on `gemv_mt` from 2 rows: 4 rows 4.27 / 4.31 / 4.08, 8 rows 6.10 / 5.75 / 5.75,
/// 16 rows 9.90 / 9.25 / 9.26. An H100, 2026-12-07 (sixth session, two rounds), per item / on
/// `gemv_mt`: 2 rows 3.67 / 4.06, 3 rows 4.12 / 4.30 (one round of each faster, the other far
/// slower: kept per item below 4 rows).
pub(crate) const SHARED_MT_MIN_ROWS: usize = 4;

/// The divisor of the few-items-per-tile experts' grid rows (`experts_gate_up_mt`,
/// `experts_down_mt`: the tiles bound / this, each block looping over its tiles), unless
/// overridden (`CudaOptions::few_grid_divisor`). The H100, lean Laguna-XS, 2026-12-06 (call S,
/// one round): a 32-row step 13.34 ms with 1 (about half the blocks past the tile count), 12.24
/// with 2; at three blocks a SM (`CudaOptions::few_three_blocks`), 2026-12-07 (call 23, two
/// rounds), 12.76 with 1, 11.73 with 2.
pub(crate) const FEW_GRID_DIVISOR: usize = 2;

/// Fewest rows of a batched step that prefetches its weights into L2
/// (`CudaOptions::l2_prefetch_rows`). The H100, lean Laguna-XS, 2026-12-05 (`batch_decode_speed`,
/// ms per step, three rounds, with and without): 32 rows 14.46 / 14.83, but 2, 4 and 8 rows
/// 4.07 / 3.77, 5.05 / 4.48, 7.48 / 6.54.
pub(crate) const L2_PREFETCH_MIN_ROWS: usize = 32;

/// Most experts per layer `moe_align` handles (`MA_EMAX` in kernels/moe.cu).
pub(crate) const MOE_ALIGN_MAX_EXPERTS: usize = 1024;

/// Rows of gate and of up per warp of `experts_gate_up2` (`XR`).
pub(crate) const EXPERT_GU_ROWS: u32 = 2;

/// Warps per block of `experts_gate_up2` (x is staged in shared memory once per block).
pub(crate) const EXPERT_GU_WARPS: u32 = 8;

/// Widest expert (`inter`) whose down projection `experts_down2_tc` takes (`XSD_TC`: its h in
/// shared memory).
pub(crate) const DOWN_TC_MAX_INTER: usize = 2048;

/// Rows per warp of `experts_down2` (`XRD`).
pub(crate) const EXPERT_DOWN_ROWS: u32 = 8;

/// The kernels that run a layer's experts ([`CudaBackend::moe_path`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MoePath {
    /// One token on persistent blocks (`experts_gate_up_p`, `experts_down_p`).
    Persistent,
    /// A few items per expert tile on tensor cores (`experts_gate_up_mt`, ...).
    GroupedFew,
    /// Grouped by expert (prefill).
    Grouped,
    /// One grid row per (token, expert) item (`experts_gate_up2`, `experts_down2`).
    PerItem,
}

/// Most experts of a router whose top-k runs as its `gemv_mt`'s tail (`ROUTE_TAIL_MAX` in
/// kernels/moe.cu: the logits of a warp's token in shared memory).
pub(crate) const ROUTE_TAIL_MAX_EXPERTS: usize = 256;

/// The router's top-k for `experts_raw` (`Route` in kernels/moe.cu; layout identical): computed
/// inside the persistent gate/up kernel where it applies, else by the `route` kernel first.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct Route {
    logits: DevPtr<f32>,
    bias: DevPtr<f32>,
    softcap: f32,
    scale: f32,
    n: i32,
    softmax: i32,
    normalize: i32,
    _pad: i32,
}

// SAFETY: plain old data matching the C struct's layout.
unsafe impl DeviceRepr for Route {}

impl Route {
    /// The decision of `p` over `n` experts from `logits` (`bias` null: none), weights × `scale`.
    pub(crate) fn new(
        logits: DevPtr<f32>,
        bias: DevPtr<f32>,
        n: usize,
        p: &RouterParams,
        scale: f32,
    ) -> Self {
        Self {
            logits,
            bias,
            softcap: p.logit_softcap,
            scale,
            n: n as i32,
            softmax: i32::from(p.scoring == RouterScoring::Softmax),
            normalize: i32::from(p.normalize),
            _pad: 0,
        }
    }
}

/// Expert weights prefetched into L2 once an item's expert `e` is known (`ExpertPrefetch` in
/// kernels/moe.cu; layout identical): `bytes[i]` at `base[i] + e · bytes[i]` for each part with a
/// base, for the items below `items` (0: none).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct ExpertPrefetch {
    base: [DevPtr<u8>; 4],
    bytes: [i64; 4],
    items: i32,
    _pad: i32,
}

// SAFETY: plain old data matching the C struct's layout.
unsafe impl DeviceRepr for ExpertPrefetch {}

/// Share of the L2 cache that prefetched expert weights may fill (the rest keeps the step's
/// activations, KV rows and the weights being read).
const L2_PREFETCH_SHARE: (usize, usize) = (3, 4);

/// Resident blocks per SM of the few-items-per-tile kernels (`experts_*_mt`) and the per-item
/// gate/up (`experts_gate_up2`): `__launch_bounds__(256, 2)`.
const MT_BLOCKS_PER_SM: usize = 2;

/// Resident blocks per SM of those kernels' variants of 2 chunk slots a lane
/// (`experts_*_mt3`, `experts_gate_up2_tc`): `__launch_bounds__(256, 3)`.
const MT3_BLOCKS_PER_SM: usize = 3;

/// Resident blocks per SM of the persistent MoE kernels (`__launch_bounds__(256, 2)`).
pub(crate) const PERSIST_BLOCKS_PER_SM: usize = 2;

/// B entries for all routed items in `experts_down_p` (`XB_ITEMS_MAX`).
pub(crate) const PERSIST_XB_ENTRIES: usize = 5120;

/// One projection of all experts of a layer, stacked `[E, rows, cols]`.
pub struct ExpertArena {
    pub(crate) fmt: i32,
    pub(crate) data: CudaSlice<u8>,
    pub(crate) scales: Option<CudaSlice<u8>>,
    pub(crate) inv_g: CudaSlice<f32>,
}

/// The kernel-side description of an [`ExpertArena`] (`ExpertProj` in kernels/moe.cu).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct ExpertProj {
    w: DevPtr<u8>,
    scales: DevPtr<u8>,
    inv_g: DevPtr<f32>,
    fmt: i32,
    _pad: i32,
}

// SAFETY: plain old data matching the C struct's layout.
unsafe impl DeviceRepr for ExpertProj {}

impl ExpertArena {
    pub(crate) fn proj(&self, b: &CudaBackend) -> ExpertProj {
        ExpertProj {
            w: b.ptr(&self.data),
            scales: self.scales.as_ref().map_or(DevPtr::NULL, |s| b.ptr(s)),
            inv_g: b.ptr(&self.inv_g),
            fmt: self.fmt,
            _pad: 0,
        }
    }
}

/// All routed experts of one MoE layer.
pub struct CudaExperts {
    pub(crate) gate: ExpertArena,
    pub(crate) up: ExpertArena,
    pub(crate) down: ExpertArena,
    pub(crate) n: usize,
    pub(crate) inter: usize,
    pub(crate) hidden: usize,
}

impl CudaBackend {
    /// Whether a batched step of `rows` rows prefetches weights into L2
    /// (`CudaOptions::l2_prefetch_rows`).
    pub(crate) fn l2_prefetch(&self, rows: usize) -> bool {
        let min = self.opts().l2_prefetch_rows;
        min != 0 && rows >= min
    }

    /// Grid rows between a block of a grid `row_blocks` blocks wide (`per_sm` resident a SM:
    /// the few-items-per-tile and per-item gate/up kernels) and the one about a wave later,
    /// whose weights it prefetches into L2; 0 (none) where a step of `tokens` rows does not
    /// prefetch.
    fn wave_ahead(&self, row_blocks: usize, per_sm: usize, tokens: usize) -> i32 {
        if !self.l2_prefetch(tokens) || row_blocks == 0 {
            return 0;
        }
        (per_sm * self.inner.sms).div_ceil(row_blocks) as i32
    }
}

impl CudaExperts {
    /// The prefetch of the projections `arenas` (at most two: weights and scales are four
    /// parts) of the `k` items of each of `tokens` tokens, or of as many as fit in `b`'s share
    /// of L2 for prefetched weights; none where a step of `tokens` rows does not prefetch or
    /// the device's L2 size is unknown.
    pub(crate) fn prefetch(
        &self,
        b: &CudaBackend,
        arenas: &[&ExpertArena],
        tokens: usize,
        k: usize,
    ) -> ExpertPrefetch {
        let mut pf = ExpertPrefetch::default();
        let l2 = b.inner.l2_bytes;
        let items = tokens * k;
        if !b.l2_prefetch(tokens) || l2 == 0 || self.n == 0 {
            return pf;
        }
        let mut slot = 0;
        for a in arenas.iter().take(2) {
            for buf in std::iter::once(&a.data).chain(a.scales.as_ref()) {
                pf.base[slot] = b.ptr(buf);
                pf.bytes[slot] = (buf.len() / self.n) as i64;
                slot += 1;
            }
        }
        let per_item = pf.bytes.iter().sum::<i64>().max(1) as usize;
        let fit = l2 * L2_PREFETCH_SHARE.0 / L2_PREFETCH_SHARE.1 / per_item;
        pf.items = items.min(fit).min(i32::MAX as usize) as i32;
        pf
    }
}

/// Selected experts and weights per token, on the device.
pub struct CudaRouting {
    pub(crate) sel: CudaSlice<i32>,
    pub(crate) wts: CudaSlice<f32>,
    pub(crate) top_k: usize,
    pub(crate) tokens: usize,
}

/// A shared expert for the fused MoE kernels: gate, up, down (each one resident linear).
pub(crate) struct SharedExpert<'a> {
    pub gate: &'a CudaLinear,
    pub up: &'a CudaLinear,
    pub down: &'a CudaLinear,
}

/// A shared expert as the expert kernels take it: its three projections and its width.
#[derive(Clone, Copy, Default)]
pub(crate) struct SharedProj {
    gate: ExpertProj,
    up: ExpertProj,
    down: ExpertProj,
    inter: usize,
}

/// The device buffers of one MoE call: the routing (`top_k` selected experts and their weights
/// per token, `tokens` tokens) and the activations (input `x`, intermediate `h` of
/// `items × max(inter, shared_inter)` floats, per-item outputs `part` of `items × hidden`, with
/// `items = tokens · top_k [+ tokens]`; the result `out = resid + Σ ...`, `resid` null: none).
/// `staged`: `x`'s rows as the norm that produced them staged them for `gemv_mt`, if it did
/// (the few-items-per-tile experts then stage nothing themselves where the format is there);
/// `tiles`: the routed items already grouped by expert in tiles of [`FEW_TILE_ITEMS`] (by the
/// router's top-k, [`router_topk`](CudaBackend::router_topk)), if they are; `shared_gu`: the
/// shared expert's gate and up outputs (`tokens × shared_inter` each), where the router's
/// launch already computed them ([`router_shared_applies`](CudaBackend::router_shared_applies)).
#[derive(Clone, Copy)]
pub(crate) struct MoeBuffers<'a> {
    pub sel: &'a CudaSlice<i32>,
    pub wts: &'a CudaSlice<f32>,
    pub top_k: usize,
    pub tokens: usize,
    pub x: DevPtr<f32>,
    pub h: DevPtr<f32>,
    pub part: DevPtr<f32>,
    pub out: DevPtr<f32>,
    pub resid: DevPtr<f32>,
    pub staged: Option<&'a StagedRows>,
    pub tiles: Option<&'a ExpertTiles>,
    pub shared_gu: Option<(DevPtr<f32>, DevPtr<f32>)>,
}

impl CudaBackend {
    pub(crate) fn arena(&self, name: &str, ws: &[&LinearWeight]) -> Result<ExpertArena> {
        let fmt = fmt_of(ws[0]);
        let (rows, cols) = (ws[0].rows(), ws[0].cols());
        self.check(
            ws.iter()
                .all(|w| fmt_of(w) == fmt && w.rows() == rows && w.cols() == cols),
            || format!("`{name}`: experts of one layer differ in encoding or shape"),
        )?;
        let mut data = Vec::new();
        let mut scales = Vec::new();
        let mut inv = Vec::with_capacity(ws.len());
        for w in ws {
            match w {
                LinearWeight::Bf16 { data: d, .. }
                | LinearWeight::F16 { data: d, .. }
                | LinearWeight::F32 { data: d, .. } => {
                    data.extend_from_slice(d.as_slice());
                    inv.push(1.0);
                }
                LinearWeight::Nvfp4 {
                    packed,
                    scales: s,
                    global_scale,
                    ..
                } => {
                    data.extend_from_slice(packed.as_slice());
                    scales.extend_from_slice(s.as_slice());
                    inv.push(1.0 / global_scale);
                }
            }
        }
        Ok(ExpertArena {
            fmt,
            data: self.upload_bytes(&data)?,
            scales: if fmt == 3 {
                Some(self.upload_bytes(&scales)?)
            } else {
                None
            },
            inv_g: self
                .inner
                .stream
                .clone_htod(&inv)
                .map_err(|e| self.err(format!("{e:?}")))?,
        })
    }

    /// `l` as an expert projection whose `1 / global_scale` is the f32 at device address `inv`.
    pub(crate) fn lin_proj(&self, l: &CudaLinear, inv: DevPtr<f32>) -> ExpertProj {
        ExpertProj {
            w: self.ptr(&l.data),
            scales: l.scales_ptr(self),
            inv_g: inv,
            fmt: l.fmt,
            _pad: 0,
        }
    }

    /// Routed (and optionally shared) experts in three launches (gate/up, down, ordered sum):
    /// `out = resid + Σ w·E(x) [+ S(x)]` over the buffers of `io` (see [`MoeBuffers`]). With
    /// `route`, `io.sel` / `io.wts` are outputs: the router's top-k is computed first (inside the
    /// gate/up kernel on the persistent path, else by the `route` kernel); without, they are
    /// inputs. `epi` runs after the sum (in its last block for one token). With `staged`
    /// (buffers from [`stage_buffers`](Self::stage_buffers) for `epi`, a norm of `io.out`), the
    /// sum and that norm run in one launch that also stages the normed rows into them
    /// (`experts_reduce_norm_stage`: the bits of `experts_reduce`, then `norm_stage`). Where
    /// [`shared_mt_applies`](Self::shared_mt_applies), the shared expert runs on `gemv_mt`
    /// before the per-item kernels take the routed items alone.
    pub(crate) fn experts_raw(
        &self,
        e: &CudaExperts,
        shared: Option<(&SharedExpert<'_>, [DevPtr<f32>; 3])>,
        io: MoeBuffers<'_>,
        epi: Epi,
        route: Option<&Route>,
        staged: Option<&StagedRows>,
    ) -> Result<()> {
        let MoeBuffers {
            sel,
            wts,
            top_k: k,
            tokens: t,
            x,
            h,
            part,
            out,
            resid,
            ..
        } = io;
        let sp = shared.as_ref().map(|(s, inv)| SharedProj {
            gate: self.lin_proj(s.gate, inv[0]),
            up: self.lin_proj(s.up, inv[1]),
            down: self.lin_proj(s.down, inv[2]),
            inter: s.gate.rows,
        });
        let SharedProj {
            gate: sg,
            up: su,
            down: sd,
            inter: sinter,
        } = sp.unwrap_or_default();
        let has = i32::from(shared.is_some());
        let path = self.moe_path(e, shared.as_ref().map(|(s, _)| *s), k, t);
        // (the shared expert on gemv_mt beside the per-item routed experts)
        let shared_mt = self.shared_mt_applies(shared.as_ref().map(|(s, _)| *s), path, t);
        let (persistent, grouped_few, grouped, per_item) = (
            path == MoePath::Persistent,
            path == MoePath::GroupedFew,
            path == MoePath::Grouped,
            path == MoePath::PerItem,
        );
        self.check(
            io.shared_gu.is_none() || ((grouped_few || shared_mt) && shared.is_some()),
            || {
                "a shared expert's gate and up computed for experts that do not take them"
                    .to_string()
            },
        )?;
        // (the routed items whose gate/up the top-k prefetches)
        let mut gu_prefetched = 0;
        let fused_route = match route {
            Some(r) if persistent && r.n <= 256 && k <= 32 => *r,
            Some(r) => {
                self.check(k <= 32, || format!("top-{k} routing"))?;
                // (per item: the routed items' gate/up prefetched into L2 as they are chosen)
                let pf = if per_item {
                    e.prefetch(self, &[&e.gate, &e.up], t, k)
                } else {
                    ExpertPrefetch::default()
                };
                gu_prefetched = pf.items as usize;
                let ways = if pf.items > 0 { k as u32 } else { 1 };
                ops::moe::RouteArgs {
                    logits: r.logits,
                    bias: r.bias,
                    n: r.n,
                    k: k as i32,
                    softmax: r.softmax,
                    normalize: r.normalize,
                    softcap: r.softcap,
                    scale: r.scale,
                    sel: self.ptr(sel),
                    wts: self.ptr(wts),
                    pf,
                }
                .launch(self, (t as u32, ways, 1), (32, 1, 1))?;
                Route::default()
            }
            None => Route::default(),
        };
        if persistent {
            let groups = |rows: usize, per: usize, items: usize| rows.div_ceil(per) * items;
            let shared_n = usize::from(shared.is_some());
            let cap = self.opts().persist_grid;
            let resident = match cap {
                0 => PERSIST_BLOCKS_PER_SM * self.inner.sms,
                cap => cap.min(PERSIST_BLOCKS_PER_SM * self.inner.sms),
            };
            let gu = groups(e.inter, 16, k) + groups(sinter, 16, shared_n);
            ops::moe::ExpertsGateUpPArgs {
                gate: e.gate.proj(self),
                up: e.up.proj(self),
                sgate: sg,
                sup: su,
                has_shared: has,
                shared_inter: sinter as i32,
                sel: self.ptr(sel),
                wts: self.ptr(wts),
                k: k as i32,
                x,
                h,
                inter: e.inter as i32,
                hidden: e.hidden as i32,
                route: fused_route,
            }
            .launch(self, (gu.min(resident) as u32, 1, 1), (256, 1, 1))?;
            let dn = groups(e.hidden, 64, k + shared_n);
            ops::moe::ExpertsDownPArgs {
                down: e.down.proj(self),
                sdown: sd,
                has_shared: has,
                shared_inter: sinter as i32,
                sel: self.ptr(sel),
                wts: self.ptr(wts),
                k: k as i32,
                h,
                inter: e.inter as i32,
                part,
                hidden: e.hidden as i32,
            }
            .launch(self, (dn.min(resident) as u32, 1, 1), (256, 1, 1))?;
        } else if grouped_few {
            self.experts_grouped_few(e, shared.map(|(s, _)| s), io)?;
        } else if grouped {
            self.experts_grouped(e, io)?;
        } else if let (true, Some((s, _))) = (shared_mt, shared.as_ref()) {
            self.shared_expert_mt(s, e.hidden, &io)?;
            self.inner
                .shared_on_mt
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.experts_per_item(e, None, io, gu_prefetched)?;
        } else {
            self.experts_per_item(e, sp, io, gu_prefetched)?;
        }
        if let Some(staged) = staged {
            let threads = ops::elementwise::norm_row_threads(e.hidden);
            self.check(
                epi.kind == 1
                    && epi.x.addr() == out.addr()
                    && epi.n as usize == e.hidden
                    && e.hidden.is_multiple_of(128)
                    && e.hidden <= 32 * threads as usize,
                || format!("experts_reduce_norm_stage of {t} rows of {}", e.hidden),
            )?;
            let [(xb_nv, ds_nv), (xb_bf, ds_bf)] = staged.ptrs(self);
            ops::moe::ExpertsReduceNormStageArgs {
                part,
                k: k as i32,
                t: t as i32,
                has_shared: has,
                out,
                resid,
                hidden: e.hidden as i32,
                w: epi.w,
                y: epi.out,
                eps: epi.eps,
                xb_nv,
                ds_nv,
                xb_bf,
                ds_bf,
            }
            .launch(self, (t as u32, 1, 1), (threads, 1, 1))?;
            self.inner
                .sums_with_norm
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Ok(());
        }
        let n = (t * e.hidden) as u32;
        let (fused, separate) = if t == 1 && epi.fusable(256) {
            (epi, false)
        } else {
            (Epi::default(), epi.kind != 0)
        };
        ops::moe::ExpertsReduceArgs {
            part,
            k: k as i32,
            t: t as i32,
            has_shared: has,
            out,
            resid,
            hidden: e.hidden as i32,
            epi: fused,
        }
        .launch(self, (n.div_ceil(256), 1, 1), (256, 1, 1))?;
        if separate {
            self.epilogue_launch(&epi, t)?;
        }
        Ok(())
    }

    /// Which kernels run the experts of `t` tokens (top-`k`, `shared` expert if any): the
    /// persistent ones, a few items per expert tile, grouped by expert, or one grid row per item.
    pub(crate) fn moe_path(
        &self,
        e: &CudaExperts,
        shared: Option<&SharedExpert<'_>>,
        k: usize,
        t: usize,
    ) -> MoePath {
        if self.persistent_moe(e, shared, k, t) {
            MoePath::Persistent
        } else if self.grouped_few(e, k, t) {
            MoePath::GroupedFew
        } else if shared.is_none() && self.grouped_moe(e, t) {
            MoePath::Grouped
        } else {
            MoePath::PerItem
        }
    }

    /// The weight formats in which the experts `e` of `t` tokens, run on `path`
    /// ([`moe_path`](Self::moe_path)), take their input rows staged by the norm that produced
    /// them (`MoeBuffers::staged`), ascending: the few-items-per-tile experts' NVFP4 and the
    /// shared expert's gate/up formats on `gemv_mt`, where `CudaOptions::moe_staged` is on and
    /// the experts run a few items per tile; NVFP4 for the per-item experts' tensor-core path,
    /// where `CudaOptions::item_staged` is on; else none.
    pub(crate) fn moe_input_formats(
        &self,
        e: &CudaExperts,
        path: MoePath,
        shared: Option<&SharedExpert<'_>>,
        t: usize,
    ) -> Vec<i32> {
        let (moe_staged, item_staged) = {
            let o = self.opts();
            (o.moe_staged, o.item_staged)
        };
        // (the shared expert's gate/up formats, where it runs on gemv_mt)
        let shared_formats = |s: &SharedExpert<'_>| {
            self.gemv_mt_formats(&[(s.gate, DevPtr::NULL), (s.up, DevPtr::NULL)], t)
        };
        let mut formats = match path {
            MoePath::GroupedFew if moe_staged => {
                let mut formats = shared.map_or_else(Vec::new, shared_formats);
                formats.push(3);
                formats
            }
            MoePath::PerItem => {
                let mut formats = match shared {
                    Some(s) if moe_staged && self.shared_mt_applies(Some(s), path, t) => {
                        shared_formats(s)
                    }
                    _ => Vec::new(),
                };
                if item_staged && self.per_item_mma(e) {
                    formats.push(3);
                }
                formats
            }
            _ => Vec::new(),
        };
        formats.sort_unstable();
        formats.dedup();
        formats
    }

    /// Whether a batched step of `t` rows whose experts run one grid row per item (`path`)
    /// leaves the shared expert `shared` to `gemv_mt` ([`shared_expert_mt`](Self::shared_expert_mt):
    /// each weight read once for all rows, not once per row as an item of the per-item kernels):
    /// `t` at least `CudaOptions::shared_mt_min_rows` (0: never) and its three projections on
    /// `gemv_mt`.
    pub(crate) fn shared_mt_applies(
        &self,
        shared: Option<&SharedExpert<'_>>,
        path: MoePath,
        t: usize,
    ) -> bool {
        let min = self.opts().shared_mt_min_rows;
        match shared {
            Some(s) if path == MoePath::PerItem && min != 0 && t >= min => [s.gate, s.up, s.down]
                .iter()
                .all(|w| self.gemv_mt_applies(w, t)),
            _ => false,
        }
    }

    /// Whether a batched step's router (`t` rows) and its shared expert `s`'s gate and up run in one
    /// `gemv_mt` launch (the router's input staged for bf16, its top-k a launch of its own):
    /// switched on (`CudaOptions::router_shared`), the experts a few items per tile (`path`), a
    /// bf16 router, gate and up of one width, each on `gemv_mt`, and the launch's K split that
    /// of the router alone and of the gate and up alone (so the bits of the two launches).
    pub(crate) fn router_shared_applies(
        &self,
        router: &CudaLinear,
        s: &SharedExpert<'_>,
        path: MoePath,
        t: usize,
    ) -> bool {
        let ws = [router, s.gate, s.up];
        let split = |rows: usize| self.mt_k_split(rows, router.cols);
        self.opts().router_shared
            && (path == MoePath::GroupedFew || self.shared_mt_applies(Some(s), path, t))
            && ws
                .iter()
                .all(|w| w.fmt == 2 && w.cols == router.cols && self.gemv_mt_applies(w, t))
            && split(router.rows) == split(router.rows + 2 * s.gate.rows)
            && split(2 * s.gate.rows) == split(router.rows + 2 * s.gate.rows)
    }

    /// Whether a batched step's router (`t` rows) runs its top-k as the tail of its own launch
    /// ([`router_topk`](Self::router_topk)): switched on (`CudaOptions::router_topk`), a bf16
    /// router on `gemv_mt` of at most [`ROUTE_TAIL_MAX_EXPERTS`] experts, top-32 at most, and a
    /// top-k that has nothing else to do (it prefetches the per-item experts' weights into L2 at
    /// steps that prefetch: then it keeps its own launch).
    pub(crate) fn router_topk_applies(
        &self,
        e: &CudaExperts,
        shared: Option<&SharedExpert<'_>>,
        router: &CudaLinear,
        k: usize,
        t: usize,
    ) -> bool {
        let prefetches = self.moe_path(e, shared, k, t) == MoePath::PerItem
            && e.prefetch(self, &[&e.gate, &e.up], t, k).items > 0;
        self.opts().router_topk
            && router.fmt == 2
            && self.gemv_mt_applies(router, t)
            && router.rows <= ROUTE_TAIL_MAX_EXPERTS
            && k <= 32
            && !prefetches
    }

    /// Whether a batched step of `t` rows (2+) runs its MoE input norm and its `router` in one
    /// `norm_gemv_bf16` launch, as one row does ([`norm_gemv_raw`](Self::norm_gemv_raw)): `t`
    /// at most `CudaOptions::norm_router_rows`, rows the launch holds, nothing that takes the
    /// MoE's input staged ([`moe_input_formats`](Self::moe_input_formats) empty) and a top-k of
    /// its own launch (not [`router_topk_applies`](Self::router_topk_applies)).
    pub(crate) fn norm_router_applies(
        &self,
        e: &CudaExperts,
        shared: Option<&SharedExpert<'_>>,
        router: &CudaLinear,
        k: usize,
        t: usize,
    ) -> bool {
        t <= self.opts().norm_router_rows
            && Self::norm_gemv_applies(router, t)
            && self
                .moe_input_formats(e, self.moe_path(e, shared, k, t), shared, t)
                .is_empty()
            && !self.router_topk_applies(e, shared, router, k, t)
    }

    /// The router's logits of `t` rows (`x`, [`gemv_mt`](Self::gemv_mt) on bf16 `router` into
    /// `logits`) and their top-k by `route` into `sel` / `wts`, in one launch
    /// (`gemv_mt_bf16_topk`: the last block to finish routes; the bits of `gemv_mt` then
    /// `route`). Where [`router_topk_applies`](Self::router_topk_applies). With `tiles` (from
    /// [`expert_tiles_unset`](Self::expert_tiles_unset) for these `t · k` items of the router's
    /// experts), that block also groups the items by expert into them (`moe_align`'s work: one
    /// launch fewer for the few-items-per-tile experts, `MoeBuffers::tiles`).
    pub(crate) fn router_topk(
        &self,
        router: &CudaLinear,
        logits: DevPtr<f32>,
        x: MtInput,
        t: usize,
        (route, k): (&Route, usize),
        (sel, wts, tiles): (&CudaSlice<i32>, &CudaSlice<f32>, Option<&ExpertTiles>),
    ) -> Result<()> {
        self.check(
            router.fmt == 2
                && route.n as usize == router.rows
                && router.rows <= ROUTE_TAIL_MAX_EXPERTS
                && k <= 32
                && sel.len() >= t * k
                && wts.len() >= t * k
                && tiles.is_none_or(|g| g.order.len() >= t * k && g.per_tile > 0),
            || format!("the top-{k} of {} logits as the router's tail", router.rows),
        )?;
        let (bn, order, tile_list, ntiles) = match tiles {
            Some(g) => (
                g.per_tile as i32,
                self.ptr(&g.order),
                self.ptr(&g.tiles),
                self.ptr(&g.ntiles),
            ),
            None => (0, DevPtr::NULL, DevPtr::NULL, DevPtr::NULL),
        };
        let plan = self.gemv_mt_plan(&[(router, logits)], x, t, DevPtr::NULL, DevPtr::NULL)?;
        ops::moe::GemvMtBf16TopkArgs {
            segs: plan.segs,
            xb: plan.xb,
            xds: plan.xds,
            cols: plan.cols,
            t: t as i32,
            ks: plan.ks,
            bias: route.bias,
            n: route.n,
            k: k as i32,
            softmax: route.softmax,
            normalize: route.normalize,
            softcap: route.softcap,
            scale: route.scale,
            sel: self.ptr(sel),
            wts: self.ptr(wts),
            ticket: self.ptr(&self.inner.counters),
            bn,
            order,
            tiles: tile_list,
            ntiles,
        }
        .launch(self, plan.grid, (32 * NV_WARPS, 1, 1))?;
        self.inner
            .routed_in_router
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if tiles.is_some() {
            self.inner
                .grouped_in_router
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(())
    }

    /// Whether one token's experts run on the persistent kernels (`experts_*_p`): tensor cores on
    /// (sm_89+), NVFP4 routed experts with `hidden` and `inter` multiples of 128, every routed
    /// item's `h` staged at once (`k · inter <= 10240`), a BF16 shared expert if any; unless
    /// switched off (`CudaOptions::persistent_moe`).
    pub(crate) fn persistent_moe(
        &self,
        e: &CudaExperts,
        shared: Option<&SharedExpert<'_>>,
        k: usize,
        t: usize,
    ) -> bool {
        let on = self.opts().persistent_moe;
        let shared_ok = match shared {
            None => true,
            Some(s) => {
                [s.gate, s.up, s.down].iter().all(|l| l.fmt == 2)
                    && s.gate.rows.is_multiple_of(8)
                    && e.hidden.is_multiple_of(8)
            }
        };
        on && t == 1
            && self.inner.mma
            && [e.gate.fmt, e.up.fmt, e.down.fmt].iter().all(|&f| f == 3)
            && e.hidden.is_multiple_of(MMA_CHUNK)
            && e.hidden <= NV_MAX_K
            && e.inter.is_multiple_of(MMA_CHUNK)
            && k * e.inter <= 2 * PERSIST_XB_ENTRIES
            && k < 64
            && shared_ok
    }

    /// Whether `t` tokens' routed experts run grouped by expert on tensor cores
    /// ([`experts_grouped`](Self::experts_grouped)): [`GROUPED_MOE_MIN_TOKENS`]+ tokens, bf16 or
    /// NVFP4 projections with `hidden` and `inter` multiples of 32, at most [`MOE_ALIGN_MAX_EXPERTS`]
    /// experts, sm_80+; unless switched off (`CudaOptions::grouped_moe`).
    pub(crate) fn grouped_moe(&self, e: &CudaExperts, t: usize) -> bool {
        self.opts().grouped_moe
            && self.inner.sm80
            && t >= GROUPED_MOE_MIN_TOKENS
            && [e.gate.fmt, e.up.fmt, e.down.fmt]
                .iter()
                .all(|&f| f == 2 || f == 3)
            && e.hidden.is_multiple_of(32)
            && e.inter.is_multiple_of(32)
            && e.n <= MOE_ALIGN_MAX_EXPERTS
    }

    /// Buffers for `items` routed items of `experts` grouped by expert in tiles of up to
    /// `per_tile` items, not yet written (`moe_align`, or the router's top-k, writes `ntiles` and
    /// every tile and order entry below it; nothing reads past).
    pub(crate) fn expert_tiles_unset(
        &self,
        items: usize,
        experts: usize,
        per_tile: usize,
    ) -> Result<ExpertTiles> {
        // at most one partial tile per expert that has items
        let max_tiles = items.div_ceil(per_tile) + experts.min(items);
        Ok(ExpertTiles {
            order: self.alloc_unset::<i32>(items)?,
            tiles: self.alloc_unset::<i32>(4 * max_tiles)?,
            ntiles: self.alloc_unset::<i32>(1)?,
            max_tiles,
            per_tile,
        })
    }

    /// The `items` routed items of `sel` (expert ids among `experts`) grouped by expert in tiles
    /// of up to `per_tile` items of one expert (`moe_align`, one launch).
    fn expert_tiles(
        &self,
        sel: &CudaSlice<i32>,
        items: usize,
        experts: usize,
        per_tile: usize,
    ) -> Result<ExpertTiles> {
        let t = self.expert_tiles_unset(items, experts, per_tile)?;
        ops::moe::MoeAlignArgs {
            sel: self.ptr(sel),
            items: items as i32,
            e: experts as i32,
            bn: per_tile as i32,
            order: self.ptr(&t.order),
            tiles: self.ptr(&t.tiles),
            ntiles: self.ptr(&t.ntiles),
        }
        .launch(self, (1, 1, 1), (MOE_ALIGN_MAX_EXPERTS as u32, 1, 1))?;
        Ok(t)
    }

    /// The routed items of `io` (no shared expert) grouped by expert (`moe_align`), then gate/up
    /// and down of every tile of one expert's items on tensor cores: each expert's weights are
    /// read once per [`GEMM_MMA_TOKENS`] of its items instead of once per item. Fills `io.h` and
    /// `io.part` exactly as [`experts_per_item`](Self::experts_per_item) does.
    pub(crate) fn experts_grouped(&self, e: &CudaExperts, io: MoeBuffers<'_>) -> Result<()> {
        let MoeBuffers {
            sel,
            wts,
            top_k: k,
            tokens: t,
            x,
            h,
            part,
            ..
        } = io;
        let items = t * k;
        let ExpertTiles {
            order,
            tiles,
            ntiles,
            max_tiles,
            ..
        } = self.expert_tiles(sel, items, e.n, GEMM_MMA_TOKENS as usize)?;
        if self.experts_h16_applies(e) {
            // x and then h split once into their f16 parts (and their rows' scales), the tiles'
            // rows gathered from them
            let (xds, xh) = self.scale_split_h16(x, None, t, e.hidden)?;
            ops::moe::ExpertsGateUpH16Args {
                gate: e.gate.proj(self),
                up: e.up.proj(self),
                tiles: self.ptr(&tiles),
                ntiles: self.ptr(&ntiles),
                order: self.ptr(&order),
                k: k as i32,
                xh: self.ptr(&xh),
                t: t as i32,
                h,
                inter: e.inter as i32,
                hidden: e.hidden as i32,
                xds: self.ptr(&xds),
            }
            .launch(
                self,
                ((e.inter as u32).div_ceil(64), max_tiles as u32, 1),
                (256, 1, 1),
            )?;
            let (hds, hh) = self.scale_split_h16(h, None, items, e.inter)?;
            return ops::moe::ExpertsDownH16Args {
                down: e.down.proj(self),
                tiles: self.ptr(&tiles),
                ntiles: self.ptr(&ntiles),
                order: self.ptr(&order),
                wts: self.ptr(wts),
                hh: self.ptr(&hh),
                items: items as i32,
                part,
                inter: e.inter as i32,
                hidden: e.hidden as i32,
                hds: self.ptr(&hds),
            }
            .launch(
                self,
                (
                    (e.hidden as u32).div_ceil(GEMM_MMA_ROWS),
                    max_tiles as u32,
                    1,
                ),
                (256, 1, 1),
            );
        }
        let xds = if e.gate.fmt == e.up.fmt {
            self.row_scales_for_f16_mma(e.gate.fmt, x, t, e.hidden)?
        } else {
            None
        };
        ops::moe::ExpertsGateUpMmaArgs {
            gate: e.gate.proj(self),
            up: e.up.proj(self),
            tiles: self.ptr(&tiles),
            ntiles: self.ptr(&ntiles),
            order: self.ptr(&order),
            k: k as i32,
            x,
            h,
            inter: e.inter as i32,
            hidden: e.hidden as i32,
            xds: xds.as_ref().map_or(DevPtr::NULL, |d| self.ptr(d)),
        }
        .launch(
            self,
            ((e.inter as u32).div_ceil(64), max_tiles as u32, 1),
            (256, 1, 1),
        )?;
        let hds = self.row_scales_for_f16_mma(e.down.fmt, h, items, e.inter)?;
        ops::moe::ExpertsDownMmaArgs {
            down: e.down.proj(self),
            tiles: self.ptr(&tiles),
            ntiles: self.ptr(&ntiles),
            order: self.ptr(&order),
            wts: self.ptr(wts),
            h,
            part,
            inter: e.inter as i32,
            hidden: e.hidden as i32,
            hds: hds.as_ref().map_or(DevPtr::NULL, |d| self.ptr(d)),
        }
        .launch(
            self,
            (
                (e.hidden as u32).div_ceil(GEMM_MMA_ROWS),
                max_tiles as u32,
                1,
            ),
            (256, 1, 1),
        )
    }

    /// Whether the grouped experts (tiles of [`GEMM_MMA_TOKENS`] items; the tiles of
    /// `gemm_h16`'s core hold as many: [`EXPERTS_H16_ITEMS`]) run on `experts_*_h16`: gate, up and
    /// down NVFP4 on the f16 path, `hidden` and `inter` multiples of 64, the device able
    /// (`Inner::h16_gemm`) and `CudaOptions::h16_gemm` on.
    fn experts_h16_applies(&self, e: &CudaExperts) -> bool {
        const _: () = assert!(EXPERTS_H16_ITEMS == GEMM_MMA_TOKENS);
        self.inner.h16_gemm
            && self.opts().h16_gemm
            && [e.gate.fmt, e.up.fmt, e.down.fmt].iter().all(|&f| f == 3)
            && e.hidden.is_multiple_of(64)
            && e.inter.is_multiple_of(64)
            && self.f16_mma_applies(3, e.hidden)
    }

    /// Whether `t` tokens with `k` routed experts each run grouped a few items per tile
    /// ([`experts_grouped_few`](Self::experts_grouped_few)): at least
    /// `CudaOptions::few_moe_min_tokens` (and 2) tokens, at most
    /// `CudaOptions::few_items_per_expert` items per expert on average, NVFP4 routed projections
    /// with `hidden` and `inter` multiples of 128 and at most `NV_MAX_K`, at most
    /// [`MOE_ALIGN_MAX_EXPERTS`] experts, tensor cores on (sm_89+); unless switched off
    /// (`CudaOptions::grouped_moe`).
    pub(crate) fn grouped_few(&self, e: &CudaExperts, k: usize, t: usize) -> bool {
        let (on, min, per_expert) = {
            let o = self.opts();
            (o.grouped_moe, o.few_moe_min_tokens, o.few_items_per_expert)
        };
        on && self.inner.mma
            && min > 0
            && t >= min.max(2)
            && t * k <= per_expert * e.n
            && [e.gate.fmt, e.up.fmt, e.down.fmt].iter().all(|&f| f == 3)
            && [e.hidden, e.inter]
                .iter()
                .all(|&c| c.is_multiple_of(128) && c <= NV_MAX_K)
            && e.n <= MOE_ALIGN_MAX_EXPERTS
    }

    /// The shared expert `s` of a MoE layer of `hidden` wide rows on `gemv_mt`, each weight read
    /// once for all of `io`'s rows: its gate and up (unless the router's launch computed them,
    /// `io.shared_gu`), the SiLU product (staged for the down projection's `gemv_mt` with
    /// `CudaOptions::moe_staged`) and the down projection into the shared expert's rows of
    /// `io.part` (after the routed items': what `experts_reduce` adds last).
    fn shared_expert_mt(
        &self,
        s: &SharedExpert<'_>,
        hidden: usize,
        io: &MoeBuffers<'_>,
    ) -> Result<()> {
        let (t, x, part, shared_gu) = (io.tokens, io.x, io.part, io.shared_gu);
        let items = t * io.top_k;
        let unstaged = StagedRows::default();
        let staged = io.staged.unwrap_or(&unstaged);
        let si = s.gate.rows;
        // (the buffers made here live until this call's launches are queued)
        let made;
        let (g, u) = match shared_gu {
            Some(gu) => gu,
            None => {
                made = (self.alloc_unset(t * si)?, self.alloc_unset(t * si)?);
                let (g, u) = (self.ptr(&made.0), self.ptr(&made.1));
                let parts = [(s.gate, g), (s.up, u)];
                self.linears_of_one_input(&parts, x, t, hidden, staged)?;
                (g, u)
            }
        };
        let out = part.add(items * hidden);
        if self.opts().moe_staged && s.down.fmt == 2 && self.gemv_mt_applies(s.down, t) {
            // silu(g) · u staged for the down projection's gemv_mt as it is computed
            let xb = self.alloc_unset::<u32>(t * 3 * si / 2)?;
            let xds = self.alloc_unset::<f32>(t)?;
            let (xb, xds) = (self.ptr(&xb), self.ptr(&xds));
            ops::elementwise::SiluMulStageArgs {
                g,
                u,
                k: si as i32,
                xb_bf: xb,
                ds_bf: xds,
            }
            .launch(self, (t as u32, 1, 1), (128, 1, 1))?;
            let input = MtInput::Staged(xb, xds);
            self.gemv_mt(&[(s.down, out)], input, t, DevPtr::NULL, DevPtr::NULL)?;
            self.inner
                .moe_inputs_staged
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        } else {
            self.silu_mul_raw(g, u, g, t * si)?;
            self.gemv_raw(s.down, Gemv::rows(g, out, DevPtr::NULL, t))?;
        }
        Ok(())
    }

    /// The routed items of `io` grouped by expert in tiles of up to [`FEW_TILE_ITEMS`]
    /// (`moe_align`, or already by the router: `io.tiles`), the tokens' inputs staged once as
    /// tensor-core operands (`xb_stage`, or as their norm staged them: `io.staged`), then gate/up
    /// and down of every tile on the decode GEMV's tensor-core core: each expert's weights are
    /// read once per [`FEW_TILE_ITEMS`] of its items (a batched decode step's items spread one or
    /// two per expert). The shared expert, if any, runs as three linears over all tokens (weights
    /// read once per step; gate and up on `io.staged` where it has their format, down on its
    /// SiLU product staged as it is computed with `CudaOptions::moe_staged`), its output in the
    /// shared items' rows of `io.part`. Per item the same arithmetic as
    /// [`experts_per_item`](Self::experts_per_item) on tensor cores.
    pub(crate) fn experts_grouped_few(
        &self,
        e: &CudaExperts,
        shared: Option<&SharedExpert<'_>>,
        io: MoeBuffers<'_>,
    ) -> Result<()> {
        let MoeBuffers {
            sel,
            wts,
            top_k: k,
            tokens: t,
            x,
            h,
            part,
            staged,
            ..
        } = io;
        let items = t * k;
        let (hidden, inter) = (e.hidden, e.inter);
        let unstaged = StagedRows::default();
        let staged = staged.unwrap_or(&unstaged);
        if staged.nv.is_some() {
            self.inner
                .moe_inputs_staged
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        if let Some(s) = shared {
            self.shared_expert_mt(s, hidden, &io)?;
        }
        // (tiles of 8 items where the items average `few_tile8_items` or more per expert)
        let (divisor, three, tile8) = {
            let o = self.opts();
            (
                o.few_grid_divisor.max(1),
                o.few_three_blocks,
                o.few_tile8_items > 0 && items >= o.few_tile8_items * e.n,
            )
        };
        let per_tile = if tile8 {
            FEW_TILE8_ITEMS
        } else {
            FEW_TILE_ITEMS
        };
        // (the tiles made here live until this call's launches are queued)
        let made;
        let ExpertTiles {
            order,
            tiles,
            ntiles,
            max_tiles,
            ..
        } = match io.tiles {
            Some(tiles) if tiles.per_tile == per_tile => tiles,
            _ => {
                made = self.expert_tiles(sel, items, e.n, per_tile)?;
                &made
            }
        };
        // (the bound is about twice a step's tile count: past the count a block has no tile)
        let grid_rows = max_tiles.div_ceil(divisor) as u32;
        // (the kernels' variant: 0 `_mt`, 1 `_mt3`, 2 `_mt8`)
        let (variant, per_sm) = if tile8 {
            self.inner
                .few_tile8_launches
                .fetch_add(2, std::sync::atomic::Ordering::Relaxed);
            (2, MT_BLOCKS_PER_SM)
        } else if three {
            self.inner
                .few_b3_launches
                .fetch_add(2, std::sync::atomic::Ordering::Relaxed);
            (1, MT3_BLOCKS_PER_SM)
        } else {
            (0, MT_BLOCKS_PER_SM)
        };
        // B entries: `cols / 2` pairs of f16 pairs (two u32) per row, all written by xb_stage
        // (or by the norm; `own` keeps this call's buffers until its launches are queued)
        let own;
        let (xb, xds) = match &staged.nv {
            Some(nv) => nv,
            None => {
                own = (self.alloc_unset::<u32>(t * hidden)?, self.alloc_unset(t)?);
                ops::gemv::XbStageArgs {
                    x,
                    k: hidden as i32,
                    fmt: 3,
                    xb: self.ptr(&own.0),
                    ds: self.ptr(&own.1),
                }
                .launch(self, (t as u32, 1, 1), (256, 1, 1))?;
                &own
            }
        };
        ops::moe::ExpertsGateUpMtArgs {
            gate: e.gate.proj(self),
            up: e.up.proj(self),
            tiles: self.ptr(tiles),
            ntiles: self.ptr(ntiles),
            order: self.ptr(order),
            k: k as i32,
            xb: self.ptr(xb),
            xds: self.ptr(xds),
            h,
            inter: inter as i32,
            hidden: hidden as i32,
            ahead: self.wave_ahead(inter.div_ceil(16), per_sm, t),
        }
        .launch(
            self,
            variant,
            ((inter as u32).div_ceil(16), grid_rows, 1),
            (256, 1, 1),
        )?;
        let hb = self.alloc_unset::<u32>(items * inter)?;
        let hds = self.alloc_unset(items)?;
        ops::gemv::XbStageArgs {
            x: h,
            k: inter as i32,
            fmt: 3,
            xb: self.ptr(&hb),
            ds: self.ptr(&hds),
        }
        .launch(self, (items as u32, 1, 1), (256, 1, 1))?;
        ops::moe::ExpertsDownMtArgs {
            down: e.down.proj(self),
            tiles: self.ptr(tiles),
            ntiles: self.ptr(ntiles),
            order: self.ptr(order),
            wts: self.ptr(wts),
            hb: self.ptr(&hb),
            hds: self.ptr(&hds),
            part,
            inter: inter as i32,
            hidden: hidden as i32,
            ahead: self.wave_ahead(hidden.div_ceil(64), per_sm, t),
        }
        .launch(
            self,
            variant,
            ((hidden as u32).div_ceil(64), grid_rows, 1),
            (256, 1, 1),
        )
    }

    /// Whether the per-item gate/up kernel runs the routed items of `e` on its tensor-core path
    /// (tensor cores on, NVFP4 gate and up, `hidden % 128 == 0`, at most `NV_MAX_K`): the path
    /// that can read its input staged for NVFP4.
    pub(crate) fn per_item_mma(&self, e: &CudaExperts) -> bool {
        self.inner.mma
            && e.gate.fmt == 3
            && e.up.fmt == 3
            && e.hidden.is_multiple_of(128)
            && e.hidden <= NV_MAX_K
    }

    /// Gate/up and down of `items` (token, expert) pairs, one grid row per item (the shared
    /// expert, if any, one more item per token); the routed items below `gu_prefetched` had
    /// their gate/up prefetched into L2 by the top-k. Where `io.staged` holds the input staged
    /// for NVFP4 (and the tensor-core path runs), the routed items read it there.
    pub(crate) fn experts_per_item(
        &self,
        e: &CudaExperts,
        shared: Option<SharedProj>,
        io: MoeBuffers<'_>,
        gu_prefetched: usize,
    ) -> Result<()> {
        let MoeBuffers {
            sel,
            wts,
            top_k: k,
            tokens: t,
            x,
            h,
            part,
            staged,
            ..
        } = io;
        let has = i32::from(shared.is_some());
        let SharedProj {
            gate: sg,
            up: su,
            down: sd,
            inter: sinter,
        } = shared.unwrap_or_default();
        let items = t * k + if has != 0 { t } else { 0 };
        let rows = e.inter.max(sinter) as u32;
        let (xbs, xds) = match staged.and_then(|s| s.nv.as_ref()) {
            Some((xb, ds)) if self.per_item_mma(e) => {
                self.inner
                    .moe_inputs_staged
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                (self.ptr(xb), self.ptr(ds))
            }
            _ => (DevPtr::NULL, DevPtr::NULL),
        };
        // The tensor-core-only kernels: routed items only; the down projection's on NVFP4 weights
        // narrow enough for its shared memory, the gate/up's where the tensor-core path takes
        // the items.
        let (item_tc, gate_up_tc, down_eight_warps, down_four_blocks) = {
            let o = self.opts();
            (
                o.item_tc && has == 0,
                o.gate_up_tc && has == 0,
                o.down_eight_warps,
                o.down_four_blocks,
            )
        };
        let down_tc = item_tc
            && self.inner.mma
            && e.down.fmt == 3
            && e.inter.is_multiple_of(128)
            && e.inter <= DOWN_TC_MAX_INTER;
        let gate_up_tc = gate_up_tc && self.per_item_mma(e);
        let tc = usize::from(down_tc) + usize::from(gate_up_tc);
        if tc > 0 {
            self.inner
                .tc_item_launches
                .fetch_add(tc, std::sync::atomic::Ordering::Relaxed);
        }
        ops::moe::ExpertsGateUp2Args {
            gate: e.gate.proj(self),
            up: e.up.proj(self),
            sgate: sg,
            sup: su,
            has_shared: has,
            shared_inter: sinter as i32,
            sel: self.ptr(sel),
            k: k as i32,
            t: t as i32,
            x,
            h,
            inter: e.inter as i32,
            hidden: e.hidden as i32,
            mma: i32::from(self.inner.mma),
            experts: e.n as i32,
            dpf: e.prefetch(self, &[&e.down], t, k),
            ahead: self.wave_ahead(
                rows.div_ceil(EXPERT_GU_WARPS * EXPERT_GU_ROWS) as usize,
                if gate_up_tc {
                    MT3_BLOCKS_PER_SM
                } else {
                    MT_BLOCKS_PER_SM
                },
                t,
            ),
            gu_prefetched: gu_prefetched as i32,
            xbs,
            xds,
        }
        .launch(
            self,
            usize::from(gate_up_tc),
            (
                rows.div_ceil(EXPERT_GU_WARPS * EXPERT_GU_ROWS),
                items as u32,
                1,
            ),
            (32 * EXPERT_GU_WARPS, 1, 1),
        )?;
        // (experts_down2, its tensor-core-only variant, its four-blocks-a-SM one or its
        // eight-warp one)
        let (variant, warps) = if down_tc {
            (3, GEMV_WARPS)
        } else if down_eight_warps {
            (2, 2 * GEMV_WARPS)
        } else {
            (usize::from(down_four_blocks), GEMV_WARPS)
        };
        ops::moe::ExpertsDown2Args {
            down: e.down.proj(self),
            sdown: sd,
            shared_inter: sinter as i32,
            sel: self.ptr(sel),
            wts: self.ptr(wts),
            k: k as i32,
            t: t as i32,
            h,
            inter: e.inter as i32,
            part,
            hidden: e.hidden as i32,
            mma: i32::from(self.inner.mma),
        }
        .launch(
            self,
            variant,
            (
                (e.hidden as u32).div_ceil(warps * EXPERT_DOWN_ROWS),
                items as u32,
                1,
            ),
            (32 * warps, 1, 1),
        )
    }
}
