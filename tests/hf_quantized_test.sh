#!/usr/bin/env bash
# Runs tests/hf_quantized_test.py (QuantizedHuggingFaceStorageReader against
# PyTorch's dequantization of files the safetensors library wrote) with the
# repository's .venv interpreter; skipped, saying so, without one.
set -euo pipefail
HERE="$(dirname "$(realpath "${BASH_SOURCE[0]}")")"
PYTHON="$(dirname "$HERE")/.venv/bin/python"
if [[ ! -x "$PYTHON" ]] ||
    ! "$PYTHON" -c 'import torch, safetensors' 2>/dev/null; then
  echo "SKIPPED: hf_quantized_test needs $PYTHON with torch and safetensors" \
    "(./dcp.sh test installs them)"
  exit 0
fi
export HF_INTEROP_HELPER="$PWD/tests/hf_interop_helper"
exec "$PYTHON" "$HERE/hf_quantized_test.py"
