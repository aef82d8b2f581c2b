#!/usr/bin/env bash
# Real agent clients (the official `openai` package and LangChain's `langchain-openai`) against
# `fp4forge serve`: tool calls and reasoning on the scripted Laguna agent with the real
# Laguna-S-2.1 template and the poolside_v1 parsers, then structured output (openai's
# `parse`, LangChain's `with_structured_output`) on the tiny random model (see
# agentic_client_check.py).
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
"$VENV/bin/python" "$ROOT/tools/clients/agentic_client_check.py" tools "$BASE_URL" "$MODEL_NAME" \
    || status=$?
stop_server
if [[ $status -ne 0 ]]; then
    log "server log:"
    tail -20 "$SERVER_LOG" >&2
    exit $status
fi
# Structured output on the tiny random model (a byte-level vocabulary).
TINY=/tmp/fp4forge-clients-tiny-structured
rm -rf "$TINY"
"$ROOT/target/release/examples/tiny_model" "$TINY" >/dev/null
start_server "$TINY"
"$VENV/bin/python" "$ROOT/tools/clients/agentic_client_check.py" structured "$BASE_URL" \
    "$MODEL_NAME" || status=$?
stop_server
if [[ $status -ne 0 ]]; then
    log "server log:"
    tail -20 "$SERVER_LOG" >&2
fi
exit $status
