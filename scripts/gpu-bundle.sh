#!/usr/bin/env bash
# The GPU machine has no Rust toolchain and a call carries at most 64 MiB: build every binary the
# GPU scripts run here, pack them into one compressed file that a call carries, unpack it there.
#
#   scripts/gpu-bundle.sh pack     # here: scripts/gpu-tests.sh build + scripts/gpu-ab.sh build,
#                                  # then target/dev/gpu-bundle.tar.xz (the size is printed; an
#                                  # error past 60 MiB, leaving room for other carried files),
#                                  # with any target/gpu-ab-* folders (e.g. main's prefill_speed
#                                  # and batch_decode_speed, for scripts/gpu-ab.sh's
#                                  # FP4FORGE_AB_BIN)
#   scripts/gpu-bundle.sh unpack   # there, from the repo root: target/gpu/ and target/gpu-ab/
#
# Carry `target/dev` with the call (`carry: ["target/dev"]`), then e.g.
#   scripts/gpu-bundle.sh unpack && scripts/gpu-tests.sh run OUT
#   scripts/gpu-bundle.sh unpack && scripts/gpu-ab.sh run OUT builtin FP4FORGE_CUDA_H16_GEMM=0
set -euo pipefail
cd "$(dirname "$0")/.."
bundle=target/dev/gpu-bundle.tar.xz
limit=$((60 * 1024 * 1024))
case ${1:-} in
    pack)
        scripts/gpu-tests.sh build
        scripts/gpu-ab.sh build
        mkdir -p target/dev
        # shellcheck disable=SC2046
        tar -cf - --exclude target/gpu/out target/gpu target/gpu-ab $(ls -d target/gpu-ab-* 2>/dev/null) \
            | xz -T0 -6 > "$bundle.part"
        mv "$bundle.part" "$bundle"
        size=$(stat -c %s "$bundle")
        echo "$bundle: $((size / 1024 / 1024)) MiB ($size bytes)"
        if [ "$size" -gt "$limit" ]; then
            echo "$bundle is over 60 MiB: a call carries 64 MiB in all" >&2
            exit 1
        fi
        ;;
    unpack)
        [ -f "$bundle" ] || { echo "$bundle not found: carry target/dev with the call" >&2; exit 1; }
        xz -dc "$bundle" | tar -xf -
        ls -la target/gpu target/gpu-ab*
        ;;
    *)
        echo "usage: $0 pack | unpack" >&2
        exit 2
        ;;
esac
