#!/usr/bin/env bash
# Prints one sha256 over the sources a GPU bundle is built from (C++, CUDA,
# Python, shell and Bazel files of the project's own directories), read from
# the current directory, the repository root. build_gpu_bundle.sh records it
# in MANIFEST.json; run_gpu_checks.sh computes it again on the GPU machine
# (which has the working tree, not .git) to tell a bundle built from other
# sources than the tree it runs beside.
set -euo pipefail
dirs=()
for d in bench capi comm core cuda engine examples fuzz io planner python \
    staging tests tools; do
  [[ -d "$d" ]] && dirs+=("$d")
done
find "${dirs[@]}" -type f \( -name '*.cc' -o -name '*.h' -o -name '*.hpp' \
    -o -name '*.c' -o -name '*.cu' -o -name '*.py' -o -name '*.sh' \
    -o -name 'BUILD.bazel' \) -not -path '*/__pycache__/*' -print0 |
  LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1
