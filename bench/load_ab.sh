#!/usr/bin/env bash
# Alternated A/B of cold dcp loads against fio's cold buffered read:
#
#   bench/load_ab.sh SIZE ROUNDS VARIANT...
#   VARIANT = NAME:CONFIG[:FLAG,VALUE,...]   e.g.
#   bench/load_ab.sh 4294967296 5 p8:posix-buffered:--max-buffered-read,8388608 \
#                                 p1:posix-buffered
#
# Each round: fio writes a SIZE file (psync, bs 1M, end fsync) and reads it
# back cold (invalidate=1), then for every variant in order a fresh dcp save
# and a cold load of it (`io_bench --child save|load`, FLAGs go to the load).
# Prints one line per round, GB/s. The disk here moves between rounds, so
# compare variants within a round; run it on an idle machine (no builds).
# Needs `bazel build //bench:io_bench`, fio and python3. Works in a fresh
# directory under $DIR (default /tmp, the disk measured), removed at the end.
set -euo pipefail
cd "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/.."
SIZE=${1:?usage: load_ab.sh SIZE ROUNDS VARIANT...}
ROUNDS=${2:?usage: load_ab.sh SIZE ROUNDS VARIANT...}
shift 2
[[ $# -gt 0 ]] || { echo "load_ab.sh: no VARIANT" >&2; exit 2; }
BENCH=bazel-bin/bench/io_bench
[[ -x $BENCH ]] || { echo "load_ab.sh: build //bench:io_bench first" >&2; exit 2; }
DIR=$(mktemp -d "${DIR:-/tmp}/dcp-load-ab.XXXXXX")
trap 'rm -rf "$DIR"' EXIT
# Prints "%.3f" of the JSON value at the given keys (stdin).
field() { python3 -c 'import functools,json,sys; print("%.3f" % functools.reduce(lambda v, k: v[int(k) if k.isdigit() else k], sys.argv[1:], json.load(sys.stdin)))' "$@"; }
for round in $(seq 1 "$ROUNDS"); do
  rm -f "$DIR/fio.dat"
  sync
  fio --name=w --filename="$DIR/fio.dat" --size="$SIZE" --bs=1M --rw=write \
    --ioengine=psync --end_fsync=1 --output-format=json >/dev/null
  sync
  fio_read=$(fio --name=r --filename="$DIR/fio.dat" --size="$SIZE" --bs=1M \
    --rw=read --ioengine=psync --invalidate=1 --output-format=json |
    field jobs 0 read bw_bytes)
  fio_read=$(python3 -c "print('%.3f' % ($fio_read / 1e9))")
  rm -f "$DIR/fio.dat"
  line="round $round fio_read_cold $fio_read"
  for variant in "$@"; do
    IFS=: read -r name config flags <<<"$variant"
    IFS=, read -r -a extra <<<"${flags:-}"
    rm -rf "$DIR/ck"
    sync
    "$BENCH" --child save --size "$SIZE" --config "$config" --dir "$DIR/ck" >/dev/null
    load=$("$BENCH" --child load --size "$SIZE" --config "$config" \
      --dir "$DIR/ck" "${extra[@]}" | field gbps)
    line="$line $name $load"
  done
  echo "$line"
done
