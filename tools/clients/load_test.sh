#!/usr/bin/env bash
# Bounded load test of a release `fp4forge serve`: 64 concurrent streaming clients, each sending
# N requests back to back (`fp4forge bench --concurrency 64`), run twice (a warm-up round, then a
# measured one); reports failed requests (bench's count, and every non-200 in the server's
# /metrics) and the server's RSS (ps -o rss) before, during (peak, sampled every 0.2 s) and after
# each round. Exits 1 on any error.
#
# usage: tools/clients/load_test.sh [MODEL_DIR] [REQUESTS_PER_CLIENT] [MAX_TOKENS] [PROMPT_TOKENS]
#   defaults: assets/smollm2-nvfp4 (else target/main-job/smollm2-nvfp4, what scripts/main-job.sh
#   builds), 4 requests per client, 16 tokens, 32-token prompts. Env: CLIENTS (64),
#   SERVE_ARGS (extra `fp4forge serve` flags).
set -euo pipefail
. "$(dirname "$0")/common.sh"

DIR="${1:-}"
if [[ -z "$DIR" ]]; then
    if [[ -f "$ROOT/assets/smollm2-nvfp4/config.json" ]]; then
        DIR="$ROOT/assets/smollm2-nvfp4"
    else
        DIR="$ROOT/target/main-job/smollm2-nvfp4"
    fi
fi
PER_CLIENT="${2:-4}"
MAX_TOKENS="${3:-16}"
PROMPT="${4:-32}"
CLIENTS="${CLIENTS:-64}"
[[ -f "$DIR/config.json" ]] || { log "no model at $DIR (run scripts/main-job.sh, or pass a dir)"; exit 2; }

build_release
# Batch and queue admit every client (a 429 would count as an error).
# shellcheck disable=SC2086
start_server "$DIR" --max-batch "$CLIENTS" --max-queue $((4 * CLIENTS)) ${SERVE_ARGS:-}

WORK="$(mktemp -d /tmp/fp4forge-load-XXXXXX)"
cleanup() { stop_server; rm -rf "$WORK"; [[ -n "$SERVER_LOG" ]] && rm -f "$SERVER_LOG"; }
trap cleanup EXIT

rss_mib() { ps -o rss= -p "$SERVER_PID" | awk '{printf "%.1f", $1 / 1024}'; }

# Samples the server's RSS (KiB) into $1 every 0.2 s until killed.
sample_rss() {
    while kill -0 "$SERVER_PID" 2>/dev/null; do
        ps -o rss= -p "$SERVER_PID" >>"$1" || true
        sleep 0.2
    done
}

ROWS=()
FAILED_TOTAL=0
round() {
    local name="$1" samples="$WORK/rss-$1.txt" sampler before after peak failed requests secs t0
    before="$(rss_mib)"
    : >"$samples"
    sample_rss "$samples" &
    sampler=$!
    t0=$(date +%s.%N)
    # --context: bench always runs a single-stream pass first; one request of the same prompt
    # length keeps it short (--repetitions is also the per-stream request count of the sweep).
    "$BIN" bench "$BASE_URL" --model "$MODEL_NAME" --tokenizer "$DIR" \
        --context "$PROMPT" --max-tokens "$MAX_TOKENS" --concurrency "$CLIENTS" \
        --repetitions "$PER_CLIENT" --warmup 0 --timeout 300 \
        --json "$WORK/bench-$name.json" >"$WORK/bench-$name.txt" 2>"$WORK/bench-$name.err" || {
        cat "$WORK/bench-$name.err" >&2
        log "bench failed"
        FAILED_TOTAL=$((FAILED_TOTAL + 1))
    }
    secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
    kill "$sampler" 2>/dev/null || true
    wait "$sampler" 2>/dev/null || true
    after="$(rss_mib)"
    peak="$(sort -n "$samples" | tail -n 1 | awk '{printf "%.1f", $1 / 1024}')"
    if [[ -f "$WORK/bench-$name.json" ]]; then
        failed="$(jq '[.sweep[].failed] + [.contexts[] | select(.error != null) | 1] | add // 0' "$WORK/bench-$name.json")"
        requests="$(jq '[.sweep[].requests] | add // 0' "$WORK/bench-$name.json")"
        sed -n '/^Concurrency/,$p' "$WORK/bench-$name.txt" >&2
    else
        failed="?" requests=0
        FAILED_TOTAL=$((FAILED_TOTAL + 1))
    fi
    [[ "$failed" =~ ^[0-9]+$ ]] && FAILED_TOTAL=$((FAILED_TOTAL + failed))
    ROWS+=("$(printf '%-9s %9s %9s %9s %9s %10s %8s' "$name" "$requests" "$failed" "$before" "$peak" "$after" "$secs")")
}

idle="$(rss_mib)"
log "$CLIENTS clients × $PER_CLIENT requests, prompt $PROMPT tokens, $MAX_TOKENS tokens each, model $DIR"
round warm-up
round measured

# Every request the server answered, by status: anything but 200 is an error.
curl -sf "${BASE_URL%/v1}/metrics" >"$WORK/metrics.txt"
non200="$(awk '/^fp4forge_requests_total\{/ && !/status="200"/ {s += $2} END {print s + 0}' "$WORK/metrics.txt")"
running="$(awk '/^fp4forge_requests_running\{/ {print $2}' "$WORK/metrics.txt")"
waiting="$(awk '/^fp4forge_requests_waiting\{/ {print $2}' "$WORK/metrics.txt")"
FAILED_TOTAL=$((FAILED_TOTAL + non200))

echo
echo "server RSS (MiB): idle after start $idle"
printf '%-9s %9s %9s %9s %9s %10s %8s\n' round requests failed "RSS before" "RSS peak" "RSS after" seconds
printf '%s\n' "${ROWS[@]}"
warm_after="$(awk '{print $6}' <<<"${ROWS[0]}")"
meas_after="$(awk '{print $6}' <<<"${ROWS[1]}")"
echo "growth over the measured round: $(awk -v a="$warm_after" -v b="$meas_after" 'BEGIN {printf "%+.1f", b - a}') MiB"
echo "non-200 responses (server /metrics): $non200; running $running, waiting $waiting afterwards"
if [[ "$FAILED_TOTAL" -ne 0 || "$running" != 0 || "$waiting" != 0 ]]; then
    log "FAILED: $FAILED_TOTAL errors"
    exit 1
fi
log "ok: zero errors"
