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

// Decode steps of several sequences in one launch (a batched step: one query row each): sequence
// b = blockIdx.y reads row b of q / kch / vch, writes row b of out (and its rows of the split
// partials), and attends over its own bf16 cache seqs.s[b] at its own position; the rope and the
// append are done inside (pp.on, the cache and slot taken from seqs.s[b]; no per-head norms:
// the caller applied them). Up to ATTN_BATCH_MAX sequences per launch; the descriptors are a
// kernel parameter (no upload).
#define ATTN_BATCH_MAX 32
struct AttnSeq {
    u16* kc;
    u16* vc;
    long slot;
    int pos0;
    int pad;
};
struct AttnSeqs {
    AttnSeq s[ATTN_BATCH_MAX];
};
#define ATTN_KERNEL_DEC_BATCH(NAME, D, MINB)                                                                           \
    extern "C" __global__ void __launch_bounds__(AW * 32, MINB) NAME(                                                 \
        const float* q, const float* kch, const float* vch, float* out, float* part_o, float* part_ml, int heads,     \
        int kvh, float scale, int window, int splits, int ngroups, Prep pp, AttnSeqs seqs) {                           \
        pdl_enter();                                                                                                   \
        const int b = blockIdx.y;                                                                                      \
        const AttnSeq sq = seqs.s[b];                                                                                  \
        Prep ps = pp;                                                                                                  \
        ps.kc = sq.kc;                                                                                                 \
        ps.vc = sq.vc;                                                                                                 \
        ps.slot = sq.slot;                                                                                             \
        const long qw = (long)heads * D, kw = (long)kvh * D;                                                           \
        attn_dec_impl<D>(q + b * qw, kch + b * kw, vch + b * kw, sq.kc, sq.vc, out + b * qw,                           \
                         part_o ? part_o + b * qw * splits : part_o,                                                   \
                         part_ml ? part_ml + 2l * b * heads * splits : part_ml, heads, kvh, scale, sq.pos0, window,   \
                         splits, ngroups, ps);                                                                         \
    }
ATTN_KERNEL_DEC_BATCH(attn_dec_batch_bf16_64, 64, 4)
ATTN_KERNEL_DEC_BATCH(attn_dec_batch_bf16_128, 128, 4)
ATTN_KERNEL_DEC_BATCH(attn_dec_batch_bf16_128_short, 128, 2)
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
