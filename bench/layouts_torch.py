#!/usr/bin/env python3
"""torch.distributed.checkpoint on the layouts of `dcp bench layouts`.

  layouts_torch.py save --spec SPEC.json --dir D
  layouts_torch.py load --spec SPEC.json --dir D

SPEC is written by bench/layouts_bench.cc: {"layout", "seed", "bytes",
"tensors": [[path, dtype, shape], ...], "samples": [[index, hex], ...]}, the
tensors in the order of the layout's byte stream, and the first bytes of
some of them as the C++ side generates them (checked here before a save). Tensor i holds bytes [o_i, o_i + n_i) of the stream,
o_i the sizes of the tensors before it added up; byte g of the stream is
byte g % 8 (little-endian) of SplitMix64(key + g // 8), key the layout's
name folded into the seed: torch_compare.fill_bytes(seed, layout, g, n),
as the C++ side generates it. Every tensor is an allocation of its own,
nested in dicts along its path (as a model's and an optimizer's state
dicts are).

  save  builds the state, then times dcp.save(state, storage_writer=
        FileSystemWriter(D)) with torch's defaults (one thread,
        sync_files=True), after os.sync().
  load  builds a zero-filled destination, drops D's pages from the page
        cache, times dcp.load(dest, storage_reader=FileSystemReader(D)),
        then checks every byte against the stream.

Prints one JSON object: phase, layout, tensors, bytes, seconds,
rss_before_io_bytes and peak_rss_bytes (ru_maxrss before and right after
the timed call), user_seconds, system_seconds, minor_faults, major_faults,
verified (and problem when not), torch_version. Generation and checks go
64 MiB of the stream at a time, so neither adds a copy of the state to the
peak.
"""

import argparse
import json
import os
import resource
import sys
import time
import warnings

import numpy as np

from torch_compare import drop_page_cache, fill_bytes, max_rss_bytes, \
    resource_use

_PIECE = 64 << 20


def torch_dtype(torch, name):
    return {"F32": torch.float32, "BF16": torch.bfloat16,
            "F16": torch.float16, "F8_E4M3": torch.float8_e4m3fn,
            "I64": torch.int64, "I32": torch.int32,
            "U8": torch.uint8}[name]


def build(torch, spec, fill):
    """(nested state dict, [tensor] in stream order), filled or zeroed."""
    root, tensors = {}, []
    make = torch.empty if fill else torch.zeros
    for path, dtype, shape in spec["tensors"]:
        t = make(shape, dtype=torch_dtype(torch, dtype))
        d = root
        for key in path[:-1]:
            d = d.setdefault(key, {})
        d[path[-1]] = t
        tensors.append(t)
    if fill:
        for start, views in pieces(torch, tensors):
            expected = fill_bytes(spec["seed"], spec["layout"], start,
                                  sum(v.size for _, v in views))
            pos = 0
            for _, v in views:
                v[:] = expected[pos:pos + v.size]
                pos += v.size
        # The C++ side's bytes of some tensors: both generate the same state.
        for i, head in spec["samples"]:
            got = bytes(tensors[i].reshape(-1).view(torch.uint8)
                        [:len(head) // 2].numpy()).hex()
            if got != head:
                raise SystemExit(f"layouts_torch: tensor {i} of "
                                 f"{spec['layout']} starts {got}, the C++ "
                                 f"side generates {head}")
    return root, tensors


def pieces(torch, tensors):
    """Yields (stream offset, [(tensor index, numpy byte view)]) covering the
    stream in order, at most _PIECE bytes each (large tensors split)."""
    offset, start, run, size = 0, 0, [], 0
    for i, t in enumerate(tensors):
        v = t.reshape(-1).view(torch.uint8).numpy()
        pos = 0
        while pos < v.size:
            m = min(v.size - pos, _PIECE - size)
            if not run:
                start = offset
            run.append((i, v[pos:pos + m]))
            size += m
            pos += m
            offset += m
            if size == _PIECE:
                yield start, run
                run, size = [], 0
    if run:
        yield start, run


def verify(torch, spec, tensors):
    """None, or where the first loaded byte differs from the stream."""
    for start, views in pieces(torch, tensors):
        expected = fill_bytes(spec["seed"], spec["layout"], start,
                              sum(v.size for _, v in views))
        pos = 0
        for i, v in views:
            e = expected[pos:pos + v.size]
            if not np.array_equal(v, e):
                path = ".".join(spec["tensors"][i][0])
                at = int(np.argmax(v != e))
                return f"{path} differs at stream offset {start + pos + at}"
            pos += v.size
    return None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("phase", choices=["save", "load"])
    p.add_argument("--spec", required=True)
    p.add_argument("--dir", required=True)
    args = p.parse_args()
    warnings.filterwarnings("ignore")  # "assuming a single process", etc.
    import torch
    import torch.distributed.checkpoint as tdcp
    with open(args.spec) as f:
        spec = json.load(f)
    save = args.phase == "save"
    state, tensors = build(torch, spec, fill=save)
    if save:
        os.sync()  # What earlier steps left for the disk, before the clock.
    else:
        drop_page_cache(args.dir)
    rss_before = max_rss_bytes()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    if save:
        tdcp.save(state, storage_writer=tdcp.FileSystemWriter(args.dir))
    else:
        tdcp.load(state, storage_reader=tdcp.FileSystemReader(args.dir))
    seconds = time.perf_counter() - start
    use = resource_use(args.phase, usage)
    peak = max_rss_bytes()
    problem = None if save else verify(torch, spec, tensors)
    out = {"phase": args.phase, "layout": spec["layout"],
           "tensors": len(tensors),
           "bytes": sum(t.numel() * t.element_size() for t in tensors),
           "seconds": seconds, "rss_before_io_bytes": rss_before,
           "peak_rss_bytes": peak, "verified": problem is None,
           "torch_version": torch.__version__}
    for field in ("user_seconds", "system_seconds", "minor_faults",
                  "major_faults"):
        out[field] = use[f"{args.phase}_{field}"]
    if problem:
        out["problem"] = problem
    print(json.dumps(out))  # The caller checks "verified".
    return 0


if __name__ == "__main__":
    sys.exit(main())
