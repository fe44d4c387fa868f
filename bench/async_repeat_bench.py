"""Memory and time of repeated async_saves of one many-item state, dcp
against torch.distributed.checkpoint in the same run: the RSS after each
save shows whether anything of a finished save stays alive (a reference
cycle waits for a full garbage collection, which a process with torch
loaded seldom runs).

    DCP_LIBRARY=bazel-bin/capi/libdcp.so PYTHONPATH=python \\
        .venv/bin/python bench/async_repeat_bench.py --items 20000 --saves 15

Each engine and kind runs in a process of its own, alternated; prints one
line per run: seconds per save and RSS (MiB) after each save.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time


def child(engine, kind, items, saves, root):
    import warnings
    warnings.filterwarnings("ignore")
    import torch
    if engine == "dcp":
        import dcp as D
    else:
        import torch.distributed.checkpoint as D

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGESIZE") / 2**20
    state = {f"layer{i}.w": torch.full((8,), float(i)) for i in range(items)}
    state["step"] = 3
    kw = {}
    if kind == "PROCESS":
        kinds = (D.AsyncCheckpointerType if engine == "dcp" else
                 D.state_dict_saver.AsyncCheckpointerType)
        kw["async_checkpointer_type"] = kinds.PROCESS
    seconds, sizes = [], []
    for k in range(saves):
        start = time.perf_counter()
        try:
            f = D.async_save(state, checkpoint_id=os.path.join(root, f"c{k}"),
                             **kw)
            (f.upload_completion if hasattr(f, "upload_completion") else f
             ).result()
        except Exception as e:  # torch's PROCESS: too many open files
            print(f"{engine:5s} {kind:7s} items={items}: save {k} failed: "
                  f"{type(e).__name__}: {str(e)[:120]}", flush=True)
            return
        seconds.append(time.perf_counter() - start)
        sizes.append(rss())
        if k >= 2:
            shutil.rmtree(os.path.join(root, f"c{k - 2}"), ignore_errors=True)
    print(f"{engine:5s} {kind:7s} items={items}: s/save "
          + " ".join(f"{s:.2f}" for s in seconds))
    print(f"{engine:5s} {kind:7s} RSS MiB " + " ".join(f"{r:.0f}" for r in sizes)
          + f"  (growth after save 3: {sizes[-1] - sizes[2]:+.0f} MiB)",
          flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--items", type=int, default=20000)
    p.add_argument("--saves", type=int, default=15)
    p.add_argument("--kinds", default="THREAD,PROCESS")
    p.add_argument("--engines", default="dcp,torch")
    p.add_argument("--dir", default=None)
    p.add_argument("--child", nargs=2, metavar=("ENGINE", "KIND"))
    args = p.parse_args()
    root = args.dir or tempfile.mkdtemp(prefix="async_repeat_")
    if args.child:
        child(*args.child, args.items, args.saves, root)
        return
    for kind in args.kinds.split(","):
        for engine in args.engines.split(","):
            where = os.path.join(root, f"{engine}_{kind}")
            os.makedirs(where, exist_ok=True)
            subprocess.run([sys.executable, __file__, "--child", engine, kind,
                            "--items", str(args.items), "--saves",
                            str(args.saves), "--dir", where], check=True)
            shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    main()
