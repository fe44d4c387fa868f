"""A planner's set_up_planner, honoured around the engine's planning.

torch's saver and loader call `planner.set_up_planner(state_dict, ...)` on
every rank before planning; the planner keeps the state dict it will plan
for in `planner.state_dict`. Subclasses override it to rewrite that dict
(rename or drop keys, build it from the checkpoint's metadata as torch's
_EmptyStateDictLoadPlanner does). dcp plans in the engine, so it calls the
override the same way and then walks `planner.state_dict` instead of the
caller's dict. The default set_up_planner (torch's and dcp's) flattens
the dict (its `mappings` lead each flat key back to its place in the
caller's dict): a save or load walks it nested again where every key
still has its mapping, and a load puts each non-tensor value it read back into the
caller's dict through `mappings`, as torch's load_bytes does. A hook that
renames keys should keep the nesting (put the dict under a key rather
than prefix dotted names): lists of plain values are matched by their
nesting, so under a dotted name that stands for a nesting they load at
the destination's length. Tensors are loaded in
place, so the caller's tensors hold the values either way.

Only an overridden set_up_planner costs anything: otherwise the caller's
dict is walked as before.
"""

from __future__ import annotations

from .planner import (DefaultLoadPlanner, DefaultSavePlanner, _torch_default,
                      as_dcp_planner)


def _honoured(planner, kind: str):
    """The class planner's set_up_planner is inherited from when a subclass
    overrides it (dcp's or torch's default planner), else None."""
    if planner is None:
        return None
    for base in (DefaultSavePlanner if kind == "save" else
                 DefaultLoadPlanner, _torch_default(kind)):
        if base is None or not isinstance(planner, base):
            continue
        if type(planner).set_up_planner is not base.set_up_planner:
            return base
    return None


def _is_torchs(base) -> bool:
    return base is not DefaultSavePlanner and base is not DefaultLoadPlanner


def _storage_meta(torchs: bool, path: str):
    if torchs:
        from torch.distributed.checkpoint.metadata import StorageMeta
    else:
        from .metadata import StorageMeta
    return StorageMeta(checkpoint_id=path)


def _torch_metadata(md):
    """dcp Metadata `md` as torch.distributed.checkpoint's Metadata
    (state_dict_metadata, planner_data and storage_meta), for a planner of
    torch's, which checks values against torch's classes."""
    from .metadata import _gc_paused
    with _gc_paused():  # many new objects, no cycles (as Metadata's read)
        return _torch_metadata_made(md)


def _torch_metadata_made(md):
    from torch.distributed.checkpoint import metadata as tm
    import torch
    items = {}
    for name, item in md.state_dict_metadata.items():
        if hasattr(item, "chunks"):
            items[name] = tm.TensorStorageMetadata(
                properties=tm.TensorProperties(
                    dtype=item.properties.dtype,
                    requires_grad=item.properties.requires_grad),
                size=torch.Size(item.size),
                chunks=[tm.ChunkStorageMetadata(
                    offsets=torch.Size(c.offsets), sizes=torch.Size(c.sizes))
                    for c in item.chunks])
        else:
            items[name] = tm.BytesStorageMetadata()
    meta = md.storage_meta
    return tm.Metadata(
        state_dict_metadata=items, planner_data=dict(md.planner_data),
        storage_meta=tm.StorageMeta(
            checkpoint_id=getattr(meta, "checkpoint_id", None),
            save_id=getattr(meta, "save_id", None)) if meta else None)


def set_up_save(planner, state_dict, *, checkpoint_id, storage_writer,
                is_coordinator: bool):
    """The dict a save walks: `state_dict`, or what the planner's
    overridden set_up_planner left in planner.state_dict."""
    as_dcp_planner(planner, "save")  # refused before any hook runs
    base = _honoured(planner, "save")
    if base is None:
        return state_dict
    from .checkpoint import _checkpoint_path
    path = _checkpoint_path(checkpoint_id, storage_writer, "save")
    torchs = _is_torchs(base)
    planner.state_dict = state_dict  # for an override that leaves it
    planner.set_up_planner(state_dict, _storage_meta(torchs, path),
                           is_coordinator)
    walked = planner.state_dict
    if _flattened(planner, walked, state_dict):
        # The default flattening, keys kept (some perhaps dropped): the
        # nesting comes back, so the checkpoint records it (planner_data)
        # as without a planner.
        walked = _unflatten(walked, planner.mappings, torchs)
    if not isinstance(walked, dict):
        raise TypeError(
            f"{type(planner).__qualname__}.set_up_planner left a "
            f"{type(walked).__name__} in planner.state_dict, not a dict")
    return walked


def read_metadata_for(storage_reader, path: str, rank: int):
    """The metadata a load's set_up_planner sees: the checkpoint's (a
    rank-local checkpoint's: this rank's)."""
    import os
    from . import metadata
    if storage_reader is not None:
        return metadata.read_metadata_through(storage_reader)
    local = os.path.join(path, f"rank-{rank}")
    if "://" not in path and not os.path.exists(
            os.path.join(path, ".metadata")) and os.path.exists(
                os.path.join(local, ".metadata")):
        return metadata.read_metadata(local)
    return metadata.read_metadata(path)


class LoadSetUp:
    """What a load's overridden set_up_planner decided: `walked`, the dict
    to load into, and finish(), which puts the values read into the
    caller's dict where torch's flattening moved them.

    torch's flattening, keys untouched (every key has its mapping), is
    walked nested again (`nested`), as the checkpoint holds it: lists of
    plain values are matched by their nesting (_state.Flat.reshape_lists)
    and come back whole."""

    def __init__(self, planner, state_dict, walked, nested=None,
                 torchs=False):
        self._planner = planner
        self._state_dict = state_dict
        self._flat = walked
        self._nested = nested
        self._torchs = torchs
        self.walked = nested if nested is not None else walked

    def finish(self) -> None:
        mappings = getattr(self._planner, "mappings", None)
        if self._flat is self._state_dict or not mappings:
            return
        from .planner import _is_tensor
        original = getattr(self._planner, "original_state_dict",
                           self._state_dict)
        torchs = self._torchs
        if self._nested is not None:
            for key in self._flat:
                path = mappings[key]
                value = _get_element(self._nested, path)
                if not _is_tensor(value):
                    self._flat[key] = value
                    _set_element(original, path, value, torchs)
            return

        def put_back(d) -> None:
            # The flat keys, also where the hook put the flattened dict
            # under a key of its own ({"wrapped": flat}): a dict whose keys
            # are all flat names (not a nested dict whose keys could equal
            # one by chance).
            for key, value in d.items():
                path = mappings.get(key)
                if path is not None:
                    if not _is_tensor(value):
                        _set_element(original, path, value, torchs)
                elif isinstance(value, dict) and value and all(
                        k in mappings for k in value):
                    put_back(value)

        put_back(self._flat)


def set_up_load(planner, state_dict, *, storage_reader, path: str, rank: int,
                is_coordinator: bool):
    """The load's LoadSetUp: the caller's dict unless the planner overrides
    set_up_planner, which is then called with the checkpoint's metadata."""
    as_dcp_planner(planner, "load")  # refused before any hook runs
    base = _honoured(planner, "load")
    if base is None:
        return LoadSetUp(None, state_dict, state_dict)
    md = read_metadata_for(storage_reader, path, rank)
    # A hook may build its dict from the nesting paths (torch's
    # _EmptyStateDictLoadPlanner does): damaged ones are refused first.
    from ._state import check_saved_paths
    from .metadata import check_chunk_coverage
    check_saved_paths((p for p in (md.planner_data or {}).values()
                       if isinstance(p, tuple)), path)
    for name, item in md.state_dict_metadata.items():
        if hasattr(item, "chunks"):
            check_chunk_coverage(name, item, path)
    if _is_torchs(base):
        md = _torch_metadata(md)
    planner.state_dict = state_dict  # for an override that leaves it
    planner.set_up_planner(state_dict, md, is_coordinator)
    walked = planner.state_dict
    if not isinstance(walked, dict):
        raise TypeError(
            f"{type(planner).__qualname__}.set_up_planner left a "
            f"{type(walked).__name__} in planner.state_dict, not a dict")
    nested = None
    torchs = _is_torchs(base)
    if _flattened(planner, walked, state_dict):
        nested = _unflatten(walked, planner.mappings, torchs)
    return LoadSetUp(planner, state_dict, walked, nested, torchs)


def _flattened(planner, walked, state_dict) -> bool:
    """Whether `walked` is the default set_up_planner's flattening of
    `state_dict` (or part of it): every key has its mapping."""
    mappings = getattr(planner, "mappings", None)
    return bool(mappings) and walked is not state_dict and all(
        key in mappings for key in walked)


def _unflatten(flat: dict, mappings: dict, torchs: bool) -> dict:
    """The nested dict of `flat`'s values at their `mappings` paths, as
    torch's unflatten_state_dict makes it (lists padded with None).
    `torchs`: torch's mappings (keys str, list indices int), else dcp's
    (keys as they are, list indices planner.ListIndex)."""
    nested: dict = {}
    for key, value in flat.items():
        _set_element(nested, mappings[key], value, torchs)
    return nested


def _get_element(root, path):
    node = root
    for part in path:
        node = node[part]
    return node


def _is_index(part, torchs: bool) -> bool:
    from .planner import ListIndex
    return type(part) is ListIndex or (torchs and type(part) is int)


def _set_element(root, path, value, torchs: bool) -> None:
    """Sets `value` at `path` under `root`, making the dicts (for keys)
    and lists (for list indices, _is_index; padded with None) on the way,
    as torch's set_element."""
    node = root
    for part, following in zip(path, path[1:]):
        fresh = [] if _is_index(following, torchs) else {}
        if isinstance(node, list):
            node.extend([None] * (part + 1 - len(node)))
            if node[part] is None:
                node[part] = fresh
            node = node[part]
        else:
            node = node.setdefault(part, fresh)
    last = path[-1]
    if isinstance(node, list):
        node.extend([None] * (last + 1 - len(node)))
    node[last] = value
