"""A planner's set_up_planner, honoured around the engine's planning.

torch's saver and loader call `planner.set_up_planner(state_dict, ...)` on
every rank before planning; the planner keeps the state dict it will plan
for in `planner.state_dict`. Subclasses override it to rewrite that dict
(rename or drop keys, build it from the checkpoint's metadata as torch's
_EmptyStateDictLoadPlanner does). dcp plans in the engine, so it calls the
override the same way and then walks `planner.state_dict` instead of the
caller's dict. torch's own set_up_planner flattens the dict (its
`mappings` lead each flat key back to its place in the caller's dict):
a save or load walks it nested again where every key still has its
mapping, and a load puts each non-tensor value it read back into the
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
    mappings = getattr(planner, "mappings", None)
    if torchs and mappings and walked is not state_dict and \
            all(key in mappings for key in walked):
        # torch's flattening, keys untouched: the nesting comes back, so
        # the checkpoint records it (planner_data) as without a planner.
        from torch.distributed.checkpoint._nested_dict import (
            unflatten_state_dict)
        walked = unflatten_state_dict(walked, mappings)
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

    def __init__(self, planner, state_dict, walked, nested=None):
        self._planner = planner
        self._state_dict = state_dict
        self._flat = walked
        self._nested = nested
        self.walked = nested if nested is not None else walked

    def finish(self) -> None:
        mappings = getattr(self._planner, "mappings", None)
        if self._flat is self._state_dict or not mappings:
            return
        from torch.distributed.checkpoint._traverse import (get_element,
                                                            set_element)
        import torch
        original = getattr(self._planner, "original_state_dict",
                           self._state_dict)
        if self._nested is not None:
            for key, path in mappings.items():
                value = get_element(self._nested, path)
                if not isinstance(value, torch.Tensor):
                    self._flat[key] = value
                    set_element(original, path, value)
            return
        for key, value in self._flat.items():
            path = mappings.get(key)
            if path is not None and not isinstance(value, torch.Tensor):
                set_element(original, path, value)


def set_up_load(planner, state_dict, *, storage_reader, path: str, rank: int,
                is_coordinator: bool):
    """The load's LoadSetUp: the caller's dict unless the planner overrides
    set_up_planner, which is then called with the checkpoint's metadata."""
    as_dcp_planner(planner, "load")  # refused before any hook runs
    base = _honoured(planner, "load")
    if base is None:
        return LoadSetUp(None, state_dict, state_dict)
    md = read_metadata_for(storage_reader, path, rank)
    if _is_torchs(base):
        md = _torch_metadata(md)
    planner.state_dict = state_dict  # for an override that leaves it
    planner.set_up_planner(state_dict, md, is_coordinator)
    walked = planner.state_dict
    if not isinstance(walked, dict):
        raise TypeError(
            f"{type(planner).__qualname__}.set_up_planner left a "
            f"{type(walked).__name__} in planner.state_dict, not a dict")
    mappings = getattr(planner, "mappings", None)
    nested = None
    if _is_torchs(base) and mappings and walked is not state_dict and \
            all(key in mappings for key in walked):
        from torch.distributed.checkpoint._nested_dict import (
            unflatten_state_dict)
        nested = unflatten_state_dict(walked, mappings)
    return LoadSetUp(planner, state_dict, walked, nested)
