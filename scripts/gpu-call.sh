#!/usr/bin/env bash
# One device call that does the most when machines are scarce (a start can be refused or a machine
# taken back, and each start costs minutes of the session's 30): the engine's GPU tests, then an
# A/B of kernel variants in the time left, the lean XS checkpoint written on the CPUs while the
# tests run on the GPU.
#
#   scripts/gpu-bundle.sh pack                       # here
#   scripts/gpu-call.sh OUTDIR [VARIANT ...]         # there, carrying target/dev
#
# e.g. `scripts/gpu-call.sh $OUT builtin prefill:FP4FORGE_CUDA_H16_GEMM=0
# decode:FP4FORGE_CUDA_MT_B1=1` (variants as scripts/gpu-ab.sh takes them; default: builtin
# only; `none`: no A/B, e.g. for the tests and SERVE alone). Environment: DEADLINE (seconds after the start by which everything has stopped, default
# 545: a call has 600, transfers included), TESTS_LIMIT (seconds for the tests, default 270),
# ROUNDS (default 1), NCU (default 0), XS, DECODE_BATCHES, NCU_BATCHES, NCU_DETAIL and NCU_PREFILL as
# scripts/gpu-ab.sh reads them, TESTS as scripts/gpu-tests.sh's suite reads it (only the tests
# it names), SERVE (default none: configurations for `fp4forge serve` + `fp4forge bench` after
# the A/B, each `default` or NAME=VALUE settings joined by `,`, in turn through
# benches/gpu_vs_llamacpp.sh without llama.cpp on the A/B's lean XS: 2,048-token prefill,
# decode at 128 and 2,048 context, 1 / 4 / 16 / 32 streams, two repetitions; SERVE_PROMPTS:
# the prefills' prompt lengths instead, e.g. "2048 16384"; SERVE_LIMIT seconds each, default 130; TOOLS: word_tokenizer.py's folder, default ../shared/tools).
# Results: OUTDIR/summary.txt (each step's exit status and time, the tests' result lines, the
# A/B table, each served configuration's table), OUTDIR/tests.log, OUTDIR/xs.log,
# OUTDIR/ab/ab.txt, OUTDIR/serve-NAME.{md,json,log}, OUTDIR/serve-NAME-metrics.txt (the server's
# /metrics after its runs). Exit status 1 when a test
# failed, a step ran out of time or a script failed (a variant whose run fails is a "failed" cell
# of the A/B table, its output in OUTDIR/ab/failed.log).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: $0 OUTDIR [VARIANT ...]}
shift
variants=("$@")
[ ${#variants[@]} -gt 0 ] || variants=(builtin)
deadline=${DEADLINE:-545}
tests_limit=${TESTS_LIMIT:-270}
mkdir -p "$out"
summary=$out/summary.txt
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }
status=0
scripts/gpu-bundle.sh unpack > "$out/unpack.log" 2>&1 || { say "unpack failed: $(tail -n 3 "$out/unpack.log")"; exit 1; }
# The kernels compiled by the tests are reused by the A/B's processes.
export FP4FORGE_KERNEL_CACHE=${FP4FORGE_KERNEL_CACHE:-/dev/shm/fp4forge-kernels}
mkdir -p "$FP4FORGE_KERNEL_CACHE"
scripts/gpu-ab.sh xs > "$out/xs.log" 2>&1 &
xs_pid=$!
timeout "$tests_limit" scripts/gpu-tests.sh suite "$out" > "$out/suite.log" 2>&1
rc=$?
say "GPU tests: exit status $rc at $SECONDS s$([ $rc = 124 ] && echo " (past TESTS_LIMIT=$tests_limit s)")"
# The GPU's line and the tests' result lines, as `gpu-tests.sh suite` printed them.
head -n 40 "$out/suite.log" | tee -a "$summary"
[ $rc = 0 ] || status=1
if ! wait "$xs_pid"; then
    say "writing lean XS failed at $SECONDS s: $(tail -n 3 "$out/xs.log")"
    exit 1
fi
say "lean XS ready at $SECONDS s"
left=$((deadline - SECONDS))
if [ "${variants[*]}" = none ]; then
    say "no A/B (variants: none)"
elif [ "$left" -lt 60 ]; then
    say "no A/B: $left s left before DEADLINE=$deadline"
    exit 1
else
    ROUNDS=${ROUNDS:-1} NCU=${NCU:-0} timeout "$left" scripts/gpu-ab.sh run "$out/ab" "${variants[@]}" > "$out/ab.log" 2>&1
    rc=$?
    say "A/B: exit status $rc at $SECONDS s$([ $rc = 124 ] && echo " (past DEADLINE=$deadline s: the rows so far)")"
    [ $rc = 0 ] || status=1
    [ ! -f "$out/ab/ab.txt" ] || tee -a "$summary" < "$out/ab/ab.txt"
fi
# SERVE: the production path on the same checkpoint (hard links, or symbolic ones across file
# systems, plus the stand-in tokenizer).
read -r -a serve <<< "${SERVE:-}"
if [ ${#serve[@]} -gt 0 ]; then
    tools=${TOOLS:-../shared/tools}
    work=/dev/shm/gpu-call-bench
    m=$work/models/xs
    if [ ! -f "$m/lean.ok" ]; then
        xs=$(realpath "${XS:-/dev/shm/xs-lean}")
        mkdir -p "$m" && rm -rf "$m/lean" &&
            { cp -al "$xs" "$m/lean" 2> /dev/null || { rm -rf "$m/lean" && cp -as "$xs" "$m/lean"; }; } &&
            rm -f "$m"/lean/tokenizer*.json && python3 "$tools/word_tokenizer.py" 100352 "$m/lean" > /dev/null &&
            touch "$m/lean.ok" || { say "no checkpoint to serve"; exit 1; }
    fi
    for cfg in "${serve[@]}"; do
        left=$((deadline - SECONDS))
        [ "$left" -ge 60 ] || { say "serve $cfg: not run, $left s left before DEADLINE=$deadline"; status=1; continue; }
        limit=${SERVE_LIMIT:-130}
        settings=""
        [ "$cfg" = default ] || settings=${cfg//,/ }
        name=${cfg//FP4FORGE_CUDA_/}
        name=${name//[=,]/-}
        rm -f "$work/report.md" "$work/results.json" "$work/runs/xs/ff-metrics.txt"
        # shellcheck disable=SC2086
        env $settings FP4FORGE_BIN=target/gpu-ab/fp4forge TOOLS="$tools" WORK="$work" SKIP_LLAMA=1 REPS=2 \
            PREFILL_DEPTH=0 PROMPTS="${SERVE_PROMPTS:-2048}" DECODE_DEPTHS=2048 CONCURRENCY="1 4 16 32" \
            timeout $((left < limit ? left : limit)) benches/gpu_vs_llamacpp.sh > "$out/serve-$name.log" 2>&1
        rc=$?
        say "serve $cfg: exit status $rc at $SECONDS s"
        [ $rc = 0 ] || status=1
        cp "$work/report.md" "$out/serve-$name.md" 2>/dev/null && grep -E '^\|' "$out/serve-$name.md" | tee -a "$summary"
        cp "$work/results.json" "$out/serve-$name.json" 2>/dev/null
        cp "$work/runs/xs/ff-metrics.txt" "$out/serve-$name-metrics.txt" 2>/dev/null
    done
fi
exit $status
