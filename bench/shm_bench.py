"""dcp.save and dcp.load of torch CPU tensors in a memory-backed directory
(tmpfs) vs a plain `write` / `readinto` of the same bytes to/from one file
there, in one process, alternated.

torch's CPU tensors are not 4 KiB aligned; memory-backed files open buffered
even when O_DIRECT is asked for, so the engine writes and reads them in
place whatever `direct_io` says. Run it once per libdcp.so to compare
builds:

    DCP_LIBRARY=/tmp/libdcp_X.so bench/torch_env.sh shm_bench.py \
        --dir /dev/shm/dcp_shm_bench --direct-io on

Prints one line (and --json: one JSON object): medians of --reps saves and
loads.
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))

import torch  # noqa: E402

import dcp  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", default="/dev/shm/dcp_shm_bench")
    p.add_argument("--tensors", type=int, default=16)
    p.add_argument("--mib", type=int, default=64, help="per tensor (fp32)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--direct-io", choices=["on", "off", "auto"], default="on")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    numel = args.mib << 18
    torch.manual_seed(0)
    src = {f"t{i}": torch.randn(numel) for i in range(args.tensors)}
    ckpt = os.path.join(args.dir, "ckpt")
    plain = os.path.join(args.dir, "plain")
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    try:
        direct = {"on": True, "off": False, "auto": None}[args.direct_io]
        saves, writes, loads, reads = [], [], [], []

        def save():
            shutil.rmtree(ckpt, ignore_errors=True)
            t0 = time.perf_counter()
            dcp.save(src, storage_writer=dcp.FileSystemWriter(
                ckpt, direct_io=direct), no_dist=True)
            saves.append(time.perf_counter() - t0)

        def write():
            if os.path.exists(plain):
                os.remove(plain)
            t0 = time.perf_counter()
            with open(plain, "wb", buffering=0) as f:
                for t in src.values():
                    f.write(memoryview(t.numpy()).cast("B"))
                os.fsync(f.fileno())
            writes.append(time.perf_counter() - t0)

        dest = {k: torch.empty_like(v) for k, v in src.items()}

        def load():
            t0 = time.perf_counter()
            dcp.load(dest, storage_reader=dcp.FileSystemReader(
                ckpt, direct_io=direct), no_dist=True)
            loads.append(time.perf_counter() - t0)

        def read():
            t0 = time.perf_counter()
            with open(plain, "rb", buffering=0) as f:
                for t in dest.values():
                    f.readinto(memoryview(t.numpy()).cast("B"))
            reads.append(time.perf_counter() - t0)

        aligned = sum(t.data_ptr() % 4096 == 0 for t in src.values()) + \
            sum(t.data_ptr() % 4096 == 0 for t in dest.values())
        for r in range(args.reps):
            steps = (save, write, load, read) if r % 2 == 0 else \
                (write, save, read, load)
            for step in steps:
                step()
            if r == 0:
                for k in src:
                    if not torch.equal(src[k], dest[k]):
                        sys.exit(f"{k} differs after the load")
        gb = args.tensors * numel * 4 / 1e9
        out = {"library": os.environ.get("DCP_LIBRARY", "default"),
               "direct_io": args.direct_io, "gb": gb,
               "aligned_tensors": aligned, "tensors": 2 * args.tensors}
        for name, times in (("save", saves), ("write", writes),
                            ("load", loads), ("read", reads)):
            out[f"{name}_gbps"] = gb / statistics.median(times)
        out["save_ratio"] = out["save_gbps"] / out["write_gbps"]
        out["load_ratio"] = out["load_gbps"] / out["read_gbps"]
        if args.json:
            print(json.dumps(out))
        else:
            print(f"{out['library']}: direct_io={args.direct_io}, "
                  f"{aligned}/{2 * args.tensors} tensors 4 KiB aligned: "
                  f"save {out['save_gbps']:.2f} GB/s vs plain write "
                  f"{out['write_gbps']:.2f} ({out['save_ratio']:.2f}x), "
                  f"load {out['load_gbps']:.2f} vs plain readinto "
                  f"{out['read_gbps']:.2f} ({out['load_ratio']:.2f}x)")
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
