// ---- KV cache and attention -------------------------------------------------------------------

// One row of keys and one of values into kd / vd. kv_t: 0 = f32, 1 = fp8 e4m3 of x / scale (ks for
// keys, vs for values), 2 = bf16.
__device__ __forceinline__ void kv_put_row(void* kd, void* vd, const float* __restrict__ k,
                                           const float* __restrict__ v, int width, int kv_t, float ks, float vs) {
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        const float kk = k[i], vv = v[i];
        if (kv_t == 2) {
            ((u16*)kd)[i] = f32_to_bf16(kk);
            ((u16*)vd)[i] = f32_to_bf16(vv);
        } else if (kv_t == 1) {
            ((u8*)kd)[i] = (u8)f32_to_e4m3_sat(kk / ks);
            ((u8*)vd)[i] = (u8)f32_to_e4m3_sat(vv / vs);
        } else {
            ((float*)kd)[i] = kk;
            ((float*)vd)[i] = vv;
        }
    }
}

// Writes the chunk's rows into the paged cache `tab` (the last `window` rows for a ring), one
// block per row.
extern "C" __global__ void kv_append(const u64* __restrict__ tab, const float* __restrict__ k,
                                    const float* __restrict__ v, int T, int pos0, int window, int width, int kv_t,
                                    float ks, float vs) {
    pdl_enter();
    const int r = blockIdx.x;
    if (window > 0 && r < T - window) return;
    const long pos = pos0 + r;
    const long slot = window > 0 ? pos % window : pos;
    const long rb = (long)width * (kv_t == 2 ? 2 : kv_t == 1 ? 1 : 4);
    kv_put_row(kv_row<u8>(tab, slot, rb, 0), kv_row<u8>(tab, slot, rb, 1), k + (long)r * width,
               v + (long)r * width, width, kv_t, ks, vs);
}

// The chunk's T rows in the storage type into the contiguous kc / vc (row r at row r), one block
// per row: the prefill attention's view of the chunk.
extern "C" __global__ void kv_stage(void* kc, void* vc, const float* __restrict__ k, const float* __restrict__ v,
                                   int width, int kv_t, float ks, float vs) {
    pdl_enter();
    const long r = blockIdx.x;
    const long e = kv_t == 2 ? 2 : kv_t == 1 ? 1 : 4;
    kv_put_row((u8*)kc + r * width * e, (u8*)vc + r * width * e, k + r * width, v + r * width, width, kv_t, ks,
               vs);
}

// Up to KV_PUT_MAX entries of a block table, passed by value (no upload): tab[at + i] = e[i].
#define KV_PUT_MAX 16
struct KvTablePut {
    u64 e[KV_PUT_MAX];
};
extern "C" __global__ void kv_table_put(u64* tab, int at, int n, KvTablePut put) {
    pdl_enter();
    const int i = threadIdx.x;
    if (i < n) tab[at + i] = put.e[i];
}

// The keys [x, y) of key split z of `splits` that a query row at position p attends over (the
// window's last `window` positions through p, or all of them).
__device__ __forceinline__ int2 split_keys(int p, int window, int splits, int z) {
    const int first = window > 0 ? max(0, p + 1 - window) : 0;
    const int nkeys = p - first + 1;
    const int per = (nkeys + splits - 1) / splits;
    const int s0 = first + z * per;
    return make_int2(s0, min(s0 + per, p + 1));
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
                          const u64* __restrict__ kt, float* __restrict__ out,
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
    const int2 span = split_keys(p, window, splits, z);
    const int s0 = span.x, s1 = span.y;
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
            const KT* kr =
                cached ? kv_row<const KT>(kt, window > 0 ? (long)(j % window) : (long)j, rw, 0) + (long)kv * d : nullptr;
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
                const KT* vr = kv_row<const KT>(kt, slot, rw, 1) + (long)kv * d;
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

// Decode attention (one query row, T == 1) over a bf16 or fp8 e4m3 cache: the host's ngroups
// blocks per (kv head, split) split the kv head's G query heads evenly (ceil(G / ngroups) <=
// DEC_GMAX each; the group's blocks run side by side, so their K/V reads after the first hit L2).
// Warp w takes tiles of 16 keys (key jb + lane / 2, jb = s0 + 16 (w + AW i)); per tile every lane
// issues half of its key's D / 8 16-byte K loads and the 16 keys' V slices (D / 32 dims per
// lane) before any arithmetic; online softmax per head with per-lane partial sums of exp. The
// chunk's own key and value (position pos0, not yet in the cache) are rounded to the storage type
// once per block, into shared memory, and read from there like a stored row. fp8 caches (keys
// e4m3 of k / ks, values of v / vs) load half the bytes (a lane's half key row: D / 16 8-byte
// chunks) and decode as attn_impl's KvIo<u8>.
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

// The cache storage of the decode kernels: 8 key values a chunk (bf16: 16 bytes, fp8: 8) and a
// lane's D / 32 values of a value row (bf16: in D / 64 words, fp8: in one), each decoded exactly
// as KvIo<u16> / KvIo<u8> decodes it (fp8: e4m3 * s; e4m3x2 gives e4m3 * 2^-8 exactly, and
// (e4m3 * 2^-8) * (256 s) rounds as e4m3 * s does), and rows of the chunk rounded to it.
template <bool FP8>
struct DecKv;
template <>
struct DecKv<false> {
    typedef u16 T;
    typedef uint4 KChunk;
    __device__ static void key8(KChunk a, float o[8], float) { bf16x8_to_f32(a, o); }
    __device__ static u32 put(float x, float) { return f32_to_bf16(x); }
};
template <>
struct DecKv<true> {
    typedef u8 T;
    typedef uint2 KChunk;
    // Four codes (byte i = code i) times s256 = 256 * scale into o; the NaN codes (0x7f, 0xff)
    // decode to NaN, as e4m3_to_f32 decodes them.
    __device__ static void codes4(u32 v, float o[4], float s256) {
        const float2 p = e4m3x2(v), q = e4m3x2(v >> 16);
        o[0] = p.x * s256;
        o[1] = p.y * s256;
        o[2] = q.x * s256;
        o[3] = q.y * s256;
        if (((v & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u) {  // some code is 0x7f or 0xff
#pragma unroll
            for (int i = 0; i < 4; i++)
                if (((v >> (8 * i)) & 0x7fu) == 0x7fu) o[i] = __uint_as_float(0x7fc00000u);
        }
    }
    __device__ static void key8(KChunk a, float o[8], float s256) {
        codes4(a.x, o, s256);
        codes4(a.y, o + 4, s256);
    }
    // s: the scale (not times 256)
    __device__ static u32 put(float x, float s) { return f32_to_e4m3_sat(x / s); }
};

// A lane's VL values of a value row at src as words (bf16: VL / 2 of two values; fp8: one of VL
// codes), through the read-only cache from global memory (GLOBAL) or from shared memory.
template <bool FP8, int VL, bool GLOBAL, typename KT>
__device__ __forceinline__ void v_slice(const KT* src, u32* w) {
    if constexpr (FP8) {
        if constexpr (VL == 4) {
            w[0] = GLOBAL ? __ldg((const u32*)src) : *(const u32*)src;
        } else {
            w[0] = GLOBAL ? (u32)__ldg((const u16*)src) : (u32)(*(const u16*)src);
        }
    } else if constexpr (VL == 4) {
        const uint2 t = GLOBAL ? __ldg((const uint2*)src) : *(const uint2*)src;
        w[0] = t.x;
        w[1] = t.y;
    } else {
        w[0] = GLOBAL ? __ldg((const u32*)src) : *(const u32*)src;
    }
}

// The per-head q/k rmsnorm, rope and KV append of a decode step, done inside the decode attention
// kernel instead of a qk_norm_rope launch before it (`on` = 0: q and k arrive normalised and
// rotated and the cache row is written). Layout matches `AttnPrep` on the host.
struct Prep {
    const float* qn;        // q norm weight [D] (null: none)
    const float* kn;        // k norm weight [D] (null: none)
    const float* inv_freq;  // rope frequencies [rdim / 2]
    const u64* kt;          // the cache's block table (the rows the kernel reads): slot `slot` is written
    long slot;
    float eps;
    float attn_factor;
    int rdim;
    int on;
    const float* gate;      // per-head softplus gate [heads] applied to a single split's output (null: none)
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

// The shared memory of a decode block's preparation (dec_prepare): its query heads (times the
// softmax scale), the rope table at the new position, and the new key and value rows (knew: the
// key normalised and rotated; kcode / vcode: both in the storage type KT).
template <int D, typename KT, int GM>
struct DecPrepSmem {
    float qs[GM][D];
    float knew[D], rcs[D / 2], rsn[D / 2];
    __align__(16) KT kcode[D];
    __align__(16) KT vcode[D];
};

// A decode block's preparation (attn_dec_impl's and attn_dec_mma_impl's): its G query heads h0..
// of kv head kv into sm.qs, times scale. With pp.on, q and the new key (position p) are
// normalised and rotated here, and where the block's split holds position p (holds_new) the group
// block grp 0 appends the key and value rows to the cache; otherwise q and k arrive normalised
// and rotated and the cache row is written. Where the split holds p, the new rows in the storage
// type (sm.kcode, sm.vcode) are made once by the block, one value a thread, and read by the
// caller as a cached row is. Ends with the block synchronised.
template <int D, bool FP8, int GM>
__device__ __forceinline__ void dec_prepare(DecPrepSmem<D, typename DecKv<FP8>::T, GM>& sm,
                                            const float* __restrict__ q, const float* __restrict__ kch,
                                            const float* __restrict__ vch, int kv, int grp, int h0, int G, int p,
                                            bool holds_new, long rw, float scale, const Prep& pp, float ks,
                                            float vs) {
    typedef DecKv<FP8> Kv;
    typedef typename Kv::T KT;
    const int wid = threadIdx.x >> 5;
    const bool own_new = pp.on && holds_new;
    if (pp.on) {
        rope_table(sm.rcs, sm.rsn, pp, p);
        __syncthreads();
        for (int g = wid; g < G; g += AW)
            head_norm_rope<D>(sm.qs[g], q + (long)(h0 + g) * D, pp.qn, pp, sm.rcs, sm.rsn, scale);
        if (own_new && wid == AW - 1) head_norm_rope<D>(sm.knew, kch + (long)kv * D, pp.kn, pp, sm.rcs, sm.rsn, 1.f);
    } else {
        for (int i = threadIdx.x; i < G * D; i += blockDim.x) sm.qs[i / D][i % D] = q[(long)h0 * D + i] * scale;
    }
    __syncthreads();
    if (holds_new) {  // (the same for every thread of the block)
        const float* kin = pp.on ? sm.knew : kch + (long)kv * D;
        for (int i = threadIdx.x; i < D; i += blockDim.x) {
            sm.kcode[i] = (KT)Kv::put(kin[i], ks);
            sm.vcode[i] = (KT)Kv::put(vch[(long)kv * D + i], vs);
        }
        __syncthreads();
        if (own_new && grp == 0) {
            for (int i = threadIdx.x; i < D; i += blockDim.x) {
                kv_row<KT>(pp.kt, pp.slot, rw, 0)[(long)kv * D + i] = sm.kcode[i];
                kv_row<KT>(pp.kt, pp.slot, rw, 1)[(long)kv * D + i] = sm.vcode[i];
            }
        }
    }
}

// The end of a decode block (after a barrier): merges its AW warps' softmax states (wm: maxima in
// natural-log units, -inf where a warp saw no key; wl: sums; wacc: unnormalised outputs, dim d of
// head g at wacc[w][g * LDA + d + (SWZ ? d / 32 : 0)]) of its G heads h0.. into the output rows
// (one split: times softplus(pp.gate) where set) or split z's partials for attn_combine.
template <int D, int GM, int LDA, bool SWZ>
__device__ __forceinline__ void dec_merge(const float (*wm)[GM], const float (*wl)[GM], const float (*wacc)[GM * LDA],
                                          int G, int h0, int z, int splits, float* __restrict__ out,
                                          float* __restrict__ part_o, float* __restrict__ part_ml, const Prep& pp) {
    for (int i = threadIdx.x; i < G * D; i += blockDim.x) {
        const int g = i / D, c = i % D;
        const int at = g * LDA + c + (SWZ ? c / 32 : 0);
        float M = -INF_F;
#pragma unroll
        for (int w = 0; w < AW; w++) M = fmaxf(M, wm[w][g]);
        float L = 0.f, O = 0.f;
        if (M != -INF_F) {
#pragma unroll
            for (int w = 0; w < AW; w++) {
                const float f = wm[w][g] == -INF_F ? 0.f : expf(wm[w][g] - M);
                L += wl[w][g] * f;
                O += wacc[w][at] * f;
            }
        }
        const long hh = h0 + g;
        if (splits == 1) {
            const float o = L > 0.f ? O / L : 0.f;
            out[hh * D + c] = pp.gate ? o * softplus(pp.gate[hh]) : o;
        } else {
            part_o[(hh * splits + z) * D + c] = O;
            if (c == 0) {
                part_ml[(hh * splits + z) * 2] = M;
                part_ml[(hh * splits + z) * 2 + 1] = L;
            }
        }
    }
}

// ks, vs: an fp8 cache's scales of keys and values (ignored for bf16).
template <int D, bool FP8, int GM = DEC_GMAX>
__device__ void attn_dec_impl(const float* __restrict__ q, const float* __restrict__ kch,
                              const float* __restrict__ vch, const u64* __restrict__ kt, float* __restrict__ out,
                              float* __restrict__ part_o, float* __restrict__ part_ml,
                              int heads, int kvh, float scale, int pos0, int window, int splits, int ngroups,
                              const Prep& pp, float ks, float vs) {
    typedef DecKv<FP8> Kv;
    typedef typename Kv::T KT;
    constexpr int KC = D / 8;   // 8-value chunks of a key row
    constexpr int VL = D / 32;  // value dims per lane (2 or 4)
    const float ks256 = ks * 256.f, vs256 = vs * 256.f;
    __shared__ DecPrepSmem<D, KT, GM> sp;
    __shared__ float wm[AW][GM], wl[AW][GM];
    __shared__ float wacc[AW][GM * D];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const int kv = blockIdx.x / ngroups, grp = blockIdx.x % ngroups;
    const int GA = heads / kvh;
    const int gs = (GA + ngroups - 1) / ngroups;
    const int G = min(gs, GA - grp * gs);  // heads of this block (<= 0: none)
    if (G <= 0) return;
    const int h0 = kv * GA + grp * gs;
    const int z = blockIdx.z;
    const int p = pos0;
    const int2 span = split_keys(p, window, splits, z);
    const int s0 = span.x, s1 = span.y;
    const long rw = (long)kvh * D;
    dec_prepare<D, FP8, GM>(sp, q, kch, vch, kv, grp, h0, G, p, s0 <= p && p < s1, rw, scale, pp, ks, vs);
    const float(*qs)[D] = sp.qs;
    const KT* kcode = sp.kcode;
    const KT* vcode = sp.vcode;
    float m[GM], l[GM], acc[GM][VL];
#pragma unroll
    for (int g = 0; g < GM; g++) {
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
        typename Kv::KChunk kr[KC / 2];
        if (valid) {
            if (j < pos0) {
                const long slot = window > 0 ? (long)(j % window) : (long)j;
                const typename Kv::KChunk* src =
                    (const typename Kv::KChunk*)(kv_row<const KT>(kt, slot, rw, 0) + (long)kv * D) + half * (KC / 2);
#pragma unroll
                for (int c = 0; c < KC / 2; c++) kr[c] = __ldg(src + c);
            } else {  // (j == pos0: the new key)
                const typename Kv::KChunk* src = (const typename Kv::KChunk*)kcode + half * (KC / 2);
#pragma unroll
                for (int c = 0; c < KC / 2; c++) kr[c] = src[c];
            }
        }
        const int nk = min(16, s1 - jb);
        const int slotb = window > 0 ? jb % window : jb;
        // (bf16: VL / 2 words of two values; fp8: one word of VL codes)
        constexpr int VW = FP8 ? 1 : VL / 2;
        u32 vr[16][VW];
#pragma unroll
        for (int kk = 0; kk < 16; kk++) {
            if (kk < nk) {
                const int jj = jb + kk;
                if (jj < pos0) {
                    int slot = slotb + kk;
                    if (window > 0 && slot >= window) slot -= window;
                    v_slice<FP8, VL, true>(kv_row<const KT>(kt, slot, rw, 1) + (long)kv * D + lane * VL, vr[kk]);
                } else {  // (jj == pos0: the new value)
                    v_slice<FP8, VL, false>(vcode + lane * VL, vr[kk]);
                }
            }
        }
        // ---- scores (pair-reduced) and online softmax
        float sc[GM];
#pragma unroll
        for (int g = 0; g < GM; g++) sc[g] = 0.f;
        if (valid) {
#pragma unroll
            for (int c = 0; c < KC / 2; c++) {
                float kf[8];
                Kv::key8(kr[c], kf, ks256);
                const int qo = (half * (KC / 2) + c) * 8;
#pragma unroll
                for (int g = 0; g < GM; g++) {
                    if (g < G) {
                        const float4 qa = *(const float4*)&qs[g][qo], qb = *(const float4*)&qs[g][qo + 4];
                        sc[g] += qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3] + qb.x * kf[4] +
                                 qb.y * kf[5] + qb.z * kf[6] + qb.w * kf[7];
                    }
                }
            }
        }
        float pr[GM];
#pragma unroll
        for (int g = 0; g < GM; g++) {
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
                float vf[4];
                if constexpr (FP8) {
                    Kv::codes4(vr[kk][0], vf, vs256);
                } else {
#pragma unroll
                    for (int c = 0; c < VL / 2; c++) {
                        vf[2 * c] = __uint_as_float(vr[kk][c] << 16);
                        vf[2 * c + 1] = __uint_as_float(vr[kk][c] & 0xffff0000u);
                    }
                }
#pragma unroll
                for (int g = 0; g < GM; g++) {
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
    for (int g = 0; g < GM; g++) {
        if (g < G) {
            const float ls = warp_sum(l[g]);
            if (lane == 0) {
                wm[wid][g] = m[g];
                wl[wid][g] = ls;
            }
#pragma unroll
            for (int c = 0; c < VL; c++) wacc[wid][g * D + lane * VL + c] = acc[g][c];
        }
    }
    __syncthreads();
    dec_merge<D, GM, D, false>(wm, wl, wacc, G, h0, z, splits, out, part_o, part_ml, pp);
}

#define ATTN_KERNEL(NAME, KT, DPL)                                                                                     \
    extern "C" __global__ void __launch_bounds__(AW * 32) NAME(                                                       \
        const float* q, const float* kch, const float* vch, const u64* kt, float* out, float* part_o,                 \
        float* part_ml, int T, int heads, int kvh, int d, float scale, int pos0, int window, int splits,             \
        int ngroups, float ks, float vs) {                                                                             \
        pdl_enter();                                                                                                   \
        attn_impl<KT, DPL>(q, kch, vch, kt, out, part_o, part_ml, T, heads, kvh, d, scale, pos0, window, splits,     \
                           ngroups, ks, vs);                                                                          \
    }
// Decode steps (T == 1) over bf16 or fp8 caches with d = 64 / 128 (the host picks these when
// ceil(G / ngroups) <= DEC_GMAX). MINB resident blocks per SM: 4 caps the registers at 128 (d 128
// fits without spilling; long contexts gain from the occupancy), 2 leaves them uncapped (short
// spans: sliding layers and short contexts).
#define ATTN_KERNEL_DEC(NAME, D, FP8, MINB)                                                                            \
    extern "C" __global__ void __launch_bounds__(AW * 32, MINB) NAME(                                                 \
        const float* q, const float* kch, const float* vch, const u64* kt, float* out, float* part_o,                 \
        float* part_ml, int heads, int kvh, float scale, int pos0, int window, int splits, int ngroups, Prep pp,      \
        float ks, float vs) {                                                                                          \
        pdl_enter();                                                                                                   \
        attn_dec_impl<D, FP8>(q, kch, vch, kt, out, part_o, part_ml, heads, kvh, scale, pos0, window, splits,         \
                              ngroups, pp, ks, vs);                                                                    \
    }
ATTN_KERNEL_DEC(attn_dec_bf16_64, 64, false, 4)
ATTN_KERNEL_DEC(attn_dec_bf16_128, 128, false, 4)
ATTN_KERNEL_DEC(attn_dec_bf16_128_short, 128, false, 2)
ATTN_KERNEL_DEC(attn_dec_fp8_64, 64, true, 4)
ATTN_KERNEL_DEC(attn_dec_fp8_128, 128, true, 4)
ATTN_KERNEL_DEC(attn_dec_fp8_128_short, 128, true, 2)

// Decode steps of several sequences in one launch (a batched step: one query row each): sequence
// b = blockIdx.y reads row b of q / kch / vch, writes row b of out (and its rows of the split
// partials), and attends over its own cache seqs.s[b] (bf16 or fp8, every sequence's of one type
// and scales) at its own position; the rope and the append are done inside (pp.on, the cache and
// slot taken from seqs.s[b]; no per-head norms: the caller applied them). Up to ATTN_BATCH_MAX
// sequences per launch; the descriptors are a kernel parameter (no upload). GM: the most query
// heads of a kv head one block takes (DEC_GMAX; the _g8 kernels 8, a kv head's whole group of
// Laguna's 6 or 8, so that its K/V rows are read by one block instead of two: the same
// arithmetic per head, so the same bits at the same key splits). IMPL: attn_dec_impl (CUDA
// cores) or attn_dec_mma_impl (tensor cores, after the prefill's flash attention below).
#define ATTN_BATCH_MAX 32
struct AttnSeq {
    const u64* kt;  // the sequence's block table
    long slot;
    int pos0;
    int pad;
};
struct AttnSeqs {
    AttnSeq s[ATTN_BATCH_MAX];
};
#define ATTN_KERNEL_DEC_BATCH(NAME, D, FP8, MINB, GM, IMPL)                                                            \
    extern "C" __global__ void __launch_bounds__(AW * 32, MINB) NAME(                                                 \
        const float* q, const float* kch, const float* vch, float* out, float* part_o, float* part_ml, int heads,     \
        int kvh, float scale, int window, int splits, int ngroups, Prep pp, AttnSeqs seqs, float ks, float vs) {      \
        pdl_enter();                                                                                                   \
        const int b = blockIdx.y;                                                                                      \
        const AttnSeq sq = seqs.s[b];                                                                                  \
        Prep ps = pp;                                                                                                  \
        ps.kt = sq.kt;                                                                                                 \
        ps.slot = sq.slot;                                                                                             \
        ps.gate = pp.gate ? pp.gate + b * heads : pp.gate;                                                             \
        const long qw = (long)heads * D, kw = (long)kvh * D;                                                           \
        IMPL<D, FP8, GM>(q + b * qw, kch + b * kw, vch + b * kw, sq.kt, out + b * qw,                                  \
                         part_o ? part_o + b * qw * splits : part_o,                                                   \
                         part_ml ? part_ml + 2l * b * heads * splits : part_ml, heads, kvh, scale, sq.pos0, window,    \
                         splits, ngroups, ps, ks, vs);                                                                 \
    }
ATTN_KERNEL_DEC_BATCH(attn_dec_batch_bf16_64, 64, false, 4, DEC_GMAX, attn_dec_impl)
ATTN_KERNEL_DEC_BATCH(attn_dec_batch_bf16_128, 128, false, 4, DEC_GMAX, attn_dec_impl)
ATTN_KERNEL_DEC_BATCH(attn_dec_batch_bf16_128_short, 128, false, 2, DEC_GMAX, attn_dec_impl)
ATTN_KERNEL_DEC_BATCH(attn_dec_batch_fp8_64, 64, true, 4, DEC_GMAX, attn_dec_impl)
ATTN_KERNEL_DEC_BATCH(attn_dec_batch_fp8_128, 128, true, 4, DEC_GMAX, attn_dec_impl)
ATTN_KERNEL_DEC_BATCH(attn_dec_batch_fp8_128_short, 128, true, 2, DEC_GMAX, attn_dec_impl)
ATTN_KERNEL_DEC_BATCH(attn_dec_batch_bf16_128_g8, 128, false, 2, 8, attn_dec_impl)
ATTN_KERNEL_DEC_BATCH(attn_dec_batch_fp8_128_g8, 128, true, 2, 8, attn_dec_impl)
ATTN_KERNEL(attn_f32_1, float, 1)
ATTN_KERNEL(attn_f32_2, float, 2)
ATTN_KERNEL(attn_f32_4, float, 4)
ATTN_KERNEL(attn_bf16_1, u16, 1)
ATTN_KERNEL(attn_bf16_2, u16, 2)
ATTN_KERNEL(attn_bf16_4, u16, 4)
ATTN_KERNEL(attn_fp8_1, u8, 1)
ATTN_KERNEL(attn_fp8_2, u8, 2)
ATTN_KERNEL(attn_fp8_4, u8, 4)

// ---- prefill attention on tensor cores (flash attention) ---------------------------------------
//
// Causal attention of a chunk of T query rows (the host takes this path for T >= ATTN_FLASH_MIN_T
// over bf16 or fp8 caches with head_dim D = 64 or 128) with bf16 mma.m16n8k16 and f32
// accumulation. Same semantics as attn_impl: key j of position j < pos0 is cache row j (ring slot
// j % window on sliding layers, through the block table), one of position j >= pos0 is row
// j - pos0 of the chunk. The chunk's rows arrive already in the storage type (kx / vx, contiguous:
// the host converts them with kv_stage), rounded exactly as attn_impl rounds them on the fly.
//
// Block: FA_WARPS warps of 16 query rows each, hb (1, 2 or 4) heads of one kv head's group times
// 64 / hb tokens: warp w takes head h0 + w % hb at tokens t0 + 16 (w / hb) .. + 15 (hb > 1 fills
// the tile at small T; the heads share the block's K/V tiles). Grid: (kv head x head group, token
// tile, key split); token tiles run last-first (the causal ones with most keys start first).
// Keys in tiles of FA_BN = 64 aligned positions, from the first one the block's window needs to
// its last row's position; split z takes a contiguous run of tiles. Per tile:
//   S = Q K^T  (16 x 64 per warp): A = q (f32, times scale * log2(e)) split into three bf16
//              parts q = hi + mid + lo (the remainder is ~2^-24 |q|: the score is f32-exact up to
//              summation order), B = K (bf16, exact); three mma per k-step of 16 dims.
//   mask       (only on tiles a row of the warp sees partly: causal j <= p, window j > p - window).
//   softmax    online, per row, in f32 and base 2 (exp2f of log2e-prescaled scores).
//   O += P V   A = P split as p = hi + lo (bf16; ~2^-17 relative), B = V (exact); two mma per
//              k-step of 16 keys. l sums the f32 p.
// fp8 caches: the e4m3 codes become bf16 exactly as e4m3 * 2^-8 (the f16 bit trick of e4m3x2);
// ks * 2^8 is folded into q's factor and vs * 2^8 into the output's.
//
// Fragments (mma.m16n8k16, g = lane / 4, c = lane % 4): A regs {a0 a1} = row g, cols 2c, 2c + 1;
// {a2 a3} = row g + 8; {a4 a5}, {a6 a7}: the same rows at cols 2c + 8, 2c + 9. B regs {b0 b1} =
// rows (k) 2c, 2c + 1 of col (n) g; {b2 b3}: rows 2c + 8, 2c + 9. C: c0 c1 = row g, cols 2c,
// 2c + 1; c2 c3 = row g + 8. S's C layout of two 8-key tiles is P's A layout of one 16-key step,
// so P never leaves registers. K^T's B fragments come from the K tile ([key][dim], rows padded by
// 16 bytes: conflict-free ldmatrix) by ldmatrix.x4 (matrices: keys 8n.., dims 16k, 16k + 8,
// 16k + 16, 16k + 24), V's by ldmatrix.x4.trans (keys 16s.., 16s + 8.. at dims 8d.., 8d + 8..).
//
// Staging: cp.async (16 bytes, zero-filled past the chunk's last key) of K tile i + 1 while the
// warps do the softmax and P V of tile i, of V tile i during Q K^T of tile i; one buffer each
// (48 KB of static shared memory is the limit). fp8: the codes go to a byte tile first, and each
// thread converts the 16-byte pieces it copied itself (no barrier in between).
//
// Outputs as attn_impl: out [T, heads * D] (splits == 1) or the partials (o, m, l) for
// attn_combine (m converted to natural-log units).
#define FA_BN 64     // keys per tile
#define FA_WARPS 4   // warps per block (16 query rows each)
#define FA_LOG2E 1.4426950408889634f
#define FA_LN2 0.6931471805599453f
#define FA_FP8_UNIT 256.f  // fp8 tiles hold e4m3 * 2^-8
#ifndef FA_QPARTS
#define FA_QPARTS 3  // bf16 parts of q
#endif

// Four e4m3 codes (byte i = code i) as two bf16 pairs of e4m3 * 2^-8, exactly (codes 0, 1 in the
// first). The NaN codes (0x7f, 0xff) become NaN, as e4m3_to_f32 decodes them.
__device__ __forceinline__ void e4m3x4_bf16(u32 v, u32& a, u32& b) {
    const float2 p = e4m3x2(v), q = e4m3x2(v >> 16);
    a = (__float_as_uint(p.x) >> 16) | (__float_as_uint(p.y) & 0xffff0000u);
    b = (__float_as_uint(q.x) >> 16) | (__float_as_uint(q.y) & 0xffff0000u);
    if (((v & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u) {  // some code is 0x7f or 0xff
        const u32 hi[2] = {a, b};
        u32 o[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            u32 x = hi[i];
            if (((v >> (16 * i)) & 0x7fu) == 0x7fu) x = (x & 0xffff0000u) | 0x7fc0u;
            if (((v >> (16 * i + 8)) & 0x7fu) == 0x7fu) x = (x & 0xffffu) | 0x7fc00000u;
            o[i] = x;
        }
        a = o[0];
        b = o[1];
    }
}

// Shared memory of one block: the K and V tiles (bf16, rows padded to D + 8 values) and, for fp8
// caches, the byte tile the codes land in.
template <int D, bool FP8>
struct FaSmem {
    static constexpr int LD = D + 8;  // u16 per padded tile row
    u16 k[FA_BN * LD];
    u16 v[FA_BN * LD];
    u8 raw[FP8 ? FA_BN * D : 16];
};

// Issues the copies of one K or V tile (keys kb .. kb + 63 of kv head kv) into `dst` (bf16) or
// `raw` (fp8): key j < pos0 from the cache's keys (isv = 0) or values (isv = 1) through its block
// table kt (ring slot j % window where window > 0), j >= pos0 from
// `chunk` row j - pos0, j > kend zero. Thread tid copies 16-byte piece `tid % CPR` of rows
// tid / CPR + i * (128 / CPR) (the same pieces for K and V: fa_convert relies on it).
template <int D, bool FP8>
__device__ __forceinline__ void fa_stage(u16* dst, u8* raw, const u64* __restrict__ kt, int isv,
                                         const u8* __restrict__ chunk, int kb, int kend, int pos0, int window, int kvh,
                                         int kv) {
    constexpr int E = FP8 ? 1 : 2;         // bytes per value
    constexpr int CPR = D * E / 16;        // 16-byte pieces per row
    constexpr int RPP = FA_WARPS * 32 / CPR;  // rows per pass of the block
    const int tid = threadIdx.x;
    const int col = tid % CPR;
    const long rwb = (long)kvh * D * E;  // bytes per cache / chunk row
    const long off = (long)kv * D * E + col * 16;
    const int slotb = window > 0 ? kb % window : 0;
    const u32 base = FP8 ? smem_u32(raw) : smem_u32(dst);
    const int stride = FP8 ? D : (D + 8) * 2;  // bytes per row of the destination
    // Most tiles are 64 consecutive rows of one buffer (no chunk boundary, no ring wrap, no key
    // past the chunk): one base pointer, no per-row cases.
    const u8* lin = nullptr;
    if (kb + FA_BN - 1 <= kend) {
        if (kb >= pos0) {
            lin = chunk + (long)(kb - pos0) * rwb;
        } else if (kb + FA_BN <= pos0 &&
                   (window == 0 || (window >= FA_BN && slotb % FA_BN == 0 && slotb + FA_BN <= window))) {
            // (an aligned tile of 64 slots is one cache block)
            lin = kv_row<const u8>(kt, window > 0 ? slotb : kb, rwb, isv);
        }
    }
    if (lin) {
        const u8* src = lin + off + (long)(tid / CPR) * rwb;
        const u32 d0 = base + (tid / CPR) * stride + col * 16;
#pragma unroll
        for (int i = 0; i < FA_BN / RPP; i++) cp_async16(d0 + i * RPP * stride, src + (long)i * RPP * rwb, true);
        return;
    }
#pragma unroll
    for (int i = 0; i < FA_BN / RPP; i++) {
        const int r = tid / CPR + i * RPP;
        const int j = kb + r;
        const bool ok = j <= kend;
        const u8* src = chunk;
        if (ok) {
            if (j < pos0) {
                long s = j;
                if (window > 0) {
                    if (window >= FA_BN) {
                        s = slotb + r;
                        if (s >= window) s -= window;
                    } else {
                        s = j % window;
                    }
                }
                src = kv_row<const u8>(kt, s, rwb, isv) + off;
            } else {
                src = chunk + (long)(j - pos0) * rwb + off;
            }
        }
        cp_async16(base + r * stride + col * 16, src, ok);
    }
}

// fp8: converts the pieces this thread copied with fa_stage (after its cp_async_wait) from the byte
// tile into the bf16 tile `dst`.
template <int D>
__device__ __forceinline__ void fa_convert(u16* dst, const u8* raw) {
    constexpr int CPR = D / 16;
    constexpr int RPP = FA_WARPS * 32 / CPR;
    const int tid = threadIdx.x;
    const int col = tid % CPR;
#pragma unroll
    for (int i = 0; i < FA_BN / RPP; i++) {
        const int r = tid / CPR + i * RPP;
        const uint4 c = *(const uint4*)(raw + r * D + col * 16);
        uint4 lo, hi;
        e4m3x4_bf16(c.x, lo.x, lo.y);
        e4m3x4_bf16(c.y, lo.z, lo.w);
        e4m3x4_bf16(c.z, hi.x, hi.y);
        e4m3x4_bf16(c.w, hi.z, hi.w);
        uint4* d = (uint4*)(dst + r * (D + 8) + col * 16);
        d[0] = lo;
        d[1] = hi;
    }
}

template <int D, bool FP8>
__device__ void attn_flash_impl(const float* __restrict__ q, const u64* __restrict__ kt,
                                const u8* __restrict__ kx, const u8* __restrict__ vx, float* __restrict__ out,
                                float* __restrict__ part_o, float* __restrict__ part_ml, int T, int heads, int kvh,
                                float scale, int pos0, int window, int splits, int hb, float ks, float vs) {
    constexpr int KS = D / 16;  // k-steps of Q K^T
    constexpr int DT = D / 8;   // 8-dim tiles of O
    constexpr int LD = D + 8;
    __shared__ __align__(16) FaSmem<D, FP8> sm;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int G = heads / kvh;
    const int ngrp = G / hb;
    const int kv = blockIdx.x / ngrp, grp = blockIdx.x % ngrp;
    const int tb = 16 * FA_WARPS / hb;                    // tokens per block
    const int t0 = (gridDim.y - 1 - blockIdx.y) * tb;     // last tiles first
    const int h = kv * G + grp * hb + w % hb;             // the warp's head
    const int tw = t0 + 16 * (w / hb);                    // the warp's first token
    const int z = blockIdx.z;
    const int kend = pos0 + T - 1;                        // the chunk's last key

    // The block's key tiles (positions of its first and last real row), this split's share.
    const int pfirst = pos0 + t0, plast = pos0 + min(t0 + tb, T) - 1;
    const int kb0 = (window > 0 ? max(0, pfirst + 1 - window) : 0) & ~(FA_BN - 1);
    const int ntiles = (plast - kb0) / FA_BN + 1;
    const int per = (ntiles + splits - 1) / splits;
    const int i0 = z * per, i1 = min(ntiles, i0 + per);

    // The warp's rows (positions of rows g and g + 8 of this lane; the warp's first and last).
    const int pw0 = pos0 + tw, pw1 = pw0 + 15;
    const int pr0 = pw0 + g, pr1 = pr0 + 8;
    const bool live = tw < T;  // some row of the warp is real

    // q fragments: three bf16 parts of q * scale * log2(e) (fp8: also * ks * 2^8).
    u32 qf[FA_QPARTS][KS][4];
    {
        const float qs = scale * FA_LOG2E * (FP8 ? ks * FA_FP8_UNIT : 1.f);
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            const int t = tw + g + 8 * rr;
            const float* qr = q + ((long)t * heads + h) * D + 2 * c;
#pragma unroll
            for (int k = 0; k < KS; k++) {
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    float2 v = t < T ? *(const float2*)(qr + 16 * k + 8 * hf) : make_float2(0.f, 0.f);
                    u32 part[FA_QPARTS];
                    bf16x2_parts(v.x * qs, v.y * qs, part);
#pragma unroll
                    for (int p = 0; p < FA_QPARTS; p++) qf[p][k][rr + 2 * hf] = part[p];
                }
            }
        }
    }

    float o[DT][4];
#pragma unroll
    for (int d = 0; d < DT; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
    float m0 = -INF_F, m1 = -INF_F, l0 = 0.f, l1 = 0.f;

    const u32 ks_base = smem_u32(sm.k), vs_base = smem_u32(sm.v);
    // ldmatrix row addresses of this lane (bytes, before the tile offsets).
    const u32 k_lane = ks_base + ((lane & 7) * LD + 8 * (lane >> 3)) * 2;
    const u32 v_lane = vs_base + (((lane & 7) + 8 * ((lane >> 3) & 1)) * LD + 8 * (lane >> 4)) * 2;

    if (i0 < i1) {
        fa_stage<D, FP8>(sm.k, sm.raw, kt, 0, kx, kb0 + i0 * FA_BN, kend, pos0, window, kvh, kv);
        cp_async_commit();
        if (FP8) {
            cp_async_wait<0>();
            fa_convert<D>(sm.k, sm.raw);
        }
    }
    for (int it = i0; it < i1; it++) {
        const int kb = kb0 + it * FA_BN;
        const bool more = it + 1 < i1;
        // Warps whose rows see no key of this tile only stage.
        const bool act = live && kb <= pw1 && (window == 0 || kb + FA_BN - 1 > pw0 - window);
        if (FP8) __syncthreads();  // K tile converted; every warp done with the last V tile
        fa_stage<D, FP8>(sm.v, sm.raw, kt, 1, vx, kb, kend, pos0, window, kvh, kv);
        cp_async_commit();
        if (!FP8) {
            cp_async_wait<1>();  // this tile's K (its V may still be in flight)
            __syncthreads();
        }

        // ---- S = Q K^T
        float s[FA_BN / 8][4];
#pragma unroll
        for (int n = 0; n < FA_BN / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
        if (act) {
#pragma unroll
            for (int k2 = 0; k2 < KS / 2; k2++) {
#pragma unroll
                for (int n = 0; n < FA_BN / 8; n++) {
                    u32 b[4];
                    ldsm_x4(b, k_lane + (8 * n * LD + 32 * k2) * 2);
#pragma unroll
                    for (int p = 0; p < FA_QPARTS; p++) mma_bf16(s[n], qf[p][2 * k2], b[0], b[1]);
#pragma unroll
                    for (int p = 0; p < FA_QPARTS; p++) mma_bf16(s[n], qf[p][2 * k2 + 1], b[2], b[3]);
                }
            }
        }
        if (FP8) {
            cp_async_wait<0>();  // this tile's V codes (the V tile is free since the loop's top)
            fa_convert<D>(sm.v, sm.raw);
            __syncthreads();  // V tile complete; every warp done with the K tile
            if (more) fa_stage<D, FP8>(sm.k, sm.raw, kt, 0, kx, kb + FA_BN, kend, pos0, window, kvh, kv);
            cp_async_commit();
        } else {
            __syncthreads();  // every warp done with the K tile
            if (more) fa_stage<D, FP8>(sm.k, sm.raw, kt, 0, kx, kb + FA_BN, kend, pos0, window, kvh, kv);
            cp_async_commit();
        }

        if (act) {
            // ---- mask (tiles some row of the warp sees only in part), online softmax
            if (kb + FA_BN - 1 > pw0 || (window > 0 && kb <= pw1 - window)) {
#pragma unroll
                for (int n = 0; n < FA_BN / 8; n++) {
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int j = kb + 8 * n + 2 * c + (e & 1);
                        const int p = e < 2 ? pr0 : pr1;
                        if (j > p || (window > 0 && j <= p - window)) s[n][e] = -INF_F;
                    }
                }
            }
            float x0 = -INF_F, x1 = -INF_F;
#pragma unroll
            for (int n = 0; n < FA_BN / 8; n++) {
                x0 = fmaxf(x0, fmaxf(s[n][0], s[n][1]));
                x1 = fmaxf(x1, fmaxf(s[n][2], s[n][3]));
            }
#pragma unroll
            for (int o2 = 1; o2 < 4; o2 <<= 1) {
                x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, o2));
                x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, o2));
            }
            const float n0 = fmaxf(m0, x0), n1 = fmaxf(m1, x1);
            const float u0 = n0 == -INF_F ? 0.f : n0, u1 = n1 == -INF_F ? 0.f : n1;
            const float c0 = exp2f(m0 - u0), c1 = exp2f(m1 - u1);
            m0 = n0;
            m1 = n1;
            float r0 = 0.f, r1 = 0.f;
#pragma unroll
            for (int n = 0; n < FA_BN / 8; n++) {
                s[n][0] = exp2f(s[n][0] - u0);
                s[n][1] = exp2f(s[n][1] - u0);
                s[n][2] = exp2f(s[n][2] - u1);
                s[n][3] = exp2f(s[n][3] - u1);
                r0 += s[n][0] + s[n][1];
                r1 += s[n][2] + s[n][3];
            }
            l0 = l0 * c0 + r0;
            l1 = l1 * c1 + r1;
#pragma unroll
            for (int d = 0; d < DT; d++) {
                o[d][0] *= c0;
                o[d][1] *= c0;
                o[d][2] *= c1;
                o[d][3] *= c1;
            }
        }

        if (!FP8) {
            cp_async_wait<1>();  // this tile's V (the next K may still be in flight)
            __syncthreads();
        }
        // ---- O += P V
        if (act) {
#pragma unroll
            for (int st = 0; st < FA_BN / 16; st++) {
                // P's A fragment as hi + lo (pairs: keys 2c, 2c + 1 of rows g, g + 8, then of
                // the next 8 keys)
                u32 ph[4], pl[4];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const float* sp = s[2 * st + (i >> 1)] + 2 * (i & 1);
                    u32 part[2];
                    bf16x2_parts(sp[0], sp[1], part);
                    ph[i] = part[0];
                    pl[i] = part[1];
                }
#pragma unroll
                for (int d2 = 0; d2 < DT / 2; d2++) {
                    u32 b[4];
                    ldsm_x4_t(b, v_lane + (16 * st * LD + 16 * d2) * 2);
                    mma_bf16(o[2 * d2], ph, b[0], b[1]);
                    mma_bf16(o[2 * d2 + 1], ph, b[2], b[3]);
                    mma_bf16(o[2 * d2], pl, b[0], b[1]);
                    mma_bf16(o[2 * d2 + 1], pl, b[2], b[3]);
                }
            }
        }
        if (FP8) {
            if (more) {
                cp_async_wait<0>();  // the next K codes; the K tile is free since the barrier above
                fa_convert<D>(sm.k, sm.raw);
            }
        } else {
            __syncthreads();  // every warp done with the V tile
        }
    }

    // ---- outputs: rows g (o[.][0..1], m0, l0) and g + 8 (o[.][2..3], m1, l1) of the warp
#pragma unroll
    for (int o2 = 1; o2 < 4; o2 <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, o2);
        l1 += __shfl_xor_sync(0xffffffffu, l1, o2);
    }
    const float vm = FP8 ? vs * FA_FP8_UNIT : 1.f;
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        const int t = tw + g + 8 * rr;
        if (t >= T) continue;
        const float m = rr ? m1 : m0, l = rr ? l1 : l0;
        const long hh = (long)t * heads + h;
        if (splits == 1) {
            float* dst = out + hh * D + 2 * c;
#pragma unroll
            for (int d = 0; d < DT; d++) {
                const float a = o[d][2 * rr] * vm, b = o[d][2 * rr + 1] * vm;
                *(float2*)(dst + 8 * d) = l > 0.f ? make_float2(a / l, b / l) : make_float2(0.f, 0.f);
            }
        } else {
            float* dst = part_o + (hh * splits + z) * D + 2 * c;
#pragma unroll
            for (int d = 0; d < DT; d++)
                *(float2*)(dst + 8 * d) = make_float2(o[d][2 * rr] * vm, o[d][2 * rr + 1] * vm);
            if (c == 0) {
                part_ml[(hh * splits + z) * 2] = m == -INF_F ? -INF_F : m * FA_LN2;
                part_ml[(hh * splits + z) * 2 + 1] = l;
            }
        }
    }
}

// Prefill attention of T >= ATTN_FLASH_MIN_T rows over bf16 / fp8 caches, head_dim D. Two blocks
// per SM (registers: q's three parts and O stay in them).
#define ATTN_FLASH(NAME, D, FP8)                                                                                       \
    extern "C" __global__ void __launch_bounds__(FA_WARPS * 32, 2)                                                    \
        NAME(const float* q, const u64* kt, const u8* kx, const u8* vx, float* out, float* part_o,                    \
             float* part_ml, int T, int heads, int kvh, float scale, int pos0, int window, int splits, int hb,        \
             float ks, float vs) {                                                                                     \
        pdl_enter();                                                                                                   \
        attn_flash_impl<D, FP8>(q, kt, kx, vx, out, part_o, part_ml, T, heads, kvh, scale, pos0, window, splits,      \
                                hb, ks, vs);                                                                           \
    }
ATTN_FLASH(attn_flash_bf16_64, 64, false)
ATTN_FLASH(attn_flash_bf16_128, 128, false)
ATTN_FLASH(attn_flash_fp8_64, 64, true)
ATTN_FLASH(attn_flash_fp8_128, 128, true)

// ---- batched decode attention on tensor cores ----------------------------------------------------
//
// A batched decode step's attention (attn_dec_batch_*_128_mma; the host takes it for steps of
// CudaOptions::attn_mma rows or more over bf16 or fp8 caches, head_dim 128, at most DMMA_GMAX
// query heads per kv head): block (kv head, sequence, key split z) of AW warps over all G query
// heads of the kv head, the rows of one mma.m16n8k16 tile (rows G..15 zero), so every cached K/V
// row of the split is read once, by one warp, from global memory straight into registers (no
// staging through shared memory). The warps take the split's chunks of DMMA_KEYS keys in turn, each
// chunk's loads all issued before its first mma. Preparation (rope, append) as attn_dec_impl's
// (dec_prepare), then per chunk (fragments as in attn_flash_impl's comment, g = lane / 4,
// c = lane % 4):
//   S = Q K^T  A = q * scale * log2(e) (fp8: also * ks * 2^8) in FA_QPARTS bf16 parts, made once a
//              block into shared memory (qa), B = K: lane (g, c) loads dims 32 k2 + 8c .. + 7 of
//              key g of each 8-key tile (16 contiguous bytes; fp8 8) and uses its words as the B
//              words of k-steps 2 k2 and 2 k2 + 1: a permutation of the head dims, applied to q's
//              fragments alike (a score's products summed in another order, f32-exact each).
//   mask       keys past the split score -inf (their rows read as zeros).
//   softmax    online, per row, base 2, as attn_flash_impl.
//   O += P V   A = P as hi + lo bf16 (S's C fragments, as attn_flash_impl), B = V: lane (g, c)
//              loads dims DT g .. DT g + DT - 1 (DT = D / 8) of keys 2c, 2c + 1, 2c + 8, 2c + 9 of
//              each 16-key step and packs one dim of two keys per B word (__byte_perm): column n
//              of output tile dt is dim DT n + dt.
// The warps' states merge as attn_dec_impl's (dec_merge; wacc swizzled against bank conflicts).
#define DMMA_KEYS 32  // keys per warp chunk
#define DMMA_GMAX 8   // most query heads per kv head (rows of the 16-row tile)

// (attn_dec_impl's parameters; ngroups is 1)
template <int D, bool FP8, int GM>
__device__ void attn_dec_mma_impl(const float* __restrict__ q, const float* __restrict__ kch,
                                  const float* __restrict__ vch, const u64* __restrict__ kt, float* __restrict__ out,
                                  float* __restrict__ part_o, float* __restrict__ part_ml, int heads, int kvh,
                                  float scale, int pos0, int window, int splits, int ngroups, const Prep& pp,
                                  float ks, float vs) {
    static_assert(D == 128, "the lanes' V slices are whole 16-byte pieces at head_dim 128");
    static_assert(GM == DMMA_GMAX, "a block's heads are the rows of one 16-row tile");
    typedef DecKv<FP8> Kv;
    typedef typename Kv::T KT;
    typedef typename Kv::KChunk KChunk;   // 8 key values
    constexpr int KS = D / 16;            // k-steps of Q K^T
    constexpr int K2 = D / 32;            // key pieces a lane loads per key
    constexpr int DT = D / 8;             // output tiles; a lane's V dims per key
    constexpr int VU = DT * sizeof(KT) / 16;  // uint4 a lane loads per value row
    constexpr int LDA = D + D / 32;       // wacc's row stride (swizzled: dim d at d + d / 32)
    __shared__ DecPrepSmem<D, KT, GM> sp;
    __shared__ uint2 qa[FA_QPARTS][KS][32];
    __shared__ float wm[AW][GM], wl[AW][GM];
    __shared__ float wacc[AW][GM * LDA];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int kv = blockIdx.x;
    const int G = heads / kvh;  // (<= GM: the host's check)
    const int h0 = kv * G;
    const int z = blockIdx.z;
    const int p = pos0;
    const int2 span = split_keys(p, window, splits, z);
    const int s0 = span.x, s1 = span.y;
    const long rw = (long)kvh * D;
    dec_prepare<D, FP8, GM>(sp, q, kch, vch, kv, 0, h0, G, p, s0 <= p && p < s1, rw, scale, pp, ks, vs);

    // q's A fragments (rows g < G; A[1], A[3] are rows 8.. and zero): qa[part][kk][lane] = {A[0], A[2]}
    {
        const float f = FA_LOG2E * (FP8 ? ks * FA_FP8_UNIT : 1.f);
        for (int i = threadIdx.x; i < KS * 32; i += blockDim.x) {
            const int kk = i / 32, ln = i % 32, gg = ln >> 2, cc = ln & 3;
            const int d0 = 32 * (kk >> 1) + 8 * cc + 4 * (kk & 1);
            float x0 = 0.f, x1 = 0.f, y0 = 0.f, y1 = 0.f;
            if (gg < G) {
                x0 = sp.qs[gg][d0] * f;
                x1 = sp.qs[gg][d0 + 1] * f;
                y0 = sp.qs[gg][d0 + 2] * f;
                y1 = sp.qs[gg][d0 + 3] * f;
            }
            u32 px[FA_QPARTS], py[FA_QPARTS];
            bf16x2_parts(x0, x1, px);
            bf16x2_parts(y0, y1, py);
#pragma unroll
            for (int pt = 0; pt < FA_QPARTS; pt++) qa[pt][kk][ln] = make_uint2(px[pt], py[pt]);
        }
    }
    __syncthreads();

    float o[DT][2];  // row g: dims DT (2c) + dt, DT (2c + 1) + dt
#pragma unroll
    for (int dt = 0; dt < DT; dt++) o[dt][0] = o[dt][1] = 0.f;
    float m = -INF_F, l = 0.f;
    const long koff = (long)kv * D;
    for (int jb = s0 + wid * DMMA_KEYS; jb < s1; jb += AW * DMMA_KEYS) {
        // ---- loads (keys of the split; the others zero): K of keys jb + 8t + g, V of keys
        // jb + 16st + {2c, 2c + 1, 2c + 8, 2c + 9}
        KChunk kr[DMMA_KEYS / 8][K2];
#pragma unroll
        for (int t = 0; t < DMMA_KEYS / 8; t++) {
            const int j = jb + 8 * t + g;
            const long slot = window > 0 ? (long)(j % window) : (long)j;
            const KChunk* src = j < p ? (const KChunk*)(kv_row<const KT>(kt, slot, rw, 0) + koff)
                                      : (const KChunk*)sp.kcode;
#pragma unroll
            for (int k2 = 0; k2 < K2; k2++) {
                KChunk v = {};
                if (j < s1) v = j < p ? __ldg(src + 4 * k2 + c) : src[4 * k2 + c];
                kr[t][k2] = v;
            }
        }
        uint4 vr[DMMA_KEYS / 16][4][VU];
#pragma unroll
        for (int st = 0; st < DMMA_KEYS / 16; st++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int j = jb + 16 * st + 2 * c + (e & 1) + 8 * (e >> 1);
                const long slot = window > 0 ? (long)(j % window) : (long)j;
                const uint4* src =
                    (const uint4*)((j < p ? kv_row<const KT>(kt, slot, rw, 1) + koff : sp.vcode) + DT * g);
#pragma unroll
                for (int u = 0; u < VU; u++) {
                    uint4 v = make_uint4(0u, 0u, 0u, 0u);
                    if (j < s1) v = j < p ? __ldg(src + u) : src[u];
                    vr[st][e][u] = v;
                }
            }
        }
        // ---- S = Q K^T
        float s[DMMA_KEYS / 8][4];
#pragma unroll
        for (int t = 0; t < DMMA_KEYS / 8; t++) s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
            u32 a[FA_QPARTS][4];
#pragma unroll
            for (int pt = 0; pt < FA_QPARTS; pt++) {
                const uint2 w = qa[pt][kk][lane];
                a[pt][0] = w.x;
                a[pt][1] = 0u;
                a[pt][2] = w.y;
                a[pt][3] = 0u;
            }
#pragma unroll
            for (int t = 0; t < DMMA_KEYS / 8; t++) {
                u32 b0, b1;
                if constexpr (FP8) {
                    e4m3x4_bf16((kk & 1) ? kr[t][kk >> 1].y : kr[t][kk >> 1].x, b0, b1);
                } else {
                    b0 = (kk & 1) ? kr[t][kk >> 1].z : kr[t][kk >> 1].x;
                    b1 = (kk & 1) ? kr[t][kk >> 1].w : kr[t][kk >> 1].y;
                }
#pragma unroll
                for (int pt = 0; pt < FA_QPARTS; pt++) mma_bf16(s[t], a[pt], b0, b1);
            }
        }
        // ---- mask, online softmax (row g; the row's 4 lanes c hold its keys)
        if (jb + DMMA_KEYS > s1) {
#pragma unroll
            for (int t = 0; t < DMMA_KEYS / 8; t++) {
                if (jb + 8 * t + 2 * c >= s1) s[t][0] = -INF_F;
                if (jb + 8 * t + 2 * c + 1 >= s1) s[t][1] = -INF_F;
            }
        }
        float x = -INF_F;
#pragma unroll
        for (int t = 0; t < DMMA_KEYS / 8; t++) x = fmaxf(x, fmaxf(s[t][0], s[t][1]));
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
        const float mn = fmaxf(m, x);  // (finite: the chunk holds a key of the split)
        const float corr = exp2f(m - mn);
        m = mn;
        float r = 0.f;
#pragma unroll
        for (int t = 0; t < DMMA_KEYS / 8; t++) {
            s[t][0] = exp2f(s[t][0] - mn);
            s[t][1] = exp2f(s[t][1] - mn);
            r += s[t][0] + s[t][1];
        }
        l = l * corr + r;
#pragma unroll
        for (int dt = 0; dt < DT; dt++) {
            o[dt][0] *= corr;
            o[dt][1] *= corr;
        }
        // ---- O += P V
#pragma unroll
        for (int st = 0; st < DMMA_KEYS / 16; st++) {
            u32 ph[4], pl[4], pa[2], pb[2];
            bf16x2_parts(s[2 * st][0], s[2 * st][1], pa);
            bf16x2_parts(s[2 * st + 1][0], s[2 * st + 1][1], pb);
            ph[0] = pa[0];
            pl[0] = pa[1];
            ph[2] = pb[0];
            pl[2] = pb[1];
            ph[1] = ph[3] = pl[1] = pl[3] = 0u;
            // the four keys' DT values as bf16 pairs (dims 2i, 2i + 1 in word i)
            u32 vw[4][DT / 2];
#pragma unroll
            for (int e = 0; e < 4; e++) {
#pragma unroll
                for (int u = 0; u < VU; u++) {
                    const uint4 v = vr[st][e][u];
                    if constexpr (FP8) {
                        e4m3x4_bf16(v.x, vw[e][8 * u], vw[e][8 * u + 1]);
                        e4m3x4_bf16(v.y, vw[e][8 * u + 2], vw[e][8 * u + 3]);
                        e4m3x4_bf16(v.z, vw[e][8 * u + 4], vw[e][8 * u + 5]);
                        e4m3x4_bf16(v.w, vw[e][8 * u + 6], vw[e][8 * u + 7]);
                    } else {
                        vw[e][4 * u] = v.x;
                        vw[e][4 * u + 1] = v.y;
                        vw[e][4 * u + 2] = v.z;
                        vw[e][4 * u + 3] = v.w;
                    }
                }
            }
#pragma unroll
            for (int dt = 0; dt < DT; dt++) {
                const u32 sel = (dt & 1) ? 0x7632u : 0x5410u;
                const u32 bw0 = __byte_perm(vw[0][dt >> 1], vw[1][dt >> 1], sel);
                const u32 bw1 = __byte_perm(vw[2][dt >> 1], vw[3][dt >> 1], sel);
                float acc[4] = {o[dt][0], o[dt][1], 0.f, 0.f};
                mma_bf16(acc, ph, bw0, bw1);
                mma_bf16(acc, pl, bw0, bw1);
                o[dt][0] = acc[0];
                o[dt][1] = acc[1];
            }
        }
    }

    // ---- the warp's state into shared memory (natural-log maxima), then the block's merge
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (g < G) {
        const float vm = FP8 ? vs * FA_FP8_UNIT : 1.f;
        if (c == 0) {
            wm[wid][g] = m == -INF_F ? -INF_F : m * FA_LN2;
            wl[wid][g] = l;
        }
#pragma unroll
        for (int dt = 0; dt < DT; dt++) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int d = DT * (2 * c + h) + dt;
                wacc[wid][g * LDA + d + d / 32] = o[dt][h] * vm;
            }
        }
    }
    __syncthreads();
    dec_merge<D, GM, LDA, true>(wm, wl, wacc, G, h0, z, splits, out, part_o, part_ml, pp);
}

// The batched decode step's attention on tensor cores (ATTN_KERNEL_DEC_BATCH's grid and
// sequences; two blocks a SM).
ATTN_KERNEL_DEC_BATCH(attn_dec_batch_bf16_128_mma, 128, false, 2, DMMA_GMAX, attn_dec_mma_impl)
ATTN_KERNEL_DEC_BATCH(attn_dec_batch_fp8_128_mma, 128, true, 2, DMMA_GMAX, attn_dec_mma_impl)

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
