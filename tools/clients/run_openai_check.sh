#!/usr/bin/env bash
# The official `openai` Python package against `fp4forge serve`: chat, chat streaming,
# completions with logprobs and echo (see openai_client_check.py).
#
# Usage: tools/clients/run_openai_check.sh [MODEL_DIR]
#   MODEL_DIR defaults to assets/smollm2-hf when present, else a synthesized tiny model with a
#   tokenizer. Exits non-zero if any check fails.
set -euo pipefail
source "$(dirname "$0")/common.sh"

OPENAI_VERSION="3.57.0"
VENV=/tmp/fp4forge-openai-venv

build_release
DIR="$(model_dir "${1:-}")"
venv_with "$VENV" "openai==$OPENAI_VERSION"
start_server "$DIR"
status=0
"$VENV/bin/python" "$ROOT/tools/clients/openai_client_check.py" "$BASE_URL" "$MODEL_NAME" || status=$?
stop_server
if [[ $status -ne 0 ]]; then
    log "server log:"
    tail -20 "$SERVER_LOG" >&2
fi
exit $status
