// cuda-cpu: runs fp4forge's CUDA kernels on the CPU, for testing without a GPU.
//
// The fake NVRTC of driver.cpp compiles the kernel source as C++ with this header included first
// (`-include`), into a shared object that the fake driver loads as the "module". Every CUDA
// thread is a fiber with its own stack; the fibers of one block run on one OS thread, switched at
// every barrier and warp collective (__syncthreads, __syncwarp, shuffles, ballots, ldmatrix, mma),
// so the kernels' own code runs unchanged. Blocks are shared out among a pool of OS threads.
// `__shared__` variables are thread_local (one block per OS thread at a time); dynamic shared
// memory is a thread_local buffer. The PTX the kernels write inline (mma, ldmatrix, cp.async,
// conversions) is behind `FP4FORGE_CPU_EMU` in the kernel source, which calls the `emu_*`
// functions below, written from the PTX ISA's definitions.
//
// What it checks: the results of the kernels and their launches (grid, block, arguments, shared
// memory sizes), a barrier that not every thread of a block reaches (reported as a deadlock
// with the kernel's name instead of a hang), reads of dynamic shared memory never written
// (filled with NaN bytes at every block's start), accesses past a fiber's stack (guard page).
// What it does not: timing, races between threads (fibers switch only at barriers), the
// asynchrony of cp.async (copies complete at once), the f32 rounding order inside mma (summed in
// f64, rounded once).
#pragma once

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#define FP4FORGE_CPU_EMU 1

#ifdef FP4FORGE_CPU_EMU_SCAN
#define __global__ FP4FORGE_CPU_EMU_KERNEL  // the preprocessing pass that finds the entry points
#else
#define __global__
#endif
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static thread_local
#define __constant__ static

// ---- vector types ---------------------------------------------------------------------------
struct __align__(16) float4 { float x, y, z, w; };
struct __align__(8) float2 { float x, y; };
struct __align__(16) uint4 { unsigned x, y, z, w; };
struct __align__(8) uint2 { unsigned x, y; };
struct __align__(16) int4 { int x, y, z, w; };
struct __align__(8) int2 { int x, y; };
struct uint3 { unsigned x, y, z; };
struct dim3 { unsigned x, y, z; };
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline int2 make_int2(int x, int y) { return {x, y}; }

// ---- arithmetic intrinsics ------------------------------------------------------------------
template <class A, class B>
inline typename std::common_type<A, B>::type min(A a, B b) {
    typedef typename std::common_type<A, B>::type T;
    return (T)a < (T)b ? (T)a : (T)b;
}
template <class A, class B>
inline typename std::common_type<A, B>::type max(A a, B b) {
    typedef typename std::common_type<A, B>::type T;
    return (T)a > (T)b ? (T)a : (T)b;
}
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __saturatef(float x) { return x < 0.f ? 0.f : (x > 1.f ? 1.f : x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(unsigned x) { return x ? __builtin_clz(x) : 32; }
inline int __ffs(unsigned x) { return __builtin_ffs((int)x); }
inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; i++) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
// Bytes of (y:x) picked by the selector's four low nibbles (PTX prmt, default mode).
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const uint64_t v = ((uint64_t)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; i++) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
}
template <class T>
inline T __ldg(const T* p) { return *p; }

inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
inline float atomicAdd(float* p, float v) {
    unsigned* u = (unsigned*)p;
    unsigned old = __atomic_load_n(u, __ATOMIC_SEQ_CST);
    while (!__atomic_compare_exchange_n(u, &old, __float_as_uint(__uint_as_float(old) + v), false,
                                        __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    }
    return __uint_as_float(old);
}
inline int atomicMax(int* p, int v) {
    int old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (old < v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    }
    return old;
}
inline unsigned atomicMax(unsigned* p, unsigned v) {
    unsigned old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (old < v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    }
    return old;
}
inline int atomicMin(int* p, int v) {
    int old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (old > v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    }
    return old;
}
inline unsigned atomicCAS(unsigned* p, unsigned cmp, unsigned v) {
    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return cmp;
}
inline int atomicCAS(int* p, int cmp, int v) {
    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return cmp;
}
inline unsigned atomicExch(unsigned* p, unsigned v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
inline int atomicExch(int* p, int v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

namespace emu {

// ---- fibers -----------------------------------------------------------------------------------

// Saves the callee-saved registers and the stack pointer into *from, and resumes the context
// whose stack pointer is `to` (System V x86-64; the kernels never change the SSE or x87 control
// words, so every fiber shares the OS thread's).
extern "C" void emu_switch_context(void** from, void* to);
asm(R"(
    .text
    .globl emu_switch_context
    .hidden emu_switch_context
    .type emu_switch_context, @function
emu_switch_context:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch_context, .-emu_switch_context
)");

constexpr size_t STACK_BYTES = 256 * 1024;
constexpr size_t GUARD_BYTES = 4096;
constexpr int MAX_THREADS = 1024;
constexpr size_t DYNAMIC_SMEM_BYTES = 232448;  // sm_90's opt-in maximum (227 KiB)

struct Barrier {
    unsigned arrived;
    unsigned generation;
};

// Warp-collective exchange: each lane's contribution, up to 10 words (mma: a, b and c), and
// the mma's result for every lane, computed once per instruction (by the first lane to resume).
struct Warp {
    Barrier bar;
    unsigned live;  // lanes not exited (bit per lane)
    unsigned mma_generation;  // the barrier generation whose mma `result` holds
    uint32_t words[32][10];
    uint64_t wide[32];
    float result[32][4];
};

struct Fiber {
    void* sp;
    char* stack;  // STACK_BYTES above a guard page
    uint3 tid;
    int lane, warp;
    bool done;
    const Barrier* waiting;
    unsigned waiting_generation;
};

struct Launch {
    void (*entry)(void**);
    void** params;
    dim3 grid, block;
    unsigned smem;
    const char* name;
};

// One OS thread's block runner: its fibers (stacks kept between blocks) and the block's state.
// Trivially constructed, internal linkage: a thread_local access costs no initialisation check.
struct Runner {
    Fiber fibers[MAX_THREADS];
    void* scheduler_sp;
    Fiber* current;
    Barrier block_bar;
    unsigned live;
    Warp warps[MAX_THREADS / 32];
    const Launch* launch;
    uint3 block_idx;
    char error[256];
    bool faulted;  // a check inside the block failed (`error` says which): the launch fails
};

static thread_local Runner runner;
static thread_local __attribute__((aligned(128))) unsigned char dynamic_smem_buffer[DYNAMIC_SMEM_BYTES];
// The origin of the 32-bit shared-memory addresses (cvta.to.shared): this thread's TLS block of
// the module holds every __shared__ variable and the dynamic buffer, within 2 GiB of it.
static thread_local unsigned char smem_origin;

inline Fiber& self() { return *runner.current; }

inline void yield() { emu_switch_context(&runner.current->sp, runner.scheduler_sp); }

// Completes `b`'s generation (releasing its waiters) if `count` threads have arrived.
inline bool complete_if_arrived(Barrier& b, unsigned count) {
    if (b.arrived == 0 || b.arrived < count) return false;
    b.arrived = 0;
    b.generation++;
    return true;
}

// Waits at `b` until `count` arrivals (including this one) complete its generation.
inline void arrive_and_wait(Barrier& b, unsigned count) {
    const unsigned gen = b.generation;
    b.arrived++;
    if (complete_if_arrived(b, count)) return;
    Fiber& f = self();
    f.waiting = &b;
    f.waiting_generation = gen;
    yield();
}

inline void sync_block() { arrive_and_wait(runner.block_bar, runner.live); }

inline Warp& my_warp() { return runner.warps[self().warp]; }

inline void sync_warp(unsigned mask) {
    Warp& w = my_warp();
    arrive_and_wait(w.bar, (unsigned)__builtin_popcount(mask & w.live));
}

[[noreturn]] inline void fiber_main() {
    Fiber& f = self();
    runner.launch->entry(runner.launch->params);
    f.done = true;
    runner.live--;
    runner.warps[f.warp].live &= ~(1u << f.lane);
    // an exited thread no longer counts at barriers: release those it completes
    complete_if_arrived(runner.block_bar, runner.live);
    Warp& w = runner.warps[f.warp];
    complete_if_arrived(w.bar, (unsigned)__builtin_popcount(w.live));
    emu_switch_context(&f.sp, runner.scheduler_sp);
    __builtin_unreachable();
}

inline void fiber_start(Fiber& f) {
    if (!f.stack) {
        char* m = (char*)mmap(nullptr, STACK_BYTES + GUARD_BYTES, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) {
            fprintf(stderr, "cuda-cpu: no memory for a fiber stack\n");
            abort();
        }
        mprotect(m, GUARD_BYTES, PROT_NONE);
        f.stack = m + GUARD_BYTES;
    }
    uintptr_t top = ((uintptr_t)(f.stack + STACK_BYTES)) & ~(uintptr_t)15;
    uint64_t* s = (uint64_t*)top;
    s[-1] = 0;                         // fiber_main's return address (it never returns)
    s[-2] = (uint64_t)&fiber_main;     // where the first switch "returns" to
    for (int i = 3; i <= 8; i++) s[-i] = 0;  // rbp, rbx, r12..r15
    f.sp = &s[-8];
    f.done = false;
    f.waiting = nullptr;
}

// Runs block `idx` of the launch to completion on this OS thread; false on a deadlock.
inline bool run_block(const Launch& l, uint3 idx) {
    Runner& r = runner;
    const unsigned n = l.block.x * l.block.y * l.block.z;
    r.launch = &l;
    r.block_idx = idx;
    r.faulted = false;
    r.block_bar = Barrier();
    r.live = n;
    for (unsigned w = 0; w < (n + 31) / 32; w++) {
        r.warps[w].bar = Barrier();
        r.warps[w].mma_generation = ~0u;
        const unsigned lanes = n - 32 * w >= 32 ? 32 : n - 32 * w;
        r.warps[w].live = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1u;
    }
    for (unsigned t = 0; t < n; t++) {
        Fiber& f = r.fibers[t];
        f.tid = uint3{t % l.block.x, (t / l.block.x) % l.block.y, t / (l.block.x * l.block.y)};
        f.lane = (int)(t % 32);
        f.warp = (int)(t / 32);
        fiber_start(f);
    }
    if (l.smem > 0) memset(dynamic_smem_buffer, 0xff, l.smem);  // NaN bytes: unwritten reads show
    unsigned done = 0;
    // rounds alternate between ascending and descending thread order, so that a read a missing
    // barrier leaves unordered runs before the write in some round
    for (unsigned round = 0; done < n; round++) {
        bool progress = false;
        done = 0;
        for (unsigned i = 0; i < n; i++) {
            Fiber& f = r.fibers[round % 2 ? n - 1 - i : i];
            if (f.done) {
                done++;
                continue;
            }
            if (f.waiting && f.waiting->generation == f.waiting_generation) continue;
            f.waiting = nullptr;
            r.current = &f;
            emu_switch_context(&r.scheduler_sp, f.sp);
            progress = true;
            if (f.done) done++;
        }
        if (!progress && done < n) {
            unsigned waiting_block = 0, waiting_warp = 0;
            for (unsigned t = 0; t < n; t++) {
                if (r.fibers[t].done) continue;
                if (r.fibers[t].waiting == &r.block_bar) waiting_block++;
                else waiting_warp++;
            }
            snprintf(r.error, sizeof r.error,
                     "kernel %s, block (%u, %u, %u): deadlock: %u of %u threads at __syncthreads, %u at a "
                     "warp collective, %u exited (a barrier not every thread reaches)",
                     l.name, idx.x, idx.y, idx.z, waiting_block, n, waiting_warp, n - waiting_block - waiting_warp);
            return false;
        }
    }
    r.current = nullptr;
    return !r.faulted;
}

// The driver's check that [p, p + bytes) lies inside one live allocation (set at module load).
inline bool (*range_check)(const void* p, size_t bytes) = nullptr;

// The OS threads blocks are shared out among (FP4FORGE_CUDA_CPU_THREADS, default: every core).
struct Pool {
    std::mutex m;
    std::condition_variable wake, finished;
    std::vector<std::thread> threads;
    const Launch* launch = nullptr;
    uint64_t generation = 0;
    std::atomic<long> next{0};
    long total = 0;
    unsigned busy = 0;
    std::atomic<bool> failed{false};
    char error[256] = {0};

    Pool() {
        unsigned n = std::thread::hardware_concurrency();
        if (const char* e = getenv("FP4FORGE_CUDA_CPU_THREADS")) n = (unsigned)atoi(e);
        if (n < 1) n = 1;
        for (unsigned i = 1; i < n; i++) threads.emplace_back([this] { work(); });
    }

    void blocks(const Launch& l) {
        for (;;) {
            const long b = next.fetch_add(1);
            if (b >= total || failed.load()) return;
            const uint3 idx{(unsigned)(b % l.grid.x), (unsigned)((b / l.grid.x) % l.grid.y),
                            (unsigned)(b / ((long)l.grid.x * l.grid.y))};
            if (!run_block(l, idx)) {
                std::lock_guard<std::mutex> g(m);
                if (!failed.exchange(true)) memcpy(error, runner.error, sizeof error);
                return;
            }
        }
    }

    void work() {
        uint64_t seen = 0;
        for (;;) {
            const Launch* l;
            {
                std::unique_lock<std::mutex> g(m);
                wake.wait(g, [&] { return generation != seen; });
                seen = generation;
                l = launch;
            }
            blocks(*l);
            std::lock_guard<std::mutex> g(m);
            if (--busy == 0) finished.notify_all();
        }
    }

    // Runs every block of `l`; false with `error` set when a block deadlocked or faulted.
    bool run(const Launch& l) {
        {
            std::lock_guard<std::mutex> g(m);
            launch = &l;
            total = (long)l.grid.x * l.grid.y * l.grid.z;
            next = 0;
            failed = false;
            busy = (unsigned)threads.size();
            generation++;
        }
        wake.notify_all();
        blocks(l);
        std::unique_lock<std::mutex> g(m);
        finished.wait(g, [&] { return busy == 0; });
        return !failed.load();
    }
};

// Calls f with the kernel parameters params[i] points at (the driver's cuLaunchKernel layout).
template <class... A, size_t... I>
inline void invoke_impl(void (*f)(A...), void** params, std::index_sequence<I...>) {
    f(*static_cast<typename std::remove_cv<typename std::remove_reference<A>::type>::type*>(params[I])...);
}
template <class... A>
inline void invoke(void (*f)(A...), void** params) {
    invoke_impl(f, params, std::index_sequence_for<A...>{});
}

}  // namespace emu

// The driver hands the module its allocation check once loaded (driver.cpp's cuModuleLoadData).
extern "C" __attribute__((visibility("default"))) void emu_set_range_check(bool (*check)(const void*, size_t)) {
    emu::range_check = check;
}

// An L2 prefetch of [p, p + bytes) (`l2_prefetch` in kernels/common.cu): a no-op, but on a GPU a
// range outside the device's allocations is a bad address, so the launch fails here, naming it.
inline void emu_prefetch_check(const void* p, long bytes) {
    if (bytes <= 0 || !emu::range_check || emu::range_check(p, (size_t)bytes)) return;
    emu::Runner& r = emu::runner;
    if (!r.faulted)
        snprintf(r.error, sizeof r.error,
                 "kernel %s, block (%u, %u, %u), thread %u: L2 prefetch of %ld bytes at %p, outside every allocation",
                 r.launch->name, r.block_idx.x, r.block_idx.y, r.block_idx.z, r.current ? r.current->tid.x : 0u,
                 bytes, p);
    r.faulted = true;
}

// The module's launch entry (driver.cpp's cuLaunchKernel): 0, or -1 with `error` filled.
extern "C" __attribute__((visibility("default"))) int emu_launch(void (*entry)(void**), const char* name,
                                                                 const unsigned grid[3], const unsigned block[3],
                                                                 unsigned smem, void** params, char* error,
                                                                 size_t error_len) {
    static emu::Pool* pool = new emu::Pool();  // never destroyed: its threads live to the end
    static std::mutex one_launch;
    std::lock_guard<std::mutex> g(one_launch);
    const unsigned threads = block[0] * block[1] * block[2];
    if (threads == 0 || threads > (unsigned)emu::MAX_THREADS || grid[0] * grid[1] * grid[2] == 0) {
        snprintf(error, error_len, "kernel %s: invalid launch: grid (%u, %u, %u), block (%u, %u, %u)", name, grid[0],
                 grid[1], grid[2], block[0], block[1], block[2]);
        return -1;
    }
    if (smem > emu::DYNAMIC_SMEM_BYTES) {
        snprintf(error, error_len, "kernel %s: %u bytes of dynamic shared memory (at most %zu)", name, smem,
                 emu::DYNAMIC_SMEM_BYTES);
        return -1;
    }
    const emu::Launch l{entry, params, dim3{grid[0], grid[1], grid[2]}, dim3{block[0], block[1], block[2]}, smem,
                        name};
    if (!pool->run(l)) {
        snprintf(error, error_len, "%s", pool->error);
        return -1;
    }
    return 0;
}

#define threadIdx (emu::runner.current->tid)
#define blockIdx (emu::runner.block_idx)
#define blockDim (emu::runner.launch->block)
#define gridDim (emu::runner.launch->grid)
#define warpSize 32

inline void __syncthreads() { emu::sync_block(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { emu::sync_warp(mask); }

// ---- warp collectives: each lane posts its value, all meet, each reads its source, all meet --
template <class T>
inline T emu_shuffle(unsigned mask, T v, int src_lane) {
    static_assert(sizeof(T) <= 8, "shuffled values are at most 8 bytes");
    emu::Warp& w = emu::my_warp();
    const int lane = emu::self().lane;
    memcpy(&w.wide[lane], &v, sizeof(T));
    emu::sync_warp(mask);
    T r;
    memcpy(&r, &w.wide[src_lane & 31], sizeof(T));
    emu::sync_warp(mask);
    return r;
}
template <class T>
inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    const int lane = emu::self().lane;
    return emu_shuffle(mask, v, (lane & ~(width - 1)) + (src & (width - 1)));
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int m, int width = 32) {
    const int lane = emu::self().lane;
    const int src = lane ^ m;
    return emu_shuffle(mask, v, (src & ~(width - 1)) == (lane & ~(width - 1)) ? src : lane);
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32) {
    const int lane = emu::self().lane;
    const int seg = lane & ~(width - 1);
    return emu_shuffle(mask, v, lane - (int)d >= seg ? lane - (int)d : lane);
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) {
    const int lane = emu::self().lane;
    const int seg = lane & ~(width - 1);
    return emu_shuffle(mask, v, lane + (int)d < seg + width ? lane + (int)d : lane);
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
    emu::Warp& w = emu::my_warp();
    const int lane = emu::self().lane;
    w.words[lane][0] = pred != 0;
    emu::sync_warp(mask);
    unsigned r = 0;
    for (int i = 0; i < 32; i++)
        if ((mask >> i & 1u) && (w.live >> i & 1u) && w.words[i][0]) r |= 1u << i;
    emu::sync_warp(mask);
    return r;
}
inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
inline int __all_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) == (mask & emu::my_warp().live); }
inline unsigned __activemask() { return emu::my_warp().live; }

// ---- the PTX the kernel source writes inline ---------------------------------------------------

// f16 bits -> f32 (cvt.f32.f16: exact).
inline float emu_f16_to_f32(uint16_t h) {
    const uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        const float v = (float)m * 5.9604644775390625e-8f;  // m * 2^-24
        return __uint_as_float(__float_as_uint(v) | s);
    }
    if (e == 31) return __uint_as_float(s | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0u));
    return __uint_as_float(s | ((e + 112u) << 23) | (m << 13));
}

// f32 -> f16 bits, round to nearest even (cvt.rn.f16.f32), subnormals and overflow to inf.
inline uint16_t emu_f32_to_f16(float f) {
    const uint32_t u = __float_as_uint(f), s = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(s | 0x7e00u);
    if (a >= 0x477ff000u) return (uint16_t)(s | 0x7c00u);  // rounds past 65504: inf
    if (a < 0x38800000u) {                                 // below 2^-14: subnormal (or zero)
        const float v = __uint_as_float(a) * 16777216.0f;  // in units of 2^-24, exact
        return (uint16_t)(s | (uint32_t)rintf(v));
    }
    const uint32_t r = a - (112u << 23) + 0xfffu + ((a >> 13) & 1u);
    return (uint16_t)(s | (r >> 13));
}

// f32 -> bf16 bits, round to nearest even (cvt.rn.bf16.f32; NaN stays a quiet NaN).
inline uint16_t emu_f32_to_bf16(float f) {
    const uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// cvt.rn.bf16x2.f32 / cvt.rn.f16x2.f32 with x in the low half.
inline uint32_t emu_bf16x2_rn(float x, float y) { return emu_f32_to_bf16(x) | ((uint32_t)emu_f32_to_bf16(y) << 16); }
inline uint32_t emu_f16x2_rn(float x, float y) { return emu_f32_to_f16(x) | ((uint32_t)emu_f32_to_f16(y) << 16); }

// Two e4m3 bytes (low byte first) -> two f16 (cvt.rn.f16x2.e4m3x2: exact; 0x7f/0xff are NaN).
inline uint32_t emu_e4m3x2_to_f16x2(uint16_t v) {
    uint32_t r = 0;
    for (int i = 0; i < 2; i++) {
        const uint32_t b = (v >> (8 * i)) & 0xffu, s = (b & 0x80u) << 8, e = (b >> 3) & 0xfu, m = b & 7u;
        uint32_t h;
        if (e == 15 && m == 7) h = 0x7fffu;
        else if (e == 0) h = s | (uint32_t)emu_f32_to_f16((float)m * 0.001953125f);
        else h = s | ((e + 8u) << 10) | (m << 7);
        r |= (h & 0xffffu) << (16 * i);
    }
    return r;
}

// mul.rn.f16x2: each half's product rounded once to f16 (the f32 product of two f16 is exact).
inline uint32_t emu_hmul2(uint32_t a, uint32_t b) {
    const float lo = emu_f16_to_f32((uint16_t)a) * emu_f16_to_f32((uint16_t)b);
    const float hi = emu_f16_to_f32((uint16_t)(a >> 16)) * emu_f16_to_f32((uint16_t)(b >> 16));
    return emu_f16x2_rn(lo, hi);
}

// cvta.to.shared: the 32-bit shared-memory address of a __shared__ or dynamic-shared pointer.
inline uint32_t emu_smem_u32(const void* p) { return (uint32_t)((const unsigned char*)p - &emu::smem_origin); }
inline unsigned char* emu_smem_ptr(uint32_t a) { return &emu::smem_origin + (int32_t)a; }

// The dynamic shared memory of the running block (extern __shared__).
inline unsigned char* emu_dynamic_smem() { return emu::dynamic_smem_buffer; }

// cp.async of `bytes` (16 or 4): copied at once; not ok: zeros, src not read.
inline void emu_cp_async(uint32_t dst, const void* src, int bytes, bool ok) {
    if (ok) memcpy(emu_smem_ptr(dst), src, (size_t)bytes);
    else memset(emu_smem_ptr(dst), 0, (size_t)bytes);
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lanes 8j..8j+7 give the row addresses of
// matrix j; register j of lane l gets row l/4, columns 2(l%4), 2(l%4)+1 of matrix j (with .trans:
// rows 2(l%4), 2(l%4)+1 of column l/4).
inline void emu_ldmatrix_x4(uint32_t r[4], uint32_t addr, bool trans) {
    emu::Warp& w = emu::my_warp();
    const int lane = emu::self().lane;
    w.words[lane][0] = addr;
    emu::sync_warp(0xffffffffu);
    for (int j = 0; j < 4; j++) {
        if (!trans) {
            memcpy(&r[j], emu_smem_ptr(w.words[8 * j + lane / 4][0]) + 4 * (lane % 4), 4);
        } else {
            uint16_t lo, hi;
            memcpy(&lo, emu_smem_ptr(w.words[8 * j + 2 * (lane % 4)][0]) + 2 * (lane / 4), 2);
            memcpy(&hi, emu_smem_ptr(w.words[8 * j + 2 * (lane % 4) + 1][0]) + 2 * (lane / 4), 2);
            r[j] = lo | ((uint32_t)hi << 16);
        }
    }
    emu::sync_warp(0xffffffffu);
}

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32, d = a * b + c: lane l (group
// g = l/4, t = l%4) holds A rows g, g+8 at columns 2t, 2t+1 (+8 in registers 2, 3), B column g at
// rows 2t, 2t+1 (+8 in register 1), C/D rows g, g+8 at columns 2t, 2t+1. Products exact, the sum
// of each output in f64, rounded once to f32.
inline void emu_mma_m16n8k16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1, bool bf16) {
    emu::Warp& w = emu::my_warp();
    const int lane = emu::self().lane;
    uint32_t* mine = w.words[lane];
    for (int i = 0; i < 4; i++) mine[i] = a[i];
    mine[4] = b0;
    mine[5] = b1;
    for (int i = 0; i < 4; i++) memcpy(&mine[6 + i], &c[i], 4);
    emu::sync_warp(0xffffffffu);
    if (w.mma_generation != w.bar.generation) {
        w.mma_generation = w.bar.generation;
        auto half = [bf16](uint32_t reg, int k) -> double {
            const uint16_t h = (uint16_t)(reg >> (16 * (k & 1)));
            return bf16 ? (double)__uint_as_float((uint32_t)h << 16) : (double)emu_f16_to_f32(h);
        };
        double A[16][16], B[16][8];
        for (int row = 0; row < 16; row++)
            for (int k = 0; k < 16; k++) A[row][k] = half(w.words[(row % 8) * 4 + (k % 8) / 2][(row >= 8) + 2 * (k >= 8)], k);
        for (int k = 0; k < 16; k++)
            for (int col = 0; col < 8; col++) B[k][col] = half(w.words[col * 4 + (k % 8) / 2][4 + (k >= 8)], k);
        for (int l = 0; l < 32; l++) {
            const int g = l / 4, t = l % 4;
            for (int i = 0; i < 4; i++) {
                const int row = g + 8 * (i / 2), col = 2 * t + (i % 2);
                float ci;
                memcpy(&ci, &w.words[l][6 + i], 4);
                double s = ci;
                for (int k = 0; k < 16; k++) s += A[row][k] * B[k][col];
                w.result[l][i] = (float)s;
            }
        }
    }
    for (int i = 0; i < 4; i++) c[i] = w.result[lane][i];
    emu::sync_warp(0xffffffffu);
}
