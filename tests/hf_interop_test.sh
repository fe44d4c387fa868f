#!/usr/bin/env bash
# Runs tests/hf_interop_test.py (dcp's Hugging Face storage against the
# reference safetensors library) with the repository's .venv interpreter,
# which ./dcp.sh test installs (torch, numpy, safetensors). Without it the
# test is skipped with a message: Bazel alone does not install Python
# packages.
set -euo pipefail
HERE="$(dirname "$(realpath "${BASH_SOURCE[0]}")")"
PYTHON="$(dirname "$HERE")/.venv/bin/python"
if [[ ! -x "$PYTHON" ]] ||
    ! "$PYTHON" -c 'import torch, numpy, safetensors' 2>/dev/null; then
  echo "SKIPPED: hf_interop_test needs $PYTHON with torch, numpy and" \
    "safetensors (./dcp.sh test installs them)"
  exit 0
fi
export HF_INTEROP_HELPER="$PWD/tests/hf_interop_helper"
exec "$PYTHON" "$HERE/hf_interop_test.py"
