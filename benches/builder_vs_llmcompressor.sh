#!/usr/bin/env bash
# fp4forge vs llm-compressor: wall time and peak RSS of NVFP4A16 (weight-only) quantization of the
# same synthetic ~2 GB bf16 Laguna checkpoint, on this machine, in one run; plus a tensor-by-tensor
# comparison of the outputs.
#
#   benches/builder_vs_llmcompressor.sh            # everything, work dir /tmp/fp4forge-bench
#
# Measured (each under /usr/bin/time: elapsed wall clock and maximum resident set size):
#   fp4forge quantize                     recipes all-linear and qkvo (release binary)
#   llmcompressor model_free_ptq          recipes all-linear and qkvo (max_workers=1, CPU)
#   llmcompressor oneshot (data-free)     recipes all-linear and qkvo: from_pretrained(bf16) +
#                                         oneshot(QuantizationModifier(..., "NVFP4A16")) +
#                                         save_pretrained(save_compressed=True)
#   fp4forge quantize, lean build         default targets (attention q/k/v/o) from the stock
#                                         layout (routed experts already NVFP4 W4A4)
# Recipes:
#   all-linear  every Linear except lm_head, routers (re:.*mlp\.gate$), g_proj (re:.*self_attn\.g_proj$)
#   qkvo        re:.*self_attn\.(q|k|v|o)_proj$
#
# Warm cache: before every measured run the source safetensors are read into the page cache
# (`cat > /dev/null`) and dirty pages of the previous run are flushed (`sync`); the output
# directory is removed beforehand. Writes are NOT fsync'ed by any tool: wall times are to the
# page cache. Python times include interpreter start-up and imports (~5 s; part of the tool's cost).
#
# Environment (all optional):
#   WORK=/tmp/fp4forge-bench   work dir (checkpoints, outputs, logs, results.json)
#   CONFIG=benches/laguna-2gb.json   Laguna config.json of the synthetic checkpoint
#   SEED=0                     synth seed
#   MAX_SHARD_SIZE=            bytes per source shard (default: synth's 5 GB = one shard); e.g.
#                              500000000 gives 5 shards (model_free_ptq works shard by shard)
#   FP4FORGE_RUNS=3            measured runs per fp4forge case (median wall reported)
#   LLMC_RUNS=1                measured runs per llm-compressor case
#   MFP_WORKERS=1              model_free_ptq max_workers
#   SKIP_ONESHOT=0             1: skip the (slow) oneshot runs
#   SKIP_BUILD=0               1: use the existing target/release/fp4forge
#   PY=tools/reference/.venv/bin/python
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
WORK="${WORK:-/tmp/fp4forge-bench}"
CONFIG="${CONFIG:-$ROOT/benches/laguna-2gb.json}"
SEED="${SEED:-0}"
MAX_SHARD_SIZE="${MAX_SHARD_SIZE:-}"
FP4FORGE_RUNS="${FP4FORGE_RUNS:-3}"
LLMC_RUNS="${LLMC_RUNS:-1}"
MFP_WORKERS="${MFP_WORKERS:-1}"
SKIP_ONESHOT="${SKIP_ONESHOT:-0}"
SKIP_BUILD="${SKIP_BUILD:-0}"
PY="${PY:-$ROOT/tools/reference/.venv/bin/python}"
RUNNER="$ROOT/benches/llmcompressor_runner.py"
FF="$ROOT/target/release/fp4forge"
TIME=/usr/bin/time

log() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

if [[ ! -x $TIME ]]; then
  log "/usr/bin/time missing; installing Debian package 'time'"
  apt-get install -y time >/dev/null || { apt-get update >/dev/null && apt-get install -y time >/dev/null; } \
    || die "cannot install GNU time (apt-get install time)"
fi
[[ -x $PY ]] || die "$PY missing: run tools/reference/setup.sh (llmcompressor 0.14.0.1 venv)"
[[ -f $CONFIG ]] || die "config $CONFIG missing"

if [[ $SKIP_BUILD != 1 ]]; then
  log "cargo build --release -p fp4forge"
  cargo build --release -p fp4forge >&2
fi
[[ -x $FF ]] || die "$FF missing"

rm -rf "$WORK/out" "$WORK/compare" "$WORK/logs"
mkdir -p "$WORK/logs" "$WORK/out"
RESULTS="$WORK/results.tsv"
: > "$RESULTS"

# ---- machine description ------------------------------------------------------------------
{
  echo "date:     $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "cpu:      $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores (nproc)"
  echo "memory:   $(free -g | awk '/^Mem:/ {print $2 " GiB total"}')"
  echo "kernel:   $(uname -sr)"
  echo "load avg: $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min) at start"
  echo "fp4forge: $($FF --version 2>/dev/null || echo '?') (git $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo '+dirty'))"
  echo "python:   $("$PY" - <<'EOF'
import importlib.metadata as m, platform
print(platform.python_version(), ", ".join(f"{p} {m.version(p)}" for p in
      ("llmcompressor", "compressed-tensors", "torch", "transformers", "safetensors")))
EOF
)"
} > "$WORK/machine.txt"
lscpu | head -20 > "$WORK/lscpu.txt"
cat "$WORK/machine.txt" >&2

# ---- checkpoints --------------------------------------------------------------------------
SHARD_ARGS=()
[[ -n $MAX_SHARD_SIZE ]] && SHARD_ARGS=(--max-shard-size "$MAX_SHARD_SIZE")
log "synth bf16 and stock checkpoints from $CONFIG (seed $SEED) ${SHARD_ARGS[*]:-}"
"$FF" synth "$WORK/bf16" --config "$CONFIG" --seed "$SEED" "${SHARD_ARGS[@]}" --force >&2
"$FF" synth "$WORK/stock" --config "$CONFIG" --seed "$SEED" --stock-nvfp4 "${SHARD_ARGS[@]}" --force >&2
du -sh "$WORK/bf16" "$WORK/stock" >&2

# ---- measurement --------------------------------------------------------------------------
# measure TOOL RECIPE RUN SRC DST -- CMD...
measure() {
  local tool=$1 recipe=$2 run=$3 src=$4 dst=$5; shift 6
  local tag; tag="$(echo "$tool-$recipe-$run" | tr ' /' '__')"
  rm -rf "$dst"
  sync
  cat "$src"/*.safetensors > /dev/null
  log "run: $tool / $recipe (#$run)"
  local rc=0 t0 t1 wall rss cpu
  t0=$(date +%s%N)
  $TIME -f '%e\t%M\t%U\t%S' -o "$WORK/logs/$tag.time" "$@" > "$WORK/logs/$tag.log" 2>&1 || rc=$?
  t1=$(date +%s%N)
  wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", (b - a) / 1e9 }')
  rss=$(tail -1 "$WORK/logs/$tag.time" | cut -f2)   # GNU time %M: max RSS in KiB
  cpu=$(tail -1 "$WORK/logs/$tag.time" | awk -F'\t' '{ printf "%.2f", $3 + $4 }')   # user + sys
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$tool" "$recipe" "$run" "$wall" "$rss" "$rc" "$src" "$dst" "$cpu" >> "$RESULTS"
  log "     wall ${wall} s, cpu ${cpu} s, peak RSS $((rss / 1024)) MiB, exit $rc (load avg $(cut -d' ' -f1-3 /proc/loadavg))"
  [[ $rc == 0 ]] || { log "FAILED, see $WORK/logs/$tag.log"; tail -20 "$WORK/logs/$tag.log" >&2; }
}

IGNORE_ALL=(--ignore lm_head --ignore 're:.*mlp\.gate$' --ignore 're:.*self_attn\.g_proj$')
QKVO='re:.*self_attn\.(q|k|v|o)_proj$'

for recipe in all-linear qkvo; do
  if [[ $recipe == all-linear ]]; then ff_args=(--targets Linear "${IGNORE_ALL[@]}"); else ff_args=(--targets "$QKVO"); fi
  for ((i = 1; i <= FP4FORGE_RUNS; i++)); do
    measure "fp4forge quantize" "$recipe" "$i" "$WORK/bf16" "$WORK/out/fp4forge-$recipe" -- \
      "$FF" quantize "$WORK/bf16" "$WORK/out/fp4forge-$recipe" "${ff_args[@]}" --force
  done
  for ((i = 1; i <= LLMC_RUNS; i++)); do
    measure "llmcompressor model_free_ptq" "$recipe" "$i" "$WORK/bf16" "$WORK/out/model_free_ptq-$recipe" -- \
      "$PY" "$RUNNER" model-free "$WORK/bf16" "$WORK/out/model_free_ptq-$recipe" --recipe "$recipe" --max-workers "$MFP_WORKERS"
  done
  if [[ $SKIP_ONESHOT != 1 ]]; then
    for ((i = 1; i <= LLMC_RUNS; i++)); do
      measure "llmcompressor oneshot" "$recipe" "$i" "$WORK/bf16" "$WORK/out/oneshot-$recipe" -- \
        "$PY" "$RUNNER" oneshot "$WORK/bf16" "$WORK/out/oneshot-$recipe" --recipe "$recipe"
    done
  fi
done

for ((i = 1; i <= FP4FORGE_RUNS; i++)); do
  measure "fp4forge quantize (lean, from stock)" "qkvo" "$i" "$WORK/stock" "$WORK/out/fp4forge-lean" -- \
    "$FF" quantize "$WORK/stock" "$WORK/out/fp4forge-lean" --force
done

# ---- output comparison --------------------------------------------------------------------
COMPARE_ARGS=()
mkdir -p "$WORK/compare"
for recipe in all-linear qkvo; do
  for other in model_free_ptq oneshot; do
    [[ -d $WORK/out/$other-$recipe ]] || continue
    j="$WORK/compare/fp4forge-vs-$other-$recipe.json"
    log "compare fp4forge-$recipe vs $other-$recipe"
    "$PY" "$RUNNER" compare "$WORK/out/fp4forge-$recipe" "$WORK/out/$other-$recipe" --json "$j" > /dev/null
    COMPARE_ARGS+=(--compare "$j")
  done
done
log "fp4forge verify (lean build against its stock source)"
if "$FF" verify "$WORK/stock" "$WORK/out/fp4forge-lean" > "$WORK/logs/verify-lean.log" 2>&1; then
  VERIFY="fp4forge verify stock -> lean: OK"
else
  VERIFY="fp4forge verify stock -> lean: FAILED (see $WORK/logs/verify-lean.log)"
fi

# ---- report -------------------------------------------------------------------------------
exec > >(tee "$WORK/report.md")
echo
echo "## fp4forge vs llm-compressor (NVFP4A16), $(basename "$CONFIG"): $(du -sb "$WORK/bf16" | awk '{printf "%.2f GB", $1/1e9}') bf16 source, $(ls "$WORK/bf16"/*.safetensors | wc -l) shard(s)"
echo
sed 's/^/    /' "$WORK/machine.txt"
echo
echo "Warm page cache (source read before every run), outputs not fsync'ed; wall = median of runs."
echo
"$PY" "$RUNNER" report "$RESULTS" "$WORK/results.json" --machine "$(cat "$WORK/machine.txt")" \
  --note "$VERIFY" --note "source: $CONFIG, seed $SEED, max shard size ${MAX_SHARD_SIZE:-default}, model_free_ptq max_workers $MFP_WORKERS" \
  "${COMPARE_ARGS[@]}"
echo
echo "$VERIFY"
echo "model_free_ptq matches tensor names: its all-linear run also ignores re:.*embed_tokens\$ (else it quantizes the embedding)."
echo "model_free_ptq fuses global scales only for q/k/v and mlp.gate_proj/up_proj (its regex re:.*mlp\\.gate_proj\\.weight\$):"
echo "routed-expert and shared-expert gate/up get their own global scales, unlike oneshot and fp4forge."
echo "JSON: $WORK/results.json   logs: $WORK/logs/"
