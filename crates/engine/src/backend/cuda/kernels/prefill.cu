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
