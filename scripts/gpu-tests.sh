#!/usr/bin/env bash
# GPU tests and the decode benchmark of the CUDA backend (feature `cuda`).
#
# The GPU machine needs no Rust toolchain: build here (no CUDA needed: the driver and NVRTC are
# loaded at run time), then run the carried binaries there.
#
#   scripts/gpu-tests.sh build          # here: test binary + benchmark (crates/lab) -> target/gpu/
#                                       # (stripped)
#   scripts/gpu-tests.sh run [OUTDIR]   # on the GPU machine, from the repo root
#   scripts/gpu-tests.sh bench [OUTDIR] # on the GPU machine: only the decode benchmark
#   scripts/gpu-tests.sh suite [OUTDIR] # on the GPU machine: only the engine's GPU tests
#                                       # (crates/engine/tests/cuda.rs; scripts/gpu-call.sh's;
#                                       # TESTS="a b": only those matching a or b)
#   scripts/gpu-tests.sh probe [OUTDIR] # on the GPU machine: the decode-stream probe (bounds per
#                                       # kernel organisation), then the decode benchmark
#
# `run` executes the `#[ignore]`d GPU tests of crates/engine/tests/cuda.rs (kernels vs f64
# matmul; NVFP4 experts vs the CPU backend; decode/prefill attention vs the CPU backend on bf16 and
# fp8 caches at d 64/128 (GQA, sliding and full), the prefill attention on tensor cores vs the CPU
# backend and vs the CUDA-core kernels; tiny Laguna bf16/stock/lean logits vs the CPU
# backend and transformers; 256 greedy tokens GPU vs CPU; the model path's fused decode step
# (fused epilogues, persistent MoE) vs the generic ops and the CPU on synthetic Laguna
# checkpoints; device sampling vs the host sampler; SmolLM2 if assets/smollm2-* are present), the
# server's batching, prefix-cache, API and request-field tests
# (crates/server/tests/{batching,prefix_cache,api,request_fields}.rs) with FP4FORGE_TEST_DEVICE=cuda, and then the Laguna-S decode benchmark of crates/lab (a real
# Decoder with synthetic weights, the production step; table on stdout, JSON in
# OUTDIR/bench.json). With compute-sanitizer on the
# machine, the NVFP4 experts test also runs under racecheck and memcheck.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-run}
out=${2:-target/gpu/out}

if [ "$mode" = build ]; then
    cargo test --release --features cuda -p fp4forge-engine --test cuda --no-run
    cargo test --release --features cuda -p fp4forge-server --test batching --test prefix_cache \
        --test api --test request_fields --no-run
    cargo build --release --features cuda -p fp4forge-lab --bin cuda_decode_bench
    mkdir -p target/gpu
    bin=$(ls -t target/release/deps/cuda-* | grep -v '\.d$' | head -1)
    objcopy --strip-debug "$bin" target/gpu/cuda-tests
    for t in batching prefix_cache api request_fields; do
        bin=$(ls -t target/release/deps/"$t"-* | grep -v '\.d$' | head -1)
        objcopy --strip-debug "$bin" "target/gpu/server-${t//_/-}"
    done
    objcopy --strip-debug target/release/cuda_decode_bench target/gpu/cuda_decode_bench
    ls -la target/gpu
    exit 0
fi

# NVRTC and the driver are found through the loader's path.
source scripts/cuda-env.sh
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$out/gpu.txt" || true
export FP4FORGE_ENGINE_DIR="$PWD/crates/engine"
status=0
if [ "$mode" = suite ]; then
    # (TESTS: names or parts of names of the tests to run, space-separated; default all)
    # shellcheck disable=SC2086
    target/gpu/cuda-tests --ignored --test-threads 1 --nocapture ${TESTS:-} > "$out/tests.log" 2>&1 || status=1
    grep -E '^test result|FAILED|panicked' "$out/tests.log" || true
    exit $status
fi
if [ "$mode" = run ]; then
    target/gpu/cuda-tests --ignored --test-threads 1 --nocapture 2>&1 | tee "$out/tests.log" || status=1
    # The server's continuous-batching tests with the engine on the GPU (16 clients at once get
    # their single-client greedy answers, cancellation, 429, draining).
    FP4FORGE_TEST_DEVICE=cuda target/gpu/server-batching --test-threads 1 2>&1 |
        tee "$out/server-batching.log" || status=1
    # Prefix caching on the GPU: requests that reuse cached KV blocks answer what a server
    # without the cache answers, prompt logprobs and their top tokens included.
    FP4FORGE_TEST_DEVICE=cuda target/gpu/server-prefix-cache --test-threads 1 2>&1 |
        tee "$out/server-prefix-cache.log" || status=1
    # The OpenAI API and every request field (logprobs, sampling, stops, tools) with the engine
    # on the GPU.
    for t in api request-fields; do
        FP4FORGE_TEST_DEVICE=cuda "target/gpu/server-$t" --test-threads 1 2>&1 |
            tee "$out/server-$t.log" || status=1
    done
    # The persistent MoE kernels (shared-memory staging, several groups per block), the grouped
    # experts and the prompts' GEMM on gemm_h16's core and the prefill attention on tensor cores
    # (cp.async tiles) under compute-sanitizer's race and memory checkers, where the machine has
    # it.
    sanitizer=$(ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer 2>/dev/null | head -1 || true)
    if [ -n "$sanitizer" ]; then
        for tool in racecheck memcheck; do
            "$sanitizer" --tool "$tool" --error-exitcode 1 --print-limit 10 \
                target/gpu/cuda-tests --ignored --test-threads 1 gpu_nvfp4_experts \
                gpu_flash_attention_matches_the_cuda_core_kernel gpu_elementwise_ops 2>&1 |
                tee "$out/sanitizer-$tool.log" | tail -n 3 || status=1
        done
    else
        echo "compute-sanitizer not found: race/memory checks skipped"
    fi
fi
if [ "$mode" = probe ]; then
    # Its own process: a fault in the probe's kernels must not cost the benchmark's figures.
    target/gpu/cuda_decode_bench --probe-only \
        --stock crates/builder/tests/fixtures/laguna-s-2.1/config.json \
        --lean crates/builder/tests/fixtures/laguna-s-2.1-lean/config.json \
        --contexts 2048,16384,65536 --reps 30 --json "$out/probe.json" 2>&1 | tee "$out/probe.log" ||
        { rc=${PIPESTATUS[0]}; echo "stream probe failed: exit status $rc" | tee -a "$out/probe.log"; status=1; }
fi
target/gpu/cuda_decode_bench \
    --stock crates/builder/tests/fixtures/laguna-s-2.1/config.json \
    --lean crates/builder/tests/fixtures/laguna-s-2.1-lean/config.json \
    --contexts 2048,16384,65536 --reps 50 --json "$out/bench.json" 2>&1 | tee "$out/bench.log" || status=1
exit $status
