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

typedef unsigned long long u64;
typedef unsigned int u32;

struct Region {
    u64 ptr;     // base address
    u64 bytes;   // bytes read in this region (multiple of 16)
    u64 stride;  // routed regions: bytes between experts
    int routed;  // -1: fixed address; j >= 0: base + sel[j] * stride
    int pad;
};

struct Stage {
    int first_region;
    int n_regions;
    int wait;    // stage index whose completion this stage's consumption waits for, or -1
    int select;  // stage index whose outputs pick the routed experts, or -1
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

// The slice [lo, hi) of a region's bytes that block `b` of `g` reads.
__device__ __forceinline__ void slice_of(u64 bytes, int b, int g, u64& lo, u64& hi) {
    u64 per = ((bytes + g - 1) / g + 15) & ~15ull;
    lo = per * b;
    hi = lo + per;
    if (lo > bytes) lo = bytes;
    if (hi > bytes) hi = bytes;
}

// Expert j of the top-k chosen from stage `sel`'s outputs (distinct for j < 256 / gcd).
__device__ __forceinline__ u32 pick_expert(const u32* out, int sel, int g, int j) {
    u32 h = 0;
    for (int i = 0; i < g; i++) h = h * 2654435761u + out[sel * g + i];
    h ^= h >> 13;
    return (h + 97u * (u32)j) % PROBE_EXPERTS;
}

__device__ __forceinline__ u64 region_base(const Region& r, const u32* sel) {
    return r.routed < 0 ? r.ptr : r.ptr + (u64)sel[r.routed] * r.stride;
}

__device__ __forceinline__ u32 fold4(uint4 v) { return v.x ^ (v.y * 3u) ^ (v.z * 5u) ^ (v.w * 7u); }

// Folds a 16-byte word with `work` extra rounds of 3 integer instructions (a stand-in for the
// per-byte arithmetic of a real kernel: NVFP4 unpacking and the dot products are roughly 16-32
// instructions per 16 bytes of codes).
__device__ __forceinline__ u32 consume(uint4 v, int work) {
    u32 a = fold4(v);
    for (int w = 0; w < work; w++) a = ((a ^ (a >> 7)) * 0x9E3779B1u) + v.x;
    return a;
}

// Streams [p, p + n) with every thread of the block, 4 loads in flight per thread, from word
// `from` on (the words before it were loaded by the caller).
__device__ __forceinline__ u32 stream_global(const char* p, u64 n, int tid, int nthreads, int work,
                                             u64 from = 0) {
    u32 acc = 0;
    const uint4* q = reinterpret_cast<const uint4*>(p);
    u64 words = n / 16;
    u64 i = from + tid;
    for (; i + 3 * nthreads < words; i += 4 * nthreads) {
        uint4 a = __ldcs(q + i), b = __ldcs(q + i + nthreads), c = __ldcs(q + i + 2 * nthreads),
              d = __ldcs(q + i + 3 * nthreads);
        acc += consume(a, work) + consume(b, work) + consume(c, work) + consume(d, work);
    }
    for (; i < words; i += nthreads) acc += consume(__ldcs(q + i), work);
    return acc;
}

__device__ __forceinline__ u32 block_sum(u32 v, u32* red, int tid, int nthreads) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((tid & 31) == 0) red[tid >> 5] = v;
    __syncthreads();
    u32 s = 0;
    if (tid == 0)
        for (int w = 0; w < nthreads / 32; w++) s += red[w];
    __syncthreads();
    return s;
}

// One stage per launch. Launched with programmatic stream serialization: the next stage's
// blocks may start while this one drains; each waits for its predecessor before it reads
// activations. With `prefetch`, a block issues its first 4 loads per thread of a fixed-address
// stage before that wait (weights do not depend on the predecessor), as the backend's GEMVs do;
// `work`: see consume().
extern "C" __global__ void __launch_bounds__(256) probe_stage(const Stage* stages, const Region* regions,
                                                            int s, u32* out, int prefetch, int work) {
    __shared__ u32 red[8];
    __shared__ u32 sel[PROBE_TOPK];
    int tid = threadIdx.x, b = blockIdx.x, g = gridDim.x;
    Stage st = stages[s];
    u32 acc = 0;
    u64 from = 0;
    if (prefetch && st.select < 0 && st.n_regions > 0) {
        Region rg = regions[st.first_region];
        u64 lo, hi;
        slice_of(rg.bytes, b, g, lo, hi);
        const uint4* q = reinterpret_cast<const uint4*>(rg.ptr + lo);
        u64 words = (hi - lo) / 16;
        from = words < 4 * 256 ? words : 4 * 256;
        uint4 v[4];
#pragma unroll
        for (int j = 0; j < 4; j++)
            if (j * 256 + tid < (int)from) v[j] = __ldcs(q + j * 256 + tid);
        asm volatile("griddepcontrol.wait;" ::: "memory");
#pragma unroll
        for (int j = 0; j < 4; j++)
            if (j * 256 + tid < (int)from) acc += consume(v[j], work);
    } else {
        asm volatile("griddepcontrol.wait;" ::: "memory");
    }
    asm volatile("griddepcontrol.launch_dependents;");
    if (st.select >= 0 && tid < PROBE_TOPK) sel[tid] = pick_expert(out, st.select, g, tid);
    __syncthreads();
    for (int r = 0; r < st.n_regions; r++) {
        Region rg = regions[st.first_region + r];
        u64 lo, hi;
        slice_of(rg.bytes, b, g, lo, hi);
        acc += stream_global(reinterpret_cast<const char*>(region_base(rg, sel)) + lo, hi - lo, tid, 256, work,
                             r == 0 ? from : 0);
    }
    acc = block_sum(acc, red, tid, 256);
    if (tid == 0) out[s * g + b] = acc;
}

// All stages in one launch (grid no larger than what is co-resident), ordered by counters.
extern "C" __global__ void __launch_bounds__(256) probe_persistent(const Stage* stages, int n_stages,
                                                                 const Region* regions, u32* counters,
                                                                 u32* out, u32* status) {
    __shared__ u32 red[8];
    __shared__ u32 sel[PROBE_TOPK];
    int tid = threadIdx.x, b = blockIdx.x, g = gridDim.x;
    for (int s = 0; s < n_stages; s++) {
        Stage st = stages[s];
        if (tid == 0) {
            if (st.wait >= 0) wait_count(counters + st.wait, g, status);
            if (st.select >= 0) wait_count(counters + st.select, g, status);
        }
        __syncthreads();
        if (st.select >= 0 && tid < PROBE_TOPK) sel[tid] = pick_expert(out, st.select, g, tid);
        __syncthreads();
        u32 acc = 0;
        for (int r = 0; r < st.n_regions; r++) {
            Region rg = regions[st.first_region + r];
            u64 lo, hi;
            slice_of(rg.bytes, b, g, lo, hi);
            acc += stream_global(reinterpret_cast<const char*>(region_base(rg, sel)) + lo, hi - lo, tid, 256, 0);
        }
        acc = block_sum(acc, red, tid, 256);
        if (tid == 0) {
            out[s * g + b] = acc;
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
#define RING_CONSUMER_WARPS 8

// One launch per step (`work`: see consume()): warp 0 produces (bulk copies into `slots` slots of `chunk` bytes of
// dynamic shared memory), warps 1..8 consume. With `lookahead` 0 the producer also waits for a
// stage's dependency before issuing its copies (a ring that does not run ahead of the stages).
extern "C" __global__ void __launch_bounds__(32 * (RING_CONSUMER_WARPS + 1))
    probe_ring(const Stage* stages, int n_stages, const Region* regions, u32* counters, u32* out, u32* status,
               int slots, int chunk, int lookahead, int work) {
    extern __shared__ __align__(128) char ring[];
    __shared__ u64 full[RING_MAX_SLOTS], empty[RING_MAX_SLOTS];
    __shared__ u32 red[RING_CONSUMER_WARPS];
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, b = blockIdx.x, g = gridDim.x;
    if (tid == 0) {
        for (int i = 0; i < slots; i++) {
            mbar_init(&full[i], 1);
            mbar_init(&empty[i], RING_CONSUMER_WARPS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (warp == 0) {
        if (lane != 0) return;
        u32 sel[PROBE_TOPK];
        int k = 0;
        for (int s = 0; s < n_stages; s++) {
            Stage st = stages[s];
            if (!lookahead && st.wait >= 0) wait_count(counters + st.wait, g, status);
            bool picked = false;
            for (int r = 0; r < st.n_regions; r++) {
                Region rg = regions[st.first_region + r];
                // The routed experts' addresses wait for the router; the fixed regions before
                // them in the stage (the shared expert) are issued without waiting.
                if (rg.routed >= 0 && !picked) {
                    wait_count(counters + st.select, g, status);
                    for (int j = 0; j < PROBE_TOPK; j++) sel[j] = pick_expert(out, st.select, g, j);
                    picked = true;
                }
                u64 lo, hi;
                slice_of(rg.bytes, b, g, lo, hi);
                const char* base = reinterpret_cast<const char*>(region_base(rg, sel));
                for (u64 o = lo; o < hi; o += chunk, k++) {
                    int slot = k % slots;
                    if (k >= slots) mbar_wait(&empty[slot], ((k / slots) - 1) & 1, status);
                    u32 n = (u32)min((u64)chunk, hi - o);
                    mbar_expect_tx(&full[slot], n);
                    bulk_load(ring + (size_t)slot * chunk, base + o, n, &full[slot]);
                }
            }
        }
        return;
    }
    int ctid = tid - 32;
    int k = 0;
    for (int s = 0; s < n_stages; s++) {
        Stage st = stages[s];
        if (st.wait >= 0) {
            if (ctid == 0) wait_count(counters + st.wait, g, status);
            asm volatile("bar.sync 1, %0;" ::"r"(32 * RING_CONSUMER_WARPS) : "memory");
        }
        u32 acc = 0;
        for (int r = 0; r < st.n_regions; r++) {
            Region rg = regions[st.first_region + r];
            u64 lo, hi;
            slice_of(rg.bytes, b, g, lo, hi);
            for (u64 o = lo; o < hi; o += chunk, k++) {
                int slot = k % slots;
                mbar_wait(&full[slot], (k / slots) & 1, status);
                u32 n = (u32)min((u64)chunk, hi - o);
                const uint4* q = reinterpret_cast<const uint4*>(ring + (size_t)slot * chunk);
                for (u32 i = ctid; i < n / 16; i += 32 * RING_CONSUMER_WARPS) acc += consume(q[i], work);
                __syncwarp();
                if (lane == 0) mbar_arrive(&empty[slot]);
            }
        }
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0) red[warp - 1] = acc;
        asm volatile("bar.sync 1, %0;" ::"r"(32 * RING_CONSUMER_WARPS) : "memory");
        if (ctid == 0) {
            u32 t = 0;
            for (int w = 0; w < RING_CONSUMER_WARPS; w++) t += red[w];
            out[s * g + b] = t;
            red_release(counters + s, 1);
        }
        asm volatile("bar.sync 1, %0;" ::"r"(32 * RING_CONSUMER_WARPS) : "memory");
    }
}
