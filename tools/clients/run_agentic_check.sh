#!/usr/bin/env bash
# Real agent clients (the official `openai` package and LangChain's `langchain-openai`) against
# `fp4forge serve` on the scripted Laguna agent with the real Laguna-S-2.1 template and the
# poolside_v1 tool-call and reasoning parsers (see agentic_client_check.py).
#
# Usage: tools/clients/run_agentic_check.sh
#   Exits non-zero if any check fails.
set -euo pipefail
source "$(dirname "$0")/common.sh"

OPENAI_VERSION="3.57.0"
LANGCHAIN_OPENAI_VERSION="1.7.4"
VENV=/tmp/fp4forge-agentic-venv

build_release
DIR=/tmp/fp4forge-clients-laguna-agent
rm -rf "$DIR"
"$ROOT/target/release/examples/script_model" "$DIR" >/dev/null
venv_with "$VENV" "openai==$OPENAI_VERSION" "langchain-openai==$LANGCHAIN_OPENAI_VERSION"
start_server "$DIR" --enable-auto-tool-choice --tool-call-parser poolside_v1 \
    --reasoning-parser poolside_v1
status=0
"$VENV/bin/python" "$ROOT/tools/clients/agentic_client_check.py" "$BASE_URL" "$MODEL_NAME" || status=$?
stop_server
if [[ $status -ne 0 ]]; then
    log "server log:"
    tail -20 "$SERVER_LOG" >&2
fi
exit $status
