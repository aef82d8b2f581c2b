#!/usr/bin/env bash
# Creates tools/reference/.venv with the pinned reference stack (about 2 minutes, 6 GB on disk:
# PyPI's torch wheel pulls the CUDA runtime wheels even though everything here runs on CPU).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3.11}
"$PY" -m venv .venv
# The CPU-only torch index is tried first; where it is unreachable PyPI's torch is used.
.venv/bin/pip install --retries 0 --timeout 15 torch==2.14.0 --index-url https://download.pytorch.org/whl/cpu \
  || echo "CPU torch index unreachable; falling back to PyPI's torch"
.venv/bin/pip install $(grep -v '^#' requirements.txt | grep -v '^compressed-tensors')
.venv/bin/pip install --no-deps "$(grep '^compressed-tensors==' requirements.txt)"
.venv/bin/python -c "import compressed_tensors, llmcompressor, torch, transformers, transformers.models.laguna; \
print('compressed-tensors', compressed_tensors.__version__, 'llmcompressor', llmcompressor.__version__, \
'torch', torch.__version__, 'transformers', transformers.__version__)"
