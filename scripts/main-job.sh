#!/usr/bin/env bash
# The main job, on a built-in default (no downloads): synthesize a stock-layout Laguna checkpoint
# (routed experts NVFP4 W4A4, everything else bf16), build the lean version (attention q/k/v/o
# NVFP4 too), verify it bit for bit against its source, and show the inspect table before/after;
# then the same before/after arithmetic on the real Laguna-S-2.1 configuration.
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
