#!/usr/bin/env bash
# Runs a Python script of bench/ with the current PyTorch from PyPI:
#
#   bench/torch_env.sh SCRIPT [ARGS...]      e.g. torch_compare.py run --json
#
# The first run creates .venv at the repository root (git-ignored) and installs
# bench/requirements.txt into it (torch is a large download, once). SCRIPT is
# relative to bench/ unless it is an absolute path. Works through Bazel's
# runfiles links too: the venv always lives in the source tree.
set -euo pipefail
HERE="$(dirname "$(realpath "${BASH_SOURCE[0]}")")"
VENV="$(dirname "$HERE")/.venv"
if ! "$VENV/bin/python" -c 'import torch, numpy' 2>/dev/null; then
  echo "torch_env.sh: installing torch and numpy from PyPI into $VENV (once)" >&2
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q -r "$HERE/requirements.txt" >&2
fi
SCRIPT="${1:?usage: torch_env.sh SCRIPT [ARGS...]}"
shift
[[ "$SCRIPT" == /* ]] || SCRIPT="$HERE/$SCRIPT"
exec "$VENV/bin/python" "$SCRIPT" "$@"
