import os, sys, json, time
sys.path.insert(0, os.environ.get("DCPPY", os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")))
import torch
import dcp

NSMALL = 120


def make_state(v, scenario, rank=0, world=1):
    """Every tensor value == v; 'step' == v."""
    st = {"small": {}, "big": {}}
    dts = [torch.float32, torch.int32, torch.float64, torch.int64]
    for i in range(NSMALL):
        st["small"][f"t{i:03d}"] = torch.full((1 + (i * 7) % 50,), v, dtype=dts[i % 4])
    big = {
        "b0": torch.full((256, 1024), v, dtype=torch.float32),   # 1 MiB
        "b1": torch.full((96, 1024), v, dtype=torch.float64),    # 768 KiB
        "b2": torch.full((200003,), v, dtype=torch.int32),       # ~800 KB, odd size
    }
    if scenario == "hf_dist":
        # each rank holds half the rows of every big tensor
        out = {}
        for k, t in big.items():
            n = t.shape[0]
            h = n // 2
            lo, hi = (0, h) if rank == 0 else (h, n)
            local = t[lo:hi].clone()
            out[k] = dcp.ShardedTensor(local, t.shape, (lo,) + (0,) * (t.dim() - 1))
        st["big"] = out
    else:
        st["big"] = big
    if scenario in ("hf", "hf_dist"):
        st["step"] = torch.full((1,), v, dtype=torch.int64)
    else:
        st["step"] = v
        st["note"] = f"v={v}"
    return st


def flat_values(st, prefix=""):
    for k, x in st.items():
        name = prefix + k
        if isinstance(x, dict):
            yield from flat_values(x, name + ".")
        elif isinstance(x, dcp.ShardedTensor):
            yield name, x.local
        else:
            yield name, x


def versions_of(st):
    """Set of versions found in a loaded state (tensors must be uniform)."""
    vs = {}
    for name, x in flat_values(st):
        if isinstance(x, torch.Tensor):
            u = torch.unique(x)
            for val in u.tolist():
                vs.setdefault(int(val), []).append(name)
            if u.numel() != 1:
                vs.setdefault("nonuniform", []).append(name)
        elif isinstance(x, str):
            vs.setdefault(int(x.split("=")[1]), []).append(name)
        else:
            vs.setdefault(int(x), []).append(name)
    return vs


def hf_mapping(v, st):
    names = [n for n, _ in flat_values(st)]
    nfiles = 3 if v % 2 else 2
    return {n: 1 + (i % nfiles) for i, n in enumerate(sorted(names))}


def writer_for(scenario, d, v, st):
    if scenario == "native":
        return dict(checkpoint_id=d)
    if scenario == "native_multi":
        return dict(storage_writer=dcp.FileSystemWriter(
            d, single_file_per_rank=False, thread_count=2, overwrite=True))
    if scenario == "native_nodirect":
        return dict(storage_writer=dcp.FileSystemWriter(
            d, thread_count=1 + v % 2, direct_io=False))
    if scenario == "hf":
        return dict(storage_writer=dcp.HuggingFaceStorageWriter(
            d, fqn_to_index_mapping=hf_mapping(v, st)))
    if scenario == "hf_dist":
        return dict(storage_writer=dcp.HuggingFaceStorageWriter(
            d, save_distributed=True, enable_consolidation=bool(v % 2)))
    if scenario == "mega":
        if v % 3 == 0:
            return dict(checkpoint_id="mega://" + d)
        return dict(storage_writer=dcp.MegaStorageWriter(
            d, fqn_to_index_mapping=hf_mapping(v, st)))
    if scenario in ("async_thread", "async_process", "async_process_wk", "concurrent",
                    "ranklocal"):
        return dict(checkpoint_id=d)
    raise ValueError(scenario)


def reader_kw(scenario, d):
    if scenario in ("hf", "hf_dist"):
        return dict(storage_reader=dcp.HuggingFaceStorageReader(d))
    if scenario == "mega":
        return dict(storage_reader=dcp.MegaStorageReader(d))
    return dict(checkpoint_id=d)


UNRELATED = ["rank-0/user.txt", "rank-1/user.txt", "README.txt", "notes.distcp.bak", "__x.distcp", "model.safetensors.bak",
             ".hidden_user_file", "config.json"]


def place_unrelated(d):
    os.makedirs(d, exist_ok=True)
    for n in [x for x in UNRELATED if "/" not in x]:
        p = os.path.join(d, n)
        if not os.path.exists(p):
            with open(p, "w") as f:
                f.write("user file\n")


def listing(d):
    out = []
    for root, dirs, files in os.walk(d):
        for f in files + [x for x in dirs if os.path.islink(os.path.join(root, x))]:
            p = os.path.join(root, f)
            try:
                sz = os.lstat(p).st_size
            except FileNotFoundError:
                sz = -1
            out.append((os.path.relpath(p, d), sz))
    return sorted(out)


def own_files(scenario, d):
    """Files the committed checkpoint consists of (relative paths)."""
    own = set()
    if scenario == "ranklocal":
        for r in range(2):
            sub = os.path.join(d, f"rank-{r}")
            if os.path.exists(os.path.join(sub, ".metadata")):
                own.add(f"rank-{r}/.metadata")
                md = dcp.FileSystemReader(sub).read_metadata()
                for si in md.storage_data.values():
                    own.add(f"rank-{r}/" + si.relative_path)
        return own
    if scenario in ("hf", "hf_dist"):
        idx = os.path.join(d, "model.safetensors.index.json")
        if os.path.exists(idx):
            own.add("model.safetensors.index.json")
            own.update(json.load(open(idx))["weight_map"].values())
        own.update(f for f in os.listdir(d)
                   if f.startswith("shard-") and f.endswith(".safetensors"))
        sh = os.path.join(d, "sharded")
        if os.path.isdir(sh):
            for f in os.listdir(sh):
                own.add("sharded/" + f)
        return own
    if scenario == "mega":
        idx = os.path.join(d, "model.mega.index.json")
        if os.path.exists(idx):
            own.add("model.mega.index.json")
            own.update(json.load(open(idx))["files"])
        return own
    own.add(".metadata")
    md = dcp.read_metadata(d)
    for si in md.storage_data.values():
        own.add(si.relative_path)
    return own


def leftovers(scenario, d):
    own = own_files(scenario, d)
    extra = []
    for rel, sz in listing(d):
        if rel in own or rel in UNRELATED:
            continue
        extra.append((rel, sz))
    return extra


class Log:
    def __init__(self, path):
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def __call__(self, *parts):
        line = " ".join(str(p) for p in parts) + "\n"
        os.write(self.fd, line.encode())
