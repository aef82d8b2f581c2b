#!/usr/bin/env bash
# Laguna-XS-2.1 geometry end to end from files on a GPU machine: `synth --preset xs --stock-nvfp4`
# (seeded synthetic weights, the real checkpoint's tensor set and byte counts, 21.7 GB), `quantize`
# to the lean build (q/k/v/o NVFP4), `inspect` both (bytes per token), then `fp4forge run
# --device cuda` on each at exact prompt lengths (128 tokens generated; prefill and decode tok/s).
#
# usage: scripts/gpu-xs-e2e.sh [WORKDIR] [CONTEXTS]   (defaults: /tmp/xs, "2048 16384 65536")
#   FP4FORGE_BIN: the binary (default target/release/fp4forge; build it with --features cuda).
#   Needs ~42 GB of disk in WORKDIR and a GPU with ~25 GB free.
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-/tmp/xs}
contexts=${2:-2048 16384 65536}
bin=${FP4FORGE_BIN:-target/release/fp4forge}
# NVRTC and the driver are found through the loader's path.
source scripts/cuda-env.sh
stock=$work/xs-stock
lean=$work/xs-lean
mkdir -p "$work"
[ -d "$stock" ] || "$bin" synth --preset xs --stock-nvfp4 "$stock"
[ -d "$lean" ] || "$bin" quantize "$stock" "$lean"
for m in "$stock" "$lean"; do
    echo "== $(basename "$m"): $("$bin" inspect "$m" --json |
        python3 -c 'import json, sys; print("%.3f GB per token" % (json.load(sys.stdin)["totals"]["bytes_per_token"] / 1e9))')"
done
# A prompt of exactly N token ids (synthetic checkpoints have no tokenizer), passed in pieces.
ids() {
    python3 -c "
import sys; n = int(sys.argv[1])
print(' '.join('--prompt-ids ' + ','.join(str(100 + (j * 7919) % 30000) for j in range(i, min(i + 2000, n)))
               for i in range(0, n, 2000)))" "$1"
}
for ctx in $contexts; do
    for m in "$stock" "$lean"; do
        echo "== $(basename "$m") context $ctx"
        # shellcheck disable=SC2046
        "$bin" run "$m" --device cuda $(ids "$ctx") --max-tokens 128 2>&1 | tail -n 1
    done
done
