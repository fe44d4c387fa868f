#!/usr/bin/env bash
# Runs fio and dcp's io_bench on the same directory, size and sync semantics
# and prints one JSON line per measurement plus a ratio table.
#
#   bench/fio_compare.sh [DIR] [SIZE_MB]     (defaults: /tmp/dcp_fio, 1024)
#
# Matching modes:
#   buffered write + one fsync at the end  <->  dcp save, direct=0 (fsync on)
#   O_DIRECT write (queue depth 32)        <->  dcp save, direct=1
#   cold sequential read (cache dropped)   <->  dcp load after fadvise(DONTNEED)
#   O_DIRECT read                          <->  (reference)
set -euo pipefail
DIR="${1:-/tmp/dcp_fio}"
SIZE_MB="${2:-1024}"
cd "$(dirname "$0")/.."
mkdir -p "$DIR"
bazel build -c opt //bench:io_bench >/dev/null 2>&1
BENCH="$(bazel info -c opt bazel-bin 2>/dev/null)/bench/io_bench"

fio_gbps() {  # name, fio args...; prints GB/s (1e9 bytes/s)
  local name="$1"; shift
  fio --name="$name" --directory="$DIR" --filename=fio.dat --size="${SIZE_MB}M" \
      --bs=1M --output-format=json "$@" 2>/dev/null |
    python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; \
print("%.3f" % ((j["write"]["bw_bytes"] or j["read"]["bw_bytes"])/1e9))'
}

rm -f "$DIR/fio.dat"
W_BUF=$(fio_gbps wbuf --rw=write --ioengine=psync --end_fsync=1)
R_COLD=$(fio_gbps rcold --rw=read --ioengine=psync --invalidate=1)
rm -f "$DIR/fio.dat"
W_DIR=$(fio_gbps wdirect --rw=write --ioengine=io_uring --iodepth=32 --direct=1)
R_DIR=$(fio_gbps rdirect --rw=read --ioengine=io_uring --iodepth=32 --direct=1)
rm -f "$DIR/fio.dat"
echo "{\"tool\": \"fio\", \"size_mb\": $SIZE_MB, \"write_buffered_fsync_gbps\": $W_BUF, \"write_direct_gbps\": $W_DIR, \"read_cold_gbps\": $R_COLD, \"read_direct_gbps\": $R_DIR}"

for mode in uring posix; do
  for direct in 0 1; do
    out=$("$BENCH" --dir="$DIR/ckpt" --size_mb="$SIZE_MB" --mode=$mode --direct=$direct --cold=1)
    rm -rf "$DIR/ckpt"
    echo "$out"
    python3 - "$out" "$W_BUF" "$W_DIR" "$R_COLD" "$R_DIR" "$direct" <<'PY'
import json, sys
r = json.loads(sys.argv[1]); wbuf, wdir, rcold, rdir = map(float, sys.argv[2:6])
direct = sys.argv[6] == "1"
fio_w, fio_r = (wdir, rdir) if direct else (wbuf, rcold)
print("  %-8s direct=%d  save %.3f GB/s = %.2fx fio %s write   load %.3f GB/s = %.2fx fio %s read"
      % (r["engine"], direct, r["save_gbps"], r["save_gbps"] / fio_w,
         "direct" if direct else "buffered+fsync", r["load_gbps"],
         r["load_gbps"] / fio_r, "direct" if direct else "cold"))
PY
  done
done
