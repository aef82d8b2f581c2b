#!/usr/bin/env bash
# What logprobs cost through `fp4forge serve`, for one or more fp4forge binaries side by side
# (A/B of two builds in one run): generation with and without `logprobs`, and `fp4forge eval`'s
# prompt scoring (echoed prompt logprobs: WikiText-style windows, top-1, then top-20 against the
# same endpoint as `--compare`, the KL path). Run from anywhere in the repository:
#
#   BINS="before=/path/old/fp4forge after=target/release/fp4forge" WORK=/mnt/x/lp \
#     TOOLS=../shared/tools benches/logprobs_ab.sh          # table on stdout and in WORK/report.md
#
# Steps, per binary of BINS (label=path; default: this=target/release/fp4forge):
#   1. (once) the model: MODEL_DIR if set, else `fp4forge synth --preset MODEL --stock-nvfp4` +
#      `fp4forge quantize` into WORK/MODEL-lean (MODEL=xs on a GPU, tiny for a CPU try-out), with
#      the WordLevel tokenizer of TOOLS/word_tokenizer.py (t0 … tN-1); a text of EVAL_WORDS random
#      words t1 … tN-1 (seeded) stands in for WikiText, so windows are random ids as in
#      benches/gpu_vs_llamacpp.sh (prose through that tokenizer would be one id repeated);
#   2. `fp4forge serve MODEL --device DEVICE --port PORT --served-model-name m`;
#   3. 1 and CLIENTS concurrent completions of a 128-id prompt, 128 tokens (greedy, ignore_eos),
#      without and with `logprobs: 5` (wall-clock seconds);
#   4. `fp4forge eval URL --task wikitext --data TEXT --tokenizer MODEL --limit EVAL_ITEMS`
#      (windows of 512 ids, every token scored: prompt logprobs, top 1), then
#      `--limit KL_ITEMS --compare URL` (top 20 from both "endpoints");
#   5. a markdown table, one column per binary.
# Knobs: BINS, MODEL (xs), MODEL_DIR, DEVICE (cuda), WORK (/tmp/fp4forge-logprobs), TOOLS
# (../shared/tools), PORT (8100), CLIENTS (16), EVAL_ITEMS (100), KL_ITEMS (30), EVAL_WORDS
# (210000), KERNEL_CACHE_<label> (FP4FORGE_KERNEL_CACHE for that binary's server).
set -euo pipefail
cd "$(dirname "$0")/.."
BINS=${BINS:-this=target/release/fp4forge}
MODEL=${MODEL:-xs}
DEVICE=${DEVICE:-cuda}
WORK=${WORK:-/tmp/fp4forge-logprobs}
TOOLS=${TOOLS:-../shared/tools}
PORT=${PORT:-8100}
CLIENTS=${CLIENTS:-16}
EVAL_ITEMS=${EVAL_ITEMS:-100}
KL_ITEMS=${KL_ITEMS:-30}
EVAL_WORDS=${EVAL_WORDS:-210000}
die() { echo "logprobs_ab.sh: $*" >&2; exit 1; }
log() { echo "logprobs_ab.sh: $*" >&2; }
now() { echo "$EPOCHREALTIME"; }
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }'; }
mkdir -p "$WORK"
first_bin=${BINS%% *}
first_bin=${first_bin#*=}
[[ -x $first_bin ]] || die "$first_bin: no such binary (BINS=label=path ...)"

# 1. model, tokenizer, text, request bodies
if [[ -n ${MODEL_DIR:-} ]]; then
  M=$MODEL_DIR
else
  M=$WORK/$MODEL-lean
  if [[ ! -f $M/model.safetensors.index.json && ! -f $M/model.safetensors ]]; then
    log "writing the $MODEL checkpoint (synth + quantize) into $M"
    "$first_bin" synth --preset "$MODEL" --stock-nvfp4 "$WORK/$MODEL-stock" >&2
    rm -rf "$M"
    "$first_bin" quantize "$WORK/$MODEL-stock" "$M" >&2
    rm -rf "$WORK/$MODEL-stock"
  fi
fi
VOCAB=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$M/config.json")
[[ -f $M/tokenizer.json ]] || python3 "$TOOLS/word_tokenizer.py" "$VOCAB" "$M" \
  || die "no tokenizer in $M and none written (TOOLS=$TOOLS)"
python3 - "$WORK" "$VOCAB" "$EVAL_WORDS" <<'PY'
import json, random, sys
work, vocab, words = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
r = random.Random(7)
with open(f"{work}/words.txt", "w") as f:
    for _ in range(max(1, words // 700)):
        f.write(" ".join(f"t{r.randrange(1, vocab)}" for _ in range(700)) + "\n\n")
r = random.Random(3)
body = {"model": "m", "prompt": [r.randrange(1, vocab) for _ in range(128)], "max_tokens": 128,
        "ignore_eos": True, "temperature": 0}
json.dump(body, open(f"{work}/plain.json", "w"))
json.dump(dict(body, logprobs=5), open(f"{work}/logprobs.json", "w"))
PY

# $1 request body, $2 clients: wall-clock seconds for all of them
completions() {
  local t0 pids=() i
  t0=$(now)
  for i in $(seq 1 "$2"); do
    curl -sf -m 300 -o "$WORK/out-$i.json" -H 'Content-Type: application/json' -d @"$1" \
      "http://127.0.0.1:$PORT/v1/completions" & pids+=($!)
  done
  wait "${pids[@]}" || die "a completion failed ($1, $2 clients)"
  since "$t0"
}

declare -A R
labels=()
for entry in $BINS; do
  label=${entry%%=*}; bin=${entry#*=}
  [[ -x $bin ]] || die "$bin: no such binary"
  labels+=("$label")
  log "== $label ($bin)"
  cache_var="KERNEL_CACHE_$label"
  FP4FORGE_KERNEL_CACHE=${!cache_var:-${FP4FORGE_KERNEL_CACHE:-}} "$bin" serve "$M" --device "$DEVICE" \
    --port "$PORT" --served-model-name m > "$WORK/serve-$label.log" 2>&1 &
  pid=$!
  trap 'kill $pid 2>/dev/null || true' EXIT
  for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break
    kill -0 $pid 2>/dev/null || die "serve ($label) exited: $WORK/serve-$label.log"
    sleep 1
  done
  R[$label,plain1]=$(completions "$WORK/plain.json" 1)
  R[$label,plainN]=$(completions "$WORK/plain.json" "$CLIENTS")
  R[$label,lp1]=$(completions "$WORK/logprobs.json" 1)
  R[$label,lpN]=$(completions "$WORK/logprobs.json" "$CLIENTS")
  t0=$(now)
  "$bin" eval "http://127.0.0.1:$PORT" --model m --task wikitext --data "$WORK/words.txt" \
    --tokenizer "$M" --limit "$EVAL_ITEMS" --json "$WORK/eval-$label.json" > "$WORK/eval-$label.log" 2>&1 \
    || die "eval ($label) failed: $WORK/eval-$label.log"
  R[$label,eval]=$(since "$t0")
  t0=$(now)
  "$bin" eval "http://127.0.0.1:$PORT" --model m --task wikitext --data "$WORK/words.txt" \
    --tokenizer "$M" --limit "$KL_ITEMS" --compare "http://127.0.0.1:$PORT" \
    --json "$WORK/evalkl-$label.json" > "$WORK/evalkl-$label.log" 2>&1 \
    || die "eval --compare ($label) failed: $WORK/evalkl-$label.log"
  R[$label,kl]=$(since "$t0")
  R[$label,nll]=$(python3 -c 'import json, sys; print("%.4f" % json.load(open(sys.argv[1]))["endpoints"][0]["scores"][0]["value"])' "$WORK/eval-$label.json")
  kill $pid; wait $pid 2>/dev/null || true
  trap - EXIT
done

# 5. the table
{
  echo "| seconds (wall clock), \`serve --device $DEVICE\`, $(basename "$M") | $(IFS='|'; echo "${labels[*]}" | sed 's/|/ | /g') |"
  echo "|---$(for _ in "${labels[@]}"; do printf '|---:'; done)|"
  row() { printf '| %s |' "$1"; for l in "${labels[@]}"; do printf ' %s |' "${R[$l,$2]}"; done; echo; }
  row "1 completion, 128 tokens" plain1
  row "$CLIENTS completions at once" plainN
  row "1 completion with logprobs 5" lp1
  row "$CLIENTS completions with logprobs 5" lpN
  row "eval: $EVAL_ITEMS windows of 512 ids, prompt logprobs (top 1)" eval
  row "eval --compare: $KL_ITEMS windows, top 20 from both" kl
  row "eval nll (nats/token)" nll
} | tee "$WORK/report.md"
