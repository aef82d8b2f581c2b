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
#define SAMPLE_K_MAX 256  // largest top_k sample_logits takes (0 and beyond: sample_sorted)
#define SAMPLE_CAND_MAX 2048  // keys a row's fast path gathers and ranks (more: the radix select)

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

// The parts of the host's parted sums (SUM_PARTS == SAMPLE_THREADS parts, sampling.rs) of
// p[0, m), m >= 1: thread j adds part j's terms (c = ceil(m / SAMPLE_THREADS) from j c) in order
// into part[j] (0 past the last part); returns c. p is written by any of the block's threads
// before the call; part: SAMPLE_THREADS doubles of shared memory. Ends with a barrier.
__device__ int part_sums(const double* p, int m, double* part) {
    const int tid = threadIdx.x, c = (m + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
    __syncthreads();
    double s = 0.0;
    for (int i = min(m, tid * c), e = min(m, i + c); i < e; i++) s += p[i];
    part[tid] = s;
    __syncthreads();
    return c;
}

// The host's parted_sum of p[0, m) in every thread: part_sums, then thread 0 adds the parts'
// sums in order.
__device__ double parted_sum(const double* p, int m, double* part) {
    __shared__ double s_total;
    const int c = part_sums(p, m, part);
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (int j = 0, np = (m + c - 1) / c; j < np; j++) t += part[j];
        s_total = t;
    }
    __syncthreads();
    return s_total;
}

// The host's parted_walk over p[0, m) in every thread: the first index at which the cumulative
// sum, in parts (the sums of the parts before added in order, then the part's own terms), is
// >= thr (strict false) or > thr (strict true); m where none is. Thread 0 turns the parts'
// sums into their exclusive prefix in order; each thread walks its own part from its prefix.
__device__ int parted_walk(const double* p, int m, double thr, bool strict, double* part) {
    __shared__ int s_first;
    const int tid = threadIdx.x, c = part_sums(p, m, part);
    if (tid == 0) {
        double before = 0.0;
        for (int j = 0, np = (m + c - 1) / c; j < np; j++) {
            const double t = part[j];
            part[j] = before;
            before += t;
        }
        s_first = m;
    }
    __syncthreads();
    double acc = part[tid];
    for (int i = min(m, tid * c), e = min(m, i + c); i < e; i++) {
        acc += p[i];
        if (strict ? thr < acc : acc >= thr) {
            atomicMin(&s_first, i);
            break;
        }
    }
    __syncthreads();
    return s_first;
}

// The host `Sampler`'s pick among k candidates sorted by (key desc, index asc), whose softmax
// terms exp(key - max) in f64 are p[0, k) (shared or global memory, written by any of the
// block's threads before the call): their parted sum, each term divided by it; where top_p < 1
// the shortest prefix whose parted cumulative sum reaches top_p, its parted sum likewise and
// each of its terms divided by it; the first candidate whose parted cumulative probability
// exceeds u (else the last kept). The same bits as the host's (sampling.rs: `pick`, with
// `parted_sum` and `parted_walk`): up to SAMPLE_THREADS candidates the plain sums in order.
// Called by every thread of the block (SAMPLE_THREADS); p is overwritten with the
// probabilities; returns the candidate's place in every thread.
__device__ int pick_sorted(double* p, int k, float top_p, double u) {
    __shared__ double part[SAMPLE_THREADS];
    const int tid = threadIdx.x;
    const double total = parted_sum(p, k, part);
    for (int i = tid; i < k; i += SAMPLE_THREADS) p[i] /= total;
    int keep = k;
    if (top_p < 1.f) {
        const int cut = parted_walk(p, k, (double)top_p, false, part);
        keep = cut < k ? cut + 1 : k;
        const double t2 = parted_sum(p, keep, part);
        for (int i = tid; i < keep; i += SAMPLE_THREADS) p[i] /= t2;
    }
    const int pick = parted_walk(p, keep, u, true, part);
    return pick < keep ? pick : keep - 1;
}

// One row to sample: its logits and the sampler's parameters and draw (`SampleRow` in
// ops/sampling.rs; same layout).
struct SampleRow {
    const float* logits;
    int n;
    float temperature;
    int top_k;
    float top_p;
    double u;
};

// The next token of every row of `rows` (one block each), exactly as the host `Sampler` picks it
// from logits[0, n) with uniform draw `u`: greedy (temperature <= 0 or top_k == 1): the first
// index of the largest value; otherwise the top_k (2..SAMPLE_K_MAX) of the keys
// logit / temperature (f32) by (key desc, index asc), the softmax of (key - max) in f64 over
// them, cut to the shortest prefix whose sum reaches top_p, renormalised, and the first candidate
// whose cumulative probability exceeds u (pick_sorted). NaN logits are never picked. Blocks of
// SAMPLE_THREADS threads; out[row] = the row's token.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS) sample_logits(const SampleRow* __restrict__ rows,
                                                                     u32* out_all) {
    pdl_enter();
    const SampleRow row = rows[blockIdx.x];
    const float* __restrict__ logits = row.logits;
    const int n = row.n, top_k = row.top_k;
    const float temperature = row.temperature, top_p = row.top_p;
    const double u = row.u;
    u32* out = out_all + blockIdx.x;
    const int tid = threadIdx.x;
    __shared__ u32 hist[256];
    __shared__ u32 s_prefix, s_mask;
    __shared__ int s_need;
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
    // The k candidates (k = top_k, or fewer where fewer keys are valid), sorted by (key desc,
    // index asc) into sorted_key / sorted_idx. Fast path, two reads of the row: each thread's
    // largest key and the valid count; t0 = the k-th largest of the threads' largest keys (each
    // is a different element, so at least k keys reach t0, and the k-th largest key does too);
    // every key >= t0 gathered (usually a few more than k) and ranked among themselves. Where
    // more than SAMPLE_CAND_MAX keys reach t0 (many equal values), the radix select below
    // gathers exactly the k candidates instead, ranked the same way.
    __shared__ float sorted_key[SAMPLE_K_MAX];
    __shared__ int sorted_idx[SAMPLE_K_MAX];
    __shared__ u32 tops[SAMPLE_THREADS];
    __shared__ u32 gkey[SAMPLE_CAND_MAX];
    __shared__ int gidx[SAMPLE_CAND_MAX];
    // (the largest logit divided once: division by temperature > 0 keeps the order, and where
    // fmaxf takes -0 for +0 the key is one lower, which t0 may be: it stays a lower bound)
    float lmax = __int_as_float(0xff800000);  // -inf
    int valid = 0;
    for (int i = tid; i < n; i += SAMPLE_THREADS) {
        const float l = logits[i];
        if (isnan(l)) continue;
        valid++;
        lmax = fmaxf(lmax, l);
    }
    // (0: no valid key; every valid one's order key is above it)
    const u32 tmax = valid > 0 ? order_key(lmax / temperature) : 0u;
    int n_valid;
    block_exclusive_scan(valid, &n_valid);
    const int k = min(top_k, n_valid);
    if (k == 0) {
        if (tid == 0) *out = 0;
        return;
    }
    // the threads' largest keys sorted descending (bitonic, in shared memory)
    tops[tid] = tmax;
    if (tid == 0) s_count = 0;
    __syncthreads();
    for (int size = 2; size <= SAMPLE_THREADS; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            const int j = tid ^ stride;
            if (j > tid) {
                const u32 a = tops[tid], b = tops[j];
                // (descending where tid's bit `size` is clear)
                if (((tid & size) == 0) == (a < b)) {
                    tops[tid] = b;
                    tops[j] = a;
                }
            }
            __syncthreads();
        }
    }
    // (0 where fewer than k threads hold a key: every valid key is gathered)
    const u32 t0 = tops[k - 1];
    for (int i = tid; i < n; i += SAMPLE_THREADS) {
        const float l = logits[i];
        if (isnan(l)) continue;
        const u32 ok = order_key(l / temperature);
        if (ok >= t0) {
            const int slot = atomicAdd(&s_count, 1);
            if (slot < SAMPLE_CAND_MAX) {
                gkey[slot] = ok;
                gidx[slot] = i;
            }
        }
    }
    __syncthreads();
    int m = s_count;
    if (m > SAMPLE_CAND_MAX) {
        // Radix select (8 bits per pass, most significant first) of the k-th largest key.
        if (tid == 0) { s_prefix = 0; s_mask = 0; s_need = k; }
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
        const u32 thr = s_prefix;       // the k-th largest key
        const int ties_taken = s_need;  // keys equal to it that are taken (lowest indices first)
        // Gather exactly the k candidates: every key above the threshold, and the first
        // `ties_taken` equal to it by index (each thread scans one contiguous range, so an ordered
        // scan ranks the ties).
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
            const u32 ok = order_key(l / temperature);
            bool take = ok > thr;
            if (ok == thr) take = rank++ < ties_taken;
            if (take) {
                const int slot = atomicAdd(&s_count, 1);
                if (slot < SAMPLE_K_MAX) {
                    gkey[slot] = ok;
                    gidx[slot] = i;
                }
            }
        }
        __syncthreads();
        m = min(s_count, SAMPLE_K_MAX);
    }
    // each gathered key's place by (key desc, index asc; the order keys' total order, as the
    // host's: -0 below +0); the first k are the candidates
    for (int c = tid; c < m; c += SAMPLE_THREADS) {
        const u32 ok = gkey[c];
        const int ki = gidx[c];
        int r = 0;
        for (int j = 0; j < m; j++) {
            const u32 oj = gkey[j];
            r += (oj > ok) || (oj == ok && gidx[j] < ki);
        }
        if (r < k) {
            sorted_key[r] = logits[ki] / temperature;
            sorted_idx[r] = ki;
        }
    }
    __syncthreads();
    __shared__ double p[SAMPLE_K_MAX];
    const float mx = sorted_key[0];
    for (int i = tid; i < k; i += SAMPLE_THREADS) p[i] = exp((double)(sorted_key[i] - mx));
    const int pick = pick_sorted(p, k, top_p, u);
    if (tid == 0) *out = (u32)sorted_idx[pick];
}

// A row for sample_sorted (`SortedSampleRow` in ops/sampling.rs; same layout): the row, and its
// scratch of 24 n bytes (8-byte aligned): two key and two index buffers of n u32, then n f64.
struct SortedSampleRow {
    SampleRow row;
    u8* scratch;
};

// One pass of a block-wide stable LSD radix sort of n (key, index) pairs by the key's 8 bits at
// `shift`, src -> dst: each tile of SAMPLE_THREADS pairs in order, a pair's place = its digit's
// base + the pairs of that digit in earlier warps of the tile + its rank among its warp's peers
// (lanes of the same digit, found by 8 ballots). wcount is zero on entry and on exit.
// (no __restrict__: the buffers are written earlier in the same kernel, so their loads must not
// take the read-only path)
__device__ __forceinline__ void radix_pass(const u32* sk, const u32* si, u32* dk, u32* di, int n, int shift, u32 (*wcount)[256]) {
    __shared__ u32 base[256];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    for (int d = tid; d < 256; d += SAMPLE_THREADS) base[d] = 0;
    __syncthreads();
    for (int i = tid; i < n; i += SAMPLE_THREADS) atomicAdd(&base[(sk[i] >> shift) & 255], 1u);
    __syncthreads();
    if (tid == 0) {
        u32 sum = 0;
        for (int d = 0; d < 256; d++) {
            const u32 c = base[d];
            base[d] = sum;
            sum += c;
        }
    }
    __syncthreads();
    const unsigned lt = (1u << lane) - 1u;
    for (int t0 = 0; t0 < n; t0 += SAMPLE_THREADS) {
        const int i = t0 + tid;
        const bool on = i < n;
        const u32 key = on ? sk[i] : 0u;
        const int d = (key >> shift) & 255;
        unsigned peers = __ballot_sync(0xffffffffu, on);
#pragma unroll
        for (int b = 0; b < 8; b++) {
            const unsigned bit = __ballot_sync(0xffffffffu, (d >> b) & 1);
            peers &= ((d >> b) & 1) ? bit : ~bit;
        }
        const int rank = __popc(peers & lt);
        if (on && rank == 0) wcount[warp][d] = __popc(peers);
        __syncthreads();
        // each digit's running base through the tile's warps (only counts written are replaced)
        for (int dd = tid; dd < 256; dd += SAMPLE_THREADS) {
            u32 at = base[dd];
            for (int w = 0; w < SAMPLE_THREADS / 32; w++) {
                const u32 c = wcount[w][dd];
                if (c) {
                    wcount[w][dd] = at;
                    at += c;
                }
            }
            base[dd] = at;
        }
        __syncthreads();
        if (on) {
            const u32 pos = wcount[warp][d] + rank;
            dk[pos] = key;
            di[pos] = si[i];
        }
        __syncwarp();
        if (on && rank == 0) wcount[warp][d] = 0;
        __syncthreads();
    }
}

// The block's (key, index) pair first in the order (key desc, index asc), in every thread.
__device__ void block_best(float& key, int& idx) {
    __shared__ float bk[SAMPLE_THREADS / 32];
    __shared__ int bi[SAMPLE_THREADS / 32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ok = __shfl_xor_sync(0xffffffffu, key, o);
        const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (ok > key || (ok == key && oi < idx)) { key = ok; idx = oi; }
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0) { bk[threadIdx.x >> 5] = key; bi[threadIdx.x >> 5] = idx; }
    __syncthreads();
    for (int w = 0; w < SAMPLE_THREADS / 32; w++)
        if (bk[w] > key || (bk[w] == key && bi[w] < idx)) { key = bk[w]; idx = bi[w]; }
}

// The host's pick_in_index_order (sampling.rs) of logits[0, n), at least one of them not NaN,
// in every thread: every position's term exp(logit / temperature - max) in f64 (0 for NaN) in
// p[0, n), pick_sorted over them in index order (no top-p cut), then the first position from
// its pick on whose probability is positive, else the last positive one, else (no positive
// term: an infinite logit) the first largest logit. (The largest key is the largest logit
// divided: division by temperature > 0 keeps the order.)
__device__ int pick_in_index_order(const float* __restrict__ logits, int n, float temperature, double u,
                                   double* p) {
    __shared__ int s_first, s_last;
    const int tid = threadIdx.x;
    float lmax = __int_as_float(0xff800000);  // -inf
    int at = 0x7fffffff;
    for (int i = tid; i < n; i += SAMPLE_THREADS) {
        const float l = logits[i];
        if (l > lmax) { lmax = l; at = i; }
    }
    block_best(lmax, at);
    const float mx = lmax / temperature;
    for (int i = tid; i < n; i += SAMPLE_THREADS) {
        const float l = logits[i];
        p[i] = isnan(l) ? 0.0 : exp((double)(l / temperature - mx));
    }
    const int stop = pick_sorted(p, n, 1.f, u);
    if (tid == 0) {
        s_first = 0x7fffffff;
        s_last = -1;
    }
    __syncthreads();
    int first = 0x7fffffff, last = -1;
    for (int i = tid; i < n; i += SAMPLE_THREADS) {
        if (!(p[i] > 0.0)) continue;
        if (i >= stop) first = min(first, i);
        last = max(last, i);
    }
    if (first != 0x7fffffff) atomicMin(&s_first, first);
    if (last >= 0) atomicMax(&s_last, last);
    __syncthreads();
    if (s_first != 0x7fffffff) return s_first;
    if (s_last >= 0) return s_last;
    return at == 0x7fffffff ? 0 : at;
}

// The next token of every row of `rows` (one block each) as sample_logits picks it, for rows of
// any top_k (0: every candidate) and temperature > 0: every non-NaN logit's key
// logit / temperature sorted by (key desc, index asc) (a stable radix sort of ~order keys, NaN
// last), the first k; the softmax of (key - max) in f64 and the rest as pick_sorted takes it
// (the host's parted sums: each thread adds its part of the candidates in order, one thread the
// parts' sums). Rows of top-k 0 and top-p 1 sort nothing: pick_in_index_order.
// Blocks of SAMPLE_THREADS threads (one a SM: without the bound ptxas aims at two, 32
// registers, and spills); out[row] = the row's token.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS, 1) sample_sorted(const SortedSampleRow* __restrict__ rows,
                                                                     u32* out_all) {
    pdl_enter();
    const SortedSampleRow sr = rows[blockIdx.x];
    const SampleRow row = sr.row;
    const float* __restrict__ logits = row.logits;
    const int n = row.n, tid = threadIdx.x;
    const float temperature = row.temperature;
    u32* out = out_all + blockIdx.x;
    u32* ka = (u32*)sr.scratch;
    u32* kb = ka + n;
    u32* ia = kb + n;
    u32* ib = ia + n;
    double* p = (double*)(ib + n);
    __shared__ u32 wcount[SAMPLE_THREADS / 32][256];
    for (int j = tid; j < (SAMPLE_THREADS / 32) * 256; j += SAMPLE_THREADS) (&wcount[0][0])[j] = 0;
    int valid = 0;
    for (int i = tid; i < n; i += SAMPLE_THREADS) {
        const float l = logits[i];
        const bool ok = !isnan(l);
        valid += ok;
        // (ascending ~order_key: the largest key first; a valid key's order key is never 0,
        // so NaN's 0xffffffff sorts after all of them)
        ka[i] = ok ? ~order_key(l / temperature) : 0xffffffffu;
        ia[i] = (u32)i;
    }
    int n_valid;
    block_exclusive_scan(valid, &n_valid);
    if (n_valid == 0) {
        if (tid == 0) *out = 0;
        return;
    }
    if (row.top_k <= 0 && !(row.top_p < 1.f)) {
        // top-k 0 and top-p 1 (no cut): the candidates in index order, nothing sorted
        const int pick = pick_in_index_order(logits, n, temperature, row.u, p);
        if (tid == 0) *out = (u32)pick;
        return;
    }
    const int k = row.top_k > 0 ? min(row.top_k, n_valid) : n_valid;
    __syncthreads();
    radix_pass(ka, ia, kb, ib, n, 0, wcount);
    radix_pass(kb, ib, ka, ia, n, 8, wcount);
    radix_pass(ka, ia, kb, ib, n, 16, wcount);
    radix_pass(kb, ib, ka, ia, n, 24, wcount);
    // the candidates' keys, recomputed from their logits (the host's f32 division)
    const float mx = logits[ia[0]] / temperature;
    for (int i = tid; i < k; i += SAMPLE_THREADS) p[i] = exp((double)(logits[ia[i]] / temperature - mx));
    const int pick = pick_sorted(p, k, row.top_p, row.u);
    if (tid == 0) *out = ia[pick];
}

// ---- log-probabilities -----------------------------------------------------------------------

#define LOGPROB_THREADS SAMPLE_THREADS  // (block_best and block_sum_f64 take blocks of SAMPLE_THREADS)

// One row to score (`LogprobRow` in ops/sampling.rs; same layout): its n logits, the token it
// scores (any value; outside [0, n): scored -inf, ranked n), how many of the most likely tokens
// and the first of their slots in top_id / top_lp.
struct LogprobRow {
    const float* logits;
    int n;
    int target;
    int top;
    int out;
};

// The block's sum of one double per thread (fixed order: lanes, then warps), in every thread.
__device__ double block_sum_f64(double v) {
    __shared__ double part[LOGPROB_THREADS / 32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    double s = 0.0;
    for (int w = 0; w < LOGPROB_THREADS / 32; w++) s += part[w];
    return s;
}

// The log-probabilities of each row of `rows` (one block each) as the host's token_logprob
// computes them: lse = max + log(sum exp(x - max)) over the non-NaN logits in f64 (lse = max
// where max is not finite), lp[b] = x[target] - lse, rank[b] = 1 + the count of logits above
// x[target], and the `top` most likely tokens by (logit desc, index asc) with NaN as -inf, one
// pass per place, into top_id / top_lp from slot `out`. Blocks of LOGPROB_THREADS threads.
extern "C" __global__ void __launch_bounds__(LOGPROB_THREADS) row_logprobs(const LogprobRow* __restrict__ rows,
                                                                          float* __restrict__ lp,
                                                                          u32* __restrict__ rank,
                                                                          u32* __restrict__ top_id,
                                                                          float* __restrict__ top_lp) {
    pdl_enter();
    const LogprobRow row = rows[blockIdx.x];
    const float* __restrict__ x = row.logits;
    const int n = row.n, tid = threadIdx.x;
    const float neg_inf = __int_as_float(0xff800000);
    float m = neg_inf;
    for (int i = tid; i < n; i += LOGPROB_THREADS) {
        const float v = x[i];
        if (!isnan(v)) m = fmaxf(m, v);
    }
    {
        int unused = 0;
        block_best(m, unused);
    }
    double lse = (double)m;
    if (isfinite(m)) {
        double s = 0.0;
        for (int i = tid; i < n; i += LOGPROB_THREADS) {
            const float v = x[i];
            if (!isnan(v)) s += exp((double)v - (double)m);
        }
        lse = (double)m + log(block_sum_f64(s));
    }
    const int t = row.target;
    const bool known = t >= 0 && t < n;
    const float xt = known ? x[t] : 0.f;
    double above = 0.0;  // (a count, summed exactly in f64)
    if (known)
        for (int i = tid; i < n; i += LOGPROB_THREADS) above += x[i] > xt ? 1.0 : 0.0;
    above = block_sum_f64(above);
    if (tid == 0) {
        lp[blockIdx.x] = known ? (float)((double)xt - lse) : neg_inf;
        rank[blockIdx.x] = known ? 1u + (u32)above : (u32)n;
    }
    // the top places, one pass each: the best (key, index) after the previous place's
    const int k = min(row.top, n);
    float pk = __int_as_float(0x7f800000);  // +inf
    int pi = -1;
    for (int j = 0; j < k; j++) {
        float bk = neg_inf;
        int bi = 0x7fffffff;
        for (int i = tid; i < n; i += LOGPROB_THREADS) {
            const float v = x[i];
            const float key = isnan(v) ? neg_inf : v;
            const bool after = key < pk || (key == pk && i > pi);
            if (after && (key > bk || (key == bk && i < bi))) { bk = key; bi = i; }
        }
        block_best(bk, bi);
        if (tid == 0) {
            top_id[row.out + j] = (u32)bi;
            top_lp[row.out + j] = (float)((double)x[bi] - lse);
        }
        pk = bk;
        pi = bi;
    }
}
