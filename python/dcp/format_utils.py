"""Whole-checkpoint helpers for offline tools (evaluation, export,
inspection), after torch.distributed.checkpoint.format_utils:

    sd = dcp.format_utils.load_all("/ckpt/step-1000")   # no model needed
    dcp.format_utils.dcp_to_torch_save("/ckpt/step-1000", "model.pt")
    dcp.format_utils.torch_save_to_dcp("model.pt", "/ckpt/imported")
    dcp.format_utils.torch_dcp_to_dcp("/torch_ckpt/step-9", "/ckpt/step-9")

or from a shell (the modes of torch's `python -m
torch.distributed.checkpoint.format_utils`, and torch_dcp_to_dcp):

    python -m dcp.format_utils dcp_to_torch /ckpt/step-1000 model.pt

load_all builds the state dict a checkpoint holds from its metadata (each
name's nesting path, dtypes and global shapes) and loads it in this process
(no process group): whole tensors, however many ranks saved them, and
plain values, nested as they were saved. It needs memory for everything it
loads. What the metadata does not record is lost: tuples holding tensors
or dicts come back as lists (lists and tuples of plain values are stored
whole and come back as saved) and integer dict keys as strings (as from
torch's DCP), dicts in name order, empty dicts left out; MEGA and Hugging Face directories record
no nesting (flat names).
"""

from __future__ import annotations

import os
import stat
import tempfile

from . import _lib, _state, checkpoint, errors
from .metadata import TensorStorageMetadata, check_chunk_coverage, \
    read_metadata, read_metadata_through

__all__ = ["load_all", "dcp_to_torch_save", "torch_save_to_dcp",
           "torch_dcp_to_dcp", "BroadcastingTorchSaveReader",
           "DynamicMetaLoadPlanner"]


class BroadcastingTorchSaveReader:
    """A storage_reader for dcp.load that reads a torch.save file (the
    checkpoint_id) on one rank and broadcasts it: a model saved whole loads
    straight into a distributed job, each rank keeping its own shards of
    DTensor parameters (resharded as a dcp checkpoint would be)::

        dcp.load({"model": model.state_dict()},
                 checkpoint_id="model.pt",
                 storage_reader=dcp.format_utils.BroadcastingTorchSaveReader(),
                 planner=dcp.format_utils.DynamicMetaLoadPlanner())

    The file's state dict is flattened as dcp.load flattens the
    destination ("model.layers.0.weight"); names must match. Only the
    rank `coordinator_rank` (a global rank, as in torch) reads the file,
    with torch.load (memory-mapped where the file allows; weights_only
    unless dcp.load gets allow_pickle=True); every tensor is then
    broadcast whole over torch.distributed, one at a time, and copied
    (converted as copy_ converts) into each rank's part. Plain values load
    too (torch's reader loads tensors only). Without a process group (or
    no_dist=True) the file is read in this process. Keys the file lacks
    raise CheckpointNotFoundError unless the planner has
    allow_partial_load; a shape that differs raises CheckpointValueError;
    every rank raises together."""

    def __init__(self, checkpoint_id=None, coordinator_rank: int = 0):
        self.checkpoint_id = checkpoint_id
        self.coordinator_rank = int(coordinator_rank)

    def reset(self, checkpoint_id=None) -> None:
        self.checkpoint_id = checkpoint_id

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return os.path.isfile(checkpoint_id)

    def __repr__(self):
        return (f"BroadcastingTorchSaveReader(checkpoint_id="
                f"{self.checkpoint_id!r}, coordinator_rank="
                f"{self.coordinator_rank})")


class DynamicMetaLoadPlanner(checkpoint.DefaultLoadPlanner):
    """The planner torch pairs with BroadcastingTorchSaveReader (a
    torch.save file has no metadata to plan against); dcp's reader needs
    none, so this is DefaultLoadPlanner under torch's name
    (allow_partial_load works as there)."""


def _torch(what: str):
    """torch, or ModuleNotFoundError saying that `what` needs it (the rest
    of dcp works with numpy alone)."""
    try:
        import torch
    except ModuleNotFoundError as e:
        if e.name != "torch":
            raise
        raise ModuleNotFoundError(
            f"dcp.format_utils.{what} needs torch (its results are torch "
            "tensors): pip install torch, or the wheel's [torch] extra. "
            "Without torch, load into numpy arrays with dcp.load",
            name="torch") from e
    return torch


def _selected(metadata, keys):
    """The (name, item, path) of `metadata`'s items, in name order: all of
    them, or those a key of `keys` names: its flattened name, or a prefix
    of it ending at a dot ("model", "model.layers"). KeyError naming the
    keys that match nothing."""
    chosen = []
    matched = set()
    for name, item in metadata.state_dict_metadata.items():
        path = tuple(metadata.planner_data.get(name) or (name,))
        if keys is not None:
            hit = {k for k in keys
                   if name == k or name.startswith(k + ".")}
            if not hit:
                continue
            matched |= hit
        chosen.append((name, item, path))
    if keys is not None and matched != keys:
        missing = sorted(keys - matched)
        raise KeyError(
            f"the checkpoint holds no {', '.join(map(repr, missing))}")
    return chosen


def _place(root: dict, path: tuple, leaf) -> None:
    """Sets `leaf` at `path` under `root`, creating the dicts (string
    keys) and lists (int indices, padded with None) on the way."""
    node = root
    for depth, key in enumerate(path):
        if isinstance(node, list):
            if not isinstance(key, int) or key < 0:
                raise ValueError(f"path {path!r}: {key!r} indexes a list")
            node.extend([None] * (key + 1 - len(node)))
        elif isinstance(key, int) and depth == 0:
            raise ValueError(f"path {path!r} starts with a list index")
        if depth == len(path) - 1:
            there = node[key] if isinstance(node, list) else node.get(key)
            if isinstance(there, (dict, list)):
                raise ValueError(f"path {path!r} ends where other paths "
                                 "pass through")
            node[key] = leaf
            return
        child = node[key] if isinstance(node, list) else node.get(key)
        if child is None:
            child = [] if isinstance(path[depth + 1], int) else {}
            node[key] = child
        elif not isinstance(child, (dict, list)):
            raise ValueError(f"path {path!r} passes through a value")
        node = child


def _refuse_rank_local(checkpoint_id) -> None:
    """Raises dcp.load's error for a directory of rank-local checkpoints
    (use_collectives=False: rank-R/ subdirectories, no .metadata of its
    own): each holds one rank's shards, never whole tensors."""
    path = os.fspath(checkpoint_id)
    if not os.path.exists(os.path.join(path, ".metadata")) and \
            os.path.exists(os.path.join(path, "rank-0", ".metadata")):
        checkpoint.load({}, checkpoint_id=path, no_dist=True)


def load_all(checkpoint_id=None, *, storage_reader=None, keys=None,
             device=None, allow_pickle: bool = False) -> dict:
    """Everything the checkpoint holds (or what `keys` names: flattened
    names, or prefixes of them ending at a dot, such as "model" or
    "model.layers") as a new nested state dict: torch tensors of the saved
    dtypes and global shapes, on `device` (None: the CPU), and plain
    values, nested by the saved paths (lists holding tensors or dicts
    padded with None where `keys` left items out; a list of plain values
    is one item, stored whole). checkpoint_id and storage_reader as for dcp.load (a
    dcp, MEGA or Hugging Face directory; the last two keep no nesting, so
    their names come back flat); pickled values need allow_pickle=True.
    Loads in this process alone. Raises what dcp.load raises (rank-local
    checkpoints, saved with use_collectives=False, are refused as dcp.load
    refuses them without a process group), and KeyError for keys the
    checkpoint does not hold."""
    torch = _torch("load_all")
    if storage_reader is not None:
        if checkpoint_id is not None:
            storage_reader.reset(checkpoint_id)
        metadata = read_metadata_through(storage_reader)
    elif checkpoint_id is not None:
        _refuse_rank_local(checkpoint_id)
        metadata = read_metadata(checkpoint_id)
    else:
        raise ValueError("load_all needs checkpoint_id or storage_reader")
    if keys is not None:
        keys = {keys} if isinstance(keys, str) else set(keys)
        if not all(isinstance(k, str) for k in keys):
            raise TypeError("load_all: keys must be strings (flattened "
                            "names or their prefixes)")
    # Loaded under the flattened names, which select single items (a list
    # element without its neighbours), then nested.
    flat = {}
    paths = {}
    source = checkpoint_id if checkpoint_id is not None else getattr(
        storage_reader, "path", "the checkpoint")
    selected = _selected(metadata, keys)
    # The metadata's paths and shapes checked before anything is built
    # from them: a damaged checkpoint is refused (CheckpointCorruptError)
    # rather than growing lists or tensors without bound.
    _state.check_saved_paths((path for _, _, path in selected), source)
    state: dict = {}
    try:
        for _, _, path in selected:
            _place(state, path, _LEAF)
    except ValueError as e:
        raise errors.from_status(
            _lib.DATA_LOSS, f"{source}: the metadata's nesting paths are "
            f"damaged: {e}") from None
    for name, item, path in selected:
        if isinstance(item, TensorStorageMetadata):
            check_chunk_coverage(name, item, source)
            flat[name] = torch.empty(tuple(item.size),
                                     dtype=item.properties.dtype,
                                     device=device)
        else:
            flat[name] = None  # The load puts the saved value here.
        paths[name] = path
    checkpoint.load(flat, checkpoint_id=checkpoint_id,
                    storage_reader=storage_reader, no_dist=True,
                    allow_pickle=allow_pickle)
    state = {}
    for name, value in flat.items():
        _place(state, paths[name], value)
    return state


# What the check of load_all's paths places before anything is loaded.
_LEAF = object()


def dcp_to_torch_save(dcp_checkpoint_dir, torch_save_path, *, keys=None,
                      allow_pickle: bool = False) -> None:
    """Writes what the checkpoint in `dcp_checkpoint_dir` holds (all of it,
    or what `keys` names: load_all) to `torch_save_path` with torch.save:
    into a new file beside it, renamed over `torch_save_path` once written
    (a failed write leaves no partial file)."""
    state = load_all(dcp_checkpoint_dir, keys=keys, allow_pickle=allow_pickle)
    # Through a symlink to its target; the file's mode as a plain open
    # would leave it (kept where it exists, else from the umask).
    path = os.path.realpath(os.fspath(torch_save_path))
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    directory, base = os.path.split(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=".tmp",
                               dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            try:
                _torch("dcp_to_torch_save").save(state, f)
            except RecursionError as e:
                raise ValueError(
                    f"dcp_to_torch_save: {dcp_checkpoint_dir} nests deeper "
                    "than torch.save's pickler goes (Python's recursion "
                    "limit)") from e
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _umask() -> int:
    """This process's umask, read without changing it where Linux shows
    it (/proc/self/status, 4.7+)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    old = os.umask(0o022)  # (briefly changed: no other way)
    os.umask(old)
    return old


def torch_save_to_dcp(torch_save_path, dcp_checkpoint_dir, *,
                      weights_only: bool = True,
                      allow_pickle: bool = False) -> None:
    """Saves the state dict in the torch.save file `torch_save_path` as a
    dcp checkpoint in `dcp_checkpoint_dir` (in this process alone).
    weights_only as for torch.load: True (the default, unlike torch's
    format_utils) unpickles only tensors and plain containers; False runs
    whatever code the file's pickle names. Values other than tensors,
    numbers, strings, bytes, None and containers of them need
    allow_pickle=True to be saved."""
    state = _torch("torch_save_to_dcp").load(
        os.fspath(torch_save_path), map_location="cpu",
        weights_only=weights_only)
    if not isinstance(state, dict):
        raise TypeError(f"{os.fspath(torch_save_path)} holds a "
                        f"{type(state).__name__}, not a state dict")
    checkpoint.save(state, checkpoint_id=dcp_checkpoint_dir, no_dist=True,
                    allow_pickle=allow_pickle)


def torch_dcp_to_dcp(torch_dcp_dir, dcp_checkpoint_dir, *,
                     allow_pickle: bool = False) -> None:
    """Converts a checkpoint written by torch.distributed.checkpoint (its
    FileSystemWriter's format, which dcp does not read) into a dcp
    checkpoint: torch's DCP reads all of it in this process (its
    .metadata is a Python pickle, read as torch reads it: convert only
    checkpoints you trust), then dcp.save writes it. Needs memory for the
    whole state. ValueError when `torch_dcp_dir` holds no such checkpoint;
    values other than tensors, numbers, strings, bytes, None and containers
    of them need allow_pickle=True."""
    src = os.fspath(torch_dcp_dir)
    if not errors.is_torch_dcp_checkpoint(src):
        raise ValueError(f"{src} holds no checkpoint written by "
                         "torch.distributed.checkpoint (no pickled .metadata)")
    _torch("torch_dcp_to_dcp")
    import torch.distributed.checkpoint as torch_dcp
    try:
        # What torch's own dcp_to_torch_save uses: a planner that builds
        # the state dict from the metadata.
        from torch.distributed.checkpoint.format_utils import \
            _EmptyStateDictLoadPlanner
        from torch.distributed.checkpoint.state_dict_loader import \
            _load_state_dict
    except ImportError as e:
        raise NotImplementedError(
            "this torch has no torch.distributed.checkpoint.format_utils"
            "._EmptyStateDictLoadPlanner; convert with torch's "
            "dcp_to_torch_save, then dcp.format_utils.torch_save_to_dcp"
        ) from e
    state: dict = {}
    _load_state_dict(state, storage_reader=torch_dcp.FileSystemReader(src),
                     planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    checkpoint.save(state, checkpoint_id=dcp_checkpoint_dir, no_dist=True,
                    allow_pickle=allow_pickle)


_MODES = {
    "torch_to_dcp": (torch_save_to_dcp, "a torch.save file"),
    "dcp_to_torch": (dcp_to_torch_save, "a dcp checkpoint directory"),
    "torch_dcp_to_dcp": (torch_dcp_to_dcp,
                         "a torch.distributed.checkpoint directory"),
}


def main(argv=None) -> int:
    """`python -m dcp.format_utils MODE SRC DST`: converts SRC into DST;
    exit status 0, or 1 with the error on stderr."""
    import argparse
    import sys
    parser = argparse.ArgumentParser(
        prog="python -m dcp.format_utils",
        description="Convert a checkpoint between dcp, torch.save and "
        "torch.distributed.checkpoint formats (in this process; needs "
        "memory for the whole state).")
    parser.add_argument("mode", choices=sorted(_MODES),
                        help="; ".join(f"{m}: SRC is {what}" for m, (_, what)
                                       in sorted(_MODES.items())))
    parser.add_argument("src")
    parser.add_argument("dst")
    parser.add_argument("--allow-pickle", action="store_true",
                        help="save and load values that need pickling "
                        "(loading a pickle runs code from the file)")
    args = parser.parse_args(argv)
    convert, _ = _MODES[args.mode]
    kwargs = {"allow_pickle": args.allow_pickle}
    if convert is torch_save_to_dcp and args.allow_pickle:
        kwargs["weights_only"] = False
    try:
        convert(args.src, args.dst, **kwargs)
    except Exception as e:  # noqa: BLE001: reported, not hidden
        print(f"python -m dcp.format_utils: {type(e).__name__}: {e}",
              file=sys.stderr)
        return 1
    print(f"{args.src} -> {args.dst} ({args.mode})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
