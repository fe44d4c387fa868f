"""AsyncSave from CUDA tensors: torch.distributed.checkpoint against dcp.

Builds a Llama-style state on the GPU (bf16 weights, fp32 AdamW moments,
0-d step tensors, fp32 norms) of about --gib GiB, then for each variant saves
it with async_save several times (one warm-up), and reports per variant the
time the training loop is blocked (the call until its tensors may change:
staging_completion where the API has one, else the call's return) and the
total time until the checkpoint is written; then loads the last checkpoint
into zeroed CUDA tensors and checks every tensor for equality.

Variants:
  torch_default  torch.distributed.checkpoint.async_save with its defaults
                 (what a user gets without an async_stager)
  torch_pinned   the same with DefaultStager(StagingOptions(True, True,
                 True, True)): pinned, shared memory, async staging,
                 non-blocking copies, one stager kept for every save
  torch_pinned_fresh  the same with a new stager per save
  dcp            the dcp Python package's async_save, when it is importable

Prints one JSON object per line (flushed): a header, one line per save, one
summary per variant, one line per load, and {"done": true} at the end.

    python3 tests/gpu/torch_async_save.py --gib 4 --dir /tmp --reps 2
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time


def emit(row):
    print(json.dumps(row), flush=True)


def make_state(torch, gib, device):
    """A Llama-style model + AdamW state of about `gib` GiB on `device`."""
    hidden, ffn = 4096, 11008
    shapes = {"q_proj": (hidden, hidden), "k_proj": (hidden, hidden),
              "v_proj": (hidden, hidden), "o_proj": (hidden, hidden),
              "gate_proj": (ffn, hidden), "up_proj": (ffn, hidden),
              "down_proj": (hidden, ffn)}
    per_layer = sum(a * b for a, b in shapes.values()) * (2 + 4 + 4)
    layers = max(1, round(gib * (1 << 30) / per_layer))
    gen = torch.Generator(device=device).manual_seed(0)
    model, optim = {}, {}
    for layer in range(layers):
        for name, shape in shapes.items():
            key = f"layers.{layer}.{name}.weight"
            w = torch.randn(shape, generator=gen, device=device,
                            dtype=torch.bfloat16)
            model[key] = w
            optim[key] = {
                "step": torch.tensor(float(layer + 1), device=device),
                "exp_avg": torch.randn(shape, generator=gen, device=device),
                "exp_avg_sq": torch.rand(shape, generator=gen, device=device),
            }
        for norm in ("input_layernorm", "post_attention_layernorm"):
            model[f"layers.{layer}.{norm}.weight"] = torch.ones(
                hidden, device=device)
    return {"model": model, "optim": optim, "step": 1000}, layers


def state_bytes(torch, state):
    total = 0
    stack = [state]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, torch.Tensor):
            total += v.numel() * v.element_size()
    return total


def zeros_like_state(torch, state):
    if isinstance(state, dict):
        return {k: zeros_like_state(torch, v) for k, v in state.items()}
    if isinstance(state, torch.Tensor):
        return torch.zeros_like(state)
    return state


def first_difference(torch, a, b, path=""):
    if isinstance(a, dict):
        for k in a:
            d = first_difference(torch, a[k], b.get(k), f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or not torch.equal(a, b):
            return path
        return None
    return None if a == b else path


def variants(torch, dcp_module):
    import torch.distributed.checkpoint as tdcp

    def torch_default(state, path):
        # Staging is synchronous in the call: the loop is blocked until it
        # returns.
        return None, tdcp.async_save(state, checkpoint_id=path)

    def pinned(reuse):
        stagers = []  # Reused: one stager for every save, as a loop keeps it.

        def save(state, path):
            from torch.distributed.checkpoint.staging import (DefaultStager,
                                                              StagingOptions)
            if not stagers or not reuse:
                stagers[:] = [
                    DefaultStager(StagingOptions(True, True, True, True))]
            r = tdcp.async_save(state, checkpoint_id=path,
                                async_stager=stagers[0])
            return r.staging_completion, r.upload_completion
        return save

    def dcp_async(state, path):
        r = dcp_module.async_save(state, checkpoint_id=path)
        staged = getattr(r, "staging_completion", r)
        uploaded = getattr(r, "upload_completion", r)
        return staged, uploaded

    def torch_load(state, path):
        tdcp.load(state, checkpoint_id=path)

    # torch 2.11 failed reusing a DefaultStager for a second save of this
    # state (KeyError: <class 'type'>): torch_pinned_fresh makes one per
    # save, so it pays for pinning memory every time.
    # dcp first: a run cut short by its budget still has it.
    out = []
    if dcp_module is not None:
        out.append(("dcp", dcp_async,
                    lambda state, path: dcp_module.load(state,
                                                        checkpoint_id=path)))
    out += [("torch_default", torch_default, torch_load),
            ("torch_pinned", pinned(True), torch_load),
            ("torch_pinned_fresh", pinned(False), torch_load)]
    return out


def wait(f):
    if f is None:
        return
    if hasattr(f, "result"):
        f.result()
    elif hasattr(f, "wait"):
        f.wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=4)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--budget_s", type=float, default=0)
    parser.add_argument(
        "--variants",
        # torch_pinned (one reused DefaultStager) fails on torch 2.11 with
        # KeyError: <class 'type'>; ask for it by name.
        default="dcp,torch_default,torch_pinned_fresh")
    args = parser.parse_args()
    start = time.monotonic()

    import torch
    if args.device == "cuda" and not torch.cuda.is_available():
        emit({"skipped": "torch sees no CUDA device",
              "torch": torch.__version__})
        return 0
    try:
        import dcp as dcp_module  # The dcp Python package, once it exists.
        if not hasattr(dcp_module, "async_save"):
            dcp_module = None
    except ImportError:
        dcp_module = None
    state, layers = make_state(torch, args.gib, args.device)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    sync()
    nbytes = state_bytes(torch, state)
    emit({"part": "torch_async_save", "torch": torch.__version__,
          "python": sys.version.split()[0], "device": args.device,
          "gpu": torch.cuda.get_device_name() if args.device == "cuda" else "",
          "bytes": nbytes, "layers": layers, "dir": args.dir,
          "dcp_package": dcp_module is not None})
    base = tempfile.mkdtemp(prefix="dcp-torch-async-", dir=args.dir)
    wanted = set(args.variants.split(","))
    truncated = False
    failed = False
    try:
        for name, save, load in variants(torch, dcp_module):
            if name not in wanted:
                continue
            if args.budget_s and time.monotonic() - start > args.budget_s:
                truncated = True
                break
            try:
                run_variant(torch, args, name, save, load, state, nbytes,
                            base, sync)
            except Exception as e:  # Report and go on with the next one.
                emit({"variant": name, "error": f"{type(e).__name__}: {e}"})
                failed = True
    finally:
        shutil.rmtree(base, ignore_errors=True)
    emit({"truncated": True} if truncated else {"done": True,
          "elapsed_s": time.monotonic() - start})
    return 1 if failed else 0


def run_variant(torch, args, name, save, load, state, nbytes, base, sync):
    """Saves `state` reps + 1 times with `save` (the first is a warm-up),
    then loads the last checkpoint into zeroed tensors and compares."""
    blocked, total, path = [], [], None
    for rep in range(args.reps + 1):
        path = os.path.join(base, f"{name}-{rep}")
        sync()
        t0 = time.perf_counter()
        staged, uploaded = save(state, path)
        t_return = time.perf_counter()
        wait(staged)
        t_staged = time.perf_counter()
        wait(uploaded)
        t_done = time.perf_counter()
        emit({"variant": name, "rep": rep, "warmup": rep == 0,
              "return_s": t_return - t0, "blocked_s": t_staged - t0,
              "total_s": t_done - t0})
        if rep > 0:
            blocked.append(t_staged - t0)
            total.append(t_done - t0)
        if rep < args.reps:
            shutil.rmtree(path, ignore_errors=True)
    blocked.sort()
    total.sort()
    emit({"variant": name, "summary": True, "bytes": nbytes,
          "blocked_s": blocked[len(blocked) // 2],
          "total_s": total[len(total) // 2]})
    dest = zeros_like_state(torch, state)
    sync()
    t0 = time.perf_counter()
    load(dest, path)
    sync()
    seconds = time.perf_counter() - t0
    diff = first_difference(torch, state, dest)
    emit({"variant": name, "load_s": seconds,
          "load_gbps": nbytes / seconds / 1e9,
          "equal": diff is None, "first_difference": diff})
    shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
