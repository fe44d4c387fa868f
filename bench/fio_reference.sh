#!/usr/bin/env bash
# The disk's physical reference for dcp save/load: fio on the same directory,
# with the same size and sync semantics.
#
#   bench/fio_reference.sh DIR SIZE [--json]      e.g. /tmp/bench 1GiB
#
# Jobs (one 1 MiB-block sequential file of SIZE bytes, created fresh for
# every write, removed at the end):
#   write_buffered_fsync  buffered pwrite (psync), one fsync at the end
#                         (end_fsync=1): dcp save with sync_files, direct_io off
#   read_cold             buffered read after dropping the file's page cache
#                         (invalidate=1): dcp load after fadvise(DONTNEED)
#   write_direct          O_DIRECT, io_uring, queue depth 32, end fsync:
#                         dcp save with direct_io
#   read_direct           O_DIRECT, io_uring, queue depth 32: dcp load with
#                         direct_io
# GB/s is 1e9 bytes/s, from fio's bw_bytes (fio's job runtime includes the
# end fsync). Prints a table, or one JSON object with --json.
set -euo pipefail

usage() { sed -n '5p' "$0" | sed 's/^# *//' >&2; exit 2; }
[[ $# -ge 2 ]] || usage
DIR="$1"
SIZE_TEXT="$2"
JSON=0
[[ "${3:-}" == "--json" ]] && JSON=1
command -v fio >/dev/null || {
  echo "fio_reference.sh: fio is missing (apt-get install fio)" >&2; exit 1; }

# Sizes as dcp's ParseSize reads them: 1GiB, 256MiB, 4G, bytes.
SIZE=$(python3 - "$SIZE_TEXT" <<'PY'
import re, sys
m = re.fullmatch(r"([0-9.]+)\s*([A-Za-z]*)", sys.argv[1])
scale = {"": 1, "b": 1, "k": 1024, "kib": 1024, "kb": 1024, "m": 2**20,
         "mib": 2**20, "mb": 2**20, "g": 2**30, "gib": 2**30, "gb": 2**30}
if not m or m.group(2).lower() not in scale:
    sys.exit(f"fio_reference.sh: bad size {sys.argv[1]!r}")
print(int(float(m.group(1)) * scale[m.group(2).lower()]))
PY
)
mkdir -p "$DIR"
FILE="fio-reference.$$.dat"
trap 'rm -f "$DIR/$FILE"' EXIT

# fio_gbps NAME ARGS...: runs one job, prints its GB/s.
fio_gbps() {
  local name="$1"; shift
  fio --name="$name" --directory="$DIR" --filename="$FILE" --size="$SIZE" \
      --bs=1M --output-format=json "$@" |
    python3 -c 'import json, sys
j = json.load(sys.stdin)["jobs"][0]
print("%.4f" % (max(j["write"]["bw_bytes"], j["read"]["bw_bytes"]) / 1e9))'
}

rm -f "$DIR/$FILE"
W_BUF=$(fio_gbps write_buffered_fsync --rw=write --ioengine=psync --end_fsync=1)
R_COLD=$(fio_gbps read_cold --rw=read --ioengine=psync --invalidate=1)
rm -f "$DIR/$FILE"
W_DIR=$(fio_gbps write_direct --rw=write --ioengine=io_uring --iodepth=32 \
        --direct=1 --end_fsync=1)
R_DIR=$(fio_gbps read_direct --rw=read --ioengine=io_uring --iodepth=32 \
        --direct=1)

if ((JSON)); then
  printf '{"tool": "fio", "fio_version": "%s", "bytes": %s, "write_buffered_fsync_gbps": %s, "read_cold_gbps": %s, "write_direct_gbps": %s, "read_direct_gbps": %s}\n' \
    "$(fio --version)" "$SIZE" "$W_BUF" "$R_COLD" "$W_DIR" "$R_DIR"
else
  echo "fio reference ($(fio --version), $SIZE bytes, dir $DIR, bs=1M)"
  printf '  %-36s %s GB/s\n' \
    "write buffered + end fsync" "$W_BUF" \
    "read cold (page cache dropped)" "$R_COLD" \
    "write O_DIRECT io_uring qd32 + fsync" "$W_DIR" \
    "read O_DIRECT io_uring qd32" "$R_DIR"
fi
