# Shared by the real-client scripts: the release binary, a model directory, a server on a free
# loopback port (stopped by PID on exit), and a cached virtualenv in /tmp.
# shellcheck shell=bash

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN="$ROOT/target/release/fp4forge"
SERVER_PID=""
SERVER_LOG=""

log() { echo "[$(basename "$0")] $*" >&2; }

# Builds the release binary (and the server examples) if needed.
build_release() {
    log "building the release binary"
    (cd "$ROOT" && cargo build --release -q -p fp4forge -p fp4forge-server --examples --bins)
}

# Echoes the model directory to serve: $1 if given, else assets/smollm2-hf if present, else a
# synthesized tiny model with a tokenizer (written once under /tmp).
model_dir() {
    if [[ -n "${1:-}" ]]; then
        echo "$1"
    elif [[ -f "$ROOT/assets/smollm2-hf/tokenizer.json" ]]; then
        echo "$ROOT/assets/smollm2-hf"
    else
        local tiny=/tmp/fp4forge-clients-tiny
        if [[ ! -f "$tiny/tokenizer.json" ]]; then
            rm -rf "$tiny"
            "$ROOT/target/release/examples/tiny_model" "$tiny" >/dev/null
        fi
        echo "$tiny"
    fi
}

# A virtualenv at $1 with the pip requirements $2... installed (kept between runs).
venv_with() {
    local dir="$1"
    shift
    if [[ ! -f "$dir/.installed" ]] || [[ "$(cat "$dir/.installed")" != "$*" ]]; then
        log "creating $dir with: $*"
        rm -rf "$dir"
        python3 -m venv "$dir"
        "$dir/bin/pip" install -q --disable-pip-version-check "$@"
        echo "$*" > "$dir/.installed"
    fi
}

stop_server() {
    if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        for _ in $(seq 1 100); do
            kill -0 "$SERVER_PID" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$SERVER_PID" 2>/dev/null || true
    fi
    SERVER_PID=""
}

# Starts `fp4forge serve $1` on a free loopback port; sets BASE_URL and MODEL_NAME.
start_server() {
    local dir="$1"
    shift
    SERVER_LOG="$(mktemp /tmp/fp4forge-serve-XXXXXX.log)"
    "$BIN" serve "$dir" --host 127.0.0.1 --port 0 "$@" >"$SERVER_LOG" 2>&1 &
    SERVER_PID=$!
    trap stop_server EXIT
    local line=""
    for _ in $(seq 1 600); do
        line="$(grep -m1 'on http://' "$SERVER_LOG" || true)"
        [[ -n "$line" ]] && break
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            cat "$SERVER_LOG" >&2
            log "the server exited before listening"
            return 1
        fi
        sleep 0.2
    done
    if [[ -z "$line" ]]; then
        cat "$SERVER_LOG" >&2
        log "the server did not start listening"
        return 1
    fi
    BASE_URL="$(sed -E 's|.* on (http://[^ ]+/v1).*|\1|' <<<"$line")"
    MODEL_NAME="$(sed -E 's|.*model `([^`]+)`.*|\1|' <<<"$line")"
    log "serving $MODEL_NAME at $BASE_URL (pid $SERVER_PID)"
}
