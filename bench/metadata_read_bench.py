"""Cost per item of reading a checkpoint's metadata in Python (inspecting
it without loading), dcp's against torch.distributed.checkpoint's on the
identical state dict: N items of an optimizer-like state (a 1-d tensor,
a 0-d step and a plain int per parameter, nested model/optim dicts).

    DCP_LIBRARY=bazel-bin/capi/libdcp.so PYTHONPATH=python \\
      .venv/bin/python bench/metadata_read_bench.py --params 30000 --reps 3

Saves both checkpoints once (dcp.save, torch's DCP save), then each
(implementation, repetition) reads in a fresh process, dcp and torch
alternated: the read of the metadata and a walk of every item
(state_dict_metadata, and storage_data's entries). Prints one line per
run and the medians in microseconds per item."""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def state(params):
    import torch
    model = {f"layers.{i}.weight": torch.full((4,), float(i))
             for i in range(params)}
    optim = {"state": {f"layers.{i}.weight": {
        "step": torch.tensor(float(i)),
        "exp_avg": torch.zeros(4)} for i in range(params)},
        "param_groups": [{"lr": 1e-3, "params": list(range(params))}]}
    return {"model": model, "optim": optim,
            "extra": {f"counter{i}": i for i in range(params)}}


def save(directory, params):
    import warnings
    warnings.filterwarnings("ignore")
    import torch.distributed.checkpoint as tdcp
    import dcp
    sd = state(params)
    dcp.save(sd, checkpoint_id=os.path.join(directory, "dcp"))
    tdcp.save(sd, checkpoint_id=os.path.join(directory, "torch"),
              no_dist=True)


def child(impl, directory):
    import warnings
    warnings.filterwarnings("ignore")
    if impl == "dcp":
        import dcp
        t0 = time.perf_counter()
        md = dcp.read_metadata(os.path.join(directory, "dcp"))
    else:
        import torch.distributed.checkpoint as tdcp
        t0 = time.perf_counter()
        md = tdcp.FileSystemReader(
            os.path.join(directory, "torch")).read_metadata()
    t1 = time.perf_counter()
    items = sum(1 for _ in md.state_dict_metadata.values())
    storage = sum(1 for _ in md.storage_data.items())
    t2 = time.perf_counter()
    print(json.dumps({"read": t1 - t0, "walk": t2 - t1, "items": items,
                      "storage": storage}))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--params", type=int, default=30000)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--child", nargs=2)
    p.add_argument("--save", nargs=2)
    args = p.parse_args()
    if args.child:
        child(*args.child)
        return
    if args.save:
        save(args.save[0], int(args.save[1]))
        return
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as d:
        subprocess.run([sys.executable, __file__, "--save", d,
                        str(args.params)], check=True)
        per_item = {"dcp": [], "torch": []}
        for rep in range(args.reps):
            for impl in ("dcp", "torch"):
                out = subprocess.run(
                    [sys.executable, __file__, "--child", impl, d],
                    check=True, capture_output=True, text=True).stdout
                r = json.loads(out.strip().splitlines()[-1])
                us = (r["read"] + r["walk"]) / r["items"] * 1e6
                per_item[impl].append(us)
                print(f"rep {rep} {impl:5s}: {r['items']} items, "
                      f"{r['storage']} storage entries, read "
                      f"{r['read']:.3f} s, walk {r['walk']:.3f} s, "
                      f"{us:.2f} us/item", flush=True)
        med = {k: statistics.median(v) for k, v in per_item.items()}
        print(f"median us/item: dcp {med['dcp']:.2f}, torch "
              f"{med['torch']:.2f}, dcp/torch {med['dcp'] / med['torch']:.2f}")


if __name__ == "__main__":
    main()
