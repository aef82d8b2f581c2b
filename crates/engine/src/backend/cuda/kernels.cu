// fp4forge CUDA kernels, compiled with NVRTC at start-up for the device's architecture.
// No headers: bf16/f16/fp8 conversions are done with bit manipulation (NVRTC needs no CUDA
// include path). Activations are f32; weights stay in their stored encoding.
//
// Weight formats (the `fmt` argument): 0 = f32, 1 = f16, 2 = bf16, 3 = NVFP4
// (packed e2m1, even element in the low nibble; one fp8 e4m3 scale per 16 elements;
// w = e2m1 * e4m3(scale) * inv_global).

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define INF_F __int_as_float(0x7f800000)

// ---- programmatic dependent launch --------------------------------------------------------------
//
// The host launches every kernel with programmatic stream serialization (sm_90+): its blocks may
// start while the previous kernel still runs. Each kernel first waits for its predecessor's
// results (griddepcontrol.wait: the previous grid completed and its writes are visible), then
// lets its own successor launch, so the successor's launch and block scheduling overlap this
// kernel's work instead of following it. Data never written by kernels (weights) may be read
// before the wait.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}
__device__ __forceinline__ void pdl_enter() {
    pdl_wait();
    pdl_launch_dependents();
}

__device__ __forceinline__ float bf16_to_f32(u32 b) { return __uint_as_float(b << 16); }
__device__ __forceinline__ u16 f32_to_bf16(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40);
    u32 r = u + 0x7fffu + ((u >> 16) & 1u);
    return (u16)(r >> 16);
}
__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("{ cvt.f32.f16 %0, %1; }" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// fp8 e4m3 (OCP, NaN = 0x7f/0xff, no infinities) to f32.
__device__ __forceinline__ float e4m3_to_f32(u32 b) {
    u32 s = (b & 0x80u) << 24;
    u32 e = (b >> 3) & 0xfu;
    u32 m = b & 0x7u;
    float v;
    if (e == 0) {
        v = (float)m * 0.001953125f;  // m * 2^-9
    } else if (e == 15 && m == 7) {
        return __uint_as_float(0x7fc00000u);
    } else {
        v = __uint_as_float(((e + 120u) << 23) | (m << 20));
    }
    return __uint_as_float(__float_as_uint(v) | s);
}

// f32 to fp8 e4m3 exactly as the format crate's f32_to_e4m3_saturating (torch's cast after a clamp
// to +-448): round to nearest even, subnormals kept, NaN stays NaN (0x7f with x's sign).
__device__ __forceinline__ u32 f32_to_e4m3_sat(float x) {
    const u32 bits = __float_as_uint(x);
    const u32 sign = (bits >> 24) & 0x80u;
    if (x != x) return sign | 0x7fu;
    const u32 a = bits & 0x7fffffffu;
    u32 mag;
    if (a > 0x43e80000u) {
        mag = 0x7eu;  // above the 448 / 480 tie (464): saturates
    } else if (a < 0x3c800000u) {
        mag = (u32)rintf(__uint_as_float(a) * 512.f);  // subnormal: m * 2^-9, ties to even
    } else {
        mag = (a - (120u << 23) + 0x7ffffu + ((a >> 20) & 1u)) >> 20;
    }
    return sign | mag;
}

__constant__ float E2M1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                               -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// ---- NVFP4 dequantization in registers (no tables) ----------------------------------------------
//
// e2m1: for a code n, the fp16 with bits ((n & 7) << 9) | ((n & 8) << 12) is exactly
// e2m1(n) * 2^-14 (e = 0, m = 1 is the fp16 subnormal 2^-15 = 0.5 * 2^-14; e > 0 gives
// 2^(e-15) (1 + m/2)). Codes i and i + 4 of a u32 (element i in nibble i: element 2c is the low
// nibble of byte c) form one half2 with two shifts and masks; half -> f32 is exact.
// e4m3: the fp16 with bits ((b & 0x7f) << 7) | ((b & 0x80) << 8) is exactly e4m3(b) * 2^-8 for
// every finite code (the NaN code 0x7f is not special-cased: it decodes as 480).
// So a block's partial sum sum(e2m1 * x) * e4m3 comes out exactly 2^-22 times the true value
// (power-of-two scaling: the same roundings as the table decode); NV_UNIT restores it together
// with the tensor's global scale.

#define NV_UNIT 4194304.0f  // 2^22

__device__ __forceinline__ float2 h2_to_f2(u32 h) {
    float2 f;
    asm("{ .reg .b16 lo, hi;\n\t mov.b32 {lo, hi}, %2;\n\t cvt.f32.f16 %0, lo;\n\t cvt.f32.f16 %1, hi; }"
        : "=f"(f.x), "=f"(f.y)
        : "r"(h));
    return f;
}

// The 8 codes of w as f32 values * 2^-14, in element order.
__device__ __forceinline__ void e2m1x8(u32 w, float f[8]) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const u32 v = w >> (4 * j);
        const float2 p = h2_to_f2(((v & 0x00070007u) << 9) | ((v & 0x00080008u) << 12));
        f[j] = p.x;
        f[j + 4] = p.y;
    }
}

// Two fp8 e4m3 scales (low byte first) as f32 values * 2^-8.
__device__ __forceinline__ float2 e4m3x2(u32 s) {
    return h2_to_f2(((s & 0x7fu) << 7) | ((s & 0x80u) << 8) | ((s & 0x7f00u) << 15) | ((s & 0x8000u) << 16));
}

// Global factor of an NVFP4 row sum computed with the decodes above (1 for other formats).
__device__ __forceinline__ float nv_gscale(int fmt, float inv_g) { return fmt == 3 ? inv_g * NV_UNIT : 1.f; }

// ---- fused epilogue ----------------------------------------------------------------------------
//
// Epi: work a decode kernel does once its outputs are complete, in the last of its blocks to finish
// (a grid-wide completion counter), in place of a separate launch: out = rmsnorm(x) * w for one
// row of n values (kind 1; kind 0: none).
struct Epi {
    u32* counter;    // zero before and after the kernel
    const float* x;  // the row to normalise
    const float* w;  // the norm weight
    float* out;      // the normalised row
    float eps;
    int kind;
    int n;
    int pad;
};

__device__ float block_sum(float v);

__device__ __forceinline__ float4 ld_cg4(const float* p) {
    float4 v;
    asm volatile("ld.global.cg.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
    return v;
}

#define EPI_V 8  // float4s of x per thread held in registers (n <= 32 * blockDim)

// All threads of every block call it last (no thread may have returned early). n % 4 == 0 and
// n <= 4 * EPI_V * blockDim (the host checks).
__device__ void epilogue(const Epi& ep) {
    if (ep.kind == 0) return;
    __shared__ int last;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(ep.counter, 1u) == gridDim.x * gridDim.y * gridDim.z - 1u;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    // the whole row in registers, all loads in flight together (from L2: other blocks wrote it)
    float4 v[EPI_V];
    float ss = 0.f;
#pragma unroll
    for (int q = 0; q < EPI_V; q++) {
        const int i = 4 * (threadIdx.x + q * blockDim.x);
        v[q] = i < ep.n ? ld_cg4(ep.x + i) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int q = 0; q < EPI_V; q++) ss += v[q].x * v[q].x + v[q].y * v[q].y + v[q].z * v[q].z + v[q].w * v[q].w;
    ss = block_sum(ss);
    const float r = 1.0f / sqrtf(ss / (float)ep.n + ep.eps);
#pragma unroll
    for (int q = 0; q < EPI_V; q++) {
        const int i = 4 * (threadIdx.x + q * blockDim.x);
        if (i < ep.n) {
            const float4 w = *(const float4*)(ep.w + i);
            *(float4*)(ep.out + i) = make_float4(w.x * (v[q].x * r), w.y * (v[q].y * r), w.z * (v[q].z * r),
                                                 w.w * (v[q].w * r));
        }
    }
    if (threadIdx.x == 0) *ep.counter = 0u;
}

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
// blocks [seg_block[s], seg_block[s+1]).
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
};

// ---- decode GEMV (one token): R rows per warp, x reused from registers across the rows ------

// Weights are read once per token: no L1 allocation, and first out of L2 (evict_first), so the
// weight stream does not push activations and KV rows out of L2.
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
    uint4 v;
#if __CUDA_ARCH__ >= 800
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
#if __CUDA_ARCH__ < 890
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
    u32 d;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
__device__ __forceinline__ u16 f32_to_f16_rn(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ float f16_bits_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
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
#if __CUDA_ARCH__ >= 890
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
// (o = 16 c + 4 t + j, h = 0, 1), lane t, high parts and remainders.
__device__ __forceinline__ void xb_octet(uint2* xb, int o, float4 a, float4 b, float s) {
    uint2* dst = xb + 8 * (8 * (o >> 4) + 2 * (o & 3)) + ((o >> 2) & 3);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const float v[4] = {(h ? a.y : a.x) * s, (h ? a.w : a.z) * s, (h ? b.y : b.x) * s, (h ? b.w : b.z) * s};
        u16 hi[4], lo[4];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            hi[q] = f32_to_f16_rn(v[q]);
            lo[q] = f32_to_f16_rn(v[q] - f16_bits_to_f32(hi[q]));
        }
        dst[8 * h] = make_uint2((u32)hi[0] | ((u32)hi[1] << 16), (u32)hi[2] | ((u32)hi[3] << 16));
        dst[8 * h + 4] = make_uint2((u32)lo[0] | ((u32)lo[1] << 16), (u32)lo[2] | ((u32)lo[3] << 16));
    }
}

// x as the mma's B operand in shared memory (uint2 entries; K / 2 of them, K <= XS_MAX): entry
// 8 s + 4 p + t, for mma step s = 8 c + 2 j + h (chunk c, word j, half h) and lane t of group p
// (0: f16 high parts, 1: remainders), holds {(x[i], x[i + 2]), (x[i + 4], x[i + 6])} * 2^e,
// i = 128 c + 32 t + 8 j + h. Returns 2^-e; 2^e puts max|x| in [2^14, 2^15) (1 when x is zero or
// not finite: a NaN or inf then reaches the output). All threads of the block must call it; it
// ends with a barrier.
__device__ float xb_fill(uint2* xb, const float* __restrict__ x, int K) {
    __shared__ float wmax[32];
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
    m = warp_max(m);
    if ((threadIdx.x & 31) == 0) wmax[threadIdx.x >> 5] = m;
    __syncthreads();
    m = 0.f;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) m = fmaxf(m, wmax[i]);
    const int e = xb_exp(m);
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

// One chunk of a tile: 8 mma steps over lane pieces `qa` (row g), `qb` (row g + 8) with their
// block scale pairs `za`, `zb`; `xb` points at the chunk's B entries + lane.
__device__ __forceinline__ void mma_chunk(uint4 qa, uint4 qb, u32 za, u32 zb, const uint2* xb, bool bx,
                                          float acc[4]) {
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
            const uint2 b = bx ? xb[(2 * j + h) * 8] : make_uint2(0u, 0u);
            mma16816(acc, ha[2 * h], hb[2 * h], ha[2 * h + 1], hb[2 * h + 1], b.x, b.y);
        }
    }
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
    int si = 0;
    for (int i = 1; i < segs.n; i++)
        if ((int)blockIdx.x >= segs.s[i].block0) si = i;
    const Seg s = segs.s[si];
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

// ---- multi-token linear (prefill): tiled matrix-matrix product ------------------------------

#define GM_BM 64   // output rows per block
#define GM_BN 64   // tokens per block
#define GM_BK 32   // K per tile (one NVFP4 chunk: 16 bytes and 2 scales per row)
#define GM_PAD 4

// The 8 weights w[row, k0 + 8 * part .. + 8] of any format as f32 (the same values as the GEMV
// paths: NVFP4 = e2m1 * e4m3 * inv_g). K % 32 == 0.
__device__ __forceinline__ void gm_weights(int fmt, const void* __restrict__ w, const u8* __restrict__ scales,
                                           float inv_g, long row, int K, int k0, int part, float f[8]) {
    const int k = k0 + 8 * part;
    if (fmt == 3) {
        const u32 q = __ldg((const u32*)((const u8*)w + row * (K / 2) + k / 2));
        e2m1x8(q, f);
        const u32 b = __ldg(scales + row * (K / 16) + k / 16);
        const float sc = e4m3x2(b).x * (inv_g * NV_UNIT);
#pragma unroll
        for (int e = 0; e < 8; e++) f[e] *= sc;
    } else if (fmt == 2 || fmt == 1) {
        const uint4 v = __ldg((const uint4*)((const u16*)w + row * K + k));
        const u32 u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            if (fmt == 2) {
                f[2 * j] = bf16_to_f32(u[j] & 0xffffu);
                f[2 * j + 1] = bf16_to_f32(u[j] >> 16);
            } else {
                f[2 * j] = f16_to_f32((u16)(u[j] & 0xffffu));
                f[2 * j + 1] = f16_to_f32((u16)(u[j] >> 16));
            }
        }
    } else {
        const float4* p = (const float4*)((const float*)w + row * K + k);
        const float4 a = __ldg(p), c = __ldg(p + 1);
        f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w;
        f[4] = c.x; f[5] = c.y; f[6] = c.z; f[7] = c.w;
    }
}

// y[t, o] = resid[t, o] + bias[o] + W[o, :] . x[t, :] for T tokens (prefill), K % 32 == 0.
// Block: GM_BM rows x GM_BN tokens, 256 threads, each 4 rows x 4 tokens in registers; per K tile
// the block dequantizes its weights and copies its x rows into shared memory (k-major), so each
// weight is read once per GM_BN tokens and each x value once per GM_BM rows. f32 throughout.
extern "C" __global__ void __launch_bounds__(256) gemm_tiled(int fmt, const void* __restrict__ w,
                                                             const u8* __restrict__ scales, float inv_g,
                                                             const float* __restrict__ x, float* y,
                                                             const float* __restrict__ bias, const float* resid,
                                                             int N, int K, int T) {
    __shared__ __align__(16) float ws[GM_BK][GM_BM + GM_PAD];
    __shared__ __align__(16) float xs[GM_BK][GM_BN + GM_PAD];
    const int tid = threadIdx.x;
    const long r0 = (long)blockIdx.x * GM_BM;
    const long t0 = (long)blockIdx.y * GM_BN;
    const int lr = tid >> 2, part = tid & 3;  // loader: row / token lr, 8 values of K at 8 * part
    const int ty = tid >> 4, tx = tid & 15;   // compute: rows 4 * ty.., tokens 4 * tx..
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.f;
    pdl_enter();
    for (int k0 = 0; k0 < K; k0 += GM_BK) {
        float f[8];
        if (r0 + lr < N) {
            gm_weights(fmt, w, scales, inv_g, r0 + lr, K, k0, part, f);
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++) f[e] = 0.f;
        }
        float g[8];
        if (t0 + lr < T) {
            const float4* p = (const float4*)(x + (t0 + lr) * K + k0 + 8 * part);
            const float4 a = __ldg(p), c = __ldg(p + 1);
            g[0] = a.x; g[1] = a.y; g[2] = a.z; g[3] = a.w;
            g[4] = c.x; g[5] = c.y; g[6] = c.z; g[7] = c.w;
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++) g[e] = 0.f;
        }
        __syncthreads();  // the previous tile's reads are done
#pragma unroll
        for (int e = 0; e < 8; e++) {
            ws[8 * part + e][lr] = f[e];
            xs[8 * part + e][lr] = g[e];
        }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < GM_BK; kk++) {
            const float4 a = *(const float4*)&ws[kk][4 * ty];
            const float4 b = *(const float4*)&xs[kk][4 * tx];
            const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
    }
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const long t = t0 + 4 * tx + j;
        if (t >= T) continue;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const long o = r0 + 4 * ty + i;
            if (o >= N) continue;
            const long idx = t * N + o;
            float v = acc[i][j];
            if (bias) v += bias[o];
            if (resid) v += resid[idx];
            y[idx] = v;
        }
    }
}

// ---- embedding -------------------------------------------------------------------------------

extern "C" __global__ void embed(int fmt, const void* __restrict__ w, const u8* __restrict__ scales, float inv_g,
                                 const u32* __restrict__ ids, float* __restrict__ y, int K) { pdl_enter();
    const long r = ids[blockIdx.x];
    float* out = y + (long)blockIdx.x * K;
    for (int k = threadIdx.x; k < K; k += blockDim.x) {
        float v;
        if (fmt == 3) {
            u8 b = ((const u8*)w)[r * (K / 2) + k / 2];
            u32 code = (k & 1) ? (b >> 4) : (b & 0xf);
            v = E2M1[code] * (e4m3_to_f32(scales[r * (K / 16) + k / 16]) * inv_g);
        } else if (fmt == 2) {
            v = bf16_to_f32(((const u16*)w)[r * K + k]);
        } else if (fmt == 1) {
            v = f16_to_f32(((const u16*)w)[r * K + k]);
        } else {
            v = ((const float*)w)[r * K + k];
        }
        out[k] = v;
    }
}

// ---- norms, rope, elementwise ----------------------------------------------------------------

__device__ float block_sum(float v) {
    __shared__ float sh[32];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    float r = 0.f;
    const int nw = blockDim.x >> 5;
    for (int i = 0; i < nw; i++) r += sh[i];
    return r;
}

// One block per group of `width` values: y = x * rsqrt(mean(x^2) + eps) * w.
extern "C" __global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
                                   int width, float eps) {
    pdl_enter();
    const float* g = x + (long)blockIdx.x * width;
    float* o = y + (long)blockIdx.x * width;
    if ((width & 3) == 0 && width <= 4 * EPI_V * (int)blockDim.x) {
        // the row and the weight in registers, every load in flight at once
        float4 v[EPI_V], wv[EPI_V];
        float ss = 0.f;
#pragma unroll
        for (int q = 0; q < EPI_V; q++) {
            const int i = 4 * (threadIdx.x + q * blockDim.x);
            v[q] = i < width ? *(const float4*)(g + i) : make_float4(0.f, 0.f, 0.f, 0.f);
            wv[q] = i < width ? __ldg((const float4*)(w + i)) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int q = 0; q < EPI_V; q++) ss += v[q].x * v[q].x + v[q].y * v[q].y + v[q].z * v[q].z + v[q].w * v[q].w;
        ss = block_sum(ss);
        const float r = 1.0f / sqrtf(ss / (float)width + eps);
#pragma unroll
        for (int q = 0; q < EPI_V; q++) {
            const int i = 4 * (threadIdx.x + q * blockDim.x);
            if (i < width)
                *(float4*)(o + i) = make_float4(wv[q].x * (v[q].x * r), wv[q].y * (v[q].y * r), wv[q].z * (v[q].z * r),
                                                wv[q].w * (v[q].w * r));
        }
        return;
    }
    float ss = 0.f;
    for (int i = threadIdx.x; i < width; i += blockDim.x) ss += g[i] * g[i];
    ss = block_sum(ss);
    const float r = 1.0f / sqrtf(ss / (float)width + eps);
    for (int i = threadIdx.x; i < width; i += blockDim.x) o[i] = w[i] * (g[i] * r);
}

#define NG_SLOTS 16  // 16-byte weight loads per lane of a row in norm_gemv_bf16 (K <= 32 * 8 * NG_SLOTS)
#define NG_WARPS 4

// y[r] = W[r, :] . xn for one token, xn = nw * (x * rsqrt(mean(x^2) + eps)) (the rms_norm
// kernel's formula): the norm feeding a small BF16 GEMV (the MoE router) in the same launch.
// One row per warp, NG_WARPS warps per block; each warp's whole row is loaded before the wait
// (weights are never written by kernels), so the loads overlap the previous kernel. Every block
// normalises x itself; block 0 also writes xn (the experts' input). Requires K % 256 == 0,
// K <= 256 * NG_SLOTS.
extern "C" __global__ void __launch_bounds__(NG_WARPS * 32) norm_gemv_bf16(const u16* __restrict__ w,
                                                                         const float* __restrict__ x,
                                                                         const float* __restrict__ nw, float eps,
                                                                         float* __restrict__ xn, float* __restrict__ y,
                                                                         int N, int K) {
    __shared__ float4 xs[256 * NG_SLOTS / 4];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long row = (long)blockIdx.x * NG_WARPS + warp;
    const int slots = K >> 8;
    uint4 wv[NG_SLOTS];
    if (row < N) {
        const uint4* p = (const uint4*)(w + row * K);
#pragma unroll
        for (int j = 0; j < NG_SLOTS; j++)
            if (j < slots) wv[j] = ld_stream(p + lane + 32 * j);
    }
    pdl_enter();
    constexpr int XQ = 256 * NG_SLOTS / 4 / (NG_WARPS * 32);  // float4s of x per thread
    const float4* x4 = (const float4*)x;
    const int n4 = K >> 2;
    float4 v[XQ];
    float ss = 0.f;
#pragma unroll
    for (int q = 0; q < XQ; q++) {
        const int i = threadIdx.x + q * NG_WARPS * 32;
        v[q] = i < n4 ? x4[i] : make_float4(0.f, 0.f, 0.f, 0.f);
        ss += v[q].x * v[q].x + v[q].y * v[q].y + v[q].z * v[q].z + v[q].w * v[q].w;
    }
    ss = block_sum(ss);
    const float r = 1.0f / sqrtf(ss / (float)K + eps);
#pragma unroll
    for (int q = 0; q < XQ; q++) {
        const int i = threadIdx.x + q * NG_WARPS * 32;
        if (i < n4) {
            const float4 g = __ldg((const float4*)nw + i);
            const float4 o = make_float4(g.x * (v[q].x * r), g.y * (v[q].y * r), g.z * (v[q].z * r), g.w * (v[q].w * r));
            xs[i] = o;
            if (blockIdx.x == 0) ((float4*)xn)[i] = o;
        }
    }
    __syncthreads();
    if (row >= N) return;
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < NG_SLOTS; j++) {
        if (j < slots) {
            const int i = lane + 32 * j;  // elements 8 i .. 8 i + 7
            const float4 a = xs[2 * i], b = xs[2 * i + 1];
            acc += dot_bf16x8(wv[j], a, b);
        }
    }
    acc = warp_sum(acc);
    if (lane == 0) y[row] = acc;
}

// NeoX rotation within the first `rdim` of each head: x rows [T, heads * hd], row t at pos0 + t.
// grid (heads, T), threads >= rdim / 2.
extern "C" __global__ void rope(float* x, const float* __restrict__ inv_freq, int heads, int hd, int rdim,
                               float attn_factor, int pos0) { pdl_enter();
    const int half = rdim / 2;
    const int j = threadIdx.x;
    if (j >= half) return;
    const int t = blockIdx.y;
    float* h = x + ((long)t * heads + blockIdx.x) * hd;
    const float ang = (float)(pos0 + t) * inv_freq[j];
    const float c = (float)cos((double)ang) * attn_factor;
    const float s = (float)sin((double)ang) * attn_factor;
    const float x1 = h[j], x2 = h[j + half];
    h[j] = x1 * c - x2 * s;
    h[j + half] = x2 * c + x1 * s;
}

// One value into a KV cache of storage type kv_t (0 f32, 1 fp8 e4m3 of x / scale, 2 bf16).
__device__ __forceinline__ void kv_store(void* c, long i, float x, int kv_t, float scale) {
    if (kv_t == 2)
        ((u16*)c)[i] = f32_to_bf16(x);
    else if (kv_t == 1)
        ((u8*)c)[i] = (u8)f32_to_e4m3_sat(x / scale);
    else
        ((float*)c)[i] = x;
}

// Per-head RMSNorm then rope, for q (heads) and k (kv_heads) of one token, in place.
// grid (heads + kv_heads [+ kv_heads]), block = hd rounded up to whole warps (hd <= 256).
// With `kc` (the KV append fused in): the k heads' blocks also write their rotated row into
// cache slot `slot` (row width kv_heads * hd), and kv_heads more blocks write v's.
extern "C" __global__ void qk_norm_rope(float* q, float* k, const float* __restrict__ qn, const float* __restrict__ kn,
                                       int heads, int hd, float eps, const float* __restrict__ inv_freq, int rdim,
                                       float attn_factor, int pos, void* kc, void* vc, const float* __restrict__ v,
                                       long slot, int kv_heads, int kv_t, float ks, float vs) {
    pdl_enter();
    const int i = threadIdx.x;
    if ((int)blockIdx.x >= heads + kv_heads) {
        const int hv = blockIdx.x - heads - kv_heads;
        if (i < hd) kv_store(vc, slot * kv_heads * hd + (long)hv * hd + i, v[(long)hv * hd + i], kv_t, vs);
        return;
    }
    const bool isq = (int)blockIdx.x < heads;
    float* h = isq ? q + (long)blockIdx.x * hd : k + (long)(blockIdx.x - heads) * hd;
    const float* w = isq ? qn : kn;
    float v0 = i < hd ? h[i] : 0.f;
    float ss = block_sum(v0 * v0);
    v0 = (w && i < hd) ? w[i] * (v0 * (1.0f / sqrtf(ss / (float)hd + eps))) : v0;
    __shared__ float sh[256];
    if (i < hd) sh[i] = v0;
    __syncthreads();
    const int half = rdim / 2;
    float out = v0;
    if (i < half) {
        const float ang = (float)pos * inv_freq[i];
        const float c = (float)cos((double)ang) * attn_factor;
        const float s = (float)sin((double)ang) * attn_factor;
        out = sh[i] * c - sh[i + half] * s;
    } else if (i < rdim) {
        const int j = i - half;
        const float ang = (float)pos * inv_freq[j];
        const float c = (float)cos((double)ang) * attn_factor;
        const float s = (float)sin((double)ang) * attn_factor;
        out = sh[i] * c + sh[j] * s;
    }
    if (i < hd) {
        h[i] = out;
        if (kc && !isq) kv_store(kc, slot * kv_heads * hd + (long)(blockIdx.x - heads) * hd + i, out, kv_t, ks);
    }
}

__device__ __forceinline__ float softplus(float g) { return g > 20.f ? g : log1pf(expf(g)); }

// x[t, j] *= softplus(gate[t, j / group]) ; n = rows * cols of x.
extern "C" __global__ void softplus_gate(float* x, const float* __restrict__ gate, long n, int group) { pdl_enter();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= softplus(gate[i / group]);
}

extern "C" __global__ void silu_mul(const float* __restrict__ g, const float* __restrict__ u, float* __restrict__ y,
                                   long n) { pdl_enter();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float a = g[i];
        y[i] = a / (1.0f + expf(-a)) * u[i];
    }
}

extern "C" __global__ void add_scaled(float* y, float alpha, const float* __restrict__ x, long n) { pdl_enter();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * alpha + y[i];
}

// ---- KV cache and attention -------------------------------------------------------------------

// Writes the chunk's rows into the cache (the last `window` rows for a ring). kv_t: 0 = f32,
// 1 = fp8 e4m3 of x / scale (ks for keys, vs for values), 2 = bf16.
extern "C" __global__ void kv_append(void* kc, void* vc, const float* __restrict__ k, const float* __restrict__ v,
                                    int T, int pos0, int window, int width, int kv_t, float ks, float vs) {
    pdl_enter();
    const int r = blockIdx.x;
    if (window > 0 && r < T - window) return;
    const long pos = pos0 + r;
    const long slot = window > 0 ? pos % window : pos;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        float kk = k[(long)r * width + i], vv = v[(long)r * width + i];
        if (kv_t == 2) {
            ((u16*)kc)[slot * width + i] = f32_to_bf16(kk);
            ((u16*)vc)[slot * width + i] = f32_to_bf16(vv);
        } else if (kv_t == 1) {
            ((u8*)kc)[slot * width + i] = (u8)f32_to_e4m3_sat(kk / ks);
            ((u8*)vc)[slot * width + i] = (u8)f32_to_e4m3_sat(vv / vs);
        } else {
            ((float*)kc)[slot * width + i] = kk;
            ((float*)vc)[slot * width + i] = vv;
        }
    }
}

#define GMAX 4
#define AW 4  // warps per attention block

// Reads and rounding of one cache storage type; `s` is the fp8 scale (ignored by the others).
template <typename KT>
struct KvIo;
template <>
struct KvIo<float> {
    __device__ static float ld(const float* p, long i, float) { return p[i]; }
    __device__ static float rnd(float x, float) { return x; }
    __device__ static void ld8(const float* p, float o[8], float) {
        float4 a = *(const float4*)p, b = *(const float4*)(p + 4);
        o[0] = a.x; o[1] = a.y; o[2] = a.z; o[3] = a.w; o[4] = b.x; o[5] = b.y; o[6] = b.z; o[7] = b.w;
    }
};
template <>
struct KvIo<u16> {
    __device__ static float ld(const u16* p, long i, float) { return bf16_to_f32(p[i]); }
    __device__ static float rnd(float x, float) { return round_bf16(x); }
    __device__ static void ld8(const u16* p, float o[8], float) {
        uint4 a = *(const uint4*)p;
        u32 w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            o[2 * j] = __uint_as_float(w[j] << 16);
            o[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
        }
    }
};
// fp8 e4m3 of x / s: decoded as e4m3 * s (the CPU cache's rounding and decode).
template <>
struct KvIo<u8> {
    __device__ static float ld(const u8* p, long i, float s) { return e4m3_to_f32(p[i]) * s; }
    __device__ static float rnd(float x, float s) { return e4m3_to_f32(f32_to_e4m3_sat(x / s)) * s; }
    __device__ static void ld8(const u8* p, float o[8], float s) {
        const uint2 a = *(const uint2*)p;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            o[j] = e4m3_to_f32((a.x >> (8 * j)) & 0xffu) * s;
            o[4 + j] = e4m3_to_f32((a.y >> (8 * j)) & 0xffu) * s;
        }
    }
};

// Causal attention of q [T, heads*d] over the cache (positions < pos0) and this chunk's k/v
// (f32 [T, kvh*d], rounded to the storage type on the fly), one block per (kv head, head
// group, token, split). Lanes own keys for the scores and dims for the values. Writes the
// output directly (splits == 1) or partial (o, m, l) for attn_combine.
// d % 8 == 0, d <= 128. DPL = ceil(d / 32).
template <typename KT, int DPL>
__device__ void attn_impl(const float* __restrict__ q, const float* __restrict__ kch, const float* __restrict__ vch,
                          const KT* __restrict__ kc, const KT* __restrict__ vc, float* __restrict__ out,
                          float* __restrict__ part_o, float* __restrict__ part_ml, int T, int heads, int kvh, int d,
                          float scale, int pos0, int window, int splits, int ngroups, float ks, float vs) {
    __shared__ float qs[GMAX][128];
    __shared__ float sm[AW][GMAX], sl[AW][GMAX];
    __shared__ float sacc[AW][GMAX][128];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const int kv = blockIdx.x / ngroups, grp = blockIdx.x % ngroups;
    const int G = heads / kvh;
    const int g0 = grp * GMAX;
    const int gn = min(GMAX, G - g0);
    const int h0 = kv * G + g0;
    const int t = blockIdx.y, z = blockIdx.z;
    const int p = pos0 + t;
    const int first = window > 0 ? max(0, p + 1 - window) : 0;
    const int nkeys = p - first + 1;
    const int per = (nkeys + splits - 1) / splits;
    const int s0 = first + z * per;
    const int s1 = min(s0 + per, p + 1);
    const long rw = (long)kvh * d;

    for (int i = threadIdx.x; i < GMAX * d; i += blockDim.x) {
        int g = i / d, c = i % d;
        qs[g][c] = g < gn ? q[(long)t * heads * d + (long)(h0 + g) * d + c] * scale : 0.f;
    }
    __syncthreads();

    float m[GMAX], l[GMAX], acc[GMAX][DPL];
#pragma unroll
    for (int g = 0; g < GMAX; g++) {
        m[g] = -INF_F;
        l[g] = 0.f;
#pragma unroll
        for (int c = 0; c < DPL; c++) acc[g][c] = 0.f;
    }

    for (int jb = s0 + wid * 32; jb < s1; jb += AW * 32) {
        const int j = jb + lane;
        float sc[GMAX];
#pragma unroll
        for (int g = 0; g < GMAX; g++) sc[g] = 0.f;
        const bool valid = j < s1;
        if (valid) {
            // All of the key's loads first (one latency), then the dot products.
            const bool cached = j < pos0;
            const KT* kr = kc + (cached ? (window > 0 ? (long)(j % window) : (long)j) : 0) * rw + (long)kv * d;
            const float* kf = kch + (long)(cached ? 0 : j - pos0) * rw + (long)kv * d;
            float kk[4 * DPL][8];
#pragma unroll
            for (int cc = 0; cc < 4 * DPL; cc++) {
                if (cc * 8 < d) {
                    if (cached) {
                        KvIo<KT>::ld8(kr + cc * 8, kk[cc], ks);
                    } else {
                        KvIo<float>::ld8(kf + cc * 8, kk[cc], 1.f);
#pragma unroll
                        for (int e = 0; e < 8; e++) kk[cc][e] = KvIo<KT>::rnd(kk[cc][e], ks);
                    }
                }
            }
#pragma unroll
            for (int cc = 0; cc < 4 * DPL; cc++) {
                if (cc * 8 < d) {
#pragma unroll
                    for (int g = 0; g < GMAX; g++)
                        if (g < gn) {
#pragma unroll
                            for (int e = 0; e < 8; e++) sc[g] += qs[g][cc * 8 + e] * kk[cc][e];
                        }
                }
            }
        }
        float pr[GMAX];
#pragma unroll
        for (int g = 0; g < GMAX; g++) {
            if (g < gn) {
                float s = valid ? sc[g] : -INF_F;
                float mx = warp_max(s);
                float mn = fmaxf(m[g], mx);
                float corr = m[g] == -INF_F ? 0.f : expf(m[g] - mn);
                float pv = valid ? expf(s - mn) : 0.f;
                l[g] = l[g] * corr + warp_sum(pv);
#pragma unroll
                for (int c = 0; c < DPL; c++) acc[g][c] *= corr;
                m[g] = mn;
                pr[g] = pv;
            }
        }
        const int nk = min(32, s1 - jb);
#pragma unroll 8
        for (int kk = 0; kk < nk; kk++) {
            const int jj = jb + kk;
            float vv[DPL];
            if (jj < pos0) {
                const long slot = window > 0 ? (long)(jj % window) : (long)jj;
                const KT* vr = vc + slot * rw + (long)kv * d;
#pragma unroll
                for (int c = 0; c < DPL; c++) {
                    int dd = lane + 32 * c;
                    vv[c] = dd < d ? KvIo<KT>::ld(vr, dd, vs) : 0.f;
                }
            } else {
                const float* vr = vch + (long)(jj - pos0) * rw + (long)kv * d;
#pragma unroll
                for (int c = 0; c < DPL; c++) {
                    int dd = lane + 32 * c;
                    vv[c] = dd < d ? KvIo<KT>::rnd(vr[dd], vs) : 0.f;
                }
            }
#pragma unroll
            for (int g = 0; g < GMAX; g++)
                if (g < gn) {
                    float pk = __shfl_sync(0xffffffffu, pr[g], kk);
#pragma unroll
                    for (int c = 0; c < DPL; c++) acc[g][c] += pk * vv[c];
                }
        }
    }
#pragma unroll
    for (int g = 0; g < GMAX; g++) {
        if (lane == 0) {
            sm[wid][g] = m[g];
            sl[wid][g] = l[g];
        }
#pragma unroll
        for (int c = 0; c < DPL; c++) {
            int dd = lane + 32 * c;
            if (dd < d) sacc[wid][g][dd] = acc[g][c];
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < gn * d; i += blockDim.x) {
        const int g = i / d, c = i % d;
        float M = -INF_F;
        for (int w = 0; w < AW; w++) M = fmaxf(M, sm[w][g]);
        float L = 0.f, O = 0.f;
        if (M != -INF_F) {
            for (int w = 0; w < AW; w++) {
                float f = sm[w][g] == -INF_F ? 0.f : expf(sm[w][g] - M);
                L += sl[w][g] * f;
                O += sacc[w][g][c] * f;
            }
        }
        const long hh = (long)t * heads + h0 + g;
        if (splits == 1) {
            out[hh * d + c] = L > 0.f ? O / L : 0.f;
        } else {
            part_o[(hh * splits + z) * d + c] = O;
            if (c == 0) {
                part_ml[(hh * splits + z) * 2] = M;
                part_ml[(hh * splits + z) * 2 + 1] = L;
            }
        }
    }
}

// Decode attention (one query row, T == 1) over a bf16 cache: the host's ngroups blocks per
// (kv head, split) split the kv head's G query heads evenly (ceil(G / ngroups) <= DEC_GMAX each;
// the group's blocks run side by side, so their K/V reads after the first hit L2).
// Warp w takes tiles of 16 keys (key jb + lane / 2, jb = s0 + 16 (w + AW i)); per tile every lane
// issues half of its key's D / 8 16-byte K loads and the 16 keys' V slices (D / 32 dims per
// lane) before any arithmetic; online softmax per head with per-lane partial sums of exp. The
// chunk's own key (position pos0, not yet in the cache) is read from kch/vch, rounded to bf16
// like a stored row.
// Same grid and outputs as attn_impl.
#define DEC_GMAX 4

__device__ __forceinline__ void bf16x8_to_f32(uint4 a, float o[8]) {
    const u32 w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        o[2 * j] = __uint_as_float(w[j] << 16);
        o[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
    }
}

__device__ __forceinline__ u32 pack_bf16x2(float a, float b) {
    return (u32)f32_to_bf16(a) | ((u32)f32_to_bf16(b) << 16);
}

// The per-head q/k rmsnorm, rope and KV append of a decode step, done inside the decode attention
// kernel instead of a qk_norm_rope launch before it (`on` = 0: q and k arrive normalised and
// rotated and the cache row is written). Layout matches `AttnPrep` on the host.
struct Prep {
    const float* qn;        // q norm weight [D] (null: none)
    const float* kn;        // k norm weight [D] (null: none)
    const float* inv_freq;  // rope frequencies [rdim / 2]
    u16* kc;                // the cache (the same rows the kernel reads): slot `slot` is written
    u16* vc;
    long slot;
    float eps;
    float attn_factor;
    int rdim;
    int on;
};

// The rope's cos and sin at position pos for the rdim / 2 frequencies (qk_norm_rope's
// arithmetic), by the block's threads into cs / sn; the caller synchronises.
__device__ __forceinline__ void rope_table(float* cs, float* sn, const Prep& pp, int pos) {
    for (int j = threadIdx.x; j < pp.rdim / 2; j += blockDim.x) {
        const float ang = (float)pos * pp.inv_freq[j];
        cs[j] = (float)cos((double)ang) * pp.attn_factor;
        sn[j] = (float)sin((double)ang) * pp.attn_factor;
    }
}

// One warp: v[0..D) = mul * rope(w * rmsnorm(src)) (NeoX rotation of the first rdim dims by the
// table cs / sn; w null: no norm), with qk_norm_rope's arithmetic and summation order.
template <int D>
__device__ __forceinline__ void head_norm_rope(float* v, const float* __restrict__ src, const float* __restrict__ w,
                                               const Prep& pp, const float* cs, const float* sn, float mul) {
    constexpr int C = D / 32;
    const int lane = threadIdx.x & 31;
    float x[C];
#pragma unroll
    for (int c = 0; c < C; c++) x[c] = src[lane + 32 * c];
    float ss = 0.f;
#pragma unroll
    for (int c = 0; c < C; c++) ss += warp_sum(x[c] * x[c]);
    const float r = 1.0f / sqrtf(ss / (float)D + pp.eps);
#pragma unroll
    for (int c = 0; c < C; c++) {
        if (w) x[c] = w[lane + 32 * c] * (x[c] * r);
        v[lane + 32 * c] = x[c];
    }
    __syncwarp();
    const int half = pp.rdim / 2;
    float o[C];
#pragma unroll
    for (int c = 0; c < C; c++) {
        const int i = lane + 32 * c;
        o[c] = x[c];
        if (i < pp.rdim) {
            const int j = i < half ? i : i - half;
            o[c] = i < half ? v[i] * cs[j] - v[i + half] * sn[j] : v[i] * cs[j] + v[j] * sn[j];
        }
    }
    __syncwarp();
#pragma unroll
    for (int c = 0; c < C; c++) v[lane + 32 * c] = o[c] * mul;
    __syncwarp();
}

template <int D>
__device__ void attn_dec_impl(const float* __restrict__ q, const float* __restrict__ kch,
                              const float* __restrict__ vch, const u16* __restrict__ kc, const u16* __restrict__ vc,
                              float* __restrict__ out, float* __restrict__ part_o, float* __restrict__ part_ml,
                              int heads, int kvh, float scale, int pos0, int window, int splits, int ngroups,
                              const Prep& pp) {
    constexpr int KC = D / 8;   // 16-byte chunks of a key row
    constexpr int VL = D / 32;  // value dims per lane (2 or 4)
    __shared__ float qs[DEC_GMAX][D];
    __shared__ float wm[AW][DEC_GMAX], wl[AW][DEC_GMAX];
    __shared__ float wacc[AW][DEC_GMAX][D];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const int kv = blockIdx.x / ngroups, grp = blockIdx.x % ngroups;
    const int GA = heads / kvh;
    const int gs = (GA + ngroups - 1) / ngroups;
    const int G = min(gs, GA - grp * gs);  // heads of this block (<= 0: none)
    if (G <= 0) return;
    const int h0 = kv * GA + grp * gs;
    const int z = blockIdx.z;
    const int p = pos0;
    const int first = window > 0 ? max(0, p + 1 - window) : 0;
    const int nkeys = p - first + 1;
    const int per = (nkeys + splits - 1) / splits;
    const int s0 = first + z * per;
    const int s1 = min(s0 + per, p + 1);
    const long rw = (long)kvh * D;

    // With pp.on, q and the new key (position p, in the block whose split holds it) are normalised
    // and rotated here; the kv head's first group block appends the key and value rows.
    __shared__ float knew[D], rcs[D / 2], rsn[D / 2];
    const bool own_new = pp.on && s0 <= p && p < s1;
    if (pp.on) {
        rope_table(rcs, rsn, pp, p);
        __syncthreads();
        for (int g = wid; g < G; g += AW) head_norm_rope<D>(qs[g], q + (long)(h0 + g) * D, pp.qn, pp, rcs, rsn, scale);
        if (own_new && wid == AW - 1) head_norm_rope<D>(knew, kch + (long)kv * D, pp.kn, pp, rcs, rsn, 1.f);
    } else {
        for (int i = threadIdx.x; i < G * D; i += blockDim.x) qs[i / D][i % D] = q[(long)h0 * D + i] * scale;
    }
    __syncthreads();
    if (own_new && grp == 0) {
        for (int i = threadIdx.x; i < D; i += blockDim.x) {
            pp.kc[pp.slot * rw + (long)kv * D + i] = f32_to_bf16(knew[i]);
            pp.vc[pp.slot * rw + (long)kv * D + i] = f32_to_bf16(vch[(long)kv * D + i]);
        }
    }

    float m[DEC_GMAX], l[DEC_GMAX], acc[DEC_GMAX][VL];
#pragma unroll
    for (int g = 0; g < DEC_GMAX; g++) {
        m[g] = -INF_F;
        l[g] = 0.f;
#pragma unroll
        for (int c = 0; c < VL; c++) acc[g][c] = 0.f;
    }

    // Tiles of 16 keys per warp: key jb + (lane >> 1); the lane pair splits its K row in halves.
    const int half = lane & 1;
    for (int jb = s0 + wid * 16; jb < s1; jb += AW * 16) {
        const int j = jb + (lane >> 1);
        const bool valid = j < s1;
        // ---- loads: half of this lane's key row, then the 16 keys' V slices of this lane
        uint4 kr[KC / 2];
        if (valid) {
            if (j < pos0) {
                const long slot = window > 0 ? (long)(j % window) : (long)j;
                const uint4* src = (const uint4*)(kc + slot * rw + (long)kv * D) + half * (KC / 2);
#pragma unroll
                for (int c = 0; c < KC / 2; c++) kr[c] = __ldg(src + c);
            } else {
                const float* src =
                    (pp.on ? knew : kch + (long)(j - pos0) * rw + (long)kv * D) + half * (D / 2);
#pragma unroll
                for (int c = 0; c < KC / 2; c++) {
                    const float4 a = *(const float4*)(src + 8 * c), b = *(const float4*)(src + 8 * c + 4);
                    kr[c] = make_uint4(pack_bf16x2(a.x, a.y), pack_bf16x2(a.z, a.w), pack_bf16x2(b.x, b.y),
                                       pack_bf16x2(b.z, b.w));
                }
            }
        }
        const int nk = min(16, s1 - jb);
        const int slotb = window > 0 ? jb % window : jb;
        u32 vr[16][VL / 2];
#pragma unroll
        for (int kk = 0; kk < 16; kk++) {
            if (kk < nk) {
                const int jj = jb + kk;
                if (jj < pos0) {
                    int slot = slotb + kk;
                    if (window > 0 && slot >= window) slot -= window;
                    const u16* src = vc + (long)slot * rw + (long)kv * D + lane * VL;
                    if (VL == 4) {
                        const uint2 t = __ldg((const uint2*)src);
                        vr[kk][0] = t.x;
                        vr[kk][VL / 2 - 1] = t.y;
                    } else {
                        vr[kk][0] = __ldg((const u32*)src);
                    }
                } else {
                    const float* src = vch + (long)(jj - pos0) * rw + (long)kv * D + lane * VL;
#pragma unroll
                    for (int c = 0; c < VL / 2; c++) vr[kk][c] = pack_bf16x2(src[2 * c], src[2 * c + 1]);
                }
            }
        }
        // ---- scores (pair-reduced) and online softmax
        float sc[DEC_GMAX];
#pragma unroll
        for (int g = 0; g < DEC_GMAX; g++) sc[g] = 0.f;
        if (valid) {
#pragma unroll
            for (int c = 0; c < KC / 2; c++) {
                float kf[8];
                bf16x8_to_f32(kr[c], kf);
                const int qo = (half * (KC / 2) + c) * 8;
#pragma unroll
                for (int g = 0; g < DEC_GMAX; g++) {
                    if (g < G) {
                        const float4 qa = *(const float4*)&qs[g][qo], qb = *(const float4*)&qs[g][qo + 4];
                        sc[g] += qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3] + qb.x * kf[4] +
                                 qb.y * kf[5] + qb.z * kf[6] + qb.w * kf[7];
                    }
                }
            }
        }
        float pr[DEC_GMAX];
#pragma unroll
        for (int g = 0; g < DEC_GMAX; g++) {
            pr[g] = 0.f;
            if (g < G) {
                const float full = sc[g] + __shfl_xor_sync(0xffffffffu, sc[g], 1);
                const float s = valid ? full : -INF_F;
                const float mn = fmaxf(m[g], warp_max(s));
                const float corr = m[g] == -INF_F ? 0.f : expf(m[g] - mn);
                const float pv = valid ? expf(s - mn) : 0.f;
                l[g] = l[g] * corr + (half ? 0.f : pv);  // per-lane partial; reduced at the end
#pragma unroll
                for (int c = 0; c < VL; c++) acc[g][c] *= corr;
                m[g] = mn;
                pr[g] = pv;
            }
        }
        // ---- values
#pragma unroll
        for (int kk = 0; kk < 16; kk++) {
            if (kk < nk) {
                float vf[VL];
#pragma unroll
                for (int c = 0; c < VL / 2; c++) {
                    vf[2 * c] = __uint_as_float(vr[kk][c] << 16);
                    vf[2 * c + 1] = __uint_as_float(vr[kk][c] & 0xffff0000u);
                }
#pragma unroll
                for (int g = 0; g < DEC_GMAX; g++) {
                    if (g < G) {
                        const float pk = __shfl_sync(0xffffffffu, pr[g], 2 * kk);
#pragma unroll
                        for (int c = 0; c < VL; c++) acc[g][c] = fmaf(pk, vf[c], acc[g][c]);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int g = 0; g < DEC_GMAX; g++) {
        if (g < G) {
            const float ls = warp_sum(l[g]);
            if (lane == 0) {
                wm[wid][g] = m[g];
                wl[wid][g] = ls;
            }
#pragma unroll
            for (int c = 0; c < VL; c++) wacc[wid][g][lane * VL + c] = acc[g][c];
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < G * D; i += blockDim.x) {
        const int g = i / D, c = i % D;
        float M = -INF_F;
#pragma unroll
        for (int w = 0; w < AW; w++) M = fmaxf(M, wm[w][g]);
        float L = 0.f, O = 0.f;
        if (M != -INF_F) {
#pragma unroll
            for (int w = 0; w < AW; w++) {
                const float f = wm[w][g] == -INF_F ? 0.f : expf(wm[w][g] - M);
                L += wl[w][g] * f;
                O += wacc[w][g][c] * f;
            }
        }
        const long hh = h0 + g;
        if (splits == 1) {
            out[hh * D + c] = L > 0.f ? O / L : 0.f;
        } else {
            part_o[(hh * splits + z) * D + c] = O;
            if (c == 0) {
                part_ml[(hh * splits + z) * 2] = M;
                part_ml[(hh * splits + z) * 2 + 1] = L;
            }
        }
    }
}

#define ATTN_KERNEL(NAME, KT, DPL)                                                                                     \
    extern "C" __global__ void __launch_bounds__(AW * 32) NAME(                                                       \
        const float* q, const float* kch, const float* vch, const KT* kc, const KT* vc, float* out, float* part_o,   \
        float* part_ml, int T, int heads, int kvh, int d, float scale, int pos0, int window, int splits,             \
        int ngroups, float ks, float vs) {                                                                             \
        pdl_enter();                                                                                                   \
        attn_impl<KT, DPL>(q, kch, vch, kc, vc, out, part_o, part_ml, T, heads, kvh, d, scale, pos0, window, splits, \
                           ngroups, ks, vs);                                                                          \
    }
// Decode steps (T == 1) over bf16 caches with d = 64 / 128 (the host picks these when
// ceil(G / ngroups) <= DEC_GMAX). MINB resident blocks per SM: 4 caps the registers at 128 (d 128
// spills a little, but long contexts gain from the occupancy), 2 leaves them uncapped (short
// spans: sliding layers and short contexts).
#define ATTN_KERNEL_DEC(NAME, D, MINB)                                                                                 \
    extern "C" __global__ void __launch_bounds__(AW * 32, MINB) NAME(                                                 \
        const float* q, const float* kch, const float* vch, const u16* kc, const u16* vc, float* out, float* part_o,   \
        float* part_ml, int heads, int kvh, float scale, int pos0, int window, int splits, int ngroups, Prep pp) {      \
        pdl_enter();                                                                                                   \
        attn_dec_impl<D>(q, kch, vch, kc, vc, out, part_o, part_ml, heads, kvh, scale, pos0, window, splits, ngroups, \
                         pp);                                                                                          \
    }
ATTN_KERNEL_DEC(attn_dec_bf16_64, 64, 4)
ATTN_KERNEL_DEC(attn_dec_bf16_128, 128, 4)
ATTN_KERNEL_DEC(attn_dec_bf16_128_short, 128, 2)
ATTN_KERNEL(attn_f32_1, float, 1)
ATTN_KERNEL(attn_f32_2, float, 2)
ATTN_KERNEL(attn_f32_4, float, 4)
ATTN_KERNEL(attn_bf16_1, u16, 1)
ATTN_KERNEL(attn_bf16_2, u16, 2)
ATTN_KERNEL(attn_bf16_4, u16, 4)
ATTN_KERNEL(attn_fp8_1, u8, 1)
ATTN_KERNEL(attn_fp8_2, u8, 2)
ATTN_KERNEL(attn_fp8_4, u8, 4)

// Merges the splits: grid (heads, T), threads d. Optionally multiplies by softplus(gate[t, h]).
extern "C" __global__ void attn_combine(const float* __restrict__ part_o, const float* __restrict__ part_ml,
                                       float* __restrict__ out, const float* __restrict__ gate, int heads, int d,
                                       int splits) { pdl_enter();
    const long hh = (long)blockIdx.y * heads + blockIdx.x;
    const int c = threadIdx.x;
    if (c >= d) return;
    float M = -INF_F;
    for (int z = 0; z < splits; z++) M = fmaxf(M, part_ml[(hh * splits + z) * 2]);
    float L = 0.f, O = 0.f;
    if (M != -INF_F) {
        for (int z = 0; z < splits; z++) {
            float mz = part_ml[(hh * splits + z) * 2];
            float f = mz == -INF_F ? 0.f : expf(mz - M);
            L += part_ml[(hh * splits + z) * 2 + 1] * f;
            O += part_o[(hh * splits + z) * d + c] * f;
        }
    }
    float v = L > 0.f ? O / L : 0.f;
    if (gate) v *= softplus(gate[hh]);
    out[hh * d + c] = v;
}

// ---- mixture of experts -----------------------------------------------------------------------

// One warp per token: scores (sigmoid or softmax), top-k on score + bias (ties: lower id),
// renormalise, scale. n <= 1024 experts.
// PER = experts per lane (n <= 32 PER): the selection loops are unrolled over PER registers.
template <int PER>
__device__ void route_impl(const float* __restrict__ logits, const float* __restrict__ bias, int n, int k,
                           int softmax, int normalize, float softcap, float scale, int* __restrict__ sel,
                           float* __restrict__ wts, int t) {
    const int lane = threadIdx.x & 31;
    const float* l = logits + (long)t * n;
    float s[PER], b[PER];
    float mx = -INF_F;
#pragma unroll
    for (int i = 0; i < PER; i++) {
        int e = lane + 32 * i;
        float x = e < n ? l[e] : -INF_F;
        if (softcap > 0.f && e < n) x = tanhf(x / softcap) * softcap;
        s[i] = x;
        mx = fmaxf(mx, x);
    }
    mx = warp_max(mx);
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < PER; i++) {
        int e = lane + 32 * i;
        if (e < n) {
            s[i] = softmax ? expf(s[i] - mx) : 1.0f / (1.0f + expf(-s[i]));
            sum += s[i];
        }
    }
    if (softmax) {
        sum = warp_sum(sum);
#pragma unroll
        for (int i = 0; i < PER; i++) s[i] /= sum;
    }
#pragma unroll
    for (int i = 0; i < PER; i++) {
        int e = lane + 32 * i;
        b[i] = e < n ? s[i] + (bias ? bias[e] : 0.f) : -INF_F;
    }
    float chosen_sum = 0.f;
    float my_w = 0.f;
    int my_e = 0;
    for (int r = 0; r < k; r++) {
        float best = -INF_F;
        int bi = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < PER; i++) {
            int e = lane + 32 * i;
            if (e < n && (b[i] > best || (b[i] == best && e < bi))) {
                best = b[i];
                bi = e;
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float ob = __shfl_xor_sync(0xffffffffu, best, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ob > best || (ob == best && oi < bi)) {
                best = ob;
                bi = oi;
            }
        }
        // the owner removes it and broadcasts its unbiased score
        float sv = 0.f;
        if ((bi & 31) == lane) {
#pragma unroll
            for (int i = 0; i < PER; i++)
                if (lane + 32 * i == bi) {
                    sv = s[i];
                    b[i] = -INF_F;
                }
        }
        sv = __shfl_sync(0xffffffffu, sv, bi & 31);
        chosen_sum += sv;
        if (lane == r) {
            my_w = sv;
            my_e = bi;
        }
    }
    if (lane < k) {
        float w = normalize ? my_w / chosen_sum : my_w;
        sel[t * k + lane] = my_e;
        wts[t * k + lane] = w * scale;
    }
}

// Top-k routing of token t by one warp (the calling threads 0..31).
__device__ void route_token(const float* __restrict__ logits, const float* __restrict__ bias, int n, int k,
                            int softmax, int normalize, float softcap, float scale, int* __restrict__ sel,
                            float* __restrict__ wts, int t) {
    if (n <= 64)
        route_impl<2>(logits, bias, n, k, softmax, normalize, softcap, scale, sel, wts, t);
    else if (n <= 128)
        route_impl<4>(logits, bias, n, k, softmax, normalize, softcap, scale, sel, wts, t);
    else if (n <= 256)
        route_impl<8>(logits, bias, n, k, softmax, normalize, softcap, scale, sel, wts, t);
    else if (n <= 512)
        route_impl<16>(logits, bias, n, k, softmax, normalize, softcap, scale, sel, wts, t);
    else
        route_impl<32>(logits, bias, n, k, softmax, normalize, softcap, scale, sel, wts, t);
}

extern "C" __global__ void route(const float* __restrict__ logits, const float* __restrict__ bias, int n, int k,
                                int softmax, int normalize, float softcap, float scale, int* __restrict__ sel,
                                float* __restrict__ wts) {
    pdl_enter();
    route_token(logits, bias, n, k, softmax, normalize, softcap, scale, sel, wts, blockIdx.x);
}

// One projection of all experts of a layer, stacked: expert e's rows start at e * rows.
struct ExpertProj {
    const void* w;         // [E, rows, K] (or packed [E, rows, K/2])
    const u8* scales;      // NVFP4: [E, rows, K/16]
    const float* inv_g;    // NVFP4: [E]
    int fmt;
};

// Where a warp of an expert's 16-row tile reads: tile rows `row0..` of projection P, chunks [c0, c1).
__device__ __forceinline__ void mma_start_group(MmaTile<MMA_U>& m, const ExpertProj& P, long row0, int nrows, int K,
                                                int c0, int c1) {
    if (nrows > 0) m.start((const u8*)P.w + row0 * (K / 2), P.scales + row0 * (K / 16), K / 2, K / 16, nrows, c0, c1);
}

// a ? x : y field by field (no local-memory copy of the parameters).
__device__ __forceinline__ ExpertProj pick(bool a, const ExpertProj& x, const ExpertProj& y) {
    ExpertProj r;
    r.w = a ? x.w : y.w;
    r.scales = a ? x.scales : y.scales;
    r.inv_g = a ? x.inv_g : y.inv_g;
    r.fmt = a ? x.fmt : y.fmt;
    return r;
}

#define XR 2   // rows of gate and of up per warp in experts_gate_up2
#define XU 3   // chunk slots per lane and batch in experts_gate_up2 (K = 3072: the whole row at once)
#define XRD 8  // rows per warp in experts_down2

// Item j of blockIdx.y: the shared expert's items (j >= T*k) are scheduled first (they are the
// largest when the shared expert is BF16), then the routed ones.
__device__ __forceinline__ int expert_item(int has_shared, int T, int k) {
    const int y = blockIdx.y;
    if (!has_shared) return y;
    return y < T ? T * k + y : y - T;
}

// h[j, o..o+XR) = silu(gate_e . x[t]) * (up_e . x[t]) for item j (token t = j / k, expert
// e = sel[j]; items j >= T*k: the shared expert of token j - T*k). XR rows of gate and XR of up
// per warp, their loads issued together.
// With `mma` (blocks of 8 warps), NVFP4 gate and up with K % 128 == 0 take the tensor-core path:
// the block's 16 gate rows are one tile (warps 0-3), its 16 up rows another (warps 4-7).
extern "C" __global__ void __launch_bounds__(256, 2) experts_gate_up2(ExpertProj gate, ExpertProj up, ExpertProj sgate, ExpertProj sup,
                                           int has_shared, int shared_inter, const int* __restrict__ sel, int k,
                                           int T, const float* __restrict__ x, float* __restrict__ h, int inter,
                                           int K, int mma) {
    const int warps = blockDim.x >> 5;
    const long o = ((long)blockIdx.x * warps + (threadIdx.x >> 5)) * XR;
    const int j = expert_item(has_shared, T, k);
    const bool sh = j >= T * k;
    const int n = sh ? shared_inter : inter;
    __shared__ float4 xs[XS_MAX / 4];
    if (mma && !sh && gate.fmt == 3 && up.fmt == 3 && (K & 127) == 0 && K <= XS_MAX && warps == 8 && XR == 2) {
        __shared__ float red[8][16];
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
        const long ob = (long)blockIdx.x * 16;
        const int nrows = (int)max(0l, min(16l, (long)n - ob));
        const bool is_up = warp >= 4;
        const ExpertProj P = is_up ? up : gate;
        const int nc = K >> 7, part = warp & 3;
        pdl_enter();  // (sel is the router's output: the weights' address is known only after it)
        const long ee = sel[j];
        const long r0 = ee * (long)n + ob;
        MmaTile<MMA_U> m;
        mma_start_group(m, P, r0, nrows, K, part * nc / 4, (part + 1) * nc / 4);
        const int t = j / k;
        const float ds = xb_fill((uint2*)xs, x + (long)t * K, K);
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        if (nrows > 0) m.run((const uint2*)xs, acc);
        const float v = mma_reduce(acc, red, 4);  // warp 0: the gate rows (warps 0-3)
        if (warp == 0 && lane < nrows) {
            float uv = 0.f;
#pragma unroll
            for (int p = 0; p < 4; p++) uv += red[4 + p][lane];
            const float gv = v * (64.f * ds * gate.inv_g[ee]);
            uv *= 64.f * ds * up.inv_g[ee];
            h[(long)j * max(inter, shared_inter) + ob + lane] = gv / (1.0f + expf(-gv)) * uv;
        }
        return;
    }
    pdl_enter();
    const bool active = o < n;  // (no early exit: the NVFP4 path synchronises the block)
    const int nrows = active ? min((long)XR, n - o) : 0;
    const int t = sh ? j - T * k : j / k;
    const float* xt = x + (long)t * K;
    const ExpertProj G = pick(sh, sgate, gate);
    const ExpertProj U = pick(sh, sup, up);
    const long e = sh ? 0 : sel[j];
    const long r0 = e * (long)n + (active ? o : 0);
    const float gg = nv_gscale(G.fmt, G.fmt == 3 ? G.inv_g[e] : 1.f);
    const float gu = nv_gscale(U.fmt, U.fmt == 3 ? U.inv_g[e] : 1.f);
    float g[XR], u[XR];
    if (G.fmt == 3 && U.fmt == 3 && (K & 31) == 0 && K <= XS_MAX) {
        const RowSet rs = rowset(3, G.w, G.scales, r0, nrows, U.w, U.scales, r0, nrows, K);
        float a[2 * XR];
#pragma unroll
        for (int r = 0; r < 2 * XR; r++) a[r] = 0.f;
        nv_rows_smem<2 * XR, XR, XU>(rs, active, true, K, xt, xs, 0, 1, a);
        if (!active) return;
#pragma unroll
        for (int r = 0; r < XR; r++) {
            g[r] = a[r];
            u[r] = a[XR + r];
        }
    } else if (!active) {
        return;
    } else if (G.fmt == U.fmt) {
        const RowSet rs = rowset(G.fmt, G.w, G.scales, r0, nrows, U.w, U.scales, r0, nrows, K);
        float a[2 * XR];
        rows_core<2 * XR, XR, XU>(G.fmt, rs, K, xt, 0, 1, a);
#pragma unroll
        for (int r = 0; r < XR; r++) {
            g[r] = a[r];
            u[r] = a[XR + r];
        }
    } else {
        const RowSet rg = rowset(G.fmt, G.w, G.scales, r0, nrows, G.w, G.scales, r0, 0, K);
        const RowSet ru = rowset(U.fmt, U.w, U.scales, r0, nrows, U.w, U.scales, r0, 0, K);
        rows_core<XR, XR, 2>(G.fmt, rg, K, xt, 0, 1, g);
        rows_core<XR, XR, 2>(U.fmt, ru, K, xt, 0, 1, u);
    }
    const int width = max(inter, shared_inter);
#pragma unroll
    for (int r = 0; r < XR; r++) {
        float gv = warp_sum(g[r]) * gg, uv = warp_sum(u[r]) * gu;
        if ((threadIdx.x & 31) == 0 && r < nrows) h[(long)j * width + o + r] = gv / (1.0f + expf(-gv)) * uv;
    }
}

// part[j, o] = w_j * down_{sel[j]}[o] . h[j] (w = 1 for the shared expert's items j >= T*k).
// grid (ceil(H / (warps * XRD)), T*k (+ T)).
// With `mma` (blocks of 4 warps), NVFP4 experts with K % 128 == 0 take the tensor-core path: the
// block's 32 rows are two tiles of 2 warps each.
extern "C" __global__ void experts_down2(ExpertProj down, ExpertProj sdown, int shared_inter,
                                        const int* __restrict__ sel, const float* __restrict__ wts, int k, int T,
                                        const float* __restrict__ h, int inter, float* __restrict__ part, int H,
                                        int mma) {
    const int warps = blockDim.x >> 5;
    __shared__ float4 xs[XS_MAX / 4];
    if (mma && down.fmt == 3 && (inter & 127) == 0 && inter <= XS_MAX && warps * XRD == 32 &&
        expert_item(gridDim.y > T * k, T, k) < T * k) {
        __shared__ float red[4][16];
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
        const int j = expert_item(gridDim.y > T * k, T, k);
        const long ob = (long)blockIdx.x * 32 + (warp >> 1) * 16;
        const int nrows = (int)max(0l, min(16l, (long)H - ob));
        const int K = inter, nc = K >> 7, p = warp & 1;
        pdl_enter();
        const long e = sel[j];
        const long r0 = e * (long)H + ob;
        MmaTile<MMA_U> m;
        mma_start_group(m, down, r0, nrows, K, p * nc / 2, (p + 1) * nc / 2);
        const float ds = xb_fill((uint2*)xs, h + (long)j * max(inter, shared_inter), K);
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        if (nrows > 0) m.run((const uint2*)xs, acc);
        const float v = mma_reduce(acc, red, 2);
        if (p == 0 && lane < nrows) part[(long)j * H + ob + lane] = v * (64.f * ds * down.inv_g[e] * wts[j]);
        return;
    }
    const long o0 = ((long)blockIdx.x * warps + (threadIdx.x >> 5)) * XRD;
    const bool active = o0 < H;  // (no early exit: the NVFP4 path synchronises the block)
    const long o = active ? o0 : 0;
    const int nrows = active ? min((long)XRD, H - o) : 0;
    const int j = expert_item(gridDim.y > T * k, T, k);
    const bool sh = j >= T * k;
    pdl_enter();
    const int width = max(inter, shared_inter);
    const ExpertProj D = pick(sh, sdown, down);
    const long e = sh ? 0 : sel[j];
    const int K = sh ? shared_inter : inter;
    const RowSet rs = rowset(D.fmt, D.w, D.scales, e * H + o, nrows, D.w, D.scales, 0, 0, K);
    float a[XRD];
    if (D.fmt == 3 && (K & 31) == 0 && K <= XS_MAX) {
#pragma unroll
        for (int r = 0; r < XRD; r++) a[r] = 0.f;
        nv_rows_smem<XRD, XRD, 1>(rs, active, true, K, h + (long)j * width, xs, 0, 1, a);
        if (!active) return;
    } else {
        if (!active) return;
        rows_core<XRD, XRD, 1>(D.fmt, rs, K, h + (long)j * width, 0, 1, a);
    }
    const float gs = nv_gscale(D.fmt, D.fmt == 3 ? D.inv_g[e] : 1.f) * (sh ? 1.f : wts[j]);
#pragma unroll
    for (int r = 0; r < XRD; r++) {
        float v = warp_sum(a[r]);
        if ((threadIdx.x & 31) == 0 && r < nrows) part[(long)j * H + o + r] = v * gs;
    }
}

// ---- persistent decode MoE (one token, NVFP4 routed experts on tensor cores) ------------------
//
// As many blocks as are resident loop over groups of rows; the shared expert's groups first (any
// format, through rows_core, x from global memory), then the routed items'. x (gate/up) or every
// item's h (down) is staged once per block, and all groups run in one wave
// (the per-item kernels above restage x in every block and run in several waves). A block's
// groups are reduced through shared memory double-buffered by group parity: one barrier each.

// The router's top-k (n <= 256 experts, k <= 32), computed by every block of experts_gate_up_p
// from the router logits (in place of a separate launch; block 0 also writes sel / wts for the
// kernels after it). `logits` null: sel / wts are inputs (already routed).
struct Route {
    const float* logits;
    const float* bias;
    float softcap;
    float scale;
    int n;
    int softmax;
    int normalize;
    int pad;
};

template <int PER>
__device__ void route_impl(const float* __restrict__ logits, const float* __restrict__ bias, int n, int k,
                           int softmax, int normalize, float softcap, float scale, int* __restrict__ sel,
                           float* __restrict__ wts, int t);


// The rows [s0, s1) of a shared expert (`srows` rows costing `cs` bytes each) that block `b` of
// `nb` takes, so that with the routed groups it gets round-robin (`groups` of `cr` bytes each:
// blocks below groups % nb one more) every block streams about the same bytes. Blocks with more
// routed groups take fewer shared rows; the shares are contiguous and cover [0, srows).
__device__ __forceinline__ void shared_share(int srows, float cs, int groups, float cr, int b, int nb, int& s0,
                                             int& s1) {
    const float per_block = ((float)groups * cr + (float)srows * cs) / (float)nb;
    const int base = groups / nb, extra = groups % nb;
    auto start = [&](int i) {
        if (i >= nb) return srows;
        const float routed = (float)(i * base + min(i, extra)) * cr;
        return max(0, min(srows, (int)(((float)i * per_block - routed) / cs)));
    };
    s0 = start(b);
    s1 = max(s0, start(b + 1));
}

// h[j] = silu(gate_e . x) * (up_e . x) for the k routed items j (e = sel[j]) and the shared
// expert (item k); T = 1. Routed groups of 16 rows go round-robin over the blocks (warps 0-3
// split the gate tile's chunks, warps 4-7 the up tile's; the next group's first loads are issued
// before the current one is reduced); the shared expert's rows are shared out so that every block
// streams about the same bytes (`shared_share`), one gate and up row per warp, on warps 1-7
// while warp 0 computes the top-k. Requires K % 128 == 0, K <= XS_MAX, NVFP4 routed gate/up, a
// BF16 shared expert (if any), 8 warps.
extern "C" __global__ void __launch_bounds__(256, 2) experts_gate_up_p(ExpertProj gate, ExpertProj up, ExpertProj sgate,
                                                                        ExpertProj sup, int has_shared, int shared_inter,
                                                                        int* sel_out, float* wts_out, int k,
                                                                        const float* __restrict__ x, float* __restrict__ h,
                                                                        int inter, int K, Route rt) {
    __shared__ uint2 xb[XS_MAX / 2];
    __shared__ float red[2][8][16];
    __shared__ int sel[64];
    __shared__ float wsel[64];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int width = max(inter, shared_inter);
    const int rgroups = (inter + 15) / 16;
    const int groups = k * rgroups;
    const int nc = K >> 7, part = warp & 3;
    const bool is_up = warp >= 4;
    const ExpertProj P = is_up ? up : gate;
    int s0 = 0, s1 = 0;
    if (has_shared) shared_share(shared_inter, 4.f * K, groups, 18.f * K, blockIdx.x, gridDim.x, s0, s1);
    pdl_enter();
    if (warp == 0) {
        if (rt.logits) {
            route_impl<8>(rt.logits, rt.bias, rt.n, k, rt.softmax, rt.normalize, rt.softcap, rt.scale, sel, wsel, 0);
            __syncwarp();
            if (blockIdx.x == 0 && lane < k) {
                sel_out[lane] = sel[lane];
                wts_out[lane] = wsel[lane];
            }
        } else {
            for (int i = lane; i < k; i += 32) sel[i] = sel_out[i];
        }
    } else {
        // this block's shared rows: one gate and one up row per warp and pass
        for (int o = s0 + warp - 1; o < s1; o += 7) {
            const RowSet rs = rowset(2, sgate.w, sgate.scales, o, 1, sup.w, sup.scales, o, 1, K);
            float a[2] = {0.f, 0.f};
            bf_rows<2, 1>(rs, K, x, 0, 1, a);
            const float gv = warp_sum(a[0]), uv = warp_sum(a[1]);
            if (lane == 0) h[(long)k * width + o] = gv / (1.0f + expf(-gv)) * uv;
        }
    }
    __syncthreads();
    // routed groups gi = blockIdx.x + it * gridDim.x; the first one's loads fly during the staging
    auto tile_of = [&](int gi, MmaTile<MMA_U>& m) {
        const int item = gi / rgroups;
        const long ob = (long)(gi % rgroups) * 16;
        const int nrows = (int)min(16l, (long)inter - ob);
        mma_start_group(m, P, (long)sel[item] * inter + ob, nrows, K, part * nc / 4, (part + 1) * nc / 4);
        return nrows;
    };
    MmaTile<MMA_U> m;
    int gi = blockIdx.x;
    int nrows = gi < groups ? tile_of(gi, m) : 0;
    const float ds = xb_fill(xb, x, K);
    for (int it = 0; gi < groups; it++) {
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        if (nrows > 0) m.run(xb, acc);
        const int item = gi / rgroups;
        const long ob = (long)(gi % rgroups) * 16;
        const int rows = nrows;
        gi += gridDim.x;
        nrows = gi < groups ? tile_of(gi, m) : 0;
        float (*rb)[16] = red[it & 1];
        float gv = mma_reduce(acc, rb, 4);  // warp 0: the gate rows (warps 0-3)
        if (warp == 0 && lane < rows) {
            const long e = sel[item];
            float uv = 0.f;
#pragma unroll
            for (int p = 0; p < 4; p++) uv += rb[4 + p][lane];
            gv *= 64.f * ds * gate.inv_g[e];
            uv *= 64.f * ds * up.inv_g[e];
            h[(long)item * width + ob + lane] = gv / (1.0f + expf(-gv)) * uv;
        }
    }
}

// The h rows of items its[0..n) (K = inter values each) as B entries at xb + j * K / 2 (row
// its[j]), each with its own power-of-two scale: ds[j] = 2^-e_j. The warps compute the rows'
// maxima (warp w: rows w, w + 8, ...), then all threads fill. Ends with a barrier.
__device__ void xb_fill_items(uint2* xb, float* ds, const float* __restrict__ h, int width, const int* its, int n,
                              int K) {
    __shared__ float sc[64];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (int j = warp; j < n; j += warps) {
        const float4* x4 = (const float4*)(h + (long)its[j] * width);
        float m = 0.f;
        for (int i = lane; i < K / 4; i += 32) {
            const float4 v = x4[i];
            m = fmaxf(m, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
        }
        m = warp_max(m);
        const int e = xb_exp(m);
        if (lane == 0) {
            sc[j] = pow2f(e);
            ds[j] = pow2f(-e);
        }
    }
    __syncthreads();
    const int no = K >> 3;
    for (int q = threadIdx.x; q < n * no; q += blockDim.x) {
        const int j = q / no, o = q % no;
        const float4* x4 = (const float4*)(h + (long)its[j] * width);
        xb_octet(xb + (long)j * (K / 2), o, x4[2 * o], x4[2 * o + 1], sc[j]);
    }
    __syncthreads();
}

#define XB_ITEMS_MAX 5120  // uint2 B entries for all routed items of experts_down_p (k * inter <= 10240)

// part[j, o] = w_j * down_{sel[j]}[o] . h[j] for the k routed items and (w = 1) the shared expert
// (item k); T = 1. Routed groups of 64 rows (4 tiles, 2 warps splitting each tile's chunks) go
// round-robin over the blocks, the next group's first loads issued before the current one is
// reduced; the shared expert's rows are shared out so that every block streams about the same
// bytes (`shared_share`), two rows per warp and pass. Requires inter % 128 == 0,
// k * inter <= 2 * XB_ITEMS_MAX, NVFP4 routed down, a BF16 shared expert (if any), 8 warps.
extern "C" __global__ void __launch_bounds__(256, 2) experts_down_p(ExpertProj down, ExpertProj sdown, int has_shared,
                                                                     int shared_inter, const int* __restrict__ sel,
                                                                     const float* __restrict__ wts, int k,
                                                                     const float* __restrict__ h, int inter,
                                                                     float* __restrict__ part, int H) {
    __shared__ uint2 xb[XB_ITEMS_MAX];
    __shared__ float ds[64];
    __shared__ float red[2][8][16];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int width = max(inter, shared_inter);
    const int rgroups = (H + 63) / 64;
    const int groups = k * rgroups;
    const int K = inter, nc = K >> 7, p = warp & 1, tile = warp >> 1;
    int s0 = 0, s1 = 0;
    if (has_shared) shared_share(H, 2.f * shared_inter, groups, 36.f * K, blockIdx.x, gridDim.x, s0, s1);
    pdl_enter();
    for (int o = s0 + 2 * warp; o < s1; o += 16) {
        const int nrows = min(2, s1 - o);
        const RowSet rs = rowset(2, sdown.w, sdown.scales, o, nrows, sdown.w, sdown.scales, 0, 0, shared_inter);
        float a[2] = {0.f, 0.f};
        bf_rows<2, 2>(rs, shared_inter, h + (long)k * width, 0, 1, a);
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float v = warp_sum(a[r]);
            if (lane == 0 && r < nrows) part[(long)k * H + o + r] = v;
        }
    }
    // routed groups gi = blockIdx.x + it * gridDim.x; the first one's loads fly during the staging
    auto tile_of = [&](int gi, MmaTile<MMA_U>& m) {
        const long ob = (long)(gi % rgroups) * 64 + tile * 16;
        const int nrows = (int)max(0l, min(16l, (long)H - ob));
        mma_start_group(m, down, (long)sel[gi / rgroups] * H + ob, nrows, K, p * nc / 2, (p + 1) * nc / 2);
        return nrows;
    };
    MmaTile<MMA_U> m;
    int gi = blockIdx.x;
    int nrows = gi < groups ? tile_of(gi, m) : 0;
    // only the items this block's groups use are staged (slot j: its[j]; groups ascend, so do
    // their items)
    __shared__ int its[64];
    int nits = 0;
    for (int g = blockIdx.x, last = -1; g < groups; g += gridDim.x) {
        const int item = g / rgroups;
        if (item != last) {
            if (threadIdx.x == 0) its[nits] = item;
            nits++;
            last = item;
        }
    }
    __syncthreads();
    xb_fill_items(xb, ds, h, width, its, nits, K);
    for (int it = 0, slot = 0; gi < groups; it++) {
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        const int item = gi / rgroups;
        while (slot + 1 < nits && its[slot] != item) slot++;
        if (nrows > 0) m.run(xb + (long)slot * (K / 2), acc);
        const long ob = (long)(gi % rgroups) * 64 + tile * 16;
        const int rows = nrows;
        gi += gridDim.x;
        nrows = gi < groups ? tile_of(gi, m) : 0;
        const float v = mma_reduce(acc, red[it & 1], 2);
        if (p == 0 && lane < rows) {
            const long e = sel[item];
            part[(long)item * H + ob + lane] = v * (64.f * ds[slot] * down.inv_g[e] * wts[item]);
        }
    }
}

// out[t, o] = resid[t, o] + sum_i part[t*k + i, o] (+ part[T*k + t, o]); in item order.
extern "C" __global__ void experts_reduce(const float* __restrict__ part, int k, int T, int has_shared, float* out,
                                         const float* resid, int H, Epi ep) {
    pdl_enter();
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (long)T * H) {
        const int t = i / H, o = i % H;
        float v = 0.f;
        for (int q = 0; q < k; q++) v += part[(long)(t * k + q) * H + o];
        if (has_shared) v += part[(long)(T * k + t) * H + o];
        out[i] = (resid ? resid[i] : 0.f) + v;
    }
    epilogue(ep);
}

// ---- synthetic data (benchmarks) --------------------------------------------------------------

__device__ __forceinline__ u32 hash32(u64 x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return (u32)x;
}

// mode 0: random bytes; 1: bf16 values in +-amp; 2: fp8 e4m3 scales (exponents 4..9, never NaN);
// 3: f32 in +-amp.
extern "C" __global__ void fill(void* p, long n, u64 seed, int mode, float amp) { pdl_enter();
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        u32 r = hash32(seed * 0x9E3779B97F4A7C15ull + (u64)i);
        if (mode == 0) {
            ((u8*)p)[i] = (u8)r;
        } else if (mode == 1) {
            float f = ((float)(r & 0xffffff) / 16777216.0f * 2.f - 1.f) * amp;
            ((u16*)p)[i] = f32_to_bf16(f);
        } else if (mode == 2) {
            ((u8*)p)[i] = (u8)(((4 + (r % 6)) << 3) | ((r >> 8) & 7));
        } else {
            ((float*)p)[i] = ((float)(r & 0xffffff) / 16777216.0f * 2.f - 1.f) * amp;
        }
    }
}

// ---- sampling ----------------------------------------------------------------------------------

#define SAMPLE_THREADS 1024
#define SAMPLE_K_MAX 256  // largest top_k sampled on the device (the host sorts beyond it)

// An unsigned key ordering floats ascending (NaN never reaches it: skipped by the callers).
__device__ __forceinline__ u32 order_key(float f) {
    const u32 b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Block-wide exclusive prefix sum of one int per thread (SAMPLE_THREADS threads); *total gets
// the sum.
__device__ int block_exclusive_scan(int v, int* total) {
    __shared__ int warp_tot[SAMPLE_THREADS / 32];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    int incl = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
    }
    __syncthreads();
    if (lane == 31) warp_tot[wid] = incl;
    __syncthreads();
    int before = 0, all = 0;
    for (int w = 0; w < SAMPLE_THREADS / 32; w++) {
        if (w < wid) before += warp_tot[w];
        all += warp_tot[w];
    }
    *total = all;
    return before + incl - v;
}

// The next token from logits[0, n) exactly as the host `Sampler` picks it with uniform draw `u`:
// greedy (temperature <= 0 or top_k == 1): the first index of the largest value; otherwise the
// top_k (2..SAMPLE_K_MAX) of the keys logit / temperature (f32) by (key desc, index asc), the
// softmax of (key - max) in f64 over them, cut to the shortest prefix whose sum reaches top_p,
// renormalised, and the first candidate whose cumulative probability exceeds u. NaN logits are
// never picked. One block of SAMPLE_THREADS threads; *out = the token.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS) sample_logits(const float* __restrict__ logits, int n,
                                                                     float temperature, int top_k, float top_p,
                                                                     double u, u32* out) {
    pdl_enter();
    const int tid = threadIdx.x;
    __shared__ u32 hist[256];
    __shared__ u32 s_prefix, s_mask;
    __shared__ int s_need;
    __shared__ float cand_key[SAMPLE_K_MAX];
    __shared__ int cand_idx[SAMPLE_K_MAX];
    __shared__ int s_count;
    const bool greedy = temperature <= 0.f || top_k == 1;
    if (greedy) {
        // first index of the largest value
        float best = __int_as_float(0xff800000);  // -inf
        int bi = 0x7fffffff;
        for (int i = tid; i < n; i += SAMPLE_THREADS) {
            const float v = logits[i];
            if (v > best) { best = v; bi = i; }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ob = __shfl_xor_sync(0xffffffffu, best, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ob > best || (ob == best && oi < bi)) { best = ob; bi = oi; }
        }
        __shared__ float wb[SAMPLE_THREADS / 32];
        __shared__ int wi[SAMPLE_THREADS / 32];
        if ((tid & 31) == 0) { wb[tid >> 5] = best; wi[tid >> 5] = bi; }
        __syncthreads();
        if (tid == 0) {
            float b = __int_as_float(0xff800000);
            int i0 = 0x7fffffff;
            for (int w = 0; w < SAMPLE_THREADS / 32; w++)
                if (wb[w] > b || (wb[w] == b && wi[w] < i0)) { b = wb[w]; i0 = wi[w]; }
            *out = i0 == 0x7fffffff ? 0u : (u32)i0;  // (all NaN or -inf: index 0, as the host)
        }
        return;
    }
    // Radix select (8 bits per pass, most significant first) of the top_k-th largest key.
    if (tid == 0) { s_prefix = 0; s_mask = 0; s_need = top_k; }
    int valid = 0;
    for (int i = tid; i < n; i += SAMPLE_THREADS) valid += !isnan(logits[i]);
    int n_valid;
    block_exclusive_scan(valid, &n_valid);
    const int k = min(top_k, n_valid);
    if (k == 0) {
        if (tid == 0) *out = 0;
        return;
    }
    if (tid == 0) s_need = k;
    __syncthreads();
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = tid; b < 256; b += SAMPLE_THREADS) hist[b] = 0;
        __syncthreads();
        const u32 prefix = s_prefix, mask = s_mask;
        for (int i = tid; i < n; i += SAMPLE_THREADS) {
            const float l = logits[i];
            if (isnan(l)) continue;
            const u32 key = order_key(l / temperature);
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255], 1u);
        }
        __syncthreads();
        if (tid == 0) {
            int need = s_need;
            int d = 255;
            for (; d > 0; d--) {
                if ((int)hist[d] >= need) break;
                need -= (int)hist[d];
            }
            s_need = need;  // how many of the keys with this digit are taken
            s_prefix = prefix | ((u32)d << shift);
            s_mask = mask | (255u << shift);
        }
        __syncthreads();
    }
    const u32 thr = s_prefix;     // the top_k-th largest key
    const int ties_taken = s_need;  // keys equal to it that are taken (lowest indices first)
    // Gather: every key above the threshold, and the first `ties_taken` equal to it by index
    // (each thread scans one contiguous range, so an ordered scan ranks the ties).
    if (tid == 0) s_count = 0;
    const int per = (n + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
    const int lo = min(n, tid * per), hi = min(n, lo + per);
    int ties = 0;
    for (int i = lo; i < hi; i++) {
        const float l = logits[i];
        if (!isnan(l) && order_key(l / temperature) == thr) ties++;
    }
    int total_ties;
    int rank = block_exclusive_scan(ties, &total_ties);
    __syncthreads();
    for (int i = lo; i < hi; i++) {
        const float l = logits[i];
        if (isnan(l)) continue;
        const float key = l / temperature;
        const u32 ok = order_key(key);
        bool take = ok > thr;
        if (ok == thr) take = rank++ < ties_taken;
        if (take) {
            const int slot = atomicAdd(&s_count, 1);
            if (slot < SAMPLE_K_MAX) { cand_key[slot] = key; cand_idx[slot] = i; }
        }
    }
    __syncthreads();
    // Order the k candidates by (key desc, index asc): each one's rank by counting.
    __shared__ float sorted_key[SAMPLE_K_MAX];
    __shared__ int sorted_idx[SAMPLE_K_MAX];
    if (tid < k) {
        const float kk = cand_key[tid];
        const u32 ok = order_key(kk);  // (total order, as the host's: -0 below +0)
        const int ki = cand_idx[tid];
        int r = 0;
        for (int j = 0; j < k; j++) {
            const u32 oj = order_key(cand_key[j]);
            r += (oj > ok) || (oj == ok && cand_idx[j] < ki);
        }
        sorted_key[r] = kk;
        sorted_idx[r] = ki;
    }
    __syncthreads();
    if (tid == 0) {
        const float mx = sorted_key[0];
        double p[SAMPLE_K_MAX];
        double total = 0.0;
        for (int i = 0; i < k; i++) {
            p[i] = exp((double)(sorted_key[i] - mx));
            total += p[i];
        }
        for (int i = 0; i < k; i++) p[i] /= total;
        int keep = k;
        if (top_p < 1.f) {
            double acc = 0.0;
            for (int i = 0; i < k; i++) {
                acc += p[i];
                if (acc >= (double)top_p) { keep = i + 1; break; }
            }
            double t2 = 0.0;
            for (int i = 0; i < keep; i++) t2 += p[i];
            for (int i = 0; i < keep; i++) p[i] /= t2;
        }
        double acc = 0.0;
        int pick = keep - 1;
        for (int i = 0; i < keep; i++) {
            acc += p[i];
            if (u < acc) { pick = i; break; }
        }
        *out = (u32)sorted_idx[pick];
    }
}
