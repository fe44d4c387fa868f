#!/usr/bin/env bash
# Builds the GPU test and benchmark binaries with Bazel on this machine and
# copies them, with every non-system shared library they load, into a
# self-contained folder that a GPU machine without Bazel can run
# (tests/gpu/run_gpu_checks.sh). The CUDA runtime is linked statically into
# the binaries; the GPU machine provides the driver (libcuda.so.1) and NCCL
# (libnccl.so.2 from its CUDA install; dlopened at run time, and too large
# to carry: ~210 MB). glibc and the dynamic loader are not copied either
# (the GPU machine's glibc must be at least the one the manifest names).
#
#   tests/gpu/build_gpu_bundle.sh [BUNDLE_DIR]   # default: .gpu_bundle
#
# The bundle must stay git-ignored (it is listed in .git/info/exclude here)
# and under the device tool's 64 MiB carry limit; the script says its size.
set -euo pipefail
cd "$(dirname "$0")/../.."
bundle="${1:-.gpu_bundle}"

# label -> name in the bundle. Each is a gtest binary except staging_bench,
# training_loop and device_bench.
targets=(
  //cuda:cuda_runtime_gpu_test
  //tests:fp8_dequant_gpu_test
  //staging:staging_gpu_test
  //tests:device_save_gpu_test
  //tests:stream_order_gpu_test
  //tests:hf_device_gpu_test
  //comm:nccl_process_group_test
  //tests/comm:nccl_rendezvous_test
  //bench:staging_bench
  //examples:training_loop
  //bench:device_bench
)

bazel build "${targets[@]}" >&2
bin_dir="$(bazel info bazel-bin 2>/dev/null)"

rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib"

# Libraries the GPU machine provides itself: glibc, the loader, the driver.
is_system_lib() {
  case "$(basename "$1")" in
    linux-vdso.so* | ld-linux*.so* | libc.so* | libm.so* | libdl.so* | \
      libpthread.so* | librt.so* | libresolv.so* | libutil.so* | \
      libcuda.so* | libnvidia-*.so*)
      return 0 ;;
  esac
  return 1
}

declare -A copied=()
for label in "${targets[@]}"; do
  pkg="${label#//}"; pkg="${pkg%%:*}"; name="${label##*:}"
  exe="$bin_dir/$pkg/$name"
  [[ -x "$exe" ]] || { echo "build_gpu_bundle: $exe missing" >&2; exit 1; }
  cp "$exe" "$bundle/bin/$name"
  chmod u+w "$bundle/bin/$name"
  # ldd resolves the Bazel-internal libraries (_solib_k8) through the
  # binary's RUNPATH and the system ones through the loader cache.
  while read -r lib path _; do
    if [[ "$path" == "not" ]]; then
      echo "build_gpu_bundle: $name needs $lib, which is not found here" >&2
      exit 1
    fi
    [[ "$path" == /* ]] || continue
    is_system_lib "$path" && continue
    base="$(basename "$lib")"
    if [[ -z "${copied[$base]:-}" ]]; then
      cp -L "$path" "$bundle/lib/$base"
      chmod u+w "$bundle/lib/$base"
      copied[$base]="$path"
    fi
  done < <(ldd "$exe" | awk '/=>/ {print $1, $3} !/=>/ {print $1, $1}')
done

# The Python package, unpacked from the wheel (libdcp.so and the libraries it
# needs inside): run_gpu_checks.sh puts bundle/python on PYTHONPATH.
venv_python="$PWD/.venv/bin/python"
if [[ -x "$venv_python" ]]; then
  bazel build //capi:libdcp.so >&2
  wheel="$(tools/build_wheel.sh "$venv_python" \
    "$(bazel info bazel-bin 2>/dev/null)/capi/libdcp.so" | tail -1)"
  mkdir -p "$bundle/python"
  (cd "$bundle/python" && "$venv_python" -m zipfile -e "$wheel" .)
  rm -rf "$bundle/python"/*.dist-info
else
  echo "build_gpu_bundle: no .venv: the Python parts will be skipped" \
    "(./dcp.sh test creates it)" >&2
fi

# Smaller to carry; symbols are not needed to run.
strip --strip-unneeded "$bundle"/lib/*.so* 2>/dev/null || true

glibc_needed="$(objdump -T "$bundle"/bin/* "$bundle"/lib/* 2>/dev/null |
  grep -o 'GLIBC_[0-9.]*' | sort -t. -k2,2n -k3,3n -u | tail -1)"
{
  echo "{"
  echo "  \"commit\": \"$(git rev-parse HEAD)\","
  echo "  \"source_digest\": \"$(tests/gpu/source_digest.sh)\","
  echo "  \"dirty\": $([[ -n "$(git status --porcelain --untracked-files=no)" ]] && echo true || echo false),"
  echo "  \"built\": \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\","
  echo "  \"build_host\": \"$(. /etc/os-release && echo "$PRETTY_NAME")\","
  echo "  \"glibc_needed\": \"$glibc_needed\","
  echo "  \"binaries\": [$(ls "$bundle/bin" | sed 's/.*/"&"/' | paste -sd, -)],"
  echo "  \"libraries\": [$(ls "$bundle/lib" | sed 's/.*/"&"/' | paste -sd, -)]"
  echo "}"
} >"$bundle/MANIFEST.json"

size_kib="$(du -sk "$bundle" | cut -f1)"
echo "build_gpu_bundle: $bundle: $(ls "$bundle/bin" | wc -l) binaries," \
  "$(ls "$bundle/lib" | wc -l) libraries, $((size_kib / 1024)) MiB" \
  "(needs $glibc_needed or newer on the GPU machine)" >&2
if ((size_kib > 60 * 1024)); then
  echo "build_gpu_bundle: WARNING: over 60 MiB; the device tool carries" \
    "at most 64 MiB in all" >&2
fi
