#!/usr/bin/env bash
# CI's sanitizer step: the whole test suite under AddressSanitizer +
# UndefinedBehaviorSanitizer (--config=asan) and the concurrency-heavy
# packages under ThreadSanitizer (--config=tsan). README "Continuous
# integration" gives the budget and the measured times.
#
#   tools/sanitize.sh [asan|tsan]...     (default: both)
#
# ASan/UBSan runs every test (`//...`, building only what the tests need);
# TSan runs the packages where threads meet: engine, staging, io and comm
# (their unit tests), the multi-process comm tests, and the engine's
# asynchronous and distributed tests of tests/. GPU tests (tag gpu) and
# tests tagged no_asan / no_tsan (with the reason in their BUILD file) are
# left out by the configurations in .bazelrc.
#
# Each configuration builds into its own output tree (platform suffix), so
# the plain build is kept; BAZEL_STARTUP (e.g. --output_base=DIR) is passed
# to bazel before the command. Exit status: bazel's (0 when all passed).
set -euo pipefail
cd "$(dirname "$0")/.."

readonly ASAN_TARGETS=(//...)
readonly TSAN_TARGETS=(
  //engine/...
  //staging/...
  //io/...
  //comm/...
  //tests/comm/...
  //tests:async_save_test
  //tests:async_save_exit_test
  //tests:async_save_distributed_test
  //tests:stream_order_test
  //tests:distributed_test
  //tests:decided_commit_test
  //capi:c_api_test
  //third_party:absl_tsan_annotations_test
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
  bazel "${startup[@]}" test --config="$config" --build_tests_only \
    "${targets[@]}" || status=$?
  echo "sanitize: $config: exit $status in $((SECONDS - start)) s"
  ((status == 0)) || rc=$status
done
exit "$rc"
