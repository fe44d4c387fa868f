"""PyTorch's consolidation of the shards bench/hf_bench_extra leaves, for
docs/BENCHMARKS.md section 7:

    bazel-bin/bench/hf_bench_extra consolidate --dir /tmp/hfx   # first
    bench/torch_env.sh hf_torch_consolidate.py --shards /tmp/hfx/shards \
        --out /tmp/hfx/torch_out --repeat 3

Each repetition drops the shards from the page cache, runs
torch.distributed.checkpoint._consolidate_hf_safetensors.
consolidate_safetensors_files(num_threads=1) into one output file, fsyncs
it, and prints its time and the peak RSS above the RSS before the call
(ru_maxrss; the process's first call only, later ones cannot lower it).
"""

import argparse
import json
import os
import resource
import shutil
import statistics
import struct
import time

from torch.distributed.checkpoint import _consolidate_hf_safetensors as c


def rss_kb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def drop(path):
    for root, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)


def tensor_names_and_bytes(sharded):
    names, total = set(), 0
    for name in os.listdir(sharded):
        with open(os.path.join(sharded, name), "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
        for k, v in header.items():
            if k != "__metadata__":
                names.add(k)
                total += v["data_offsets"][1] - v["data_offsets"][0]
    return names, total


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shards", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    sharded = os.path.join(a.shards, "sharded")
    names, total = tensor_names_and_bytes(sharded)
    mapping = {n: 1 for n in names}
    rates = []
    for r in range(a.repeat):
        shutil.rmtree(a.out, ignore_errors=True)
        os.makedirs(a.out)
        drop(sharded)
        before = rss_kb()
        start = time.monotonic()
        c.consolidate_safetensors_files(sharded, a.out, mapping, num_threads=1)
        for name in os.listdir(a.out):
            fd = os.open(os.path.join(a.out, name), os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        secs = time.monotonic() - start
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        rates.append(total / secs / 1e9)
        print(f"torch consolidate run {r}: {secs:.2f} s, {rates[-1]:.2f} GB/s, "
              f"peak RSS +{(peak - before) >> 10} MiB (run 0 meaningful)")
    print(f"torch consolidate median: {statistics.median(rates):.2f} GB/s of "
          f"{total} bytes")


if __name__ == "__main__":
    main()
