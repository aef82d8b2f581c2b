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
# only). Environment: DEADLINE (seconds after the start by which everything has stopped, default
# 545: a call has 600, transfers included), TESTS_LIMIT (seconds for the tests, default 270),
# ROUNDS (default 1), NCU (default 0), XS, DECODE_BATCHES and NCU_BATCHES as scripts/gpu-ab.sh
# reads them.
# Results: OUTDIR/summary.txt (each step's exit status and time, the tests' result lines, the
# A/B table), OUTDIR/tests.log, OUTDIR/xs.log, OUTDIR/ab/ab.txt. Exit status 1 when a test
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
if [ "$left" -lt 60 ]; then
    say "no A/B: $left s left before DEADLINE=$deadline"
    exit 1
fi
ROUNDS=${ROUNDS:-1} NCU=${NCU:-0} timeout "$left" scripts/gpu-ab.sh run "$out/ab" "${variants[@]}" > "$out/ab.log" 2>&1
rc=$?
say "A/B: exit status $rc at $SECONDS s$([ $rc = 124 ] && echo " (past DEADLINE=$deadline s: the rows so far)")"
[ $rc = 0 ] || status=1
[ ! -f "$out/ab/ab.txt" ] || tee -a "$summary" < "$out/ab/ab.txt"
exit $status
