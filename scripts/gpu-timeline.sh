#!/usr/bin/env bash
# Where a batched decode step leaves the GPU idle: Nsight Systems traces the production step
# (`batch_decode_speed`, the server's `Model::forward_batch_sampled`) and this prints, per batch
# size, the steps' wall time, the time some kernel was running (the union of the kernels'
# intervals: PDL overlap counted once), the idle rest, and the longest gaps. The question it
# answers: would CUDA graphs (fewer host launches, no launch gaps) pay for a step of this size?
#
#   scripts/gpu-timeline.sh OUTDIR XS [BATCHES...]   # on the GPU machine, from the repo root,
#                                                    # after scripts/gpu-bundle.sh unpack
#
# Environment: STEPS (traced steps a batch, default 16: the first STEPS timed steps, after the
# benchmark's warm-up, inside the profiler's capture range), DECODE_ARGS (more flags of
# batch_decode_speed, default "--prompt 128 --top-k 20": the serve's contexts and sampler).
# Results: OUTDIR/timeline.txt (the table), OUTDIR/kernels.csv (nsys's cuda_gpu_trace).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: $0 OUTDIR XS [BATCHES...]}
xs=${2:?usage: $0 OUTDIR XS [BATCHES...]}
shift 2
batches=("$@")
[ ${#batches[@]} -gt 0 ] || batches=(1 4 32)
steps=${STEPS:-16}
mkdir -p "$out"
nsys=$(command -v nsys || ls /usr/local/cuda/bin/nsys /usr/local/cuda-*/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys \
    2> /dev/null | head -1 || true)
[ -n "$nsys" ] || { echo "no nsys on this machine" | tee "$out/timeline.txt"; exit 1; }
source scripts/cuda-env.sh
# One process per batch size: the capture range then holds exactly that batch's steps.
for b in "${batches[@]}"; do
    # shellcheck disable=SC2086
    "$nsys" profile --capture-range=cudaProfilerApi --capture-range-end=stop --trace=cuda --sample=none \
        --cpuctxsw=none --force-overwrite=true -o "$out/b$b" \
        target/gpu-ab/batch_decode_speed "$xs" --device cuda ${DECODE_ARGS:---prompt 128 --top-k 20} \
        --profile "$steps" "$steps" "$b" > "$out/b$b.log" 2>&1
    "$nsys" stats --report cuda_gpu_trace --format csv --output "$out/b$b" "$out/b$b.nsys-rep" > /dev/null 2>&1
done
python3 - "$out" "$steps" "${batches[@]}" << 'PY' | tee "$out/timeline.txt"
import csv, glob, sys
out, steps, batches = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
print(f"{'rows':>4} {'steps':>5} {'wall ms/step':>12} {'busy ms/step':>12} {'idle %':>7} "
      f"{'kernels/step':>12} {'gaps > 5 us/step':>16} {'longest gaps (us)':>24}")
for b in batches:
    files = glob.glob(f"{out}/b{b}_cuda_gpu_trace.csv")
    if not files:
        print(f"{b:>4} (no trace: see {out}/b{b}.log)")
        continue
    # Every row is GPU work of the step: kernels and the step's copies (positions, block
    # tables in; sampled tokens out), which the next kernel waits for as well.
    spans, kernels = [], 0
    with open(files[0]) as f:
        for r in csv.DictReader(f):
            start, dur = float(r["Start (ns)"]), float(r["Duration (ns)"])
            spans.append((start, start + dur))
            kernels += not r.get("Name", "").startswith("[CUDA")
    if not spans:
        print(f"{b:>4} (no kernels in the capture)")
        continue
    spans.sort()
    busy, gaps, end = 0.0, [], spans[0][0]
    for s, e in spans:
        if s > end:
            gaps.append(s - end)
        if e > end:
            busy += e - max(s, end)
            end = e
    wall = end - spans[0][0]
    n = steps
    longest = sorted(gaps, reverse=True)[:3]
    print(f"{b:>4} {n:>5} {wall / n / 1e6:>12.3f} {busy / n / 1e6:>12.3f} {100 * (1 - busy / wall):>7.1f} "
          f"{kernels / n:>12.1f} {sum(g > 5e3 for g in gaps) / n:>16.1f} "
          f"{' '.join(f'{g / 1e3:.0f}' for g in longest):>24}")
PY
