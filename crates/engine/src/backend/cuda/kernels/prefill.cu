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

// ---- multi-token linear on tensor cores (prefill, batched steps) -----------------------------
//
// C = W · Xᵀ with mma.m16n8k16 (f32 accumulation): the weights are A (output rows = M), the
// tokens' activations are B (tokens = N). Two number formats, chosen per launch:
// - bf16 weights (and NVFP4 ones where the f16 path is not taken): A in bf16 exactly (an NVFP4
//   weight is e2m1 * e4m3, at most 6 significant bits; the decodes of common.cu give it times
//   2^-22, which the epilogue's nv_gscale restores with the global scale); the f32 activations as
//   three bf16 parts, x = hi + mid + lo (each the bf16 of what the previous ones leave: 24
//   significant bits, as many as f32 has), each multiplied into the same accumulators.
// - NVFP4 weights on sm_89+ with the rows' scales given (`xds`, row_pow2): the arithmetic of the
//   one-token tensor-core GEMV (gemv_mma): A in f16 as e2m1 * e4m3 * 2^-6 (exact, nv_word_h2:
//   a few integer instructions and one f16 multiply per pair instead of the f32 decode), x scaled
//   by the power of two 2^e that puts its row's max|x| in [2^14, 2^15) and entered as two f16
//   parts, hi + lo (~22 significant bits); the epilogue multiplies by 2^6 * 2^-e and the global
//   scale. Within each 8 columns the k order is 0, 2, 4, 6, 1, 3, 5, 7 for both operands
//   (nv_word_h2's pairs), which a dot product does not see. Two parts instead of three and the
//   cheap decode: a 2,048-token prefill of lean Laguna-XS in 176 ms instead of 210 (the H200,
//   2026-12-04; docs/performance.md). Splitting x once per row beforehand instead of in every
//   block measured no faster there (176.7 vs 175.5 ms) and was not kept.
// Either way a product differs from f32's only by the accumulation order (and, on the f16 path,
// x's last two bits).
//
// A block computes GT_BM weight rows x GT_BN tokens, 8 warps as 4 (rows) x 2 (tokens), each
// 32 x 32 (2 x 4 mma tiles). Per K step of GT_BK = 32 (one NVFP4 row chunk: 16 bytes, 2 scales)
// every thread decodes half a weight row (16 values) and splits 8 activations of one token, into
// one of two shared-memory stages (register staged: the next step's global loads are in flight
// while the tensor cores work on the current stage; one barrier per step). A shared row is 64
// bytes, four 16-byte chunks stored at chunk ^ ((row >> 1) & 3), so that ldmatrix's eight row
// reads of one chunk hit eight distinct bank groups.
// The token rows may be gathered: the caller points each thread at its token's row (a MoE
// expert's tokens).

#define GT_BM 128
#define GT_BN 64
#define GT_BK 32

struct GtStage {
    u16 w[GT_BM][GT_BK];
    u16 x[3][GT_BN][GT_BK];  // hi, mid, lo parts (the f16 path: hi, lo)
};

// The swizzled offset (in bf16) of 16-byte chunk c of shared row r.
__device__ __forceinline__ int gt_at(int r, int c) { return 8 * (c ^ ((r >> 1) & 3)); }




// One thread's share of a K step: half a weight row (16 values from k0 + 16 * half) and 8
// activations of one token (k0 + 8 * part ..). The weights are loaded PF steps ahead (they come
// from DRAM; gt_mainloop's parameter), the activations one step ahead (they are small and stay
// in L2; two steps ahead with at most 128 registers a thread made 4-row decode steps ~8% faster
// but the grouped experts ~20% slower: the H200, 2026-12-02).
struct GtW {
    uint4 w0, w1;  // NVFP4: w0.x, w0.y = 16 codes, w0.z = the scale byte; bf16: 16 values
};
struct GtX {
    float4 xa, xb;
};

// K steps of weight loads in flight per thread (a ring of registers) in the GEMM of a few
// tokens: its K steps have little tensor-core work to hide a load behind. Prefill tiles keep 1:
// with 4 in every launch, 2K-token prefill measured 8,247 tok/s against 9,736 with 1 (the H200,
// serve; registers and so occupancy the likely cause, not profiled).
#define GT_PF_DEEP 4

// Where a thread loads from: its weight row (null: outside the matrix, zeros) and token row.
struct GtSrc {
    const u8* wrow;      // the row's bytes (NVFP4 packed codes, or bf16 values)
    const u8* srow;      // NVFP4: the row's block scales
    const float* xrow;   // the token's activations (null: past the block's tokens, zeros)
    float xs;            // the f16 path: 2^e of the token's row (1 past the block's tokens)
    int fmt;
    int half, part;
};

// The f16 path's factor 2^e of a row whose row_pow2 scale is ds = 2^-e (exact: powers of two).
__device__ __forceinline__ float gt_row_xs(const float* __restrict__ xds, long row) { return 1.f / __ldg(xds + row); }

__device__ __forceinline__ void gt_load_w(const GtSrc& s, int k0, GtW& l) {
    if (s.wrow) {
        const int k = k0 + 16 * s.half;
        if (s.fmt == 3) {
            const uint2 q = __ldg((const uint2*)(s.wrow + k / 2));
            l.w0 = make_uint4(q.x, q.y, __ldg(s.srow + k / 16), 0u);
        } else {
            const uint4* p = (const uint4*)(s.wrow + 2 * (long)k);
            l.w0 = __ldg(p);
            l.w1 = __ldg(p + 1);
        }
    } else {
        l.w0 = make_uint4(0u, 0u, 0u, 0u);
        l.w1 = l.w0;
    }
}

__device__ __forceinline__ void gt_load_x(const GtSrc& s, int k0, GtX& l) {
    if (s.xrow) {
        const float4* p = (const float4*)(s.xrow + k0 + 8 * s.part);
        l.xa = __ldg(p);
        l.xb = __ldg(p + 1);
    } else {
        l.xa = make_float4(0.f, 0.f, 0.f, 0.f);
        l.xb = l.xa;
    }
}

template <bool H16>
__device__ __forceinline__ void gt_store(const GtSrc& s, const GtW& lw, const GtX& l, GtStage& st, int wr, int xr) {
    if (H16) {  // NVFP4 on f16 tensor cores: see the section's head
        u32 p[4], q[4];
        const u32 s2 = __byte_perm(e4m3x2_h2(lw.w0.z), 0, 0x1010);
        nv_word_h2(lw.w0.x, s2, p);
        nv_word_h2(lw.w0.y, s2, q);
        *(uint4*)&st.w[wr][gt_at(wr, 2 * s.half)] = make_uint4(p[0], p[1], p[2], p[3]);
        *(uint4*)&st.w[wr][gt_at(wr, 2 * s.half + 1)] = make_uint4(q[0], q[1], q[2], q[3]);
        // x * 2^e in the pairs (0, 2), (4, 6), (1, 3), (5, 7), high parts and remainders
        float v[8] = {l.xa.x * s.xs, l.xa.z * s.xs, l.xb.x * s.xs, l.xb.z * s.xs,
                      l.xa.y * s.xs, l.xa.w * s.xs, l.xb.y * s.xs, l.xb.w * s.xs};
        u32 hi[4], lo[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            hi[i] = f16x2_split(v[2 * i], v[2 * i + 1]);
            lo[i] = f16x2_rn(v[2 * i], v[2 * i + 1]);
        }
        *(uint4*)&st.x[0][xr][gt_at(xr, s.part)] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
        *(uint4*)&st.x[1][xr][gt_at(xr, s.part)] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
        return;
    }
    uint4 a, b;
    if (s.fmt == 3) {
        float f[8], g[8];
        e2m1x8(lw.w0.x, f);
        e2m1x8(lw.w0.y, g);
        const float sc = e4m3x2(lw.w0.z).x;
        a = make_uint4(bf16x2_rn(f[0] * sc, f[1] * sc), bf16x2_rn(f[2] * sc, f[3] * sc),
                       bf16x2_rn(f[4] * sc, f[5] * sc), bf16x2_rn(f[6] * sc, f[7] * sc));
        b = make_uint4(bf16x2_rn(g[0] * sc, g[1] * sc), bf16x2_rn(g[2] * sc, g[3] * sc),
                       bf16x2_rn(g[4] * sc, g[5] * sc), bf16x2_rn(g[6] * sc, g[7] * sc));
    } else {
        a = lw.w0;
        b = lw.w1;
    }
    *(uint4*)&st.w[wr][gt_at(wr, 2 * s.half)] = a;
    *(uint4*)&st.w[wr][gt_at(wr, 2 * s.half + 1)] = b;
    const float v[8] = {l.xa.x, l.xa.y, l.xa.z, l.xa.w, l.xb.x, l.xb.y, l.xb.z, l.xb.w};
    u32 p[4][3];
#pragma unroll
    for (int i = 0; i < 4; i++) bf16x2_parts(v[2 * i], v[2 * i + 1], p[i]);
#pragma unroll
    for (int part = 0; part < 3; part++)
        *(uint4*)&st.x[part][xr][gt_at(xr, s.part)] = make_uint4(p[0][part], p[1][part], p[2][part], p[3][part]);
}

// The tensor-core work of one K step on stage `st`: the warp's 32 rows times its tokens, in
// 8-token column groups; groups at or past `tn` (the tile's tokens) are skipped (warp-uniform:
// a decode step's few tokens, or an expert's few items, cost only the groups they fill).
template <bool H16>
__device__ __forceinline__ void gt_step(const GtStage& st, int tn, float acc[2][4][4]) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int wm = warp & 3, wn = warp >> 2;
    if (32 * wn >= tn) return;  // none of this warp's tokens
#pragma unroll
    for (int kc = 0; kc < GT_BK / 8; kc += 2) {  // 16 of K: chunks kc, kc + 1
        u32 a[2][4];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int r = 32 * wm + 16 * i + (lane & 15);
            ldsm_x4(a[i], smem_u32(&st.w[r][gt_at(r, kc + (lane >> 4))]));
        }
#pragma unroll
        for (int jj = 0; jj < 2; jj++) {
            const int t0 = 32 * wn + 16 * jj;  // the first token of this pair of column groups
            if (t0 >= tn) continue;
            const bool both = t0 + 8 < tn;
            const int tok = t0 + (lane & 7) + ((lane >> 4) << 3);
            const int at = gt_at(tok, kc + ((lane >> 3) & 1));
#pragma unroll
            for (int part = 0; part < (H16 ? 2 : 3); part++) {
                u32 b[4];
                ldsm_x4(b, smem_u32(&st.x[part][tok][at]));
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    if (H16) {
                        mma16816(acc[i][2 * jj], a[i][0], a[i][1], a[i][2], a[i][3], b[0], b[1]);
                        if (both) mma16816(acc[i][2 * jj + 1], a[i][0], a[i][1], a[i][2], a[i][3], b[2], b[3]);
                    } else {
                        mma_bf16(acc[i][2 * jj], a[i], b[0], b[1]);
                        if (both) mma_bf16(acc[i][2 * jj + 1], a[i], b[2], b[3]);
                    }
                }
            }
        }
    }
}

// The block's GT_BM x GT_BN product over K (K % 32 == 0) into acc (warp tile: rows
// 32 * (warp & 3) + 16 i + (g, g + 8), tokens 32 * (warp >> 2) + 8 j + 2 t + (0, 1)); only the
// first `tn` tokens are computed (the others' accumulators stay 0). `s` is this thread's source
// (weight row tid / 2, token row tid / 4); `smem` holds two stages. Ends with a barrier (the
// stages may then be reused). PF: K steps of weights in flight; H16: the f16 path (NVFP4 weights,
// s.xs set; block-uniform).
template <int PF, bool H16>
__device__ __forceinline__ void gt_mainloop_t(const GtSrc& s, int K, int tn, GtStage* smem, float acc[2][4][4]) {
    const int tid = threadIdx.x;
    const int wr = tid >> 1, xr = tid >> 2;
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[i][j][c] = 0.f;
    // weights of step n live in wq[n % PF] from their load until their store
    GtW wq[PF];
#pragma unroll
    for (int d = 0; d < PF; d++)
        if (d * GT_BK < K) gt_load_w(s, d * GT_BK, wq[d]);
    GtX xq;
    gt_load_x(s, 0, xq);
    gt_store<H16>(s, wq[0], xq, smem[0], wr, xr);
    if (PF * GT_BK < K) gt_load_w(s, PF * GT_BK, wq[0]);
    __syncthreads();
    int stage = 0;
    for (int k0 = 0; k0 < K; k0 += PF * GT_BK) {
#pragma unroll
        for (int d = 0; d < PF; d++) {
            const int kk = k0 + d * GT_BK;
            if (kk >= K) break;
            const bool more = kk + GT_BK < K;
            if (more) gt_load_x(s, kk + GT_BK, xq);
            gt_step<H16>(smem[stage], tn, acc);
            if (more) {
                GtW& w = wq[(d + 1) % PF];
                gt_store<H16>(s, w, xq, smem[stage ^ 1], wr, xr);
                const int kn = kk + GT_BK + PF * GT_BK;
                if (kn < K) gt_load_w(s, kn, w);
            }
            __syncthreads();
            stage ^= 1;
        }
    }
}

template <int PF>
__device__ __forceinline__ void gt_mainloop(const GtSrc& s, bool h16, int K, int tn, GtStage* smem, float acc[2][4][4]) {
    if (h16)
        gt_mainloop_t<PF, true>(s, K, tn, smem, acc);
    else
        gt_mainloop_t<PF, false>(s, K, tn, smem, acc);
}

// The factor of a row sum of gt_mainloop's accumulators: the global scale of `fmt`'s weights
// (`inv_g`) with the decodes' power of two: on the f16 path 2^6 (and the row's 2^-e, applied
// separately).
__device__ __forceinline__ float gt_gscale(int fmt, float inv_g, bool h16) { return h16 ? 64.f * inv_g : nv_gscale(fmt, inv_g); }

// f(row, token, value) for each of this thread's accumulators after gt_mainloop (row and token
// within the block's GT_BM x GT_BN tile).
template <class F>
__device__ __forceinline__ void gt_each(const float acc[2][4][4], F f) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, tq = lane & 3, wm = warp & 3, wn = warp >> 2;
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int c = 0; c < 4; c++)
                f(32 * wm + 16 * i + g + 8 * (c >> 1), 32 * wn + 8 * j + 2 * tq + (c & 1), acc[i][j][c]);
}

#define SK_AHEAD 8  // splits' partial sums in flight a thread in splitk_last_sum

// The epilogue of a K split's sum v of output (t, o) (idx = t * N + o): times s (the global
// scale, times the row's xds on the f16 path), then the bias, then the residual; in this order
// wherever splits are added (gemm_splitk_reduce, splitk_last_sum), so both give the same bits.
__device__ __forceinline__ float splitk_epilogue(float v, float s, const float* __restrict__ bias, long o,
                                                 const float* resid, long idx) {
    v *= s;
    if (bias) v += bias[o];
    if (resid) v += resid[idx];
    return v;
}

// splitk_last_sum's sums, V values of a row a thread (4: a float4, every row 16-byte aligned).
template <int V>
__device__ __forceinline__ void splitk_tile_sum(const float* part, int splits, float* y, const float* __restrict__ bias,
                                                const float* resid, float gs, const float* __restrict__ xds, int N,
                                                int T, long r0, int rows, long t0, int toks) {
    const long n = (long)N * T;
    const int g = rows / V;
    for (int i = threadIdx.x; i < g * toks; i += blockDim.x) {
        const long t = t0 + i / g, o = r0 + V * (i % g), idx = t * N + o;
        float v[V];
#pragma unroll
        for (int e = 0; e < V; e++) v[e] = 0.f;
        for (int z0 = 0; z0 < splits; z0 += SK_AHEAD) {
            float p[SK_AHEAD][V];
#pragma unroll
            for (int q = 0; q < SK_AHEAD; q++) {
                if (z0 + q >= splits) continue;
                const float* src = part + (z0 + q) * n + idx;
                if (V == 4) {
                    const float4 f = ld_cg4(src);
                    p[q][0] = f.x;
                    p[q][V > 1 ? 1 : 0] = f.y;
                    p[q][V > 2 ? 2 : 0] = f.z;
                    p[q][V > 3 ? 3 : 0] = f.w;
                } else {
                    p[q][0] = ld_cg(src);
                }
            }
#pragma unroll
            for (int q = 0; q < SK_AHEAD; q++)
                if (z0 + q < splits)
#pragma unroll
                    for (int e = 0; e < V; e++) v[e] += p[q][e];
        }
        const float s = xds ? gs * xds[t] : gs;
#pragma unroll
        for (int e = 0; e < V; e++) y[idx + e] = splitk_epilogue(v[e], s, bias, o + e, resid, idx + e);
    }
}

// The end of one block of a K-split GEMM (gemm_mma, gemm_h16) given tickets: its raw sums of the
// tile (rows r0 .. r0 + bm of N, tokens t0 .. t0 + bn of T) are written to part[blockIdx.z]. The
// last of the tile's gridDim.z splits to finish (`ticket`: zero between launches, reset here) adds
// them in split order and applies gemm_splitk_reduce's epilogue (gs, and xds: null or the f16
// path's row scales), so y gets that launch's bits without the launch.
__device__ __forceinline__ void splitk_last_sum(const float* part, u32* ticket, float* y, const float* __restrict__ bias,
                                                const float* resid, float gs, const float* __restrict__ xds, int N,
                                                int T, long r0, int bm, long t0, int bn) {
    __shared__ int last;
    __syncthreads();  // (the block's partial sums written)
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(ticket, 1u) == gridDim.z - 1u;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    const int rows = (int)min((long)bm, N - r0), toks = (int)min((long)bn, T - t0);
    if ((N & 3) == 0)
        splitk_tile_sum<4>(part, gridDim.z, y, bias, resid, gs, xds, N, T, r0, rows, t0, toks);
    else
        splitk_tile_sum<1>(part, gridDim.z, y, bias, resid, gs, xds, N, T, r0, rows, t0, toks);
    if (threadIdx.x == 0) *ticket = 0u;
}

// y[t, o] = resid[t, o] + bias[o] + gscale * W[o, :] . x[t, :] for T tokens on tensor cores;
// W bf16 (fmt 2) or NVFP4 (fmt 3), K % 32 == 0; xds: null, or (NVFP4, sm_89+) the rows' scales
// by row_pow2 for the f16 path. Grid (ceil(N / GT_BM), ceil(T / GT_BN), splits), 256 threads.
// With splits > 1 (few tiles: a batched decode step's handful of tokens), block z takes K chunks
// [z kc, (z + 1) kc) of GT_BK and writes its raw sums to part[z][t][o]; then gemm_splitk_reduce
// adds the splits in order and applies the epilogue, or with `tickets` (one a tile, zero between
// launches) the tile's last split does (splitk_last_sum: the same bits).
// The block's row tile is `rtile` (the kernel's blockIdx.x, or its place in its segment).
template <int PF>
__device__ __forceinline__ void gemm_mma_impl(int fmt, const void* __restrict__ w, const u8* __restrict__ scales,
                                              float inv_g, const float* __restrict__ x, float* y,
                                              const float* __restrict__ bias, const float* resid, int N, int K,
                                              int T, int kc, float* __restrict__ part,
                                              const float* __restrict__ xds, int rtile, u32* tickets) {
    __shared__ __align__(16) GtStage smem[2];
    const int tid = threadIdx.x;
    const long r0 = (long)rtile * GT_BM, t0 = (long)blockIdx.y * GT_BN;
    const long wrow = r0 + (tid >> 1), xrow = t0 + (tid >> 2);
    const int k0 = (int)blockIdx.z * kc * GT_BK;
    const int kn = min(K - k0, kc * GT_BK);  // this split's K (> 0: the host sizes kc)
    GtSrc s;
    s.fmt = fmt;
    s.half = tid & 1;
    s.part = tid & 3;
    s.wrow = wrow < N ? (const u8*)w + wrow * (fmt == 3 ? K / 2 : 2 * (long)K) + (fmt == 3 ? k0 / 2 : 2 * k0) : nullptr;
    s.srow = (fmt == 3 && wrow < N) ? scales + wrow * (K / 16) + k0 / 16 : nullptr;
    s.xrow = nullptr;
    s.xs = 1.f;
    const bool h16 = fmt == 3 && xds != nullptr;
    pdl_enter();
    if (xrow < T) {
        s.xrow = x + xrow * K + k0;
        if (h16) s.xs = gt_row_xs(xds, xrow);
    }
    float acc[2][4][4];
    gt_mainloop<PF>(s, h16, kn, (int)min((long)GT_BN, (long)T - t0), smem, acc);
    if (gridDim.z > 1) {
        float* pz = part + (long)blockIdx.z * T * N;
        gt_each(acc, [&](int r, int j, float v) {
            const long o = r0 + r, t = t0 + j;
            if (o < N && t < T) pz[t * N + o] = v;
        });
        if (tickets)
            splitk_last_sum(part, tickets + rtile + gridDim.x * blockIdx.y, y, bias, resid, gt_gscale(fmt, inv_g, h16),
                            h16 ? xds : nullptr, N, T, r0, GT_BM, t0, GT_BN);
        return;
    }
    const float gs = gt_gscale(fmt, inv_g, h16);
    gt_each(acc, [&](int r, int j, float v) {
        const long o = r0 + r, t = t0 + j;
        if (o < N && t < T) {
            const long idx = t * N + o;
            v *= h16 ? gs * xds[t] : gs;
            if (bias) v += bias[o];
            if (resid) v += resid[idx];
            y[idx] = v;
        }
    });
}

#define GEMM_MMA_KERNEL(NAME, PF)                                                                              \
    extern "C" __global__ void __launch_bounds__(256)                                                          \
        NAME(int fmt, const void* __restrict__ w, const u8* __restrict__ scales, float inv_g,                  \
             const float* __restrict__ x, float* y, const float* __restrict__ bias, const float* resid, int N, \
             int K, int T, int kc, float* __restrict__ part, const float* __restrict__ xds, u32* tickets) {   \
        gemm_mma_impl<PF>(fmt, w, scales, inv_g, x, y, bias, resid, N, K, T, kc, part, xds, blockIdx.x,        \
                          tickets);                                                                            \
    }
// gemm_mma: prefill-sized grids; gemm_mma_deep: one tile of tokens (a decode step's rows)
GEMM_MMA_KERNEL(gemm_mma, 1)
GEMM_MMA_KERNEL(gemm_mma_deep, GT_PF_DEEP)

// gemm_mma of several bf16 weights on one input in one launch, none of them split over K (a
// prompt's MoE router and shared expert's gate and up: alone, each has too few row tiles to
// fill the device, so each would split K and add the splits in a launch of its own): segment
// s's blocks take its row tiles, y_s = x . W_s^T. Each tile computes as gemm_mma's unsplit
// tile. Grid (the segments' row tiles, ceil(T / GT_BN)), 256 threads.
extern "C" __global__ void __launch_bounds__(256)
    gemm_mma_segs(Segs segs, const float* __restrict__ x, int K, int T) {
    const int si = seg_index(segs, blockIdx.x);
    const Seg& g = segs.s[si];
    gemm_mma_impl<1>(g.fmt, g.w, g.scales, g.inv_g, x, g.y, nullptr, nullptr, g.N, K, T, K / GT_BK, nullptr,
                     nullptr, (int)blockIdx.x - g.block0, nullptr);
}

// ---- prompts' NVFP4 linears on f16 tensor cores, several K steps in flight (gemm_h16) --------
//
// gemm_mma's f16 path (the same products: A = e2m1 * e4m3 * 2^-6, exact in f16; x * 2^e as f16
// high parts and remainders; f32 accumulation; the same epilogue and split-K partial sums),
// organised for prompts of many tokens:
// - x is split once per input (x_split_h16; q/k/v share it) into its two f16 parts, each row
//   laid out per 32 values in the order of the mma fragments (below): the main loop copies its
//   tiles with cp.async and reads them with ldmatrix, no conversions;
// - the weights' packed codes and block scales are copied raw (cp.async, 32 + 4 bytes a row per
//   K step of 64) and each warp decodes its A fragments from shared memory straight into
//   registers: a thread's u32 of 8 codes is, through nv_word_h2, exactly its four f16 pairs of
//   one row in the step's two 16-wide mma chunks (no decoded tile in shared memory);
// - GH_STAGES K steps in flight (dynamic shared memory), one barrier per step.
// Block: GH_BM = 128 weight rows x BN tokens (gemm_h16: 128; the grouped experts: 64 items of
// one expert), 8 warps as 4 (rows) x 2 (tokens), each 32 rows x BN / 2 tokens. Token groups of
// 8 at or past the tile's last token are skipped (warp-uniform). The token rows are gathered
// (each block lists its rows of x: an expert's items).
//
// Fragment order: of the 32 codes k0 .. k0 + 31 of a row, thread q of a quad holds codes
// 8q .. 8q + 7 (bytes 4q .. 4q + 3); nv_word_h2 gives their pairs (0, 2), (4, 6), (1, 3),
// (5, 7): the A registers {k 2q, 2q + 1} and {2q + 8, 2q + 9} of mma chunk 0, then the same of
// chunk 1. x's row is stored in that order: position 8 c + 2 p + e (c = 2 * chunk + the upper
// 8 of it, p a quad thread, e = 0, 1) holds x[k0 + 8 p + {0, 4, 1, 5}[c] + 2 e].

#define GH_BM 128
#define GH_BK 64
#define GH_STAGES 3

// One K step of a block's tiles: BN tokens (128 for gemm_h16, 64 items for the experts).
template <int BN>
struct GhStage {
    u16 x[2][BN][GH_BK];      // the parts' token rows; 16-byte chunk c of row r at c ^ (r & 7)
    u32 w[GH_BM][GH_BK / 8];  // packed codes (32 bytes a row)
    u32 sc[GH_BM];            // the row's 4 block scales
};

// xh[part][t][k] (part 0: the f16 high parts, 1: the remainders; T x K each) of x[t, k] * 2^e,
// 2^e = 1 / xds[t], in gemm_h16's fragment order per 32 values (K % 32 == 0). xds null: the rows'
// row_pow2 scales are computed here first (as row_pow2 computes them, so the same bits) and
// written to xds_out. gate (null: none): x[t, k] taken times softplus(gate[t, k / group]) first
// (group % 4 == 0; softplus_gate's product, so the same bits as that kernel then this one).
// `wpr` warps (1, 2, 4 or 8) per row, 8 / wpr rows a block of 256 (a prompt of few rows: more
// blocks to fill the device); 8 lanes per 32 values, lane j reading values 4j .. 4j + 3
// (coalesced), which are exactly the pairs of two words of each part: (4j, 4j + 2) is word
// 4 (j & 1) + j / 2, (4j + 1, 4j + 3) that plus 8; a row's warps take its 32-float4 stretches in
// turn. Rows of at most 128 * XS_REG_V * wpr values (a prompt's hidden states, the experts' SiLU
// products) are loaded once, all of a lane's float4s in flight together, and kept in registers
// for the scale and the parts; longer rows are read twice (the max, then the parts), a few
// float4s in flight a lane. Either way, and at any wpr, the same values (the max is exact in
// any order).
#define XS_REG_V 16

// Float4 i of a row (v, lane = i % 32), times xs, as its two words of each part (hi, lo: the
// row's parts).
__device__ __forceinline__ void x_split_store(u32* hi, u32* lo, int lane, int i, float4 v, float xs) {
    const int word = 4 * (lane & 1) + ((lane >> 1) & 3);
    float a0 = v.x * xs, b0 = v.z * xs, a1 = v.y * xs, b1 = v.w * xs;  // (f16x2_split leaves the remainders)
    const int w = (i >> 3) * 16 + word;
    hi[w] = f16x2_split(a0, b0);
    lo[w] = f16x2_rn(a0, b0);
    hi[w + 8] = f16x2_split(a1, b1);
    lo[w + 8] = f16x2_rn(a1, b1);
}

// The largest of the `wpr` warps' m of this warp's row (warp_max first), in every lane; a
// barrier of the block where wpr > 1 (every warp calls it, rows past the last included).
__device__ __forceinline__ float x_split_row_max(float m, int wpr) {
    __shared__ float wmax[8];
    m = warp_max(m);
    if (wpr == 1) return m;
    const int warp = threadIdx.x >> 5, first = warp - warp % wpr;
    if ((threadIdx.x & 31) == 0) wmax[warp] = m;
    __syncthreads();
    m = wmax[first];
    for (int w = 1; w < wpr; w++) m = fmaxf(m, wmax[first + w]);
    return m;
}

extern "C" __global__ void __launch_bounds__(256)
    x_split_h16(const float* __restrict__ x, const float* __restrict__ xds, int T, int K, u16* __restrict__ xh,
                float* __restrict__ xds_out, const float* __restrict__ gate, int group, int wpr) {
    pdl_enter();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wr = warp % wpr;
    const long r = (long)blockIdx.x * (8 / wpr) + warp / wpr;
    // (a row past T: its warps load and store nothing but meet x_split_row_max's barrier)
    const bool on = r < T;
    if (!on && wpr == 1) return;
    const long rr = on ? r : 0;
    const float4* row = (const float4*)(x + rr * K);
    const float* grow = gate ? gate + rr * (K / group) : nullptr;
    // x's float4 i, gated where there is a gate
    auto load = [&](int i) {
        float4 v = __ldg(row + i);
        if (grow) {
            const float s = softplus(__ldg(grow + 4 * i / group));
            v.x *= s;
            v.y *= s;
            v.z *= s;
            v.w *= s;
        }
        return v;
    };
    u32* hi = (u32*)(xh + rr * K);
    u32* lo = (u32*)(xh + (long)T * K + rr * K);
    // this lane's float4s: i0, i0 + step, ... below n4 (none for a row past T)
    const int n4 = on ? K / 4 : 0, i0 = lane + 32 * wr, step = 32 * wpr;
    if (K <= 128 * XS_REG_V * wpr) {
        float4 v[XS_REG_V];
#pragma unroll
        for (int q = 0; q < XS_REG_V; q++) {
            const int i = i0 + step * q;
            v[q] = i < n4 ? __ldg(row + i) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
        if (grow) {
#pragma unroll
            for (int q = 0; q < XS_REG_V; q++) {
                const int i = i0 + step * q;
                if (i < n4) {
                    const float s = softplus(__ldg(grow + 4 * i / group));
                    v[q].x *= s;
                    v[q].y *= s;
                    v[q].z *= s;
                    v[q].w *= s;
                }
            }
        }
        float xs;
        if (xds != nullptr) {
            xs = on ? gt_row_xs(xds, r) : 1.f;
        } else {
            // (max is exact in any order: the loop path's scale)
            float m = 0.f;
#pragma unroll
            for (int q = 0; q < XS_REG_V; q++)
                m = fmaxf(m, fmaxf(fmaxf(fabsf(v[q].x), fabsf(v[q].y)), fmaxf(fabsf(v[q].z), fabsf(v[q].w))));
            const float ds = pow2f(-xb_exp(x_split_row_max(m, wpr)));
            if (on && wr == 0 && lane == 0) xds_out[r] = ds;
            xs = 1.f / ds;
        }
#pragma unroll
        for (int q = 0; q < XS_REG_V; q++) {
            const int i = i0 + step * q;
            if (i < n4) x_split_store(hi, lo, lane, i, v[q], xs);
        }
        return;
    }
    float xs;
    if (xds != nullptr) {
        xs = on ? gt_row_xs(xds, r) : 1.f;
    } else {
        float m = 0.f;
#pragma unroll 4
        for (int i = i0; i < n4; i += step) {
            const float4 v = load(i);
            m = fmaxf(m, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
        }
        const float ds = pow2f(-xb_exp(x_split_row_max(m, wpr)));
        if (on && wr == 0 && lane == 0) xds_out[r] = ds;
        xs = 1.f / ds;
    }
#pragma unroll 4
    for (int i = i0; i < n4; i += step) x_split_store(hi, lo, lane, i, load(i), xs);
}

// Where a block's gh_load copies from: this thread's weight row (tid / 2; null: zeros) and,
// for tid < GH_BM, row tid's block scales (null: zeros), both at K = 0; x's parts (part p of row
// t at xh + p * part_len + t * K) and the tile's token rows `xrow` (shared memory, -1: zeros).
struct GhSrc {
    const u8* wrow;
    const u8* srow;
    const u16* xh;
    long part_len;
    const int* xrow;
    int K;
};

// Copies K step k (absolute) into `st` (cp.async).
template <int BN>
__device__ __forceinline__ void gh_load(GhStage<BN>& st, const GhSrc& s, int k) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int it = 0; it < 2 * BN * 8 / 256; it++) {
        const int c = tid + 256 * it;
        const int part = c / (BN * 8), r = (c / 8) % BN, ch = c % 8;
        const int row = s.xrow[r];
        const bool ok = row >= 0;
        const u16* src = s.xh + part * s.part_len + (long)(ok ? row : 0) * s.K + k + 8 * ch;
        cp_async16(smem_u32(&st.x[part][r][8 * (ch ^ (r & 7))]), src, ok);
    }
    // (a row outside the matrix: zeros, its source not read; x's parts stand in as an address)
    const int ch = tid & 1;
    const void* wsrc = s.wrow ? (const void*)(s.wrow + k / 2 + 16 * ch) : (const void*)s.xh;
    cp_async16(smem_u32(&st.w[tid >> 1][4 * ch]), wsrc, s.wrow != nullptr);
    if (tid < GH_BM) {
        const void* ssrc = s.srow ? (const void*)(s.srow + k / 16) : (const void*)s.xh;
        cp_async4(smem_u32(&st.sc[tid]), ssrc, s.srow != nullptr);
    }
}

// The tensor-core work of one K step on `st` for the first `tn` tokens (see the section's head):
// warp (wm, wn) takes rows 32 wm .. + 32 and tokens BN / 2 * wn .. + BN / 2. AHEAD: each part's
// B fragments of an mma chunk are loaded before its mma (their loads overlap; more registers:
// the variant for one block of 8 warps a SM).
template <int BN, bool AHEAD = false>
__device__ __forceinline__ void gh_step(const GhStage<BN>& st, int tn, float acc[2][BN / 16][4]) {
    constexpr int WN = BN / 2;  // tokens per warp
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int wm = warp & 3, wn = warp >> 2, g = lane >> 2, q = lane & 3;
    if (WN * wn >= tn) return;
#pragma unroll
    for (int sub = 0; sub < 2; sub++) {  // 32 values of K: one row chunk of 16 bytes, 2 scales
        u32 a[2][2][4];                   // [16-row tile][mma chunk][register]
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = 32 * wm + 16 * i + g + 8 * h;
                const u32 sb = (st.sc[r] >> (8 * (2 * sub + (q >> 1)))) & 0xffu;
                u32 o[4];
                nv_word_h2(st.w[r][4 * sub + q], __byte_perm(e4m3x2_h2(sb), 0, 0x1010), o);
                a[i][0][h] = o[0];
                a[i][0][2 + h] = o[1];
                a[i][1][h] = o[2];
                a[i][1][2 + h] = o[3];
            }
#pragma unroll
        for (int c = 0; c < 2; c++) {
            const int ch = 4 * sub + 2 * c + ((lane >> 3) & 1);
            if (AHEAD) {
#pragma unroll
                for (int part = 0; part < 2; part++) {
                    u32 b[WN / 16][4];  // (tokens past the tile's are zeros in shared memory)
#pragma unroll
                    for (int jj = 0; jj < WN / 16; jj++) {
                        const int tok = WN * wn + 16 * jj + (lane & 7) + ((lane >> 4) << 3);
                        ldsm_x4(b[jj], smem_u32(&st.x[part][tok][8 * (ch ^ (tok & 7))]));
                    }
#pragma unroll
                    for (int jj = 0; jj < WN / 16; jj++) {
                        const int n0 = WN * wn + 16 * jj;
                        if (n0 >= tn) break;
#pragma unroll
                        for (int i = 0; i < 2; i++) {
                            const u32* ai = a[i][c];
                            mma16816(acc[i][2 * jj], ai[0], ai[1], ai[2], ai[3], b[jj][0], b[jj][1]);
                            if (n0 + 8 < tn)
                                mma16816(acc[i][2 * jj + 1], ai[0], ai[1], ai[2], ai[3], b[jj][2], b[jj][3]);
                        }
                    }
                }
                continue;
            }
#pragma unroll
            for (int jj = 0; jj < WN / 16; jj++) {
                const int n0 = WN * wn + 16 * jj;  // the first token of this pair of 8-token groups
                if (n0 >= tn) break;
                const bool both = n0 + 8 < tn;
                const int tok = n0 + (lane & 7) + ((lane >> 4) << 3);
#pragma unroll
                for (int part = 0; part < 2; part++) {
                    u32 b[4];
                    ldsm_x4(b, smem_u32(&st.x[part][tok][8 * (ch ^ (tok & 7))]));
#pragma unroll
                    for (int i = 0; i < 2; i++) {
                        const u32* ai = a[i][c];
                        mma16816(acc[i][2 * jj], ai[0], ai[1], ai[2], ai[3], b[0], b[1]);
                        if (both) mma16816(acc[i][2 * jj + 1], ai[0], ai[1], ai[2], ai[3], b[2], b[3]);
                    }
                }
            }
        }
    }
}

// The block's GH_BM x BN product over K range [k0, k0 + kn) (kn % 64 == 0) into acc, the first
// `tn` tokens; GH_STAGES stages at `st`. Ends with no copies in flight and a barrier (the stages
// may then be reused). The caller has written s.xrow and synchronised.
template <int BN, bool AHEAD = false>
__device__ __forceinline__ void gh_mainloop(const GhSrc& s, int k0, int kn, int tn, GhStage<BN>* st,
                                            float acc[2][BN / 16][4]) {
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < BN / 16; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[i][j][c] = 0.f;
    const int steps = kn / GH_BK;
#pragma unroll
    for (int p = 0; p < GH_STAGES - 1; p++) {
        if (p < steps) gh_load<BN>(st[p], s, k0 + p * GH_BK);
        cp_async_commit();
    }
    for (int p = 0; p < steps; p++) {
        cp_async_wait<GH_STAGES - 2>();
        __syncthreads();  // step p is in; every warp is done with the stage step p - 1 used
        const int next = p + GH_STAGES - 1;
        if (next < steps) gh_load<BN>(st[next % GH_STAGES], s, k0 + next * GH_BK);
        cp_async_commit();
        gh_step<BN, AHEAD>(st[p % GH_STAGES], tn, acc);
    }
    cp_async_wait<0>();
    __syncthreads();
}

// f(row, token, value) for each of this thread's accumulators after gh_mainloop (row and token
// within the block's GH_BM x BN tile).
template <int BN, class F>
__device__ __forceinline__ void gh_each(const float acc[2][BN / 16][4], F f) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, q = lane & 3, wm = warp & 3, wn = warp >> 2;
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < BN / 16; j++)
#pragma unroll
            for (int c = 0; c < 4; c++)
                f(32 * wm + 16 * i + g + 8 * (c >> 1), BN / 2 * wn + 8 * j + 2 * q + (c & 1), acc[i][j][c]);
}

// y[t, o] = resid[t, o] + bias[o] + 64 inv_g xds[t] * W[o, :] . (x[t, :] / xds[t]) for T tokens
// and each NVFP4 W of `segs` (segment s: the row tiles of blocks [block0, next block0), its own
// W (N x K, K % 64 == 0; codes 16-byte and scales 4-byte aligned), inv_g and y; `bias`, `resid`
// and a K split: one segment only), x given as x_split_h16's parts `xh`. Grid (the segments'
// row tiles of GH_BM, ceil(T / BN), splits), 256 threads, GH_STAGES * sizeof(GhStage<BN>) bytes
// of dynamic shared memory (or more). With splits > 1, block z takes K chunks [z kc, (z + 1) kc)
// of 32 (kc even) and writes its raw sums to part[z][t][o], which gemm_splitk_reduce (fmt 3, the
// same xds) finishes, or with `tickets` the tile's last split (splitk_last_sum, as gemm_mma).
// A token's sums do not depend on BN or on the tile's other tokens, only on the K split.
template <int BN, bool AHEAD>
__device__ __forceinline__ void gemm_h16_impl(const Segs& segs, const u16* __restrict__ xh,
                                              const float* __restrict__ bias, const float* resid, int K, int T,
                                              int kc, float* __restrict__ part, const float* __restrict__ xds,
                                              u32* tickets) {
    DYNAMIC_SMEM(u8, gh_smem);
    __shared__ int xrow[BN];
    int si = 0;
    for (int i = 1; i < segs.n; i++)
        if ((int)blockIdx.x >= segs.s[i].block0) si = i;
    const Seg sg = segs.s[si];
    const u8* w = (const u8*)sg.w;
    const int N = sg.N;
    float* y = sg.y;
    const int tid = threadIdx.x;
    const long r0 = (long)(blockIdx.x - sg.block0) * GH_BM, t0 = (long)blockIdx.y * BN;
    const int k0 = (int)blockIdx.z * kc * 32;
    const long wr = r0 + (tid >> 1), sr = r0 + tid;
    GhSrc s;
    s.wrow = wr < N ? w + wr * (K / 2) : nullptr;
    s.srow = tid < GH_BM && sr < N ? sg.scales + sr * (K / 16) : nullptr;
    s.xh = xh;
    s.part_len = (long)T * K;
    s.xrow = xrow;
    s.K = K;
    if (tid < BN) xrow[tid] = t0 + tid < T ? (int)(t0 + tid) : -1;
    __syncthreads();
    pdl_enter();
    float acc[2][BN / 16][4];
    gh_mainloop<BN, AHEAD>(s, k0, min(K - k0, kc * 32), (int)min((long)BN, (long)T - t0), (GhStage<BN>*)gh_smem,
                           acc);
    const float gs = 64.f * sg.inv_g;
    float* pz = part + (long)blockIdx.z * T * N;
    gh_each<BN>(acc, [&](int r, int j, float v) {
        const long o = r0 + r, t = t0 + j;
        if (o >= N || t >= T) return;
        const long idx = t * N + o;
        if (gridDim.z > 1) {
            pz[idx] = v;
            return;
        }
        v *= gs * xds[t];
        if (bias) v += bias[o];
        if (resid) v += resid[idx];
        y[idx] = v;
    });
    if (gridDim.z > 1 && tickets)
        splitk_last_sum(part, tickets + blockIdx.x + gridDim.x * blockIdx.y, y, bias, resid, gt_gscale(3, sg.inv_g, true),
                        xds, N, T, r0, GH_BM, t0, BN);
}

#define GEMM_H16_KERNEL(NAME, BN, BLOCKS, AHEAD)                                                              \
    extern "C" __global__ void __launch_bounds__(256, BLOCKS)                                                 \
        NAME(Segs segs, const u16* __restrict__ xh, const float* __restrict__ bias, const float* resid, int K, \
             int T, int kc, float* __restrict__ part, const float* __restrict__ xds, u32* tickets) {          \
        gemm_h16_impl<BN, AHEAD>(segs, xh, bias, resid, K, T, kc, part, xds, tickets);                        \
    }
// gemm_h16: two blocks a SM (128 registers); gemm_h16_b1: one block of more registers, each
// chunk's B fragments loaded ahead (CudaOptions::h16_one_block); gemm_h16_t32: tiles of 32
// tokens, two blocks a SM (a batched decode step's 17-32 rows: CudaOptions::h16_few_min), each
// weight fragment decoded once for the step's tokens
GEMM_H16_KERNEL(gemm_h16, 128, 2, false)
GEMM_H16_KERNEL(gemm_h16_b1, 128, 1, true)
GEMM_H16_KERNEL(gemm_h16_t32, 32, 2, false)

// y[t, o] = resid + bias + gscale * (part[0][t][o] + part[1][t][o] + ...) over `splits` split-K
// partial sums of gemm_mma (weights of format `fmt`, 1 / global scale `inv_g`, `xds` as given to
// gemm_mma), in split order (deterministic).
extern "C" __global__ void gemm_splitk_reduce(const float* __restrict__ part, int splits, float* y,
                                              const float* __restrict__ bias, const float* resid, int fmt,
                                              float inv_g, int N, int T, const float* __restrict__ xds) {
    pdl_enter();
    const bool h16 = fmt == 3 && xds != nullptr;
    const float gs = gt_gscale(fmt, inv_g, h16);
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    const long n = (long)N * T;
    if (i >= n) return;
    float v = 0.f;
    for (int z = 0; z < splits; z++) v += part[z * n + i];
    y[i] = splitk_epilogue(v, h16 ? gs * xds[i / N] : gs, bias, i % N, resid, i);
}

// ds[r] = 2^-e for each of `rows` rows of x (K values, K % 4 == 0), 2^e the power of two that puts
// the row's max|x| in [2^14, 2^15) (xb_exp: 1 for a zero or non-finite row): the f16 path's
// scales of gemm_mma and the grouped experts. One warp per row, 8 rows per block of 256.
extern "C" __global__ void __launch_bounds__(256) row_pow2(const float* __restrict__ x, int rows, int K,
                                                           float* __restrict__ ds) {
    pdl_enter();
    const long r = (long)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (r >= rows) return;
    const int lane = threadIdx.x & 31;
    const float4* row = (const float4*)(x + r * K);
    float m = 0.f;
#pragma unroll 4
    for (int i = lane; i < K / 4; i += 32) {
        const float4 v = __ldg(row + i);
        m = fmaxf(m, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    }
    m = warp_max(m);
    if (lane == 0) ds[r] = pow2f(-xb_exp(m));
}
