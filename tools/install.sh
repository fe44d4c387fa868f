#!/usr/bin/env bash
# Installs the embeddable library into a prefix:
#
#   tools/install.sh --prefix DIR --lib PATH/libdcp.so --headers DIR
#
#   DIR/include/dcp/dcp.h, dcp.hpp     the C ABI and its C++ wrapper
#   DIR/lib/libdcp.so.X.Y.Z (+ .so.X, .so links)
#   DIR/lib/pkgconfig/dcp.pc            pkg-config --cflags --libs dcp
#   DIR/lib/cmake/dcp/dcpConfig.cmake   find_package(dcp) -> target dcp::dcp
#
# `./dcp.sh install --prefix DIR` builds //capi:libdcp.so and runs this; the
# consumer test (examples/consumer) runs it on the Bazel outputs. The
# installed tree is relocatable: the CMake config finds the library relative
# to itself, and dcp.pc uses ${pcfiledir}.
set -euo pipefail

prefix="" lib="" headers=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --prefix) prefix="$2"; shift 2 ;;
    --prefix=*) prefix="${1#*=}"; shift ;;
    --lib) lib="$2"; shift 2 ;;
    --headers) headers="$2"; shift 2 ;;
    *) echo "install.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
if [[ -z "$prefix" || -z "$lib" || -z "$headers" ]]; then
  echo "usage: install.sh --prefix DIR --lib PATH/libdcp.so --headers DIR" >&2
  exit 2
fi
for f in "$lib" "$headers/dcp.h" "$headers/dcp.hpp"; do
  [[ -f "$f" ]] || { echo "install.sh: missing $f" >&2; exit 1; }
done

version_part() {
  sed -n "s/^#define DCP_VERSION_$1 \([0-9]*\)$/\1/p" "$headers/dcp.h"
}
major=$(version_part MAJOR) minor=$(version_part MINOR) patch=$(version_part PATCH)
# Each must be one number: an empty one would install libdcp.so.. files.
for part in "$major" "$minor" "$patch"; do
  if ! [[ "$part" =~ ^[0-9]+$ ]]; then
    echo "install.sh: cannot read the version from $headers/dcp.h: expected" \
      "one '#define DCP_VERSION_MAJOR|MINOR|PATCH N' line each, found" \
      "major='$major' minor='$minor' patch='$patch'" >&2
    exit 1
  fi
done
version="$major.$minor.$patch"

mkdir -p "$prefix/include/dcp" "$prefix/lib/pkgconfig" "$prefix/lib/cmake/dcp"
install -m 644 "$headers/dcp.h" "$headers/dcp.hpp" "$prefix/include/dcp/"
install -m 755 "$lib" "$prefix/lib/libdcp.so.$version"
ln -sfn "libdcp.so.$version" "$prefix/lib/libdcp.so.$major"
ln -sfn "libdcp.so.$major" "$prefix/lib/libdcp.so"

cat >"$prefix/lib/pkgconfig/dcp.pc" <<PC
prefix=\${pcfiledir}/../..
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: dcp
Description: GPU-aware distributed checkpoint engine (C ABI)
Version: $version
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -ldcp
Cflags: -I\${includedir}
PC

cat >"$prefix/lib/cmake/dcp/dcpConfigVersion.cmake" <<CMAKE
# Compatible within a major version (the C ABI's promise).
set(PACKAGE_VERSION "$version")
if(PACKAGE_FIND_VERSION_MAJOR AND
   NOT PACKAGE_FIND_VERSION_MAJOR STREQUAL "$major")
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
elseif(PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION)
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
else()
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
  if(PACKAGE_FIND_VERSION STREQUAL PACKAGE_VERSION)
    set(PACKAGE_VERSION_EXACT TRUE)
  endif()
endif()
CMAKE

cat >"$prefix/lib/cmake/dcp/dcpConfig.cmake" <<'CMAKE'
# find_package(dcp) -> the imported target dcp::dcp (libdcp.so with the
# include directory holding dcp/dcp.h). dcp.h includes <dlpack/dlpack.h>:
# Debian's libdlpack-dev (or any DLPack >= 0.6 header on the include path).
get_filename_component(_dcp_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
if(NOT TARGET dcp::dcp)
  add_library(dcp::dcp SHARED IMPORTED)
  set_target_properties(dcp::dcp PROPERTIES
    IMPORTED_LOCATION "${_dcp_prefix}/lib/libdcp.so"
    INTERFACE_INCLUDE_DIRECTORIES "${_dcp_prefix}/include")
  find_package(dlpack QUIET CONFIG)
  if(TARGET dlpack::dlpack)
    set_property(TARGET dcp::dcp APPEND PROPERTY
      INTERFACE_LINK_LIBRARIES dlpack::dlpack)
  endif()
endif()
set(dcp_FOUND TRUE)
unset(_dcp_prefix)
CMAKE
echo "$prefix"
