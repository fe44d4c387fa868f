#!/usr/bin/env bash
# Installs libdcp.so into a fresh prefix with tools/install.sh, builds
# examples/consumer with CMake (find_package(dcp)) and with pkg-config, runs
# the programs, and checks what the library needs at run time.
#
#   consumer_test.sh LIBDCP INSTALL_SH DCP_H CONSUMER_CMAKELISTS
set -euo pipefail
lib="$(realpath "$1")" install_sh="$(realpath "$2")"
headers="$(dirname "$(realpath "$3")")"
src="$(dirname "$(realpath "$4")")"
work="${TEST_TMPDIR:-$(mktemp -d)}/consumer"
rm -rf "$work" && mkdir -p "$work"
prefix="$work/prefix"

fail() { echo "consumer_test: $*" >&2; exit 1; }

"$install_sh" --prefix "$prefix" --lib "$lib" --headers "$headers" >/dev/null
for f in include/dcp/dcp.h include/dcp/dcp.hpp lib/libdcp.so \
    lib/pkgconfig/dcp.pc lib/cmake/dcp/dcpConfig.cmake \
    lib/cmake/dcp/dcpConfigVersion.cmake; do
  [[ -e "$prefix/$f" ]] || fail "install left out $f"
done

# Only the C ABI is exported, and what the library needs at run time comes
# from Debian runtime packages (libgloo0, libprotobuf32, libabsl20220623,
# the C/C++ runtime), never from a -dev package.
exported=$(nm -D --defined-only "$prefix/lib/libdcp.so" | awk '{print $3}' |
  grep -v '^dcp_' | grep -v '^$' || true)
[[ -z "$exported" ]] || fail "exports non-dcp_ symbols: $(echo $exported | head -c 300)"
while read -r name _ path _; do
  [[ "$path" == /* ]] || continue
  owner=$(dpkg -S "$(readlink -f "$path")" 2>/dev/null | head -1 | cut -d: -f1 ||
    true)
  [[ -n "$owner" ]] ||
    owner=$(dpkg -S "$path" 2>/dev/null | head -1 | cut -d: -f1 || true)
  case "$owner" in
    *-dev) fail "libdcp.so needs $name, which only $owner provides" ;;
  esac
done < <(ldd "$prefix/lib/libdcp.so")

# CMake: find_package(dcp) from the installed prefix. The source is copied so
# that the build cannot pick up headers from the repository.
cp -r "$src" "$work/src"
cmake -S "$work/src" -B "$work/build" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release >"$work/cmake.log" 2>&1 ||
  { cat "$work/cmake.log" >&2; fail "cmake configure failed"; }
cmake --build "$work/build" >>"$work/cmake.log" 2>&1 ||
  { cat "$work/cmake.log" >&2; fail "cmake build failed"; }
"$work/build/c_example" "$work/ckpt-c" || fail "c_example failed"
"$work/build/train_loop" "$work/ckpt-loop" || fail "train_loop failed"
[[ -f "$work/ckpt-loop/step-6/.metadata" ]] || fail "no committed step-6"

# pkg-config: the same C program built by hand.
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
lib_version=$("$work/build/c_example" "$work/ckpt-pc" | head -1 | cut -d' ' -f2)
[[ "$(pkg-config --modversion dcp)" == "$lib_version" ]] ||
  fail "pkg-config says $(pkg-config --modversion dcp), dcp_version() $lib_version"
cc -std=c99 -o "$work/c_example_pc" "$work/src/c_example.c" \
  $(pkg-config --cflags --libs dcp)
"$work/c_example_pc" "$work/ckpt-pc2" >/dev/null || fail "pkg-config build failed"
echo "consumer_test: OK"
