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
// With `kt` (a paged cache's block table: the KV append fused in): the k heads' blocks also write
// their rotated row into cache slot `slot` (row width kv_heads * hd), and kv_heads more blocks
// write v's.
extern "C" __global__ void qk_norm_rope(float* q, float* k, const float* __restrict__ qn, const float* __restrict__ kn,
                                       int heads, int hd, float eps, const float* __restrict__ inv_freq, int rdim,
                                       float attn_factor, int pos, const u64* __restrict__ kt,
                                       const float* __restrict__ v, long slot, int kv_heads, int kv_t, float ks,
                                       float vs) {
    pdl_enter();
    const int i = threadIdx.x;
    const long rb = (long)kv_heads * hd * (kv_t == 2 ? 2 : kv_t == 1 ? 1 : 4);  // bytes per cache row
    if ((int)blockIdx.x >= heads + kv_heads) {
        const int hv = blockIdx.x - heads - kv_heads;
        if (i < hd) kv_store(kv_row<u8>(kt, slot, rb, 1), (long)hv * hd + i, v[(long)hv * hd + i], kv_t, vs);
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
        if (kt && !isq) kv_store(kv_row<u8>(kt, slot, rb, 0), (long)(blockIdx.x - heads) * hd + i, out, kv_t, ks);
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
