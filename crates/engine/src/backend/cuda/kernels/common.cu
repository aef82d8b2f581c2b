// fp4forge CUDA kernels, compiled with NVRTC at start-up for the device's architecture, as one
// source: the files of this folder concatenated in the order of `KERNELS_CU` (compile.rs):
// common.cu (types, conversions, programmatic dependent launch, NVFP4 dequantization, fused
// epilogues), gemv.cu, prefill.cu (tiled matrix-matrix, embedding), elementwise.cu (norms,
// rope, gates), attention.cu, moe.cu, sampling.cu (synthetic data, sampling on the device).
// No headers: bf16/f16/fp8 conversions are done with bit manipulation (NVRTC needs no CUDA
// include path). Under FP4FORGE_CPU_EMU (tools/cuda-cpu: the kernels compiled for the CPU, for
// tests without a GPU) each inline PTX statement is replaced by the emulator's `emu_*` function
// of the same instruction. Activations are f32; weights stay in their stored encoding.
//
// Weight formats (the `fmt` argument): 0 = f32, 1 = f16, 2 = bf16, 3 = NVFP4
// (packed e2m1, even element in the low nibble; one fp8 e4m3 scale per 16 elements;
// w = e2m1 * e4m3(scale) * inv_global).

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define INF_F __int_as_float(0x7f800000)

// A kernel's dynamic shared memory, as `T name[]` (16-byte aligned).
#ifdef FP4FORGE_CPU_EMU
#define DYNAMIC_SMEM(T, name) T* name = (T*)emu_dynamic_smem()
#else
#define DYNAMIC_SMEM(T, name) extern __shared__ __align__(16) T name[]
#endif

// ---- paged KV cache ------------------------------------------------------------------------------
//
// A layer's cache is blocks of KV_BLOCK positions, each KV_BLOCK rows of keys then KV_BLOCK rows of
// values (a row: kv_heads * head_dim values of the storage type), wherever the pool put them; the
// layer's block table holds their addresses. Slot s (the position, or its ring slot on a sliding
// layer) is row s % KV_BLOCK of block table[s / KV_BLOCK]. Blocks of KV_BLOCK = 64 rows keep every
// 64-aligned tile of the prefill attention inside one block.
#define KV_BLOCK 64
// Row `slot` of the keys (v = 0) or values (v = 1) of a paged cache whose rows are `rw` values of T.
template <typename T>
__device__ __forceinline__ T* kv_row(const u64* __restrict__ tab, long slot, long rw, int v) {
    return (T*)tab[slot >> 6] + ((long)v * KV_BLOCK + (slot & (KV_BLOCK - 1))) * rw;
}

// ---- programmatic dependent launch --------------------------------------------------------------
//
// The host launches every kernel with programmatic stream serialization (sm_90+): its blocks may
// start while the previous kernel still runs. Each kernel first waits for its predecessor's
// results (griddepcontrol.wait: the previous grid completed and its writes are visible), then
// lets its own successor launch, so the successor's launch and block scheduling overlap this
// kernel's work instead of following it. Data never written by kernels (weights) may be read
// before the wait.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(FP4FORGE_CPU_EMU)
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(FP4FORGE_CPU_EMU)
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}
__device__ __forceinline__ void pdl_enter() {
    pdl_wait();
    pdl_launch_dependents();
}

// ---- L2 prefetch --------------------------------------------------------------------------------
//
// A hint that [p, p + bytes) is read soon: the L2 fetches it from DRAM while the caller (or the
// kernel after it) does other work, so that the loads that follow hit L2 instead of each waiting
// for DRAM. No effect on any result; sm_90 only (a bulk prefetch a piece), nothing elsewhere.
// Only the 16-byte words inside the range are asked for (never a byte outside it). Lane `lane`
// of `lanes` issues the pieces lane, lane + lanes, ... (L2_PF_PIECE bytes each).
#define L2_PF_PIECE 16384
__device__ __forceinline__ void l2_prefetch(const void* p, long bytes, int lane, int lanes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(FP4FORGE_CPU_EMU)
    const unsigned long a = (unsigned long)p, b = a + (unsigned long)max(bytes, 0l);
    const unsigned long a16 = (a + 15) & ~15ul, b16 = b & ~15ul;
    for (unsigned long o = a16 + (unsigned long)lane * L2_PF_PIECE; o < b16; o += (unsigned long)lanes * L2_PF_PIECE) {
        const unsigned n = (unsigned)min((unsigned long)L2_PF_PIECE, b16 - o);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(o), "r"(n) : "memory");
    }
#elif defined(FP4FORGE_CPU_EMU)
    if (lane == 0) emu_prefetch_check(p, bytes);  // (tools/cuda-cpu: the range must be allocated)
    (void)lanes;
#else
    (void)p, (void)bytes, (void)lane, (void)lanes;
#endif
}

// l2_prefetch of rows [row0, row0 + rows) of an NVFP4 matrix of K columns: their packed values
// (K / 2 bytes a row at w) and their scales (K / 16 bytes a row at scales).
__device__ __forceinline__ void l2_prefetch_nv_rows(const void* w, const u8* scales, long row0, long rows, int K,
                                                    int lane, int lanes) {
    l2_prefetch((const u8*)w + row0 * (K / 2), rows * (K / 2), lane, lanes);
    l2_prefetch(scales + row0 * (K / 16), rows * (K / 16), lane, lanes);
}

__device__ __forceinline__ float bf16_to_f32(u32 b) { return __uint_as_float(b << 16); }
__device__ __forceinline__ u16 f32_to_bf16(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40);
    u32 r = u + 0x7fffu + ((u >> 16) & 1u);
    return (u16)(r >> 16);
}
__device__ __forceinline__ float f16_to_f32(u16 h) {
#ifdef FP4FORGE_CPU_EMU
    return emu_f16_to_f32(h);
#else
    float f;
    asm("{ cvt.f32.f16 %0, %1; }" : "=f"(f) : "h"(h));
    return f;
#endif
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

// The attention output gate's factor: softplus(g) = log(1 + e^g) (g itself past 20).
__device__ __forceinline__ float softplus(float g) { return g > 20.f ? g : log1pf(expf(g)); }
// silu(g) * u, the SiLU product of every kernel that computes one (silu_mul, the experts).
__device__ __forceinline__ float silu_times(float g, float u) { return g / (1.0f + expf(-g)) * u; }

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
#ifdef FP4FORGE_CPU_EMU
    f.x = emu_f16_to_f32((u16)h);
    f.y = emu_f16_to_f32((u16)(h >> 16));
#else
    asm("{ .reg .b16 lo, hi;\n\t mov.b32 {lo, hi}, %2;\n\t cvt.f32.f16 %0, lo;\n\t cvt.f32.f16 %1, hi; }"
        : "=f"(f.x), "=f"(f.y)
        : "r"(h));
#endif
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


// ---- tensor-core helpers (sm_80+: bf16 mma, ldmatrix, cp.async; older devices never take the
// paths that use them, where they compile to nothing) --------------------------------------------

// The shared-memory address of p (for cp.async and ldmatrix).
__device__ __forceinline__ u32 smem_u32(const void* p) {
#ifdef FP4FORGE_CPU_EMU
    return emu_smem_u32(p);
#else
    u32 a;
    asm("{ .reg .u64 t;\n\t cvta.to.shared.u64 t, %1;\n\t cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
#endif
}

// 16 bytes global -> shared, asynchronously; ok == false: 16 zero bytes (src is not read).
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, bool ok) {
#ifdef FP4FORGE_CPU_EMU
    emu_cp_async(dst, src, 16, ok);
#elif __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0) : "memory");
#endif
}
// 4 bytes global -> shared, asynchronously (through L1); ok == false: 4 zero bytes.
__device__ __forceinline__ void cp_async4(u32 dst, const void* src, bool ok) {
#ifdef FP4FORGE_CPU_EMU
    emu_cp_async(dst, src, 4, ok);
#elif __CUDA_ARCH__ >= 800
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(ok ? 4 : 0) : "memory");
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if __CUDA_ARCH__ >= 800 && !defined(FP4FORGE_CPU_EMU)
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
// Waits until at most N of this thread's committed groups are pending.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if __CUDA_ARCH__ >= 800 && !defined(FP4FORGE_CPU_EMU)
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

// 8 bytes of shared memory at address a (smem_u32's), in order with the other asm of the thread
// (barriers, cp.async waits).
__device__ __forceinline__ uint2 lds64(u32 a) {
#ifdef FP4FORGE_CPU_EMU
    return *(const uint2*)emu_smem_ptr(a);
#else
    uint2 v;
    asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(a));
    return v;
#endif
}

__device__ __forceinline__ void ldsm_x4(u32 r[4], u32 addr) {
#ifdef FP4FORGE_CPU_EMU
    emu_ldmatrix_x4(r, addr, false);
#elif __CUDA_ARCH__ >= 800
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
#endif
}
__device__ __forceinline__ void ldsm_x4_t(u32 r[4], u32 addr) {
#ifdef FP4FORGE_CPU_EMU
    emu_ldmatrix_x4(r, addr, true);
#elif __CUDA_ARCH__ >= 800
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
#endif
}

// c += a * b: mma.m16n8k16, bf16 operands, f32 accumulation (sm_80+).
__device__ __forceinline__ void mma_bf16(float c[4], const u32 a[4], u32 b0, u32 b1) {
#ifdef FP4FORGE_CPU_EMU
    emu_mma_m16n8k16(c, a, b0, b1, true);
#elif __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// (x, y) rounded to bf16, x in the low half.
__device__ __forceinline__ u32 bf16x2_rn(float x, float y) {
#ifdef FP4FORGE_CPU_EMU
    return emu_bf16x2_rn(x, y);
#elif __CUDA_ARCH__ >= 800
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(y), "f"(x));
    return r;
#else
    return (u32)f32_to_bf16(x) | ((u32)f32_to_bf16(y) << 16);
#endif
}

// The bf16 pair nearest (x, y); x and y become what it leaves (exact in f32).
__device__ __forceinline__ u32 bf16x2_split(float& x, float& y) {
    const u32 h = bf16x2_rn(x, y);
    x -= __uint_as_float(h << 16);
    y -= __uint_as_float(h & 0xffff0000u);
    return h;
}

// (x, y) as N bf16 pairs (x in the low halves) that sum to it: each the pair nearest what the
// ones before it leave, the last rounded, so about 8N significant bits of each (tensor-core A
// operands of f32 values: q in FA_QPARTS parts, a probability as hi + lo).
template <int N>
__device__ __forceinline__ void bf16x2_parts(float x, float y, u32 (&part)[N]) {
#pragma unroll
    for (int i = 0; i + 1 < N; i++) part[i] = bf16x2_split(x, y);
    part[N - 1] = bf16x2_rn(x, y);
}

// (x, y) rounded to f16, x in the low half.
__device__ __forceinline__ u32 f16x2_rn(float x, float y) {
#ifdef FP4FORGE_CPU_EMU
    return emu_f16x2_rn(x, y);
#else
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(y), "f"(x));
    return r;
#endif
}

// The f16 pair nearest (x, y); x and y become what it leaves (exact in f32 within f16's range).
__device__ __forceinline__ u32 f16x2_split(float& x, float& y) {
    const u32 h = f16x2_rn(x, y);
    const float2 f = h2_to_f2(h);
    x -= f.x;
    y -= f.y;
    return h;
}

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
#ifdef FP4FORGE_CPU_EMU
    v = *(const float4*)p;
#else
    asm volatile("ld.global.cg.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
#endif
    return v;
}

// One f32 through L2 only (written by another block of the same launch).
__device__ __forceinline__ float ld_cg(const float* p) {
#ifdef FP4FORGE_CPU_EMU
    return *p;
#else
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
#endif
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
