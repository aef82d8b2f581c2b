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
        // (no score compares when they are NaN: a valid expert and a NaN weight, so that the NaN
        // reaches the token's output as the CPU's sort gives it, and no item reads past the
        // experts' weights)
        const bool none = bi == 0x7fffffff;
        if (none) bi = r;
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
        if (none) sv = __int_as_float(0x7fc00000);
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

// Expert weights to prefetch into L2 once an item's expert e is known: for each part i with a
// base, bytes[i] bytes at base[i] + e * bytes[i] (one projection's weights or scales, stacked per
// expert), for the items below `items` (0: none).
struct ExpertPrefetch {
    const u8* base[4];
    long bytes[4];
    int items;
    int _pad;
};

// Issues the prefetch of `pf` for expert e (< n experts), split over `lanes` lanes; part of
// `slice` of `slices` (slice boundaries at 16 bytes) of each range.
__device__ __forceinline__ void expert_prefetch(const ExpertPrefetch& pf, long e, int n, int slice, int slices,
                                                int lane, int lanes) {
    if (e < 0 || e >= n) return;
#pragma unroll 1
    for (int i = 0; i < 4; i++) {
        if (!pf.base[i]) continue;
        const long b = pf.bytes[i], lo = (b * slice / slices) & ~15l, hi = slice + 1 == slices ? b : (b * (slice + 1) / slices) & ~15l;
        l2_prefetch(pf.base[i] + e * b + lo, hi - lo, lane, lanes);
    }
}

// Top-k routing, one warp per block: token blockIdx.x. With `pf.items`, the grid is (T, k) and
// block (t, q) also prefetches the weights of token t's q-th expert (item t * k + q, if below
// pf.items; every block of a token computes its top-k, block (t, 0) writes it).
extern "C" __global__ void route(const float* __restrict__ logits, const float* __restrict__ bias, int n, int k,
                                int softmax, int normalize, float softcap, float scale, int* __restrict__ sel,
                                float* __restrict__ wts, ExpertPrefetch pf) {
    __shared__ int ssel[32];
    __shared__ float swts[32];
    pdl_enter();
    const int t = blockIdx.x, q = blockIdx.y, lane = threadIdx.x & 31;
    route_token(logits + (long)t * n, bias, n, k, softmax, normalize, softcap, scale, ssel, swts, 0);
    __syncwarp();
    if (q == 0 && lane < k) {
        sel[t * k + lane] = ssel[lane];
        wts[t * k + lane] = swts[lane];
    }
    if (q < k && t * k + q < pf.items) expert_prefetch(pf, ssel[q], n, 0, 1, lane, 32);
}

#define ROUTE_TAIL_MAX 256  // experts of a router whose top-k runs as gemv_mt_bf16_topk's tail

template <bool NC>
__device__ void align_items(const int* sel, int items, int E, int bn, int* __restrict__ order,
                            int* __restrict__ tiles, int* __restrict__ ntiles, int* cnt, int* off);

// The router's bf16 gemv_mt (gemv_mt_bf16's bits: logits = W x[t] of the T staged rows into
// segs' one segment), then its top-k as the tail of the block that finishes last (`ticket`, a
// counter at zero between launches, reset by that block): one warp a token reads the token's
// logits through L2 (other blocks wrote them) and routes them as `route` does (sel / wts of
// `route_token`: the same bits). One launch instead of two. n <= ROUTE_TAIL_MAX, k <= 32.
// bn > 0: that block then also groups the T k items by expert in tiles of up to bn (moe_align's
// order / tiles / ntiles, for the few-items-per-tile experts): one launch instead of three.
extern "C" __global__ void __launch_bounds__(256) gemv_mt_bf16_topk(Segs segs, const uint2* __restrict__ xb,
                                                                   const float* __restrict__ xds, int K, int T,
                                                                   int ks, const float* __restrict__ bias_e, int n,
                                                                   int k, int softmax, int normalize, float softcap,
                                                                   float scale, int* __restrict__ sel,
                                                                   float* __restrict__ wts, u32* ticket, int bn,
                                                                   int* __restrict__ order, int* __restrict__ tiles,
                                                                   int* __restrict__ ntiles) {
    gemv_mt_impl<2, MT_BF_U, MT_BF_GROUPS>(segs, xb, xds, nullptr, nullptr, K, T, ks);
    __shared__ unsigned last;
    __shared__ float lg[8][ROUTE_TAIL_MAX];
    __shared__ int ssel[8][32];
    __shared__ float swts[8][32];
    __threadfence();  // (this block's logits before its ticket)
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(ticket, 1u) + 1 == gridDim.x * gridDim.y;
    __syncthreads();
    if (!last) return;
    __threadfence();
    const float* logits = segs.s[0].y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (int t = warp; t < T; t += warps) {
        for (int e = lane; e < n; e += 32) lg[warp][e] = ld_cg(logits + (long)t * n + e);
        __syncwarp();
        route_token(lg[warp], bias_e, n, k, softmax, normalize, softcap, scale, ssel[warp], swts[warp], 0);
        __syncwarp();
        if (lane < k) {
            sel[t * k + lane] = ssel[warp][lane];
            wts[t * k + lane] = swts[warp][lane];
        }
        __syncwarp();
    }
    if (bn > 0) {
        __shared__ int cnt[ROUTE_TAIL_MAX], off[ROUTE_TAIL_MAX];
        __syncthreads();  // (every token's sel written)
        align_items<false>(sel, T * k, n, bn, order, tiles, ntiles, cnt, off);
    }
    if (threadIdx.x == 0) *ticket = 0u;
}

// One projection of all experts of a layer, stacked: expert e's rows start at e * rows.
struct ExpertProj {
    const void* w;         // [E, rows, K] (or packed [E, rows, K/2])
    const u8* scales;      // NVFP4: [E, rows, K/16]
    const float* inv_g;    // NVFP4: [E]
    int fmt;
};

// Where a warp of an expert's 16-row tile reads: tile rows `row0..` of projection P, chunks [c0, c1).
template <int U>
__device__ __forceinline__ void mma_start_group(MmaTile<U>& m, const ExpertProj& P, long row0, int nrows, int K,
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

// Item j of grid row y (default: blockIdx.y): the shared expert's items (j >= T*k) are scheduled
// first (they are the largest when the shared expert is BF16), then the routed ones.
__device__ __forceinline__ int expert_item(int has_shared, int T, int k, int y = -1) {
    if (y < 0) y = blockIdx.y;
    if (!has_shared) return y;
    return y < T ? T * k + y : y - T;
}

// h[j, o..o+XR) = silu(gate_e . x[t]) * (up_e . x[t]) for item j (token t = j / k, expert
// e = sel[j]; items j >= T*k: the shared expert of token j - T*k). XR rows of gate and XR of up
// per warp, their loads issued together.
// With `mma` (blocks of 8 warps), NVFP4 gate and up with K % 128 == 0 take the tensor-core path:
// the block's 16 gate rows are one tile (warps 0-3), its 16 up rows another (warps 4-7); once
// they are read, warp 1 prefetches the block's share (blockIdx.x of gridDim.x) of the item's
// down projection into L2 (`dpf`: routed items below dpf.items). `ahead` > 0: warp 7 first
// prefetches the gate and up rows of the block `ahead` grid rows later, if its item is a routed
// one the top-k did not prefetch (items from `gu_prefetched` on). `xbs` (null: none): the T rows of
// x already staged as xb_stage writes them for NVFP4 (entries xbs, scales xds, e.g. by the norm
// that produced x): the tensor-core path then reads its B there instead of staging x itself (the
// same entries and scale, so the same bits).
// TC_ONLY (`experts_gate_up2_tc`): the tensor-core path alone, for launches the host has checked
// it covers (no shared items, NVFP4 gate and up, K % 128 == 0, K <= XS_MAX, 8 warps), with SLOTS
// chunk slots a lane: without the CUDA-core path and at 2 slots, under 85 registers, so three
// blocks a SM (the default: two, at MMA_U).
template <bool TC_ONLY, int SLOTS>
__device__ __forceinline__ void experts_gate_up2_impl(ExpertProj gate, ExpertProj up, ExpertProj sgate, ExpertProj sup,
                                                      int has_shared, int shared_inter, const int* __restrict__ sel,
                                                      int k, int T, const float* __restrict__ x, float* __restrict__ h,
                                                      int inter, int K, int mma, int experts, ExpertPrefetch dpf,
                                                      int ahead, int gu_prefetched, const uint2* __restrict__ xbs,
                                                      const float* __restrict__ xds, float4* xs) {
    const int warps = blockDim.x >> 5;
    const long o = ((long)blockIdx.x * warps + (threadIdx.x >> 5)) * XR;
    const int j = expert_item(has_shared, T, k);
    const bool sh = j >= T * k;
    const int n = sh ? shared_inter : inter;
    if (TC_ONLY || (mma && !sh && gate.fmt == 3 && up.fmt == 3 && (K & 127) == 0 && K <= XS_MAX && warps == 8 && XR == 2)) {
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
        MmaTile<SLOTS> m;
        mma_start_group(m, P, r0, nrows, K, part * nc / 4, (part + 1) * nc / 4);
        if (ahead > 0 && warp == 7 && (int)blockIdx.y + ahead < (int)gridDim.y) {
            const int j2 = expert_item(has_shared, T, k, blockIdx.y + ahead);
            if (j2 < T * k && j2 >= gu_prefetched) {
                const long r2 = (long)sel[j2] * n + ob;
                l2_prefetch_nv_rows(gate.w, gate.scales, r2, nrows, K, lane, 32);
                l2_prefetch_nv_rows(up.w, up.scales, r2, nrows, K, lane, 32);
            }
        }
        const int t = j / k;
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        float ds;
        if (xbs) {
            // lanes 0-7 feed the item's token (run's B lanes), the others zeros
            ds = xds[t];
            const uint4* xl = (const uint4*)(xbs + (long)t * (K / 2)) + 4 * (lane & 7);
            if (nrows > 0) m.template run_staged<1>(xl, 0, lane < 8 ? 1u : 0u, (float(*)[4])acc);
        } else {
            ds = xb_fill((uint2*)xs, x + (long)t * K, K);
            if (nrows > 0) m.run((const uint2*)xs, acc);
        }
        const float v = mma_reduce(acc, red, 4);  // warp 0: the gate rows (warps 0-3)
        if (warp == 0 && lane < nrows) {
            float uv = 0.f;
#pragma unroll
            for (int p = 0; p < 4; p++) uv += red[4 + p][lane];
            const float gv = v * (64.f * ds * gate.inv_g[ee]);
            uv *= 64.f * ds * up.inv_g[ee];
            h[(long)j * max(inter, shared_inter) + ob + lane] = silu_times(gv, uv);
        }
        if (warp == 1 && j < dpf.items) expert_prefetch(dpf, ee, experts, blockIdx.x, gridDim.x, lane, 32);
        return;
    }
    if (TC_ONLY) return;
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
        if ((threadIdx.x & 31) == 0 && r < nrows) h[(long)j * width + o + r] = silu_times(gv, uv);
    }
}

extern "C" __global__ void __launch_bounds__(256, 2) experts_gate_up2(ExpertProj gate, ExpertProj up, ExpertProj sgate, ExpertProj sup,
                                           int has_shared, int shared_inter, const int* __restrict__ sel, int k,
                                           int T, const float* __restrict__ x, float* __restrict__ h, int inter,
                                           int K, int mma, int experts, ExpertPrefetch dpf, int ahead,
                                           int gu_prefetched, const uint2* __restrict__ xbs,
                                           const float* __restrict__ xds) {
    __shared__ float4 xs[XS_MAX / 4];
    experts_gate_up2_impl<false, MMA_U>(gate, up, sgate, sup, has_shared, shared_inter, sel, k, T, x, h, inter, K,
                                        mma, experts, dpf, ahead, gu_prefetched, xbs, xds, xs);
}
extern "C" __global__ void __launch_bounds__(256, 3) experts_gate_up2_tc(ExpertProj gate, ExpertProj up, ExpertProj sgate, ExpertProj sup,
                                           int has_shared, int shared_inter, const int* __restrict__ sel, int k,
                                           int T, const float* __restrict__ x, float* __restrict__ h, int inter,
                                           int K, int mma, int experts, ExpertPrefetch dpf, int ahead,
                                           int gu_prefetched, const uint2* __restrict__ xbs,
                                           const float* __restrict__ xds) {
    __shared__ float4 xs[XS_MAX / 4];
    experts_gate_up2_impl<true, 2>(gate, up, sgate, sup, has_shared, shared_inter, sel, k, T, x, h, inter, K, mma,
                                   experts, dpf, ahead, gu_prefetched, xbs, xds, xs);
}

// part[j, o] = w_j * down_{sel[j]}[o] . h[j] (w = 1 for the shared expert's items j >= T*k).
// grid (ceil(H / (warps * XRD)), T*k (+ T)).
// With `mma` (blocks of 4 or 8 warps), NVFP4 experts with K % 128 == 0 take the tensor-core path:
// the block's 32 or 64 rows are tiles of 2 warps each (the same arithmetic per row either way).
// TC_ONLY (`experts_down2_tc`): the tensor-core path alone, for launches the host has checked it
// covers (no shared items, NVFP4 down, inter % 128 == 0 and at most XSD_TC, 4 warps): h staged
// in a smaller shared array, fewer registers, five blocks a SM (experts_down2: three).
#define XSD_TC 2048  // floats of h in experts_down2_tc's shared memory
template <bool TC_ONLY = false>
__device__ __forceinline__ void experts_down2_impl(ExpertProj down, ExpertProj sdown, int shared_inter,
                                                   const int* __restrict__ sel, const float* __restrict__ wts, int k,
                                                   int T, const float* __restrict__ h, int inter,
                                                   float* __restrict__ part, int H, int mma) {
    const int warps = blockDim.x >> 5;
    __shared__ float4 xs[(TC_ONLY ? XSD_TC : XS_MAX) / 4];
    if (TC_ONLY || (mma && down.fmt == 3 && (inter & 127) == 0 && inter <= XS_MAX && (warps == 4 || warps == 8) &&
                    XRD == 8 && expert_item(gridDim.y > T * k, T, k) < T * k)) {
        __shared__ float red[8][16];
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
        const int j = expert_item(gridDim.y > T * k, T, k);
        const long ob = (long)blockIdx.x * (warps * XRD) + (warp >> 1) * 16;
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
    if (TC_ONLY) return;
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

// experts_down2: ptxas's choice of registers (133: three blocks of 4 warps a SM); experts_down2_tc:
// the tensor-core path alone at five (93 registers, CudaOptions::item_tc); experts_down2_b4:
// at most 128, four blocks a SM, a third more weight loads in flight
// (CudaOptions::down_four_blocks); experts_down2_w8: blocks of 8 warps (64 rows each on the
// tensor-core path, half the blocks: each block's item lookup and staging of h serve twice the
// weights), at most 128 registers, two blocks a SM (CudaOptions::down_eight_warps).
extern "C" __global__ void experts_down2(ExpertProj down, ExpertProj sdown, int shared_inter,
                                        const int* __restrict__ sel, const float* __restrict__ wts, int k, int T,
                                        const float* __restrict__ h, int inter, float* __restrict__ part, int H,
                                        int mma) {
    experts_down2_impl(down, sdown, shared_inter, sel, wts, k, T, h, inter, part, H, mma);
}
extern "C" __global__ void __launch_bounds__(128, 4)
    experts_down2_b4(ExpertProj down, ExpertProj sdown, int shared_inter, const int* __restrict__ sel,
                     const float* __restrict__ wts, int k, int T, const float* __restrict__ h, int inter,
                     float* __restrict__ part, int H, int mma) {
    experts_down2_impl(down, sdown, shared_inter, sel, wts, k, T, h, inter, part, H, mma);
}
extern "C" __global__ void __launch_bounds__(256, 2)
    experts_down2_w8(ExpertProj down, ExpertProj sdown, int shared_inter, const int* __restrict__ sel,
                     const float* __restrict__ wts, int k, int T, const float* __restrict__ h, int inter,
                     float* __restrict__ part, int H, int mma) {
    experts_down2_impl(down, sdown, shared_inter, sel, wts, k, T, h, inter, part, H, mma);
}
extern "C" __global__ void __launch_bounds__(128, 5)
    experts_down2_tc(ExpertProj down, ExpertProj sdown, int shared_inter, const int* __restrict__ sel,
                     const float* __restrict__ wts, int k, int T, const float* __restrict__ h, int inter,
                     float* __restrict__ part, int H, int mma) {
    experts_down2_impl<true>(down, sdown, shared_inter, sel, wts, k, T, h, inter, part, H, mma);
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
            if (lane == 0) h[(long)k * width + o] = silu_times(gv, uv);
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
            h[(long)item * width + ob + lane] = silu_times(gv, uv);
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

// experts_reduce of token blockIdx.x's row, then norm_stage of that row (one block a row,
// norm_stage's block size): out = resid + Σ part in experts_reduce's order, y = rmsnorm(out) · w
// and y staged for gemv_mt, the bits of experts_reduce followed by norm_stage. Each thread sums
// the float4s that rms_norm_regs then reads back on the same thread (no other thread's writes
// are read). out may be resid. H % 128 == 0, H <= 4 * EPI_V * blockDim.
extern "C" __global__ void __launch_bounds__(512) experts_reduce_norm_stage(const float* __restrict__ part, int k, int T,
                                                                            int has_shared, float* out, const float* resid,
                                                                            int H, const float* __restrict__ w,
                                                                            float* __restrict__ y, float eps,
                                                                            uint2* __restrict__ xb_nv, float* __restrict__ ds_nv,
                                                                            uint2* __restrict__ xb_bf, float* __restrict__ ds_bf) {
    pdl_enter();
    const long t = blockIdx.x;
#pragma unroll
    for (int q = 0; q < EPI_V; q++) {
        const int o = 4 * (threadIdx.x + q * (int)blockDim.x);
        if (o >= H) continue;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int j = 0; j < k; j++) {
            const float4 p = *(const float4*)(part + (t * k + j) * H + o);
            v = make_float4(v.x + p.x, v.y + p.y, v.z + p.z, v.w + p.w);
        }
        if (has_shared) {
            const float4 p = *(const float4*)(part + ((long)T * k + t) * H + o);
            v = make_float4(v.x + p.x, v.y + p.y, v.z + p.z, v.w + p.w);
        }
        const float4 r = resid ? *(const float4*)(resid + t * H + o) : make_float4(0.f, 0.f, 0.f, 0.f);
        *(float4*)(out + t * H + o) = make_float4(r.x + v.x, r.y + v.y, r.z + v.z, r.w + v.w);
    }
    norm_stage_row(out, w, y, H, eps, xb_nv, ds_nv, xb_bf, ds_bf, t);
}

// ---- grouped MoE on tensor cores (many tokens: prefill, batched steps) ------------------------
//
// The routed items (token t, slot q: item t * k + q, expert sel[item]) are grouped by expert
// (`moe_align`), so that each expert's weights are read once per GT_BN of its items instead of
// once per item; then one launch computes gate/up for every (expert, tile of up to GT_BN items)
// and one launch down (the tiled tensor-core core of prefill.cu, gt_mainloop, with the token rows
// gathered). Outputs stay indexed by item (h [items, inter], part [items, H]), so the ordered sum
// `experts_reduce` is unchanged and the result does not depend on the grouping.

#define MA_EMAX 1024  // most experts moe_align handles: one a thread of its block
#define MA_ILP 8       // loads of sel each thread has in flight

// Groups `items` routed items by expert: order[] lists the items expert by expert, tiles[i] =
// (expert, first index into order, items (<= bn), 0) for tiles 0 .. *ntiles; `tiles` holds 4
// ints per tile. The calling block's threads (a multiple of 32, at least E; thread e counts expert
// e) all call it; cnt and off are shared arrays of at least E ints. Within an expert the items'
// order is arbitrary (atomics); results do not depend on it. Items with an expert id outside
// [0, E) are left out. The two passes over sel keep MA_ILP loads in flight a thread, and the
// experts' offsets are block-wide prefix sums (warp scans), so that one block does not serialise
// on memory latency. NC: sel through the read-only path (written before this launch), else
// through plain loads (written by this block before a barrier).
template <bool NC>
__device__ void align_items(const int* sel, int items, int E, int bn, int* __restrict__ order,
                            int* __restrict__ tiles, int* __restrict__ ntiles, int* cnt, int* off) {
    __shared__ int warp_items[32], warp_tiles[32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nthr = blockDim.x, warps = nthr >> 5;
    const auto load = [&](int i) { return NC ? __ldg(sel + i) : *(volatile const int*)(sel + i); };
    if (tid < E) cnt[tid] = 0;
    __syncthreads();
    for (int i0 = 0; i0 < items; i0 += nthr * MA_ILP) {
        int e[MA_ILP];
#pragma unroll
        for (int j = 0; j < MA_ILP; j++) {
            const int i = i0 + j * nthr + tid;
            e[j] = i < items ? load(i) : -1;
        }
#pragma unroll
        for (int j = 0; j < MA_ILP; j++)
            if ((unsigned)e[j] < (unsigned)E) atomicAdd(&cnt[e[j]], 1);
    }
    __syncthreads();
    // expert tid's first item and first tile: exclusive prefix sums over the experts
    const int c = tid < E ? cnt[tid] : 0;
    const int nt = (c + bn - 1) / bn;
    int ci = c, ti = nt;  // inclusive scans within the warp
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const int a = __shfl_up_sync(0xffffffffu, ci, d), b = __shfl_up_sync(0xffffffffu, ti, d);
        if (lane >= d) {
            ci += a;
            ti += b;
        }
    }
    if (lane == 31) {
        warp_items[warp] = ci;
        warp_tiles[warp] = ti;
    }
    __syncthreads();
    if (warp == 0) {
        const int wi = lane < warps ? warp_items[lane] : 0, wt = lane < warps ? warp_tiles[lane] : 0;
        int a = wi, b = wt;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            const int x = __shfl_up_sync(0xffffffffu, a, d), y = __shfl_up_sync(0xffffffffu, b, d);
            if (lane >= d) {
                a += x;
                b += y;
            }
        }
        warp_items[lane] = a - wi;
        warp_tiles[lane] = b - wt;
    }
    __syncthreads();
    const int first = warp_items[warp] + ci - c, tile0 = warp_tiles[warp] + ti - nt;
    if (tid < E) {
        off[tid] = first;
        cnt[tid] = 0;
        for (int q = 0; q < nt; q++) ((int4*)tiles)[tile0 + q] = make_int4(tid, first + q * bn, min(bn, c - q * bn), 0);
        if (tid == E - 1) *ntiles = tile0 + nt;
    }
    __syncthreads();
    for (int i0 = 0; i0 < items; i0 += nthr * MA_ILP) {
        int e[MA_ILP];
#pragma unroll
        for (int j = 0; j < MA_ILP; j++) {
            const int i = i0 + j * nthr + tid;
            e[j] = i < items ? load(i) : -1;
        }
#pragma unroll
        for (int j = 0; j < MA_ILP; j++)
            if ((unsigned)e[j] < (unsigned)E) order[off[e[j]] + atomicAdd(&cnt[e[j]], 1)] = i0 + j * nthr + tid;
    }
}

// align_items of sel over one block of MA_EMAX threads (E <= MA_EMAX).
extern "C" __global__ void __launch_bounds__(MA_EMAX) moe_align(const int* __restrict__ sel, int items, int E, int bn,
                                                                int* __restrict__ order, int* __restrict__ tiles,
                                                                int* __restrict__ ntiles) {
    __shared__ int cnt[MA_EMAX], off[MA_EMAX];
    pdl_enter();
    align_items<true>(sel, items, E, bn, order, tiles, ntiles, cnt, off);
}

// The weight row `row` of expert e's projection P (rows per expert `rows`, K inputs) for a
// gt_mainloop source (bf16 or NVFP4); null where row >= rows.
__device__ __forceinline__ void gt_expert_row(GtSrc& s, const ExpertProj& P, long e, long row, int rows, int K) {
    s.fmt = P.fmt;
    s.wrow = nullptr;
    s.srow = nullptr;
    if (row < rows) {
        const long r = e * rows + row;
        s.wrow = (const u8*)P.w + r * (P.fmt == 3 ? K / 2 : 2 * (long)K);
        if (P.fmt == 3) s.srow = P.scales + r * (K / 16);
    }
}

// h[item, o] = silu(gate_e . x[t]) * (up_e . x[t]) for the items of tile blockIdx.y (token
// t = item / k), rows o of [64 * blockIdx.x, + 64): the block's 128 weight rows are 64 gate rows
// and the same 64 up rows, combined through shared memory. xds: null, or (gate and up NVFP4,
// sm_89+) the token rows' row_pow2 scales for gt_mainloop's f16 path. Grid (ceil(inter / 64),
// tiles bound).
extern "C" __global__ void __launch_bounds__(256) experts_gate_up_mma(ExpertProj gate, ExpertProj up,
                                                                      const int* __restrict__ tiles,
                                                                      const int* __restrict__ ntiles,
                                                                      const int* __restrict__ order, int k,
                                                                      const float* __restrict__ x,
                                                                      float* __restrict__ h, int inter, int K,
                                                                      const float* __restrict__ xds) {
    __shared__ __align__(16) GtStage smem[2];
    __shared__ int items[GT_BN];
    __shared__ float ids[GT_BN];  // the f16 path: each item's 2^-e
    const int tid = threadIdx.x;
    const bool h16 = gate.fmt == 3 && up.fmt == 3 && xds != nullptr;
    pdl_enter();  // (the tiles are moe_align's output)
    if ((int)blockIdx.y >= *ntiles) return;
    const int4 tile = ((const int4*)tiles)[blockIdx.y];
    const long e = tile.x;
    const int cnt = tile.z;
    if (tid < GT_BN) {
        items[tid] = tid < cnt ? order[tile.y + tid] : 0;
        ids[tid] = h16 && tid < cnt ? __ldg(xds + order[tile.y + tid] / k) : 1.f;
    }
    const long o0 = (long)blockIdx.x * 64;
    const int wr = tid >> 1, xr = tid >> 2;
    GtSrc s;
    s.half = tid & 1;
    s.part = tid & 3;
    gt_expert_row(s, wr >= 64 ? up : gate, e, o0 + (wr & 63), inter, K);
    s.xrow = nullptr;
    s.xs = 1.f;
    if (xr < cnt) {
        const long t = order[tile.y + xr] / k;
        s.xrow = x + t * K;
        if (h16) s.xs = gt_row_xs(xds, t);
    }
    float acc[2][4][4];
    gt_mainloop<1>(s, h16, K, cnt, smem, acc);
    float(*C)[GT_BN + 1] = (float(*)[GT_BN + 1])(void*)smem;
    gt_each(acc, [&](int r, int j, float v) { C[r][j] = v; });
    __syncthreads();
    const float gg = gt_gscale(gate.fmt, gate.fmt == 3 ? gate.inv_g[e] : 1.f, h16);
    const float gu = gt_gscale(up.fmt, up.fmt == 3 ? up.inv_g[e] : 1.f, h16);
    for (int idx = tid; idx < 64 * GT_BN; idx += blockDim.x) {
        const int o = idx & 63, j = idx >> 6;
        if (j < cnt && o0 + o < inter) {
            const float gv = C[o][j] * (gg * ids[j]), uv = C[64 + o][j] * (gu * ids[j]);
            h[(long)items[j] * inter + o0 + o] = silu_times(gv, uv);
        }
    }
}

// part[item, o] = wts[item] * (down_e . h[item]) for the items of tile blockIdx.y, rows o of
// [GT_BM * blockIdx.x, + GT_BM). hds: null, or (NVFP4, sm_89+) the item rows' row_pow2 scales
// for gt_mainloop's f16 path. Grid (ceil(H / GT_BM), tiles bound).
extern "C" __global__ void __launch_bounds__(256) experts_down_mma(ExpertProj down, const int* __restrict__ tiles,
                                                                   const int* __restrict__ ntiles,
                                                                   const int* __restrict__ order,
                                                                   const float* __restrict__ wts,
                                                                   const float* __restrict__ h, float* __restrict__ part,
                                                                   int inter, int H, const float* __restrict__ hds) {
    __shared__ __align__(16) GtStage smem[2];
    __shared__ int items[GT_BN];
    const int tid = threadIdx.x;
    const bool h16 = down.fmt == 3 && hds != nullptr;
    pdl_enter();
    if ((int)blockIdx.y >= *ntiles) return;
    const int4 tile = ((const int4*)tiles)[blockIdx.y];
    const long e = tile.x;
    const int cnt = tile.z;
    if (tid < GT_BN) items[tid] = tid < cnt ? order[tile.y + tid] : 0;
    const long o0 = (long)blockIdx.x * GT_BM;
    const int xr = tid >> 2;
    GtSrc s;
    s.half = tid & 1;
    s.part = tid & 3;
    gt_expert_row(s, down, e, o0 + (tid >> 1), H, inter);
    s.xrow = nullptr;
    s.xs = 1.f;
    if (xr < cnt) {
        const long item = order[tile.y + xr];
        s.xrow = h + item * inter;
        if (h16) s.xs = gt_row_xs(hds, item);
    }
    float acc[2][4][4];
    gt_mainloop<1>(s, h16, inter, cnt, smem, acc);
    const float gs = gt_gscale(down.fmt, down.fmt == 3 ? down.inv_g[e] : 1.f, h16);
    gt_each(acc, [&](int r, int t, float v) {
        const long o = o0 + r;
        if (o < H && t < cnt) {
            const int item = items[t];
            part[(long)item * H + o] = v * (gs * (h16 ? wts[item] * hds[item] : wts[item]));
        }
    });
}

// The same two products on gemm_h16's core (NVFP4 gate/up/down, sm_90): x and h split once into
// their f16 parts (x_split_h16), each tile's rows gathered by cp.async, tiles of 64 items,
// GH_STAGES * sizeof(GhStage<64>) bytes of dynamic shared memory. The arithmetic of the f16 path
// above (same products, same scales; f32 sums in another order).

// h[item, o] as experts_gate_up_mma, from x's parts `xh` (T token rows of K) and their scales.
extern "C" __global__ void __launch_bounds__(256, 2)
    experts_gate_up_h16(ExpertProj gate, ExpertProj up, const int* __restrict__ tiles, const int* __restrict__ ntiles,
                        const int* __restrict__ order, int k, const u16* __restrict__ xh, int T,
                        float* __restrict__ h, int inter, int K, const float* __restrict__ xds) {
    constexpr int BN = 64;
    DYNAMIC_SMEM(u8, ex_smem);
    __shared__ int xrow[BN], items[BN];
    __shared__ float ids[BN];
    const int tid = threadIdx.x;
    pdl_enter();  // (the tiles are moe_align's output)
    if ((int)blockIdx.y >= *ntiles) return;
    const int4 tile = ((const int4*)tiles)[blockIdx.y];
    const long e = tile.x;
    const int cnt = tile.z;
    if (tid < BN) {
        const int item = tid < cnt ? order[tile.y + tid] : 0;
        items[tid] = item;
        xrow[tid] = tid < cnt ? item / k : -1;
        ids[tid] = tid < cnt ? __ldg(xds + item / k) : 1.f;
    }
    // weight rows: 64 gate rows, then the same 64 up rows
    const long o0 = (long)blockIdx.x * 64;
    const int wr = tid >> 1;
    const long wo = o0 + (wr & 63), so = o0 + (tid & 63);
    const ExpertProj& wp = wr >= 64 ? up : gate;
    const ExpertProj& sp = tid >= 64 ? up : gate;
    GhSrc s;
    s.wrow = wo < inter ? (const u8*)wp.w + (e * inter + wo) * (K / 2) : nullptr;
    s.srow = tid < GH_BM && so < inter ? sp.scales + (e * inter + so) * (K / 16) : nullptr;
    s.xh = xh;
    s.part_len = (long)T * K;
    s.xrow = xrow;
    s.K = K;
    __syncthreads();
    float acc[2][BN / 16][4];
    gh_mainloop<BN>(s, 0, K, cnt, (GhStage<BN>*)ex_smem, acc);
    float(*C)[BN + 1] = (float(*)[BN + 1])(void*)ex_smem;  // (the stages are free again)
    gh_each<BN>(acc, [&](int r, int j, float v) { C[r][j] = v; });
    __syncthreads();
    const float gg = 64.f * gate.inv_g[e], gu = 64.f * up.inv_g[e];
    for (int idx = tid; idx < 64 * BN; idx += blockDim.x) {
        const int o = idx & 63, j = idx >> 6;
        if (j < cnt && o0 + o < inter) {
            const float gv = C[o][j] * (gg * ids[j]), uv = C[64 + o][j] * (gu * ids[j]);
            h[(long)items[j] * inter + o0 + o] = silu_times(gv, uv);
        }
    }
}

// part[item, o] as experts_down_mma, from h's parts `hh` (one row of `inter` per item, `items`
// rows) and their scales `hds`.
extern "C" __global__ void __launch_bounds__(256, 2)
    experts_down_h16(ExpertProj down, const int* __restrict__ tiles, const int* __restrict__ ntiles,
                     const int* __restrict__ order, const float* __restrict__ wts, const u16* __restrict__ hh,
                     int items_total, float* __restrict__ part, int inter, int H, const float* __restrict__ hds) {
    constexpr int BN = 64;
    DYNAMIC_SMEM(u8, ex_smem);
    __shared__ int xrow[BN];
    const int tid = threadIdx.x;
    pdl_enter();
    if ((int)blockIdx.y >= *ntiles) return;
    const int4 tile = ((const int4*)tiles)[blockIdx.y];
    const long e = tile.x;
    const int cnt = tile.z;
    if (tid < BN) xrow[tid] = tid < cnt ? order[tile.y + tid] : -1;
    const long o0 = (long)blockIdx.x * GH_BM;
    const long wo = o0 + (tid >> 1), so = o0 + tid;
    GhSrc s;
    s.wrow = wo < H ? (const u8*)down.w + (e * H + wo) * (inter / 2) : nullptr;
    s.srow = tid < GH_BM && so < H ? down.scales + (e * H + so) * (inter / 16) : nullptr;
    s.xh = hh;
    s.part_len = (long)items_total * inter;
    s.xrow = xrow;
    s.K = inter;
    __syncthreads();
    float acc[2][BN / 16][4];
    gh_mainloop<BN>(s, 0, inter, cnt, (GhStage<BN>*)ex_smem, acc);
    const float gs = 64.f * down.inv_g[e];
    gh_each<BN>(acc, [&](int r, int t, float v) {
        const long o = o0 + r;
        if (o < H && t < cnt) {
            const int item = xrow[t];
            part[(long)item * H + o] = v * (gs * (wts[item] * hds[item]));
        }
    });
}

// ---- grouped MoE of a few items per expert (batched decode steps) ----------------------------
//
// A batched decode step's routed items spread over many experts, one or a few each: tiles of up
// to MT_BN items of one expert (moe_align with bn = MT_BN) on the decode GEMV's tensor-core core
// (MmaTile). One token uses 2 of the mma's 8 B columns (f16 high parts, remainders), so lanes
// 8 s .. 8 s + 7 feed the tile's item s: MT_BN items cost the instructions of one and each
// expert's weights are read once per MT_BN of its items. The `_mt8` kernels take tiles of 2 MT_BN
// items (moe_align with bn = 2 MT_BN: a prompt's several items per expert) as two column groups of
// the mma, each decoded weight fragment feeding both. The activations are staged once per row by
// xb_stage (kernels/gemv.cu). Per item the arithmetic is that of the per-item kernels'
// tensor-core path (same chunk split, same reduction order), so the results are the same bits.

#define MT_BN 4

// This lane's item slots of a tile of up to 4 G items (lane / 8 + 4 q for group q < G): the
// slot's item (0 where empty), a bit per group that holds one, and the distance in uint4 words
// from group 0's item's row of `xb` (rows of `row` uint4 words) to group 1's (0 where empty),
// run_staged's gstride for G = 2.
template <int G>
struct MtSlots {
    static_assert(G == 1 || G == 2, "one stride reaches group 1 only");
    int item[G];
    unsigned on;
    long gstride;
};
template <int G>
__device__ __forceinline__ MtSlots<G> mt_slots(const int4 tile, const int* __restrict__ order, int div, long row) {
    const int s = (threadIdx.x & 31) >> 3;
    MtSlots<G> r;
    r.on = 0u;
#pragma unroll
    for (int q = 0; q < G; q++) {
        const bool on = s + 4 * q < tile.z;
        r.item[q] = on ? order[tile.y + s + 4 * q] : 0;
        r.on |= on ? 1u << q : 0u;
    }
    r.gstride = G > 1 && (r.on >> 1 & 1) ? (long)(r.item[G - 1] / div - r.item[0] / div) * row : 0l;
    return r;
}

// Per-item sums of the tiles of a block through shared memory: red[warp][row][slot] (lane
// g = lane / 4, t = lane % 4 holds rows g and g + 8 of slots t + 4 q). Ends with a barrier.
template <int G>
__device__ __forceinline__ void mt_stash(const float acc[G][4], float (*red)[16][4 * G]) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int q = 0; q < G; q++) {
        red[warp][lane >> 2][(lane & 3) + 4 * q] = acc[q][0] + acc[q][1];
        red[warp][(lane >> 2) + 8][(lane & 3) + 4 * q] = acc[q][2] + acc[q][3];
    }
    __syncthreads();
}

// h[item, o] = silu(gate_e . x[t]) * (up_e . x[t]) (h rows of `inter` values) for the items of
// tiles blockIdx.y, + gridDim.y, ... below the tile count (token t = item / k; x staged by
// xb_stage as xb, xds), rows o of [16 blockIdx.x, + 16): warps 0-3 split the 16 gate rows'
// chunks, warps 4-7 the same up rows'. Tiles of up to 4 G items: G column groups of the mma,
// each decoded weight fragment feeding them all. Grid (ceil(inter / 16), up to the tiles bound),
// 8 warps; NVFP4 gate and up, K % 128 == 0 (sm_89+). A grid of fewer rows than the bound has
// fewer blocks with no tile (the bound is about twice a step's tile count); each tile's
// arithmetic is the same. `ahead` > 0: warp 7 also prefetches into L2 the rows of the tile
// `ahead` tiles later (about a wave ahead: that block finds its weights in L2 or on their way).
template <int SLOTS, int G>
__device__ __forceinline__ void experts_gate_up_mt_impl(ExpertProj gate, ExpertProj up, const int* __restrict__ tiles,
                                                        const int* __restrict__ ntiles, const int* __restrict__ order,
                                                        int k, const uint2* __restrict__ xb,
                                                        const float* __restrict__ xds, float* __restrict__ h,
                                                        int inter, int K, int ahead) {
    constexpr int BN = 4 * G;
    __shared__ float red[8][16][BN];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    pdl_enter();  // (the tiles are moe_align's output)
    const int nt = *ntiles;
    const long ob = (long)blockIdx.x * 16;
    const int nrows = (int)min(16l, (long)inter - ob);
    const int nc = K >> 7, part = warp & 3;
    for (int ty = blockIdx.y; ty < nt; ty += gridDim.y) {
        const int4 tile = ((const int4*)tiles)[ty];
        const long e = tile.x;
        MmaTile<SLOTS> m;
        mma_start_group(m, warp >= 4 ? up : gate, e * inter + ob, nrows, K, part * nc / 4, (part + 1) * nc / 4);
        if (ahead > 0 && warp == 7 && ty + ahead < nt) {
            const long r = (long)((const int4*)tiles)[ty + ahead].x * inter + ob;
            l2_prefetch_nv_rows(gate.w, gate.scales, r, nrows, K, lane, 32);
            l2_prefetch_nv_rows(up.w, up.scales, r, nrows, K, lane, 32);
        }
        const MtSlots<G> sl = mt_slots<G>(tile, order, k, K / 4);
        const uint4* xl = (const uint4*)(xb + (long)(sl.item[0] / k) * (K / 2)) + 4 * (lane & 7);
        float acc[G][4] = {};
        m.template run_staged<G>(xl, sl.gstride, sl.on, acc);
        mt_stash<G>(acc, red);
        if (threadIdx.x < 16 * BN) {
            const int r = threadIdx.x / BN, s = threadIdx.x % BN;
            if (r < nrows && s < tile.z) {
                const int item = order[tile.y + s];
                const float ds = xds[item / k];
                float gv = 0.f, uv = 0.f;
#pragma unroll
                for (int p = 0; p < 4; p++) gv += red[p][r][s];
#pragma unroll
                for (int p = 0; p < 4; p++) uv += red[4 + p][r][s];
                gv *= 64.f * ds * gate.inv_g[e];
                uv *= 64.f * ds * up.inv_g[e];
                h[(long)item * inter + ob + r] = silu_times(gv, uv);
            }
        }
        __syncthreads();  // (red is read above before the next tile's stash writes it)
    }
}

// experts_gate_up_mt: tiles of 4 items, MMA_U chunk slots a lane, two blocks a SM;
// experts_gate_up_mt3: 2 slots, under 85 registers, three blocks a SM
// (CudaOptions::few_three_blocks); experts_gate_up_mt8: tiles of 8 items (two column groups),
// 2 slots, 128 registers (NVRTC sm_90: MMA_U slots spill), two blocks a SM
// (CudaOptions::few_tile8_items). Per item the same arithmetic.
extern "C" __global__ void __launch_bounds__(256, 2)
    experts_gate_up_mt(ExpertProj gate, ExpertProj up, const int* __restrict__ tiles, const int* __restrict__ ntiles,
                       const int* __restrict__ order, int k, const uint2* __restrict__ xb,
                       const float* __restrict__ xds, float* __restrict__ h, int inter, int K, int ahead) {
    experts_gate_up_mt_impl<MMA_U, 1>(gate, up, tiles, ntiles, order, k, xb, xds, h, inter, K, ahead);
}
extern "C" __global__ void __launch_bounds__(256, 3)
    experts_gate_up_mt3(ExpertProj gate, ExpertProj up, const int* __restrict__ tiles, const int* __restrict__ ntiles,
                        const int* __restrict__ order, int k, const uint2* __restrict__ xb,
                        const float* __restrict__ xds, float* __restrict__ h, int inter, int K, int ahead) {
    experts_gate_up_mt_impl<2, 1>(gate, up, tiles, ntiles, order, k, xb, xds, h, inter, K, ahead);
}
extern "C" __global__ void __launch_bounds__(256, 2)
    experts_gate_up_mt8(ExpertProj gate, ExpertProj up, const int* __restrict__ tiles, const int* __restrict__ ntiles,
                        const int* __restrict__ order, int k, const uint2* __restrict__ xb,
                        const float* __restrict__ xds, float* __restrict__ h, int inter, int K, int ahead) {
    experts_gate_up_mt_impl<2, 2>(gate, up, tiles, ntiles, order, k, xb, xds, h, inter, K, ahead);
}

// part[item, o] = wts[item] * (down_e . h[item]) for the items of tiles blockIdx.y, + gridDim.y,
// ... below the tile count (h staged by xb_stage as hb, hds, one row per item), rows o of
// [64 blockIdx.x, + 64): 4 tiles of 16 rows, 2 warps splitting each tile's chunks; tiles of up
// to 4 G items as in experts_gate_up_mt_impl. Grid (ceil(H / 64), up to the tiles bound), 8
// warps; NVFP4 down, inter % 128 == 0 (sm_89+). `ahead`: as in experts_gate_up_mt (the block's
// 64 rows).
template <int SLOTS, int G>
__device__ __forceinline__ void experts_down_mt_impl(ExpertProj down, const int* __restrict__ tiles,
                                                     const int* __restrict__ ntiles, const int* __restrict__ order,
                                                     const float* __restrict__ wts, const uint2* __restrict__ hb,
                                                     const float* __restrict__ hds, float* __restrict__ part,
                                                     int inter, int H, int ahead) {
    __shared__ float red[8][16][4 * G];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    pdl_enter();
    const int nt = *ntiles;
    const long ob = (long)blockIdx.x * 64 + (warp >> 1) * 16;
    const int nrows = (int)max(0l, min(16l, (long)H - ob));
    const int nc = inter >> 7, p = warp & 1;
    for (int ty = blockIdx.y; ty < nt; ty += gridDim.y) {
        const int4 tile = ((const int4*)tiles)[ty];
        const long e = tile.x;
        MmaTile<SLOTS> m;
        mma_start_group(m, down, e * H + ob, nrows, inter, p * nc / 2, (p + 1) * nc / 2);
        if (ahead > 0 && warp == 7 && ty + ahead < nt) {
            const long b0 = (long)blockIdx.x * 64, brows = max(0l, min(64l, (long)H - b0));
            const long r = (long)((const int4*)tiles)[ty + ahead].x * H + b0;
            l2_prefetch_nv_rows(down.w, down.scales, r, brows, inter, lane, 32);
        }
        const MtSlots<G> sl = mt_slots<G>(tile, order, 1, inter / 4);
        const uint4* xl = (const uint4*)(hb + (long)sl.item[0] * (inter / 2)) + 4 * (lane & 7);
        float acc[G][4] = {};
        if (nrows > 0) m.template run_staged<G>(xl, sl.gstride, sl.on, acc);
        mt_stash<G>(acc, red);
        // warp pair w, w + 1 (w even): rows ob.. of its tile; thread (r, s) of the pair's first
        // warp, slots s + 4 q
        if (p == 0 && nrows > 0) {
            const int r = lane >> 2;
#pragma unroll
            for (int q = 0; q < G; q++) {
                const int s = (lane & 3) + 4 * q;
                if (s < tile.z) {
                    const int item = order[tile.y + s];
                    const float gs = 64.f * hds[item] * down.inv_g[e] * wts[item];
#pragma unroll
                    for (int h2 = 0; h2 < 2; h2++) {
                        const int row = r + 8 * h2;
                        if (row < nrows) {
                            float v = 0.f;
                            v += red[warp][row][s];
                            v += red[warp + 1][row][s];
                            part[(long)item * H + ob + row] = v * gs;
                        }
                    }
                }
            }
        }
        __syncthreads();  // (red is read above before the next tile's stash writes it)
    }
}

// experts_down_mt / experts_down_mt3 / experts_down_mt8: as the gate/up's three.
extern "C" __global__ void __launch_bounds__(256, 2)
    experts_down_mt(ExpertProj down, const int* __restrict__ tiles, const int* __restrict__ ntiles,
                    const int* __restrict__ order, const float* __restrict__ wts, const uint2* __restrict__ hb,
                    const float* __restrict__ hds, float* __restrict__ part, int inter, int H, int ahead) {
    experts_down_mt_impl<MMA_U, 1>(down, tiles, ntiles, order, wts, hb, hds, part, inter, H, ahead);
}
extern "C" __global__ void __launch_bounds__(256, 3)
    experts_down_mt3(ExpertProj down, const int* __restrict__ tiles, const int* __restrict__ ntiles,
                     const int* __restrict__ order, const float* __restrict__ wts, const uint2* __restrict__ hb,
                     const float* __restrict__ hds, float* __restrict__ part, int inter, int H, int ahead) {
    experts_down_mt_impl<2, 1>(down, tiles, ntiles, order, wts, hb, hds, part, inter, H, ahead);
}
extern "C" __global__ void __launch_bounds__(256, 2)
    experts_down_mt8(ExpertProj down, const int* __restrict__ tiles, const int* __restrict__ ntiles,
                     const int* __restrict__ order, const float* __restrict__ wts, const uint2* __restrict__ hb,
                     const float* __restrict__ hds, float* __restrict__ part, int inter, int H, int ahead) {
    experts_down_mt_impl<2, 2>(down, tiles, ntiles, order, wts, hb, hds, part, inter, H, ahead);
}
