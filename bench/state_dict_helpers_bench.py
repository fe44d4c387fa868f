"""Cost per parameter of the state-dict helpers, dcp's against torch's
(torch.distributed.checkpoint.state_dict) on identical models: one
nn.ModuleList of L Linear(2, 2) (2L parameters: a wide module, as MoE
experts or many embedding tables give) and AdamW after one step.
--layout onebn adds one BatchNorm1d (a module that loads its own way);
--layout groups gives each layer its own param group.

    DCP_LIBRARY=bazel-bin/capi/libdcp.so PYTHONPATH=python \\
      .venv/bin/python bench/state_dict_helpers_bench.py --layers 20000 \\
      --reps 3 [--flat] [--layout linear|onebn|groups]

Each (implementation, repetition) runs in a fresh process, dcp and torch
alternated; prints one line per run and the medians."""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

OPS = ("get_state", "set_model", "set_optim", "set_state")


def child(impl, layers, flat, layout="linear"):
    import warnings
    warnings.filterwarnings("ignore")
    import torch
    import torch.nn as nn
    if impl == "dcp":
        from dcp import state_dict as S
    else:
        import torch.distributed.checkpoint.state_dict as S
    torch.manual_seed(0)
    model = nn.ModuleList([nn.Linear(2, 2) for _ in range(layers)] +
                          ([nn.BatchNorm1d(2)] if layout == "onebn" else []))
    if layout == "groups":
        opt = torch.optim.AdamW(
            [{"params": list(m.parameters()), "lr": 1e-3 * (1 + i % 7)}
             for i, m in enumerate(model)])
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    opts = S.StateDictOptions(flatten_optimizer_state_dict=flat)
    times = {}

    def timed(name, fn):
        t0 = time.perf_counter()
        out = fn()
        times[name] = time.perf_counter() - t0
        return out

    msd, osd = timed("get_state", lambda: S.get_state_dict(model, opt,
                                                           options=opts))
    timed("set_model", lambda: S.set_model_state_dict(model, msd,
                                                       options=opts))
    timed("set_optim", lambda: S.set_optimizer_state_dict(model, opt, osd,
                                                          options=opts))
    timed("set_state", lambda: S.set_state_dict(
        model, opt, model_state_dict=msd, optim_state_dict=osd,
        options=opts))
    print(json.dumps(times))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=20000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--flat", action="store_true")
    ap.add_argument("--layout", choices=("linear", "onebn", "groups"),
                    default="linear")
    ap.add_argument("--child", choices=("dcp", "torch"))
    args = ap.parse_args()
    if args.child:
        child(args.child, args.layers, args.flat, args.layout)
        return
    runs = {"dcp": [], "torch": []}
    for rep in range(args.reps):
        for impl in ("dcp", "torch"):
            out = subprocess.run(
                [sys.executable, __file__, "--child", impl, "--layers",
                 str(args.layers), "--layout", args.layout] +
                (["--flat"] if args.flat else []),
                capture_output=True, text=True, env=os.environ, check=True)
            times = json.loads(out.stdout.strip().splitlines()[-1])
            runs[impl].append(times)
            print(f"rep {rep} {impl:5s} " + " ".join(
                f"{k}={v:.3f}s" for k, v in times.items()), flush=True)
    params = 2 * args.layers
    print(f"medians, {params} parameters, layout {args.layout} "
          f"({'flat' if args.flat else 'nested'} optimizer state dict):")
    for op in OPS:
        d = statistics.median(r[op] for r in runs["dcp"])
        t = statistics.median(r[op] for r in runs["torch"])
        print(f"  {op:10s} dcp {d:8.3f} s ({d / params * 1e6:6.1f} us/param)"
              f"  torch {t:8.3f} s ({t / params * 1e6:7.1f} us/param)"
              f"  {t / d:6.1f}x")


if __name__ == "__main__":
    main()
