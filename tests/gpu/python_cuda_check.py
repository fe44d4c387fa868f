"""The dcp Python package on CUDA tensors (run by run_gpu_checks.sh, part
"python"; with --device cpu it runs anywhere, which is how it is tested
before a GPU run).

Checks, each printed as one JSON line {"check": ..., "ok": ..., ...}:
  roundtrip     every dtype torch checkpoints use (bf16, fp8 e4m3fn/e5m2,
                bool, complex, 0-d, strided) saved from and loaded into
                device tensors, bit-exact, loads in place (same data_ptr)
  stream_order  the save is issued right after a long kernel chain on the
                caller's current (non-default) stream writes the tensor; the
                saved bytes must be the chain's final values (dcp waits on
                that stream), never an intermediate
  load_order    the load is issued right after a kernel chain on the
                caller's current (non-default) stream writes the destination;
                the tensor must end with the checkpoint's values (dcp's copies
                wait for that stream), never the chain's
  convert       checkpoints of fp32, fp16, bf16 and fp64 loaded into device
                tensors of each other of those dtypes (and a strided one),
                equal to torch's own conversion bit for bit, loads in
                place; then a converting load issued right after a kernel
                chain on the caller's current stream writes the destination
                ends with the checkpoint's values
  async_thread  async_save THREAD from device tensors; the tensors are
                overwritten once staging_completion is done; the checkpoint
                holds the values at the call
  async_process the same with AsyncCheckpointerType.PROCESS
  state_dict    get_state_dict / set_state_dict of a CUDA model + AdamW
                through dcp.save / dcp.load

Exit status 0 when every check passed.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time


def emit(**row):
    print(json.dumps(row), flush=True)
    return row["ok"]


def same_bytes(torch, a, b):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.reshape(-1).view(torch.uint8).cpu(),
                       b.reshape(-1).view(torch.uint8).cpu())


def filled(torch, dtype, shape, device, seed):
    g = torch.Generator().manual_seed(seed)
    n = 1
    for s in shape:
        n *= s
    raw = torch.randint(0, 256, (n * torch.empty((), dtype=dtype)
                                 .element_size(),), generator=g,
                        dtype=torch.uint8)
    if dtype.is_floating_point or dtype.is_complex:
        # Random bytes can be NaN patterns; equal-bytes checks handle them.
        pass
    if dtype == torch.bool:
        raw = raw % 2
    return raw.view(dtype).reshape(shape).to(device)


def check_roundtrip(torch, dcp, device, base):
    dtypes = [torch.float32, torch.float16, torch.bfloat16, torch.float64,
              torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64,
              torch.bool, torch.complex64, torch.float8_e4m3fn,
              torch.float8_e5m2]
    saved = {str(dt).replace("torch.", ""): filled(torch, dt, (33, 17), device,
                                                   i)
             for i, dt in enumerate(dtypes)}
    saved["scalar"] = torch.tensor(3.5, device=device)
    saved["strided"] = filled(torch, torch.float32, (16, 24), device, 99).t()
    path = os.path.join(base, "roundtrip")
    dcp.save({"t": saved}, checkpoint_id=path)
    dest = {k: torch.zeros_like(v) for k, v in saved.items()}
    ptrs = {k: v.data_ptr() for k, v in dest.items()}
    dcp.load({"t": dest}, checkpoint_id=path)
    bad = [k for k in saved if not same_bytes(torch, saved[k], dest[k])]
    moved = [k for k in dest if dest[k].data_ptr() != ptrs[k]]
    return emit(check="roundtrip", ok=not bad and not moved, mismatched=bad,
                not_in_place=moved, tensors=len(saved))


def check_stream_order(torch, dcp, device, base):
    if device == "cpu":
        return emit(check="stream_order", ok=True, skipped="cpu")
    n = 64 << 20  # 256 MiB of fp32: long enough to be in flight at save
    x = torch.zeros(n, device=device)
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        # About half a second of GPU time before the chain: a save that did
        # not wait for this stream would copy x while it is still zero.
        torch.cuda._sleep(1 << 30)
        for _ in range(50):  # 50 dependent kernels: x ends at 50.0
            x.add_(1.0)
        path = os.path.join(base, "stream_order")
        dcp.save({"x": x}, checkpoint_id=path)
    torch.cuda.synchronize()
    got = torch.empty(n, device="cpu")
    dcp.load({"x": got}, checkpoint_id=path)
    values = torch.unique(got).tolist()
    return emit(check="stream_order", ok=values == [50.0],
                distinct_values=values[:8])


def check_strided_load(torch, dcp, device, base):
    """A load into a transposed 4096x4096 fp32 destination (one element
    per contiguous run) fills it exactly. The seconds of it and of a
    contiguous load are reported, not judged (the package goes through a
    contiguous temporary on the device: they should be close)."""
    src = torch.arange(4096 * 4096, dtype=torch.float32).reshape(4096, 4096)
    path = os.path.join(base, "strided_load")
    dcp.save({"w": src}, checkpoint_id=path)
    seconds = {}
    for name, dst in (
            ("contiguous", torch.zeros(4096, 4096, device=device)),
            ("transposed", torch.zeros(4096, 4096, device=device).t())):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        dcp.load({"w": dst}, checkpoint_id=path)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds[name] = time.perf_counter() - start
        if not torch.equal(dst.cpu(), src):
            return emit(check="strided_load", ok=False, wrong=name,
                        seconds=seconds)
    return emit(check="strided_load", ok=True, seconds=seconds)


def check_load_order(torch, dcp, device, base):
    if device == "cpu":
        return emit(check="load_order", ok=True, skipped="cpu")
    n = 64 << 20  # 256 MiB of fp32: the chain is still running at load
    path = os.path.join(base, "load_order")
    dcp.save({"x": torch.full((n,), 7.0)}, checkpoint_id=path)
    x = torch.zeros(n, device=device)
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(1 << 30)  # keeps the chain running at the load
        for _ in range(50):  # 50 dependent kernels still writing x
            x.add_(1.0)
        dcp.load({"x": x}, checkpoint_id=path)
        after = x.clone()  # the caller's next work sees the loaded bytes
    torch.cuda.synchronize()
    values = torch.unique(after.cpu()).tolist()
    return emit(check="load_order", ok=values == [7.0],
                distinct_values=values[:8])


def check_convert(torch, dcp, device, base):
    dtypes = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
    g = torch.Generator().manual_seed(5)
    # Finite values across the ranges (NaN payloads may differ between the
    # host's and the device's conversions), specials, and subnormals.
    values = torch.cat([torch.randn(4000, generator=g, dtype=torch.float64)
                        * 10.0 ** torch.randint(-8, 6, (4000,), generator=g),
                        torch.tensor([0.0, -0.0, float("inf"), -float("inf"),
                                      1e-40, 65504.0, 65520.0, 3.4e38],
                                     dtype=torch.float64)])
    saved = {str(dt).replace("torch.", ""): values.to(dt) for dt in dtypes}
    path = os.path.join(base, "convert")
    dcp.save(saved, checkpoint_id=path)
    bad, moved, pairs = [], [], 0
    for name, src in saved.items():
        for dt in dtypes:
            if dt == src.dtype:
                continue
            pairs += 1
            dest = torch.zeros(values.numel(), dtype=dt, device=device)
            strided = torch.zeros(2 * values.numel(), dtype=dt,
                                  device=device)[::2]
            ptrs = (dest.data_ptr(), strided.data_ptr())
            dcp.load({name: dest}, checkpoint_id=path)
            dcp.load({name: strided}, checkpoint_id=path)
            want = src.to(device).to(dt)
            for label, got in (("", dest), ("strided ", strided)):
                if not same_bytes(torch, got.contiguous(), want):
                    bad.append(f"{label}{name} -> {dt}")
            if (dest.data_ptr(), strided.data_ptr()) != ptrs:
                moved.append(f"{name} -> {dt}")
    order_ok, distinct = True, None
    if device != "cpu":
        n = 64 << 20  # 256 MiB of fp32: the chain is still running at load
        order_path = os.path.join(base, "convert_order")
        dcp.save({"x": torch.full((n,), 7.0, dtype=torch.bfloat16)},
                 checkpoint_id=order_path)
        x = torch.zeros(n, device=device)
        side = torch.cuda.Stream()
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            torch.cuda._sleep(1 << 30)
            for _ in range(50):
                x.add_(1.0)
            dcp.load({"x": x}, checkpoint_id=order_path)
            after = x.clone()
        torch.cuda.synchronize()
        distinct = torch.unique(after.cpu()).tolist()[:8]
        order_ok = distinct == [7.0]
        # A converting load holds no device memory beyond its destinations:
        # 16 bf16 tensors of 16 MiB into fp32 ones (512 MiB) may add at most
        # one tensor's conversion (torch's DCP loads one item at a time).
        del x, after
        many = {f"t{k}": torch.full((8 << 20,), float(k),
                                    dtype=torch.bfloat16) for k in range(16)}
        many_path = os.path.join(base, "convert_many")
        dcp.save(many, checkpoint_id=many_path)
        dests = {k: torch.zeros(8 << 20, device=device) for k in many}
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        dcp.load(dests, checkpoint_id=many_path)
        torch.cuda.synchronize()
        extra_mib = (torch.cuda.max_memory_allocated() - before) / (1 << 20)
        filled_ok = all(bool((d == float(k[1:])).all())
                        for k, d in dests.items())
        peak_ok = extra_mib <= 32 and filled_ok
    else:
        extra_mib, peak_ok = None, True
    return emit(check="convert",
                ok=not bad and not moved and order_ok and peak_ok,
                pairs=pairs, mismatched=bad, not_in_place=moved,
                order_distinct_values=distinct,
                extra_device_mib_converting_512_mib=extra_mib)


def check_async(torch, dcp, device, base, kind_name):
    kind = getattr(dcp.AsyncCheckpointerType, kind_name)
    t = filled(torch, torch.bfloat16, (1024, 1024), device, 7)
    expected = t.clone()
    path = os.path.join(base, f"async_{kind_name.lower()}")
    start = time.perf_counter()
    resp = dcp.async_save({"w": t}, checkpoint_id=path,
                          async_checkpointer_type=kind)
    returned = time.perf_counter() - start
    resp.staging_completion.result()
    staged = time.perf_counter() - start
    t.fill_(0)  # Allowed once staged: must not reach the checkpoint.
    resp.upload_completion.result()
    got = torch.zeros_like(expected)
    dcp.load({"w": got}, checkpoint_id=path)
    return emit(check=f"async_{kind_name.lower()}",
                ok=same_bytes(torch, expected, got),
                return_seconds=returned, staged_seconds=staged)


def check_async_stager(torch, dcp, device, base, kind_name):
    """async_save through a kept dcp.DefaultStager (the seed's defaults:
    pinned staging memory, non-blocking copies waited for by the stager's
    background thread), called right after a chain of kernels on the
    caller's side stream: each checkpoint holds the chain's final values,
    not what the tensor held while the chain ran, nor what the loop wrote
    after staging completed; twice, the second reusing the stager's
    memory."""
    kind = getattr(dcp.AsyncCheckpointerType, kind_name)
    n = 64 << 20  # 256 MiB of fp32
    x = torch.zeros(n, device=device)
    stager = dcp.DefaultStager()
    side = torch.cuda.Stream() if device.startswith("cuda") else None
    results = []
    for round_ in range(2):
        if side is not None:
            torch.cuda.synchronize()
            with torch.cuda.stream(side):
                torch.cuda._sleep(1 << 30)  # about half a second first
                for _ in range(50):
                    x.add_(1.0)
                path = os.path.join(base, f"stager_{kind_name}_{round_}")
                resp = dcp.async_save({"x": x}, checkpoint_id=path,
                                      async_checkpointer_type=kind,
                                      async_stager=stager)
        else:
            x.add_(50.0)
            path = os.path.join(base, f"stager_{kind_name}_{round_}")
            resp = dcp.async_save({"x": x}, checkpoint_id=path,
                                  async_checkpointer_type=kind,
                                  async_stager=stager)
        resp.staging_completion.result()
        want = float(50 * (round_ + 1))
        x.fill_(-1.0)  # allowed once staged: must not reach the checkpoint
        resp.upload_completion.result()
        got = torch.empty(n, device="cpu")
        dcp.load({"x": got}, checkpoint_id=path)
        results.append(torch.unique(got).tolist()[:8])
        x.fill_(want)
        if side is not None:
            torch.cuda.synchronize()
    stager.close()
    return emit(check=f"async_stager_{kind_name.lower()}",
                ok=results == [[50.0], [100.0]], distinct_values=results)


def check_copy_on_write_pinned(torch, dcp, device, base):
    """A copy-on-write stager copies pinned CPU tensors (a device's DMA
    into them would bypass the write protection) and snapshots pageable
    ones; after staging, a device-to-host copy into the pinned tensor and
    CPU writes into the pageable one must not reach the checkpoint."""
    n = 4 << 20  # floats: 16 MiB each
    pinned = torch.arange(n, dtype=torch.float32).pin_memory()
    pageable = torch.arange(n, dtype=torch.float32) * 2
    want_pinned, want_pageable = pinned.clone(), pageable.clone()
    stager = dcp.DefaultStager(dcp.StagingOptions(copy_on_write=True))
    path = os.path.join(base, "cow_pinned")
    resp = dcp.async_save({"pinned": pinned, "pageable": pageable},
                          checkpoint_id=path, async_stager=stager)
    resp.staging_completion.result()
    zeros = torch.zeros(n, dtype=torch.float32, device=device)
    pinned.copy_(zeros, non_blocking=True)  # DMA into the pinned tensor
    torch.cuda.current_stream().synchronize()
    pageable.fill_(-1)
    resp.upload_completion.result()
    got = {"pinned": torch.empty(n), "pageable": torch.empty(n)}
    dcp.load(got, checkpoint_id=path)
    cow = stager.copy_on_write_bytes
    stager.close()
    # Only the pageable tensor's whole pages may have been snapshot.
    ok = (torch.equal(got["pinned"], want_pinned) and
          torch.equal(got["pageable"], want_pageable) and
          cow <= 4 * n and bool(torch.all(pinned == 0)))
    return emit(check="copy_on_write_pinned", ok=ok,
                copy_on_write_bytes=cow)


def check_state_dict(torch, dcp, device, base):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(),
                                torch.nn.Linear(128, 8)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 64, device=device)).sum().backward()
    opt.step()
    msd, osd = dcp.get_state_dict(model, opt)
    path = os.path.join(base, "state_dict")
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=path)
    torch.manual_seed(1)
    fresh = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(),
                                torch.nn.Linear(128, 8)).to(device)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    fmsd, fosd = dcp.get_state_dict(fresh, fresh_opt)
    state = {"model": fmsd, "optim": fosd}
    dcp.load(state, checkpoint_id=path)
    dcp.set_state_dict(fresh, fresh_opt, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
    params_ok = all(torch.equal(a, b) for a, b in
                    zip(model.parameters(), fresh.parameters()))
    s1 = opt.state_dict()["state"]
    s2 = fresh_opt.state_dict()["state"]
    state_ok = all(torch.equal(torch.as_tensor(s1[i][k]).cpu(),
                               torch.as_tensor(s2[i][k]).cpu())
                   for i in s1 for k in s1[i])
    return emit(check="state_dict", ok=params_ok and state_ok,
                params=params_ok, optimizer_state=state_ok)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    p.add_argument("--dir", default=None)
    args = p.parse_args()
    import torch
    import dcp
    device = args.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        emit(check="setup", ok=False, error="torch sees no CUDA device")
        return 1
    emit(check="setup", ok=True, torch=torch.__version__,
         dcp=getattr(dcp, "version", "?"), device=device,
         dcp_file=dcp.__file__)
    base = tempfile.mkdtemp(prefix="dcp-py-cuda-", dir=args.dir)
    ok = True
    try:
        for check in (check_roundtrip, check_stream_order,
                      check_load_order, check_convert, check_strided_load):
            try:
                ok &= check(torch, dcp, device, base)
            except Exception as e:  # One check's failure is its row.
                ok &= emit(check=check.__name__[6:], ok=False, error=repr(e))
        for kind in ("THREAD", "PROCESS"):
            try:
                ok &= check_async(torch, dcp, device, base, kind)
            except Exception as e:
                ok &= emit(check=f"async_{kind.lower()}", ok=False,
                           error=repr(e))
            try:
                ok &= check_async_stager(torch, dcp, device, base, kind)
            except Exception as e:
                ok &= emit(check=f"async_stager_{kind.lower()}", ok=False,
                           error=repr(e))
        if device.startswith("cuda"):
            try:
                ok &= check_copy_on_write_pinned(torch, dcp, device, base)
            except Exception as e:
                ok &= emit(check="copy_on_write_pinned", ok=False,
                           error=repr(e))
        try:
            ok &= check_state_dict(torch, dcp, device, base)
        except Exception as e:
            ok &= emit(check="state_dict", ok=False, error=repr(e))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
