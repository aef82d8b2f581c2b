#!/usr/bin/env bash
# Fetches NVIDIA's NVRTC library (the runtime CUDA C++ compiler, no driver needed) from PyPI, pinned
# by version and sha256, into target/nvrtc; prints the directory holding libnvrtc.so.13. CI uses
# it to compile the CUDA kernels without a GPU (crates/engine/tests/nvrtc.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
version=13.5.37
wheel=nvidia_cuda_nvrtc-$version-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl
sha=86b4d68058807988b7d9af5b44917a0601e9c337f35ccd657bfb3c759ff8d8bc
dir=target/nvrtc
lib=$dir/nvidia/cu13/lib
if [ ! -f "$lib/libnvrtc.so.13" ]; then
    mkdir -p "$dir"
    if [ ! -f "$dir/$wheel" ]; then
        python3 -m pip download --quiet --no-deps --disable-pip-version-check --dest "$dir" \
            "nvidia-cuda-nvrtc==$version" >&2
    fi
    echo "$sha  $dir/$wheel" | sha256sum --check --quiet - >&2 || {
        echo "fetch-nvrtc: $dir/$wheel does not match the pinned sha256" >&2
        exit 1
    }
    python3 -m zipfile -e "$dir/$wheel" "$dir" >&2
fi
[ -f "$lib/libnvrtc.so.13" ] || { echo "fetch-nvrtc: no libnvrtc.so.13 in $lib" >&2; exit 1; }
echo "$PWD/$lib"
