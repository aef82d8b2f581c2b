// Decode-stream probe: the byte stream and the dependency structure of one batch-1 decode step,
// with trivial compute (each block folds its bytes into one word), to measure how close to the
// copy bandwidth a given kernel organisation can get before any real arithmetic is added.
//
// A step is a list of stages (q/k/v/g, attention's KV, o, router, gate/up, down per layer, then
// the lm_head). A stage reads a list of regions; every block reads its contiguous slice of each
// region (16-byte aligned). A stage may wait for an earlier stage to be complete (all blocks
// signalled its counter) before it consumes its bytes, and a routed stage reads regions whose
// addresses depend on an earlier stage's outputs (the router's top-k): base + sel[j] * stride.
//
// Three organisations, same plan:
// - probe_stage: one launch per stage (programmatic dependent launch; the step is captured in a
//   CUDA graph by the host), every block streams its slice straight from global memory,
//   optionally issuing its first loads before waiting for its predecessor;
// - probe_persistent: one launch per step, stages ordered by counters in global memory, blocks
//   stream their slices straight from global memory;
// - probe_ring: one launch per step, a producer warp per block streams the block's slices
//   through a ring of shared-memory slots with bulk copies (cp.async.bulk + mbarrier), running
//   ahead across stage boundaries (weights do not depend on activations) except where an
//   address depends on a stage not yet complete; consumer warps wait for the stage's
//   dependency before they consume its slots.
//
// Consumers fold their bytes with trivial integer arithmetic (optionally `work` extra rounds),
// or, in the `_real` kernels, with the backend's own per-byte arithmetic (kernels/common.cu,
// gemv.cu and elementwise.cu come first in this translation unit): each stage's input vector
// staged into shared memory once its dependency is met, then NVFP4 codes through the
// tensor-core decode of `mma_chunk` (8 codes to 4 scaled f16 pairs, one m16n8k16 per 32-bit
// word, chained on one accumulator as in `MmaTile::run`), bf16 weights and KV entries through
// `dot_bf16x8` with x from shared memory; the fp8 block scales are loaded with their codes and
// need no arithmetic of their own. Those loops are warp-uniform (the mma is warp-collective):
// lanes past a piece's end consume zeros.

struct Region {
    u64 ptr;     // base address
    u64 bytes;   // bytes read in this region (multiple of 16)
    u64 stride;  // routed regions: bytes between experts
    int routed;  // -1: fixed address; j >= 0: base + sel[j] * stride
    int kind;    // what the bytes are, for the `_real` kernels: REGION_BF16, _CODES or _SCALES
};

#define REGION_BF16 0    // bf16 weights or KV-cache entries
#define REGION_CODES 1   // NVFP4 e2m1 codes
#define REGION_SCALES 2  // NVFP4 fp8 block scales

struct Stage {
    int first_region;
    int n_regions;
    int wait;    // stage index whose completion this stage's consumption waits for, or -1
    int select;  // stage index whose outputs pick the routed experts, or -1
    int x_len;   // values of the stage's input vector (what a real consumer stages after `wait`)
    int pad;
};

#define PROBE_TOPK 10
#define PROBE_EXPERTS 256

__device__ __forceinline__ u32 ld_acquire(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void red_release(u32* p, u32 v) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ u64 now_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Watchdog for the spin waits: a wait not satisfied within 2 s sets `*status` (which the host
// reads after the run) and gives up, as does every later wait, so a deadlocked plan ends with
// an error instead of hanging the device. Polls the flag and the clock every 1,024 spins only.
__device__ __forceinline__ bool stalled(u32* status, u32& spins, u64& t0) {
    if ((++spins & 1023) != 1) return false;
    if (spins == 1) {
        t0 = now_ns();
        return false;
    }
    if (*(volatile u32*)status) return true;
    if (now_ns() - t0 > 2000000000ull) {
        atomicExch(status, 1u);
        return true;
    }
    return false;
}

__device__ __forceinline__ void wait_count(const u32* p, u32 target, u32* status) {
    u32 spins = 0;
    u64 t0 = 0;
    while (ld_acquire(p) < target)
        if (stalled(status, spins, t0)) return;
}

// Expert j of the top-k chosen from stage `sel`'s outputs: a function of the word block 0 of
// that stage wrote, so the address truly depends on the stage being complete (distinct for j <
// 256 / gcd).
__device__ __forceinline__ u32 pick_expert(const u32* out, int sel, int g, int j) {
    u32 h = *(volatile const u32*)(out + sel * g) * 2654435761u;
    h ^= h >> 13;
    return (h + 97u * (u32)j) % PROBE_EXPERTS;
}

__device__ __forceinline__ u64 region_base(const Region& r, const u32* sel) {
    return r.routed < 0 ? r.ptr : r.ptr + (u64)sel[r.routed] * r.stride;
}

// Most regions in one stage (the fused gate/up + down stage of the top-10: 42).
#define PROBE_MAX_REGIONS 64
// 16-byte loads each thread keeps in flight.
#define PROBE_INFLIGHT 8

// Copies stage `st`'s regions into `rs` with threads `t` of `nt` (one round trip); the caller
// synchronises before reading them.
__device__ __forceinline__ void load_regions(Region* rs, const Region* regions, Stage st, int t, int nt) {
    for (int i = t; i < st.n_regions; i += nt) rs[i] = regions[st.first_region + i];
}

// Block `b` of `g` reads the slice [lo, hi) of the concatenation of the stage's regions: a few
// contiguous pieces (row ranges of one or two tensors), not a sliver of every region.
__device__ __forceinline__ void block_slice(const Region* rs, int n, int b, int g, u64& lo, u64& hi) {
    u64 total = 0;
    for (int r = 0; r < n; r++) total += rs[r].bytes;
    u64 per = ((total + g - 1) / g + 15) & ~15ull;
    lo = per * b;
    hi = lo + per;
    if (lo > total) lo = total;
    if (hi > total) hi = total;
}

// Region `r`'s part [a, e) (offsets into the region) of the slice [lo, hi) of the concatenation,
// where `off` is the region's offset in it; false where they do not overlap.
__device__ __forceinline__ bool piece_of(const Region& r, u64 off, u64 lo, u64 hi, u64& a, u64& e) {
    u64 s = lo > off ? lo : off, t = hi < off + r.bytes ? hi : off + r.bytes;
    a = s - off;
    e = t - off;
    return s < t;
}

__device__ __forceinline__ u32 fold4(uint4 v) { return v.x ^ (v.y * 3u) ^ (v.z * 5u) ^ (v.w * 7u); }

// Folds a 16-byte word with `work` extra rounds of 3 integer instructions (a stand-in for the
// per-byte arithmetic of a real kernel).
__device__ __forceinline__ u32 consume(uint4 v, int work) {
    u32 a = fold4(v);
    for (int w = 0; w < work; w++) a = ((a ^ (a >> 7)) * 0x9E3779B1u) + v.x;
    return a;
}

// Values of a stage's input the `_real` consumers stage in shared memory (the backend's XS_MAX).
#define PROBE_XS 9216

// x as the `_real` consumers read it from shared memory: 64 float4s (the bf16 dot products'
// operand, filled once by probe_x_fill) and the stage's input as f16 pairs, staged from global
// memory once the stage's dependency is met (probe_x_stage; the mma B entries of the NVFP4 tiles,
// as the backend's xb_fill stages them).
struct ProbeX {
    float4 f[64];
    u32 h[PROBE_XS / 2];
};

// Fills `x.f` with threads `t` of `nt` (the caller synchronises before it is read).
__device__ __forceinline__ void probe_x_fill(ProbeX& x, int t, int nt) {
    for (int i = t; i < 64; i += nt) {
        const float v = 1.f / (float)(i + 1);
        x.f[i] = make_float4(v, -v, 0.5f * v, 2.f * v);
    }
}

// Stages the first `n` (<= PROBE_XS, even) values of the stage's input `src` (written by the
// stage it waits for: read through L2) into `x.h` with threads `t` of `nt`; the caller
// synchronises before it is read.
__device__ __forceinline__ void probe_x_stage(ProbeX& x, const float* src, int n, int t, int nt) {
    const float2* s2 = reinterpret_cast<const float2*>(src);
    for (int i = t; i < n / 2; i += nt) {
        const float2 v = __ldcg(s2 + i);
        u32 h;
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(h) : "f"(v.y), "f"(v.x));
        x.h[i] = h;
    }
}

// The running sums of a consumer: the integer fold, or the `_real` kernels' mma accumulators
// (one chain per warp, as in MmaTile::run) and a bf16 dot product sum.
struct Acc {
    u32 fold;
    float c[4];
    float dot;

    __device__ __forceinline__ void zero() {
        fold = 0;
        c[0] = c[1] = c[2] = c[3] = 0.f;
        dot = 0.f;
    }
    __device__ __forceinline__ u32 bits() const {
        return fold ^ __float_as_uint(c[0] + c[1] + c[2] + c[3] + dot);
    }
};

// The backend's arithmetic for one 16-byte word `v` (word `i` of its piece) of a region of
// `kind`. Warp-collective for REGION_CODES (every lane must call it).
__device__ __forceinline__ void consume_real(uint4 v, int kind, u64 i, const ProbeX& x, Acc& acc) {
    if (kind == REGION_CODES) {
        // mma_chunk's work per 16 bytes of one row: the block scale pair to f16 (one cvt, two
        // byte permutes), then per 32-bit word 8 codes to 4 scaled f16 pairs and one m16n8k16
        // with x's B entry from shared memory (lanes 0..7).
        const int lane = threadIdx.x & 31;
        const u32 sc = e4m3x2_h2((v.w >> 8) & 0x3f3fu);
        const u32 sl = __byte_perm(sc, 0, 0x1010), sh = __byte_perm(sc, 0, 0x3232);
        const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            u32 h[4];
            nv_word_h2(w[j], j < 2 ? sl : sh, h);
            const u32 o = (((u32)i << 4) + 16 * j + 2 * lane) & 4094u;  // a walk through x
            const uint2 b = lane < 8 ? make_uint2(x.h[o], x.h[o + 1]) : make_uint2(0u, 0u);
            mma16816(acc.c, h[0], h[1], h[2], h[3], b.x, b.y);
        }
    } else if (kind == REGION_BF16) {
        // bf_rows' work per 16 bytes: 8 bf16 weights times 8 values of x from shared memory.
        const int o = (int)(i & 31) * 2;
        acc.dot += dot_bf16x8(v, x.f[o], x.f[o + 1]);
    } else {
        // fp8 block scales: loaded with their codes (above), no arithmetic of their own.
        acc.fold += v.x ^ v.w;
    }
}

// One word into `acc`: the integer fold with `work` rounds, or with REAL the backend's
// arithmetic for a region of `kind`.
template <bool REAL>
__device__ __forceinline__ void consume_word(uint4 v, int work, int kind, u64 i, const ProbeX& x, Acc& acc) {
    if constexpr (REAL)
        consume_real(v, kind, i, x, acc);
    else
        acc.fold += consume(v, work);
}

// Streams [p, p + n) with every thread of the block, PROBE_INFLIGHT loads in flight per thread,
// from word `from` on (the words before it were loaded by the caller). With REAL every loop is
// warp-uniform (the warp's lowest index decides) and lanes past the end consume zeros.
template <bool REAL>
__device__ __forceinline__ void stream_global(const char* p, u64 n, int tid, int nthreads, int work, int kind,
                                              const ProbeX& x, Acc& acc, u64 from = 0) {
    const uint4* q = reinterpret_cast<const uint4*>(p);
    const u64 words = n / 16;
    const u64 lane = REAL ? (u64)(tid & 31) : 0;  // index - lane: the warp's lowest (REAL)
    const u64 last = REAL ? 31 : 0;
    u64 i = from + tid;
    for (; i - lane + last + (PROBE_INFLIGHT - 1) * nthreads < words; i += PROBE_INFLIGHT * nthreads) {
        uint4 v[PROBE_INFLIGHT];
#pragma unroll
        for (int j = 0; j < PROBE_INFLIGHT; j++) v[j] = __ldcs(q + i + j * nthreads);
#pragma unroll
        for (int j = 0; j < PROBE_INFLIGHT; j++) consume_word<REAL>(v[j], work, kind, i + j * nthreads, x, acc);
    }
    for (; i - lane < words; i += nthreads) {
        const uint4 v = i < words ? __ldcs(q + i) : make_uint4(0u, 0u, 0u, 0u);
        consume_word<REAL>(v, work, kind, i, x, acc);
    }
}

// The loads a block may issue before its stage's dependency is met: the first
// PROBE_INFLIGHT words per thread of its slice's first piece, where that piece's address does not
// depend on an earlier stage (weights never do; routed experts do).
struct Early {
    uint4 v[PROBE_INFLIGHT];
    u64 words;  // words of the first piece loaded early (0: none)
    int region; // the region that piece belongs to

    __device__ __forceinline__ void issue(const Region* rs, int n, u64 lo, u64 hi, int tid, int nthreads) {
        words = 0;
        region = -1;
        u64 off = 0, a = 0, e = 0;
        for (int r = 0; r < n; off += rs[r].bytes, r++)
            if (piece_of(rs[r], off, lo, hi, a, e)) {
                region = r;
                break;
            }
        if (region < 0 || rs[region].routed >= 0) return;
        const uint4* q = reinterpret_cast<const uint4*>(rs[region].ptr + a);
        u64 w = (e - a) / 16, cap = (u64)PROBE_INFLIGHT * nthreads;
        words = w < cap ? w : cap;
#pragma unroll
        for (int j = 0; j < PROBE_INFLIGHT; j++)
            v[j] = (u64)(j * nthreads + tid) < words ? __ldcs(q + j * nthreads + tid) : make_uint4(0u, 0u, 0u, 0u);
    }

    // With REAL every thread consumes all its slots (zeros past `words`), so the warp stays
    // converged; `words` is the same for the whole block.
    template <bool REAL>
    __device__ __forceinline__ void consume_all(const Region* rs, int tid, int nthreads, int work, const ProbeX& x,
                                                Acc& acc) {
        if (words == 0) return;
        const int kind = rs[region].kind;
#pragma unroll
        for (int j = 0; j < PROBE_INFLIGHT; j++)
            if (REAL || (u64)(j * nthreads + tid) < words)
                consume_word<REAL>(v[j], work, kind, (u64)(j * nthreads + tid), x, acc);
    }
};

// Streams the block's slice [lo, hi) of the stage's regions `rs` straight from global memory,
// skipping the words `early` already loaded.
template <bool REAL>
__device__ __forceinline__ void stream_slice(const Region* rs, int n, const u32* sel, u64 lo, u64 hi,
                                             const Early& early, int tid, int nthreads, int work, const ProbeX& x,
                                             Acc& acc) {
    u64 off = 0;
    for (int r = 0; r < n && off < hi; r++) {
        u64 a, e;
        if (piece_of(rs[r], off, lo, hi, a, e))
            stream_global<REAL>(reinterpret_cast<const char*>(region_base(rs[r], sel)) + a, e - a, tid, nthreads,
                                work, rs[r].kind, x, acc, r == early.region ? early.words : 0);
        off += rs[r].bytes;
    }
}

__device__ __forceinline__ u32 block_sum(u32 v, u32* red, int tid, int nthreads) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((tid & 31) == 0) red[tid >> 5] = v;
    __syncthreads();
    u32 s = 0;
    if (tid == 0)
        for (int w = 0; w < nthreads / 32; w++) s += red[w];
    return s;
}

// One stage per launch. Launched with programmatic stream serialization: the next stage's
// blocks may start while this one drains; each waits for its predecessor before it reads
// activations. With `prefetch`, a block issues its first loads of a fixed-address piece before
// that wait (weights do not depend on the predecessor), as the backend's GEMVs do; `work`: see
// consume(); REAL: the backend's arithmetic (probe_stage_real).
template <bool REAL>
__device__ __forceinline__ void probe_stage_impl(const Stage* stages, const Region* regions, int s, u32* out,
                                                 int prefetch, int work, const float* xsrc) {
    __shared__ u32 red[8];
    __shared__ u32 sel[PROBE_TOPK];
    __shared__ Region rs[PROBE_MAX_REGIONS];
    __shared__ ProbeX x;
    int tid = threadIdx.x, b = blockIdx.x, g = gridDim.x;
    Stage st = stages[s];
    load_regions(rs, regions, st, tid, 256);
    if (REAL) probe_x_fill(x, tid, 256);
    __syncthreads();
    u64 lo, hi;
    block_slice(rs, st.n_regions, b, g, lo, hi);
    Early early;
    early.words = 0;
    early.region = -1;
    if (prefetch) early.issue(rs, st.n_regions, lo, hi, tid, 256);
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;");
    if (REAL) {
        probe_x_stage(x, xsrc, min(st.x_len, PROBE_XS), tid, 256);
        __syncthreads();
    }
    Acc acc;
    acc.zero();
    early.consume_all<REAL>(rs, tid, 256, work, x, acc);
    if (st.select >= 0) {
        if (tid < PROBE_TOPK) sel[tid] = pick_expert(out, st.select, g, tid);
        __syncthreads();
    }
    stream_slice<REAL>(rs, st.n_regions, sel, lo, hi, early, tid, 256, work, x, acc);
    const u32 sum = block_sum(acc.bits(), red, tid, 256);
    if (tid == 0) out[s * g + b] = sum;
}

extern "C" __global__ void __launch_bounds__(256) probe_stage(const Stage* stages, const Region* regions,
                                                            int s, u32* out, int prefetch, int work) {
    probe_stage_impl<false>(stages, regions, s, out, prefetch, work, nullptr);
}

// `xsrc`: PROBE_XS floats standing for the stage's input vector.
extern "C" __global__ void __launch_bounds__(256) probe_stage_real(const Stage* stages, const Region* regions,
                                                                 int s, u32* out, int prefetch,
                                                                 const float* xsrc) {
    probe_stage_impl<true>(stages, regions, s, out, prefetch, 0, xsrc);
}

// All stages in one launch (grid no larger than what is co-resident), ordered by counters. Each
// block issues its first loads of a stage's fixed-address piece before it waits.
extern "C" __global__ void __launch_bounds__(256) probe_persistent(const Stage* stages, int n_stages,
                                                                 const Region* regions, u32* counters,
                                                                 u32* out, u32* status) {
    __shared__ u32 red[8];
    __shared__ u32 sel[PROBE_TOPK];
    __shared__ Region rs[PROBE_MAX_REGIONS];
    __shared__ ProbeX x;  // unused: integer folds only
    int tid = threadIdx.x, b = blockIdx.x, g = gridDim.x;
    for (int s = 0; s < n_stages; s++) {
        Stage st = stages[s];
        load_regions(rs, regions, st, tid, 256);
        __syncthreads();
        u64 lo, hi;
        block_slice(rs, st.n_regions, b, g, lo, hi);
        Early early;
        early.issue(rs, st.n_regions, lo, hi, tid, 256);
        if (tid == 0 && st.wait >= 0) wait_count(counters + st.wait, g, status);
        __syncthreads();
        if (st.select >= 0) {
            if (tid < PROBE_TOPK) sel[tid] = pick_expert(out, st.select, g, tid);
            __syncthreads();
        }
        Acc acc;
        acc.zero();
        early.consume_all<false>(rs, tid, 256, 0, x, acc);
        stream_slice<false>(rs, st.n_regions, sel, lo, hi, early, tid, 256, 0, x, acc);
        const u32 sum = block_sum(acc.bits(), red, tid, 256);
        if (tid == 0) {
            out[s * g + b] = sum;
            red_release(counters + s, 1);
        }
    }
}

__device__ __forceinline__ u32 smem_addr(const void* p) {
    return static_cast<u32>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(u64* bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count));
}

__device__ __forceinline__ void mbar_arrive(u64* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

__device__ __forceinline__ void mbar_expect_tx(u64* bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ bool mbar_try(u64* bar, u32 parity) {
    u32 ok;
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(ok)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
    return ok != 0;
}

__device__ __forceinline__ void mbar_wait(u64* bar, u32 parity, u32* status) {
    u32 spins = 0;
    u64 t0 = 0;
    while (!mbar_try(bar, parity))
        if (stalled(status, spins, t0)) return;
}

__device__ __forceinline__ void bulk_load(void* dst, const void* src, u32 bytes, u64* bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
            smem_addr(dst)),
        "l"(src), "r"(bytes), "r"(smem_addr(bar))
        : "memory");
}

#define RING_MAX_SLOTS 32
#define RING_CONSUMER_WARPS 8  // consumer warps of probe_ring and probe_ring_real (probe_ring_real16: 16)

// One launch per step (`work`: see consume()): warp 0 produces (bulk copies of the block's slice
// of each stage, piece by piece, in `chunk`-byte pieces into `slots` slots of dynamic shared
// memory), warps 1..CW consume. The producer runs ahead across stages, waiting only where an
// address depends on a stage not yet complete (the routed experts); with `lookahead` 0 it also
// waits for a stage's dependency before issuing its copies (a ring that does not run ahead).
// REAL: the consumers do the backend's arithmetic (probe_ring_real); CW consumer warps.
template <bool REAL, int CW>
__device__ __forceinline__ void probe_ring_impl(const Stage* stages, int n_stages, const Region* regions,
                                                u32* counters, u32* out, u32* status, int slots, int chunk,
                                                int lookahead, int work, const float* xsrc) {
    extern __shared__ __align__(128) char ring[];
    __shared__ u64 full[RING_MAX_SLOTS], empty[RING_MAX_SLOTS];
    __shared__ u32 red[CW];
    __shared__ Region prs[PROBE_MAX_REGIONS], crs[PROBE_MAX_REGIONS];
    __shared__ ProbeX x;
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, b = blockIdx.x, g = gridDim.x;
    if (REAL) probe_x_fill(x, tid, 32 * (CW + 1));
    if (tid == 0) {
        for (int i = 0; i < slots; i++) {
            mbar_init(&full[i], 1);
            mbar_init(&empty[i], CW);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (warp == 0) {
        u32 sel[PROBE_TOPK];
        int k = 0;
        for (int s = 0; s < n_stages; s++) {
            Stage st = stages[s];
            __syncwarp();
            load_regions(prs, regions, st, lane, 32);
            __syncwarp();
            if (lane != 0) continue;
            if (!lookahead && st.wait >= 0) wait_count(counters + st.wait, g, status);
            u64 lo, hi, off = 0;
            block_slice(prs, st.n_regions, b, g, lo, hi);
            bool picked = false;
            for (int r = 0; r < st.n_regions && off < hi; r++) {
                u64 a, e;
                if (piece_of(prs[r], off, lo, hi, a, e)) {
                    // The routed experts' addresses wait for the router; the fixed regions
                    // before them in the stage are issued without waiting.
                    if (prs[r].routed >= 0 && !picked) {
                        wait_count(counters + st.select, g, status);
                        for (int j = 0; j < PROBE_TOPK; j++) sel[j] = pick_expert(out, st.select, g, j);
                        picked = true;
                    }
                    const char* base = reinterpret_cast<const char*>(region_base(prs[r], sel));
                    for (u64 o = a; o < e; o += chunk, k++) {
                        int slot = k % slots;
                        if (k >= slots) mbar_wait(&empty[slot], ((k / slots) - 1) & 1, status);
                        u32 n = (u32)min((u64)chunk, e - o);
                        mbar_expect_tx(&full[slot], n);
                        bulk_load(ring + (size_t)slot * chunk, base + o, n, &full[slot]);
                    }
                }
                off += prs[r].bytes;
            }
        }
        return;
    }
    int ctid = tid - 32;
    int k = 0;
    for (int s = 0; s < n_stages; s++) {
        Stage st = stages[s];
        load_regions(crs, regions, st, ctid, 32 * CW);
        if (st.wait >= 0 && ctid == 0) wait_count(counters + st.wait, g, status);
        asm volatile("bar.sync 1, %0;" ::"r"(32 * CW) : "memory");
        if (REAL) {
            probe_x_stage(x, xsrc, min(st.x_len, PROBE_XS), ctid, 32 * CW);
            asm volatile("bar.sync 1, %0;" ::"r"(32 * CW) : "memory");
        }
        Acc acc;
        acc.zero();
        u64 lo, hi, off = 0;
        block_slice(crs, st.n_regions, b, g, lo, hi);
        for (int r = 0; r < st.n_regions && off < hi; r++) {
            u64 a, e;
            if (piece_of(crs[r], off, lo, hi, a, e)) {
                for (u64 o = a; o < e; o += chunk, k++) {
                    int slot = k % slots;
                    mbar_wait(&full[slot], (k / slots) & 1, status);
                    u32 n = (u32)min((u64)chunk, e - o);
                    const uint4* q = reinterpret_cast<const uint4*>(ring + (size_t)slot * chunk);
                    // (REAL: warp-uniform, the warp's lowest index decides; zeros past the end)
                    const u32 words = n / 16, lane_off = REAL ? (u32)lane : 0u;
                    for (u32 i = ctid; i - lane_off < words; i += 32 * CW)
                        consume_word<REAL>(i < words ? q[i] : make_uint4(0u, 0u, 0u, 0u), work, crs[r].kind,
                                           i, x, acc);
                    __syncwarp();
                    if (lane == 0) mbar_arrive(&empty[slot]);
                }
            }
            off += crs[r].bytes;
        }
        u32 v = acc.bits();
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) red[warp - 1] = v;
        asm volatile("bar.sync 1, %0;" ::"r"(32 * CW) : "memory");
        if (ctid == 0) {
            u32 t = 0;
            for (int w = 0; w < CW; w++) t += red[w];
            out[s * g + b] = t;
            red_release(counters + s, 1);
        }
    }
}

extern "C" __global__ void __launch_bounds__(32 * (RING_CONSUMER_WARPS + 1))
    probe_ring(const Stage* stages, int n_stages, const Region* regions, u32* counters, u32* out, u32* status,
               int slots, int chunk, int lookahead, int work) {
    probe_ring_impl<false, RING_CONSUMER_WARPS>(stages, n_stages, regions, counters, out, status, slots, chunk,
                                                lookahead, work, nullptr);
}

extern "C" __global__ void __launch_bounds__(32 * (RING_CONSUMER_WARPS + 1))
    probe_ring_real(const Stage* stages, int n_stages, const Region* regions, u32* counters, u32* out,
                    u32* status, int slots, int chunk, int lookahead, const float* xsrc) {
    probe_ring_impl<true, RING_CONSUMER_WARPS>(stages, n_stages, regions, counters, out, status, slots, chunk,
                                               lookahead, 0, xsrc);
}

// The same with 16 consumer warps (the backend's kernels keep 16 warps per SM busy: 2 blocks of 8).
extern "C" __global__ void __launch_bounds__(32 * 17)
    probe_ring_real16(const Stage* stages, int n_stages, const Region* regions, u32* counters, u32* out,
                      u32* status, int slots, int chunk, int lookahead, const float* xsrc) {
    probe_ring_impl<true, 16>(stages, n_stages, regions, counters, out, status, slots, chunk, lookahead, 0, xsrc);
}
