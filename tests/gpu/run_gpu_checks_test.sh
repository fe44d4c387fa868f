#!/usr/bin/env bash
# Tests run_gpu_checks.sh's bookkeeping against fake bundles (no GPU, no real
# binaries): passing, skipping and failing tests, a missing benchmark, a
# missing bundle, and the exit codes and summary.json fields it promises.
set -uo pipefail
script="$(dirname "$0")/run_gpu_checks.sh"
[[ -x "$script" ]] || script="${TEST_SRCDIR:-}/${TEST_WORKSPACE:-}/tests/gpu/run_gpu_checks.sh"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0
expect() {  # expect DESCRIPTION COMMAND...
  if ! "${@:2}"; then
    echo "FAIL: $1" >&2
    failures=$((failures + 1))
  fi
}

# The digest of the tree the runner runs beside (its own root), as
# build_gpu_bundle.sh records it.
root="$(cd "$(dirname "$script")/../.." && pwd)"
digest="$(cd "$root" && tests/gpu/source_digest.sh)"

make_bundle() {  # make_bundle DIR [fail]
  mkdir -p "$1/bin" "$1/lib"
  echo "{\"commit\": \"fake\", \"source_digest\": \"$digest\"}" \
    >"$1/MANIFEST.json"
  printf '#!/bin/sh\necho "[  PASSED  ] 3 tests."\n' >"$1/bin/a_test"
  printf '#!/bin/sh\necho "x.cc:1: Skipped"\necho "no CUDA device"\n%s\n' \
    'echo "[  PASSED  ] 0 tests."; echo "[  SKIPPED ] 2 tests, listed below:"' \
    >"$1/bin/b_test"
  printf '#!/bin/sh\necho "{\\"stager_gbps\\": 1.5, \\"args\\": \\"$*\\"}"\n' \
    >"$1/bin/staging_bench"
  printf '#!/bin/sh\necho "restored step-20: args $*"\n' \
    >"$1/bin/training_loop"
  # device_bench: a header line, a row naming its subcommand, the end line;
  # "sleep" in its args makes it print one line and hang (a cut part).
  cat >"$1/bin/device_bench" <<'SH'
#!/bin/sh
echo '{"part": "header"}'
case "$*" in *sleep*) exec sleep 30 ;; esac
echo "{\"args\": \"$*\"}"
echo '{"done": true}'
SH
  if [[ "${2:-}" == fail ]]; then
    printf '#!/bin/sh\necho "[  FAILED  ] 1 test, listed below:"\nexit 1\n' \
      >"$1/bin/c_test"
  fi
  chmod +x "$1"/bin/*
}

# All pass or skip: exit 0, counts and the benchmark's JSON in the summary.
make_bundle "$tmp/ok"
OUT="$tmp/out_ok" STAGING_BENCH_ARGS="--sizes_mib=64 --json" \
  "$script" "$tmp/ok" 2>"$tmp/ok.err"
expect "all-pass exit code" test $? -eq 0
s="$tmp/out_ok/summary.json"
expect "ok true" grep -q '"ok": true' "$s"
expect "a_test passed=3" grep -q '"name": "a_test", "status": "ok", "exit_code": 0, "passed": 3' "$s"
expect "b_test skipped=2 with reason" grep -q '"skipped": 2, .*"skip_reasons": "no CUDA device"' "$s"
expect "bench JSON embedded" grep -q '"staging_bench": {"stager_gbps": 1.5, "args": "--sizes_mib=64 --json"}' "$s"
expect "device save run with its default flags" grep -q '"device_save": {"stager_gbps": 1.5, "args": "--device_save_mib=4096 --pool_mib=256 --json"}' "$s"
expect "device save ok" grep -q '"device_save_status": "ok"' "$s"
expect "training loop on the GPU" grep -q '"training_loop": "restored step-20: args --device=auto --steps=20 --every=5 --size=1024 --dir ' "$s"
expect "training loop ok" grep -q '"training_loop_status": "ok"' "$s"
expect "summary is JSON" /usr/bin/python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$s"
expect "per-test log" test -s "$tmp/out_ok/logs/a_test.log"
expect "manifest copied" test -s "$tmp/out_ok/bundle_manifest.json"
expect "bundle matches the tree" grep -q '"bundle_matches_tree": true' "$s"

# A bundle built from other sources: said, and the run fails.
make_bundle "$tmp/stale"
sed -i 's/"source_digest": "[0-9a-f]*"/"source_digest": "0123"/' \
  "$tmp/stale/MANIFEST.json"
OUT="$tmp/out_stale" STAGING_BENCH_ARGS="--sizes_mib=64 --json" \
  "$script" "$tmp/stale" 2>"$tmp/stale.err"
expect "stale bundle exit code" test $? -eq 1
expect "stale bundle in the summary" grep -q '"bundle_matches_tree": false' \
  "$tmp/out_stale/summary.json"
expect "stale bundle said" grep -q 'STALE BUNDLE' "$tmp/stale.err"
expect "stager part rows" grep -q '"stager": {"status": "ok", "args": "--budget_s=110 stager --sizes_mib=1024,4096,16384 --streams=1 --chunks_mib=64 --reps=3", "rows": \[{"part": "header"},{"args": "--budget_s=110 stager --sizes_mib=1024,4096,16384 --streams=1 --chunks_mib=64 --reps=3"},{"done": true}\]}' "$s"
expect "async part ok" grep -q '"async": {"status": "ok"' "$s"
expect "shm part ok" grep -q '"shm": {"status": "ok"' "$s"
expect "part lines kept" test -s "$tmp/out_ok/parts/shm.jsonl"

# A part cut by its time limit keeps its complete lines and fails the run;
# an empty part argument skips the part.
OUT="$tmp/out_cut" PART_TIMEOUT_S=1 STAGER_ARGS="stager sleep" ASYNC_ARGS="" \
  SHM_ARGS="" TORCH_ARGS="" "$script" "$tmp/ok" 2>/dev/null
expect "cut part exit code" test $? -eq 1
s="$tmp/out_cut/summary.json"
expect "cut part partial" grep -q '"stager": {"status": "timed_out (partial)", "args": "stager sleep", "rows": \[{"part": "header"}\]}' "$s"
expect "skipped part" grep -q '"async": {"status": "skipped", "args": "", "rows": \[\]}' "$s"
expect "cut summary is JSON" /usr/bin/python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$s"

# A failing test: exit 1, ok false, the failure counted.
make_bundle "$tmp/bad" fail
OUT="$tmp/out_bad" "$script" "$tmp/bad" 2>/dev/null
expect "failing exit code" test $? -eq 1
expect "ok false" grep -q '"ok": false' "$tmp/out_bad/summary.json"
expect "c_test failed=1" grep -q '"name": "c_test", "status": "failed", "exit_code": 1, "passed": 0, "skipped": 0, "failed": 1' "$tmp/out_bad/summary.json"

# No benchmark in the bundle: a failure, not a silent pass.
make_bundle "$tmp/nobench"
rm "$tmp/nobench/bin/staging_bench" "$tmp/nobench/bin/device_bench"
OUT="$tmp/out_nobench" "$script" "$tmp/nobench" 2>/dev/null
expect "missing bench exit code" test $? -eq 1
expect "bench missing" grep -q '"staging_bench_status": "missing"' "$tmp/out_nobench/summary.json"
expect "device save skipped" grep -q '"device_save_status": "skipped"' "$tmp/out_nobench/summary.json"
expect "part missing" grep -q '"stager": {"status": "missing"' "$tmp/out_nobench/summary.json"

# A part skipped in a run into a used $OUT shows no rows of the run before.
OUT="$tmp/out_ok" ASYNC_ARGS="" "$script" "$tmp/ok" 2>/dev/null
expect "reused OUT exit code" test $? -eq 0
expect "skipped part has no old rows" grep -q '"async": {"status": "skipped", "args": "", "rows": \[\]}' "$tmp/out_ok/summary.json"

# An nvidia-smi that fails (no driver) shows no GPU: skips stay skips.
mkdir -p "$tmp/nodriver"
printf '#!/bin/sh\necho "NVIDIA-SMI has failed"\nexit 9\n' >"$tmp/nodriver/nvidia-smi"
chmod +x "$tmp/nodriver/nvidia-smi"
OUT="$tmp/out_nodriver" PATH="$tmp/nodriver:$PATH" "$script" "$tmp/ok" 2>/dev/null
expect "failing nvidia-smi exit code" test $? -eq 0
expect "failing nvidia-smi is no GPU" grep -q '"gpu": "none"' "$tmp/out_nodriver/summary.json"

# DEVICE_SAVE_ARGS empty: the second run is skipped.
OUT="$tmp/out_nosave" DEVICE_SAVE_ARGS="" "$script" "$tmp/ok" 2>/dev/null
expect "no device save exit code" test $? -eq 0
expect "device save skipped on request" grep -q '"device_save": null' "$tmp/out_nosave/summary.json"

# nvidia-smi shows a GPU, yet a test skipped for want of one (a driver
# older than the bundle's CUDA runtime): a failure, naming the test.
mkdir -p "$tmp/fakebin"
printf '#!/bin/sh\necho "NVIDIA H200, 580.00, 143771 MiB"\n' >"$tmp/fakebin/nvidia-smi"
chmod +x "$tmp/fakebin/nvidia-smi"
OUT="$tmp/out_gpu" PATH="$tmp/fakebin:$PATH" STAGER_ARGS="" ASYNC_ARGS="" \
  SHM_ARGS="" "$script" "$tmp/ok" 2>"$tmp/gpu.err"
expect "skipped with a GPU exit code" test $? -eq 1
expect "skipped with a GPU named" grep -q '"skipped_with_a_gpu": "b_test"' "$tmp/out_gpu/summary.json"
expect "skipped with a GPU said" grep -q "b_test skipped with 'no CUDA device'" "$tmp/gpu.err"

# A run killed mid-way leaves the summary of what finished.
{ (OUT="$tmp/out_killed" PART_TIMEOUT_S=30 STAGER_ARGS="stager sleep" \
  timeout -s KILL 5 "$script" "$tmp/ok") >/dev/null 2>&1; } 2>/dev/null
s="$tmp/out_killed/summary.json"
expect "killed run left a summary" /usr/bin/python3 -c 'import json,sys; d = json.load(open(sys.argv[1])); assert d["tests"] and d["staging_bench_status"] == "ok"' "$s"

# No bundle at all: exit 2 with advice.
OUT="$tmp/out_none" "$script" "$tmp/does-not-exist" 2>"$tmp/none.err"
expect "missing bundle exit code" test $? -eq 2
expect "advice names the builder" grep -q build_gpu_bundle.sh "$tmp/none.err"

if ((failures > 0)); then
  echo "$failures check(s) failed" >&2
  exit 1
fi
echo "all checks passed"
