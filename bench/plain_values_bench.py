"""Saving and loading the plain values of a training state (lists and
tuples of names, numbers and RNG states, no tensors) with dcp, dcp storing
lists item by item (as before it stored them whole), and torch's DCP, on
identical state dicts, alternated.

    DCP_LIBRARY=bazel-bin/capi/libdcp.so PYTHONPATH=python \
        .venv/bin/python bench/plain_values_bench.py --params 30000 --reps 3

The state: an optimizer's param_groups in the flattened-name form
(`params`: the FQNs of every parameter, `betas` tuples), a loss history of
floats, and `random.getstate()` (a tuple holding a tuple of 625 ints) for
each of 8 data workers. Prints seconds per save and load (into a fresh
state of the same shape) and the item count of each checkpoint.
"""
import argparse
import json
import os
import random
import shutil
import tempfile
import time

import dcp
from dcp import _state


def make_state(params: int) -> dict:
    names = [f"model.layers.{i // 12}.block.{i % 12}.weight"
             for i in range(params)]
    groups = [{"params": names[g::4], "lr": 1e-4 * (g + 1),
               "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1,
               "amsgrad": False, "foreach": None}
              for g in range(4)]
    rngs = []
    for w in range(8):
        random.seed(w)
        rngs.append(random.getstate())
    return {"optim": {"param_groups": groups},
            "history": [float(i) / 7 for i in range(params // 3)],
            "rng": {"workers": rngs}}


def blank(state):
    """A destination of the same shape, every value zeroed."""
    if isinstance(state, dict):
        return {k: blank(v) for k, v in state.items()}
    if isinstance(state, list):
        return [blank(v) for v in state]
    if isinstance(state, tuple):
        return tuple(blank(v) for v in state)
    if isinstance(state, str):
        return ""
    if isinstance(state, (bool, type(None))):
        return state
    return type(state)(0)


def run(kind: str, state: dict, root: str) -> dict:
    path = os.path.join(root, kind)
    shutil.rmtree(path, ignore_errors=True)
    if kind == "torch":
        import torch.distributed.checkpoint as lib
    else:
        lib = dcp
        _state.PACK_PLAIN_LISTS = kind == "dcp"
    t0 = time.perf_counter()
    lib.save(state, checkpoint_id=path, no_dist=True)
    t1 = time.perf_counter()
    dst = blank(state)
    lib.load(dst, checkpoint_id=path, no_dist=True)
    t2 = time.perf_counter()
    items = len(lib.FileSystemReader(path).read_metadata()
                .state_dict_metadata)
    assert dst == state, kind
    return {"save_s": t1 - t0, "load_s": t2 - t1, "items": items}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", type=int, default=30000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    import warnings
    warnings.filterwarnings("ignore")
    state = make_state(args.params)
    root = args.dir or tempfile.mkdtemp(prefix="plain_values_")
    results = {k: [] for k in ("dcp", "dcp_per_item", "torch")}
    for rep in range(args.reps):
        order = list(results)
        order = order[rep % 3:] + order[:rep % 3]
        for kind in order:
            results[kind].append(run(kind, state, root))
    for kind, runs in results.items():
        print(f"{kind:13s} items {runs[0]['items']:7d}  save " +
              " / ".join(f"{r['save_s']:.3f}" for r in runs) + " s  load " +
              " / ".join(f"{r['load_s']:.3f}" for r in runs) + " s")
    print(json.dumps(results))
    if args.dir is None:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
