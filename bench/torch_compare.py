#!/usr/bin/env python3
"""The PyTorch peer of `dcp demo`, measured on the same data.

Regenerates, with vectorised numpy, exactly the tensors of
MakeSyntheticState (tools/synthetic_state.cc) for one rank: the same
flattened names, shapes, dtypes and bytes (SplitMix64 over the per-name key
and the global 8-byte word index). Then:

  run        saves them with torch.distributed.checkpoint (dcp.save,
             FileSystemWriter(sync_files=True)) in one subprocess and loads
             them into zero-filled tensors (dcp.load, FileSystemReader) in
             another, after dropping the page cache of the written files
             (fdatasync + POSIX_FADV_DONTNEED, as `dcp demo` does), so the load
             is cold; then loads them once more in a third subprocess after
             reading every file (page cache warm: the software path alone).
             Each phase reports its time and peak RSS; the loads verify every
             byte against the generation.
  check-dcp  proves the data is identical to ours: reads the `.metadata` of a
             checkpoint written by `dcp demo --mode save --dir D --seed S
             --size X` with a small independent decoder of the format in
             docs/FORMAT.md (header, XXH3-free: the payload is decoded as raw
             protobuf wire format) and compares the stored bytes of every
             tensor item with the Python generation, byte for byte.
  gen-check  self-test of the generator against constants computed by hand
             from the C++ algorithm (SplitMix64 reference values).

Both phases of `run` mirror the demo's process: the save process holds the
generated state; the load process holds the expected state (regenerated, as
the demo does) plus the destination tensors.

Output with --json: one object with torch_version, bytes, save_seconds,
load_seconds, save_gbps, load_gbps, load_warm_seconds, load_warm_gbps,
save_peak_rss_bytes, load_peak_rss_bytes, verified, and for each timed
phase P in save, load, load_warm: P_user_seconds, P_system_seconds,
P_minor_faults, P_major_faults (plus a few extra fields).
"""

import argparse
import json
import os
import re
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

MASK64 = (1 << 64) - 1
K_LAYERS = 8
K_COLS = 1024

# core/dtype.h codes (never renumbered) for the dtypes the state uses.
DTYPE_CODES = {"F32": 11, "BF16": 10, "I64": 8}
ELEMENT_SIZE = {"F32": 4, "BF16": 2, "I64": 8}


# ---------------------------------------------------------------- generation


def splitmix64_int(x):
    """SplitMix64 of one Python int (mod 2^64), as in synthetic_state.cc."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def name_key(seed, name):
    key = seed & MASK64
    for c in name.encode():
        key = splitmix64_int(key ^ c)
    return key


_C2 = np.uint64(0xBF58476D1CE4E5B9)
_C3 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_WORDS_PER_STEP = 1 << 20  # 8 MiB of temporaries per step.


def _splitmix64_words(key, first_word, out_words):
    """out_words[i] = SplitMix64(key + first_word + i), uint64 wrapping."""
    n = out_words.shape[0]
    step = min(n, _WORDS_PER_STEP)
    tmp = np.empty(step, dtype=np.uint64)
    index = np.arange(step, dtype=np.uint64)
    base = (key + first_word) & MASK64
    for start in range(0, n, _WORDS_PER_STEP):
        m = min(_WORDS_PER_STEP, n - start)
        x = out_words[start:start + m]
        t = tmp[:m]
        np.add(index[:m], np.uint64((base + start + 0x9E3779B97F4A7C15) &
                                    MASK64), out=x)
        np.right_shift(x, _S30, out=t)
        x ^= t
        x *= _C2
        np.right_shift(x, _S27, out=t)
        x ^= t
        x *= _C3
        np.right_shift(x, _S31, out=t)
        x ^= t


def fill_bytes(seed, name, global_byte_offset, nbytes, out=None):
    """The bytes FillChunk writes for `name` at [offset, offset + nbytes)."""
    if out is None:
        out = np.empty(nbytes, dtype=np.uint8)
    if nbytes == 0:
        return out
    key = name_key(seed, name)
    first_word = global_byte_offset // 8
    last_word = (global_byte_offset + nbytes - 1) // 8
    head = global_byte_offset % 8
    nwords = last_word - first_word + 1
    if head == 0 and nbytes % 8 == 0 and out.ctypes.data % 8 == 0:
        _splitmix64_words(key, first_word, out.view(np.uint64))
        return out
    words = np.empty(nwords, dtype=np.uint64)
    _splitmix64_words(key, first_word, words)
    out[:] = words.view(np.uint8)[head:head + nbytes]  # Little-endian words.
    return out


def state_layout(total_bytes):
    """[(flattened name, dtype, shape, row_sharded)] of MakeSyntheticState."""
    per_layer = max(total_bytes // K_LAYERS, 1)
    rows = max(per_layer // (14 * K_COLS), 1)
    layout = []
    for layer in range(K_LAYERS):
        p = f"model.layers.{layer}"
        layout.append((f"{p}.weight", "F32", (rows, K_COLS)))
        layout.append((f"{p}.proj_bf16", "BF16", (rows, K_COLS)))
        layout.append((f"{p}.bias", "F32", (K_COLS,)))
        o = f"optim.state.{layer}"
        layout.append((f"{o}.exp_avg", "F32", (rows, K_COLS)))
        layout.append((f"{o}.exp_avg_sq", "F32", (rows, K_COLS)))
        layout.append((f"{o}.step", "I64", ()))
    return layout


def nbytes_of(dtype, shape):
    n = ELEMENT_SIZE[dtype]
    for d in shape:
        n *= d
    return n


def generate_tensor_bytes(seed, name, dtype, shape):
    # One rank: a row shard covers the whole tensor (global offset 0).
    return fill_bytes(seed, name, 0, nbytes_of(dtype, shape))


PLAIN_VALUES = {  # Flattened name -> value, as MakeSyntheticState fills them.
    "optim.param_groups.0.lr": 3e-4,
    "optim.param_groups.0.betas.0": 0.9,
    "optim.param_groups.0.betas.1": 0.999,
    "optim.param_groups.0.name": "adamw",
    "epoch": 7,
    "rng_state": b"\x01\x02\x00\xff",
}


# --------------------------------------------------------------- torch side


def _torch_dtype(torch, dtype):
    return {"F32": torch.float32, "BF16": torch.bfloat16,
            "I64": torch.int64}[dtype]


def build_torch_state(torch, seed, total_bytes, fill):
    """The nested state dict of MakeSyntheticState as torch tensors."""
    model, optim_state = {}, {}
    for name, dtype, shape in state_layout(total_bytes):
        n = nbytes_of(dtype, shape)
        if fill:
            raw = torch.from_numpy(generate_tensor_bytes(seed, name, dtype,
                                                         shape))
        else:
            raw = torch.zeros(n, dtype=torch.uint8)
        t = raw.view(_torch_dtype(torch, dtype)).reshape(shape)
        parts = name.split(".")
        if parts[0] == "model":  # model.layers.<i>.<leaf>
            model.setdefault(f"layers.{parts[2]}", {})[parts[3]] = t
        else:  # optim.state.<i>.<leaf>
            optim_state.setdefault(parts[2], {})[parts[3]] = t
    group = {"lr": 3e-4 if fill else 0.0,
             "betas": [0.9 if fill else 0.0, 0.999 if fill else 0.0],
             "name": "adamw" if fill else ""}
    return {
        "model": model,
        "optim": {"state": optim_state, "param_groups": [group]},
        "epoch": 7 if fill else 0,
        "rng_state": b"\x01\x02\x00\xff" if fill else b"",
    }


def drop_page_cache(directory):
    for root, _, files in os.walk(directory):
        for f in files:
            try:
                fd = os.open(os.path.join(root, f), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def max_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def resource_use(prefix, before):
    """CPU time and page faults since `before` (a getrusage of this process),
    as fields named after the phase: the load's first touches of fresh
    memory (its read buffers) show up as minor faults and system time."""
    now = resource.getrusage(resource.RUSAGE_SELF)
    return {f"{prefix}_user_seconds": now.ru_utime - before.ru_utime,
            f"{prefix}_system_seconds": now.ru_stime - before.ru_stime,
            f"{prefix}_minor_faults": now.ru_minflt - before.ru_minflt,
            f"{prefix}_major_faults": now.ru_majflt - before.ru_majflt}


def phase_save(args):
    import torch
    import torch.distributed.checkpoint as tdcp
    state = build_torch_state(torch, args.seed, args.size, fill=True)
    rss_before = max_rss_bytes()
    writer = tdcp.FileSystemWriter(args.dir, sync_files=True,
                                   thread_count=args.thread_count)
    os.sync()  # As before each dcp and fio measurement.
    usage = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    tdcp.save(state, storage_writer=writer)
    seconds = time.perf_counter() - start
    return {"save_seconds": seconds, "save_peak_rss_bytes": max_rss_bytes(),
            "save_rss_before_bytes": rss_before,
            **resource_use("save", usage)}


def warm_page_cache(directory):
    """Reads every file once so that the load after it reads from memory."""
    for root, _, files in os.walk(directory):
        for f in files:
            with open(os.path.join(root, f), "rb", buffering=0) as src:
                while src.read(8 << 20):
                    pass


def phase_load(args, warm=False):
    import torch
    import torch.distributed.checkpoint as tdcp
    # As the demo: the expected state first, then the cache drop (or, warm,
    # a read of every file), then the zero-filled destination, then the
    # timed load.
    expected = build_torch_state(torch, args.seed, args.size, fill=True)
    if warm:
        warm_page_cache(args.dir)
    else:
        drop_page_cache(args.dir)
    dest = build_torch_state(torch, args.seed, args.size, fill=False)
    rss_before = max_rss_bytes()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    tdcp.load(dest, storage_reader=tdcp.FileSystemReader(args.dir))
    seconds = time.perf_counter() - start
    use = resource_use("load", usage)
    peak = max_rss_bytes()
    problems = compare_states(torch, expected, dest)
    return {"load_seconds": seconds, "load_peak_rss_bytes": peak,
            "load_rss_before_bytes": rss_before, **use,
            "verified": not problems, "problems": problems[:5]}


def compare_states(torch, expected, actual, prefix=""):
    problems = []
    if isinstance(expected, dict):
        for k, v in expected.items():
            if k not in actual:
                problems.append(f"{prefix}{k}: missing after load")
            else:
                problems += compare_states(torch, v, actual[k],
                                           f"{prefix}{k}.")
    elif isinstance(expected, list):
        for i, v in enumerate(expected):
            problems += compare_states(torch, v, actual[i], f"{prefix}{i}.")
    elif isinstance(expected, torch.Tensor):
        name = prefix[:-1]
        if (expected.dtype != actual.dtype or
                expected.shape != actual.shape):
            problems.append(f"{name}: dtype/shape differ")
        else:
            e = expected.reshape(-1).view(torch.uint8)
            a = actual.reshape(-1).view(torch.uint8)
            if not torch.equal(e, a):
                i = int((e != a).nonzero()[0])
                problems.append(f"{name}: bytes differ at byte offset {i}")
    elif expected != actual:
        problems.append(f"{prefix[:-1]}: value differs")
    return problems


def run_phase_subprocess(phase, args, directory):
    cmd = [sys.executable, os.path.abspath(__file__), "_phase", phase,
           "--dir", directory, "--size", str(args.size), "--seed",
           str(args.seed), "--thread-count", str(args.thread_count)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"torch_compare: {phase} phase failed "
                         f"(exit {proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def command_run(args):
    import torch
    parent = args.dir or tempfile.gettempdir()
    os.makedirs(parent, exist_ok=True)
    directory = tempfile.mkdtemp(prefix="torch-dcp-", dir=parent)
    try:
        save = run_phase_subprocess("save", args, directory)
        load = run_phase_subprocess("load", args, directory)
        warm = run_phase_subprocess("load-warm", args, directory)
        file_bytes = sum(os.path.getsize(os.path.join(r, f))
                         for r, _, fs in os.walk(directory) for f in fs)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    nbytes = sum(nbytes_of(d, s) for _, d, s in state_layout(args.size))
    gb = nbytes / 1e9
    result = {
        "torch_version": torch.__version__,
        "bytes": nbytes,
        "file_bytes": file_bytes,
        "save_seconds": save["save_seconds"],
        "load_seconds": load["load_seconds"],
        "save_gbps": gb / save["save_seconds"],
        "load_gbps": gb / load["load_seconds"],
        "load_warm_seconds": warm["load_seconds"],
        "load_warm_gbps": gb / warm["load_seconds"],
        "save_peak_rss_bytes": save["save_peak_rss_bytes"],
        "load_peak_rss_bytes": load["load_peak_rss_bytes"],
        "save_rss_before_bytes": save["save_rss_before_bytes"],
        "load_rss_before_bytes": load["load_rss_before_bytes"],
        "verified": load["verified"] and warm["verified"],
        "thread_count": args.thread_count,
    }
    for phase, prefix, source in (("save", "save", save), ("load", "load", load),
                                  ("load", "load_warm", warm)):
        for field in ("user_seconds", "system_seconds", "minor_faults",
                      "major_faults"):
            result[f"{prefix}_{field}"] = source[f"{phase}_{field}"]
    if not result["verified"]:
        result["problems"] = load["problems"] + warm["problems"]
    if args.json:
        print(json.dumps(result))
    else:
        print(f"torch {result['torch_version']} distributed.checkpoint, "
              f"{nbytes} bytes")
        print(f"  save  {result['save_seconds']:.3f} s  "
              f"{result['save_gbps']:.3f} GB/s  peak RSS "
              f"{result['save_peak_rss_bytes'] / 2**20:.0f} MiB")
        print(f"  load  {result['load_seconds']:.3f} s  "
              f"{result['load_gbps']:.3f} GB/s  peak RSS "
              f"{result['load_peak_rss_bytes'] / 2**20:.0f} MiB "
              f"(page cache dropped; {result['load_minor_faults']} minor "
              f"faults, {result['load_system_seconds']:.2f} s system time)")
        print(f"  load  {result['load_warm_seconds']:.3f} s  "
              f"{result['load_warm_gbps']:.3f} GB/s (page cache warm)")
        print(f"  verify (every byte) {'ok' if result['verified'] else 'FAILED'}")
    return 0 if result["verified"] else 1


# ------------------------------------------- reading a dcp checkpoint (FORMAT.md)

_MAGIC = b"\x89DCP\r\n\x1a\n"


def _varint(buf, pos):
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def _fields(buf):
    """Yields (field number, wire type, value) of one protobuf message."""
    pos = 0
    while pos < len(buf):
        tag, pos = _varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value = buf[pos:pos + 8]
            pos += 8
        elif wire == 2:
            n, pos = _varint(buf, pos)
            value = buf[pos:pos + n]
            pos += n
        elif wire == 5:
            value = buf[pos:pos + 4]
            pos += 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        yield number, wire, value


def _packed_varints(value, signed):
    out, pos = [], 0
    while pos < len(value):
        v, pos = _varint(value, pos)
        if signed and v >= 1 << 63:
            v -= 1 << 64
        out.append(v)
    return out


def _string_table(buf):
    blob, lengths = b"", []
    for number, wire, value in _fields(buf):
        if number == 1:
            blob = bytes(value)
        elif number == 2:
            lengths += (_packed_varints(value, False) if wire == 2
                        else [value])
    names, pos = [], 0
    for n in lengths:
        names.append(blob[pos:pos + n].decode())
        pos += n
    return names


def read_dcp_metadata(directory):
    """The parts of `.metadata` this check needs (docs/FORMAT.md, io/format.proto)."""
    with open(os.path.join(directory, ".metadata"), "rb") as f:
        data = f.read()
    if data[:8] != _MAGIC:
        raise SystemExit(f"{directory}/.metadata is not a dcp metadata file")
    header_version, _, payload_length = struct.unpack_from("<IIQ", data, 8)
    if header_version != 1 or len(data) != 32 + payload_length:
        raise SystemExit(f"{directory}/.metadata: unexpected header")
    payload = memoryview(data)[32:]
    signed = {9, 11, 12, 20, 22, 23}  # int64 fields.
    arrays, md = {}, {"files": []}
    for number, wire, value in _fields(payload):
        if number == 1:
            md["version"] = bytes(value).decode()
        elif number == 3:
            md["names"] = _string_table(value)
        elif number == 17:
            md["files"].append(bytes(value).decode())
        elif number == 25:
            arrays.setdefault(25, []).extend(
                struct.unpack(f"<{len(value) // 8}Q", value))
        elif 4 <= number <= 24 and number not in (16, 17):
            vals = (_packed_varints(value, number in signed) if wire == 2
                    else [value - (1 << 64) if number in signed and
                          value >= 1 << 63 else value])
            arrays.setdefault(number, []).extend(vals)
    names = md["names"]
    get = lambda n: arrays.get(n, [])
    # Tensors: name -> (dtype code, shape).
    tensors, size_pos, t = {}, 0, 0
    for name_id, kind in zip(get(4), get(5)):
        if kind != 1:
            continue
        rank = get(8)[t]
        tensors[names[name_id]] = (get(6)[t],
                                   tuple(get(9)[size_pos:size_pos + rank]))
        size_pos += rank
        t += 1
    # Stored items: (name, chunk offset or None, file, offset, length).
    items, off_pos = [], 0
    for i, name_id in enumerate(get(18)):
        r = get(19)[i]
        chunk = None
        if r > 0:
            chunk = tuple(get(20)[off_pos:off_pos + r - 1])
            off_pos += r - 1
        items.append((names[name_id], chunk, md["files"][get(21)[i]],
                      get(22)[i], get(23)[i]))
    return md["version"], tensors, items


def command_check_dcp(args):
    version, tensors, items = read_dcp_metadata(args.dir)
    layout = {n: (d, s) for n, d, s in state_layout(args.size)}
    problems, checked_bytes, checked_items = [], 0, 0
    if set(tensors) != set(layout):
        problems.append(f"tensor names differ: only in checkpoint "
                        f"{sorted(set(tensors) - set(layout))}, only in "
                        f"Python {sorted(set(layout) - set(tensors))}")
    for name, (dtype, shape) in layout.items():
        if name in tensors and tensors[name] != (DTYPE_CODES[dtype], shape):
            problems.append(f"{name}: checkpoint has dtype code/shape "
                            f"{tensors[name]}, Python {DTYPE_CODES[dtype]}"
                            f"/{shape}")
    for name, chunk, file, offset, length in items:
        if chunk is None or name not in layout:
            continue  # Plain values (planner encoding) are not compared.
        dtype, shape = layout[name]
        # A chunk of full rows (or the whole tensor) is one contiguous byte
        # range of the tensor starting at its first row.
        row_bytes = nbytes_of(dtype, shape[1:]) if shape else 0
        global_offset = chunk[0] * row_bytes if chunk else 0
        expected = fill_bytes(args.seed, name, global_offset, length)
        with open(os.path.join(args.dir, file), "rb") as f:
            f.seek(offset)
            stored = np.frombuffer(f.read(length), dtype=np.uint8)
        checked_items += 1
        checked_bytes += length
        if stored.shape != expected.shape or not np.array_equal(stored,
                                                                expected):
            where = (int(np.argmax(stored != expected))
                     if stored.shape == expected.shape else "length")
            problems.append(f"{name} chunk {chunk} in {file}@{offset}: "
                            f"bytes differ at {where}")
    covered = {n for n, c, *_ in items if c is not None}
    for name in layout:
        if name not in covered:
            problems.append(f"{name}: no stored item")
    result = {"format": version, "tensors": len(tensors),
              "items_compared": checked_items, "bytes_compared": checked_bytes,
              "identical": not problems, "problems": problems[:10]}
    if args.json:
        print(json.dumps(result))
    else:
        for p in problems:
            print(f"DIFF {p}")
        print(f"{'IDENTICAL' if not problems else 'DIFFERENT'}: "
              f"{checked_items} tensor items, {checked_bytes} bytes of "
              f"{args.dir} compared with the Python generation "
              f"(seed {args.seed}, size {args.size})")
    return 0 if not problems else 1


# ----------------------------------------------------------------- self-test


def command_gen_check(args):
    # SplitMix64(0) is the first output of the well-known SplitMix64
    # generator seeded with 0 (state += gamma, then mix).
    assert splitmix64_int(0) == 0xE220A8397B1DCDAF
    words = np.empty(4, dtype=np.uint64)
    _splitmix64_words(12345, 7, words)
    ref = [splitmix64_int((12345 + 7 + i) & MASK64) for i in range(4)]
    assert [int(w) for w in words] == ref, (words, ref)
    # Unaligned offsets agree with the aligned generation.
    whole = fill_bytes(3, "x", 0, 100)
    for off in (0, 1, 7, 8, 13):
        assert np.array_equal(fill_bytes(3, "x", off, 100 - off), whole[off:])
    # Wrap-around of key + word index.
    _splitmix64_words(MASK64, 0, words)
    assert int(words[1]) == splitmix64_int(0)
    print("generator self-test ok")
    return 0


# ----------------------------------------------------------------------- main


def parse_size(text):
    m = re.fullmatch(r"([0-9.]+)\s*([A-Za-z]*)", str(text))
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {text!r}")
    unit = m.group(2).lower()
    scale = {"": 1, "b": 1, "k": 1024, "kib": 1024, "kb": 1024,
             "m": 2**20, "mib": 2**20, "mb": 2**20,
             "g": 2**30, "gib": 2**30, "gb": 2**30}.get(unit)
    if scale is None:
        raise argparse.ArgumentTypeError(f"bad size unit in {text!r}")
    return int(float(m.group(1)) * scale)  # As dcp's ParseSize.


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", nargs="?", default="run",
                   choices=["run", "check-dcp", "gen-check", "_phase"])
    p.add_argument("phase", nargs="?", choices=["save", "load", "load-warm"])
    p.add_argument("--size", type=parse_size, default=parse_size("1GiB"))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--dir", default="",
                   help="run: parent directory of the torch checkpoint "
                        "(removed afterwards); check-dcp: the dcp checkpoint")
    p.add_argument("--thread-count", type=int, default=1,
                   help="FileSystemWriter thread_count (torch default: 1)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.command == "_phase":
        if args.phase == "save":
            result = phase_save(args)
        else:
            result = phase_load(args, warm=args.phase == "load-warm")
        print(json.dumps(result))
        return 0
    if args.command == "check-dcp":
        if not args.dir:
            p.error("check-dcp needs --dir")
        return command_check_dcp(args)
    if args.command == "gen-check":
        return command_gen_check(args)
    return command_run(args)


if __name__ == "__main__":
    sys.exit(main())
