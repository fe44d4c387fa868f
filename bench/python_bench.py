#!/usr/bin/env python3
"""dcp's Python package against PyTorch DCP on a training state (issue 20).

A decoder-only transformer built from torch.nn (bf16 weights, --params
parameters, ~350M by default) and its AdamW state after one step (fp32
exp_avg and exp_avg_sq, 0-d step tensors), taken with get_state_dict and
restored with set_state_dict, saved and loaded by:

  dcp    the dcp package (python/dcp, over libdcp.so)
  torch  torch.distributed.checkpoint from PyPI

Each phase runs in its own subprocess, alternating the two libraries, for
--reps rounds:

  save          get_state_dict + save, wall seconds, GB/s, peak RSS
  load          set_state_dict(load into a fresh model), page cache of the
                checkpoint dropped first; every byte checked afterwards
  load-convert  the model's bf16 weights loaded into an fp32 copy of the
                model (upcast on load), page cache dropped, every value
                checked (not in the default --phases; after save)
  async-thread  async_save(THREAD): seconds the loop is blocked (call to
                return, and call to staging done), and to upload done
  async-process the same with AsyncCheckpointerType.PROCESS (first call,
                which starts the writer process, and a second call)
  async-thread-stager  THREAD with a stager kept for the run: dcp's
                DefaultStager reserved before the loop; torch's DefaultStager
                with cache_staged_state_dict (not in the default --phases)
  async-process-stager the same with PROCESS (dcp: reserve(sd, PROCESS)
                maps the shared memory and starts the writer process)
  <async phase>-cow    dcp with StagingOptions(copy_on_write=True): CPU
                tensors are write-protected and copied after staging
                completes (async-thread-cow: such a stager made per run, not
                reserved); torch runs the phase without -cow

Every async phase also times the loop's next write of every floating
tensor (in place, x *= 1) right after staging completes ("touch"): with
copy_on_write that write may wait for pages still being copied.

--state small replaces the model with --items small tensors (a 4 B - 256 B
mix of fp32, bf16, fp16 and int64, every fifth one 0-d, named as a model's
parameters are: layer<i>.p<j>) and one int per 100 tensors, saved and
loaded with save/load directly (no state-dict helpers): the cost per item
of each library. The save, load and async phases apply.

plus fio's sequential write and read of the same byte count on the same
disk as the reference. Usage:

  bench/torch_env.sh python_bench.py --dir /var/tmp/pybench [--params 350M]
      [--reps 3] [--phases save,load,async-thread,async-process] [--json]
      [--state transformer|small] [--items 100000]

DCP_LIBRARY may name libdcp.so; by default the package finds the build's.
"""

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))


def parse_count(text):
    text = text.strip().upper()
    scale = {"K": 1e3, "M": 1e6, "G": 1e9}.get(text[-1:], 1)
    return int(float(text.rstrip("KMG")) * scale)


def max_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def drop_page_cache(directory):
    for root, _, files in os.walk(directory):
        for f in files:
            fd = os.open(os.path.join(root, f), os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def model_shape(params):
    """Layers and width of a decoder with about `params` parameters
    (12 * d^2 per layer plus embeddings of a 32k vocabulary)."""
    vocab = 32000
    for d in (4096, 3072, 2560, 2048, 1536, 1024, 768, 512, 256):
        layers = (params - 2 * vocab * d) // (12 * d * d)
        if layers >= 4:
            return int(layers), d, vocab
    return 2, 128, 1000


def build_training_state(torch, params, seed):
    """Model and AdamW after one step; optimizer state in fp32."""
    torch.manual_seed(seed)
    layers, d, vocab = model_shape(params)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1 = torch.nn.LayerNorm(d)
            self.attn = torch.nn.MultiheadAttention(d, max(1, d // 128),
                                                    batch_first=True)
            self.norm2 = torch.nn.LayerNorm(d)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d),
                                           torch.nn.GELU(),
                                           torch.nn.Linear(4 * d, d))

        def forward(self, x):
            h = self.norm1(x)
            x = x + self.attn(h, h, h, need_weights=False)[0]
            return x + self.mlp(self.norm2(x))

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(vocab, d)
            self.blocks = torch.nn.ModuleList(Block() for _ in range(layers))
            self.norm = torch.nn.LayerNorm(d)
            self.head = torch.nn.Linear(d, vocab, bias=False)

        def forward(self, tokens):
            x = self.embed(tokens)
            for b in self.blocks:
                x = b(x)
            return self.head(self.norm(x))

    with torch.no_grad():
        model = Decoder().to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    # One step without a forward pass (a 350M forward on 2 cores is slow and
    # adds nothing): synthetic gradients, then the state moved to fp32 as a
    # mixed-precision trainer keeps it.
    for p in model.parameters():
        p.grad = torch.full_like(p, 1e-3)
    opt.step()
    for state in opt.state.values():
        for k in ("exp_avg", "exp_avg_sq"):
            state[k] = state[k].float()
    opt.zero_grad(set_to_none=True)
    return model, opt


def build_small_state(torch, items, seed):
    """`items` small tensors of mixed dtypes (every fifth 0-d) and an int
    per 100 of them; values depend on `seed`."""
    g = torch.Generator().manual_seed(seed)
    dtypes = (torch.float32, torch.bfloat16, torch.float16, torch.int64)
    lengths = torch.randint(1, 33, (items,), generator=torch.Generator()
                            .manual_seed(0)).tolist()
    sd = {}
    for i in range(items):
        shape = () if i % 5 == 0 else (lengths[i],)
        dtype = dtypes[i % len(dtypes)]
        if dtype.is_floating_point:
            t = torch.randn(shape, generator=g).to(dtype)
        else:
            t = torch.randint(-1 << 40, 1 << 40, shape, generator=g)
        sd[f"layer{i // 100}.p{i % 100}"] = t
        if i % 100 == 0:
            sd[f"layer{i // 100}.step"] = seed * 1000 + i
    return sd


def state_bytes(torch, sd):
    total = 0
    stack = [sd]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
        elif isinstance(v, torch.Tensor):
            total += v.numel() * v.element_size()
    return total


def digest(torch, sd):
    """A digest of every tensor byte and value of a (nested) state dict."""
    import hashlib
    h = hashlib.blake2b(digest_size=16)

    def walk(prefix, v):
        if isinstance(v, dict):
            for k in sorted(v, key=str):
                walk(f"{prefix}.{k}", v[k])
        elif isinstance(v, (list, tuple)):
            for i, x in enumerate(v):
                walk(f"{prefix}.{i}", x)
        elif isinstance(v, torch.Tensor):
            h.update(f"{prefix}:{v.dtype}:{tuple(v.shape)}".encode())
            h.update(v.detach().reshape(-1).contiguous().view(
                torch.uint8).numpy().tobytes())
        else:
            h.update(f"{prefix}={v!r}".encode())

    walk("", sd)
    return h.hexdigest()


def library(lib):
    """(save, load, async_save, get_state_dict, set_state_dict, thread, process)
    of `lib`."""
    if lib == "dcp":
        import dcp as m
        sdm = m
        return m, sdm, m.AsyncCheckpointerType
    import torch.distributed.checkpoint as m
    import torch.distributed.checkpoint.state_dict as sdm
    from torch.distributed.checkpoint.state_dict_saver import (
        AsyncCheckpointerType)
    return m, sdm, AsyncCheckpointerType


def init_torch_group(torch, directory):
    import torch.distributed as dist
    if not dist.is_initialized():
        store = os.path.join(directory, ".store")
        dist.init_process_group("gloo", init_method=f"file://{store}",
                                rank=0, world_size=1)


def tensors_of(value):
    """Every tensor in a nested state dict."""
    import torch
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors_of(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_of(v)]
    return []


def phase(args):
    import torch
    torch.set_num_threads(os.cpu_count() or 1)
    m, sdm, kinds = library(args.lib)
    init_torch_group(torch, args.work)
    out = {"lib": args.lib, "phase": args.phase}
    if args.state == "small":
        return small_phase(args, torch, m, kinds, out)
    model, opt = build_training_state(torch, args.params, seed=1)
    if args.phase == "load":
        fresh, fresh_opt = build_training_state(torch, args.params, seed=2)
        drop_page_cache(args.dir)
        rss_before = max_rss_bytes()
        start = time.perf_counter()
        msd, osd = sdm.get_state_dict(fresh, fresh_opt)
        loaded = {"model": msd, "optim": osd}
        m.load(loaded, checkpoint_id=args.dir)
        sdm.set_state_dict(fresh, fresh_opt, model_state_dict=msd,
                           optim_state_dict=osd)
        out["seconds"] = time.perf_counter() - start
        out["rss_before_bytes"] = rss_before
        out["peak_rss_bytes"] = max_rss_bytes()
        # What the load filled in, against the state that was saved.
        smsd, sosd = sdm.get_state_dict(model, opt)
        out["verified"] = digest(torch, loaded) == digest(
            torch, {"model": smsd, "optim": sosd})
        return out
    if args.phase == "load-convert":
        # The bf16 checkpoint into an fp32 copy of the model (upcast on
        # load; both libraries convert as they copy). Model only.
        fresh, _ = build_training_state(torch, args.params, seed=2)
        fresh = fresh.float()
        drop_page_cache(args.dir)
        rss_before = max_rss_bytes()
        start = time.perf_counter()
        msd = sdm.get_model_state_dict(fresh)
        m.load({"model": msd}, checkpoint_id=args.dir)
        sdm.set_model_state_dict(fresh, msd)
        out["seconds"] = time.perf_counter() - start
        out["rss_before_bytes"] = rss_before
        out["peak_rss_bytes"] = max_rss_bytes()
        saved = sdm.get_model_state_dict(model)
        out["bytes"] = state_bytes(torch, msd)
        out["verified"] = all(
            msd[k].dtype == torch.float32 and
            torch.equal(msd[k], saved[k].float()) for k in saved)
        return out
    msd, osd = sdm.get_state_dict(model, opt)
    sd = {"model": msd, "optim": osd}
    out["bytes"] = state_bytes(torch, sd)
    rss_before = max_rss_bytes()
    if args.phase == "save":
        os.sync()
        start = time.perf_counter()
        msd, osd = sdm.get_state_dict(model, opt)
        m.save({"model": msd, "optim": osd}, checkpoint_id=args.dir)
        out["seconds"] = time.perf_counter() - start
    else:
        kind = (kinds.PROCESS if args.phase.startswith("async-process")
                else kinds.THREAD)
        cow = args.phase.endswith("-cow") and args.lib == "dcp"
        stager = None
        if cow and "-stager" not in args.phase:
            stager = m.DefaultStager(m.StagingOptions(
                use_pinned_memory=False, copy_on_write=True))
        if "-stager" in args.phase:
            # A stager kept for the run and reserved before the loop (dcp's
            # DefaultStager, pageable memory: dcp.DefaultStager.reserve, for
            # PROCESS its shared memory and writer process; for torch its
            # DefaultStager with caching, whose first stage maps).
            if args.lib == "dcp":
                stager = m.DefaultStager(m.StagingOptions(
                    use_pinned_memory=False, copy_on_write=cow))
                stager.reserve(sd, kind)
            else:
                from torch.distributed.checkpoint.staging import (
                    DefaultStager, StagingOptions)
                stager = DefaultStager(StagingOptions(False, False, False,
                                                      False))
        async_calls(args, m, sd, kind, stager, out)
    out["rss_before_bytes"] = rss_before
    out["peak_rss_bytes"] = max_rss_bytes()
    return out


def async_calls(args, m, sd, kind, stager, out):
    """Two async_saves of `sd` to args.dir/first and /second, timing how
    long the loop is blocked, its next write of every floating tensor, and
    the upload."""
    floating = [t for t in tensors_of(sd) if t.is_floating_point()]
    for call in ("first", "second"):
        target = os.path.join(args.dir, call)
        os.sync()
        start = time.perf_counter()
        resp = m.async_save(sd, checkpoint_id=target,
                            async_checkpointer_type=kind,
                            **({"async_stager": stager} if stager
                               else {}))
        returned = time.perf_counter() - start
        staging = getattr(resp, "staging_completion", None)
        upload = getattr(resp, "upload_completion", resp)
        if staging is not None:
            staging.result()
        staged = time.perf_counter() - start
        # The loop's next step writes its tensors.
        touch = time.perf_counter()
        for t in floating:
            t.mul_(1)
        out[f"{call}_touch_seconds"] = time.perf_counter() - touch
        upload.result()
        out[f"{call}_return_seconds"] = returned
        out[f"{call}_staged_seconds"] = staged
        out[f"{call}_upload_seconds"] = time.perf_counter() - start


def small_phase(args, torch, m, kinds, out):
    """A phase of --state small: save/load/async of many small tensors."""
    sd = build_small_state(torch, args.items, seed=1)
    out["bytes"] = state_bytes(torch, sd)
    out["items"] = args.items
    if args.phase == "load":
        fresh = build_small_state(torch, args.items, seed=2)
        drop_page_cache(args.dir)
        rss_before = max_rss_bytes()
        start = time.perf_counter()
        m.load(fresh, checkpoint_id=args.dir)
        out["seconds"] = time.perf_counter() - start
        out["verified"] = digest(torch, fresh) == digest(torch, sd)
    elif args.phase == "save":
        os.sync()
        rss_before = max_rss_bytes()
        start = time.perf_counter()
        m.save(sd, checkpoint_id=args.dir)
        out["seconds"] = time.perf_counter() - start
    elif args.phase in ("async-thread", "async-process"):
        rss_before = max_rss_bytes()
        kind = (kinds.PROCESS if args.phase == "async-process"
                else kinds.THREAD)
        async_calls(args, m, sd, kind, None, out)
    else:
        raise SystemExit(f"python_bench: --state small has no phase "
                         f"{args.phase}")
    out["rss_before_bytes"] = rss_before
    out["peak_rss_bytes"] = max_rss_bytes()
    return out


def run_sub(args, lib, phase_name, directory):
    cmd = [sys.executable, os.path.abspath(__file__), "_phase", "--lib", lib,
           "--phase", phase_name, "--dir", directory, "--work", args.work,
           "--params", str(args.params), "--state", args.state,
           "--items", str(args.items)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 and lib == "torch":
        # The reference failing is a result (torch's PROCESS async_save
        # passes one file descriptor per tensor and runs out of them with
        # many small tensors): recorded with its last error line.
        lines = [l for l in proc.stderr.splitlines() if l.strip()]
        error = next((l for l in reversed(lines) if "Error" in l),
                     lines[-1] if lines else f"exit {proc.returncode}")
        return {"lib": lib, "phase": phase_name, "error": error.strip()}
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"python_bench: {lib} {phase_name} failed "
                         f"(exit {proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def fio(directory, nbytes, rw):
    path = os.path.join(directory, "fio.dat")
    cmd = ["fio", "--name=ref", f"--filename={path}", f"--rw={rw}",
           "--bs=8M", f"--size={nbytes}", "--direct=1", "--ioengine=libaio",
           "--iodepth=8", "--output-format=json"]
    if rw == "write":
        cmd.append("--end_fsync=1")
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    job = json.loads(proc.stdout)["jobs"][0]
    side = job["write" if rw == "write" else "read"]
    return side["bw_bytes"] / 1e9


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("mode", nargs="?", default="run", choices=["run", "_phase"])
    p.add_argument("--dir", default=None)
    p.add_argument("--work", default=None)
    p.add_argument("--params", default="350M")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--phases", default="save,load,async-thread,async-process")
    p.add_argument("--lib", default="dcp")
    p.add_argument("--phase", default="save")
    p.add_argument("--json", action="store_true")
    p.add_argument("--state", default="transformer",
                   choices=["transformer", "small"])
    p.add_argument("--items", type=int, default=100000)
    args = p.parse_args()
    args.params = parse_count(str(args.params))
    if args.mode == "_phase":
        print(json.dumps(phase(args)))
        return
    parent = args.dir or tempfile.gettempdir()
    os.makedirs(parent, exist_ok=True)
    args.work = tempfile.mkdtemp(prefix="pybench-", dir=parent)
    phases = args.phases.split(",")
    results = []
    try:
        for rep in range(args.reps):
            order = ["dcp", "torch"] if rep % 2 == 0 else ["torch", "dcp"]
            for lib in order:
                ckpt = os.path.join(args.work, f"{lib}-ckpt")
                for ph in phases:
                    target = (os.path.join(args.work, f"{lib}-async")
                              if ph.startswith("async") else ckpt)
                    r = run_sub(args, lib, ph, target)
                    r["rep"] = rep
                    results.append(r)
                    if not args.json:
                        print(json.dumps(r), flush=True)
                    if ph.startswith("async"):
                        shutil.rmtree(target, ignore_errors=True)
                shutil.rmtree(ckpt, ignore_errors=True)
            if args.state == "small":
                continue  # A few MB: torch is the reference, not the disk.
            nbytes = next((r["bytes"] for r in results if "bytes" in r), 1 << 30)
            results.append({"lib": "fio", "rep": rep,
                            "write_gbps": fio(args.work, nbytes, "write"),
                            "read_gbps": fio(args.work, nbytes, "read")})
            os.remove(os.path.join(args.work, "fio.dat"))
    finally:
        shutil.rmtree(args.work, ignore_errors=True)

    def med(lib, ph, key):
        vals = [r[key] for r in results
                if r.get("lib") == lib and r.get("phase") == ph and key in r]
        return statistics.median(vals) if vals else None

    summary = {"params": args.params, "reps": args.reps,
               "state": args.state}
    if args.state == "small":
        summary["items"] = args.items
    for lib in ("dcp", "torch"):
        for ph in phases:
            for key in ("seconds", "peak_rss_bytes", "first_return_seconds",
                        "first_staged_seconds", "second_return_seconds",
                        "second_staged_seconds", "second_upload_seconds",
                        "first_touch_seconds", "second_touch_seconds"):
                v = med(lib, ph, key)
                if v is not None:
                    summary[f"{lib}_{ph}_{key}"] = v
    fio_runs = [r for r in results if r["lib"] == "fio"]
    if fio_runs:
        summary["fio_write_gbps"] = statistics.median(
            r["write_gbps"] for r in fio_runs)
        summary["fio_read_gbps"] = statistics.median(
            r["read_gbps"] for r in fio_runs)
    summary["bytes"] = next((r["bytes"] for r in results if "bytes" in r), 0)
    summary["verified"] = all(r.get("verified", True) for r in results)
    print(json.dumps({"summary": summary, "runs": results} if args.json
                     else summary, indent=None if args.json else 1))


if __name__ == "__main__":
    main()
