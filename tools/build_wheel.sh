#!/usr/bin/env bash
# Builds the Python wheel: the pure-Python package python/dcp with libdcp.so
# inside, plus the shared libraries libdcp.so needs that a machine without
# Debian's Gloo lacks (bundled under dcp/_libs, found through RUNPATH
# $ORIGIN, the way auditwheel repairs wheels). One wheel serves every
# CPython 3 (the package binds the C ABI through ctypes): tagged
# py3-none-manylinux_2_36_x86_64 (built against Debian 12's glibc 2.36).
#
#   tools/build_wheel.sh PYTHON LIBDCP     (./dcp.sh wheel runs it)
#
# Prints the wheel's path as its last line.
set -euo pipefail
python="$1" lib="$2"
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
# ldd's output is taken whole first: a failing ldd must stop the build
# (read from a process substitution, its status would be lost), and so
# must a library it cannot find ("libX.so => not found"), which the wheel
# would otherwise lack.
if ! deps="$(ldd "$stage/dcp/libdcp.so")"; then
  echo "build_wheel.sh: ldd $lib failed; cannot collect its libraries" >&2
  exit 1
fi
missing=()
while read -r name _ path _; do
  if [[ "${path:-}" == "not" ]]; then
    missing+=("$name")
    continue
  fi
  [[ -n "${path:-}" && "$path" == /* ]] || continue
  is_system_lib "$name" && continue
  cp -L "$path" "$stage/dcp/_libs/$name"
  chmod 755 "$stage/dcp/_libs/$name"
  patchelf --set-rpath '$ORIGIN' "$stage/dcp/_libs/$name"
done <<<"$deps"
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "build_wheel.sh: $lib needs libraries ldd cannot find:" \
    "${missing[*]} (install them or add their directory to" \
    "LD_LIBRARY_PATH); not building a wheel without them" >&2
  exit 1
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
