"""dcp.load from a torch.save file, read by one rank and broadcast
(format_utils.BroadcastingTorchSaveReader): a model saved whole with
torch.save loads straight into a distributed job's state dict, each rank
keeping its own shards of DTensor parameters.

The coordinator reads the file (torch.load, memory-mapped where the file
allows); the ranks agree on what each needs, then every tensor is
broadcast whole over torch.distributed, one at a time, and each rank
copies its part into its destination (converted as copy_ converts). Plain
values travel with the names. Every failure (no file, a key the file
lacks, a shape that differs) is agreed, so each rank raises
CheckpointException together rather than leaving another in a broadcast.
"""

from __future__ import annotations

import os
import pickle

import numpy as np

from . import _lib, _state, errors
from ._planner_hooks import _set_element
from .planner import as_dcp_planner, flatten
from .stateful import is_stateful

# Header entries: a tensor's (_TENSOR, shape, dtype); a plain value's
# (_VALUE, value); a name the file lacks (_ABSENT,).
_TENSOR, _VALUE, _ABSENT = "tensor", "value", "absent"


def _partial(planner) -> bool:
    """allow_partial_load of the load's planner: dcp's DefaultLoadPlanner
    (DynamicMetaLoadPlanner among them), torch's, or torch's
    DynamicMetaLoadPlanner, whose planning this load does not use."""
    if planner is None:
        return False
    try:
        from torch.distributed.checkpoint.format_utils import \
            DynamicMetaLoadPlanner as TorchDynamic
    except ImportError:
        TorchDynamic = None
    if TorchDynamic is None or type(planner) is not TorchDynamic:
        planner = as_dcp_planner(planner, "load")
    return bool(getattr(planner, "allow_partial_load", False))


def _planner_name(planner) -> str:
    """How the missing-key message names the planner class to pass
    allow_partial_load=True to: the caller's class where it is dcp's or
    torch's DynamicMetaLoadPlanner, else DefaultLoadPlanner."""
    name = type(planner).__name__ if planner is not None else ""
    if name == "DynamicMetaLoadPlanner":
        return "dcp.format_utils.DynamicMetaLoadPlanner"
    return "dcp.DefaultLoadPlanner"


def _read(path: str, allow_pickle: bool) -> dict:
    """The flattened state dict of torch.save file `path` (read as
    torch.load reads it: weights_only unless allow_pickle)."""
    import torch
    if os.path.isdir(path):
        raise errors.from_status(
            _lib.INVALID_ARGUMENT,
            f"{path} is a directory: BroadcastingTorchSaveReader reads a "
            "torch.save file (load a checkpoint directory without it)")
    if not os.path.exists(path):
        raise errors.from_status(
            _lib.NOT_FOUND, f"no torch.save file at {path}",
            cls=errors.CheckpointFileNotFoundError)
    kwargs = dict(map_location="cpu", weights_only=not allow_pickle)
    try:
        try:
            state = torch.load(path, mmap=True, **kwargs)
        except RuntimeError as e:
            if "mmap" not in str(e):
                raise
            state = torch.load(path, **kwargs)  # the legacy format
    except pickle.UnpicklingError as e:
        if allow_pickle or "weights_only" not in str(e).replace(" ", "_"):
            raise errors.from_status(
                _lib.DATA_LOSS, f"{path}: torch.load failed: {e}") from e
        raise errors.from_status(
            _lib.INVALID_ARGUMENT,
            f"{path} holds objects other than tensors and plain values, "
            "which only a full unpickling reads (it can run code): pass "
            "allow_pickle=True to dcp.load for a file you trust") from e
    except (OSError, EOFError, RuntimeError, ValueError) as e:
        raise errors.from_status(
            _lib.DATA_LOSS, f"{path}: torch.load failed: "
            f"{type(e).__name__}: {e}") from e
    if not isinstance(state, dict):
        raise errors.from_status(
            _lib.INVALID_ARGUMENT, f"{path} holds a "
            f"{type(state).__name__}, not a state dict")
    return flatten(state)[0]


def _describe(source: dict, name: str, path: str):
    """The header entry of `name`; raises for a tensor the broadcast cannot
    carry (sparse, on the meta device)."""
    import torch
    if name not in source:
        return (_ABSENT,)
    value = source[name]
    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided or value.is_meta:
            raise errors.from_status(
                _lib.UNIMPLEMENTED,
                f'"{name}" in {path} is a {value.layout} tensor'
                f'{" on the meta device" if value.is_meta else ""}; '
                "BroadcastingTorchSaveReader loads dense tensors")
        return (_TENSOR, tuple(value.shape), value.dtype)
    return (_VALUE, value)


def _absent_hint(source: dict, name: str) -> str:
    """For a `name` the file lacks: the same name one key shallower or
    deeper in the file (a state dict wrapped as {"model": ...} on one side
    only), as " (the file holds ...)"; "" when none fits alone."""
    dot = name.find(".")
    if dot > 0 and name[dot + 1:] in source:
        return (f' (the file holds "{name[dot + 1:]}": saved without the '
                f'key "{name[:dot]}" of the state dict? load into that '
                "key's value)")
    tail = "." + name
    outers = [k for k in source if k.endswith(tail) and
              "." not in k[:-len(tail)] and k[:-len(tail)]]
    if len(outers) == 1:
        outer = outers[0][:-len(tail)]
        return (f' (the file holds "{outers[0]}": saved under the key '
                f'"{outer}", which the state dict lacks? load '
                f'{{"{outer}": ...}})')
    return ""


def _is_tensor(value) -> bool:
    import torch
    return isinstance(value, (torch.Tensor, np.ndarray,
                              _state.ShardedTensor))


def _global_shape(dest) -> tuple:
    if isinstance(dest, _state.ShardedTensor):
        return tuple(dest.global_shape)
    return tuple(dest.shape)


def _holds_tensor(value) -> bool:
    if _is_tensor(value):
        return True
    if isinstance(value, dict):
        return any(_holds_tensor(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_tensor(v) for v in value)
    return False


def _check(flat: dict, header: dict, partial: bool, path: str,
           hint: str = "", planner_name: str = "DefaultLoadPlanner") -> list:
    """The names this rank loads (those the file holds); raises for a
    name the file lacks (unless `partial`: its message ends with `hint`,
    the source's _absent_hint of the first one, and names the planner
    class to pass allow_partial_load to) or holds in another kind or
    shape."""
    missing = []
    names = []
    for name, dest in flat.items():
        entry = header[name]
        if entry[0] == _ABSENT:
            missing.append(name)
            continue
        if _is_tensor(dest):
            if entry[0] != _TENSOR:
                raise errors.from_status(
                    _lib.INVALID_ARGUMENT,
                    f'"{name}" is a tensor in the state dict but a value '
                    f"of type {type(entry[1]).__name__} in {path}")
            if _global_shape(dest) != entry[1]:
                raise errors.from_status(
                    _lib.INVALID_ARGUMENT,
                    f'"{name}" has shape {list(_global_shape(dest))} in the '
                    f"state dict but {list(entry[1])} in {path}")
        elif _holds_tensor(dest):
            raise errors.from_status(
                _lib.UNIMPLEMENTED,
                f'"{name}" is a {type(dest).__name__} holding tensors, which '
                "BroadcastingTorchSaveReader would replace rather than fill "
                "in place: hold them in a dict or list")
        elif entry[0] == _TENSOR:
            raise errors.from_status(
                _lib.INVALID_ARGUMENT,
                f'"{name}" is a value of type {type(dest).__name__} in the '
                f"state dict but a tensor in {path}")
        names.append(name)
    if missing and not partial:
        listed = ", ".join(f'"{n}"' for n in missing[:8])
        more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
        raise errors.from_status(
            _lib.NOT_FOUND,
            f"{path} has no {listed}{more}{hint}; or, to skip the keys it "
            f"lacks, load with planner={planner_name}("
            "allow_partial_load=True)")
    return names


def _copy_into(dest, full, name: str) -> None:
    """Copies this rank's part of the whole tensor `full` into `dest`."""
    import torch
    if isinstance(dest, np.ndarray):
        torch.from_numpy(dest).copy_(full)
        return
    if _state._is_dtensor(dest):
        chunk = _state._dtensor_chunk(dest, name)
        if chunk is None:
            return
        local, _, offsets = chunk
        if offsets is not None:
            for dim, (start, length) in enumerate(zip(offsets, local.shape)):
                full = full.narrow(dim, start, length)
        local.copy_(full)
        return
    if isinstance(dest, _state.ShardedTensor):
        for dim, (start, length) in enumerate(zip(dest.offsets,
                                                  dest.local.shape)):
            full = full.narrow(dim, start, length)
        _copy_into(dest.local, full, name)
        return
    if getattr(dest, "global_shape", None) is not None:
        raise errors.from_status(
            _lib.UNIMPLEMENTED,
            f'"{name}": BroadcastingTorchSaveReader loads into tensors, '
            "DTensors and dcp.ShardedTensor, not into a CheckpointableTensor")
    dest.copy_(full)


def _prepare(state_dict, reader, checkpoint_id, planner, where, stateful):
    """What this rank loads, before any collective: (path, partial,
    statefuls, target, flat, mappings, torch group or None, source rank,
    is_source). Raises for bad arguments or a Stateful that fails."""
    import torch.distributed as dist
    if not isinstance(state_dict, dict):
        raise TypeError(f"state_dict must be a dict, not "
                        f"{type(state_dict).__name__}")
    if checkpoint_id is not None:
        reader.reset(checkpoint_id)
    if reader.checkpoint_id is None:
        raise errors.CheckpointIdMissingError(
            "load: pass checkpoint_id (the torch.save file) or a "
            "BroadcastingTorchSaveReader holding it")
    path = errors.checked_path(reader.checkpoint_id, "checkpoint_id")
    partial = _partial(planner)
    statefuls = {k: v for k, v in state_dict.items()
                 if stateful and is_stateful(v, load=True)}
    target = dict(state_dict)
    for key, value in statefuls.items():
        target[key] = value.state_dict()
    flat, mappings = flatten(target)
    group = where.group
    tgroup, source, is_source = None, reader.coordinator_rank, True
    if group is not None:
        tgroup = getattr(group, "_keep", None)
        if tgroup is None:
            raise ValueError(
                "BroadcastingTorchSaveReader broadcasts through "
                "torch.distributed: pass a torch process group (or none, "
                "after init_process_group), not a dcp.ProcessGroup")
        # The coordinator is a global rank, as in torch's reader.
        dist.get_group_rank(tgroup, source)  # ValueError unless a member
        is_source = dist.get_rank() == source
    return (path, partial, statefuls, target, flat, mappings, tgroup, source,
            is_source)


def _nbytes(entry) -> int:
    import torch
    _, shape, dtype = entry
    numel = 1
    for n in shape:
        numel *= n
    return numel * torch.empty((), dtype=dtype).element_size()


def load(state_dict, *, reader, checkpoint_id, planner, where,
         allow_pickle: bool, stateful: bool) -> None:
    """dcp.load through BroadcastingTorchSaveReader `reader` (module
    docstring), in the group `where` (process_group.Resolved). Every
    failure is agreed before the next collective, so each rank raises."""
    import torch
    import torch.distributed as dist
    error = prepared = None
    try:
        prepared = _prepare(state_dict, reader, checkpoint_id, planner, where,
                            stateful)
    except Exception as e:
        error = e
    where.agree("load", error)
    (path, partial, statefuls, target, flat, mappings, tgroup, source,
     is_source) = prepared
    # What every rank needs, in one order.
    names = sorted(flat)
    if tgroup is not None:
        gathered = [None] * where.group.size
        dist.all_gather_object(gathered, names, group=tgroup)
        names = sorted(set().union(*gathered))
    error = None
    header = saved = None
    hint = ""
    if is_source:
        try:
            saved = _read(path, allow_pickle)
            header = {n: _describe(saved, n, path) for n in names}
            absent = next((n for n in names if header[n][0] == _ABSENT),
                          None)
            hint = "" if absent is None else _absent_hint(saved, absent)
        except Exception as e:
            error = e
    where.agree("load", error)
    if tgroup is not None:
        box = [(header, hint) if is_source else None]
        dist.broadcast_object_list(box, src=source, group=tgroup)
        header, hint = box[0]
    error = None
    try:
        loading = set(_check(flat, header, partial, path, hint,
                             _planner_name(planner)))
    except Exception as e:
        error = e
    where.agree("load", error)
    device = torch.device("cpu")
    if tgroup is not None and dist.get_backend(tgroup) == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    error = None
    with torch.no_grad():
        for name in names:
            entry = header[name]
            if entry[0] != _TENSOR:
                continue
            nbytes = _nbytes(entry)
            # The bytes travel as uint8 (any dtype, any backend); a rank
            # that fails keeps taking part, and says so at the end.
            payload = None
            if is_source:
                try:
                    full = saved[name].detach().to(device).contiguous()
                    payload = full.reshape(-1).view(torch.uint8)
                except Exception as e:
                    error = error or _named(e, name)
            if payload is None:
                payload = torch.empty(nbytes, dtype=torch.uint8,
                                      device=device)
            if tgroup is not None and nbytes:
                dist.broadcast(payload, src=source, group=tgroup)
            if name in loading and error is None:
                try:
                    full = payload.view(entry[2]).reshape(entry[1])
                    _copy_into(flat[name], full, name)
                except Exception as e:
                    error = _named(e, name)
            del payload
    where.agree("load", error)
    for name in sorted(loading):
        entry = header[name]
        if entry[0] == _VALUE:
            if name in mappings:
                _set_element(target, mappings[name], entry[1], torchs=False)
            else:
                target[name] = entry[1]
    for key in state_dict:
        if key not in statefuls:
            state_dict[key] = target[key]
    for key, value in statefuls.items():
        value.load_state_dict(target[key])


def _named(error, name):
    """`error` as a CheckpointException naming `name`."""
    if isinstance(error, errors.CheckpointException):
        return error
    return errors.from_status(_lib.INVALID_ARGUMENT,
                              f'"{name}": {type(error).__name__}: {error}')
