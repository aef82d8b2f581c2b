#!/usr/bin/env bash
# The CUDA backend's GPU tests on the CPU, through tools/cuda-cpu (a CUDA driver and NVRTC that
# compile the kernels with the host C++ compiler and run every CUDA thread as a fiber): the
# kernels' results, their launches and the Rust side that drives them are checked on a machine
# without a GPU. Timing is not (docs/performance.md has the GPU's figures).
#
#   scripts/cuda-cpu.sh lib                 # build target/cuda-cpu/libcuda.so (+ NVRTC's names)
#   scripts/cuda-cpu.sh test [FILTER ...]   # lib, then crates/engine/tests/cuda.rs (the
#                                           # `#[ignore]`d GPU tests, or those matching FILTER)
#   scripts/cuda-cpu.sh server [TEST ...]   # lib, then the server's tests with the engine on
#                                           # the emulated GPU (batching prefix_cache api
#                                           # request_fields unless named)
#
# Needs g++ (CXX), a C++17 standard library and an x86-64 CPU. The compiled kernels are cached
# in target/cuda-cpu/kernels (FP4FORGE_KERNEL_CACHE), so only the first test binary compiles
# them (about a minute). FP4FORGE_CUDA_CPU_CC (default 90) picks the architecture the device
# reports, FP4FORGE_CUDA_CPU_THREADS the OS threads that run blocks (default: every core).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-test}
shift || true
lib=target/cuda-cpu

build_lib() {
    mkdir -p "$lib"
    local src=tools/cuda-cpu
    if [ ! -f "$lib/libcuda.so" ] || [ "$src/driver.cpp" -nt "$lib/libcuda.so" ]; then
        ${CXX:-g++} -std=c++17 -O2 -shared -fPIC -Wall -Werror \
            -DCUDA_CPU_DIR="\"$PWD/$src\"" -o "$lib/libcuda.so.tmp" "$src/driver.cpp"
        mv "$lib/libcuda.so.tmp" "$lib/libcuda.so"
    fi
    # one library answers for the driver and for NVRTC (the names cudarc looks for)
    for name in libcuda.so.1 libnvrtc.so libnvrtc.so.13; do ln -sf libcuda.so "$lib/$name"; done
    mkdir -p "$lib/kernels"
}

# The newest test binary of `name` that cargo built.
test_binary() {
    ls -t target/release/deps/"$1"-* | grep -v '\.d$' | head -1
}

build_lib
export LD_LIBRARY_PATH="$PWD/$lib:${LD_LIBRARY_PATH:-}"
export FP4FORGE_KERNEL_CACHE="${FP4FORGE_KERNEL_CACHE:-$PWD/$lib/kernels}"
export FP4FORGE_ENGINE_DIR="$PWD/crates/engine"
case "$mode" in
lib) ;;
test)
    cargo test --release --features cuda -p fp4forge-engine --test cuda --no-run
    "$(test_binary cuda)" --ignored --test-threads 1 "$@"
    ;;
server)
    tests=("$@")
    [ ${#tests[@]} -gt 0 ] || tests=(batching prefix_cache api request_fields)
    args=()
    for t in "${tests[@]}"; do args+=(--test "$t"); done
    cargo test --release --features cuda -p fp4forge-server "${args[@]}" --no-run
    status=0
    for t in "${tests[@]}"; do
        echo "== server test $t on the emulated GPU"
        FP4FORGE_TEST_DEVICE=cuda "$(test_binary "$t")" --test-threads 1 || status=1
    done
    exit $status
    ;;
*)
    echo "usage: scripts/cuda-cpu.sh lib | test [FILTER ...] | server [TEST ...]" >&2
    exit 2
    ;;
esac
