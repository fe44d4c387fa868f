#!/usr/bin/env bash
# Runs dcp's GPU checks from a bundle made by tests/gpu/build_gpu_bundle.sh:
# the real-GPU tests (cuda, staging, NCCL) and the staging benchmark, in one
# command, on a machine with CUDA but no Bazel. Writes one log per binary,
# the benchmark's JSON and a JSON summary into $OUT (or ./gpu_checks_out).
#
#   tests/gpu/run_gpu_checks.sh [BUNDLE_DIR]     # default: .gpu_bundle
#
# Environment:
#   OUT                  where results go (default: ./gpu_checks_out)
#   STAGING_BENCH_ARGS   default: --sizes_mib=64,256,1024,8192 --json
#   DEVICE_SAVE_ARGS     the second staging_bench run: a save of device
#                        tensors through a bounded pool vs a CPU save, with
#                        peak RSS (default: --device_save_mib=4096
#                        --pool_mib=256 --json; empty skips it)
#   TRAINING_LOOP_ARGS   examples/training_loop on the GPU (AsyncSave of
#                        device tensors, restore into device tensors;
#                        default: --device=auto --steps=20 --every=5
#                        --size=1024)
#   STAGER_ARGS          device_bench's stager sweep (sizes x layouts x copy
#                        streams x chunk sizes x coalescing, against the
#                        pinned peak; default: --budget_s=110 stager
#                        --sizes_mib=1024,4096,16384 --streams=1
#                        --chunks_mib=64 --reps=3: the chosen defaults, and
#                        the small layout with coalescing on and off)
#   ASYNC_ARGS           device_bench's AsyncSave from device tensors and
#                        Load into device tensors (default: --budget_s=60
#                        async --mib=4096 --reps=3 --dir=/dev/shm)
#   SHM_ARGS             device_bench's save/load with 1-16 threads on
#                        /dev/shm against plain write/read (default:
#                        --budget_s=90 shm --mib=4096 --threads=1,4,8,16
#                        --reps=2 --dir=/dev/shm)
#   TORCH_ARGS           tests/gpu/torch_async_save.py: torch's async_save
#                        (and dcp's Python package, once it exists) on a
#                        Llama-style CUDA state (default: --gib 4 --reps 2
#                        --budget_s 120); run with $PYTHON (default: the
#                        torch venv /opt/torch/.venv/bin/python where it
#                        exists, else python3)
#   PYTHON_ARGS          tests/gpu/python_cuda_check.py: the dcp Python
#                        package on CUDA tensors (round trips of every
#                        dtype, the stream rule, async THREAD/PROCESS, the
#                        state-dict helpers; default: --device cuda)
#   The package comes from the bundle (python/, unpacked from the wheel with
#   libdcp.so and its libraries) through PYTHONPATH, for both Python parts.
#   Each of the four is one part: empty skips it, PART_TIMEOUT_S bounds it
#   (default 150), and its JSON lines land in parts/NAME.jsonl and in the
#   summary under parts.NAME.rows, partial if it was cut short.
#   TEST_TIMEOUT_S       per test binary (default 60: a hang must not
#                        spend a third of a 15-minute device session)
#   BENCH_TIMEOUT_S      for staging_bench (default 300)
#   CUDA_HOME            where NCCL is looked for (default /usr/local/cuda)
#   DCP_REQUIRE_GPU=1    fail (exit 3) when no GPU is visible, instead of
#                        letting the GPU tests skip
# Exit code: 0 when every test binary and the benchmark succeeded (tests that
# skip count as success), 1 otherwise, 2 for a missing bundle. A bundle built
# from other sources than the tree beside it (MANIFEST.json's source_digest,
# tests/gpu/source_digest.sh) is said on stderr and in the summary
# (bundle_matches_tree false) and fails the run: rebuild it first.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
bundle="$(cd "${1:-.gpu_bundle}" 2>/dev/null && pwd)" || {
  echo "run_gpu_checks: no bundle at ${1:-.gpu_bundle}; build it with" \
    "tests/gpu/build_gpu_bundle.sh on the Bazel machine" >&2
  exit 2
}
out="${OUT:-$PWD/gpu_checks_out}"
mkdir -p "$out/logs"
cuda_home="${CUDA_HOME:-/usr/local/cuda}"
test_timeout="${TEST_TIMEOUT_S:-60}"
bench_timeout="${BENCH_TIMEOUT_S:-300}"
bench_args="${STAGING_BENCH_ARGS:---sizes_mib=64,256,1024,8192 --json}"
device_save_args="${DEVICE_SAVE_ARGS---device_save_mib=4096 --pool_mib=256 --json}"
loop_args="${TRAINING_LOOP_ARGS:---device=auto --steps=20 --every=5 --size=1024}"
stager_args="${STAGER_ARGS---budget_s=110 stager --sizes_mib=1024,4096,16384 --streams=1 --chunks_mib=64 --reps=3}"
async_args="${ASYNC_ARGS---budget_s=60 async --mib=4096 --reps=3 --dir=/dev/shm}"
shm_args="${SHM_ARGS---budget_s=90 shm --mib=4096 --threads=1,4,8,16 --reps=2 --dir=/dev/shm}"
torch_args="${TORCH_ARGS---gib 4 --reps 2 --budget_s 120}"
python_args="${PYTHON_ARGS---device cuda}"
part_timeout="${PART_TIMEOUT_S:-150}"
default_python=python3
[[ -x /opt/torch/.venv/bin/python ]] && default_python=/opt/torch/.venv/bin/python
python="${PYTHON:-$default_python}"

# Bundled libraries first; NCCL from the CUDA install (dlopened by name).
export LD_LIBRARY_PATH="$bundle/lib:$cuda_home/lib64:$cuda_home/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for nccl in "${DCP_NCCL_LIBRARY:-}" "$cuda_home/lib64/libnccl.so.2" \
    "$cuda_home/lib/libnccl.so.2" /usr/lib/x86_64-linux-gnu/libnccl.so.2; do
  if [[ -n "$nccl" && -e "$nccl" ]]; then
    export DCP_NCCL_LIBRARY="$nccl"
    break
  fi
done
scratch="$(mktemp -d "${TMPDIR:-/tmp}/dcp-gpu-checks.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT

json_escape() {
  sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/\t/ /g' | tr '\n' ' ' |
    sed 's/ *$//'
}

gpu_info="none"
if command -v nvidia-smi >/dev/null 2>&1; then
  # An nvidia-smi that fails (installed, no driver) shows no GPU.
  gpu_info="$(nvidia-smi --query-gpu=name,driver_version,memory.total \
    --format=csv,noheader 2>&1)" && [[ -n "$gpu_info" ]] &&
    gpu_info="$(head -4 <<<"$gpu_info")" || gpu_info="none"
  nvidia-smi >"$out/logs/nvidia-smi.log" 2>&1
fi
echo "run_gpu_checks: bundle $bundle" >&2
echo "run_gpu_checks: GPU: $gpu_info" >&2
echo "run_gpu_checks: NCCL: ${DCP_NCCL_LIBRARY:-not found (NCCL tests skip)}" >&2
cp "$bundle/MANIFEST.json" "$out/bundle_manifest.json" 2>/dev/null
bundle_digest="$(grep -o '"source_digest": *"[0-9a-f]*"' \
  "$bundle/MANIFEST.json" 2>/dev/null | grep -o '[0-9a-f]\{64\}')"
tree_digest="$(tests/gpu/source_digest.sh 2>/dev/null)"
bundle_matches=true
if [[ -z "$bundle_digest" || "$bundle_digest" != "$tree_digest" ]]; then
  bundle_matches=false
  echo "run_gpu_checks: STALE BUNDLE: built from sources" \
    "${bundle_digest:-(unrecorded)}, the tree here is $tree_digest;" \
    "rebuild it (tests/gpu/build_gpu_bundle.sh) before spending device time" >&2
fi
if [[ "${DCP_REQUIRE_GPU:-0}" == 1 && "$gpu_info" == none ]]; then
  echo "run_gpu_checks: DCP_REQUIRE_GPU=1 and no nvidia-smi" >&2
  exit 3
fi

# Libraries that still do not resolve (a GPU machine older than the bundle).
missing="$(for b in "$bundle"/bin/*; do ldd "$b" 2>&1 | grep 'not found'; done |
  sort -u)"
if [[ -n "$missing" ]]; then
  echo "run_gpu_checks: unresolved libraries:" >&2
  echo "$missing" >&2
fi

overall=0
[[ "$bundle_matches" == true ]] || overall=1
results=()
gpu_skipped=()
# The summary, rewritten after every step: a run cut short by its caller's
# time limit still leaves what finished.
bench_json="null"
bench_status="not run"
device_save_json="null"
device_save_status="not run"
loop_status="not run"
loop_summary=""
part_json=()
json_items() {  # json_items ITEM...: one per line, comma-separated.
  local i=0 item
  for item in "$@"; do
    ((++i < $#)) && echo "    $item," || echo "    $item"
  done
}
write_summary() {
  {
    echo "{"
    echo "  \"ok\": $([[ $overall == 0 ]] && echo true || echo false),"
    echo "  \"bundle_matches_tree\": $bundle_matches,"
    echo "  \"python\": \"$python\","
    echo "  \"host\": \"$(uname -n | json_escape)\","
    echo "  \"gpu\": \"$(echo "$gpu_info" | json_escape)\","
    echo "  \"nccl\": \"${DCP_NCCL_LIBRARY:-}\","
    echo "  \"unresolved_libraries\": \"$(echo "$missing" | json_escape)\","
    echo "  \"skipped_with_a_gpu\": \"${gpu_skipped[*]}\","
    echo "  \"tests\": ["
    json_items "${results[@]}"
    echo "  ],"
    echo "  \"staging_bench_status\": \"$bench_status\","
    echo "  \"staging_bench_args\": \"$bench_args\","
    echo "  \"staging_bench\": $bench_json,"
    echo "  \"device_save_status\": \"$device_save_status\","
    echo "  \"device_save_args\": \"$device_save_args\","
    echo "  \"device_save\": $device_save_json,"
    echo "  \"training_loop_status\": \"$loop_status\","
    echo "  \"training_loop\": \"$loop_summary\","
    echo "  \"parts\": {"
    json_items "${part_json[@]}"
    echo "  }"
    echo "}"
  } >"$out/summary.json.tmp" &&
    mv "$out/summary.json.tmp" "$out/summary.json"
}

count() {  # count PATTERN LOG: the N of gtest's "[  TAG  ] N test" lines.
  grep -E "^\[ *$1 *\] [0-9]+ test" "$2" | head -1 | grep -oE '[0-9]+' |
    head -1
}
for exe in "$bundle"/bin/*_test; do
  [[ -x "$exe" ]] || continue
  name="$(basename "$exe")"
  log="$out/logs/$name.log"
  mkdir -p "$scratch/$name"
  start_ns=$(date +%s%N)
  TEST_TMPDIR="$scratch/$name" timeout --kill-after=10 "$test_timeout" \
    "$exe" --gtest_color=no --gtest_output="json:$out/logs/$name.gtest.json" \
    >"$log" 2>&1
  rc=$?
  secs=$(awk -v a="$start_ns" -v b="$(date +%s%N)" 'BEGIN {printf "%.2f", (b - a) / 1e9}')
  passed="$(count PASSED "$log")"
  skipped="$(count SKIPPED "$log")"
  failed="$(count FAILED "$log")"
  status=ok
  if ((rc != 0)); then status=failed; overall=1; fi
  ((rc == 124 || rc == 137)) && status=timed_out
  printf 'run_gpu_checks: %-28s %-9s passed=%s skipped=%s failed=%s (%.1fs)\n' \
    "$name" "$status" "${passed:-0}" "${skipped:-0}" "${failed:-0}" \
    "${secs:-0}" >&2
  # gtest prints "file:line: Skipped" and then the reason.
  skip_reasons="$(grep -A1 ': Skipped$' "$log" | grep -v -e ': Skipped$' -e '^--$' |
    sort -u | head -3 | json_escape)"
  results+=("{\"name\": \"$name\", \"status\": \"$status\", \"exit_code\": $rc, \"passed\": ${passed:-0}, \"skipped\": ${skipped:-0}, \"failed\": ${failed:-0}, \"seconds\": ${secs:-0}, \"skip_reasons\": \"$skip_reasons\"}")
  if [[ "$gpu_info" != none ]] && grep -q 'no CUDA device' "$log"; then
    gpu_skipped+=("$name")
  fi
done
# A machine that shows a GPU but whose tests found none (a driver older
# than the bundle's CUDA runtime) must not pass with every test skipped.
if ((${#gpu_skipped[@]} > 0)); then
  echo "run_gpu_checks: nvidia-smi shows a GPU, but ${gpu_skipped[*]}" \
    "skipped with 'no CUDA device' (driver too old for CUDA 13?)" >&2
  overall=1
fi
write_summary

# The parts: JSON lines each, kept even when a part is cut short (only
# complete lines count).
mkdir -p "$out/parts"
run_part() {  # run_part NAME ARGS COMMAND...: ARGS empty skips the part.
  local name="$1" args="$2" status rows
  shift 2
  rm -f "$out/parts/$name.jsonl"  # No rows of an earlier run into $OUT.
  if [[ -z "$args" ]]; then
    status="skipped"
  elif ! command -v "$1" >/dev/null 2>&1; then
    status="missing"
    overall=1
  else
    # shellcheck disable=SC2086  # word splitting of the flags is intended
    TMPDIR="$scratch" timeout --kill-after=10 "$part_timeout" "$@" $args \
      >"$out/parts/$name.jsonl" 2>"$out/logs/$name.log"
    local rc=$?
    status=ok
    if ((rc == 124 || rc == 137)); then
      status="timed_out (partial)"
      overall=1
    elif ((rc != 0)); then
      status="failed (exit $rc)"
      overall=1
    fi
  fi
  rows="$(grep -E '^\{.*\}$' "$out/parts/$name.jsonl" 2>/dev/null |
    paste -sd, -)"
  echo "run_gpu_checks: part $name $status" >&2
  part_json+=("\"$name\": {\"status\": \"$status\", \"args\": \"$(echo "$args" | json_escape)\", \"rows\": [$rows]}")
}
# The Python package and torch first: the checks that never ran on a GPU,
# before the benchmarks that did.
torch_script="$(dirname "$0")/torch_async_save.py"
if [[ -n "$torch_args" ]] && ! "$python" -c 'import torch' 2>/dev/null; then
  echo "run_gpu_checks: part torch skipped: $python cannot import torch" >&2
  torch_args=""
fi
if [[ -d "$bundle/python/dcp" ]]; then
  export PYTHONPATH="$bundle/python${PYTHONPATH:+:$PYTHONPATH}"
elif [[ -n "$python_args" ]]; then
  echo "run_gpu_checks: part python skipped: no python/ in the bundle" >&2
  python_args=""
fi
if [[ -n "$python_args" ]] && ! "$python" -c 'import torch' 2>/dev/null; then
  echo "run_gpu_checks: part python skipped: $python cannot import torch" >&2
  python_args=""
  # On a GPU machine the Python package's CUDA checks are the point.
  [[ "$gpu_info" != none ]] && overall=1
fi
run_part python "$python_args" "$python" "$(dirname "$0")/python_cuda_check.py"
run_part torch "$torch_args" "$python" "$torch_script"
write_summary


bench_status="missing"
[[ -x "$bundle/bin/staging_bench" ]] || overall=1
if [[ -x "$bundle/bin/staging_bench" ]]; then
  # shellcheck disable=SC2086  # word splitting of the flags is intended
  timeout --kill-after=10 "$bench_timeout" "$bundle/bin/staging_bench" \
    $bench_args >"$out/staging_bench.json" 2>"$out/logs/staging_bench.log"
  rc=$?
  if ((rc == 0)) && [[ -s "$out/staging_bench.json" ]]; then
    bench_status=ok
    bench_json="$(tail -1 "$out/staging_bench.json")"
  else
    bench_status="failed (exit $rc)"
    overall=1
  fi
  echo "run_gpu_checks: staging_bench $bench_status" >&2
fi
write_summary

device_save_status="skipped"
if [[ -x "$bundle/bin/staging_bench" && -n "$device_save_args" ]]; then
  # shellcheck disable=SC2086
  TMPDIR="$scratch" timeout --kill-after=10 "$bench_timeout" \
    "$bundle/bin/staging_bench" $device_save_args \
    >"$out/device_save.json" 2>"$out/logs/device_save.log"
  rc=$?
  if ((rc == 0)) && [[ -s "$out/device_save.json" ]]; then
    device_save_status=ok
    device_save_json="$(tail -1 "$out/device_save.json")"
  else
    device_save_status="failed (exit $rc)"
    overall=1
  fi
  echo "run_gpu_checks: device save $device_save_status" >&2
fi
write_summary

loop_status="missing"
if [[ -x "$bundle/bin/training_loop" ]]; then
  # shellcheck disable=SC2086
  timeout --kill-after=10 "$bench_timeout" "$bundle/bin/training_loop" \
    $loop_args --dir "$scratch/training_loop" \
    >"$out/logs/training_loop.log" 2>&1
  rc=$?
  if ((rc == 0)); then
    loop_status=ok
  else
    loop_status="failed (exit $rc)"
    overall=1
  fi
  echo "run_gpu_checks: training_loop $loop_status" >&2
fi
loop_summary="$(grep -E '^(tensors in|staging|restored)' "$out/logs/training_loop.log" \
  2>/dev/null | json_escape)"
write_summary

run_part stager "$stager_args" "$bundle/bin/device_bench"
run_part async "$async_args" "$bundle/bin/device_bench"
run_part shm "$shm_args" "$bundle/bin/device_bench"

write_summary
echo "run_gpu_checks: summary in $out/summary.json" >&2
exit "$overall"
