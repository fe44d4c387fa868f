#!/usr/bin/env bash
# CI's sanitizer step: a budgeted subset of the suite under AddressSanitizer
# + UndefinedBehaviorSanitizer (--config=asan) and ThreadSanitizer
# (--config=tsan), chosen to fit CI's time limit (README "Continuous
# integration" gives the budget and the measured times).
#
#   tools/sanitize.sh [asan|tsan]...     (default: both)
#
# ASan/UBSan runs the tests of every decoder of untrusted bytes (metadata,
# plan, value and write-results codecs, safetensors/HF index, the fuzz
# corpora, MEGA headers, commit journals, compressed blocks) and the
# engine's save/load round trips; TSan runs the
# concurrency-heavy tests (async save, stager and staging pipeline,
# process groups, rendezvous, the C ABI's async calls, the read windows'
# shared buffers). The whole suite under both configurations is
# `bazel test --config=asan //...` (from a clean cache about 36 min on 2
# cores for ASan alone: more than CI's budget holds), run by hand.
#
# Each configuration builds into its own output tree (platform suffix), so
# the plain build is kept; BAZEL_STARTUP (e.g. --output_base=DIR) is passed
# to bazel before the command. Exit status: bazel's (0 when all passed).
set -euo pipefail
cd "$(dirname "$0")/.."

readonly ASAN_TARGETS=(
  //fuzz:all
  //engine:write_results_codec_test
  //io:metadata_format_test
  //io:safetensors_test
  //io:file_system_storage_test
  //io:fs_directory_test
  //io:fs_read_window_test
  //io:extensions_storage_test
  //io:mega_format_test
  //io:commit_journal_test
  //io:hf_quantized_storage_test
  //planner:plan_codec_test
  //planner:value_codec_test
  //tests:engine_roundtrip_test
  //tests:hf_checkpoint_test
  //tests:mega_checkpoint_test
  //tests:crash_test
  //tests:native_crash_test
  //tests:decided_commit_test
  //tools:inspect_test
)
readonly TSAN_TARGETS=(
  //tests:async_save_test
  //staging:stager_test
  //staging:staging_pipeline_test
  //comm:store_process_group_test
  //comm:process_group_test
  //io:io_engine_test
  //io:io_engine_behaviour_test
  //io:file_system_storage_test
)

configs=("$@")
((${#configs[@]})) || configs=(asan tsan)
# shellcheck disable=SC2206
startup=(${BAZEL_STARTUP:-})
rc=0
for config in "${configs[@]}"; do
  case "$config" in
    asan) targets=("${ASAN_TARGETS[@]}") ;;
    tsan) targets=("${TSAN_TARGETS[@]}") ;;
    *) echo "usage: tools/sanitize.sh [asan|tsan]..." >&2; exit 2 ;;
  esac
  start=$SECONDS
  status=0
  bazel "${startup[@]}" test --config="$config" "${targets[@]}" || status=$?
  echo "sanitize: $config: exit $status in $((SECONDS - start)) s"
  ((status == 0)) || rc=$status
done
exit "$rc"
