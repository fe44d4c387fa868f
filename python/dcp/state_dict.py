"""State dicts of torch models and optimizers keyed by parameter names.

The seed's state-dict helpers: `get_model_state_dict`,
`get_optimizer_state_dict`, `get_state_dict` and their `set_*` counterparts,
`StateDictOptions`, and `load_sharded_optimizer_state_dict`.

What they produce:
- Model state is `module.state_dict()` keyed by canonical FQNs: the names a
  parameter or buffer has in the unwrapped module. Wrapper components are
  dropped: `module.` of DistributedDataParallel, `_orig_mod.` of
  torch.compile, `_checkpoint_wrapped_module.` of activation checkpointing. A
  tied parameter appears under every name `state_dict()` reports; loading
  copies into the one shared tensor, so the tie survives.
- Optimizer state is keyed by the parameter's first canonical FQN instead of
  the optimizer's integer ids, nested
  `{"state": {fqn: {name: value}}, "param_groups": [{..., "params": [fqn]}]}`
  or, with `flatten_optimizer_state_dict`, flat `state.<fqn>.<name>` and
  `param_groups.<fqn>.<key>`. Several optimizers over one model merge into
  one state dict; each later takes back the entries of its own parameters.
- DTensor parameters (fully_shard, tensor parallel) stay DTensors unless
  `full_state_dict` gathers them; on set, a plain tensor with a DTensor
  parameter's global shape is re-sharded onto that parameter's mesh and
  placements. FSDP1's flat parameters are refused (NotImplementedError).

Tensors in a returned state dict share memory with the model and optimizer
(unless `full_state_dict` or `cpu_offload` made copies), so `dcp.load` into
them writes the live state; a `set_*` call afterwards finds the same tensors
(the optimizer's are kept as they are, the model's are copied onto
themselves). `set_*` copies values in: the model and optimizer never
keep references to the caller's tensors (torch's Optimizer.load_state_dict
alone would keep them).

Lazily created optimizer state: an optimizer that has never stepped has no
state tensors to save or to load into. `get_*` and `set_*` then create them
the way the seed does, with one `step()` over zero gradients and `lr` set to
0 (params and grads are restored afterwards; counters such as Adam's `step`
read 1, as torch's implementation of the seed leaves them). Optimizers whose
`step()` needs a closure (LBFGS) are not supported.

Threading: none of these functions is thread-safe with respect to the model
or optimizer they touch. With a process group, every rank must make the same
calls in the same order (gathering, broadcasting and re-sharding are
collectives).
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import torch
import torch.nn as nn
from torch.nn.modules.module import _IncompatibleKeys

__all__ = [
    "StateDictOptions",
    "get_model_state_dict",
    "get_optimizer_state_dict",
    "get_state_dict",
    "set_model_state_dict",
    "set_optimizer_state_dict",
    "set_state_dict",
    "load_sharded_optimizer_state_dict",
]

_STATE = "state"
_PARAM_GROUPS = "param_groups"
_PARAMS = "params"
# torch.distributed.checkpoint's placeholder for a non-tensor value to load.
_BYTES_PLACEHOLDER = "<bytes_io>"


@dataclasses.dataclass
class StateDictOptions:
    """How the get_*/set_* helpers build or consume a state dict.

    full_state_dict: get gathers every DTensor into a full tensor (a
      collective on its mesh). Set re-shards a plain tensor with a DTensor
      parameter's (or state's) global shape onto its mesh whatever this says.
    cpu_offload: get moves tensors to CPU (`.to("cpu")`: a CPU tensor is
      returned as it is, still shared with the model). With full_state_dict and a
      process group, only rank 0 keeps anything: other ranks take part in the
      gathers and get an empty dict. Ignored by set.
    ignore_frozen_params: get leaves out parameters with requires_grad False;
      set does not report them as missing.
    keep_submodule_prefixes: with `submodules`, keep the submodule's prefix
      in the keys (True) or strip it (False).
    strict: set raises RuntimeError on missing or unexpected model keys, on
      a trainable parameter that has optimizer state but none in the
      state dict, and on a parameter without saved param group settings.
      Non-strict set returns the model's missing/unexpected keys and leaves
      missing optimizer entries as they are.
    broadcast_from_rank0: set reads the state dict on rank 0 only and
      broadcasts it (requires full_state_dict and an initialized default
      process group); other ranks may pass an empty dict.
    flatten_optimizer_state_dict: get returns the flat optimizer form
      (`state.<fqn>.<name>`, `param_groups.<fqn>.<key>`); set accepts either.
    dsd_fqn_modifiers: name of a module method returning {visible name:
      hidden attribute} for modules whose state_dict hooks hide a submodule.
    """

    full_state_dict: bool = False
    cpu_offload: bool = False
    ignore_frozen_params: bool = False
    keep_submodule_prefixes: bool = True
    strict: bool = True
    broadcast_from_rank0: bool = False
    flatten_optimizer_state_dict: bool = False
    dsd_fqn_modifiers: str = "_fqn_modifiers"


# --------------------------------------------------------------------------
# torch.distributed, looked up only when the process already uses it.


def _dtensor_class() -> type | None:
    # A DTensor can only exist once torch.distributed.tensor was imported, so
    # a model without one never pays for importing it.
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None) if module is not None else None


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
# Parameter names.


def _wrapper_child(obj: Any, name: str) -> Any:
    """The wrapped module if `name` is `obj`'s wrapper component, else None."""
    if not isinstance(obj, nn.Module):
        return None
    if name == "module" and isinstance(
        obj, torch.nn.parallel.DistributedDataParallel
    ):
        return obj.module
    if name == "_orig_mod":
        eval_frame = sys.modules.get("torch._dynamo.eval_frame")
        if eval_frame is not None and isinstance(obj, eval_frame.OptimizedModule):
            return obj._orig_mod
    if name == "_checkpoint_wrapped_module":
        return getattr(obj, name, None)
    return None


def _refuse_flat_parameters(model: nn.Module) -> None:
    fsdp = sys.modules.get("torch.distributed.fsdp.fully_sharded_data_parallel")
    if fsdp is None:
        return
    if any(isinstance(m, fsdp.FullyShardedDataParallel) for m in model.modules()):
        raise NotImplementedError(
            "FullyShardedDataParallel (FSDP1) flat parameters are not supported; "
            "use fully_shard (FSDP2), whose parameters are DTensors"
        )


class _ModelIndex:
    """Canonical FQNs of one model's state dict keys and parameters."""

    def __init__(self, model: nn.Module, fqn_modifiers: str) -> None:
        _refuse_flat_parameters(model)
        self.model = model
        self._fqn_modifiers = fqn_modifiers
        self._canonical_cache: dict[str, str] = {}
        # id(param) -> (param, canonical FQNs in module order).
        self._params: dict[int, tuple[torch.Tensor, list[str]]] = {}
        for name, param in model.named_parameters(remove_duplicate=False):
            entry = self._params.setdefault(id(param), (param, []))
            fqn = self.canonical(name)
            if fqn not in entry[1]:
                entry[1].append(fqn)
        self.fqn_to_param: dict[str, torch.Tensor] = {
            fqn: param for param, fqns in self._params.values() for fqn in fqns
        }

    def canonical(self, key: str) -> str:
        """`key` (a state_dict or named_parameters name) without wrapper parts."""
        cached = self._canonical_cache.get(key)
        if cached is not None:
            return cached
        kept = []
        obj: Any = self.model
        for name in key.split("."):
            inner = _wrapper_child(obj, name)
            if inner is not None:
                obj = inner
                continue
            kept.append(name)
            obj = self._child(obj, name)
        fqn = ".".join(kept)
        self._canonical_cache[key] = fqn
        return fqn

    def _child(self, obj: Any, name: str) -> Any:
        if not isinstance(obj, nn.Module):
            return None
        child = obj._modules.get(name)
        if child is not None:
            return child
        modifiers = getattr(obj, self._fqn_modifiers, None)
        if callable(modifiers):
            hidden = modifiers().get(name)
            if hidden is not None:
                return getattr(getattr(obj, hidden, None), name, None)
        return None

    def fqns(self, param: torch.Tensor) -> list[str]:
        """Every canonical FQN of `param`; ValueError if it is not the model's."""
        entry = self._params.get(id(param))
        if entry is None:
            raise ValueError(
                "an optimizer holds a parameter of shape "
                f"{tuple(param.shape)} that is not a parameter of the model"
            )
        return entry[1]

    def frozen_fqns(self) -> set[str]:
        return {
            fqn
            for param, fqns in self._params.values()
            if not param.requires_grad
            for fqn in fqns
        }


def _submodule_prefixes(
    index: _ModelIndex, submodules: Iterable[nn.Module]
) -> list[str]:
    wanted = {id(m) for m in submodules}
    prefixes = []
    for name, module in index.model.named_modules():
        if id(module) in wanted:
            fqn = index.canonical(name) if name else ""
            prefixes.append(f"{fqn}." if fqn else "")
    return prefixes


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


def _as_optimizers(optimizers: Any) -> tuple[torch.optim.Optimizer, ...]:
    if isinstance(optimizers, torch.optim.Optimizer):
        result: tuple = (optimizers,)
    else:
        result = tuple(optimizers)
    if not result:
        raise ValueError("no optimizer was passed")
    for optim in result:
        if not isinstance(optim, torch.optim.Optimizer):
            raise TypeError(f"not a torch.optim.Optimizer: {type(optim).__name__}")
    return result


def _check_options(
    options: StateDictOptions | None, loading: bool = False
) -> StateDictOptions:
    options = options or StateDictOptions()
    if options.broadcast_from_rank0 and not options.full_state_dict:
        raise ValueError("broadcast_from_rank0 requires full_state_dict=True")
    if loading and options.broadcast_from_rank0 and not _dist_initialized():
        raise ValueError(
            "broadcast_from_rank0 requires an initialized default process group"
        )
    return options


# --------------------------------------------------------------------------
# Lazily created optimizer state.


@torch.no_grad()
def _init_optimizer_state(optim: torch.optim.Optimizer) -> None:
    """Creates the state of an optimizer that has none: one step, lr 0, zero grads."""
    if optim.state:
        return
    params = [
        p for group in optim.param_groups for p in group[_PARAMS] if p.requires_grad
    ]
    if not params:
        return
    grads = [p.grad for p in params]
    lrs = [group.get("lr") for group in optim.param_groups]
    try:
        for p in params:
            p.grad = torch.zeros_like(p)
        for group in optim.param_groups:
            lr = group.get("lr")
            if isinstance(lr, torch.Tensor):
                group["lr"] = torch.zeros_like(lr)
            elif lr is not None:
                group["lr"] = 0.0
        optim.step()
    finally:
        for group, lr in zip(optim.param_groups, lrs):
            if lr is not None:
                group["lr"] = lr
        for p, grad in zip(params, grads):
            p.grad = grad


# --------------------------------------------------------------------------
# Model.


def _model_state_dict(
    model: nn.Module,
    index: _ModelIndex,
    submodules: Iterable[nn.Module] | None,
    options: StateDictOptions,
) -> dict[str, Any]:
    raw = model.state_dict()
    state: dict[str, Any] = {}
    for key, value in raw.items():
        fqn = index.canonical(key)
        if fqn in state:
            raise RuntimeError(
                f"state_dict keys {key!r} and another both name {fqn!r} "
                "once wrapper prefixes are removed"
            )
        state[fqn] = value
    if options.ignore_frozen_params:
        for fqn in index.frozen_fqns():
            state.pop(fqn, None)
    if submodules is not None:
        prefixes = _submodule_prefixes(index, submodules)
        selected: dict[str, Any] = {}
        for fqn, value in state.items():
            for prefix in prefixes:
                if fqn.startswith(prefix):
                    key = fqn if options.keep_submodule_prefixes else fqn[len(prefix):]
                    selected[key] = value
                    break
        state = selected
    return _gather_and_offload(state, options)


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


@torch.no_grad()
def _load_model(
    model: nn.Module,
    index: _ModelIndex,
    state_dict: Mapping[str, Any],
    options: StateDictOptions,
) -> _IncompatibleKeys:
    local = model.state_dict(keep_vars=True)
    key_of = {index.canonical(key): key for key in local}
    templates = {fqn: local[key] for fqn, key in key_of.items()}

    if options.broadcast_from_rank0:
        source = dict(state_dict) if _rank() == 0 else None
        state_dict = _broadcast_tree(
            source,
            _comm_device(templates.values()),
            lambda path, t: _localize(t, templates.get(path[0])),
        )
    assign = any(
        isinstance(v, torch.Tensor)
        and (v.to_local() if _is_dtensor(v) else v).device.type == "meta"
        for v in local.values()
    )
    to_load = {}
    for fqn, value in state_dict.items():
        key = key_of.get(fqn, fqn)
        to_load[key] = _localize(value, local.get(key))
    # strict=False so that the error, if any, names canonical FQNs.
    result = model.load_state_dict(to_load, strict=False, assign=assign)
    fqn_of = {key: fqn for fqn, key in key_of.items()}
    missing = [fqn_of.get(k, k) for k in result.missing_keys]
    if options.ignore_frozen_params:
        frozen = index.frozen_fqns()
        missing = [k for k in missing if k not in frozen]
    unexpected = [fqn_of.get(k, k) for k in result.unexpected_keys]
    if options.strict and (missing or unexpected):
        parts = []
        if missing:
            parts.append(
                "Missing key(s) in state_dict: " + ", ".join(map(repr, missing))
            )
        if unexpected:
            parts.append(
                "Unexpected key(s) in state_dict: " + ", ".join(map(repr, unexpected))
            )
        raise RuntimeError(
            f"Error(s) in loading state_dict for {type(model).__name__}: "
            + ". ".join(parts)
        )
    return _IncompatibleKeys(missing, unexpected)


# --------------------------------------------------------------------------
# Optimizer.


def _optimizer_state_dict(
    index: _ModelIndex,
    optimizers: tuple[torch.optim.Optimizer, ...],
    options: StateDictOptions,
) -> dict[str, Any]:
    state: dict[str, Any] = {}
    groups: list[dict[str, Any]] = []
    for optim in optimizers:
        _init_optimizer_state(optim)
        native = optim.state_dict()
        if len(native[_PARAM_GROUPS]) != len(optim.param_groups):
            raise RuntimeError(
                f"{type(optim).__name__}.state_dict() has "
                f"{len(native[_PARAM_GROUPS])} param groups, the optimizer "
                f"{len(optim.param_groups)}"
            )
        for saved, group in zip(native[_PARAM_GROUPS], optim.param_groups):
            fqns = []
            for pid, param in zip(saved[_PARAMS], group[_PARAMS]):
                fqn = index.fqns(param)[0]
                fqns.append(fqn)
                if pid in native[_STATE]:
                    if fqn in state:
                        raise ValueError(
                            f"parameter {fqn!r} is held by more than one optimizer"
                        )
                    # A copy of the entry's dict; its tensors stay shared.
                    state[fqn] = dict(native[_STATE][pid])
            entry = {k: v for k, v in saved.items() if k != _PARAMS}
            entry[_PARAMS] = fqns
            groups.append(entry)
    result: dict[str, Any] = {_STATE: state, _PARAM_GROUPS: groups}
    if options.flatten_optimizer_state_dict:
        result = _flatten_optimizer(result)
    return _gather_and_offload(result, options)


def _flatten_optimizer(nested: dict[str, Any]) -> dict[str, Any]:
    flat: dict[str, Any] = {}

    def put(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                put(f"{prefix}.{k}", v)
        else:
            flat[prefix] = value

    for fqn, entry in nested[_STATE].items():
        put(f"{_STATE}.{fqn}", entry)
    for group in nested[_PARAM_GROUPS]:
        for fqn in group[_PARAMS]:
            for k, v in group.items():
                if k != _PARAMS:
                    flat[f"{_PARAM_GROUPS}.{fqn}.{k}"] = v
    return flat


class _LoadedOptimizerState:
    """A loaded optimizer state dict (nested or flat) indexed by parameter FQN."""

    def __init__(self, source: Mapping[str, Any], index: _ModelIndex) -> None:
        # fqn -> state entry; fqn -> group hyperparameters (without params).
        self.state: dict[str, Any] = {}
        self.group_of: dict[str, dict[str, Any]] = {}
        # Hyperparameters of loaded groups without parameters, in order.
        self.empty_groups: list[dict[str, Any]] = []
        if _STATE in source or _PARAM_GROUPS in source:
            self._read_nested(source)
        else:
            self._read_flat(source, index)

    def _read_nested(self, source: Mapping[str, Any]) -> None:
        self.state = dict(source.get(_STATE, {}))
        for group in source.get(_PARAM_GROUPS, []):
            hyper = {k: v for k, v in group.items() if k != _PARAMS}
            params = group.get(_PARAMS, [])
            if not params:
                self.empty_groups.append(hyper)
            for fqn in params:
                self.group_of[fqn] = hyper

    def _read_flat(self, source: Mapping[str, Any], index: _ModelIndex) -> None:
        known = index.fqn_to_param
        for key, value in source.items():
            section, _, rest = key.partition(".")
            if section not in (_STATE, _PARAM_GROUPS):
                continue
            # The FQN is the longest dotted prefix of `rest` naming a parameter;
            # parameters are leaves, so at most one prefix can.
            parts = rest.split(".")
            for cut in range(len(parts) - 1, 0, -1):
                fqn = ".".join(parts[:cut])
                if fqn in known:
                    break
            else:
                continue
            tail = parts[cut:]
            if section == _PARAM_GROUPS:
                self.group_of.setdefault(fqn, {})[".".join(tail)] = value
            else:
                node = self.state.setdefault(fqn, {})
                for part in tail[:-1]:
                    node = node.setdefault(part, {})
                node[tail[-1]] = value

    def find(self, fqns: list[str]) -> str | None:
        """The first of a parameter's FQNs that the loaded state dict names."""
        for fqn in fqns:
            if fqn in self.state or fqn in self.group_of:
                return fqn
        return None


def _same_value(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and bool(torch.equal(a.cpu(), b.cpu()))
        )
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 (values that cannot compare differ)
        return False


def _can_copy_into(current: torch.Tensor, value: torch.Tensor) -> bool:
    """Whether current.copy_(value) loads value without changing its meaning."""
    if current.shape != value.shape or current.dtype != value.dtype:
        return False
    if _is_dtensor(current) or _is_dtensor(value):
        return (
            _is_dtensor(current)
            and _is_dtensor(value)
            and current.device == value.device
            and current.device_mesh == value.device_mesh
            and tuple(current.placements) == tuple(value.placements)
        )
    return True  # copy_ moves between devices


def _localize_entry(entry: Any, current: Any, param: torch.Tensor) -> Any:
    """A loaded per-parameter state entry the optimizer can own.

    Full tensors are re-sharded like the current state (or the parameter).
    Values are copied into the optimizer's current tensors where shape and
    dtype (and placements) match, on whatever device those are, else cloned: Optimizer.load_state_dict keeps the tensors
    it is given, and it must not share them with the caller's state dict.
    """
    if isinstance(entry, dict):
        current = current if isinstance(current, dict) else {}
        return {k: _localize_entry(v, current.get(k), param) for k, v in entry.items()}
    if not isinstance(entry, torch.Tensor):
        return entry
    like = current if isinstance(current, torch.Tensor) else param
    value = _localize(entry, like)
    if isinstance(current, torch.Tensor) and _can_copy_into(current, value):
        if value is not current:
            current.copy_(value)
        return current
    return value if value is not entry else value.detach().clone()


@torch.no_grad()
def _load_optimizers(
    index: _ModelIndex,
    optimizers: tuple[torch.optim.Optimizer, ...],
    source: Mapping[str, Any],
    options: StateDictOptions,
) -> None:
    for optim in optimizers:
        _init_optimizer_state(optim)
    if options.broadcast_from_rank0:
        source = _broadcast_optimizer_source(index, optimizers, source)
    loaded = _LoadedOptimizerState(source, index)
    empty_groups = iter(loaded.empty_groups)
    # Everything is checked before any optimizer changes, so a strict error
    # leaves them as they were.
    plans = []
    for optim in optimizers:
        # pid -> (loaded entry or None to keep the current one, param).
        entries: dict[int, tuple[Any, torch.Tensor]] = {}
        native_groups: list[dict[str, Any]] = []
        pid = 0
        for group in optim.param_groups:
            hyper: dict[str, Any] | None = None
            hyper_from = None
            ids = []
            if not group[_PARAMS]:
                hyper = next(empty_groups, None)
            for param in group[_PARAMS]:
                fqns = index.fqns(param)
                fqn = loaded.find(fqns)
                if fqn is not None and fqn in loaded.state:
                    entries[pid] = (loaded.state[fqn], param)
                elif optim.state.get(param):
                    if options.strict and param.requires_grad:
                        raise RuntimeError(
                            f"optimizer state for parameter {fqns[0]!r} is missing "
                            "from the state dict (StateDictOptions(strict=False) "
                            "keeps the optimizer's current state)"
                        )
                    entries[pid] = (None, param)
                if fqn is not None and fqn in loaded.group_of:
                    candidate = loaded.group_of[fqn]
                    if hyper is None:
                        hyper, hyper_from = candidate, fqn
                    elif candidate is not hyper:
                        for k in set(hyper) | set(candidate):
                            if not _same_value(hyper.get(k), candidate.get(k)):
                                raise RuntimeError(
                                    f"parameters {hyper_from!r} and {fqn!r} share "
                                    f"a param group but their saved {k!r} differ: "
                                    f"{hyper.get(k)!r} vs {candidate.get(k)!r}"
                                )
                elif options.strict:
                    raise RuntimeError(
                        f"param group settings for parameter {fqns[0]!r} are "
                        "missing from the state dict"
                    )
                ids.append(pid)
                pid += 1
            # Keys the state dict lacks keep the optimizer's current values.
            entry = {k: v for k, v in group.items() if k != _PARAMS}
            entry.update(hyper or {})
            entry[_PARAMS] = ids
            native_groups.append(entry)
        plans.append((optim, entries, native_groups))

    for optim, entries, native_groups in plans:
        native_state = {}
        for pid, (entry, param) in entries.items():
            current = optim.state.get(param, {})
            native_state[pid] = (
                current if entry is None else _localize_entry(entry, current, param)
            )
        optim.load_state_dict({_STATE: native_state, _PARAM_GROUPS: native_groups})


def _broadcast_optimizer_source(
    index: _ModelIndex,
    optimizers: tuple[torch.optim.Optimizer, ...],
    source: Mapping[str, Any],
) -> dict[str, Any]:
    """Rank 0's optimizer state dict on every rank, tensors re-sharded on arrival."""
    current: dict[str, Any] = {}
    for optim in optimizers:
        for param, entry in optim.state.items():
            for fqn in index.fqns(param):
                current[fqn] = (param, entry)

    def place(path: tuple, tensor: torch.Tensor) -> torch.Tensor:
        # Nested: ("state", fqn, name, ...); flat: ("state.<fqn>.<name>",).
        if path and path[0] == _STATE and len(path) >= 3:
            fqn, names = path[1], list(path[2:])
        elif len(path) == 1 and isinstance(path[0], str) and path[0].startswith(
            _STATE + "."
        ):
            parts = path[0].split(".")[1:]
            for cut in range(len(parts) - 1, 0, -1):
                if ".".join(parts[:cut]) in current:
                    break
            else:
                return tensor
            fqn, names = ".".join(parts[:cut]), parts[cut:]
        else:
            return tensor
        if fqn not in current:
            return tensor
        param, like = current[fqn]
        for name in names:
            like = like.get(name) if isinstance(like, dict) else None
        if not isinstance(like, torch.Tensor):
            like = param
        return _localize(tensor, like)

    templates = [param for param, _ in current.values()]
    templates += [
        p
        for optim in optimizers
        for group in optim.param_groups
        for p in group[_PARAMS]
    ]
    tree = dict(source) if _rank() == 0 else None
    return _broadcast_tree(tree, _comm_device(templates), place)


# --------------------------------------------------------------------------
# Public API.


def get_model_state_dict(
    model: nn.Module,
    *,
    submodules: set[nn.Module] | None = None,
    options: StateDictOptions | None = None,
) -> dict[str, Any]:
    """Returns `model`'s state dict keyed by canonical FQNs.

    `submodules` keeps only the entries under those modules. With
    full_state_dict, DTensors are gathered (a collective: call on every rank).
    """
    options = _check_options(options)
    index = _ModelIndex(model, options.dsd_fqn_modifiers)
    with torch.no_grad():
        return _model_state_dict(model, index, submodules, options)


def get_optimizer_state_dict(
    model: nn.Module,
    optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer],
    *,
    submodules: set[nn.Module] | None = None,
    options: StateDictOptions | None = None,
) -> dict[str, Any]:
    """Returns the merged state dict of `optimizers`, keyed by parameter FQNs.

    Initializes the state of an optimizer that has never stepped (see the file
    comment). `submodules` is accepted for the seed's signature and does not
    filter optimizer state. ValueError if an optimizer holds a parameter that
    is not `model`'s or two optimizers hold the same parameter.
    """
    del submodules
    options = _check_options(options)
    optims = _as_optimizers(optimizers)
    index = _ModelIndex(model, options.dsd_fqn_modifiers)
    with torch.no_grad():
        return _optimizer_state_dict(index, optims, options)


def get_state_dict(
    model: nn.Module,
    optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer],
    *,
    submodules: set[nn.Module] | None = None,
    options: StateDictOptions | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Returns (get_model_state_dict(...), get_optimizer_state_dict(...))."""
    options = _check_options(options)
    optims = _as_optimizers(optimizers)
    index = _ModelIndex(model, options.dsd_fqn_modifiers)
    with torch.no_grad():
        model_state = _model_state_dict(model, index, submodules, options)
        optim_state = _optimizer_state_dict(index, optims, options)
    return model_state, optim_state


def set_model_state_dict(
    model: nn.Module,
    model_state_dict: dict[str, Any],
    *,
    options: StateDictOptions | None = None,
) -> _IncompatibleKeys:
    """Loads a state dict keyed by canonical FQNs into `model`, in place.

    Returns (missing_keys, unexpected_keys) as canonical FQNs. With strict
    (the default), raises RuntimeError naming them instead; values of the keys
    that did match have been copied by then, as with Module.load_state_dict.
    Shape mismatches always raise RuntimeError.
    """
    options = _check_options(options, loading=True)
    index = _ModelIndex(model, options.dsd_fqn_modifiers)
    return _load_model(model, index, model_state_dict, options)


def set_optimizer_state_dict(
    model: nn.Module,
    optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer],
    optim_state_dict: dict[str, Any],
    *,
    options: StateDictOptions | None = None,
) -> None:
    """Loads a state dict from get_optimizer_state_dict (either form) into `optimizers`.

    Each optimizer takes the entries of its own parameters; entries of other
    parameters are ignored. A tied parameter's entry is found under any of
    its FQNs. Groups without parameters match the state dict's such groups in
    order. RuntimeError with strict when a trainable parameter's state or
    group settings are missing, or when parameters of one group were saved
    with different settings.
    """
    options = _check_options(options, loading=True)
    optims = _as_optimizers(optimizers)
    index = _ModelIndex(model, options.dsd_fqn_modifiers)
    _load_optimizers(index, optims, optim_state_dict, options)


def set_state_dict(
    model: nn.Module,
    optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer],
    *,
    model_state_dict: dict[str, Any],
    optim_state_dict: dict[str, Any],
    options: StateDictOptions | None = None,
) -> _IncompatibleKeys:
    """set_optimizer_state_dict, then set_model_state_dict; returns the latter's keys.

    The optimizers go first: initializing their state steps with lr 0, and
    loading the model afterwards makes the parameters exactly the loaded ones.
    """
    options = _check_options(options, loading=True)
    optims = _as_optimizers(optimizers)
    index = _ModelIndex(model, options.dsd_fqn_modifiers)
    _load_optimizers(index, optims, optim_state_dict, options)
    return _load_model(model, index, model_state_dict, options)


# --------------------------------------------------------------------------
# Loading optimizer state without an optimizer.


def _path_of(key: str, optimizer_key: str, planner_data: Any, fqns: set[str]):
    """The nested path of checkpoint key `key`; None if not under optimizer_key."""
    if isinstance(planner_data, Mapping):
        path = planner_data.get(key)
        if isinstance(path, (tuple, list)) and path:
            return tuple(path) if path[0] == optimizer_key else None
    prefix = optimizer_key + "."
    if key == optimizer_key:
        return (optimizer_key,)
    if not key.startswith(prefix):
        return None
    rest = key[len(prefix):]
    section, _, tail = rest.partition(".")
    if section == _STATE and tail:
        parts = tail.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            fqn = ".".join(parts[:cut])
            if fqn in fqns:
                return (optimizer_key, _STATE, fqn, *parts[cut:])
    parts = rest.split(".")
    return (optimizer_key, *(int(p) if p.isdigit() else p for p in parts))


def _set_path(root: dict, path: tuple, value: Any) -> None:
    node: Any = root
    for here, following in zip(path, path[1:]):
        if isinstance(node, list):
            while len(node) <= here:
                node.append(None)
            if node[here] is None:
                node[here] = [] if isinstance(following, int) else {}
            node = node[here]
        else:
            if here not in node:
                node[here] = [] if isinstance(following, int) else {}
            node = node[here]
    last = path[-1]
    if isinstance(node, list):
        while len(node) <= last:
            node.append(None)
    node[last] = value


def load_sharded_optimizer_state_dict(
    model_state_dict: dict[str, Any],
    optimizer_key: str,
    storage_reader: Any,
    planner: Any = None,
) -> dict[str, Any]:
    """Loads the optimizer state saved under `optimizer_key` from a checkpoint.

    Reads the checkpoint's metadata through `storage_reader.read_metadata()`,
    allocates a destination for every item saved under `optimizer_key`, loads
    them with `dcp.load`, and returns `{optimizer_key: <nested optimizer state
    dict>}`. An item whose global shape equals that of the DTensor
    `model_state_dict[fqn]` for the parameter it belongs to is allocated as a
    DTensor with the same mesh and placements (each rank reads only its
    shard); other tensors are allocated whole, on the device of the matching
    model tensor or on CPU. Nested paths come from the metadata's
    `planner_data` where it maps keys to paths, else from the key text with
    the FQNs of `model_state_dict`. A sequence the checkpoint stored item by
    item (dcp does so with tuples such as Adam's betas) comes back as a list.
    """
    from dcp import load

    metadata = storage_reader.read_metadata()
    planner_data = getattr(metadata, "planner_data", None)
    model_fqns = set(model_state_dict)
    flat: dict[str, Any] = {}
    paths: dict[str, tuple] = {}
    for key, item in metadata.state_dict_metadata.items():
        path = _path_of(key, optimizer_key, planner_data, model_fqns)
        if path is None:
            continue
        paths[key] = path
        if not hasattr(item, "size") or not hasattr(item, "properties"):
            flat[key] = _BYTES_PLACEHOLDER
            continue
        size = tuple(item.size)
        dtype = item.properties.dtype
        model_value = None
        if len(path) >= 3 and path[1] == _STATE:
            model_value = model_state_dict.get(path[2])
        if _is_dtensor(model_value) and tuple(model_value.shape) == size:
            from torch.distributed.tensor import empty as dtensor_empty

            flat[key] = dtensor_empty(
                size,
                dtype=dtype,
                device_mesh=model_value.device_mesh,
                placements=model_value.placements,
            )
        else:
            device = "cpu"
            if isinstance(model_value, torch.Tensor) and not _is_dtensor(model_value):
                device = model_value.device
            flat[key] = torch.empty(size, dtype=dtype, device=device)
    load(flat, storage_reader=storage_reader, planner=planner)
    result: dict[str, Any] = {}
    for key, path in sorted(paths.items(), key=lambda kv: _path_order(kv[1])):
        _set_path(result, path, flat[key])
    return result


def _path_order(path: tuple) -> tuple:
    # List indices must be placed in increasing order; strings sort apart.
    return tuple((0, p, "") if isinstance(p, int) else (1, 0, p) for p in path)
