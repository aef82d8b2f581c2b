#!/usr/bin/env bash
# Where a batched decode step leaves the GPU idle: `batch_decode_speed --timeline N` traces N
# production steps (`Model::forward_batch_sampled`, the server's call) with CUPTI's activity API
# (`fp4forge_lab::timeline`; no Nsight needed) and prints, per batch size, the step's wall time,
# the time some kernel or copy ran (the union of their spans: PDL's overlap counted once), the
# idle time inside the step and at its edges (the host's launch lead, its turnaround after the
# sampled ids come back), the gaps by size, the longest gaps with the kernels around them and the
# kernels by time. Then the same binary times untraced steps (the first line of each block), so
# the trace's own cost shows. The question it answers: what would CUDA graphs (no host launches,
# no launch gaps) buy a step of this size?
#
#   scripts/gpu-timeline.sh OUTDIR XS [BATCHES...]   # on the GPU machine, from the repo root,
#                                                    # after scripts/gpu-bundle.sh unpack
#
# Environment: STEPS (traced steps a batch, default 16), TIMED (untraced steps after them,
# default 32), DECODE_ARGS (more flags of batch_decode_speed, default "--prompt 128 --top-k 20":
# the serve's contexts and sampler). Results: OUTDIR/timeline.txt (every batch's block),
# OUTDIR/bB.log (each run's whole output).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: $0 OUTDIR XS [BATCHES...]}
xs=${2:?usage: $0 OUTDIR XS [BATCHES...]}
shift 2
batches=("$@")
[ ${#batches[@]} -gt 0 ] || batches=(1 4 32)
mkdir -p "$out"
source scripts/cuda-env.sh
# CUPTI's library: the toolkit's, else a Python wheel's; linked as libcupti.so, a name cudarc
# loads, whatever its version suffix.
cupti=$(ls /usr/local/cuda/extras/CUPTI/lib64/libcupti.so* /usr/local/cuda-*/extras/CUPTI/lib64/libcupti.so* \
    2> /dev/null | head -1 || true)
[ -n "$cupti" ] || cupti=$(find / -name 'libcupti.so*' -not -path '/proc/*' 2> /dev/null | head -1 || true)
[ -n "$cupti" ] || { echo "no libcupti.so on this machine" | tee "$out/timeline.txt"; exit 1; }
link=$(mktemp -d)
trap 'rm -rf "$link"' EXIT
ln -s "$(realpath "$cupti")" "$link/libcupti.so"
export LD_LIBRARY_PATH="$link:$(dirname "$(realpath "$cupti")"):${LD_LIBRARY_PATH:-}"
echo "CUPTI: $cupti" | tee "$out/timeline.txt"
status=0
for b in "${batches[@]}"; do
    # shellcheck disable=SC2086
    if target/gpu-ab/batch_decode_speed "$xs" --device cuda ${DECODE_ARGS:---prompt 128 --top-k 20} \
        --timeline "${STEPS:-16}" "${TIMED:-32}" "$b" > "$out/b$b.log" 2>&1; then
        sed -n '/^ *batch /,$p' "$out/b$b.log" | tee -a "$out/timeline.txt"
    else
        status=1
        { echo "batch $b failed:"; tail -n 5 "$out/b$b.log"; } | tee -a "$out/timeline.txt"
    fi
done
exit $status
