"""torch.distributed for dcp.state_dict: DTensors, gathering, broadcasting.

Looks torch.distributed up only when the process already uses it; gathers
and re-shards DTensors, applies full_state_dict and cpu_offload to a state
dict being returned, and broadcasts rank 0's state dict (broadcast_from_rank0)
one tensor at a time. Private to dcp.state_dict, whose docstring states the
contracts.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

if TYPE_CHECKING:
    from .state_dict import StateDictOptions


# --------------------------------------------------------------------------
# torch.distributed, looked up only when the process already uses it.


_dtensor: type | None = None


def _dtensor_class() -> type | None:
    # A DTensor can only exist once torch.distributed.tensor was imported, so
    # a model without one never pays for importing it.
    global _dtensor
    if _dtensor is None:
        module = sys.modules.get("torch.distributed.tensor")
        if module is not None:
            _dtensor = getattr(module, "DTensor", None)
    return _dtensor


def _is_dtensor(value: Any) -> bool:
    cls = _dtensor_class()
    return cls is not None and isinstance(value, cls)


def _dist_initialized() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _rank() -> int:
    return torch.distributed.get_rank() if _dist_initialized() else 0


def _full_tensor(value: torch.Tensor) -> torch.Tensor:
    full = value.full_tensor()
    collectives = sys.modules.get("torch.distributed._functional_collectives")
    if collectives is not None and isinstance(
        full, collectives.AsyncCollectiveTensor
    ):
        full = full.wait()
    return full


_distribute_accepts_src_rank: bool | None = None


def _distribute_locally(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Shards `full`, which every rank holds, like the DTensor `like`.

    Each rank slices its own shard (src_data_rank=None): no communication.
    """
    from torch.distributed.tensor import distribute_tensor

    global _distribute_accepts_src_rank
    if _distribute_accepts_src_rank is None:
        _distribute_accepts_src_rank = (
            "src_data_rank" in inspect.signature(distribute_tensor).parameters
        )
    local = like.to_local()
    if local.device.type != "meta":
        full = full.to(device=local.device)
    full = full.detach()
    if _distribute_accepts_src_rank:
        return distribute_tensor(
            full, like.device_mesh, like.placements, src_data_rank=None
        )
    # Older torch scatters from each mesh dimension's first rank, which holds
    # the same full tensor here, so the result is the same.
    return distribute_tensor(full, like.device_mesh, like.placements)


# --------------------------------------------------------------------------
# Tree helpers over dicts, lists and tuples.


def _map_tensors(value: Any, fn) -> Any:
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, dict):
        return {k: _map_tensors(v, fn) for k, v in value.items()}
    if isinstance(value, list):
        return [_map_tensors(v, fn) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_map_tensors(v, fn) for v in value)
    return value


def _gather_and_offload(state: dict, options: StateDictOptions) -> dict:
    """Applies full_state_dict and cpu_offload to a state dict being returned."""
    if not options.full_state_dict and not options.cpu_offload:
        return state

    # With both options only rank 0 keeps the result; the others still take
    # part in every gather, in the same order.
    keep = not (options.full_state_dict and options.cpu_offload and _rank() != 0)

    def convert(t: torch.Tensor) -> torch.Tensor | None:
        if options.full_state_dict and _is_dtensor(t):
            t = _full_tensor(t)
        if not keep:
            return None
        if options.cpu_offload:
            t = t.to("cpu")
        return t

    converted = _map_tensors(state, convert)
    return converted if keep else {}


# --------------------------------------------------------------------------
# Set: re-sharding onto the parameters, rank 0's state dict broadcast.


def _localize(value: Any, like: Any) -> Any:
    """`value` in the form of `like`: a full tensor for a DTensor is re-sharded."""
    if (
        isinstance(value, torch.Tensor)
        and not _is_dtensor(value)
        and _is_dtensor(like)
        and tuple(value.shape) == tuple(like.shape)
    ):
        return _distribute_locally(value, like)
    return value


class _TensorSpec(NamedTuple):
    """Stands for a tensor in the broadcast skeleton; its data follows."""

    shape: tuple[int, ...]
    dtype: torch.dtype


class _BroadcastError(NamedTuple):
    """Sent instead of a skeleton when rank 0 cannot describe its state dict."""

    message: str


def _comm_device(templates: Iterable[Any]) -> torch.device:
    """The device to broadcast on: the local tensors' device, if the group can."""
    device = None
    for value in templates:
        if not isinstance(value, torch.Tensor):
            continue
        local = value.to_local() if _is_dtensor(value) else value
        if local.device.type != "meta" and local.dim() > 0:
            device = local.device
            break
    group = torch.distributed.distributed_c10d._get_default_group()
    supported = [torch.device(d) for d in getattr(group, "_device_types", ())]
    if device is not None and (
        not supported or device.type in {d.type for d in supported}
    ):
        return device
    if supported:
        d = supported[0]
        if d.type == "cuda" and d.index is None:
            return torch.device("cuda", torch.cuda.current_device())
        return d
    return torch.device("cpu")


def _broadcast_tree(tree: Any, device: torch.device, materialize) -> Any:
    """Rank 0's `tree` on every rank; `materialize(path, tensor)` places each tensor.

    Non-tensor leaves and 0-d tensors travel in one pickled skeleton; every
    other tensor is broadcast on its own into a buffer on `device`, handed to
    `materialize` and dropped, so at most one full tensor is held at a time.
    """
    dist = torch.distributed
    is_src = dist.get_rank() == 0
    skeleton: Any = None
    if is_src:

        def describe(t: torch.Tensor) -> Any:
            if _is_dtensor(t):
                raise ValueError(
                    "broadcast_from_rank0 needs full tensors on rank 0, got a DTensor"
                )
            if t.dim() == 0:
                return t.detach().cpu()
            return _TensorSpec(tuple(t.shape), t.dtype)

        try:
            skeleton = _map_tensors(tree, describe)
        except ValueError as error:
            # Sent on, so that the other ranks raise too instead of waiting.
            skeleton = _BroadcastError(str(error))
    box = [skeleton]
    dist.broadcast_object_list(box, src=0)
    skeleton = box[0]
    if isinstance(skeleton, _BroadcastError):
        raise ValueError(f"rank 0: {skeleton.message}")

    def walk(path: tuple, spec: Any, source: Any) -> Any:
        if isinstance(spec, _TensorSpec):
            if is_src:
                buffer = source.detach().to(device=device).contiguous()
            else:
                buffer = torch.empty(spec.shape, dtype=spec.dtype, device=device)
            dist.broadcast(buffer, src=0)
            return materialize(path, buffer)
        if isinstance(spec, torch.Tensor):
            return materialize(path, spec)
        if isinstance(spec, dict):
            return {
                k: walk(path + (k,), v, source[k] if is_src else None)
                for k, v in spec.items()
            }
        if isinstance(spec, (list, tuple)) and not hasattr(spec, "_fields"):
            items = [
                walk(path + (i,), v, source[i] if is_src else None)
                for i, v in enumerate(spec)
            ]
            return items if isinstance(spec, list) else tuple(items)
        return spec

    return walk((), skeleton, tree)
