// cuda-cpu: a CUDA driver and an NVRTC that run kernels on the CPU (see cuda_cpu.h).
//
// Built as one shared object that stands in for both libcuda.so and libnvrtc.so (the engine loads
// both at run time through cudarc): put its directory first on LD_LIBRARY_PATH. The subset of
// the two APIs the engine and its tests call, with the driver's semantics on one device:
// - "device memory" is host memory (a device pointer is a host address), and every stream is
//   synchronous: a launch or copy is complete when the call returns;
// - NVRTC compiles the CUDA C source with the host C++ compiler (`CXX`, default g++) and
//   cuda_cpu.h into a shared object, which is the "CUBIN"; cuModuleLoadData loads it;
// - the device reports compute capability FP4FORGE_CUDA_CPU_CC (default 90, so the sm_90 paths
//   run), FP4FORGE_CUDA_CPU_MEMORY_MIB MiB of memory (default 4096) and 132 SMs.
// Anything else answers CUDA_ERROR_NOT_SUPPORTED (the symbol is absent: cudarc names it).

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <map>
#include <mutex>
#include <regex>
#include <string>
#include <vector>

#ifndef CUDA_CPU_DIR
#error "build with -DCUDA_CPU_DIR=\"the directory of cuda_cpu.h\""
#endif

#define API extern "C" __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_LAUNCH_FAILED = 719,
    CUDA_ERROR_NOT_SUPPORTED = 801,
};

namespace {

std::mutex mu;

// sm_90's opt-in dynamic shared memory per block (cuda_cpu.h's buffer holds as much).
constexpr int OPTIN_SMEM_BYTES = 232448;

struct Context {
    int device = 0;
};
Context primary;
thread_local Context* current = nullptr;

struct Module {
    void* handle = nullptr;
    int (*launch)(void (*)(void**), const char*, const unsigned*, const unsigned*, unsigned, void**, char*,
                  size_t) = nullptr;
};

struct Function {
    Module* module;
    void (*entry)(void**);
    std::string name;
    int max_dynamic_smem = 48 * 1024;
};

struct Event {
    double seconds = 0;
};

std::map<uintptr_t, size_t> allocations;  // device pointer -> bytes
size_t allocated = 0;

int env_int(const char* name, int fallback) {
    const char* v = getenv(name);
    return v && *v ? atoi(v) : fallback;
}

size_t total_memory() { return (size_t)env_int("FP4FORGE_CUDA_CPU_MEMORY_MIB", 4096) << 20; }

int compute_capability() { return env_int("FP4FORGE_CUDA_CPU_CC", 90); }

double now() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

CUresult alloc(CUdeviceptr* p, size_t bytes) {
    std::lock_guard<std::mutex> g(mu);
    if (allocated + bytes > total_memory()) return CUDA_ERROR_OUT_OF_MEMORY;
    void* m = aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
    if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
    allocations[(uintptr_t)m] = bytes;
    allocated += bytes;
    *p = (CUdeviceptr)(uintptr_t)m;
    return CUDA_SUCCESS;
}

// Whether [p, p + bytes) lies inside one live allocation (the module's check of L2 prefetches).
bool range_in_allocation(const void* p, size_t bytes) {
    std::lock_guard<std::mutex> g(mu);
    const uintptr_t a = (uintptr_t)p;
    auto it = allocations.upper_bound(a);
    if (it == allocations.begin()) return false;
    --it;
    return a >= it->first && a - it->first <= it->second && bytes <= it->second - (a - it->first);
}

CUresult release(CUdeviceptr p) {
    std::lock_guard<std::mutex> g(mu);
    auto it = allocations.find((uintptr_t)p);
    if (it == allocations.end()) return p == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    allocated -= it->second;
    allocations.erase(it);
    free((void*)(uintptr_t)p);
    return CUDA_SUCCESS;
}

}  // namespace

// ---- driver: initialisation, device, context -------------------------------------------------

API CUresult cuInit(unsigned) { return CUDA_SUCCESS; }
API CUresult cuDriverGetVersion(int* v) {
    *v = 13000;
    return CUDA_SUCCESS;
}
API CUresult cuDeviceGetCount(int* n) {
    *n = 1;
    return CUDA_SUCCESS;
}
API CUresult cuDeviceGet(CUdevice* d, int ordinal) {
    if (ordinal != 0) return CUDA_ERROR_INVALID_VALUE;
    *d = 0;
    return CUDA_SUCCESS;
}
API CUresult cuDeviceGetName(char* name, int len, CUdevice) {
    snprintf(name, (size_t)len, "cuda-cpu (sm_%d emulated on the CPU)", compute_capability());
    return CUDA_SUCCESS;
}
API CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice) {
    *bytes = total_memory();
    return CUDA_SUCCESS;
}
API CUresult cuDeviceGetAttribute(int* v, int attribute, CUdevice) {
    switch (attribute) {
        case 1: *v = 1024; break;                         // max threads per block
        case 8: *v = 48 * 1024; break;                    // shared memory per block
        case 10: *v = 32; break;                          // warp size
        case 16: *v = 132; break;                         // multiprocessors
        case 38: *v = 50 << 20; break;                    // L2 cache (bytes)
        case 75: *v = compute_capability() / 10; break;   // compute capability
        case 76: *v = compute_capability() % 10; break;
        case 81: *v = 233472; break;                      // shared memory per multiprocessor
        case 97: *v = OPTIN_SMEM_BYTES; break;            // opt-in shared memory per block
        case 115: *v = 0; break;                          // memory pools: no (plain allocations)
        default: *v = 0; break;
    }
    return CUDA_SUCCESS;
}
API CUresult cuDevicePrimaryCtxRetain(Context** ctx, CUdevice) {
    *ctx = &primary;
    return CUDA_SUCCESS;
}
API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice) { return CUDA_SUCCESS; }
API CUresult cuCtxSetCurrent(Context* ctx) {
    current = ctx;
    return CUDA_SUCCESS;
}
API CUresult cuCtxGetCurrent(Context** ctx) {
    *ctx = current;
    return CUDA_SUCCESS;
}
API CUresult cuCtxPushCurrent_v2(Context* ctx) { return cuCtxSetCurrent(ctx); }
API CUresult cuCtxPopCurrent_v2(Context** ctx) {
    if (ctx) *ctx = current;
    return CUDA_SUCCESS;
}
API CUresult cuCtxSynchronize() { return CUDA_SUCCESS; }
// The profiler's capture range (batch_decode_speed --profile): nothing to capture here.
API CUresult cuProfilerStart() { return CUDA_SUCCESS; }
API CUresult cuProfilerStop() { return CUDA_SUCCESS; }
API CUresult cuGetErrorString(CUresult e, const char** s) {
    switch (e) {
        case CUDA_SUCCESS: *s = "no error"; break;
        case CUDA_ERROR_INVALID_VALUE: *s = "invalid argument"; break;
        case CUDA_ERROR_OUT_OF_MEMORY: *s = "out of memory"; break;
        case CUDA_ERROR_INVALID_IMAGE: *s = "invalid kernel image"; break;
        case CUDA_ERROR_NOT_FOUND: *s = "named symbol not found"; break;
        case CUDA_ERROR_LAUNCH_FAILED: *s = "unspecified launch failure"; break;
        default: *s = "unknown error"; break;
    }
    return CUDA_SUCCESS;
}
API CUresult cuGetErrorName(CUresult e, const char** s) { return cuGetErrorString(e, s); }

// ---- streams and events: everything completes inside the call ---------------------------------

API CUresult cuStreamCreate(void** s, unsigned) {
    *s = new int(0);
    return CUDA_SUCCESS;
}
API CUresult cuStreamCreateWithPriority(void** s, unsigned f, int) { return cuStreamCreate(s, f); }
API CUresult cuStreamDestroy_v2(void* s) {
    delete (int*)s;
    return CUDA_SUCCESS;
}
API CUresult cuStreamSynchronize(void*) { return CUDA_SUCCESS; }
API CUresult cuStreamQuery(void*) { return CUDA_SUCCESS; }
API CUresult cuStreamWaitEvent(void*, void*, unsigned) { return CUDA_SUCCESS; }
API CUresult cuEventCreate(Event** e, unsigned) {
    *e = new Event();
    return CUDA_SUCCESS;
}
API CUresult cuEventDestroy_v2(Event* e) {
    delete e;
    return CUDA_SUCCESS;
}
API CUresult cuEventRecord(Event* e, void*) {
    e->seconds = now();
    return CUDA_SUCCESS;
}
API CUresult cuEventSynchronize(Event*) { return CUDA_SUCCESS; }
API CUresult cuEventQuery(Event*) { return CUDA_SUCCESS; }
API CUresult cuEventElapsedTime(float* ms, Event* a, Event* b) {
    *ms = (float)((b->seconds - a->seconds) * 1e3);
    return CUDA_SUCCESS;
}
API CUresult cuEventElapsedTime_v2(float* ms, Event* a, Event* b) { return cuEventElapsedTime(ms, a, b); }
API CUresult cuLaunchHostFunc(void*, void (*f)(void*), void* data) {
    f(data);
    return CUDA_SUCCESS;
}

// ---- memory ----------------------------------------------------------------------------------

API CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t bytes) { return alloc(p, bytes); }
API CUresult cuMemAllocAsync(CUdeviceptr* p, size_t bytes, void*) { return alloc(p, bytes); }
API CUresult cuMemFree_v2(CUdeviceptr p) { return release(p); }
API CUresult cuMemFreeAsync(CUdeviceptr p, void*) { return release(p); }
API CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total) {
    std::lock_guard<std::mutex> g(mu);
    *total = total_memory();
    *free_bytes = *total - allocated;
    return CUDA_SUCCESS;
}
API CUresult cuMemHostAlloc(void** p, size_t bytes, unsigned) {
    *p = malloc(bytes ? bytes : 1);
    return *p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
API CUresult cuMemAllocHost_v2(void** p, size_t bytes) { return cuMemHostAlloc(p, bytes, 0); }
API CUresult cuMemFreeHost(void* p) {
    free(p);
    return CUDA_SUCCESS;
}
API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
    memcpy((void*)(uintptr_t)dst, src, n);
    return CUDA_SUCCESS;
}
API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, void*) {
    return cuMemcpyHtoD_v2(dst, src, n);
}
API CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
    memcpy(dst, (const void*)(uintptr_t)src, n);
    return CUDA_SUCCESS;
}
API CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, void*) { return cuMemcpyDtoH_v2(dst, src, n); }
API CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    memmove((void*)(uintptr_t)dst, (const void*)(uintptr_t)src, n);
    return CUDA_SUCCESS;
}
API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, void*) {
    return cuMemcpyDtoD_v2(dst, src, n);
}
API CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n) {
    memset((void*)(uintptr_t)dst, v, n);
    return CUDA_SUCCESS;
}
API CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, void*) { return cuMemsetD8_v2(dst, v, n); }
API CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned v, size_t n) {
    unsigned* p = (unsigned*)(uintptr_t)dst;
    for (size_t i = 0; i < n; i++) p[i] = v;
    return CUDA_SUCCESS;
}
API CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned v, size_t n, void*) { return cuMemsetD32_v2(dst, v, n); }

// ---- modules and launches --------------------------------------------------------------------

// The "CUBIN" is the shared object NVRTC wrote: written to a file and loaded.
API CUresult cuModuleLoadData(Module** out, const void* image) {
    static const char magic[4] = {0x7f, 'E', 'L', 'F'};
    if (memcmp(image, magic, 4) != 0) {
        fprintf(stderr, "cuda-cpu: cuModuleLoadData: not a cuda-cpu module (PTX cannot run here)\n");
        return CUDA_ERROR_INVALID_IMAGE;
    }
    // the ELF's size: section headers end it (e_shoff + e_shnum * e_shentsize)
    const unsigned char* b = (const unsigned char*)image;
    uint64_t shoff;
    uint16_t shentsize, shnum;
    memcpy(&shoff, b + 0x28, 8);
    memcpy(&shentsize, b + 0x3a, 2);
    memcpy(&shnum, b + 0x3c, 2);
    const size_t size = shoff + (size_t)shentsize * shnum;
    char path[] = "/tmp/cuda-cpu-module-XXXXXX";
    const int fd = mkstemp(path);
    if (fd < 0) return CUDA_ERROR_INVALID_IMAGE;
    const bool written = write(fd, image, size) == (ssize_t)size;
    close(fd);
    void* h = written ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : nullptr;
    unlink(path);
    if (!h) {
        fprintf(stderr, "cuda-cpu: cuModuleLoadData: %s\n", dlerror());
        return CUDA_ERROR_INVALID_IMAGE;
    }
    Module* m = new Module();
    m->handle = h;
    m->launch = (decltype(m->launch))dlsym(h, "emu_launch");
    if (!m->launch) return CUDA_ERROR_INVALID_IMAGE;
    if (auto set = (void (*)(bool (*)(const void*, size_t)))dlsym(h, "emu_set_range_check")) set(&range_in_allocation);
    *out = m;
    return CUDA_SUCCESS;
}
API CUresult cuModuleUnload(Module*) { return CUDA_SUCCESS; }  // kept loaded: kernels may be cached
API CUresult cuModuleGetFunction(Function** out, Module* m, const char* name) {
    void* e = dlsym(m->handle, (std::string("emu_entry_") + name).c_str());
    if (!e) return CUDA_ERROR_NOT_FOUND;
    *out = new Function{m, (void (*)(void**))e, name};
    return CUDA_SUCCESS;
}
API CUresult cuFuncSetAttribute(Function* f, int attribute, int value) {
    if (attribute == 8) {  // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        if (value > OPTIN_SMEM_BYTES) return CUDA_ERROR_INVALID_VALUE;
        f->max_dynamic_smem = value;
    }
    return CUDA_SUCCESS;
}
API CUresult cuFuncGetAttribute(int* v, int attribute, Function* f) {
    *v = attribute == 8 ? f->max_dynamic_smem : 0;
    return CUDA_SUCCESS;
}

static CUresult launch(Function* f, const unsigned grid[3], const unsigned block[3], unsigned smem, void** params) {
    if (smem > (unsigned)f->max_dynamic_smem) {
        fprintf(stderr, "cuda-cpu: kernel %s: %u bytes of dynamic shared memory, its limit is %d\n", f->name.c_str(),
                smem, f->max_dynamic_smem);
        return CUDA_ERROR_INVALID_VALUE;
    }
    char error[512];
    if (f->module->launch(f->entry, f->name.c_str(), grid, block, smem, params, error, sizeof error) != 0) {
        fprintf(stderr, "cuda-cpu: %s\n", error);
        return CUDA_ERROR_LAUNCH_FAILED;
    }
    return CUDA_SUCCESS;
}

API CUresult cuLaunchKernel(Function* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                            unsigned smem, void*, void** params, void** extra) {
    if (extra) return CUDA_ERROR_NOT_SUPPORTED;
    const unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
    return launch(f, grid, block, smem, params);
}

struct LaunchConfig {
    unsigned grid[3], block[3], smem;
    void* stream;
    void* attrs;
    unsigned num_attrs;
};

// Launch attributes (programmatic stream serialization) change only the overlap of launches.
API CUresult cuLaunchKernelEx(const LaunchConfig* c, Function* f, void** params, void** extra) {
    if (extra) return CUDA_ERROR_NOT_SUPPORTED;
    return launch(f, c->grid, c->block, c->smem, params);
}

// ---- NVRTC -----------------------------------------------------------------------------------

struct Program {
    std::string source, log, ptx;
    std::vector<char> binary;
};

namespace {

// The host compiler's flags for the kernels: FP4FORGE_CUDA_CPU_CXXFLAGS, else -O2 for x86-64-v3
// without FMA contraction. g++ fuses multiply-adds after vectorising, so two kernels whose
// source writes the same arithmetic (which nvcc fuses alike, expression by expression) could
// differ in their last bits; without fusion the same expressions give the same bits, as the
// tests that compare two kernels bit for bit expect.
std::string kernel_flags() {
    const char* flags = getenv("FP4FORGE_CUDA_CPU_CXXFLAGS");
    return flags ? flags : "-O2 -march=x86-64-v3 -ffp-contract=off";
}

// The bytes of the file at `path` (none where it cannot be read).
std::string read_file(const std::string& path) {
    std::string out;
    if (FILE* f = fopen(path.c_str(), "rb")) {
        char buf[65536];
        size_t k;
        while ((k = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, k);
        fclose(f);
    }
    return out;
}

}  // namespace

// NVRTC's version: 99.N, N a hash of cuda_cpu.h and the compiler flags (kernel caches keyed by
// the version keep these modules apart from real CUBINs, and from those another emulator header
// or other flags built).
API int nvrtcVersion(int* major, int* minor) {
    static int header_hash = [] {
        uint32_t h = 2166136261u;
        for (const char c : read_file(CUDA_CPU_DIR "/cuda_cpu.h") + kernel_flags())
            h = (h ^ (uint32_t)(unsigned char)c) * 16777619u;
        return (int)(h % 1000000u);
    }();
    *major = 99;
    *minor = header_hash;
    return 0;
}
API const char* nvrtcGetErrorString(int r) { return r == 0 ? "NVRTC_SUCCESS" : "NVRTC_ERROR_COMPILATION"; }
API int nvrtcCreateProgram(Program** p, const char* src, const char*, int, const char* const*, const char* const*) {
    *p = new Program();
    (*p)->source = src;
    return 0;
}
API int nvrtcDestroyProgram(Program** p) {
    delete *p;
    *p = nullptr;
    return 0;
}

namespace {

// Runs `cmd` (its output to `log`), appending that output to `text`; its exit status.
int run_command(const std::string& cmd, const std::string& log, std::string& text) {
    const int status = system((cmd + " > " + log + " 2>&1").c_str());
    text += read_file(log);
    return status;
}

}  // namespace

// Compiles the source with the host compiler (`CXX`, default g++; flags: `kernel_flags`):
// -D__CUDA_ARCH__ from --gpu-architecture=sm_XY,
// cuda_cpu.h included first. A preprocessing pass finds the `__global__` entry points (macros
// write some of them); one `emu_entry_NAME` per entry point is appended.
API int nvrtcCompileProgram(Program* p, int n, const char* const* options) {
    int arch = compute_capability();
    for (int i = 0; i < n; i++) {
        const char* o = options[i];
        if (!strncmp(o, "--gpu-architecture=sm_", 22)) arch = atoi(o + 22);
    }
    char dir[] = "/tmp/cuda-cpu-nvrtc-XXXXXX";
    if (!mkdtemp(dir)) return 6;
    const std::string d = dir, cu = d + "/kernels.cpp", pre = d + "/kernels.ii", so = d + "/kernels.so",
                      log = d + "/log.txt";
    const char* cxx_env = getenv("CXX");
    const std::string cxx = std::string(cxx_env && *cxx_env ? cxx_env : "g++") +
                            " -std=c++17 -w -D__CUDA_ARCH__=" + std::to_string(arch * 10) +
                            " -include '" CUDA_CPU_DIR "/cuda_cpu.h'";
    auto write = [](const std::string& path, const std::string& text) {
        FILE* f = fopen(path.c_str(), "w");
        if (!f) return false;
        const bool ok = fwrite(text.data(), 1, text.size(), f) == text.size();
        return fclose(f) == 0 && ok;
    };
    p->log.clear();
    p->ptx.clear();
    p->binary.clear();
    std::string cmd = cxx + " -E -P -DFP4FORGE_CPU_EMU_SCAN -x c++ -o " + pre + " " + cu;
    int status = write(cu, p->source) ? run_command(cmd, log, p->log) : -1;
    if (status == 0) {
        const std::string text = read_file(pre);
        std::string src = p->source + "\n// cuda-cpu: the kernels' launch entries\n";
        const std::regex kernel(R"(FP4FORGE_CPU_EMU_KERNEL\s+void\s+(\w+)\s*\()");
        for (auto it = std::sregex_iterator(text.begin(), text.end(), kernel); it != std::sregex_iterator(); ++it) {
            const std::string name = (*it)[1];
            src += "extern \"C\" __attribute__((visibility(\"default\"))) void emu_entry_" + name +
                   "(void** p) { emu::invoke(" + name + ", p); }\n";
            p->ptx += ".entry " + name + "\n";
        }
        cmd = cxx + " -shared -fPIC " + kernel_flags() + " -x c++ -o " + so + " " + cu;
        status = write(cu, src) ? run_command(cmd, log, p->log) : -1;
        if (status == 0) {
            const std::string bin = read_file(so);
            p->binary.assign(bin.begin(), bin.end());
        }
    }
    for (const std::string& f : {cu, pre, so, log}) unlink(f.c_str());
    rmdir(dir);
    if (status != 0 || p->binary.empty()) {
        p->log = "cuda-cpu: `" + cmd + "` failed:\n" + p->log;
        return 6;  // NVRTC_ERROR_COMPILATION
    }
    return 0;
}
API int nvrtcGetProgramLogSize(Program* p, size_t* n) {
    *n = p->log.size() + 1;
    return 0;
}
API int nvrtcGetProgramLog(Program* p, char* out) {
    memcpy(out, p->log.c_str(), p->log.size() + 1);
    return 0;
}
API int nvrtcGetPTXSize(Program* p, size_t* n) {
    *n = p->ptx.size() + 1;
    return 0;
}
API int nvrtcGetPTX(Program* p, char* out) {
    memcpy(out, p->ptx.c_str(), p->ptx.size() + 1);
    return 0;
}
API int nvrtcGetCUBINSize(Program* p, size_t* n) {
    *n = p->binary.size();
    return 0;
}
API int nvrtcGetCUBIN(Program* p, char* out) {
    memcpy(out, p->binary.data(), p->binary.size());
    return 0;
}
