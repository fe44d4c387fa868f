#!/usr/bin/env bash
# Builds the Python wheel: the pure-Python package python/dcp with libdcp.so
# inside, plus the shared libraries libdcp.so needs that a machine without
# Debian's Gloo lacks (bundled under dcp/_libs, found through RUNPATH
# $ORIGIN, the way auditwheel repairs wheels). One wheel serves every
# CPython 3 (the package binds the C ABI through ctypes): tagged
# py3-none-manylinux_2_36_x86_64 (built against Debian 12's glibc 2.36).
#
#   tools/build_wheel.sh PYTHON LIBDCP [DCP_TOOL]   (./dcp.sh wheel runs it)
#
# DCP_TOOL, the `dcp` command line (bazel-bin/tools/dcp), goes in as
# dcp/_bin/dcp with the libraries it needs: the wheel's `dcp` script and
# `python -m dcp` run it (inspect, verify, convert, demo).
#
# Prints the wheel's path as its last line.
set -euo pipefail
python="$1" lib="$2" tool="${3:-}"
cd "$(dirname "$0")/.."
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT

cp -r python/. "$stage/"
rm -rf "$stage/tests" "$stage/dcp/__pycache__"
install -m 755 "$lib" "$stage/dcp/libdcp.so"
mkdir -p "$stage/dcp/_libs"

# The C and C++ runtimes are the target machine's; everything else that
# libdcp.so pulls in (Gloo and its own dependencies) travels in the wheel.
is_system_lib() {
  case "$1" in
    libc.so.* | libm.so.* | libdl.so.* | librt.so.* | libpthread.so.* | \
      ld-linux*.so.* | libstdc++.so.* | libgcc_s.so.* | linux-vdso.so.*) return 0 ;;
  esac
  return 1
}
# Copies the libraries `file` needs into dcp/_libs. ldd's output is taken
# whole first: a failing ldd must stop the build (read from a process
# substitution, its status would be lost), and so must a library it cannot
# find ("libX.so => not found"), which the wheel would otherwise lack.
collect_libs() {
  local file="$1" deps name path
  if ! deps="$(ldd "$file")"; then
    echo "build_wheel.sh: ldd $file failed; cannot collect its libraries" >&2
    exit 1
  fi
  local missing=()
  while read -r name _ path _; do
    if [[ "${path:-}" == "not" ]]; then
      missing+=("$name")
      continue
    fi
    [[ -n "${path:-}" && "$path" == /* ]] || continue
    is_system_lib "$name" && continue
    [[ -e "$stage/dcp/_libs/$name" ]] && continue
    cp -L "$path" "$stage/dcp/_libs/$name"
    chmod 755 "$stage/dcp/_libs/$name"
    patchelf --set-rpath '$ORIGIN' "$stage/dcp/_libs/$name"
  done <<<"$deps"
  if [[ ${#missing[@]} -gt 0 ]]; then
    echo "build_wheel.sh: $file needs libraries ldd cannot find:" \
      "${missing[*]} (install them or add their directory to" \
      "LD_LIBRARY_PATH); not building a wheel without them" >&2
    exit 1
  fi
}
collect_libs "$stage/dcp/libdcp.so"
if [[ -n "$tool" ]]; then
  mkdir -p "$stage/dcp/_bin"
  install -m 755 "$tool" "$stage/dcp/_bin/dcp"
  collect_libs "$stage/dcp/_bin/dcp"
  patchelf --set-rpath '$ORIGIN/../_libs' "$stage/dcp/_bin/dcp"
fi
patchelf --set-rpath '$ORIGIN/_libs' "$stage/dcp/libdcp.so"

mkdir -p dist
out="$(mktemp -d)"
"$python" -m pip wheel -q --no-deps --no-build-isolation -w "$out" "$stage" >&2
built=("$out"/*.whl)
"$python" -m wheel tags --remove --python-tag py3 --abi-tag none \
  --platform-tag manylinux_2_36_x86_64 "${built[0]}" >&2
wheel=("$out"/*manylinux_2_36_x86_64.whl)
mv -f "${wheel[0]}" dist/
rm -rf "$out"
realpath "dist/$(basename "${wheel[0]}")"
