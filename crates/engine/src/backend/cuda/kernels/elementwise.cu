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

// rms_norm's arithmetic for a row held in registers (width % 4 == 0, width <= 4 * EPI_V *
// blockDim): slot q of a thread holds values [4 (threadIdx.x + q blockDim.x), + 4) of the
// normed row (zeros past `width`), also written to o. All threads of the block call it.
__device__ __forceinline__ void rms_norm_regs(const float* g, const float* __restrict__ w, float* o, int width,
                                              float eps, float4 (&out)[EPI_V]) {
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
        out[q] = make_float4(wv[q].x * (v[q].x * r), wv[q].y * (v[q].y * r), wv[q].z * (v[q].z * r),
                             wv[q].w * (v[q].w * r));
        if (i < width) *(float4*)(o + i) = out[q];
    }
}

// One block per group of `width` values: y = x * rsqrt(mean(x^2) + eps) * w.
extern "C" __global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
                                   int width, float eps) {
    pdl_enter();
    const float* g = x + (long)blockIdx.x * width;
    float* o = y + (long)blockIdx.x * width;
    if ((width & 3) == 0 && width <= 4 * EPI_V * (int)blockDim.x) {
        float4 v[EPI_V];
        rms_norm_regs(g, w, o, width, eps, v);
        return;
    }
    float ss = 0.f;
    for (int i = threadIdx.x; i < width; i += blockDim.x) ss += g[i] * g[i];
    ss = block_sum(ss);
    const float r = 1.0f / sqrtf(ss / (float)width + eps);
    for (int i = threadIdx.x; i < width; i += blockDim.x) o[i] = w[i] * (g[i] * r);
}

// rms_norm of a decode step's rows (one block a row, rms_norm's block size: the same bits)
// that also stages each normed row for gemv_mt, as xb_stage would from y: NVFP4 weights' B
// entries at xb_nv + r K / 2 with ds_nv[r] (xb_fill's scale, from the row's max |y| in the
// registers), bf16 weights' at xb_bf + r 3 K / 4 with ds_bf[r] = 1; a null xb_* skips that
// format. Each staged entry is a function of y's values and the row's scale alone, so which
// thread writes it changes no bit. K % 128 == 0 (a warp's float4s all in or all past the row),
// K <= 4 * EPI_V * blockDim. norm_stage_row is that work for row r by the calling block (all of
// its threads); norm_stage runs it one block a row, experts_reduce_norm_stage after its sum.
__device__ __forceinline__ void norm_stage_row(const float* x, const float* __restrict__ w, float* __restrict__ y,
                                               int K, float eps, uint2* __restrict__ xb_nv, float* __restrict__ ds_nv,
                                               uint2* __restrict__ xb_bf, float* __restrict__ ds_bf, long r) {
    float4 v[EPI_V];
    rms_norm_regs(x + r * K, w, y + r * K, K, eps, v);
    if (xb_nv) {
        float m = 0.f;
#pragma unroll
        for (int q = 0; q < EPI_V; q++)
            m = fmaxf(m, fmaxf(fmaxf(fabsf(v[q].x), fabsf(v[q].y)), fmaxf(fabsf(v[q].z), fabsf(v[q].w))));
        const int e = xb_exp(block_max(m));
        const float sc = pow2f(e);
        uint2* xr = xb_nv + r * (K / 2);
#pragma unroll
        for (int q = 0; q < EPI_V; q++) {
            // octet o = float4s 2 o (an even lane's) and 2 o + 1 (the next lane's)
            const int f = threadIdx.x + q * (int)blockDim.x;
            const float4 b = make_float4(__shfl_down_sync(0xffffffffu, v[q].x, 1), __shfl_down_sync(0xffffffffu, v[q].y, 1),
                                         __shfl_down_sync(0xffffffffu, v[q].z, 1), __shfl_down_sync(0xffffffffu, v[q].w, 1));
            if ((f & 1) == 0 && 4 * f < K) xb_octet_at<true>(xr, f >> 1, v[q], b, sc);
        }
        if (threadIdx.x == 0) ds_nv[r] = pow2f(-e);
    }
    if (xb_bf) {
        uint2* xr = xb_bf + r * (3 * K / 4);
#pragma unroll
        for (int q = 0; q < EPI_V; q++) {
            const int col = 4 * (threadIdx.x + q * (int)blockDim.x);
            if (col < K) xb_bf_store(xr, col, v[q]);
        }
        if (threadIdx.x == 0) ds_bf[r] = 1.f;
    }
}

extern "C" __global__ void __launch_bounds__(512) norm_stage(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
                                     int K, float eps, uint2* __restrict__ xb_nv, float* __restrict__ ds_nv,
                                     uint2* __restrict__ xb_bf, float* __restrict__ ds_bf) {
    pdl_enter();
    norm_stage_row(x, w, y, K, eps, xb_nv, ds_nv, xb_bf, ds_bf, blockIdx.x);
}

#define RNW_V 4  // float4s of a group per lane in rms_norm_warp (width <= 128 * RNW_V)

// rms_norm's arithmetic for narrow groups (per-head q/k norms: width % 4 == 0, width <=
// 128 * RNW_V): one warp per group, 8 groups per block of 256, `groups` in all. A block per
// 128-value head (rms_norm) kept 32 of its threads busy and took 256 us for a 2,048-token q of
// 64 heads on the H200.
// A warp's group of `width` values at xr normed in registers (rms_norm's formula, w the weight):
// lane slot q holds values 4 (lane + 32 q) .. + 4 (zeros past width). The arithmetic of
// rms_norm_warp and norm_rope, so both give the same bits.
__device__ __forceinline__ void warp_norm_regs(const float* xr, const float* __restrict__ w, int width, float eps,
                                               int lane, float4 (&v)[RNW_V]) {
    float ss = 0.f;
#pragma unroll
    for (int q = 0; q < RNW_V; q++) {
        const int i = 4 * (lane + 32 * q);
        v[q] = i < width ? *(const float4*)(xr + i) : make_float4(0.f, 0.f, 0.f, 0.f);
        ss += v[q].x * v[q].x + v[q].y * v[q].y + v[q].z * v[q].z + v[q].w * v[q].w;
    }
    ss = warp_sum(ss);
    const float r = 1.0f / sqrtf(ss / (float)width + eps);
#pragma unroll
    for (int q = 0; q < RNW_V; q++) {
        const int i = 4 * (lane + 32 * q);
        if (i < width) {
            const float4 wv = __ldg((const float4*)(w + i));
            v[q] = make_float4(wv.x * (v[q].x * r), wv.y * (v[q].y * r), wv.z * (v[q].z * r), wv.w * (v[q].w * r));
        }
    }
}

extern "C" __global__ void __launch_bounds__(256) rms_norm_warp(const float* __restrict__ x, const float* __restrict__ w,
                                                               float* __restrict__ y, int width, float eps,
                                                               long groups) {
    pdl_enter();
    const long g = (long)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (g >= groups) return;
    const int lane = threadIdx.x & 31;
    float* yr = y + g * width;
    float4 v[RNW_V];
    warp_norm_regs(x + g * width, w, width, eps, lane, v);
#pragma unroll
    for (int q = 0; q < RNW_V; q++) {
        const int i = 4 * (lane + 32 * q);
        if (i < width) *(float4*)(yr + i) = v[q];
    }
}

#define NG_SLOTS 16  // 16-byte weight loads per lane of a row in norm_gemv_bf16 (K <= 32 * 8 * NG_SLOTS)
#define NG_WARPS 4
#define NG_ROWS 4     // most tokens of norm_gemv_bf16
#define NG_XS 8192    // most normed values norm_gemv_bf16 holds (tokens * K)

// y[t] = W . xn[t] for each of `rows` tokens (at most NG_ROWS), xn[t] = nw * (x[t] * rsqrt(mean(
// x[t]^2) + eps)) (the rms_norm kernel's formula): the norm feeding a small BF16 GEMV (the MoE
// router) in the same launch. One row of W per warp, NG_WARPS warps per block; each warp's whole
// row is loaded before the wait (weights are never written by kernels), so the loads overlap the
// previous kernel, and each load serves every token. Every block normalises the tokens itself;
// block 0 also writes xn (the experts' input). Each token's arithmetic is that of one token
// alone (the same bits at any `rows`). Requires K % 256 == 0, K <= 256 * NG_SLOTS,
// rows * K <= NG_XS.
extern "C" __global__ void __launch_bounds__(NG_WARPS * 32) norm_gemv_bf16(const u16* __restrict__ w,
                                                                         const float* __restrict__ x,
                                                                         const float* __restrict__ nw, float eps,
                                                                         float* __restrict__ xn, float* __restrict__ y,
                                                                         int N, int K, int rows) {
    __shared__ float4 xs[NG_XS / 4];
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
    const int n4 = K >> 2;
    for (int t = 0; t < rows; t++) {
        const float4* x4 = (const float4*)(x + (long)t * K);
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
                xs[t * n4 + i] = o;
                if (blockIdx.x == 0) ((float4*)(xn + (long)t * K))[i] = o;
            }
        }
    }
    __syncthreads();
    if (row >= N) return;
    for (int t = 0; t < rows; t++) {
        const float4* xt = xs + t * n4;
        float acc = 0.f;
#pragma unroll
        for (int j = 0; j < NG_SLOTS; j++) {
            if (j < slots) {
                const int i = lane + 32 * j;  // elements 8 i .. 8 i + 7
                acc += dot_bf16x8(wv[j], xt[2 * i], xt[2 * i + 1]);
            }
        }
        acc = warp_sum(acc);
        if (lane == 0) y[(long)t * N + row] = acc;
    }
}

#define ROPE_HALF_MAX 256  // most rotated pairs per head (rdim <= 512)

// Per-head RMSNorm (w: its weight; null: none) then NeoX rotation within the first `rdim` dims,
// in place, of x rows [T, heads * hd], row t at position pos0 + t (a prompt chunk's q or k). One
// block of 256 threads per row: the row's cos and sin (f64 trigonometry of the f32 angle, times
// attn_factor) once into shared memory, then each warp takes whole heads: rms_norm_warp's norm
// (warp_norm_regs: the same bits as that kernel's output), the normed head into the warp's
// shared buffer, then each dim rotated from there (consecutive lanes on consecutive dims). One
// pass over the rows instead of rms_norm_warp's and a rope pass's (a 2,048-token q of 64 heads:
// 67 MB read and written once less). hd % 4 == 0, hd <= 128 * RNW_V, rdim / 2 <= ROPE_HALF_MAX.
// (A block per head and row recomputed the table for every head and took 160 us for that q on
// the H200.)
extern "C" __global__ void __launch_bounds__(256) norm_rope(float* x, const float* __restrict__ w, float eps,
                                                           const float* __restrict__ inv_freq, int heads, int hd,
                                                           int rdim, float attn_factor, int pos0) {
    __shared__ float cs[ROPE_HALF_MAX], sn[ROPE_HALF_MAX];
    __shared__ __align__(16) float hb[8][128 * RNW_V];
    pdl_enter();
    const int half = rdim / 2;
    const int t = blockIdx.x;
    for (int j = threadIdx.x; j < half; j += blockDim.x) {
        const float ang = (float)(pos0 + t) * inv_freq[j];
        cs[j] = (float)cos((double)ang) * attn_factor;
        sn[j] = (float)sin((double)ang) * attn_factor;
    }
    __syncthreads();
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    float* own = hb[wid];
    for (int h = wid; h < heads; h += 8) {
        float* xr = x + ((long)t * heads + h) * hd;
        float4 v[RNW_V];
        if (w) {
            warp_norm_regs(xr, w, hd, eps, lane, v);
        } else {
#pragma unroll
            for (int q = 0; q < RNW_V; q++) {
                const int i = 4 * (lane + 32 * q);
                v[q] = i < hd ? *(const float4*)(xr + i) : make_float4(0.f, 0.f, 0.f, 0.f);
            }
        }
#pragma unroll
        for (int q = 0; q < RNW_V; q++) {
            const int i = 4 * (lane + 32 * q);
            if (i < hd) *(float4*)(own + i) = v[q];
        }
        __syncwarp();
        for (int i = lane; i < hd; i += 32) {
            float o = own[i];
            if (i < half) {
                const float x1 = own[i], x2 = own[i + half];
                o = x1 * cs[i] - x2 * sn[i];
            } else if (i < rdim) {
                const int j = i - half;
                const float x1 = own[j], x2 = own[i];
                o = x2 * cs[j] + x1 * sn[j];
            }
            xr[i] = o;
        }
        __syncwarp();
    }
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

// Whether both pointers are 16-byte aligned (float4 access).
__device__ __forceinline__ bool aligned16(const void* a, const void* b) {
    return (((unsigned long long)a | (unsigned long long)b) & 15ull) == 0;
}

// x[t, j] *= softplus(gate[t, j / group]) ; n = rows * cols of x. Four values per thread (grid
// ceil(n / 4 / blockDim)): with group % 4 == 0 and x aligned they share one gate value and move
// as one float4.
extern "C" __global__ void softplus_gate(float* x, const float* __restrict__ gate, long n, int group) {
    pdl_enter();
    const long i = 4 * ((long)blockIdx.x * blockDim.x + threadIdx.x);
    if (i >= n) return;
    if ((group & 3) == 0 && (n & 3) == 0 && aligned16(x, x)) {
        const float s = softplus(gate[i / group]);
        float4 v = *(float4*)(x + i);
        v.x *= s;
        v.y *= s;
        v.z *= s;
        v.w *= s;
        *(float4*)(x + i) = v;
        return;
    }
    for (long e = i; e < i + 4 && e < n; e++) x[e] *= softplus(gate[e / group]);
}

extern "C" __global__ void silu_mul(const float* __restrict__ g, const float* __restrict__ u, float* __restrict__ y,
                                   long n) { pdl_enter();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = silu_times(g[i], u[i]);
    }
}

// silu_mul of row blockIdx.x (K values of g and u), staged for a bf16 gemv_mt as xb_stage would
// stage silu_mul's output: B entries at xb_bf + r 3 K / 4, ds_bf[r] = 1 (each entry a function of
// its four values alone: the bits of silu_mul, then xb_stage). K % 128 == 0.
extern "C" __global__ void silu_mul_stage(const float* __restrict__ g, const float* __restrict__ u, int K,
                                          uint2* __restrict__ xb_bf, float* __restrict__ ds_bf) {
    pdl_enter();
    const long r = blockIdx.x;
    uint2* xr = xb_bf + r * (3 * K / 4);
    for (int col = 4 * threadIdx.x; col < K; col += 4 * blockDim.x) {
        const float4 a = __ldg((const float4*)(g + r * K + col)), b = __ldg((const float4*)(u + r * K + col));
        const float4 v =
            make_float4(silu_times(a.x, b.x), silu_times(a.y, b.y), silu_times(a.z, b.z), silu_times(a.w, b.w));
        xb_bf_store(xr, col, v);
    }
    if (threadIdx.x == 0) ds_bf[r] = 1.f;
}

// y = x * alpha + y over n values, four per thread (grid ceil(n / 4 / blockDim); float4 where
// both are aligned and n % 4 == 0).
extern "C" __global__ void add_scaled(float* y, float alpha, const float* __restrict__ x, long n) {
    pdl_enter();
    const long i = 4 * ((long)blockIdx.x * blockDim.x + threadIdx.x);
    if (i >= n) return;
    if ((n & 3) == 0 && aligned16(x, y)) {
        const float4 a = *(const float4*)(x + i);
        float4 b = *(float4*)(y + i);
        b.x = a.x * alpha + b.x;
        b.y = a.y * alpha + b.y;
        b.z = a.z * alpha + b.z;
        b.w = a.w * alpha + b.w;
        *(float4*)(y + i) = b;
        return;
    }
    for (long e = i; e < i + 4 && e < n; e++) y[e] = x[e] * alpha + y[e];
}
