#!/usr/bin/env bash
# One side-by-side run, on one directory: the disk (fio), dcp (`dcp demo`)
# and the peer (PyTorch's torch.distributed.checkpoint, bench/torch_compare.py)
# saving and cold-loading the same synthetic state.
#
#   bench/run_io_comparison.sh [--size 1GiB] [--dir D] [--repeat 3]
#                              [--seed 1] [--dcp PATH] [--out FILE] [--json]
#
# Each repetition runs, in this order: bench/fio_reference.sh; `dcp demo
# --mode save` then `dcp demo --mode load` (cold: the demo drops the page
# cache of the checkpoint first and verifies every byte); torch_compare.py
# (save and cold load in separate processes, every byte verified). The first
# repetition also proves that dcp's checkpoint holds exactly the bytes that
# the Python generation gives torch (torch_compare.py check-dcp). The table
# shows medians; --out FILE keeps every raw measurement (JSON lines).
#
# Peak RSS is ru_maxrss of the measured process. Both save processes hold the
# generated state; both load processes hold the expected state (for the
# byte check) and the destination state.
#
# Needs fio and python3; creates bench/.venv with torch and numpy from PyPI
# when they are missing (a large download, once). --dcp PATH skips the
# `bazel build //tools:dcp`.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

SIZE="1GiB"; DIR="${TMPDIR:-/tmp}"; REPEAT=3; SEED=1; DCP=""; OUT=""; JSON=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --size) SIZE="$2"; shift 2 ;;
    --dir) DIR="$2"; shift 2 ;;
    --repeat) REPEAT="$2"; shift 2 ;;
    --seed) SEED="$2"; shift 2 ;;
    --dcp) DCP="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --json) JSON=1; shift ;;
    -h | --help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run_io_comparison.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
log() { echo "run_io_comparison: $*" >&2; }

# The venv with the current PyTorch (only when missing).
VENV="$ROOT/bench/.venv"
PY="$VENV/bin/python"
if ! "$PY" -c 'import torch, numpy' 2>/dev/null; then
  log "installing torch and numpy from PyPI into $VENV (once)"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q -r "$ROOT/bench/requirements.txt" >&2
fi

if [[ -z "$DCP" ]]; then
  bazel build //tools:dcp >&2
  DCP="$ROOT/bazel-bin/tools/dcp"
fi
DCP="$(realpath "$DCP")"

mkdir -p "$DIR"
WORK="$(mktemp -d "$DIR/dcp-io-comparison.XXXXXX")"
RESULTS="$WORK.jsonl"
trap 'rm -rf "$WORK" "$RESULTS"' EXIT
: > "$RESULTS"

# with_rss TAG CMD...: runs CMD (which prints one JSON object on its last
# stdout line), adds peak RSS and TAG, appends it to the results.
with_rss() {
  local tag="$1"; shift
  "$PY" - "$tag" "$@" >> "$RESULTS" <<'PY'
import json, resource, subprocess, sys
p = subprocess.run(sys.argv[2:], stdout=subprocess.PIPE, text=True)
if p.returncode != 0:
    sys.exit(f"run_io_comparison: failed ({p.returncode}): {' '.join(sys.argv[2:])}")
d = json.loads(p.stdout.strip().splitlines()[-1])
d["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
d["measurement"] = sys.argv[1]
print(json.dumps(d))
PY
}

log "size $SIZE, dir $WORK, $REPEAT repetitions, dcp $DCP, $("$PY" -c 'import torch; print("torch", torch.__version__)')"
log "started $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
for ((rep = 1; rep <= REPEAT; rep++)); do
  log "repetition $rep/$REPEAT: fio"
  bench/fio_reference.sh "$WORK" "$SIZE" --json |
    "$PY" -c 'import json,sys; d=json.load(sys.stdin); d["measurement"]="fio"; print(json.dumps(d))' \
    >> "$RESULTS"

  log "repetition $rep/$REPEAT: dcp save, load"
  with_rss dcp_save "$DCP" demo --mode save --dir "$WORK/dcp" --seed "$SEED" \
    --size "$SIZE" --json
  if ((rep == 1)); then
    "$PY" bench/torch_compare.py check-dcp --dir "$WORK/dcp" --seed "$SEED" \
      --size "$SIZE" --json |
      "$PY" -c 'import json,sys; d=json.load(sys.stdin); d["measurement"]="identity"; print(json.dumps(d))' \
      >> "$RESULTS"
  fi
  with_rss dcp_load "$DCP" demo --mode load --dir "$WORK/dcp" --seed "$SEED" \
    --size "$SIZE" --json
  rm -rf "$WORK/dcp"

  log "repetition $rep/$REPEAT: torch save, load"
  "$PY" bench/torch_compare.py run --dir "$WORK" --seed "$SEED" \
    --size "$SIZE" --json |
    "$PY" -c 'import json,sys; d=json.load(sys.stdin); d["measurement"]="torch"; print(json.dumps(d))' \
    >> "$RESULTS"
done
log "finished $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
[[ -n "$OUT" ]] && cp "$RESULTS" "$OUT"

"$PY" - "$RESULTS" "$JSON" "$SIZE" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
want_json, size = sys.argv[2] == "1", sys.argv[3]
by = lambda m: [r for r in rows if r["measurement"] == m]
med = lambda m, k: statistics.median(r[k] for r in by(m))
fio, torch_runs = by("fio"), by("torch")
ident = by("identity")[0]
state = by("dcp_save")[0]["bytes"]
if not all(r["verified"] for r in by("dcp_load") + torch_runs) or not ident["identical"]:
    sys.exit("run_io_comparison: a verification FAILED: " + json.dumps(rows))
s = {
    "size": size, "bytes": state, "repetitions": len(fio),
    "torch_version": torch_runs[0]["torch_version"],
    "fio_write_buffered_fsync_gbps": med("fio", "write_buffered_fsync_gbps"),
    "fio_read_cold_gbps": med("fio", "read_cold_gbps"),
    "fio_write_direct_gbps": med("fio", "write_direct_gbps"),
    "fio_read_direct_gbps": med("fio", "read_direct_gbps"),
    "dcp_save_gbps": med("dcp_save", "save_gbps"),
    "dcp_load_gbps": med("dcp_load", "load_gbps"),
    "torch_save_gbps": med("torch", "save_gbps"),
    "torch_load_gbps": med("torch", "load_gbps"),
    "dcp_save_peak_rss_bytes": med("dcp_save", "peak_rss_bytes"),
    "dcp_load_peak_rss_bytes": med("dcp_load", "peak_rss_bytes"),
    "torch_save_peak_rss_bytes": med("torch", "save_peak_rss_bytes"),
    "torch_load_peak_rss_bytes": med("torch", "load_peak_rss_bytes"),
    "torch_save_rss_before_bytes": med("torch", "save_rss_before_bytes"),
    "identical_bytes_checked": ident["bytes_compared"],
}
s["dcp_save_vs_fio_buffered"] = s["dcp_save_gbps"] / s["fio_write_buffered_fsync_gbps"]
s["dcp_load_vs_fio_cold"] = s["dcp_load_gbps"] / s["fio_read_cold_gbps"]
s["dcp_save_vs_fio_direct"] = s["dcp_save_gbps"] / s["fio_write_direct_gbps"]
s["dcp_load_vs_fio_direct"] = s["dcp_load_gbps"] / s["fio_read_direct_gbps"]
s["dcp_save_vs_torch"] = s["dcp_save_gbps"] / s["torch_save_gbps"]
s["dcp_load_vs_torch"] = s["dcp_load_gbps"] / s["torch_load_gbps"]
# Per-repetition values, to show the spread.
spread = lambda m, k: [round(r[k], 3) for r in by(m)]
s["all"] = {
    "fio_write_buffered_fsync_gbps": spread("fio", "write_buffered_fsync_gbps"),
    "fio_read_cold_gbps": spread("fio", "read_cold_gbps"),
    "fio_write_direct_gbps": spread("fio", "write_direct_gbps"),
    "fio_read_direct_gbps": spread("fio", "read_direct_gbps"),
    "dcp_save_gbps": spread("dcp_save", "save_gbps"),
    "dcp_load_gbps": spread("dcp_load", "load_gbps"),
    "torch_save_gbps": spread("torch", "save_gbps"),
    "torch_load_gbps": spread("torch", "load_gbps"),
}
if want_json:
    print(json.dumps(s))
    sys.exit(0)
mib = lambda b: f"{b / 2**20:.0f} MiB"
print(f"dcp vs fio vs torch {s['torch_version']}: {state} bytes ({size}), "
      f"median of {s['repetitions']}; dcp's checkpoint == the Python "
      f"generation ({ident['bytes_compared']} bytes compared)")
print(f"  {'':28} {'fio':>22} {'dcp':>9} {'torch':>9} {'dcp/fio':>8} {'dcp/torch':>9}")
print(f"  {'save GB/s':28} {s['fio_write_buffered_fsync_gbps']:>9.3f} (buf+fsync) "
      f"{s['dcp_save_gbps']:>9.3f} {s['torch_save_gbps']:>9.3f} "
      f"{s['dcp_save_vs_fio_buffered']:>8.2f} {s['dcp_save_vs_torch']:>9.2f}")
print(f"  {'load GB/s (cold)':28} {s['fio_read_cold_gbps']:>9.3f} (cold)      "
      f"{s['dcp_load_gbps']:>9.3f} {s['torch_load_gbps']:>9.3f} "
      f"{s['dcp_load_vs_fio_cold']:>8.2f} {s['dcp_load_vs_torch']:>9.2f}")
print(f"  {'save GB/s vs fio O_DIRECT':28} {s['fio_write_direct_gbps']:>9.3f} (direct)    "
      f"{s['dcp_save_gbps']:>9.3f} {'':>9} {s['dcp_save_vs_fio_direct']:>8.2f}")
print(f"  {'load GB/s vs fio O_DIRECT':28} {s['fio_read_direct_gbps']:>9.3f} (direct)    "
      f"{s['dcp_load_gbps']:>9.3f} {'':>9} {s['dcp_load_vs_fio_direct']:>8.2f}")
print(f"  {'save peak RSS':28} {'':>22} {mib(s['dcp_save_peak_rss_bytes']):>9} "
      f"{mib(s['torch_save_peak_rss_bytes']):>9}   (state {mib(state)})")
print(f"  {'load peak RSS':28} {'':>22} {mib(s['dcp_load_peak_rss_bytes']):>9} "
      f"{mib(s['torch_load_peak_rss_bytes']):>9}   (expected + destination "
      f"{mib(2 * state)})")
print(f"  torch RSS after import + generation, before save: "
      f"{mib(s['torch_save_rss_before_bytes'])}")
for k, v in s["all"].items():
    print(f"  all {k}: {v}")
PY
