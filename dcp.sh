#!/usr/bin/env bash
# The one entry point for a newcomer. On a fresh Debian 12 machine it installs
# the missing Debian packages, builds what is needed, then:
#   ./dcp.sh demo [flags]      checkpoint and restore a synthetic model
#   ./dcp.sh test [targets]    run the test suite (default: everything,
#                              the Python package's pytest suite included)
#   ./dcp.sh install --prefix DIR   install libdcp.so, dcp/dcp.h, CMake and
#                              pkg-config files into DIR
#   ./dcp.sh wheel             build the Python wheel under dist/ (its path
#                              is the last line printed)
#   ./dcp.sh bench KIND [..]   run a benchmark (dcp bench KIND)
#   ./dcp.sh gpu-bundle        build the GPU checks for a GPU machine
#   ./dcp.sh <subcommand> ...  run the dcp command line (inspect, verify, ...)
set -euo pipefail
cd "$(dirname "$0")"

PACKAGES=(
  bazel-bootstrap g++ libabsl-dev liburing-dev libxxhash-dev libzstd-dev
  libprotobuf-dev protobuf-compiler libcli11-dev libgloo-dev libdlpack-dev
  nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev fio
  redis-server cmake pkg-config python3-venv patchelf
)

install_missing_packages() {
  local missing=()
  for pkg in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null |
        grep -q "install ok installed"; then
      missing+=("$pkg")
    fi
  done
  if ((${#missing[@]} > 0)); then
    echo "dcp.sh: installing missing packages: ${missing[*]}" >&2
    local sudo=""
    if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq \
      --no-install-recommends "${missing[@]}" >&2
  fi
}

# Every command builds in one configuration (-c opt, from .bazelrc), so the
# demo after the tests reuses the same build outputs.
# bazel-bin/tools goes on PATH so `./dcp.sh launch -n 4 -- dcp demo ...`
# finds the dcp binary for its ranks.
run_dcp() {
  bazel build //tools:dcp //tools:dcp_launch >&2
  export PATH="$PWD/bazel-bin/tools:$PATH"
  exec ./bazel-bin/tools/dcp "$@"
}

# Benchmarks are separate programs; build the one asked for, then run it
# through `dcp bench KIND`.
run_bench() {
  local kind="${1:-}"
  case "$kind" in
    planner | io | staging | layouts) bazel build "//bench:${kind}_bench" >&2 ;;
    coord) bazel build //bench/coord:coord_bench >&2 ;;
    *) ;;  # dcp bench reports unknown kinds.
  esac
  run_dcp bench "$@"
}

# The Python venv of the test suite and the benchmarks (.venv, git-ignored):
# torch, numpy, safetensors and pytest from PyPI, installed once.
VENV="$PWD/.venv"
ensure_venv() {
  if ! "$VENV/bin/python" -c 'import torch, numpy, safetensors, pytest' \
      2>/dev/null; then
    echo "dcp.sh: installing torch, numpy, safetensors, pytest into $VENV" \
      "(once; torch is a large download)" >&2
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q -r python/requirements-test.txt >&2
  fi
}

# The Python package's tests, against the libdcp.so of this build; then the
# wheel, installed into a fresh venv and smoke-tested there.
run_python_tests() {
  ensure_venv
  bazel build //capi:libdcp.so //tools:dcp >&2
  DCP_LIBRARY="$PWD/bazel-bin/capi/libdcp.so" \
    "$VENV/bin/python" -m pytest -q -p no:cacheprovider python/tests
  local wheel
  wheel=$(tools/build_wheel.sh "$VENV/bin/python" bazel-bin/capi/libdcp.so \
    bazel-bin/tools/dcp | tail -1)
  tools/wheel_smoke_test.sh "$wheel"
}

install_missing_packages
cmd="${1:-help}"
[[ $# -gt 0 ]] && shift
case "$cmd" in
  test)
    if [[ $# -gt 0 ]]; then exec bazel test "$@"; fi
    # The venv first: the interop tests (hf_interop_test, hf_quantized_test)
    # compare against torch and safetensors from it, and skip without it.
    ensure_venv
    bazel_rc=0
    bazel test //... || bazel_rc=$?
    python_rc=0
    run_python_tests || python_rc=$?
    if ((bazel_rc != 0 || python_rc != 0)); then
      echo "dcp.sh test: FAILED (bazel exit $bazel_rc, pytest exit $python_rc)" >&2
      exit 1
    fi
    ;;
  install)
    bazel build //capi:libdcp.so >&2
    exec tools/install.sh "$@" --lib bazel-bin/capi/libdcp.so --headers capi
    ;;
  wheel)
    ensure_venv
    bazel build //capi:libdcp.so //tools:dcp >&2
    exec tools/build_wheel.sh "$VENV/bin/python" bazel-bin/capi/libdcp.so \
      bazel-bin/tools/dcp
    ;;
  bench)
    run_bench "$@"
    ;;
  demo | inspect | verify | launch)
    run_dcp "$cmd" "$@"
    ;;
  gpu-bundle)
    # Builds the GPU tests and the staging benchmark into .gpu_bundle/ for
    # tests/gpu/run_gpu_checks.sh on a GPU machine (see tests/gpu/README.md).
    exec tests/gpu/build_gpu_bundle.sh "$@"
    ;;
  help | -h | --help)
    sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
    ;;
  *)
    run_dcp "$cmd" "$@"
    ;;
esac
