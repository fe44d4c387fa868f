"""Randomized multi-process differential test: dcp vs torch.distributed.checkpoint.

Not part of the pytest suite (slow: two process spawns per trial). One trial
saves a random state (DTensors of 1-3 dims on 1-d and 2-d meshes with sizes
0-9, so some ranks hold empty shards; replicated and 0-d tensors; plain
values) with S gloo ranks through dcp.save and torch's save, then loads both
with L ranks into other placements, dtypes and plain tensors (also
dcp.async_save, and partial loads), and checks every element against the
seed's ground truth and dcp against torch:

    DCP_LIBRARY=$PWD/bazel-bin/capi/libdcp.so PYTHONPATH=python \
        .venv/bin/python python/tests/differential_torch_dcp.py SEED [WORKDIR]

Prints findings (lines starting with FINDING) and a summary line; exit
status 1 when there are findings. WORKDIR defaults to
$TMPDIR/dcp_torch_differential (each trial in WORKDIR/runs/SEED). A loop:
for s in $(seq 100 199); do ... SEED=$s ...; done.
"""
import json
import os
import random
import shutil
import sys
import traceback

import torch
import torch.multiprocessing as mp

ROOT = os.path.join(os.environ.get("TMPDIR", "/tmp"), "dcp_torch_differential")
DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.float16]
DTN = {torch.float32: "f32", torch.bfloat16: "bf16", torch.int64: "i64",
       torch.float16: "f16"}


# ---------------------------------------------------------------- the spec
def rand_placements(rng, ndim, world):
    """('1d'|'2d', [('S', d) | ('R',)...])"""
    def one():
        if ndim > 0 and rng.random() < 0.7:
            return ("S", rng.randrange(ndim))
        return ("R",)
    if world == 4 and rng.random() < 0.4:
        return ("2d", [one(), one()])
    return ("1d", [one()])


def rand_plain(rng, depth=0):
    k = rng.random()
    if depth < 2 and k < 0.15:
        return {f"k{i}": rand_plain(rng, depth + 1)
                for i in range(rng.randint(1, 3))}
    if depth < 2 and k < 0.3:
        return [rand_plain(rng, depth + 1) for _ in range(rng.randint(1, 3))]
    if k < 0.55:
        return rng.randint(-10**6, 10**6)
    if k < 0.75:
        return rng.uniform(-1e3, 1e3)
    if k < 0.9:
        return "s" + "".join(rng.choice("abcxyz_.") for _ in range(rng.randint(0, 6)))
    return rng.choice([True, False, None])


def make_spec(seed):
    rng = random.Random(seed)
    S = rng.randint(1, 4)
    L = rng.randint(1, 4)
    ents = []  # tensor entries
    n = rng.randint(2, 6)
    for i in range(n):
        kind = rng.random()
        if kind < 0.7:
            ndim = rng.randint(1, 3)
            shape = [rng.randint(0, 9) for _ in range(ndim)]
            save = ("dt",) + rand_placements(rng, ndim, S)
        elif kind < 0.85:
            ndim = rng.randint(1, 2)
            shape = [rng.randint(0, 9) for _ in range(ndim)]
            save = ("plain",)
        else:
            shape = []
            save = ("dt", "1d", [("R",)]) if rng.random() < 0.5 else ("plain",)
        dtype = rng.choice(DTYPES)
        if rng.random() < 0.2:
            load = ("plain",)
        else:
            load = ("dt",) + rand_placements(rng, len(shape), L)
        ldtype = dtype if rng.random() < 0.75 else rng.choice(DTYPES)
        prefix = rng.choice(["", "model.", "model.layer.", "optim.state.0."])
        ents.append(dict(name=f"{prefix}t{i}", shape=shape, dtype=DTN[dtype],
                         save=save, load=load, ldtype=DTN[ldtype],
                         omit=rng.random() < 0.1, gen=seed * 1000 + i))
    plain = {f"p{i}": rand_plain(rng) for i in range(rng.randint(1, 4))}
    plain["step"] = rng.randint(0, 10**9)
    plain["cfg"] = {"lr": rng.uniform(0, 1), "name": "run%d" % seed,
                    "sizes": [rng.randint(0, 9) for _ in range(rng.randint(1, 3))]}
    async_save = rng.random() < 0.4
    partial = rng.random() < 0.4
    return dict(seed=seed, S=S, L=L, ents=ents, plain=plain,
                async_save=async_save, partial=partial)


DTYPE_OF = {v: k for k, v in DTN.items()}


def full_tensor(e):
    g = torch.Generator().manual_seed(e["gen"])
    dt = DTYPE_OF[e["dtype"]]
    if dt == torch.int64:
        return torch.randint(-1000, 1000, e["shape"], generator=g, dtype=torch.int64)
    return (torch.randn(e["shape"], generator=g) * 10).to(dt)


# ---------------------------------------------------------------- helpers
def set_path(d, name, v):
    parts = name.split(".")
    for p in parts[:-1]:
        d = d.setdefault(p, {})
    d[parts[-1]] = v


def get_path(d, name):
    for p in name.split("."):
        d = d[p]
    return d


def zero_plain(v):
    if isinstance(v, dict):
        return {k: zero_plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [zero_plain(x) for x in v]
    if isinstance(v, bool):
        return not v
    if isinstance(v, int):
        return 0
    if isinstance(v, float):
        return 0.0
    if isinstance(v, str):
        return "zzz"
    return 123  # None -> 123


class Ctx:
    def __init__(self, world):
        from torch.distributed.device_mesh import init_device_mesh
        self.world = world
        self.m1 = init_device_mesh("cpu", (world,))
        self.m2 = init_device_mesh("cpu", (2, 2)) if world == 4 else None

    def placements(self, spec):
        from torch.distributed.tensor import Replicate, Shard
        mesh = self.m1 if spec[1] == "1d" else self.m2
        pl = [Shard(p[1]) if p[0] == "S" else Replicate() for p in spec[2]]
        return mesh, pl

    def build(self, full, spec, dtype=None, zero=False):
        """The local object for `spec` holding `full` (or zeros)."""
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor._utils import \
            compute_local_shape_and_global_offset
        src = full if dtype is None else full.to(dtype)
        if spec[0] == "plain":
            t = src.clone()
            return torch.zeros_like(t) if zero else t
        mesh, pl = self.placements(spec)
        shape, off = compute_local_shape_and_global_offset(full.shape, mesh, pl)
        idx = tuple(slice(o, o + s) for o, s in zip(off, shape))
        local = src[idx].clone().contiguous()
        if zero:
            local = torch.zeros_like(local)
        return DTensor.from_local(local, mesh, pl, shape=full.shape,
                                  stride=full.stride(), run_check=False)

    def expected_local(self, full, spec, dtype):
        from torch.distributed.tensor import DTensor
        t = self.build(full, spec, dtype=dtype)
        return t.to_local() if isinstance(t, DTensor) else t


def local_of(t):
    from torch.distributed.tensor import DTensor
    return t.to_local() if isinstance(t, DTensor) else t


def describe(e):
    return (f"{e['name']} shape={e['shape']} {e['dtype']} save={e['save']} "
            f"load={e['load']} ldtype={e['ldtype']}")


def teq(a, b):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.is_floating_point:
        return torch.equal(a.float().nan_to_num(7.0), b.float().nan_to_num(7.0))
    return torch.equal(a, b)


def plain_eq(a, b):
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(plain_eq(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(plain_eq(x, y) for x, y in zip(a, b))
    return a == b


# ---------------------------------------------------------------- phases
def _finish(dist, res, outdir, phase, rank):
    """Writes this rank's results for the parent, then leaves the group."""
    with open(os.path.join(outdir, f"{phase}_{rank}.json"), "w") as f:
        json.dump(res, f)
    try:
        dist.destroy_process_group()
    except Exception:
        pass


def save_phase(rank, spec, outdir):
    import torch.distributed as dist
    import torch.distributed.checkpoint as tdcp
    import dcp
    S = spec["S"]
    store = os.path.join(outdir, "store_save")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=S)
    res = {"rank": rank, "errors": {}, "notes": []}
    try:
        ctx = Ctx(S)
        state = {}
        for e in spec["ents"]:
            set_path(state, e["name"], ctx.build(full_tensor(e), e["save"]))
        for k, v in spec["plain"].items():
            state[k] = v
        for lib in ("dcp", "torch"):
            try:
                if lib == "dcp":
                    dcp.save(state, checkpoint_id=os.path.join(outdir, "A"))
                else:
                    tdcp.save(state, checkpoint_id=os.path.join(outdir, "B"))
            except BaseException as ex:
                res["errors"][lib] = f"{type(ex).__name__}: {ex}"[:2000]
                res["notes"].append(traceback.format_exc()[-3000:])
        if spec["async_save"]:
            try:
                f = dcp.async_save(state, checkpoint_id=os.path.join(outdir, "A2"))
                f.result(100)
            except BaseException as ex:
                res["errors"]["dcp_async"] = f"{type(ex).__name__}: {ex}"[:2000]
                res["notes"].append(traceback.format_exc()[-3000:])
        # metadata agreement (rank 0)
        if rank == 0 and not res["errors"]:
            try:
                md_a = dcp.read_metadata(os.path.join(outdir, "A"))
                md_b = tdcp.FileSystemReader(os.path.join(outdir, "B")).read_metadata()
                for k, m in md_b.state_dict_metadata.items():
                    if hasattr(m, "size"):
                        ma = md_a.state_dict_metadata.get(k)
                        if ma is None:
                            res["notes"].append(f"META: dcp lacks tensor key {k}")
                        elif tuple(ma.size) != tuple(m.size):
                            res["notes"].append(f"META: size {k} dcp={ma.size} torch={m.size}")
                        else:
                            ca = sorted((tuple(c.offsets), tuple(c.sizes)) for c in ma.chunks)
                            cb = sorted((tuple(c.offsets), tuple(c.sizes)) for c in m.chunks)
                            ca_ne = [c for c in ca if all(s > 0 for s in c[1]) or not c[1]]
                            cb_ne = [c for c in cb if all(s > 0 for s in c[1]) or not c[1]]
                            if ca_ne != cb_ne:
                                res["notes"].append(f"META: chunks {k} dcp={ca} torch={cb}")
            except BaseException as ex:
                res["notes"].append(f"META error {type(ex).__name__}: {ex}")
        dist.barrier()
    except Exception:
        res["errors"]["harness"] = traceback.format_exc()[-3000:]
    _finish(dist, res, outdir, "save", rank)


def load_phase(rank, spec, outdir):
    import torch.distributed as dist
    import torch.distributed.checkpoint as tdcp
    import dcp
    L = spec["L"]
    store = os.path.join(outdir, "store_load")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=L)
    res = {"rank": rank, "errors": {}, "mismatch": {}, "notes": []}
    saved_ok = json.load(open(os.path.join(outdir, "save_0.json")))["errors"]
    try:
        ctx = Ctx(L)
        fulls = {e["name"]: full_tensor(e) for e in spec["ents"]}

        def dest(include_omitted=False):
            d = {}
            for e in spec["ents"]:
                if e["omit"] and not include_omitted:
                    continue
                set_path(d, e["name"], ctx.build(fulls[e["name"]], e["load"],
                                                 dtype=DTYPE_OF[e["ldtype"]], zero=True))
            for k, v in spec["plain"].items():
                d[k] = zero_plain(v)
            return d

        def check(d, tag):
            bad = []
            for e in spec["ents"]:
                if e["omit"]:
                    continue
                got = local_of(get_path(d, e["name"]))
                want = ctx.expected_local(fulls[e["name"]], e["load"], DTYPE_OF[e["ldtype"]])
                if not teq(got, want):
                    nd = "?"
                    if got.shape == want.shape:
                        diffm = (got.double() != want.double())
                        nd = f"{int(diffm.sum())}/{got.numel()} first idx={diffm.nonzero()[:3].tolist()} got={got[diffm][:4].tolist()} want={want[diffm][:4].tolist()}"
                    bad.append(f"{describe(e)}: got {got.dtype}{tuple(got.shape)} want {want.dtype}{tuple(want.shape)} diff {nd}")
            for k, v in spec["plain"].items():
                if not plain_eq(d[k], v):
                    bad.append(f"plain {k}: got {d[k]!r} want {v!r}")
            if bad:
                res["mismatch"][tag] = bad

        def attempt(tag, fn):
            try:
                fn()
                return True
            except BaseException as ex:
                res["errors"][tag] = f"{type(ex).__name__}: {ex}"[:2000]
                res["notes"].append(tag + ": " + traceback.format_exc()[-3000:])
                return False

        if "dcp" not in saved_ok:
            d = dest()
            if attempt("dcp_load", lambda: dcp.load(d, checkpoint_id=os.path.join(outdir, "A"))):
                check(d, "dcp_load")
        if "torch" not in saved_ok:
            d = dest()
            if attempt("torch_load", lambda: tdcp.load(d, checkpoint_id=os.path.join(outdir, "B"))):
                check(d, "torch_load")
        if spec["async_save"] and "dcp_async" not in saved_ok:
            d = dest()
            if attempt("dcp_async_load", lambda: dcp.load(d, checkpoint_id=os.path.join(outdir, "A2"))):
                check(d, "dcp_async_load")
        if spec["partial"]:
            e0 = spec["ents"][0]
            for lib in ("dcp", "torch"):
                path = os.path.join(outdir, "A" if lib == "dcp" else "B")
                if lib in saved_ok:
                    continue
                for allow in (True, False):
                    t0 = ctx.build(fulls[e0["name"]], e0["load"], dtype=DTYPE_OF[e0["ldtype"]], zero=True)
                    miss = torch.full((3,), 5.0)
                    d = {}
                    set_path(d, e0["name"], t0)
                    d["missing_key"] = miss
                    d["cfg"] = zero_plain(spec["plain"]["cfg"])
                    if lib == "dcp":
                        fn = lambda: dcp.load(d, checkpoint_id=path, planner=dcp.DefaultLoadPlanner(allow_partial_load=allow))
                    else:
                        from torch.distributed.checkpoint import DefaultLoadPlanner
                        fn = lambda: tdcp.load(d, checkpoint_id=path, planner=DefaultLoadPlanner(allow_partial_load=allow))
                    tag = f"{lib}_partial_{allow}"
                    ok = attempt(tag, fn)
                    res.setdefault("partial_ok", {})[tag] = ok
                    if ok:
                        bad = []
                        got = local_of(get_path(d, e0["name"]))
                        want = ctx.expected_local(fulls[e0["name"]], e0["load"], DTYPE_OF[e0["ldtype"]])
                        if not teq(got, want):
                            bad.append(f"{describe(e0)} wrong")
                        if not torch.equal(d["missing_key"], torch.full((3,), 5.0)):
                            bad.append(f"missing_key changed {d['missing_key']}")
                        if not plain_eq(d["cfg"], spec["plain"]["cfg"]):
                            bad.append(f"cfg {d['cfg']!r}")
                        if bad:
                            res["mismatch"][tag] = bad
                    # errors in the non-allow case must not desync: barrier
                    dist.barrier()
        dist.barrier()
    except Exception:
        res["errors"]["harness"] = traceback.format_exc()[-3000:]
    _finish(dist, res, outdir, "load", rank)


def worker(rank, phase, spec, outdir):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    import faulthandler
    faulthandler.enable()
    faulthandler.dump_traceback_later(110, exit=True)
    import warnings
    warnings.filterwarnings("ignore")
    (save_phase if phase == "save" else load_phase)(rank, spec, outdir)


def main():
    seed = int(sys.argv[1])
    root = sys.argv[2] if len(sys.argv) > 2 else ROOT
    spec = make_spec(seed)
    outdir = os.path.join(root, "runs", str(seed))
    shutil.rmtree(outdir, ignore_errors=True)
    os.makedirs(outdir)
    with open(os.path.join(outdir, "spec.json"), "w") as f:
        json.dump(spec, f, indent=1)
    print(f"seed={seed} S={spec['S']} L={spec['L']} async={spec['async_save']} partial={spec['partial']}")
    for e in spec["ents"]:
        print("  ", describe(e), "OMIT" if e["omit"] else "")
    mp.spawn(worker, args=("save", spec, outdir), nprocs=spec["S"], join=True)
    saves = [json.load(open(os.path.join(outdir, f"save_{r}.json"))) for r in range(spec["S"])]
    findings = []
    for s in saves:
        for n in s["notes"]:
            if n.startswith("META"):
                findings.append(f"rank{s['rank']} {n}")
    errs = {}
    for s in saves:
        for k, v in s["errors"].items():
            errs.setdefault(k, []).append((s["rank"], v))
    for k, v in errs.items():
        print(f"SAVE ERROR {k}: {str(v[0])[:400]}")
    if "harness" in errs:
        findings.append(f"save harness error {errs['harness'][0]}")
    if ("dcp" in errs) != ("torch" in errs):
        findings.append(f"save: one library failed: {errs}")
    if "dcp_async" in errs and "dcp" not in errs:
        findings.append(f"async save failed: {errs['dcp_async']}")
    if "dcp" in errs and len(errs["dcp"]) != spec["S"]:
        findings.append(f"dcp save failed on only some ranks {errs['dcp']}")
    mp.spawn(worker, args=("load", spec, outdir), nprocs=spec["L"], join=True)
    loads = [json.load(open(os.path.join(outdir, f"load_{r}.json"))) for r in range(spec["L"])]
    lerrs = {}
    for l in loads:
        for k, v in l["errors"].items():
            lerrs.setdefault(k, []).append((l["rank"], v))
        for k, v in l["mismatch"].items():
            for b in v:
                findings.append(f"rank{l['rank']} MISMATCH {k}: {b}")
    for k, v in lerrs.items():
        print(f"LOAD ERROR {k}: {str(v[0])[:400]}")
    if "harness" in lerrs:
        findings.append(f"load harness error {lerrs['harness'][0]}")
    if ("dcp_load" in lerrs) != ("torch_load" in lerrs):
        findings.append(f"load: one library failed: dcp={lerrs.get('dcp_load')} torch={lerrs.get('torch_load')}")
    if "dcp_async_load" in lerrs and "dcp_load" not in lerrs:
        findings.append(f"async load failed {lerrs['dcp_async_load']}")
    for allow in (True, False):
        a = f"dcp_partial_{allow}" in lerrs
        b = f"torch_partial_{allow}" in lerrs
        if spec["partial"] and a != b and "dcp" not in errs and "torch" not in errs:
            findings.append(f"partial allow={allow}: dcp err={lerrs.get(f'dcp_partial_{allow}')} torch err={lerrs.get(f'torch_partial_{allow}')}")
    for k, v in lerrs.items():
        if len(v) != spec["L"]:
            findings.append(f"{k} failed on only ranks {[r for r, _ in v]}: {v[0]}")
    for f in findings:
        print("FINDING", f)
    print(f"RESULT seed={seed} findings={len(findings)}")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
