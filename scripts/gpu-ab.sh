#!/usr/bin/env bash
# A/B of CUDA kernel variants on lean Laguna-XS-2.1 in one go (issue 20's tuning loop): the
# production prefill (`Session::prefill`, crates/lab's `prefill_speed`) of PREFILL_LENS tokens
# and batched decode steps (`Model::forward_batch_sampled`, the server's call:
# `batch_decode_speed`, 64 steps) of DECODE_BATCHES sequences, each variant in turn for ROUNDS
# rounds, then where the machine has Nsight Compute the kernels of one prefill of the first
# variant summed per kernel.
#
#   scripts/gpu-ab.sh build                      # here: binaries -> target/gpu-ab/
#   scripts/gpu-ab.sh run OUTDIR [VARIANT ...]   # on the GPU machine, from the repo root
#   scripts/gpu-ab.sh xs                         # there: only write the lean XS checkpoint
#
# A variant is `builtin` (the kernels built into the binary), a `.cu` file (compiled instead of
# them through FP4FORGE_CUDA_KERNELS: kernels/*.cu concatenated in KERNELS_CU's order with a
# newline between them, e.g. an edited copy) or NAME=VALUE settings joined by `,` (backend knobs,
# e.g. FP4FORGE_CUDA_H16_GEMM=0; FP4FORGE_AB_BIN=DIR runs DIR's binaries instead of
# target/gpu-ab's), optionally after `prefill:` or `decode:` to time only the prefills or only the
# decode steps (a knob that changes one of them: each process loads the model, ~15 s, and a call
# has 10 minutes). Default: `builtin FP4FORGE_CUDA_H16_GEMM=0`.
# Environment: PREFILL_LENS (the prefills' prompt lengths, default "2048 16384"; empty: no
# prefills), NCU_PREFILL_LEN (the prompt length of the per-kernel prefill table, default 2048), XS (default /dev/shm/xs-lean: written by `synth --preset xs --stock-nvfp4` +
# `quantize` when missing, ~80 s, 21.7 + 20 GB), ROUNDS (2), DECODE_BATCHES (default "1 4 32";
# empty: no decode steps), DECODE_ARGS (more flags of every batch_decode_speed run, e.g. "--prompt
# 128 --top-k 20": the serve's contexts and sampler; default none), NCU (default 1; 0: no per-kernel times), FP4FORGE_KERNEL_CACHE
# (default /dev/shm/fp4forge-kernels: each variant compiles once, ~80 s), NCU_BATCHES (e.g. "1 4":
# also each listed batch's decode step per kernel under ncu, first variant: the NCU_STEPS
# (default 2) steps after a warm-up that `batch_decode_speed --profile` runs inside the profiler's
# capture range, averaged, ncu started with `--profile-from-start off` so that nothing else (the
# prompts' prefills, the warm-up) is profiled; default none), NCU_PREFILL (default 1; 0: no
# per-kernel table of the prefill, e.g. for a decode-only call), NCU_DETAIL (kernel names, e.g.
# "experts_gate_up2 gemv_mt_nv4": for each NCU_BATCHES batch, each named kernel's launches of one
# captured decode step under ncu's sections SpeedOfLight, Occupancy,
# LaunchStats, MemoryWorkloadAnalysis and WarpStateStats, ~30 s a kernel; the key lines in
# ab.txt, ncu's whole output in OUTDIR/ncu-bB-KERNEL.txt). Results: OUTDIR/ab.txt (each round's
# times, then each variant's mean and its ratio to the first variant's).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
bin=target/gpu-ab
if [ "$mode" = build ]; then
    cargo build --release --features cuda -p fp4forge
    cargo build --release --features cuda -p fp4forge-lab --example prefill_speed --example batch_decode_speed
    mkdir -p "$bin"
    objcopy --strip-debug target/release/fp4forge "$bin/fp4forge"
    for e in prefill_speed batch_decode_speed; do
        objcopy --strip-debug "target/release/examples/$e" "$bin/$e"
    done
    ls -la "$bin"
    exit 0
fi
xs=${XS:-/dev/shm/xs-lean}
# Lean XS into $xs unless it is there: the stock checkpoint written and quantized beside it, then
# renamed into place, so a directory at $xs is always complete.
write_xs() {
    [ -d "$xs" ] && return 0
    echo "writing lean XS into $xs"
    rm -rf "$xs.stock" "$xs.part"
    "$bin/fp4forge" synth --preset xs --stock-nvfp4 "$xs.stock" > /dev/null
    "$bin/fp4forge" quantize "$xs.stock" "$xs.part" > /dev/null
    rm -rf "$xs.stock"
    mv "$xs.part" "$xs"
}
if [ "$mode" = xs ]; then
    write_xs
    exit 0
fi
[ "$mode" = run ] || { echo "usage: $0 build | run OUTDIR [VARIANT ...] | xs" >&2; exit 2; }
out=${2:?usage: $0 run OUTDIR [VARIANT ...]}
shift 2
variants=("$@")
[ ${#variants[@]} -gt 0 ] || variants=(builtin FP4FORGE_CUDA_H16_GEMM=0)
# Variant $1 without its scope (`prefill:` / `decode:`).
body() { case $1 in prefill:* | decode:*) echo "${1#*:}" ;; *) echo "$1" ;; esac; }
# Variant $1 as the table names it: its scope, if any, and the file name of a .cu file.
label() { case $1 in prefill:* | decode:*) echo "${1%%:*}:$(basename "${1#*:}")" ;; *) basename "$1" ;; esac; }
# Whether variant $1 times measurement $2 (prefill or decode).
measures() { case $1 in prefill:*) [ "$2" = prefill ] ;; decode:*) [ "$2" = decode ] ;; *) true ;; esac; }
for v in "${variants[@]}"; do
    b=$(body "$v")
    case $b in builtin | *.cu | *=*) ;; *) echo "variant $v: not builtin, a .cu file or NAME=VALUE (after prefill: or decode:)" >&2; exit 2 ;; esac
    if [[ $b == *.cu && ! -f $b ]]; then echo "variant $v: no such file" >&2; exit 2; fi
done
source scripts/cuda-env.sh
export FP4FORGE_KERNEL_CACHE=${FP4FORGE_KERNEL_CACHE:-/dev/shm/fp4forge-kernels}
rounds=${ROUNDS:-2}
read -r -a batches <<< "${DECODE_BATCHES-1 4 32}"
read -r -a lens <<< "${PREFILL_LENS-2048 16384}"
mkdir -p "$out" "$FP4FORGE_KERNEL_CACHE"
report=$out/ab.txt
: > "$report"
rm -f "$out/failed.log"
say() { echo "$*" | tee -a "$report"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader 2>&1 | tee -a "$report" || true
write_xs | tee -a "$report"
# The environment of variant $1, as NAME=VALUE words.
settings() {
    local b
    b=$(body "$1")
    case $b in
        builtin) ;;
        *.cu) echo "FP4FORGE_CUDA_KERNELS=$(realpath "$b")" ;;
        *) echo "${b//,/ }" ;;
    esac
}
# The directory of variant $1's prefill_speed and batch_decode_speed: the value of its
# FP4FORGE_AB_BIN setting (e.g. main's binaries, packed beside this branch's, to time both in one
# call), else target/gpu-ab.
bin_of() {
    local d
    d=$(settings "$1" | tr ' ' '\n' | sed -n 's/^FP4FORGE_AB_BIN=//p')
    echo "${d:-$bin}"
}
# The medians of variant $1's prefills of PREFILL_LENS tokens in milliseconds (one prefill_speed
# run, 3 repetitions each), space-separated: "-" each where the variant times decode steps only,
# "failed" each where the run failed (its output then in OUTDIR/failed.log).
prefill_ms() {
    local log m
    [ ${#lens[@]} -gt 0 ] || return 0
    measures "$1" prefill || { printf -- '- %.0s' "${lens[@]}"; return 0; }
    # shellcheck disable=SC2046
    if ! log=$(env $(settings "$1") "$(bin_of "$1")/prefill_speed" "$xs" --device cuda "$(IFS=,; echo "${lens[*]}")" 3 2>&1); then
        echo "== $1 prefill: $log" >> "$out/failed.log"
        printf 'failed %.0s' "${lens[@]}"
        return 0
    fi
    for n in "${lens[@]}"; do
        m=$(echo "$log" | sed -n "s/^prefill $n tokens: median \([0-9.]*\) ms.*/\1/p")
        [ -n "$m" ] || echo "== $1 prefill $n (no median line): $log" >> "$out/failed.log"
        printf '%s ' "${m:-failed}"
    done
}
# ms per batched decode step of variant $1 for each of DECODE_BATCHES, space-separated ("failed"
# each where the run failed: its output then in OUTDIR/failed.log).
step_ms() {
    local log
    [ ${#batches[@]} -gt 0 ] || return 0
    measures "$1" decode || { printf -- '- %.0s' "${batches[@]}"; return 0; }
    # shellcheck disable=SC2046,SC2086
    if ! log=$(env $(settings "$1") "$(bin_of "$1")/batch_decode_speed" "$xs" --device cuda ${DECODE_ARGS:-} 64 "${batches[@]}" 2>&1); then
        echo "== $1 decode: $log" >> "$out/failed.log"
        printf 'failed %.0s' "${batches[@]}"
        return 0
    fi
    for b in "${batches[@]}"; do
        echo "$log" | awk -v b="$b" '$1 == b && NF == 3 { printf "%s ", $2 }'
    done
}
header=$(printf '%-44s %5s' variant round)
for n in "${lens[@]}"; do header+=$(printf ' %12s' "$n ms"); done
for b in "${batches[@]}"; do header+=$(printf ' %10s' "B=$b ms"); done
say "$header"
for round in $(seq 1 "$rounds"); do
    for v in "${variants[@]}"; do
        line=$(printf '%-44s %5s' "$(label "$v")" "$round")
        for s in $(prefill_ms "$v"); do line+=$(printf ' %12s' "$s"); done
        for s in $(step_ms "$v"); do line+=$(printf ' %10s' "$s"); done
        say "$line"
    done
done
# Each variant's mean over the rounds, and its ratio to the first variant's (the reference, e.g.
# builtin): < 1 is faster.
if python3 - "$report" <<'PY' | tee -a "$report"
import collections, sys
lines = open(sys.argv[1]).read().splitlines()
start = next(i for i, l in enumerate(lines) if l.startswith("variant "))
cols = lines[start].split()[2:]
cols = [" ".join(cols[i:i + 2]) for i in range(0, len(cols), 2)]  # "2048 ms", "B=1 ms", ...
sums, order = collections.defaultdict(lambda: collections.defaultdict(list)), []
for l in lines[start + 1:]:
    f = l.split()
    if len(f) != 2 + len(cols):
        continue
    name = f[0]
    if name not in order:
        order.append(name)
    for c, v in zip(cols, f[2:]):
        try:
            sums[name][c].append(float(v))
        except ValueError:
            pass
mean = lambda xs: sum(xs) / len(xs) if xs else None
ref = order[0] if order else None
print(f"mean over rounds, and / {ref}:")
print(f"{'variant':<44}" + "".join(f" {c:>18}" for c in cols))
for name in order:
    cells = []
    for c in cols:
        m, r = mean(sums[name][c]), mean(sums[ref][c])
        cells.append("-" if m is None else f"{m:.2f}" + (f" ({m / r:.3f})" if r else ""))
    print(f"{name:<44}" + "".join(f" {x:>18}" for x in cells))
PY
then :; else say "(no summary: the table above could not be read)"; fi
[ "${NCU:-1}" != 0 ] || exit 0
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /usr/local/cuda-*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || true)
if [ -z "$ncu" ]; then
    say "Nsight Compute not found: no per-kernel times"
    exit 0
fi
# Per-kernel times of an ncu CSV (gpu__time_duration.sum): `ncu_table CSV all` sums every launch
# in milliseconds; `ncu_table CSV steps N` averages N captured decode steps in microseconds (every
# launch in the CSV belongs to one of them); `ncu_table CSV launches KERNEL N` prints KERNEL's
# launches per captured step.
ncu_table() {
    python3 - "$@" <<'PY'
import collections, csv, sys
rows, header = [], None
for row in csv.reader(open(sys.argv[1])):
    if "Kernel Name" in row and "Metric Value" in row:
        header = row
        continue
    if header is None or len(row) != len(header):
        continue
    d = dict(zip(header, row))
    if d.get("Metric Name") != "gpu__time_duration.sum":
        continue
    try:
        rows.append((int(d["ID"]), d["Kernel Name"].split("(")[0], float(d["Metric Value"].replace(",", ""))))
    except ValueError:
        continue
rows.sort()
if sys.argv[2] == "launches":
    n = sum(1 for r in rows if r[1] == sys.argv[3])
    print(n // int(sys.argv[4]))
    sys.exit(0)
if sys.argv[2] == "steps":
    per, unit, scale = int(sys.argv[3]), "us/step", 1e3
    if sum(1 for r in rows if r[1] == "sample_logits") != per:
        sys.exit(f"not {per} sampling launches: the capture is not {per} whole steps")
else:
    per, unit, scale = 1, "ms", 1e6
total, count = collections.Counter(), collections.Counter()
for _, name, ns in rows:
    total[name] += ns
    count[name] += 1
print(f"{'kernel':<32} {unit:>9} {'launches':>9}")
for name, ns in total.most_common(30):
    print(f"{name:<32} {ns / scale / per:>9.2f} {count[name] / per:>9.1f}")
print(f"{'total':<32} {sum(total.values()) / scale / per:>9.2f} {sum(count.values()) / per:>9.1f}")
PY
}
if [ "${NCU_PREFILL:-1}" != 0 ]; then
    # shellcheck disable=SC2046
    env $(settings "${variants[0]}") "$ncu" --cache-control none --clock-control none \
        --metrics gpu__time_duration.sum --csv "$(bin_of "${variants[0]}")/prefill_speed" "$xs" --device cuda "${NCU_PREFILL_LEN:-2048}" 1 \
        > "$out/ncu.csv" 2> "$out/ncu.log" || true
    say "kernels of $(basename "${variants[0]}") (ncu: warm-up + one ${NCU_PREFILL_LEN:-2048}-token prefill, summed per kernel)"
    ncu_table "$out/ncu.csv" all | tee -a "$report" || say "(no table: see $out/ncu.log)"
fi
# Decode steps per kernel (NCU_BATCHES).
# Only the steps that batch_decode_speed runs inside the profiler's capture range are profiled.
steps=${NCU_STEPS:-2}
for b in ${NCU_BATCHES:-}; do
    # shellcheck disable=SC2046,SC2086
    env $(settings "${variants[0]}") "$ncu" --cache-control none --clock-control none --profile-from-start off \
        --metrics gpu__time_duration.sum --csv "$(bin_of "${variants[0]}")/batch_decode_speed" "$xs" --device cuda \
        ${DECODE_ARGS:-} --profile "$steps" "$steps" "$b" > "$out/ncu-b$b.csv" 2> "$out/ncu-b$b.log" || true
    say "kernels of $(basename "${variants[0]}") (ncu: a decode step of $b rows, mean of $steps, kernels alone and serialized)"
    ncu_table "$out/ncu-b$b.csv" steps "$steps" | tee -a "$report" || say "(no table: see $out/ncu-b$b.log)"
    # NCU_DETAIL: the named kernels' launches of one captured decode step, in depth.
    for k in ${NCU_DETAIL:-}; do
        count=$(ncu_table "$out/ncu-b$b.csv" launches "$k" "$steps" 2> /dev/null) ||
            { say "NCU_DETAIL $k, $b rows: no table in $out/ncu-b$b.csv"; continue; }
        [ "${count:-0}" -gt 0 ] || { say "NCU_DETAIL $k, $b rows: not launched in a step"; continue; }
        # shellcheck disable=SC2046,SC2086
        env $(settings "${variants[0]}") "$ncu" --cache-control none --clock-control none --profile-from-start off \
            --section SpeedOfLight --section Occupancy --section LaunchStats \
            --section MemoryWorkloadAnalysis --section WarpStateStats \
            --kernel-name "regex:^$k\$" "$(bin_of "${variants[0]}")/batch_decode_speed" "$xs" --device cuda \
            ${DECODE_ARGS:-} --profile 1 1 "$b" > "$out/ncu-b$b-$k.txt" 2>&1 || true
        say "$k, a decode step of $b rows ($count launches, ncu sections; whole output: ncu-b$b-$k.txt)"
        python3 - "$out/ncu-b$b-$k.txt" <<'PY' | tee -a "$report" || true
import collections, re, sys
# ncu's text lines "    Name    unit    value": the mean over the launches of the metrics below.
keep = ("Duration", "DRAM Throughput", "Memory Throughput", "L2 Hit Rate", "L1/TEX Hit Rate",
        "Achieved Occupancy", "Theoretical Occupancy", "Registers Per Thread", "Grid Size",
        "Waves Per SM", "Block Limit Registers", "Block Limit Shared Mem",
        "Warp Cycles Per Issued Instruction", "Dynamic Shared Memory Per Block",
        "Static Shared Memory Per Block")
sums, units, counts = collections.defaultdict(float), {}, collections.Counter()
for line in open(sys.argv[1], errors="replace"):
    parts = re.split(r"\s{2,}", line.strip())
    if len(parts) < 2 or parts[0] not in keep:
        continue
    try:
        value = float(parts[-1].replace(",", ""))
    except ValueError:
        continue
    sums[parts[0]] += value
    units[parts[0]] = parts[1] if len(parts) == 3 else ""
    counts[parts[0]] += 1
for name in keep:
    if counts[name]:
        print(f"  {name:<36} {sums[name] / counts[name]:>12.2f} {units[name]}  (mean of {counts[name]})")
PY
    done
done
