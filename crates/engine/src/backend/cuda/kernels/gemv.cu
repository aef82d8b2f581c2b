// ---- dot products of one weight row with up to TB activation rows (one warp) ---------------

#define TB 4

// acc[t] += sum_k w[row, k] * x[t, k] for t < nt; the warp's lanes split K; not reduced.
// NVFP4 fast path: K % 32 == 0 (rows 16-byte aligned); each lane loads 16 bytes (32 codes,
// 2 scales) per step; the e2m1 values are summed per 16-element block, then scaled once.
__device__ __forceinline__ void dot_nvfp4(const u8* __restrict__ packed, const u8* __restrict__ scales, float inv_g,
                                          long row, int K, const float* __restrict__ x, long xstride, int nt,
                                          float acc[TB]) {
    const int lane = threadIdx.x & 31;
    const float g14 = inv_g * 16384.0f;  // 2^14 undoes the decode's 2^-14
    if ((K & 31) == 0) {
        const uint4* p = (const uint4*)(packed + row * (long)(K / 2));
        const u16* s = (const u16*)(scales + row * (long)(K / 16));
        const int n = K / 32;
        constexpr int U = 4;
        for (int base = lane; base < n; base += 32 * U) {
            uint4 w[U];
            u32 sc[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                int i = base + 32 * u;
                if (i < n) {
                    w[u] = __ldg(p + i);
                    sc[u] = __ldg(s + i);
                }
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                int i = base + 32 * u;
                if (i < n) {
                    const float s0 = e4m3_to_f32(sc[u] & 0xff) * g14;
                    const float s1 = e4m3_to_f32(sc[u] >> 8) * g14;
                    float wf[32];
                    e2m1x8(w[u].x, wf);
                    e2m1x8(w[u].y, wf + 8);
                    e2m1x8(w[u].z, wf + 16);
                    e2m1x8(w[u].w, wf + 24);
                    for (int t = 0; t < nt; t++) {
                        const float4* xv = (const float4*)(x + t * xstride + (long)i * 32);
                        float a0 = 0.f, a1 = 0.f;
#pragma unroll
                        for (int q = 0; q < 4; q++) {
                            float4 xx = xv[q];
                            a0 += wf[4 * q] * xx.x + wf[4 * q + 1] * xx.y + wf[4 * q + 2] * xx.z + wf[4 * q + 3] * xx.w;
                        }
#pragma unroll
                        for (int q = 4; q < 8; q++) {
                            float4 xx = xv[q];
                            a1 += wf[4 * q] * xx.x + wf[4 * q + 1] * xx.y + wf[4 * q + 2] * xx.z + wf[4 * q + 3] * xx.w;
                        }
                        acc[t] += a0 * s0 + a1 * s1;
                    }
                }
            }
        }
    } else {
        // K % 16 == 0: one 8-byte block (16 codes, 1 scale) per lane step.
        const uint2* p = (const uint2*)(packed + row * (long)(K / 2));
        const u8* s = scales + row * (long)(K / 16);
        const int n = K / 16;
        for (int i = lane; i < n; i += 32) {
            uint2 w = p[i];
            float sc = e4m3_to_f32(s[i]) * g14;
            float wf[16];
            e2m1x8(w.x, wf);
            e2m1x8(w.y, wf + 8);
            for (int t = 0; t < nt; t++) {
                const float* xv = x + t * xstride + (long)i * 16;
                float a = 0.f;
#pragma unroll
                for (int q = 0; q < 16; q++) a += wf[q] * xv[q];
                acc[t] += a * sc;
            }
        }
    }
}

__device__ __forceinline__ void dot_bf16(const u16* __restrict__ w, long row, int K, const float* __restrict__ x,
                                         long xstride, int nt, float acc[TB]) {
    const int lane = threadIdx.x & 31;
    const u16* r = w + row * (long)K;
    if ((K & 7) == 0) {
        const uint4* p = (const uint4*)r;
        const int n = K / 8;
        constexpr int U = 4;
        for (int base = lane; base < n; base += 32 * U) {
            uint4 v[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                int i = base + 32 * u;
                if (i < n) v[u] = __ldg(p + i);
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                int i = base + 32 * u;
                if (i < n) {
                    float wf[8];
                    u32 ws[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        wf[2 * j] = __uint_as_float(ws[j] << 16);
                        wf[2 * j + 1] = __uint_as_float(ws[j] & 0xffff0000u);
                    }
                    for (int t = 0; t < nt; t++) {
                        const float4* xv = (const float4*)(x + t * xstride + (long)i * 8);
                        float4 a = xv[0], b = xv[1];
                        acc[t] += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w + wf[4] * b.x + wf[5] * b.y +
                                  wf[6] * b.z + wf[7] * b.w;
                    }
                }
            }
        }
    } else {
        for (int k = lane; k < K; k += 32) {
            float wv = bf16_to_f32(r[k]);
            for (int t = 0; t < nt; t++) acc[t] += wv * x[t * xstride + k];
        }
    }
}

__device__ __forceinline__ void dot_any(int fmt, const void* w, const u8* scales, float inv_g, long row, int K,
                                        const float* x, long xstride, int nt, float acc[TB]) {
    const int lane = threadIdx.x & 31;
    if (fmt == 3) {
        dot_nvfp4((const u8*)w, scales, inv_g, row, K, x, xstride, nt, acc);
    } else if (fmt == 2) {
        dot_bf16((const u16*)w, row, K, x, xstride, nt, acc);
    } else if (fmt == 1) {
        const u16* r = (const u16*)w + row * (long)K;
        for (int k = lane; k < K; k += 32) {
            float wv = f16_to_f32(r[k]);
            for (int t = 0; t < nt; t++) acc[t] += wv * x[t * xstride + k];
        }
    } else {
        const float* r = (const float*)w + row * (long)K;
        for (int k = lane; k < K; k += 32) {
            float wv = r[k];
            for (int t = 0; t < nt; t++) acc[t] += wv * x[t * xstride + k];
        }
    }
}

// y[t, o] = (resid ? resid[t, o] : 0) + bias[o] + sum_k W[o, k] x[t, k].
// grid (ceil(N / warps), ceil(T / TB)); one warp per output row and TB tokens. y may alias resid.
extern "C" __global__ void linear(int fmt, const void* __restrict__ w, const u8* __restrict__ scales, float inv_g,
                                  const float* __restrict__ x, float* y, const float* __restrict__ bias,
                                  const float* resid, int N, int K, int T) { pdl_enter();
    const int warps = blockDim.x >> 5;
    const int o = blockIdx.x * warps + (threadIdx.x >> 5);
    if (o >= N) return;
    const int t0 = blockIdx.y * TB;
    const int nt = min(TB, T - t0);
    float acc[TB] = {0.f, 0.f, 0.f, 0.f};
    dot_any(fmt, w, scales, inv_g, o, K, x + (long)t0 * K, K, nt, acc);
    const int lane = threadIdx.x & 31;
    for (int t = 0; t < nt; t++) {
        float v = warp_sum(acc[t]);
        if (lane == 0) {
            long idx = (long)(t0 + t) * N + o;
            if (bias) v += bias[o];
            if (resid) v += resid[idx];
            y[idx] = v;
        }
    }
}

// Several linears of the same input in one launch (q, k, v, gate, ...): segment s covers
// blocks [seg_block[s], seg_block[s+1]). `l2_prefetch` (gemv_mt): each block of the first grid
// row prefetches its weight rows into L2 before it waits for its input. `interleave` (gemv_mt):
// the grid's blocks in launch order take the grid rows of one block of weight rows side by side
// (the weights read from DRAM once, the other grid rows' reads hit L2), not each grid row's
// blocks one after another.
struct Seg {
    const void* w;
    const u8* scales;
    float* y;
    float inv_g;
    int fmt;
    int N;
    int block0;
};
struct Segs {
    Seg s[6];
    int n;
    int l2_prefetch;
    int interleave;
};

// The index of the segment that block `block` of a launch over `segs` works on.
__device__ __forceinline__ int seg_index(const Segs& segs, int block) {
    int si = 0;
    for (int i = 1; i < segs.n; i++)
        if (block >= segs.s[i].block0) si = i;
    return si;
}

// ---- decode GEMV (one token): R rows per warp, x reused from registers across the rows ------

// Weights are read once per token: no L1 allocation, and first out of L2 (evict_first), so the
// weight stream does not push activations and KV rows out of L2.
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
    uint4 v;
#ifdef FP4FORGE_CPU_EMU
    v = *p;
#elif __CUDA_ARCH__ >= 800
    u64 pol;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p), "l"(pol));
#else
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
#endif
    return v;
}

// R weight rows of one warp: rows r < RA are rows w0 + r (r < n0 valid), the others rows
// w1 + (r - RA) (valid below n1); `wst` / `sst` are the row strides in bytes of the data and of
// the NVFP4 scales. (Two bases: gate and up rows of an expert in one pass.)
struct RowSet {
    const u8* w0;
    const u8* s0;
    const u8* w1;
    const u8* s1;
    long wst;
    long sst;
    int n0;
    int n1;
};

template <int R, int RA>
__device__ __forceinline__ bool rs_ok(const RowSet& rs, int r) {
    return r < RA ? r < rs.n0 : r - RA < rs.n1;
}
template <int R, int RA>
__device__ __forceinline__ const u8* rs_w(const RowSet& rs, int r) {
    return r < RA ? rs.w0 + r * rs.wst : rs.w1 + (r - RA) * rs.wst;
}
template <int R, int RA>
__device__ __forceinline__ const u8* rs_s(const RowSet& rs, int r) {
    return r < RA ? rs.s0 + r * rs.sst : rs.s1 + (r - RA) * rs.sst;
}

// x in shared memory for the NVFP4 kernels: chunk i (32 floats = 8 float4) is stored with its
// float4 q at slot 8 i + (q ^ (i & 7)), so when consecutive lanes read consecutive chunks every
// quarter-warp's 128-bit reads hit 8 distinct bank groups (conflict-free), while each lane's
// register index stays static. (Reading x straight from global memory, each lane's 128 bytes
// lie in a different cache line: 32 L1 wavefronts per load, which capped the old kernels.)
#define XS_MAX 9216  // floats of x held in shared memory (K <= XS_MAX, K % 32 == 0)

__device__ __forceinline__ void xs_fill(float4* xs, const float* __restrict__ x, int K) {
    const float4* xg = (const float4*)x;
    for (int g = threadIdx.x; g < K / 4; g += blockDim.x) {
        const int i = g >> 3, q = g & 7;
        xs[(i << 3) | (q ^ (i & 7))] = __ldg(xg + g);
    }
}

// Where NvPipe reads x: chunk i's float4 c (32 floats per chunk), from global memory or from the
// swizzled shared-memory copy.
struct XGlobal {
    const float* x;
    __device__ __forceinline__ float4 get(int i, int c) const { return __ldg((const float4*)(x + (long)i * 32) + c); }
};
struct XShared {
    const float4* xs;
    __device__ __forceinline__ float4 get(int i, int c) const { return xs[(i << 3) | (c ^ (i & 7))]; }
};

// One batch of an NVFP4 row set: the loads of U chunk slots of R rows (each lane 16-byte loads,
// a warp 512 contiguous bytes per row and slot, and the 2-byte scales), then their products with
// x; the e2m1 values are summed per 16-element block, then scaled once.
template <int R, int RA, int U>
struct NvPipe {
    uint4 wv[U][R];
    u32 sv[U][R];

    __device__ __forceinline__ void load(const RowSet& rs, int base, int step, int n) {
#pragma unroll
        for (int q = 0; q < U; q++) {
            const int i = base + step * q;
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (i < n && rs_ok<R, RA>(rs, r)) {
                    wv[q][r] = ld_stream((const uint4*)rs_w<R, RA>(rs, r) + i);
                    sv[q][r] = __ldg((const u16*)rs_s<R, RA>(rs, r) + i);
                }
            }
        }
    }

    template <class X>
    __device__ __forceinline__ void compute(const RowSet& rs, int base, int step, int n, const X& x, float out[R]) {
#pragma unroll
        for (int q = 0; q < U; q++) {
            const int i = base + step * q;
            if (i < n) {
                float xr[32];
#pragma unroll
                for (int c = 0; c < 8; c++) {
                    const float4 v = x.get(i, c);
                    xr[4 * c] = v.x;
                    xr[4 * c + 1] = v.y;
                    xr[4 * c + 2] = v.z;
                    xr[4 * c + 3] = v.w;
                }
#pragma unroll
                for (int r = 0; r < R; r++) {
                    if (rs_ok<R, RA>(rs, r)) {
                        const u32 ws[4] = {wv[q][r].x, wv[q][r].y, wv[q][r].z, wv[q][r].w};
                        float a[2] = {0.f, 0.f};
#pragma unroll
                        for (int j = 0; j < 4; j++) {
                            float f[8];
                            e2m1x8(ws[j], f);
#pragma unroll
                            for (int e = 0; e < 8; e++) a[j >> 1] = fmaf(f[e], xr[8 * j + e], a[j >> 1]);
                        }
                        const float2 s = e4m3x2(sv[q][r]);
                        out[r] = fmaf(a[0], s.x, fmaf(a[1], s.y, out[r]));
                    }
                }
            }
        }
    }
};

// nv_rows with x in shared memory, for every warp of the block: the first batch of weight loads is
// issued before x is staged (its latency overlaps the fill), then the block synchronises once.
// All threads of the block must call it (with `active` false for warps without rows).
// With `fill` false, x is already staged (no synchronisation). With `enter`, the kernel's
// pdl_enter() comes between the first weight loads and the fill (weights are never written by a
// kernel), so those loads overlap the previous kernel's end.
template <int R, int RA, int U>
__device__ __forceinline__ void nv_rows_smem(const RowSet& rs, bool active, bool fill, int K,
                                             const float* __restrict__ x, float4* xs, int part, int nparts,
                                             float out[R], bool enter = false) {
    const int lane = threadIdx.x & 31;
    const int n = K >> 5;
    const int step = 32 * nparts;
    NvPipe<R, RA, U> p;
    int base = 32 * part + lane;
    if (active) p.load(rs, base, step, n);
    if (enter) pdl_enter();
    if (fill) {
        xs_fill(xs, x, K);
        __syncthreads();
    }
    if (!active) return;
    const XShared xr{xs};
    while (base < n) {
        p.compute(rs, base, step, n, xr, out);
        base += step * U;
        if (base < n) p.load(rs, base, step, n);
    }
}

// NVFP4 rows (K % 32 == 0) with x read from global memory: out[r] += (per lane, not reduced)
// 2^-22 * W[r, :] . x / inv_g over the 32-element chunks i = 32 * (part + nparts * j) + lane, U
// chunk slots of all R rows loaded before any arithmetic.
template <int R, int RA, int U>
__device__ __forceinline__ void nv_rows(const RowSet& rs, int K, const float* __restrict__ x, int part, int nparts,
                                        float out[R]) {
    const int n = K >> 5;
    const int step = 32 * nparts;
    const XGlobal xg{x};
    NvPipe<R, RA, U> p;
    for (int base = 32 * part + (threadIdx.x & 31); base < n; base += step * U) {
        p.load(rs, base, step, n);
        p.compute(rs, base, step, n, xg, out);
    }
}

// The dot product of 8 bf16 weights (one 16-byte load) with x[0..4) = a, x[4..8) = b.
__device__ __forceinline__ float dot_bf16x8(uint4 w, float4 a, float4 b) {
    return __uint_as_float(w.x << 16) * a.x + __uint_as_float(w.x & 0xffff0000u) * a.y +
           __uint_as_float(w.y << 16) * a.z + __uint_as_float(w.y & 0xffff0000u) * a.w +
           __uint_as_float(w.z << 16) * b.x + __uint_as_float(w.z & 0xffff0000u) * b.y +
           __uint_as_float(w.w << 16) * b.z + __uint_as_float(w.w & 0xffff0000u) * b.w;
}

// BF16 rows (K % 8 == 0): out[r] += per-lane partial W[r, :] . x over 8-element chunks
// i = 32 * (part + nparts * j) + lane. Each lane issues the 16-byte loads of BU chunk slots of all
// R rows before any arithmetic (a 3072-wide row is 12 slots: one serial latency per BU slots).
template <int R, int RA>
__device__ __forceinline__ void bf_rows(const RowSet& rs, int K, const float* __restrict__ x, int part, int nparts,
                                        float out[R]) {
    constexpr int BU = R >= 8 ? 2 : 16 / R;
    const int lane = threadIdx.x & 31;
    const int n = K >> 3;
    const int step = 32 * nparts;
    for (int base = 32 * part + lane; base < n; base += step * BU) {
        uint4 wv[BU][R];
#pragma unroll
        for (int q = 0; q < BU; q++) {
            const int i = base + step * q;
#pragma unroll
            for (int r = 0; r < R; r++)
                if (i < n && rs_ok<R, RA>(rs, r)) wv[q][r] = ld_stream((const uint4*)rs_w<R, RA>(rs, r) + i);
        }
#pragma unroll
        for (int q = 0; q < BU; q++) {
            const int i = base + step * q;
            if (i < n) {
                const float4* xp = (const float4*)(x + (long)i * 8);
                const float4 xa = __ldg(xp), xb = __ldg(xp + 1);
#pragma unroll
                for (int r = 0; r < R; r++) {
                    if (rs_ok<R, RA>(rs, r)) out[r] += dot_bf16x8(wv[q][r], xa, xb);
                }
            }
        }
    }
}

__device__ __forceinline__ long row_bytes(int fmt, int K) {
    return fmt == 3 ? (long)(K / 2) : fmt == 0 ? 4l * K : 2l * K;
}

__device__ __forceinline__ RowSet rowset(int fmt, const void* w, const u8* scales, long row0, int n0, const void* w1,
                                         const u8* scales1, long row1, int n1, int K) {
    RowSet rs;
    rs.wst = row_bytes(fmt, K);
    rs.sst = K / 16;
    rs.w0 = (const u8*)w + row0 * rs.wst;
    rs.s0 = scales + row0 * rs.sst;
    rs.w1 = (const u8*)w1 + row1 * rs.wst;
    rs.s1 = scales1 + row1 * rs.sst;
    rs.n0 = n0;
    rs.n1 = n1;
    return rs;
}

// out[r] = per-lane partial of row r . x (the caller reduces over the warp and multiplies by
// nv_gscale(fmt, inv_g) of the row's tensor). Fast paths split K over `nparts` warps.
template <int R, int RA, int U>
__device__ __forceinline__ void rows_core(int fmt, const RowSet& rs, int K, const float* __restrict__ x, int part,
                                          int nparts, float out[R]) {
#pragma unroll
    for (int r = 0; r < R; r++) out[r] = 0.f;
    if (fmt == 3 && (K & 31) == 0) {
        nv_rows<R, RA, U>(rs, K, x, part, nparts, out);
    } else if (fmt == 2 && (K & 7) == 0) {
        bf_rows<R, RA>(rs, K, x, part, nparts, out);
    } else if (part == 0) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (rs_ok<R, RA>(rs, r)) {
                float acc[TB] = {0.f, 0.f, 0.f, 0.f};
                dot_any(fmt, rs_w<R, RA>(rs, r), rs_s<R, RA>(rs, r), 1.0f / NV_UNIT, 0, K, x, K, 1, acc);
                out[r] = acc[0];
            }
        }
    }
}

// out[r] = (partial, per lane) W[row0 + r, :] . x for r < nrows, global scale applied
// (caller reduces over the warp).
template <int R>
__device__ __forceinline__ void rows_dot(int fmt, const void* w, const u8* scales, float inv_g, long row0, int nrows,
                                         int K, const float* __restrict__ x, float out[R]) {
    const RowSet rs = rowset(fmt, w, scales, row0, nrows, w, scales, row0, 0, K);
    rows_core<R, R, (R >= 8 ? 1 : 8 / R)>(fmt, rs, K, x, 0, 1, out);
    const float gs = nv_gscale(fmt, inv_g);
#pragma unroll
    for (int r = 0; r < R; r++) out[r] *= gs;
}

// y[o] = resid[o] + bias[o] + W[o, :] . x for one token; R rows per warp.
template <int R>
__device__ void gemv1_impl(int fmt, const void* w, const u8* scales, float inv_g, const float* __restrict__ x,
                           float* y, const float* __restrict__ bias, const float* resid, int N, int K) {
    const int warps = blockDim.x >> 5;
    const long row0 = ((long)blockIdx.x * warps + (threadIdx.x >> 5)) * R;
    pdl_enter();
    if (row0 >= N) return;
    const int nrows = min((long)R, N - row0);
    float o[R];
    rows_dot<R>(fmt, w, scales, inv_g, row0, nrows, K, x, o);
#pragma unroll
    for (int r = 0; r < R; r++) {
        float v = warp_sum(o[r]);
        if ((threadIdx.x & 31) == 0 && r < nrows) {
            const long idx = row0 + r;
            if (bias) v += bias[idx];
            if (resid) v += resid[idx];
            y[idx] = v;
        }
    }
}

#define GEMV1(R)                                                                                             \
    extern "C" __global__ void gemv1_r##R(int fmt, const void* w, const u8* scales, float inv_g,            \
                                          const float* x, float* y, const float* bias, const float* resid, \
                                          int N, int K) {                                                               \
        gemv1_impl<R>(fmt, w, scales, inv_g, x, y, bias, resid, N, K);                                     \
    }
GEMV1(1)
GEMV1(2)
GEMV1(4)
GEMV1(8)

// NVFP4 decode GEMV (K % 32 == 0): blocks of NVW warps; KS warps split one group of NV_R rows
// along K (chunk-interleaved, so every warp load stays a coalesced 512-byte run) and combine
// through shared memory; NVW / KS row groups per block.
#define NVW 8
#define NV_R 2
// Persistent: block b handles row tiles b, b + gridDim.x, ... (a tile = NVW / KS groups of NV_R
// rows), staging x in shared memory once. K % 32 == 0, K <= XS_MAX (the host uses gemv1 otherwise).
template <int KS, int U>
__device__ __forceinline__ void gemv_nv_impl(const u8* __restrict__ w, const u8* __restrict__ scales, float inv_g,
                                             const float* __restrict__ x, float* y, const float* __restrict__ bias,
                                             const float* resid, int N, int K) {
    constexpr int G = NVW / KS;
    __shared__ float4 xs[XS_MAX / 4];
    __shared__ float red[2][NVW][NV_R];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int grp = warp / KS, part = warp % KS;
    const long tiles = ((long)N + G * NV_R - 1) / (G * NV_R);
    const float gs = inv_g * NV_UNIT;
    int it = 0;
    for (long tile = blockIdx.x; tile < tiles; tile += gridDim.x, it++) {
        const long row0 = (tile * G + grp) * NV_R;
        const int nrows = (int)max(0l, min((long)NV_R, (long)N - row0));
        const RowSet rs = rowset(3, w, scales, row0, nrows, w, scales, row0, 0, K);
        float o[NV_R];
#pragma unroll
        for (int r = 0; r < NV_R; r++) o[r] = 0.f;
        nv_rows_smem<NV_R, NV_R, U>(rs, nrows > 0, it == 0, K, x, xs, part, KS, o, it == 0);
#pragma unroll
        for (int r = 0; r < NV_R; r++) o[r] = warp_sum(o[r]);
        if (KS > 1) {
            // double-buffered by tile parity: one barrier per tile
            float (*rb)[NV_R] = red[it & 1];
            if (lane == 0) {
#pragma unroll
                for (int r = 0; r < NV_R; r++) rb[warp][r] = o[r];
            }
            __syncthreads();
            if (part == 0) {
#pragma unroll
                for (int r = 0; r < NV_R; r++) {
                    float v = 0.f;
#pragma unroll
                    for (int p = 0; p < KS; p++) v += rb[grp * KS + p][r];
                    o[r] = v;
                }
            }
        }
        if (part == 0 && lane == 0) {
#pragma unroll
            for (int r = 0; r < NV_R; r++) {
                if (r < nrows) {
                    const long idx = row0 + r;
                    float v = o[r] * gs;
                    if (bias) v += bias[idx];
                    if (resid) v += resid[idx];
                    y[idx] = v;
                }
            }
        }
    }
}

// gemv_nv_k<KS>_b<MINB>: MINB resident blocks per SM (register bound); 4 chunk slots per lane and
// batch with 2 blocks per SM, 2 with 3 (fewer registers).
#define GEMV_NV(KS, MINB)                                                                                        \
    extern "C" __global__ void __launch_bounds__(NVW * 32, MINB) gemv_nv_k##KS##_b##MINB(                        \
        const u8* w, const u8* scales, float inv_g, const float* x, float* y, const float* bias, const float* resid, \
        int N, int K) {                                                                                                      \
        gemv_nv_impl<KS, (MINB >= 3 ? 2 : 4)>(w, scales, inv_g, x, y, bias, resid, N, K);                                            \
    }
GEMV_NV(1, 2)
GEMV_NV(2, 2)
GEMV_NV(4, 2)
GEMV_NV(8, 2)
GEMV_NV(1, 3)
GEMV_NV(2, 3)
GEMV_NV(4, 3)
GEMV_NV(8, 3)

// ---- NVFP4 decode GEMV on tensor cores (K % 128 == 0) ----------------------------------------
//
// mma.m16n8k16 (f16 operands, f32 accumulation) with the weights as A: a warp owns a tile of 16
// rows; lane (group g = lane / 4, t = lane % 4) loads 16 bytes of rows g and g + 8 per 128-column
// chunk (the warp: 64 contiguous bytes of each row), i.e. columns 32 t .. 32 t + 31, two NVFP4
// blocks. A dot product does not depend on the order of its terms, so the mma's k index is a
// permutation of the columns, chosen so that each 32-bit word (8 codes) becomes the A operands of
// two mma steps in few instructions: the codes are widened to fp8 e4m3 bytes with shifts and masks
// (exactly e2m1 * 2^-6), converted pairwise to f16 by the hardware (cvt.f16x2.e4m3x2) and
// multiplied by their block's scale in f16 (exact: at most 6 significant bits, within range).
// x enters as B: column 0 its f16 high parts, column 1 the f16 remainders (x = hi + lo to ~22
// bits), after scaling x by the power of two that puts max|x| in [2^14, 2^15); the other columns
// are zero. The f32 accumulators of columns 0 and 1 (lanes t == 0) hold the rows' dot products:
// 2^-6 * 2^e * sum(e2m1 * scale * x). ~2.5 SASS instructions per weight instead of ~5 for the
// f32 decode (NvPipe); measured, these GEMVs are bound more by latency and by staging x than by
// instructions (docs/performance.md).

// Two e4m3 bytes per 16-bit half of v as two f16 pairs: lo from bytes 0, 1; hi from bytes 2, 3
// (the lower byte in the lower half).
// (sm_89+; on older devices the host never selects these paths and they compile to nothing.)
__device__ __forceinline__ void e4m3x4_h2(u32 v, u32& lo, u32& hi) {
#ifdef FP4FORGE_CPU_EMU
    lo = emu_e4m3x2_to_f16x2((u16)v);
    hi = emu_e4m3x2_to_f16x2((u16)(v >> 16));
#elif __CUDA_ARCH__ < 890
    lo = hi = 0u;
#else
    asm("{ .reg .b16 a, b;\n\t mov.b32 {a, b}, %2;\n\t cvt.rn.f16x2.e4m3x2 %0, a;\n\t cvt.rn.f16x2.e4m3x2 %1, b; }"
        : "=r"(lo), "=r"(hi)
        : "r"(v));
#endif
}
__device__ __forceinline__ u32 e4m3x2_h2(u32 v) {
    u32 lo, hi;
    e4m3x4_h2(v, lo, hi);
    return lo;
}
__device__ __forceinline__ u32 hmul2(u32 a, u32 b) {
#ifdef FP4FORGE_CPU_EMU
    return emu_hmul2(a, b);
#else
    u32 d;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
#endif
}
__device__ __forceinline__ u16 f32_to_f16_rn(float f) {
#ifdef FP4FORGE_CPU_EMU
    return emu_f32_to_f16(f);
#else
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
#endif
}

// The 8 codes of an NVFP4 word (code i in nibble i) times the f16 pair `s2` (one block scale in
// both halves), as the f16 pairs (code 0, code 2), (4, 6), (1, 3), (5, 7): e2m1 * scale * 2^-6.
__device__ __forceinline__ void nv_word_h2(u32 w, u32 s2, u32 o[4]) {
    const u32 even = ((w << 2) & 0x1C1C1C1Cu) | ((w << 4) & 0x80808080u);  // codes 0, 2, 4, 6
    const u32 odd = ((w >> 2) & 0x1C1C1C1Cu) | (w & 0x80808080u);          // codes 1, 3, 5, 7
    u32 a, b, c, d;
    e4m3x4_h2(even, a, b);
    e4m3x4_h2(odd, c, d);
    o[0] = hmul2(a, s2);
    o[1] = hmul2(b, s2);
    o[2] = hmul2(c, s2);
    o[3] = hmul2(d, s2);
}

__device__ __forceinline__ void mma16816(float c[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
#ifdef FP4FORGE_CPU_EMU
    const u32 a[4] = {a0, a1, a2, a3};
    emu_mma_m16n8k16(c, a, b0, b1, false);
#elif __CUDA_ARCH__ >= 890
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

// The power-of-two exponent e that puts m = max|x| in [2^14, 2^15) (0 when m is zero or not
// finite: a NaN or inf then reaches the output).
__device__ __forceinline__ int xb_exp(float m) {
    const int E = (int)((__float_as_uint(m) >> 23) & 0xff);  // biased exponent of m
    return (m > 0.f && E < 255) ? max(-100, min(100, 141 - E)) : 0;
}
__device__ __forceinline__ float pow2f(int e) { return __uint_as_float((u32)(127 + e) << 23); }

// The four B entries fed by octet o (x[8 o .. 8 o + 7] = a, b, times s): steps 8 c + 2 j + h
// (o = 16 c + 4 t + j, h = 0, 1), lane t, high parts and remainders; at entry j of xb_fill's
// layout, or (STAGED) at entry j' of xb_stage's, j' = j with its low two octal digits swapped
// (within each 64 entries).
template <bool STAGED>
__device__ __forceinline__ void xb_octet_at(uint2* xb, int o, float4 a, float4 b, float s) {
    const int j = 8 * (8 * (o >> 4) + 2 * (o & 3)) + ((o >> 2) & 3);
    const auto at = [](int j) { return STAGED ? (j & ~63) | ((j & 7) << 3) | ((j >> 3) & 7) : j; };
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const float v[4] = {(h ? a.y : a.x) * s, (h ? a.w : a.z) * s, (h ? b.y : b.x) * s, (h ? b.w : b.z) * s};
        u16 hi[4], lo[4];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            hi[q] = f32_to_f16_rn(v[q]);
            lo[q] = f32_to_f16_rn(v[q] - f16_to_f32(hi[q]));
        }
        xb[at(j + 8 * h)] = make_uint2((u32)hi[0] | ((u32)hi[1] << 16), (u32)hi[2] | ((u32)hi[3] << 16));
        xb[at(j + 8 * h + 4)] = make_uint2((u32)lo[0] | ((u32)lo[1] << 16), (u32)lo[2] | ((u32)lo[3] << 16));
    }
}
__device__ __forceinline__ void xb_octet(uint2* xb, int o, float4 a, float4 b, float s) {
    xb_octet_at<false>(xb, o, a, b, s);
}

// The largest of the block's threads' m (all threads call it; it synchronises the block).
__device__ __forceinline__ float block_max(float m) {
    __shared__ float wmax[32];
    m = warp_max(m);
    if ((threadIdx.x & 31) == 0) wmax[threadIdx.x >> 5] = m;
    __syncthreads();
    m = 0.f;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) m = fmaxf(m, wmax[i]);
    return m;
}

// x as the mma's B operand in shared memory (uint2 entries; K / 2 of them, K <= XS_MAX): entry
// 8 s + 4 p + t, for mma step s = 8 c + 2 j + h (chunk c, word j, half h) and lane t of group p
// (0: f16 high parts, 1: remainders), holds {(x[i], x[i + 2]), (x[i + 4], x[i + 6])} * 2^e,
// i = 128 c + 32 t + 8 j + h. Returns 2^-e; 2^e puts max|x| in [2^14, 2^15) (1 when x is zero or
// not finite: a NaN or inf then reaches the output). All threads of the block must call it; it
// ends with a barrier.
__device__ float xb_fill(uint2* xb, const float* __restrict__ x, int K) {
    const float4* x4 = (const float4*)x;
    const int no = K >> 3;  // octets: x[8 o .. 8 o + 7]
    float m = 0.f;
    // max |x|: each thread's loads of a round (4 octets) in flight together
    for (int o0 = threadIdx.x; o0 < no; o0 += 4 * blockDim.x) {
        float4 v[8];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int o = o0 + q * (int)blockDim.x;
            v[2 * q] = o < no ? __ldg(x4 + 2 * o) : make_float4(0.f, 0.f, 0.f, 0.f);
            v[2 * q + 1] = o < no ? __ldg(x4 + 2 * o + 1) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int q = 0; q < 8; q++)
            m = fmaxf(m, fmaxf(fmaxf(fabsf(v[q].x), fabsf(v[q].y)), fmaxf(fabsf(v[q].z), fabsf(v[q].w))));
    }
    const int e = xb_exp(block_max(m));
    const float sc = pow2f(e);
    // (the reloads hit L1)
#pragma unroll 2
    for (int o = threadIdx.x; o < no; o += blockDim.x) xb_octet(xb, o, __ldg(x4 + 2 * o), __ldg(x4 + 2 * o + 1), sc);
    __syncthreads();
    return pow2f(-e);
}

#define XW_CHUNKS 9  // chunks of x one warp of gemv_mma stages for itself (8 warps: XS_MAX / 128)
#define XW_OCT ((XW_CHUNKS * 16 + 31) / 32)  // octets per lane

// One warp stages x's chunks [c0, c1) (c1 - c0 <= XW_CHUNKS) as B entries at xw (entry layout of
// xb_fill, relative to chunk c0) with the power of two of this range's own max|x|; returns 2^-e.
// No block barrier: each warp scales its own partial sums back (exact: powers of two).
__device__ float xb_fill_warp(uint2* xw, const float* __restrict__ x, int c0, int c1) {
    const int lane = threadIdx.x & 31;
    const float4* x4 = (const float4*)x + 32 * c0;  // octet o of the range: float4s 2 o, 2 o + 1
    const int no = 16 * (c1 - c0);
    float4 v[2 * XW_OCT];
    float m = 0.f;
#pragma unroll
    for (int q = 0; q < XW_OCT; q++) {
        const int o = lane + 32 * q;
        v[2 * q] = o < no ? __ldg(x4 + 2 * o) : make_float4(0.f, 0.f, 0.f, 0.f);
        v[2 * q + 1] = o < no ? __ldg(x4 + 2 * o + 1) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int q = 0; q < 2 * XW_OCT; q++)
        m = fmaxf(m, fmaxf(fmaxf(fabsf(v[q].x), fabsf(v[q].y)), fmaxf(fabsf(v[q].z), fabsf(v[q].w))));
    const int e = xb_exp(warp_max(m));
    const float sc = pow2f(e);
#pragma unroll
    for (int q = 0; q < XW_OCT; q++) {
        const int o = lane + 32 * q;
        if (o < no) xb_octet(xw, o, v[2 * q], v[2 * q + 1], sc);
    }
    __syncwarp();
    return pow2f(-e);
}

// One chunk of a tile for G column groups: 8 mma steps per group over lane pieces `qa` (row g),
// `qb` (row g + 8) with their block scale pairs `za`, `zb` (decoded once for all groups);
// `bstep(q, s)` is this lane's B entry of group q, step s. Only the first `ng` groups run
// (warp-uniform; the others' accumulators stay as they are).
template <int G, class B>
__device__ __forceinline__ void mma_chunk_groups(uint4 qa, uint4 qb, u32 za, u32 zb, B bstep, float acc[G][4],
                                                 int ng = G) {
    const u32 sa = e4m3x2_h2(za), sb = e4m3x2_h2(zb);
    const u32 sal = __byte_perm(sa, 0, 0x1010), sah = __byte_perm(sa, 0, 0x3232);
    const u32 sbl = __byte_perm(sb, 0, 0x1010), sbh = __byte_perm(sb, 0, 0x3232);
    const u32 wa[4] = {qa.x, qa.y, qa.z, qa.w}, wb[4] = {qb.x, qb.y, qb.z, qb.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        u32 ha[4], hb[4];
        nv_word_h2(wa[j], j < 2 ? sal : sah, ha);
        nv_word_h2(wb[j], j < 2 ? sbl : sbh, hb);
#pragma unroll
        for (int h = 0; h < 2; h++) {
#pragma unroll
            for (int q = 0; q < G; q++) {
                if (q >= ng) break;
                const uint2 b = bstep(q, 2 * j + h);
                mma16816(acc[q], ha[2 * h], hb[2 * h], ha[2 * h + 1], hb[2 * h + 1], b.x, b.y);
            }
        }
    }
}

// mma_chunk_groups of one group: `bstep(s)` is this lane's B entry of step s.
template <class B>
__device__ __forceinline__ void mma_chunk_with(uint4 qa, uint4 qb, u32 za, u32 zb, B bstep, float acc[4]) {
    mma_chunk_groups<1>(qa, qb, za, zb, [&](int, int st) { return bstep(st); }, (float(*)[4])acc);
}

// mma_chunk_with with B from xb_fill's layout: `xb` points at the chunk's B entries + lane (lanes
// with `bx` false feed zeros).
__device__ __forceinline__ void mma_chunk(uint4 qa, uint4 qb, u32 za, u32 zb, const uint2* xb, bool bx,
                                          float acc[4]) {
    mma_chunk_with(qa, qb, za, zb, [&](int st) { return bx ? xb[st * 8] : make_uint2(0u, 0u); }, acc);
}

// A 16-row NVFP4 tile (rows >= nrows read row nrows - 1; their results are to be discarded) over
// the chunks [c, c1), U chunks in flight per lane: the loads of chunk c + U are issued as soon as
// chunk c is consumed.
template <int U>
struct MmaTile {
    const uint4* wa;
    const uint4* wb;
    const u16* sa;
    const u16* sb;
    uint4 qa[U], qb[U];
    u32 za[U], zb[U];
    int c, c1;

    // Issues the first loads (weights only: may precede pdl_enter()).
    __device__ __forceinline__ void start(const u8* w, const u8* s, long wst, long sst, int nrows, int c0,
                                          int cend) {
        const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
        const int ra = min(g, nrows - 1), rb = min(g + 8, nrows - 1);
        wa = (const uint4*)(w + ra * wst) + t;
        wb = (const uint4*)(w + rb * wst) + t;
        sa = (const u16*)(s + ra * sst) + t;
        sb = (const u16*)(s + rb * sst) + t;
        c = c0;
        c1 = cend;
#pragma unroll
        for (int u = 0; u < U; u++)
            if (c0 + u < c1) load(u, c0 + u);
    }
    __device__ __forceinline__ void load(int u, int ch) {
        qa[u] = ld_stream(wa + 4 * ch);
        qb[u] = ld_stream(wb + 4 * ch);
        za[u] = __ldg(sa + 4 * ch);
        zb[u] = __ldg(sb + 4 * ch);
    }
    // acc: the mma accumulators (row g: acc[0] + acc[1], row g + 8: acc[2] + acc[3] in lanes t == 0).
    __device__ __forceinline__ void run(const uint2* xb, float acc[4]) {
        const int lane = threadIdx.x & 31;
        const bool bx = lane < 8;
        for (; c < c1; c += U) {
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int ch = c + u;
                if (ch < c1) {
                    mma_chunk(qa[u], qb[u], za[u], zb[u], xb + ch * 64 + lane, bx, acc);
                    if (ch + U < c1) load(u, ch + U);
                }
            }
        }
    }
    // As run, with B from global memory in xb_stage's layout for G column groups: `xl` points
    // at this lane's entries of group 0's chunk 0 (group q, chunk ch: 4 16-byte words at
    // xl + q * gstride + 32 ch), fetched one chunk ahead; groups whose bit of `bx` is clear feed
    // zeros. acc[q]: group q's accumulators.
    template <int G>
    __device__ __forceinline__ void run_staged(const uint4* __restrict__ xl, long gstride, unsigned bx,
                                               float acc[G][4]) {
        uint4 b[G][4], bn[G][4];
        const uint4 z = make_uint4(0u, 0u, 0u, 0u);
        if (c < c1) {
#pragma unroll
            for (int q = 0; q < G; q++)
#pragma unroll
                for (int i = 0; i < 4; i++) b[q][i] = (bx >> q & 1) ? __ldg(xl + q * gstride + 32 * c + i) : z;
        }
        for (; c < c1; c += U) {
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int ch = c + u;
                if (ch < c1) {
#pragma unroll
                    for (int q = 0; q < G; q++)
#pragma unroll
                        for (int i = 0; i < 4; i++)
                            bn[q][i] = ((bx >> q & 1) && ch + 1 < c1) ? __ldg(xl + q * gstride + 32 * (ch + 1) + i) : z;
                    mma_chunk_groups<G>(
                        qa[u], qb[u], za[u], zb[u],
                        [&](int q, int st) {
                            const uint4 w = b[q][st >> 1];
                            return (st & 1) ? make_uint2(w.z, w.w) : make_uint2(w.x, w.y);
                        },
                        acc);
                    if (ch + U < c1) load(u, ch + U);
#pragma unroll
                    for (int q = 0; q < G; q++)
#pragma unroll
                        for (int i = 0; i < 4; i++) b[q][i] = bn[q][i];
                }
            }
        }
    }
    // As run_staged, with B fetched D chunks ahead instead of one: a ring of D + 1 chunks
    // (chunk ch's B is loaded before chunk ch - D's mma, hence U % (D + 1) == 0), for warps whose
    // weights are all in flight at once (else each chunk waits for its B an L2 round trip). The
    // same bits: only the loads move. (As run_staged's D = 1, this ring of 2 made gemv_mt_nv4
    // spill 68 bytes under NVRTC sm_90, where run_staged's b / bn do not.)
    template <int G, int D>
    __device__ __forceinline__ void run_staged_ahead(const uint4* __restrict__ xl, long gstride, unsigned bx,
                                                     float acc[G][4]) {
        static_assert(D >= 1 && U % (D + 1) == 0, "B's ring of D + 1 chunks must divide the U chunk slots");
        uint4 b[D + 1][G][4];
        const uint4 z = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
        for (int d = 0; d < D; d++)
#pragma unroll
            for (int q = 0; q < G; q++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    b[d][q][i] = ((bx >> q & 1) && c + d < c1) ? __ldg(xl + q * gstride + 32 * (c + d) + i) : z;
        for (; c < c1; c += U) {
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int ch = c + u;
                if (ch < c1) {
                    // chunk ch + D into the slot of chunk ch - 1 (c - c0 is a multiple of U, so
                    // chunk ch's slot is u's)
                    const int r = (u + D) % (D + 1);
#pragma unroll
                    for (int q = 0; q < G; q++)
#pragma unroll
                        for (int i = 0; i < 4; i++)
                            b[r][q][i] = ((bx >> q & 1) && ch + D < c1) ? __ldg(xl + q * gstride + 32 * (ch + D) + i) : z;
                    mma_chunk_groups<G>(
                        qa[u], qb[u], za[u], zb[u],
                        [&](int q, int st) {
                            const uint4 w = b[u % (D + 1)][q][st >> 1];
                            return (st & 1) ? make_uint2(w.z, w.w) : make_uint2(w.x, w.y);
                        },
                        acc);
                    if (ch + U < c1) load(u, ch + U);
                }
            }
        }
    }
    // As run_staged, with B in shared memory (gemv_mt_wide): this lane's 4 16-byte words of
    // group q's chunk ch (the ch - c'th of the run) at shared address sb + q gstride + 512 (ch -
    // c), word i at + 128 i; only the first `ng` groups run (warp-uniform).
    template <int G>
    __device__ __forceinline__ void run_shared(u32 sb, u32 gstride, int ng, float acc[G][4]) {
        const int first = c;
        for (; c < c1; c += U) {
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int ch = c + u;
                if (ch < c1) {
                    const u32 cb = sb + 512u * (ch - first);
                    mma_chunk_groups<G>(
                        qa[u], qb[u], za[u], zb[u],
                        [&](int q, int st) { return lds64(cb + q * gstride + 128u * (st >> 1) + 8u * (st & 1)); },
                        acc, ng);
                    if (ch + U < c1) load(u, ch + U);
                }
            }
        }
    }
};

#define MMA_U 4
#define GEMV_U 6  // chunk slots per lane in gemv_mma (6: a whole 8-warp o projection tile in flight at once)

// Sums the tile results of the KS warps of each tile (warps w, w + 1, ... w + KS - 1 share one)
// through shared memory `red` [warps][16]; returns in lanes r < 16 of each tile's first warp the
// row r sum (0 elsewhere). All threads of the block must call it.
__device__ __forceinline__ float mma_reduce(const float acc[4], float (*red)[16], int ks) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if ((lane & 3) == 0) {
        red[warp][lane >> 2] = acc[0] + acc[1];
        red[warp][(lane >> 2) + 8] = acc[2] + acc[3];
    }
    __syncthreads();
    float v = 0.f;
    if (warp % ks == 0 && lane < 16)
        for (int p = 0; p < ks; p++) v += red[warp + p][lane];
    return v;
}

// y = resid + bias + W x for one token, W NVFP4 [N, K] with K % 128 == 0, K <= XS_MAX: blocks of
// 8 warps; KS warps per 16-row tile split its chunks into contiguous runs, 8 / KS tiles per block.
extern "C" __global__ void __launch_bounds__(256) gemv_mma(const u8* __restrict__ w, const u8* __restrict__ scales,
                                                           float inv_g, const float* __restrict__ x, float* y,
                                                           const float* __restrict__ bias, const float* resid, int N,
                                                           int K, int ks) {
    __shared__ uint2 xb[XS_MAX / 2];
    __shared__ float red[8][16];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long row0 = ((long)blockIdx.x * (8 / ks) + warp / ks) * 16;
    const int nrows = (int)max(0l, min(16l, (long)N - row0));
    const int nc = K >> 7, part = warp % ks;
    MmaTile<GEMV_U> m;
    if (nrows > 0)
        m.start(w + row0 * (K / 2), scales + row0 * (K / 16), K / 2, K / 16, nrows, part * nc / ks,
                (part + 1) * nc / ks);
    pdl_enter();
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    if (nrows > 0) {
        // this warp's chunks of x, staged by the warp itself into its own region
        const int c0 = part * nc / ks, c1 = (part + 1) * nc / ks;
        uint2* xw = xb + warp * (XW_CHUNKS * 64);
        const float ds = xb_fill_warp(xw, x, c0, c1);
        m.run(xw - c0 * 64, acc);
#pragma unroll
        for (int i = 0; i < 4; i++) acc[i] *= ds;
    }
    const float v = mma_reduce(acc, red, ks);
    if (part == 0 && lane < nrows) {
        const long idx = row0 + lane;
        float o = v * (64.f * inv_g);
        if (bias) o += bias[idx];
        if (resid) o += resid[idx];
        y[idx] = o;
    }
}

// ---- few-token linears on tensor cores (batched decode steps) --------------------------------
//
// A decode step of a few sequences: every weight row is read once for up to 8 of them. NVFP4
// weights (the arithmetic of gemv_mma): one token uses 2 of the mma's 8 B columns (f16 high
// parts and remainders), lanes 8 s .. 8 s + 7 feed token s of a group of 4, a warp runs 2 groups
// per decoded A fragment. bf16 weights (the precision of gemm_mma): one token uses 3 columns (x as
// three bf16 parts, hi + mid + lo: 24 significant bits), lanes 12 j .. 12 j + 11 feed token j of
// a group of 2 (lanes 24-31 feed zeros), 4 groups. The tokens' rows are staged once in global
// memory (xb_stage); more than 8 tokens take more grid rows.

#define MT_NV_GROUPS 2  // NVFP4: groups of 4 tokens
#define MT_BF_GROUPS 4  // bf16: groups of 2 tokens
#define MT_NV_U 2       // NVFP4: chunk slots per lane (two blocks a SM: 128 registers)
#define MT_NV4_U 2      // NVFP4, one group of 4 tokens: chunk slots per lane (three blocks a SM)
#define MT_BF_U 2       // bf16: chunk slots per lane
#define MT_DEEP_U 8     // NVFP4, gemv_mt_*_deep: chunk slots per lane (a warp's 8 of an 8-warp o projection tile)
#define MT_DEEP_AHEAD 3 // NVFP4, gemv_mt_*_deep: B's chunks fetched ahead (a ring of 4)

// Part `part` (0: hi, 1: mid, 2: lo) of v's bf16 parts (`bf16x2_parts`), two pairs: hi =
// bf16(v), mid = bf16(v - hi), lo = bf16(v - hi - mid) (v = hi + mid + lo to 24 significant bits).
__device__ __forceinline__ uint2 bf16_part(float4 v, int part) {
    u32 a[3], b[3];
    bf16x2_parts(v.x, v.y, a);
    bf16x2_parts(v.z, v.w, b);
    return part == 0 ? make_uint2(a[0], b[0]) : part == 1 ? make_uint2(a[1], b[1]) : make_uint2(a[2], b[2]);
}

// The three bf16 parts of x[col .. col + 3] = v (col % 4 == 0) into xr, one row's B entries in
// xb_stage's bf16 layout: entries 96 c + 8 (t + 4 part) + st (chunk c = col / 128; t and step st
// from col % 128). For kernels that produce a row and stage it as xb_stage would.
__device__ __forceinline__ void xb_bf_store(uint2* __restrict__ xr, int col, float4 v) {
    const int c = col >> 7, rem = col & 127;
    const int st = 2 * (rem >> 5) + ((rem >> 2) & 1), t = (rem >> 3) & 3;
#pragma unroll
    for (int part = 0; part < 3; part++) xr[96 * c + 8 * (t + 4 * part) + st] = bf16_part(v, part);
}

// Row r of x (K values) as B entries in global memory, laid out per lane so that a lane's 8 mma
// steps of a chunk of 128 columns are 4 consecutive 16-byte words.
// NVFP4 weights (fmt 3): K / 2 entries per row at xb + r * K / 2; entry 64 c + 8 l + s (chunk c,
// lane l of a token's 8, step s) holds xb_fill's entry 64 c + 8 s + l; ds[r] = xb_fill's 2^-e.
// bf16 weights (fmt 2): 3 K / 4 entries per row at xb + r * 3 K / 4; entry 96 c + 8 l + s (lane
// l < 12 of a token's: part l / 4 (hi, mid, lo), t = l % 4) holds that part of x[i .. i + 3] as
// two bf16 pairs, i = 128 c + 32 (s / 2) + 8 t + 4 (s % 2) (bf_chunk's A fragments); ds[r] = 1.
// Grid (rows), 256 threads; K % 128 == 0, K <= XS_MAX.
extern "C" __global__ void __launch_bounds__(256) xb_stage(const float* __restrict__ x, int K, int fmt,
                                                           uint2* __restrict__ xb, float* __restrict__ ds) {
    __shared__ uint2 s[XS_MAX / 2];
    pdl_enter();
    const long r = blockIdx.x;
    if (fmt == 2) {
        uint2* o = xb + r * (3 * K / 4);
        for (int i = threadIdx.x; i < 3 * K / 4; i += blockDim.x) {
            const int c = i / 96, l = (i % 96) >> 3, st = i & 7;
            const int col = 128 * c + 32 * (st >> 1) + 8 * (l & 3) + 4 * (st & 1);
            o[i] = bf16_part(__ldg((const float4*)(x + r * K + col)), l >> 2);
        }
        if (threadIdx.x == 0) ds[r] = 1.f;
        return;
    }
    uint2* o = xb + r * (K / 2);
    const float d = xb_fill(s, x + r * K, K);
    for (int i = threadIdx.x; i < K / 2; i += blockDim.x) o[i] = s[(i & ~63) + 8 * (i & 7) + ((i >> 3) & 7)];
    if (threadIdx.x == 0) ds[r] = d;
}

__device__ __forceinline__ void mma16816_bf16(float c[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
#ifdef FP4FORGE_CPU_EMU
    const u32 a[4] = {a0, a1, a2, a3};
    emu_mma_m16n8k16(c, a, b0, b1, true);
#elif __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

// A 16-row bf16 tile (rows >= nrows read row nrows - 1) over the 128-column chunks [c, c1) with
// B staged by xb_stage (fmt 2) for G column groups; U chunks in flight per lane. Lane (g, t)
// holds 8 columns of rows g and g + 8 per 32-column piece: 4 16-byte words per row per chunk.
template <int U>
struct BfTile {
    const uint4* wa;
    const uint4* wb;
    uint4 qa[U][4], qb[U][4];
    int c, c1;

    __device__ __forceinline__ void start(const u16* w, long K, int nrows, int c0, int cend) {
        const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
        wa = (const uint4*)(w + min(g, nrows - 1) * K) + t;
        wb = (const uint4*)(w + min(g + 8, nrows - 1) * K) + t;
        c = c0;
        c1 = cend;
#pragma unroll
        for (int u = 0; u < U; u++)
            if (c0 + u < c1) load(u, c0 + u);
    }
    __device__ __forceinline__ void load(int u, int ch) {
#pragma unroll
        for (int p = 0; p < 4; p++) {
            qa[u][p] = ld_stream(wa + 16 * ch + 4 * p);
            qb[u][p] = ld_stream(wb + 16 * ch + 4 * p);
        }
    }
    // `xl`: this lane's entries of group 0's chunk 0 (group q, chunk ch: 4 16-byte words at
    // xl + q * gstride + 48 ch); groups whose bit of `bx` is clear feed zeros.
    template <int G>
    __device__ __forceinline__ void run_staged(const uint4* __restrict__ xl, long gstride, unsigned bx,
                                               float acc[G][4]) {
        const uint4 z = make_uint4(0u, 0u, 0u, 0u);
        for (; c < c1; c += U) {
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int ch = c + u;
                if (ch < c1) {
                    uint4 b[G][4];
#pragma unroll
                    for (int q = 0; q < G; q++)
#pragma unroll
                        for (int i = 0; i < 4; i++) b[q][i] = (bx >> q & 1) ? __ldg(xl + q * gstride + 48 * ch + i) : z;
#pragma unroll
                    for (int p = 0; p < 4; p++) {
                        const uint4 a = qa[u][p], bb = qb[u][p];
#pragma unroll
                        for (int q = 0; q < G; q++) {
                            const uint4 w = b[q][p];
                            mma16816_bf16(acc[q], a.x, bb.x, a.y, bb.y, w.x, w.y);
                            mma16816_bf16(acc[q], a.z, bb.z, a.w, bb.w, w.z, w.w);
                        }
                    }
                    if (ch + U < c1) load(u, ch + U);
                }
            }
        }
    }
};

// A warp's G groups of accumulators into red[warp][q][row][column] (all 8 B columns).
template <int G>
__device__ __forceinline__ void mt_stash_cols(const float acc[G][4], float (*red)[4][16][8]) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int q = 0; q < G; q++) {
        red[warp][q][g][2 * t] = acc[q][0];
        red[warp][q][g][2 * t + 1] = acc[q][1];
        red[warp][q][g + 8][2 * t] = acc[q][2];
        red[warp][q][g + 8][2 * t + 1] = acc[q][3];
    }
}

// The block of weight rows a gemv_mt block works on: blockIdx.x, or with `interleave` the grid's
// blocks in launch order taking each block of weight rows' grid rows side by side.
__device__ __forceinline__ int mt_block(const Segs& segs) {
    return segs.interleave ? (blockIdx.x + blockIdx.y * gridDim.x) / gridDim.y : blockIdx.x;
}

// y[t] = resid[t] + bias + W x[t] for the tokens [8 blockIdx.y, + 8) of `T` (x staged by
// xb_stage as xb, xds) and each linear W of `segs` (segment s: blocks [block0, next block0), its
// own y; all of one format, NVFP4 (fmt 3, sm_89+) or bf16 (fmt 2, sm_80+), [N, K], K % 128 ==
// 0; `bias`, `resid`: one segment only, else null): blocks of 8 warps, KS warps per 16-row tile
// splitting its chunks into contiguous runs, 8 / KS tiles per block (gemv_mma's geometry). One
// kernel per format (gemv_mt_bf16, gemv_mt_nv: FMT; U: chunks in flight a lane, G: groups of 4
// NVFP4 tokens or of 2 bf16 tokens: a grid row's tokens), so that each gets the registers its own
// path needs. U and G change no bit: each group accumulates its chunks in the same order.
template <int FMT, int U, int G, int D = 1>
__device__ __forceinline__ void gemv_mt_impl(const Segs& segs, const uint2* __restrict__ xb,
                                             const float* __restrict__ xds, const float* __restrict__ bias,
                                             const float* resid, int K, int T, int ks) {
    __shared__ float red[8][4][16][8];
    // this block's block of weight rows (bid) and grid row (gy)
    const int bid = mt_block(segs);
    const int gy = segs.interleave ? (blockIdx.x + blockIdx.y * gridDim.x) % gridDim.y : blockIdx.y;
    const Seg sg = segs.s[seg_index(segs, bid)];
    constexpr int fmt = FMT;
    const int N = sg.N;
    const u8* w = (const u8*)sg.w;
    const u8* scales = sg.scales;
    const float inv_g = sg.inv_g;
    float* y = sg.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long row0 = ((long)(bid - sg.block0) * (8 / ks) + warp / ks) * 16;
    const int nrows = (int)max(0l, min(16l, (long)N - row0));
    const int nc = K >> 7, part = warp % ks;
    const int c0 = part * nc / ks, c1 = (part + 1) * nc / ks;
    constexpr int TOKENS = fmt == 3 ? 4 * G : 2 * G;  // tokens per grid row
    const int tok0 = gy * TOKENS;
    if constexpr (fmt == 3) {
        // lane's token in group q: tok0 + 4 q + lane / 8
        const int slot = lane >> 3;
        unsigned bx = 0;
#pragma unroll
        for (int q = 0; q < G; q++)
            if (tok0 + 4 * q + slot < T) bx |= 1u << q;
        const int tl = min(tok0 + slot, T - 1);
        const uint4* xl = (const uint4*)(xb + (long)tl * (K / 2)) + 4 * (lane & 7);
        float acc[G][4] = {};
        MmaTile<U> m;
        if (nrows > 0) m.start(w + row0 * (K / 2), scales + row0 * (K / 16), K / 2, K / 16, nrows, c0, c1);
        if (segs.l2_prefetch && gy == 0 && warp == 0) {
            // (the block's rows: 8 / ks tiles of 16 from its first warp's)
            const long brows = max(0l, min(16l * (8 / ks), (long)N - row0));
            l2_prefetch_nv_rows(w, scales, row0, brows, K, lane, 32);
        }
        pdl_enter();
        if (nrows > 0) {
            if constexpr (D == 1)
                m.template run_staged<G>(xl, 4l * (K / 4), bx, acc);
            else
                m.template run_staged_ahead<G, D>(xl, 4l * (K / 4), bx, acc);
        }
        mt_stash_cols<G>(acc, red);
    } else {
        // lane's token in group q: tok0 + 2 q + lane / 12 (lanes 24-31: none)
        const int slot = lane / 12;
        unsigned bx = 0;
#pragma unroll
        for (int q = 0; q < G; q++)
            if (lane < 24 && tok0 + 2 * q + slot < T) bx |= 1u << q;
        const int tl = min(tok0 + min(slot, 1), T - 1);
        const uint4* xl = (const uint4*)(xb + (long)tl * (3 * K / 4)) + 4 * (lane % 12);
        float acc[G][4] = {};
        BfTile<U> m;
        if (nrows > 0) m.start((const u16*)w + row0 * K, K, nrows, c0, c1);
        if (segs.l2_prefetch && gy == 0 && warp == 0) {
            const long brows = max(0l, min(16l * (8 / ks), (long)N - row0));
            l2_prefetch(w + row0 * 2l * K, brows * 2l * K, lane, 32);
        }
        pdl_enter();
        if (nrows > 0) m.template run_staged<G>(xl, 2l * (3 * K / 8), bx, acc);
        mt_stash_cols<G>(acc, red);
    }
    __syncthreads();
    if (part != 0 || nrows == 0) return;
    for (int i = lane; i < 16 * TOKENS; i += 32) {
        const int r = i & 15, tk = i >> 4, tok = tok0 + tk;
        if (r >= nrows || tok >= T) continue;
        float v = 0.f;
        for (int p = 0; p < ks; p++) {
            if constexpr (fmt == 3) {
                const float* cv = red[warp + p][tk >> 2][r] + 2 * (tk & 3);
                v += cv[0] + cv[1];
            } else {
                const float* cv = red[warp + p][tk >> 1][r] + 3 * (tk & 1);
                v += cv[0] + cv[1] + cv[2];
            }
        }
        const long row = row0 + r, idx = (long)tok * N + row;
        float o = fmt == 3 ? v * (64.f * xds[tok] * inv_g) : v;
        if (bias) o += bias[row];
        if (resid) o += resid[idx];
        y[idx] = o;
    }
}

// gemv_mt_nv: two blocks a SM (128 registers: MT_NV_U chunks in flight a lane, no spills);
// gemv_mt_nv_b1: one block a SM with MMA_U chunks in flight (the kernel before, for A/B);
// gemv_mt_nv16: 16 tokens a grid row (4 groups: each weight fragment feeds 16 tokens, read half
// as often past 8 tokens), one block a SM;
// gemv_mt_nv4: 4 tokens a grid row (one group: half the accumulators), three blocks a SM like the
// one-token gemv_mma, for steps of 2-4 sequences.
// (minb: the blocks a SM the registers are sized for; 0: no minimum, ptxas's choice)
// gemv_mt_nv4_deep, gemv_mt_nv_deep: for a grid of at most one block a SM (an o projection's
// 128 tiles of 8 warps each): every chunk of a warp's run in flight at once (MT_DEEP_U, one block
// a SM) and B fetched MT_DEEP_AHEAD chunks ahead, so that once the weights are in, the chunks do
// not wait for B one L2 round trip each (CudaOptions::mt_deep). The bits of gemv_mt_nv4 and
// gemv_mt_nv.
// (minb: the blocks a SM the registers are sized for; 0: no minimum, ptxas's choice; ahead: B's
// chunks fetched ahead, 1: run_staged, more: run_staged_ahead's D)
#define GEMV_MT_KERNEL(name, fmt, u, groups, minb, ahead)                                                             \
    extern "C" __global__ void __launch_bounds__(256, minb)                                                           \
        name(Segs segs, const uint2* __restrict__ xb, const float* __restrict__ xds, const float* __restrict__ bias,   \
             const float* resid, int K, int T, int ks) {                                                               \
        gemv_mt_impl<fmt, u, groups, ahead>(segs, xb, xds, bias, resid, K, T, ks);                                    \
    }
GEMV_MT_KERNEL(gemv_mt_bf16, 2, MT_BF_U, MT_BF_GROUPS, 0, 1)
GEMV_MT_KERNEL(gemv_mt_nv, 3, MT_NV_U, MT_NV_GROUPS, 2, 1)
GEMV_MT_KERNEL(gemv_mt_nv_b1, 3, MMA_U, MT_NV_GROUPS, 0, 1)
GEMV_MT_KERNEL(gemv_mt_nv16, 3, MT_NV_U, 4, 0, 1)
GEMV_MT_KERNEL(gemv_mt_nv4, 3, MT_NV4_U, 1, 3, 1)
GEMV_MT_KERNEL(gemv_mt_nv4_deep, 3, MT_DEEP_U, 1, 1, MT_DEEP_AHEAD)
GEMV_MT_KERNEL(gemv_mt_nv_deep, 3, MT_DEEP_U, MT_NV_GROUPS, 1, MT_DEEP_AHEAD)

// One input's NVFP4 and bf16 linears of at most 4 tokens in one launch (q/k/v beside the
// attention's bf16 gate): the blocks below the first bf16 block (bf.s[0].block0) run
// gemv_mt_nv4's path over the segments `nv` (x staged for NVFP4: xb_nv, xds_nv), the others
// gemv_mt_bf16's over `bf` (its blocks numbered on from nv's; x staged for bf16) with 2 groups
// (4 tokens) and one chunk in flight (80 registers: three blocks a SM, as gemv_mt_nv4), each with
// its own K split: the bits of the two launches.
extern "C" __global__ void __launch_bounds__(256, 3)
    gemv_mt_mixed4(Segs nv, Segs bf, const uint2* __restrict__ xb_nv, const float* __restrict__ xds_nv,
                   const uint2* __restrict__ xb_bf, const float* __restrict__ xds_bf, int K, int T, int ks_nv,
                   int ks_bf) {
    if (mt_block(nv) < bf.s[0].block0)
        gemv_mt_impl<3, MT_NV4_U, 1>(nv, xb_nv, xds_nv, nullptr, nullptr, K, T, ks_nv);
    else
        gemv_mt_impl<2, 1, 2>(bf, xb_bf, xds_bf, nullptr, nullptr, K, T, ks_bf);
}

// The same for 5 to 32 tokens, 8 a grid row: the blocks below the first NVFP4 block
// (nv.s[0].block0) run gemv_mt_bf16's path over the segments `bf` with its 4 groups (8 tokens)
// and one chunk in flight, the others gemv_mt_nv's over `nv` (its blocks numbered on from bf's),
// two blocks a SM as gemv_mt_nv; each with its own K split: the bits of the two launches. The
// few bf16 blocks (an attention gate's: a few tiles a grid row) come first in launch order, so
// that they run beside q/k/v's first wave, not after its last; both segment lists interleave
// alike (the same grid rows), so one block index picks the path. (gemv_mt_mixed4's parameters.)
extern "C" __global__ void __launch_bounds__(256, 2)
    gemv_mt_mixed8(Segs nv, Segs bf, const uint2* __restrict__ xb_nv, const float* __restrict__ xds_nv,
                   const uint2* __restrict__ xb_bf, const float* __restrict__ xds_bf, int K, int T, int ks_nv,
                   int ks_bf) {
    if (mt_block(bf) < nv.s[0].block0)
        gemv_mt_impl<2, 1, MT_BF_GROUPS>(bf, xb_bf, xds_bf, nullptr, nullptr, K, T, ks_bf);
    else
        gemv_mt_impl<3, MT_NV_U, MT_NV_GROUPS>(nv, xb_nv, xds_nv, nullptr, nullptr, K, T, ks_nv);
}

// ---- NVFP4 linears of 5-32 tokens, B in shared memory (gemv_mt_wide) ------------------------
//
// gemv_mt's 16-row warp tiles each fetch their tokens' B from L2: at 32 tokens a chunk's B
// (16 KB) is 16x the warp's weights of it (1 KB), and a 32-row step's q/k/v/o ran at 0.25 TB/s of
// weights (the H100, 2026-12-06). Here a block's 8 warps take 128 consecutive rows over the same
// run of at most MT_WIDE_RUN chunks (K split over the grid's y), that run's B for all of the
// step's tokens (up to 32: MT_WIDE_GROUPS groups of 4) is copied once into shared memory, and
// each decoded weight fragment feeds every group. Each lane's arithmetic is gemv_mt_nv's (the
// same mma steps in the same order per group). With more than one split, each writes its row
// sums to `part` ([split][token][128 gridDim.x rows]) and the last block of a row block (its
// ticket in `tickets`, reset afterwards) adds them in split order and writes y: with gemv_mt's K
// split (split p: chunks [p nc / splits, (p + 1) nc / splits)) the bits of gemv_mt_nv.
// Measured slower than gemv_mt_nv all the same (the H100, 2026-12-06: 41 us a launch at 32 rows
// against ~40, 11.4 cycles between a warp's instructions, DRAM at 9%; before its B addresses were
// one 32-bit sum each), so it stays behind CudaOptions::mt_wide_min_tokens, off. The run-time
// group count puts a branch before each mma (docs/performance.md, 2026-12-06, midday).
#define MT_WIDE_GROUPS 8
#define MT_WIDE_RUN 4    // chunks a split (all in flight a lane; B: tokens x run x 512 bytes shared)
#define MT_WIDE_AHEAD 8  // splits' partial sums in flight a thread in the last block's sum

// y[t] = resid[t] + bias + W x[t] for the T <= 32 tokens (x staged by xb_stage as xb, xds) and
// each NVFP4 linear W of `segs` (blocks of 128 rows; `bias`, `resid`: one segment only):
// grid (the segments' blocks, splits), 256 threads, 4 ceil(T / 4) run 512 bytes of dynamic shared
// memory (the tokens padded to whole groups of 4).
extern "C" __global__ void __launch_bounds__(256, 2)
    gemv_mt_wide(Segs segs, const uint2* __restrict__ xb, const float* __restrict__ xds,
                 const float* __restrict__ bias, const float* resid, int K, int T, float* part,
                 u32* tickets) {
    DYNAMIC_SMEM(uint4, sb);  // [4 ng][run][32]: lane l's word i of a token's chunk at 8 i + l
    __shared__ int last;
    const Seg sg = segs.s[seg_index(segs, blockIdx.x)];
    const int N = sg.N;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long brow0 = (long)(blockIdx.x - sg.block0) * 128, row0 = brow0 + 16 * warp;
    const int nrows = (int)max(0l, min(16l, (long)N - row0));
    const int nc = K >> 7, splits = gridDim.y, p = blockIdx.y;
    const int c0 = p * nc / splits, c1 = (p + 1) * nc / splits, run = c1 - c0;
    MmaTile<MT_WIDE_RUN> m;
    if (nrows > 0)
        m.start((const u8*)sg.w + row0 * (K / 2), sg.scales + row0 * (K / 16), K / 2, K / 16, nrows, c0, c1);
    pdl_enter();
    // token t's chunk c: 32 16-byte words at xb + t K / 2 + 64 c (word 4 l + i: lane l's word i);
    // the tokens padded to whole groups of 4 with zeros
    const int ng = (T + 3) >> 2, words = 4 * ng * run * 32;
    for (int e = threadIdx.x; e < words; e += blockDim.x) {
        const int t = e / (run * 32), r = e - t * run * 32, j = r & 31;
        const uint4* src = (const uint4*)(xb + (long)min(t, T - 1) * (K / 2)) + 32 * c0 + r;
        cp_async16(smem_u32(sb + (e - j) + 8 * (j & 3) + (j >> 2)), src, t < T);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    const int slot = lane >> 3, l = lane & 7;
    float acc[MT_WIDE_GROUPS][4] = {};
    // (lane: token slot of each group, word l of each 8)
    if (nrows > 0)
        m.template run_shared<MT_WIDE_GROUPS>(smem_u32(sb) + 16u * (slot * run * 32 + l), 2048u * run, ng, acc);
    // lane (g, t): rows g and g + 8, token 4 q + t of group q (columns 2 t, 2 t + 1)
    const int g = lane >> 2, tq = lane & 3;
    const float inv_g = sg.inv_g;
    float* y = sg.y;
    auto store = [&](long row, int tok, float v) {
        const long idx = (long)tok * N + row;
        float o = v * (64.f * xds[tok] * inv_g);
        if (bias) o += bias[row];
        if (resid) o += resid[idx];
        y[idx] = o;
    };
    if (splits == 1) {
#pragma unroll
        for (int q = 0; q < MT_WIDE_GROUPS; q++) {
            const int tok = 4 * q + tq;
            if (q >= ng || tok >= T) continue;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = g + 8 * h;
                float v = 0.f;
                v += acc[q][2 * h] + acc[q][2 * h + 1];
                if (r < nrows) store(row0 + r, tok, v);
            }
        }
        return;
    }
    const long R = 128l * gridDim.x;
#pragma unroll
    for (int q = 0; q < MT_WIDE_GROUPS; q++) {
        const int tok = 4 * q + tq;
        if (q >= ng || tok >= T) continue;
#pragma unroll
        for (int h = 0; h < 2; h++)
            part[((long)p * T + tok) * R + 128l * blockIdx.x + 16 * warp + g + 8 * h] =
                acc[q][2 * h] + acc[q][2 * h + 1];
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(tickets + blockIdx.x, 1u) == (unsigned)splits - 1u;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    // the row block's sums, 4 rows of a token a thread (float4), two such in flight with
    // MT_WIDE_AHEAD splits each (not one L2 round trip a split)
    const float* pb = part + 128l * blockIdx.x;
    for (int i0 = threadIdx.x; i0 < 32 * T; i0 += 2 * blockDim.x) {
        float4 v[2] = {};
        for (int s0 = 0; s0 < splits; s0 += MT_WIDE_AHEAD) {
            float4 pv[2][MT_WIDE_AHEAD];
#pragma unroll
            for (int o = 0; o < 2; o++) {
                const int i = i0 + o * blockDim.x, tok = min(i >> 5, T - 1);
#pragma unroll
                for (int j = 0; j < MT_WIDE_AHEAD; j++)
                    if (s0 + j < splits) pv[o][j] = ld_cg4(pb + ((long)(s0 + j) * T + tok) * R + 4 * (i & 31));
            }
#pragma unroll
            for (int o = 0; o < 2; o++)
#pragma unroll
                for (int j = 0; j < MT_WIDE_AHEAD; j++)
                    if (s0 + j < splits) {
                        v[o].x += pv[o][j].x;
                        v[o].y += pv[o][j].y;
                        v[o].z += pv[o][j].z;
                        v[o].w += pv[o][j].w;
                    }
        }
#pragma unroll
        for (int o = 0; o < 2; o++) {
            const int i = i0 + o * blockDim.x, tok = i >> 5, r = 4 * (i & 31);
            if (tok >= T) continue;
            const float c[4] = {v[o].x, v[o].y, v[o].z, v[o].w};
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (brow0 + r + e < N) store(brow0 + r + e, tok, c[e]);
        }
    }
    if (threadIdx.x == 0) tickets[blockIdx.x] = 0u;
}

#define MULTI_R 4
#define MULTI_U 4  // chunk slots per lane on the tensor-core path of linear_multi2
// Several linears of the same input, one token: segment s covers blocks [block0, next block0),
// MULTI_R rows per warp. NVFP4 segments stage x in shared memory (the segment, hence the
// format, is uniform over a block).
// With `mma` (blocks of 8 warps), NVFP4 segments with K % 128 == 0 take the tensor-core path: a
// block's 64 rows are 4 tiles, 2 warps splitting each tile's chunks (the other segments: MULTI_R
// rows per warp).
extern "C" __global__ void linear_multi2(Segs segs, const float* __restrict__ x, int K, int mma) {
    __shared__ float4 xs[XS_MAX / 4];
    const Seg s = segs.s[seg_index(segs, blockIdx.x)];
    const int warps = blockDim.x >> 5;
    if (mma && s.fmt == 3 && (K & 127) == 0 && K <= XS_MAX && warps == 8) {
        __shared__ float red[8][16];
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
        const long row0 = (long)(blockIdx.x - s.block0) * 64 + (warp >> 1) * 16;
        const int nrows = (int)max(0l, min(16l, (long)s.N - row0));
        const int nc = K >> 7, p = warp & 1;
        MmaTile<MULTI_U> m;
        if (nrows > 0)
            m.start((const u8*)s.w + row0 * (K / 2), s.scales + row0 * (K / 16), K / 2, K / 16, nrows, p * nc / 2,
                    (p + 1) * nc / 2);
        pdl_enter();
        const float ds = xb_fill((uint2*)xs, x, K);
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        if (nrows > 0) m.run((const uint2*)xs, acc);
        const float v = mma_reduce(acc, red, 2);
        if (p == 0 && lane < nrows) s.y[row0 + lane] = v * (64.f * ds * s.inv_g);
        return;
    }
    const long row0 = ((long)(blockIdx.x - s.block0) * warps + (threadIdx.x >> 5)) * MULTI_R;
    const bool active = row0 < s.N;  // (no early exit: the NVFP4 path synchronises the block)
    const int nrows = active ? min((long)MULTI_R, s.N - row0) : 0;
    const bool nv_path = s.fmt == 3 && (K & 31) == 0 && K <= XS_MAX;
    if (!nv_path) pdl_enter();  // (the NVFP4 path waits after issuing its first weight loads)
    float o[MULTI_R];
    if (nv_path) {
        const RowSet rs = rowset(3, s.w, s.scales, active ? row0 : 0, nrows, s.w, s.scales, 0, 0, K);
#pragma unroll
        for (int r = 0; r < MULTI_R; r++) o[r] = 0.f;
        nv_rows_smem<MULTI_R, MULTI_R, 2>(rs, active, true, K, x, xs, 0, 1, o, true);
        if (!active) return;
#pragma unroll
        for (int r = 0; r < MULTI_R; r++) o[r] *= s.inv_g * NV_UNIT;
    } else {
        if (!active) return;
        rows_dot<MULTI_R>(s.fmt, s.w, s.scales, s.inv_g, row0, nrows, K, x, o);
    }
#pragma unroll
    for (int r = 0; r < MULTI_R; r++) {
        float v = warp_sum(o[r]);
        if ((threadIdx.x & 31) == 0 && r < nrows) s.y[row0 + r] = v;
    }
}
