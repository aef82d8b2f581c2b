//! Every knob of the CUDA backend in one place: [`CudaOptions`], read from the `FP4FORGE_*`
//! environment once ([`CudaOptions::from_env`]) when a backend opens, stored in the backend, and
//! adjustable afterwards only through [`CudaBackend::set_options`] (benchmarks and tests).
//!
//! | variable | field | meaning | default |
//! |---|---|---|---|
//! | `FP4FORGE_CUDA_KERNELS` | `kernels_source` | compile this CUDA file instead of the built-in kernels (same names and signatures; `kernels/` concatenated in `KERNELS_CU`'s order) | the built-in source |
//! | `FP4FORGE_KERNEL_CACHE` | `kernel_cache` | directory of compiled kernels (one CUBIN per source, architecture and NVRTC version; a later start loads it instead of compiling for a minute); `off` or `0`: none | `$XDG_CACHE_HOME/fp4forge/kernels`, else `$HOME/.cache/fp4forge/kernels` |
//! | `FP4FORGE_CUDA_PDL` | `pdl` | `0`: no programmatic dependent launch (sm_90+ only anyway) | on |
//! | `FP4FORGE_CUDA_MMA` | `mma` | `0`: no tensor-core NVFP4 decode GEMVs (sm_89+ only anyway) | on |
//! | `FP4FORGE_CUDA_PERSIST` | `persistent_moe` | `0`: one token's experts on the per-item kernels, not the persistent ones | on |
//! | `FP4FORGE_CUDA_FUSED_DECODE` | `fused_decode` | `0`: the model path's single-token steps on the generic ops, not the fused sequence | on |
//! | `FP4FORGE_CUDA_FUSED_BATCH` | `fused_batch` | `0`: a decode step of several sequences on the generic ops, not the fused sequence over all of them | on |
//! | `FP4FORGE_CUDA_GEMM` | `tiled_prefill` | `0`: multi-token linears on the `linear` GEMV kernel, not `gemm_tiled` | on |
//! | `FP4FORGE_CUDA_MMA_GEMM` | `mma_gemm` | `0`: multi-token bf16/NVFP4 linears on `gemm_tiled` (f32 FMA), not `gemm_mma` (tensor cores, sm_80+) | on |
//! | `FP4FORGE_CUDA_H16_GEMM` | `h16_gemm` | `0`: prompts' NVFP4 linears (more than 64 tokens, K % 64 == 0) and grouped NVFP4 experts on `gemm_mma`'s core (f16 path), not on `gemm_h16`'s (x split once, K steps in flight; sm_90) | on |
//! | `FP4FORGE_CUDA_H16_MERGE` | `h16_merged` | `0`: the weights of one input on `gemm_h16` (q/k/v of a prompt) one launch each, not in one launch where their tiles fill the device without a K split | on |
//! | `FP4FORGE_CUDA_MMA_MERGE` | `mma_merged` | `1`: a prompt's bf16 weights of one input (the MoE router and the shared expert's gate and up) in one `gemm_mma_segs` launch without a K split, where their tiles together fill the device and some alone would split K, not one `gemm_mma` launch each (each splitting K and adding the splits in a launch of its own) | off (H100, 2026-12-07, two rounds: a 2K prompt 2.3% slower, 16K 1.5%: the merged grid's partial second wave of whole-K tiles costs more than three launches and their sums) |
//! | `FP4FORGE_CUDA_SPLITK_LAST` | `splitk_last` | `1`: a K-split `gemm_mma` / `gemm_h16` launch (a prompt's router, shared expert and attention gate: too few tiles to fill the device) adds its splits in the last block of each tile to finish (a ticket a tile), not in a `gemm_splitk_reduce` launch of its own; the same bits | off (H100, 2026-12-07, call 21, two rounds: a 2K prefill 142.40 → 142.65 ms, 16K 1,333.95 → 1,338.50; through `serve` 14,311 → 14,222 tok/s at 2K: the launches it saves overlap their neighbours already) |
//! | `FP4FORGE_CUDA_SPLIT_WARPS` | `split_row_warps` | warps a row of `x_split_h16` (a prompt's activations split into `gemm_h16`'s f16 parts), 8 / that many rows a block: `1`, `2`, `4` or `8`; `0`: the fewest of those whose blocks cover the device's SMs (a 128-token prompt: 16 blocks of one warp a row, 128 of eight), at most one a 128 values; the same bits at any count | 1 (not yet measured: a 128-token prefill spent 1.9 ms of its 27.9 in 80 launches of 16 blocks, H100, 2026-12-08) |
//! | `FP4FORGE_CUDA_H16_B1` | `h16_one_block` | `1`: `gemm_h16` as its variant of one block a SM with more registers, each chunk's B fragments loaded ahead | off |
//! | `FP4FORGE_CUDA_GROUPED_MOE` | `grouped_moe` | `0`: multi-token routed experts on the per-item kernels, not grouped by expert on tensor cores (sm_80+) | on |
//! | `FP4FORGE_CUDA_BATCH_ATTN` | `batched_attention` | `0`: a batched decode step's attention sequence by sequence (rope, attention, append per sequence), not in one `attn_dec_batch` launch | on |
//! | `FP4FORGE_CUDA_FLASH` | `flash_attention` | `0`: prefill attention (16+ rows) on the `attn_*` kernels, not on tensor cores (`attn_flash_*`, sm_80+ only anyway) | on |
//! | `FP4FORGE_CUDA_LEGACY_GEMV` | `legacy_gemv` | set (any value): decode GEMVs on the one-row-per-warp `linear` kernel | off |
//! | `FP4FORGE_NV_MINB` | `nv_blocks_per_sm` | `3`: the NVFP4 decode GEMV variant with 3 resident blocks per SM | 2 |
//! | `FP4FORGE_NV_GRID` | `nv_grid_per_sm` | blocks per SM of the NVFP4 decode GEMV's persistent grid (0: one block per tile) | `nv_blocks_per_sm` |
//! | `FP4FORGE_NV_KS` | `nv_k_split` | `1`, `2`, `4`, `8`: fixed K split (warps) of the NVFP4 decode GEMV | per shape (`nv_split`) |
//! | `FP4FORGE_CUDA_MT_TOKENS` | `few_token_max` | most tokens of a bf16/NVFP4 linear on the few-token tensor-core GEMV (`gemv_mt`; more: `gemm_mma`); `0`: never | `GEMV_MT_MAX_TOKENS` |
//! | `FP4FORGE_CUDA_FEW_MOE` | `few_moe_min_tokens` | fewest tokens whose routed experts run grouped a few items per tile (`experts_grouped_few`); `0`: never | `FEW_MOE_MIN_TOKENS` |
//! | `FP4FORGE_CUDA_FEW_ITEMS` | `few_items_per_expert` | most routed items per expert (on average over all experts) of a step or prompt chunk whose experts run grouped a few items per tile (`experts_grouped_few`; more: the tiled `experts_*_h16` GEMM), e.g. a 128-token prompt of Laguna-XS (8 of 256 experts a token) has 4 | `FEW_ITEMS_PER_EXPERT` (4) |
//! | `FP4FORGE_CUDA_FEW_TILE8` | `few_tile8_items` | `N`: where the routed items of a step or prompt chunk on the few-items-per-tile experts average N or more per expert (a 128-token prompt of Laguna-XS: 4), they run on tiles of up to 8 items of one expert (`experts_gate_up_mt8`, `experts_down_mt8`: two column groups of the mma, each decoded weight fragment feeding both, so each expert's weights read once per 8 of its items instead of 4; 2 chunk slots a lane, 128 registers, two blocks a SM; the same arithmetic, so the same bits); `0`: never | `FEW_TILE8_MIN_ITEMS` (3: H100, 2026-12-08, two rounds: a 96-token prompt 23.85 → 23.50 ms, 128 tokens 28.00 → 27.10; 64 tokens unchanged; the few-items path up to 6 an expert (`FEW_ITEMS=6`) 3.8% slower at 192 tokens than the tiled GEMM) |
//! | `FP4FORGE_MMA_KS` | `mma_k_split` | `1`, `2`, `4`, `8`: fixed K split (warps per tile) of `gemv_mma` | per shape (`mma_split`) |
//! | `FP4FORGE_CUDA_MT_B1` | `mt_one_block` | `1`: NVFP4 `gemv_mt` as its variant of one block a SM with more chunks in flight a lane (`gemv_mt_nv_b1`) | off |
//! | `FP4FORGE_CUDA_MT16` | `mt_16_tokens` | `1`: NVFP4 `gemv_mt` of more than 8 tokens at 16 tokens a grid row (`gemv_mt_nv16`: each weight read half as often, one block a SM) | off |
//! | `FP4FORGE_CUDA_MT4` | `mt_4_tokens` | `0`: NVFP4 `gemv_mt` of at most 4 tokens at 8 tokens a grid row (`gemv_mt_nv`), not at 4 with three blocks a SM (`gemv_mt_nv4`) | on |
//! | `FP4FORGE_CUDA_NORM_STAGE` | `norm_stage` | `0`: a batched decode step's norms do not also stage their rows for `gemv_mt` (q/k/v/gate and the router then each launch `xb_stage`) | on |
//! | `FP4FORGE_CUDA_REDUCE_NORM` | `reduce_norm` | `1`: in a batched decode step the MoE's sum also runs the next norm and its staging (`experts_reduce_norm_stage`, one launch a layer fewer; with `norm_stage`) | off (H100, 2026-12-06: 1.3–2.8% slower at 2–32 rows) |
//! | `FP4FORGE_CUDA_ROUTER_TOPK` | `router_topk` | `1`: in a batched decode step the router's top-k runs as the tail of the router's own launch (`gemv_mt_bf16_topk`: its last block to finish), not as a `route` launch, where that top-k prefetches nothing; where the experts run a few items per tile, that block also groups the items by expert (not a `moe_align` launch) | off (H100, 2026-12-06: 1.5–5.6% slower at 2–32 rows) |
//! | `FP4FORGE_CUDA_MT_MIXED` | `mt_mixed` | `0`: a batched step of up to 4 rows runs one input's NVFP4 and bf16 linears (q/k/v and the attention's gate) one launch per format, not in one `gemv_mt_mixed4` launch | on (H100, 2026-12-06, three rounds: 2.0–3.7% faster at 2–4 rows, neutral at 8 and 32) |
//! | `FP4FORGE_CUDA_MT_MIXED8` | `mt_mixed8` | `0`: a batched step of 5 to 32 rows runs one input's NVFP4 and bf16 linears (q/k/v and the attention's gate) one launch per format, not in one `gemv_mt_mixed8` launch (the bf16 blocks first; with `mt_mixed`) | on (H100, 2026-12-06, two rounds: 2.9% faster at 8 rows, 1.7% at 16, 1.0% at 32) |
//! | `FP4FORGE_CUDA_ROUTER_SHARED` | `router_shared` | `0`: in a batched decode step whose routed experts run a few items per tile (32+ rows), the router and the shared expert's gate/up (bf16, the same staged input) run in two `gemv_mt` launches, not one | on (H100, 2026-12-06, two rounds: 0.6–0.7% faster at 32 rows, the only rows where it applies) |
//! | `FP4FORGE_CUDA_FEW_GRID` | `few_grid_divisor` | `N`: the few-items-per-tile experts' launches (`experts_gate_up_mt`, `experts_down_mt`) take the tiles bound / N grid rows, each block looping over its tiles (the bound is about twice a 32-row step's tile count: with 1 the blocks past the count, about half of them, only read it and exit); the same bits | `FEW_GRID_DIVISOR` = 2 (H100, 2026-12-06, call S: a 32-row step 8.2% faster than with 1) |
//! | `FP4FORGE_CUDA_FEW_B3` | `few_three_blocks` | `0`: the few-items-per-tile experts (`experts_gate_up_mt`, `experts_down_mt`: batched steps of `FEW_MOE_MIN_TOKENS` rows or more, prompts of a few items per expert) at 4 chunk slots a lane and two blocks a SM (128 registers), not on their variants of 2 slots, 80 registers, three blocks a SM (`experts_gate_up_mt3`, `experts_down_mt3`; the same arithmetic, so the same bits) | on (H100, 2026-12-07, call 23, two rounds: a 32-row step 12.27 → 11.73 ms, −4.4%; 64 rows 19.50 → 18.29, −6.2%; with `FEW_GRID=1` as well, 12.76 and 19.42) |
//! | `FP4FORGE_CUDA_MOE_STAGED` | `moe_staged` | `0`: in a batched decode step whose routed experts run a few items per tile (`experts_grouped_few`), the MoE's input and the shared expert's SiLU product are staged by `xb_stage` launches, not by the kernels that produce them (the MoE's input norm staging its rows for the experts and the shared expert's gate/up: two launches a layer fewer, with `norm_stage`; `silu_mul_stage` staging the SiLU product for the down projection: one fewer) | on (H100, 2026-12-06, three rounds: 2.8–3.5% faster at 32 rows, neutral at 2–8) |
//! | `FP4FORGE_CUDA_ITEM_STAGED` | `item_staged` | `1`: in a batched decode step whose routed experts run one grid row per item (`experts_gate_up2`, below `FEW_MOE_MIN_TOKENS` rows), the MoE's input norm also stages its rows for NVFP4 and the items' tensor-core path reads them there, not each block staging its token's row into shared memory (the same bits; with `norm_stage`) | off (H100, 2026-12-07, two rounds: +1.3% at 4 rows, +1.1% at 8, the same at 32; 2026-12-06: +1.1–8.3% at 2–8) |
//! | `FP4FORGE_CUDA_SHARED_MT` | `shared_mt_min_rows` | `N`: batched decode steps of N or more rows whose routed experts run one grid row per item (`experts_gate_up2`, below `FEW_MOE_MIN_TOKENS` rows) run the shared expert on `gemv_mt` (its gate and up in the router's launch where `router_shared` allows, its SiLU product staged by `silu_mul_stage` with `moe_staged`, its down one launch), each weight read once for all the step's rows, not as one more item per row of the per-item kernels (its bf16 rows read once per row, on CUDA cores); other bits, within the tests' tolerance; `0`: never | `SHARED_MT_MIN_ROWS` (4; H100, 2026-12-07, two rounds each: a 16-row step 2.5% faster, 10.79 → 10.52 ms, a 4-row step 3.0% slower, 4.45 → 4.58 (call 13); with the routed down then on `experts_down2_tc` (`item_tc`), 8 rows 6.58 → 6.35 ms, 16 rows 10.57 → 10.16, 4 rows 4.41 → 4.44 (call 18); H200, with the routed gate/up also on `experts_gate_up2_tc` (`gate_up_tc`), 4 rows 4.27 → 4.08 (call 20); H100, from 2 rows: 2 rows 3.67 → 4.06, 3 rows 4.12 → 4.30 (call 21, two rounds, noisy: one round of each faster)) |
//! | `FP4FORGE_CUDA_NORM_ROUTER` | `norm_router_rows` | `N`: batched decode steps of 2 to N rows (at most 4) whose MoE input is staged for nothing (the per-item experts, without `item_staged` or `shared_mt_min_rows`) and whose top-k keeps its own launch run the MoE's input norm and the bf16 router in one `norm_gemv_bf16` launch, as one row does (each block norms the rows itself, block 0 writes them for the experts; the router on CUDA cores, each weight row read once for all rows), not a `norm_stage` launch and a `gemv_mt` one: one launch a MoE layer fewer, and each row's router logits the bits of that row alone; `0`: never | 0 (H100, 2026-12-07, call 13, two rounds: a 4-row step 3.4% slower, 4.45 → 4.60 ms; not profiled: the router's dot products on CUDA cores and every block norming the rows are the likely cost) |
//! | `FP4FORGE_CUDA_DOWN_B4` | `down_four_blocks` | `1`: the per-item experts' down projection (batched steps below `FEW_MOE_MIN_TOKENS` rows) at four blocks a SM (`experts_down2_b4`: at most 128 registers) | off |
//! | `FP4FORGE_CUDA_DOWN_W8` | `down_eight_warps` | `1`: the per-item experts' down projection in blocks of 8 warps (`experts_down2_w8`: 64 rows a block on the tensor-core path, half the blocks, two a SM; the same bits) | off (H100, 2026-12-07, two rounds: +2.0% at 8 rows, within 0.5% at 4 and 32; 2026-12-06: +0.6–12.7% at 2–32) |
//! | `FP4FORGE_CUDA_ITEM_TC` | `item_tc` | `0`: a batched step's per-item routed experts' down projection on `experts_down2` (three blocks a SM) where no shared expert rides in its launch (`FP4FORGE_CUDA_SHARED_MT` covers the step, or the model has none), not on its tensor-core-only kernel (`experts_down2_tc`: 93 registers, five blocks a SM; the same arithmetic, so the same bits) | on (H100, 2026-12-07, two rounds, with the shared expert on `gemv_mt`: 3.5% faster at 8 rows, 3.8% at 16, 2% at 4) |
//! | `FP4FORGE_CUDA_GU_TC` | `gate_up_tc` | `0`: the per-item routed experts' gate/up launch on `experts_gate_up2` (two blocks a SM) even where no shared expert rides in it (as for `item_tc`), not on its tensor-core-only kernel (`experts_gate_up2_tc`: 2 chunk slots a lane instead of 4, under 85 registers, three blocks a SM instead of two; the same arithmetic, so the same bits) | on (H200, 2026-12-07, two rounds: 5.6% faster at 8 rows, 6.6% at 16; with the shared expert on `gemv_mt` from 2 rows, 4.6% faster at 4) |
//! | `FP4FORGE_CUDA_L2_PREFETCH` | `l2_prefetch_rows` | `N`: batched decode steps of N or more rows prefetch weights into L2 ahead of their loads (sm_90): the routed experts' gate/up by the router's top-k, their down by the gate/up blocks (per-item experts, as many items as fit in L2), the next wave's by the grouped experts' blocks, each `gemv_mt` block's rows before it waits for its input; `0`: never, `1`: every batched step | `L2_PREFETCH_MIN_ROWS` (32) |
//! | `FP4FORGE_CUDA_MT_DEEP` | `mt_deep` | `0`: NVFP4 `gemv_mt` launches of at most one block a SM (a few rows' o projection) on `gemv_mt_nv4` / `gemv_mt_nv`, not on `gemv_mt_nv4_deep` / `gemv_mt_nv_deep` (each warp's whole run of chunks in flight and the tokens' B fetched 3 chunks ahead, one block a SM; the same bits) | on (H100, 2026-12-06, two rounds: 1.3% faster at 2 rows, 0.7–0.9% at 4, neutral at 8 and 32) |
//! | `FP4FORGE_CUDA_MT_DEEP_ALL` | `mt_deep_all` | `1`: NVFP4 `gemv_mt` launches of any grid on the deep variants (with `mt_deep`), e.g. a 32-row step's q/k/v and o at one block a SM, each warp's whole run of chunks in flight | off (H100, 2026-12-07: 5.8% slower at 32 rows, within 1% at 4 and 8; 2026-12-06: +2.4–10.2% at 2–32) |
//! | `FP4FORGE_CUDA_MT_WIDE` | `mt_wide_min_tokens` | `N`: NVFP4 `gemv_mt` launches of N or more tokens (at least 5: up to 4, `gemv_mt_nv4` and the mixed launch stay) on `gemv_mt_wide` (blocks of 128 rows over a run of at most 4 chunks, the run's B for all the step's tokens copied once into shared memory, each decoded weight fragment feeding up to 32 tokens; K split over blocks, the last block of each row block adding the splits in order); `0`: never | off (H100, 2026-12-06, two rounds: 0.3–7.3% slower at 6–32 rows; its 32-bit B addresses since not yet measured) |
//! | `FP4FORGE_CUDA_H16_FEW` | `h16_few_min` | `N`: NVFP4 linears of N to 32 tokens (a batched decode step's q/k/v and o) on `gemm_h16`'s tiles of 32 tokens (`gemm_h16_t32`: each weight fragment decoded once for all the step's tokens, weights and x copied through shared memory three K steps ahead, K split over blocks and summed by `gemm_splitk_reduce`), not on `gemv_mt` (8 tokens a grid row); `0`: never | off (H100, 2026-12-06, call S, `N` = 9: 10% slower at 16 rows, 2.2% at 32; at 32 rows `gemm_h16_t32` took 2.14 ms a step against `gemv_mt_nv`'s ~3.2, but `x_split_h16`, 4 blocks for 32 rows, 0.98 ms and the K splits' sums 0.60; H100, 2026-12-07, with `x_split_h16`'s register path, two rounds: still 1.2% slower at 32 rows) |
//! | `FP4FORGE_CUDA_MT_INTERLEAVE` | `mt_interleave` | `0`: `gemv_mt` grids of several grid rows (more tokens than a grid row holds) launch each grid row's blocks one after another, not each block of weight rows' grid rows side by side (the weights then come from DRAM once and the other grid rows read them in L2; a 32-row step's lm_head is 411 MB of bf16 in four grid rows); the same bits | on (H100, 2026-12-06, two rounds: 2.8% faster at 32 rows, 1.8% at 16, neutral at 8) |
//! | `FP4FORGE_CUDA_MT_FILL` | `mt_blocks_per_sm` | blocks a SM that `gemv_mt`'s K split aims its grid at (`mma_split`: warps per tile doubled while the grid is below this many blocks a SM and each warp keeps 2+ chunks; `gemv_mt_nv4` holds 3) | 1 (H100, 2026-12-06, two rounds: 3 was 2–3% slower at 8 and 32 rows, within 0.5% at 2 and 4) |
//! | `FP4FORGE_CUDA_NORM_ROPE` | `norm_rope` | `0`: a prompt chunk's per-head q/k norms run as `rms_norm_warp` launches before the rope (`norm_rope` without a weight), not inside the rope's pass (`norm_rope`: one read and write of q and k fewer; the same bits) | on (H100, 2026-12-07, two rounds: a 2K prefill 140.2 ms against 142.5 with it off, 16K 1,318.7 against 1,330.9) |
//! | `FP4FORGE_CUDA_ATTN_G8` | `attn_g8` | `1`: where the tensor-core kernels do not take it (`attn_mma`), a batched decode step's attention with 128-wide heads takes all of a kv head's query heads (up to 8: Laguna's 6 or 8) in one block (`attn_dec_batch_*_128_g8`), not in blocks of 4 (`DEC_GMAX`), where blocks of 4 would take more than one wave (a 32-row step of Laguna-XS: 512 blocks for 264 slots on an H100; below that, halving the blocks halves the work in flight), so that each cached K/V row is read by one block instead of two; `2`: at any step (tests); the key splits as with 4, so the same bits | off (H200, 2026-12-06, at every step: 2.7% faster at 32 rows, 5.1% slower at 4; served, 5% slower at 4 and 16 streams, even at 32; the wave rule not yet measured) |
//! | `FP4FORGE_CUDA_ATTN_MMA` | `attn_mma` | `N`: batched decode steps of N or more rows attend on tensor cores (`attn_dec_batch_*_128_mma`: head_dim 128, up to 8 query heads per kv head; one block a kv head and sequence, its K/V rows read once from global memory into registers, 32 keys a warp in flight, scores and P V on `mma.m16n8k16` with q in three bf16 parts as the prefill's flash attention; other bits than the CUDA-core kernels, within the tests' tolerance), not on the CUDA-core kernels; `0`: never | `ATTN_MMA_MIN_ROWS` (4; H100, 2026-12-07, two rounds at the serve's contexts: a 32-row step 7.9% faster, 13.41 → 12.36 ms, a 4-row step 1.6%; served, 32 streams 2,374 against 2,152 tok/s; 2–3 rows not measured) |
//! | `FP4FORGE_CUDA_MT_KS` | `mt_k_split` | `1`, `2`, `4`, `8`: fixed K split (warps per tile) of `gemv_mt` | per shape (`mma_split`) |
//! | `FP4FORGE_CUDA_ATTN_MIN_KEYS` | `attn_split_min_keys` | `N` > 0: fewest keys per key split of decode attention (the tensor-core batched kernels: at least 128); a step whose keys make one split launches no `attn_combine` | [`ATTN_SPLIT_MIN_KEYS`] (64; H100, 2026-12-07, two rounds at 128–256 keys: 256 made one row 15.2% slower, 4 rows 3.4%, one row at 2K keys 21%) |
//!
//! The fields below the table's are not read from the environment: the rest of the decode
//! attention split heuristic, the short-span attention threshold and the persistent MoE grid cap, which the
//! decode benchmark sweeps and the GPU tests vary.

use std::ffi::OsStr;
use std::path::PathBuf;

use super::ops::attention::{
    ATTN_MMA_MIN_ROWS, ATTN_SHORT_KEYS, ATTN_SPLIT_BLOCKS_PER_SM, ATTN_SPLIT_MIN_KEYS,
};
use super::ops::gemv::{GEMV_MT_MAX_TOKENS, NV_BLOCKS_PER_SM};
use super::ops::moe::{
    FEW_GRID_DIVISOR, FEW_ITEMS_PER_EXPERT, FEW_MOE_MIN_TOKENS, FEW_TILE8_MIN_ITEMS,
    L2_PREFETCH_MIN_ROWS, SHARED_MT_MIN_ROWS,
};

/// The CUDA backend's knobs (see the module's table for the `FP4FORGE_*` variable of each).
/// `kernels_source`, `pdl` and `mma` take effect when a backend opens
/// ([`CudaBackend::with_options`](super::CudaBackend::with_options)); the others at any time
/// ([`CudaBackend::set_options`](super::CudaBackend::set_options)).
#[derive(Clone, Debug, PartialEq)]
pub struct CudaOptions {
    /// `FP4FORGE_CUDA_KERNELS`: a CUDA source file compiled instead of the built-in kernels.
    pub kernels_source: Option<PathBuf>,
    /// `FP4FORGE_KERNEL_CACHE`: the directory of compiled kernels (`None`: compile every time).
    pub kernel_cache: Option<PathBuf>,
    /// `FP4FORGE_CUDA_PDL`: programmatic dependent launch where the device has it (sm_90+).
    pub pdl: bool,
    /// `FP4FORGE_CUDA_MMA`: NVFP4 decode GEMVs on tensor cores where the device has them (sm_89+).
    pub mma: bool,
    /// `FP4FORGE_CUDA_PERSIST`: one token's experts on the persistent kernels where they apply.
    pub persistent_moe: bool,
    /// `FP4FORGE_CUDA_FUSED_DECODE`: the model path's single-token steps on the fused sequence.
    pub fused_decode: bool,
    /// `FP4FORGE_CUDA_FUSED_BATCH`: decode steps of several sequences on the fused sequence.
    pub fused_batch: bool,
    /// `FP4FORGE_CUDA_GEMM`: multi-token linears (16+ tokens) on `gemm_tiled`.
    pub tiled_prefill: bool,
    /// `FP4FORGE_CUDA_MMA_GEMM`: multi-token bf16/NVFP4 linears on tensor cores (`gemm_mma`).
    pub mma_gemm: bool,
    /// `FP4FORGE_CUDA_H16_GEMM`: prompts' NVFP4 linears and grouped experts on `gemm_h16`'s core
    /// where it runs.
    pub h16_gemm: bool,
    /// `FP4FORGE_CUDA_H16_MERGE`: the weights of one input on `gemm_h16` in one launch where it
    /// needs no K split.
    pub h16_merged: bool,
    /// `FP4FORGE_CUDA_H16_B1`: `gemm_h16`'s variant of one block a SM (`gemm_h16_b1`).
    pub h16_one_block: bool,
    /// `FP4FORGE_CUDA_MT_B1`: NVFP4 `gemv_mt`'s variant of one block a SM (`gemv_mt_nv_b1`).
    pub mt_one_block: bool,
    /// `FP4FORGE_CUDA_MT16`: NVFP4 `gemv_mt` past 8 tokens at 16 tokens a grid row.
    pub mt_16_tokens: bool,
    /// `FP4FORGE_CUDA_MT4`: NVFP4 `gemv_mt` of at most 4 tokens at 4 tokens a grid row.
    pub mt_4_tokens: bool,
    /// `FP4FORGE_CUDA_NORM_STAGE`: a batched step's norms stage their rows for `gemv_mt`.
    pub norm_stage: bool,
    /// `FP4FORGE_CUDA_REDUCE_NORM`: a batched step's MoE sum also runs the next norm and its
    /// staging.
    pub reduce_norm: bool,
    /// `FP4FORGE_CUDA_ROUTER_TOPK`: a batched step's top-k runs as the router launch's tail.
    pub router_topk: bool,
    /// `FP4FORGE_CUDA_MT_MIXED`: one input's NVFP4 and bf16 linears of up to 4 rows in one launch.
    pub mt_mixed: bool,
    /// `FP4FORGE_CUDA_MT_MIXED8`: with `mt_mixed`, also at 5 to 32 rows (`gemv_mt_mixed8`).
    pub mt_mixed8: bool,
    /// `FP4FORGE_CUDA_ROUTER_SHARED`: a batched step's router and shared expert's gate/up in one
    /// launch (the few-items-per-tile experts' steps).
    pub router_shared: bool,
    /// `FP4FORGE_CUDA_FEW_GRID`: the few-items-per-tile experts' grid rows are the tiles bound
    /// divided by this (at least 1).
    pub few_grid_divisor: usize,
    /// `FP4FORGE_CUDA_FEW_B3` (`0`: off): the few-items-per-tile experts at three blocks a SM
    /// (2 chunk slots a lane).
    pub few_three_blocks: bool,
    /// `FP4FORGE_CUDA_MOE_STAGED`: a batched step's MoE input norm also stages its rows for the
    /// few-items-per-tile experts and the shared expert, and the shared expert's SiLU product
    /// is staged for its down projection.
    pub moe_staged: bool,
    /// `FP4FORGE_CUDA_ITEM_STAGED`: a batched step's per-item experts read their input as the
    /// MoE's norm staged it.
    pub item_staged: bool,
    /// `FP4FORGE_CUDA_SHARED_MT`: fewest rows (0: never; default [`SHARED_MT_MIN_ROWS`]) of a
    /// batched step whose per-item experts leave the shared expert to `gemv_mt` (each weight
    /// read once for all rows).
    pub shared_mt_min_rows: usize,
    /// `FP4FORGE_CUDA_NORM_ROUTER`: most rows (0: never; at most 4 apply) of a batched step
    /// whose MoE input norm and router run in one `norm_gemv_bf16` launch.
    pub norm_router_rows: usize,
    /// `FP4FORGE_CUDA_DOWN_B4`: the per-item experts' down projection at four blocks a SM.
    pub down_four_blocks: bool,
    /// `FP4FORGE_CUDA_DOWN_W8`: the per-item experts' down projection in blocks of 8 warps.
    pub down_eight_warps: bool,
    /// `FP4FORGE_CUDA_ITEM_TC` (`0`: off): the per-item routed experts' down projection on its
    /// tensor-core-only kernel where that applies (more blocks a SM).
    pub item_tc: bool,
    /// `FP4FORGE_CUDA_GU_TC` (`0`: off): the per-item routed experts' gate/up on its
    /// tensor-core-only kernel where that applies (three blocks a SM).
    pub gate_up_tc: bool,
    /// `FP4FORGE_CUDA_L2_PREFETCH`: fewest rows of a batched step whose weights are prefetched
    /// into L2 ahead of their loads (sm_90; 0: never).
    pub l2_prefetch_rows: usize,
    /// `FP4FORGE_CUDA_GROUPED_MOE`: multi-token routed experts grouped by expert on tensor cores.
    pub grouped_moe: bool,
    /// `FP4FORGE_CUDA_BATCH_ATTN`: a batched decode step's attention in one launch.
    pub batched_attention: bool,
    /// `FP4FORGE_CUDA_FLASH`: prefill attention (16+ rows, bf16 / fp8 caches) on tensor cores.
    pub flash_attention: bool,
    /// `FP4FORGE_CUDA_LEGACY_GEMV`: decode GEMVs on the one-row-per-warp `linear` kernel.
    pub legacy_gemv: bool,
    /// `FP4FORGE_NV_MINB`: resident blocks per SM of the NVFP4 decode GEMV variant (2 or 3).
    pub nv_blocks_per_sm: usize,
    /// `FP4FORGE_NV_GRID`: blocks per SM of the NVFP4 decode GEMV's grid (0: one per tile).
    pub nv_grid_per_sm: usize,
    /// `FP4FORGE_NV_KS`: a fixed K split of the NVFP4 decode GEMV (1, 2, 4 or 8 warps).
    pub nv_k_split: Option<usize>,
    /// `FP4FORGE_CUDA_MT_TOKENS`: most tokens of a linear on `gemv_mt` (0: never).
    pub few_token_max: usize,
    /// `FP4FORGE_CUDA_FEW_MOE`: fewest tokens on `experts_grouped_few` (0: never).
    pub few_moe_min_tokens: usize,
    /// `FP4FORGE_CUDA_FEW_ITEMS`: most routed items per expert (on average) on
    /// `experts_grouped_few`.
    pub few_items_per_expert: usize,
    /// `FP4FORGE_CUDA_SPLIT_WARPS`: warps a row of `x_split_h16` (1, 2, 4, 8; 0: the fewest
    /// whose blocks cover the SMs).
    pub split_row_warps: usize,
    /// `FP4FORGE_CUDA_FEW_TILE8`: fewest routed items per expert (on average) that
    /// `experts_grouped_few` runs on tiles of 8 items (0: never).
    pub few_tile8_items: usize,
    /// `FP4FORGE_MMA_KS`: a fixed K split of `gemv_mma` (1, 2, 4 or 8 warps per tile).
    pub mma_k_split: Option<usize>,
    /// `FP4FORGE_CUDA_MT_KS`: a fixed K split of `gemv_mt` (1, 2, 4 or 8 warps per tile).
    pub mt_k_split: Option<usize>,
    /// `FP4FORGE_CUDA_MT_DEEP`: NVFP4 `gemv_mt` grids of at most one block a SM on the deep
    /// variants (a warp's whole run of chunks in flight).
    pub mt_deep: bool,
    /// `FP4FORGE_CUDA_MT_DEEP_ALL`: with `mt_deep`, NVFP4 `gemv_mt` grids of any size on the
    /// deep variants.
    pub mt_deep_all: bool,
    /// `FP4FORGE_CUDA_MT_FILL`: blocks a SM that `gemv_mt`'s K split aims its grid at.
    pub mt_blocks_per_sm: usize,
    /// `FP4FORGE_CUDA_MT_INTERLEAVE`: `gemv_mt` blocks take one block of weight rows' grid rows
    /// side by side.
    pub mt_interleave: bool,
    /// `FP4FORGE_CUDA_H16_FEW`: fewest tokens (0: never) of an NVFP4 linear of at most
    /// `GEMM_H16_FEW_TOKENS` on `gemm_h16_t32` instead of `gemv_mt`.
    pub h16_few_min: usize,
    /// `FP4FORGE_CUDA_MT_WIDE`: fewest tokens (at least 5) of an NVFP4 `gemv_mt` launch on
    /// `gemv_mt_wide` (0: never).
    pub mt_wide_min_tokens: usize,
    /// `FP4FORGE_CUDA_MMA_MERGE`: a prompt's bf16 weights of one input in one `gemm_mma_segs`
    /// launch without a K split.
    pub mma_merged: bool,
    /// `FP4FORGE_CUDA_SPLITK_LAST`: a K-split `gemm_mma` / `gemm_h16` launch adds its splits in
    /// each tile's last block, without a `gemm_splitk_reduce` launch.
    pub splitk_last: bool,
    /// `FP4FORGE_CUDA_NORM_ROPE`: a prompt chunk's per-head q/k norms inside the rope's pass.
    pub norm_rope: bool,
    /// `FP4FORGE_CUDA_ATTN_G8`: where a batched decode step's attention of 128-wide heads takes
    /// a kv head's whole group of up to 8 query heads in one block: 0 never, 1 where blocks of
    /// 4 would take more than a wave, 2 always.
    pub attn_g8: usize,
    /// `FP4FORGE_CUDA_ATTN_MMA`: fewest rows of a batched decode step whose attention of
    /// 128-wide heads (up to 8 query heads per kv head) runs on tensor cores (0: never;
    /// default [`ATTN_MMA_MIN_ROWS`]).
    pub attn_mma: usize,
    /// `FP4FORGE_CUDA_ATTN_MIN_KEYS`: fewest keys per split of decode attention
    /// (`ATTN_SPLIT_MIN_KEYS`).
    pub attn_split_min_keys: u32,
    /// Decode attention blocks per SM the split heuristic aims at (`ATTN_SPLIT_BLOCKS_PER_SM`;
    /// 0: one wave of the kernel launched).
    pub attn_split_blocks_per_sm: u32,
    /// Attended keys up to which head_dim-128 decode attention takes its short-span variant
    /// (`ATTN_SHORT_KEYS`; 0: never).
    pub attn_short_keys: usize,
    /// Cap on the persistent MoE kernels' grid (0: as many blocks as are resident).
    pub persist_grid: usize,
}

impl Default for CudaOptions {
    /// The built-in defaults, whatever the environment says.
    fn default() -> Self {
        Self {
            kernels_source: None,
            kernel_cache: None,
            pdl: true,
            mma: true,
            persistent_moe: true,
            fused_decode: true,
            fused_batch: true,
            tiled_prefill: true,
            mma_gemm: true,
            h16_gemm: true,
            h16_merged: true,
            h16_one_block: false,
            mt_one_block: false,
            mt_16_tokens: false,
            mt_4_tokens: true,
            norm_stage: true,
            reduce_norm: false,
            router_topk: false,
            mt_mixed: true,
            mt_mixed8: true,
            router_shared: true,
            few_grid_divisor: FEW_GRID_DIVISOR,
            few_three_blocks: true,
            moe_staged: true,
            item_staged: false,
            shared_mt_min_rows: SHARED_MT_MIN_ROWS,
            norm_router_rows: 0,
            down_four_blocks: false,
            down_eight_warps: false,
            item_tc: true,
            gate_up_tc: true,
            l2_prefetch_rows: L2_PREFETCH_MIN_ROWS,
            grouped_moe: true,
            batched_attention: true,
            flash_attention: true,
            legacy_gemv: false,
            nv_blocks_per_sm: NV_BLOCKS_PER_SM,
            nv_grid_per_sm: NV_BLOCKS_PER_SM,
            nv_k_split: None,
            mma_k_split: None,
            mt_k_split: None,
            mt_deep: true,
            mt_deep_all: false,
            mt_blocks_per_sm: 1,
            mt_wide_min_tokens: 0,
            h16_few_min: 0,
            attn_g8: 0,
            attn_mma: ATTN_MMA_MIN_ROWS,
            norm_rope: true,
            mma_merged: false,
            splitk_last: false,
            mt_interleave: true,
            few_token_max: GEMV_MT_MAX_TOKENS,
            few_moe_min_tokens: FEW_MOE_MIN_TOKENS,
            few_items_per_expert: FEW_ITEMS_PER_EXPERT,
            few_tile8_items: FEW_TILE8_MIN_ITEMS,
            split_row_warps: 1,
            attn_split_min_keys: ATTN_SPLIT_MIN_KEYS,
            attn_split_blocks_per_sm: ATTN_SPLIT_BLOCKS_PER_SM,
            attn_short_keys: ATTN_SHORT_KEYS,
            persist_grid: 0,
        }
    }
}

impl CudaOptions {
    /// The defaults overridden by the `FP4FORGE_*` variables of the environment (the module's
    /// table); unparsable values are ignored.
    pub fn from_env() -> Self {
        Self::from_vars(|k| std::env::var_os(k))
    }

    /// [`from_env`](Self::from_env) over `var` instead of the process environment.
    fn from_vars(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> Self {
        let d = Self::default();
        // "0" switches a default-on feature off; anything else (or nothing) leaves it on
        let on = |k: &str| var(k).as_deref() != Some(OsStr::new("0"));
        let num = |k: &str| {
            var(k)
                .and_then(|v| v.into_string().ok())
                .and_then(|v| v.parse::<usize>().ok())
        };
        let split = |k: &str| num(k).filter(|s| [1, 2, 4, 8].contains(s));
        let nv_blocks_per_sm = match num("FP4FORGE_NV_MINB") {
            Some(3) => 3,
            _ => d.nv_blocks_per_sm,
        };
        Self {
            kernels_source: var("FP4FORGE_CUDA_KERNELS").map(PathBuf::from),
            kernel_cache: match var("FP4FORGE_KERNEL_CACHE") {
                Some(v) if v == "off" || v == "0" || v.is_empty() => None,
                Some(v) => Some(PathBuf::from(v)),
                None => var("XDG_CACHE_HOME")
                    .filter(|v| !v.is_empty())
                    .map(PathBuf::from)
                    .or_else(|| {
                        var("HOME")
                            .filter(|v| !v.is_empty())
                            .map(|h| PathBuf::from(h).join(".cache"))
                    })
                    .map(|d| d.join("fp4forge").join("kernels")),
            },
            pdl: on("FP4FORGE_CUDA_PDL"),
            mma: on("FP4FORGE_CUDA_MMA"),
            persistent_moe: on("FP4FORGE_CUDA_PERSIST"),
            fused_decode: on("FP4FORGE_CUDA_FUSED_DECODE"),
            fused_batch: on("FP4FORGE_CUDA_FUSED_BATCH"),
            tiled_prefill: on("FP4FORGE_CUDA_GEMM"),
            mma_gemm: on("FP4FORGE_CUDA_MMA_GEMM"),
            h16_gemm: on("FP4FORGE_CUDA_H16_GEMM"),
            h16_merged: on("FP4FORGE_CUDA_H16_MERGE"),
            h16_one_block: var("FP4FORGE_CUDA_H16_B1").as_deref() == Some(OsStr::new("1")),
            mt_one_block: var("FP4FORGE_CUDA_MT_B1").as_deref() == Some(OsStr::new("1")),
            mt_16_tokens: var("FP4FORGE_CUDA_MT16").as_deref() == Some(OsStr::new("1")),
            mt_4_tokens: on("FP4FORGE_CUDA_MT4"),
            norm_stage: on("FP4FORGE_CUDA_NORM_STAGE"),
            reduce_norm: var("FP4FORGE_CUDA_REDUCE_NORM").as_deref() == Some(OsStr::new("1")),
            router_topk: var("FP4FORGE_CUDA_ROUTER_TOPK").as_deref() == Some(OsStr::new("1")),
            mt_mixed: on("FP4FORGE_CUDA_MT_MIXED"),
            mt_mixed8: on("FP4FORGE_CUDA_MT_MIXED8"),
            router_shared: on("FP4FORGE_CUDA_ROUTER_SHARED"),
            few_grid_divisor: num("FP4FORGE_CUDA_FEW_GRID")
                .filter(|&n| n > 0)
                .unwrap_or(d.few_grid_divisor),
            few_three_blocks: on("FP4FORGE_CUDA_FEW_B3"),
            moe_staged: on("FP4FORGE_CUDA_MOE_STAGED"),
            item_staged: var("FP4FORGE_CUDA_ITEM_STAGED").as_deref() == Some(OsStr::new("1")),
            down_four_blocks: var("FP4FORGE_CUDA_DOWN_B4").as_deref() == Some(OsStr::new("1")),
            down_eight_warps: var("FP4FORGE_CUDA_DOWN_W8").as_deref() == Some(OsStr::new("1")),
            item_tc: on("FP4FORGE_CUDA_ITEM_TC"),
            gate_up_tc: on("FP4FORGE_CUDA_GU_TC"),
            l2_prefetch_rows: num("FP4FORGE_CUDA_L2_PREFETCH").unwrap_or(d.l2_prefetch_rows),
            grouped_moe: on("FP4FORGE_CUDA_GROUPED_MOE"),
            batched_attention: on("FP4FORGE_CUDA_BATCH_ATTN"),
            flash_attention: on("FP4FORGE_CUDA_FLASH"),
            legacy_gemv: var("FP4FORGE_CUDA_LEGACY_GEMV").is_some(),
            nv_blocks_per_sm,
            nv_grid_per_sm: num("FP4FORGE_NV_GRID").unwrap_or(nv_blocks_per_sm),
            nv_k_split: split("FP4FORGE_NV_KS"),
            mma_k_split: split("FP4FORGE_MMA_KS"),
            mt_k_split: split("FP4FORGE_CUDA_MT_KS"),
            mt_deep: on("FP4FORGE_CUDA_MT_DEEP"),
            mt_deep_all: var("FP4FORGE_CUDA_MT_DEEP_ALL").as_deref() == Some(OsStr::new("1")),
            mt_blocks_per_sm: num("FP4FORGE_CUDA_MT_FILL")
                .filter(|&n| n > 0)
                .unwrap_or(d.mt_blocks_per_sm),
            few_token_max: num("FP4FORGE_CUDA_MT_TOKENS").unwrap_or(d.few_token_max),
            few_moe_min_tokens: num("FP4FORGE_CUDA_FEW_MOE").unwrap_or(d.few_moe_min_tokens),
            few_items_per_expert: num("FP4FORGE_CUDA_FEW_ITEMS")
                .filter(|&n| n > 0)
                .unwrap_or(d.few_items_per_expert),
            few_tile8_items: num("FP4FORGE_CUDA_FEW_TILE8").unwrap_or(d.few_tile8_items),
            split_row_warps: num("FP4FORGE_CUDA_SPLIT_WARPS")
                .filter(|n| [0, 1, 2, 4, 8].contains(n))
                .unwrap_or(d.split_row_warps),
            mt_wide_min_tokens: num("FP4FORGE_CUDA_MT_WIDE").unwrap_or(d.mt_wide_min_tokens),
            h16_few_min: num("FP4FORGE_CUDA_H16_FEW").unwrap_or(d.h16_few_min),
            mt_interleave: on("FP4FORGE_CUDA_MT_INTERLEAVE"),
            attn_g8: num("FP4FORGE_CUDA_ATTN_G8").unwrap_or(d.attn_g8),
            attn_mma: num("FP4FORGE_CUDA_ATTN_MMA").unwrap_or(d.attn_mma),
            shared_mt_min_rows: num("FP4FORGE_CUDA_SHARED_MT").unwrap_or(d.shared_mt_min_rows),
            norm_router_rows: num("FP4FORGE_CUDA_NORM_ROUTER").unwrap_or(d.norm_router_rows),
            norm_rope: on("FP4FORGE_CUDA_NORM_ROPE"),
            mma_merged: var("FP4FORGE_CUDA_MMA_MERGE").as_deref() == Some(OsStr::new("1")),
            splitk_last: var("FP4FORGE_CUDA_SPLITK_LAST").as_deref() == Some(OsStr::new("1")),
            attn_split_min_keys: num("FP4FORGE_CUDA_ATTN_MIN_KEYS")
                .filter(|&n| n > 0)
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(d.attn_split_min_keys),
            ..d
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> CudaOptions {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        CudaOptions::from_vars(|k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.into()))
    }

    /// No variables: the defaults.
    #[test]
    fn empty_environment_gives_the_defaults() {
        assert_eq!(with(&[]), CudaOptions::default());
    }

    /// Only "0" switches a default-on feature off; the tuning numbers are checked.
    #[test]
    fn variables_override_their_fields() {
        let o = with(&[
            ("FP4FORGE_CUDA_PDL", "0"),
            ("FP4FORGE_CUDA_MMA", "1"),
            ("FP4FORGE_CUDA_PERSIST", "no"),
            ("FP4FORGE_CUDA_GEMM", "0"),
            ("FP4FORGE_CUDA_FUSED_BATCH", "0"),
            ("FP4FORGE_CUDA_GROUPED_MOE", "0"),
            ("FP4FORGE_CUDA_H16_GEMM", "0"),
            ("FP4FORGE_CUDA_H16_B1", "1"),
            ("FP4FORGE_CUDA_H16_MERGE", "0"),
            ("FP4FORGE_CUDA_MT_B1", "1"),
            ("FP4FORGE_CUDA_MT16", "1"),
            ("FP4FORGE_CUDA_MT4", "0"),
            ("FP4FORGE_CUDA_NORM_STAGE", "0"),
            ("FP4FORGE_CUDA_REDUCE_NORM", "1"),
            ("FP4FORGE_CUDA_ROUTER_TOPK", "1"),
            ("FP4FORGE_CUDA_MT_MIXED", "0"),
            ("FP4FORGE_CUDA_MT_MIXED8", "0"),
            ("FP4FORGE_CUDA_ROUTER_SHARED", "0"),
            ("FP4FORGE_CUDA_FEW_GRID", "3"),
            ("FP4FORGE_CUDA_MOE_STAGED", "1"),
            ("FP4FORGE_CUDA_ITEM_STAGED", "1"),
            ("FP4FORGE_CUDA_DOWN_B4", "1"),
            ("FP4FORGE_CUDA_DOWN_W8", "1"),
            ("FP4FORGE_CUDA_L2_PREFETCH", "1"),
            ("FP4FORGE_CUDA_FLASH", "0"),
            ("FP4FORGE_CUDA_LEGACY_GEMV", "0"),
            ("FP4FORGE_NV_MINB", "3"),
            ("FP4FORGE_NV_KS", "3"),
            ("FP4FORGE_MMA_KS", "4"),
            ("FP4FORGE_CUDA_MT_KS", "8"),
            ("FP4FORGE_CUDA_MT_DEEP", "0"),
            ("FP4FORGE_CUDA_MT_DEEP_ALL", "1"),
            ("FP4FORGE_CUDA_MT_FILL", "3"),
            ("FP4FORGE_CUDA_KERNELS", "/tmp/k.cu"),
            ("FP4FORGE_CUDA_MT_TOKENS", "0"),
            ("FP4FORGE_CUDA_FEW_MOE", "x"),
            ("FP4FORGE_CUDA_MT_WIDE", "9"),
            ("FP4FORGE_CUDA_MT_INTERLEAVE", "0"),
            ("FP4FORGE_CUDA_H16_FEW", "17"),
            ("FP4FORGE_CUDA_ATTN_G8", "1"),
            ("FP4FORGE_CUDA_ATTN_MMA", "5"),
            ("FP4FORGE_CUDA_SHARED_MT", "2"),
            ("FP4FORGE_CUDA_NORM_ROUTER", "4"),
            ("FP4FORGE_CUDA_NORM_ROPE", "0"),
            ("FP4FORGE_CUDA_MMA_MERGE", "1"),
            ("FP4FORGE_CUDA_ATTN_MIN_KEYS", "256"),
            ("FP4FORGE_CUDA_ITEM_TC", "0"),
            ("FP4FORGE_CUDA_GU_TC", "0"),
            ("FP4FORGE_CUDA_SPLITK_LAST", "1"),
            ("FP4FORGE_CUDA_FEW_B3", "0"),
            ("FP4FORGE_CUDA_FEW_ITEMS", "8"),
            ("FP4FORGE_CUDA_FEW_TILE8", "5"),
            ("FP4FORGE_CUDA_SPLIT_WARPS", "4"),
        ]);
        assert_eq!((o.few_items_per_expert, o.few_tile8_items), (8, 5));
        assert_eq!(o.split_row_warps, 4);
        assert!(!o.item_tc && !o.gate_up_tc && o.splitk_last && !o.few_three_blocks);
        assert_eq!(o.attn_split_min_keys, 256);
        assert!(o.attn_g8 == 1 && !o.norm_rope && o.mma_merged);
        assert_eq!(o.attn_mma, 5);
        assert_eq!(o.shared_mt_min_rows, 2);
        assert_eq!(o.norm_router_rows, 4);
        assert_eq!(o.mt_wide_min_tokens, 9);
        assert_eq!(o.h16_few_min, 17);
        assert!(!o.mt_interleave);
        assert_eq!(o.few_token_max, 0);
        assert_eq!(o.few_moe_min_tokens, FEW_MOE_MIN_TOKENS);
        assert!(!o.pdl && o.mma && o.persistent_moe && o.fused_decode && !o.tiled_prefill);
        assert!(o.legacy_gemv && o.mma_gemm && !o.grouped_moe && !o.flash_attention);
        assert!(!o.fused_batch && !o.h16_gemm && o.h16_one_block && o.mt_one_block);
        assert!(o.mt_16_tokens && !o.mt_4_tokens && !o.h16_merged && o.down_four_blocks);
        assert!(!o.norm_stage && o.reduce_norm && o.router_topk && !o.mt_mixed && o.moe_staged);
        assert!(o.item_staged && o.down_eight_warps && !o.mt_mixed8 && !o.router_shared);
        assert_eq!(o.l2_prefetch_rows, 1);
        assert_eq!((o.nv_blocks_per_sm, o.nv_grid_per_sm), (3, 3));
        assert_eq!((o.nv_k_split, o.mma_k_split), (None, Some(4)));
        assert_eq!(o.mt_k_split, Some(8));
        assert!(!o.mt_deep && o.mt_deep_all);
        assert_eq!(o.mt_blocks_per_sm, 3);
        assert_eq!(o.few_grid_divisor, 3);
        assert_eq!(o.kernels_source, Some(PathBuf::from("/tmp/k.cu")));
        let o = with(&[
            ("FP4FORGE_NV_MINB", "5"),
            ("FP4FORGE_NV_GRID", "0"),
            ("FP4FORGE_CUDA_MT_FILL", "0"),
            ("FP4FORGE_CUDA_ATTN_MIN_KEYS", "0"),
            ("FP4FORGE_CUDA_FEW_ITEMS", "0"),
            ("FP4FORGE_CUDA_SPLIT_WARPS", "3"),
        ]);
        assert_eq!(o.split_row_warps, 1);
        assert_eq!(o.attn_split_min_keys, ATTN_SPLIT_MIN_KEYS);
        assert_eq!(o.few_items_per_expert, FEW_ITEMS_PER_EXPERT);
        assert_eq!((o.nv_blocks_per_sm, o.nv_grid_per_sm), (2, 0));
        assert_eq!(o.mt_blocks_per_sm, 1);
    }

    /// The kernel cache: the variable's directory, `off`/`0` for none, else under
    /// `XDG_CACHE_HOME` or `HOME`.
    #[test]
    fn kernel_cache_directory() {
        let dir = |vars: &[(&str, &str)]| with(vars).kernel_cache;
        assert_eq!(
            dir(&[("FP4FORGE_KERNEL_CACHE", "/k"), ("HOME", "/h")]),
            Some(PathBuf::from("/k"))
        );
        assert_eq!(
            dir(&[("FP4FORGE_KERNEL_CACHE", "off"), ("HOME", "/h")]),
            None
        );
        assert_eq!(dir(&[("FP4FORGE_KERNEL_CACHE", "0")]), None);
        assert_eq!(
            dir(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")]),
            Some(PathBuf::from("/x/fp4forge/kernels"))
        );
        assert_eq!(
            dir(&[("HOME", "/h")]),
            Some(PathBuf::from("/h/.cache/fp4forge/kernels"))
        );
    }
}
