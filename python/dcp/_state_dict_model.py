"""Models for dcp.state_dict: canonical parameter names, model get and set.

_ModelIndex maps state_dict and named_parameters names to canonical FQNs
(wrapper components dropped) and parameters to their FQNs; the model's state
dict is built and loaded through it. Private to dcp.state_dict, whose
docstring states the contracts.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn
from torch.nn.modules.module import _IncompatibleKeys

from ._state_dict_dist import (_broadcast_tree, _comm_device,
                               _gather_and_offload, _is_dtensor, _localize,
                               _rank)

if TYPE_CHECKING:
    from .state_dict import StateDictOptions


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


def _module_loads_plainly(m: nn.Module) -> bool:
    """Whether torch's load of module `m`'s own tensors (not its
    children's) is a plain copy: nn.Module's _load_from_state_dict and
    extra state, no load hooks."""
    cls = type(m)
    return (cls._load_from_state_dict is nn.Module._load_from_state_dict and
            cls.get_extra_state is nn.Module.get_extra_state and
            cls.set_extra_state is nn.Module.set_extra_state and
            not getattr(m, "_load_state_dict_pre_hooks", None) and
            not getattr(m, "_load_state_dict_post_hooks", None))


@torch.no_grad()
def _own_way_subtrees(model: nn.Module) -> dict[str, nn.Module] | None:
    """The outermost submodules of `model` whose load is not a plain copy
    (_module_loads_plainly), by their state-dict prefix ("layers.3."; a
    module shared under several names has each); {} when every module
    loads plainly. None where only torch's load of the whole model will
    do: the model itself loads its own way or overrides load_state_dict,
    or torch swaps tensors on load."""
    future = getattr(torch, "__future__", None)
    swap = getattr(future, "get_swap_module_params_on_conversion", None)
    if swap is not None and swap():
        return None
    if getattr(model.load_state_dict, "__func__",
               None) is not nn.Module.load_state_dict or \
            not _module_loads_plainly(model):
        return None
    found: dict[str, nn.Module] = {}

    def walk(module: nn.Module, prefix: str) -> None:
        for name, child in module._modules.items():
            if child is None:
                continue
            child_prefix = f"{prefix}{name}."
            if _module_loads_plainly(child):
                walk(child, child_prefix)
            else:
                found[child_prefix] = child
    walk(model, "")
    return found


def _subtree_of(key: str, prefixes: dict) -> str | None:
    """The prefix in `prefixes` that `key` lies under, or None."""
    dot = key.find(".")
    while dot >= 0:
        prefix = key[:dot + 1]
        if prefix in prefixes:
            return prefix
        dot = key.find(".", dot + 1)
    return None


def _load_subtree(module: nn.Module, state: dict[str, Any], prefix: str,
                  missing: list, unexpected: list, errors: list) -> None:
    """What nn.Module.load_state_dict does for `module` at `prefix` inside
    the model (its own _load_from_state_dict with the key prefix it has in
    the model, then its children's, then its post hooks, which see the
    whole load's lists): `state` holds this subtree's keys, whole."""
    module._load_from_state_dict(state, prefix, {}, True, missing,
                                 unexpected, errors)
    for name, child in module._modules.items():
        if child is not None:
            child_prefix = f"{prefix}{name}."
            _load_subtree(child, {k: v for k, v in state.items()
                                  if k.startswith(child_prefix)},
                          child_prefix, missing, unexpected, errors)
    incompatible = _IncompatibleKeys(missing, unexpected)
    for hook in module._load_state_dict_post_hooks.values():
        hook(module, incompatible)


def _copy_plainly(model: nn.Module, local: dict[str, Any],
                  to_load: dict[str, Any]) -> _IncompatibleKeys | None:
    """model.load_state_dict(to_load, strict=False), done as plain copies of
    each value into the model's tensor of its key (each a non-DTensor of
    the same shape; `local` is model.state_dict(keep_vars=True)), and, for
    the submodules that load their own way (_own_way_subtrees), torch's
    steps for each subtree with its own keys only. None where that is not
    the same (having changed nothing, or where a step failed or reported
    an error: torch's whole load then does it again, and says it). torch's
    whole load filters the state dict once per child module, which is
    quadratic for a module with many children (10,000 of them: 15 s)."""
    subtrees = _own_way_subtrees(model)
    if subtrees is None:
        return None
    pairs = []
    parts: dict[str, dict[str, Any]] = {prefix: {} for prefix in subtrees}
    for key, value in to_load.items():
        target = local.get(key)
        prefix = _subtree_of(key, subtrees) if subtrees else None
        if prefix is not None:
            if isinstance(value, torch.Tensor) and (
                    _is_dtensor(value) or _is_dtensor(target) or (
                        isinstance(target, torch.Tensor) and
                        value.shape != target.shape)):
                return None  # torch's load says what is wrong, or does more
            parts[prefix][key] = value
            continue
        if (not isinstance(value, torch.Tensor) or
                not isinstance(target, torch.Tensor) or
                _is_dtensor(value) or _is_dtensor(target) or
                value.shape != target.shape):
            return None  # torch's load says what is wrong, or does more
        pairs.append((target, value))
    missing: list = []
    unexpected: list = []
    errors: list = []
    try:
        with torch.no_grad():
            for target, value in pairs:
                if value is not target:
                    target.copy_(value)
            # In the model's order, as torch's load meets them: a subtree's
            # post hooks see the keys missing before it, not after.
            pending = dict(subtrees)
            for key in local:
                prefix = _subtree_of(key, subtrees) if subtrees else None
                if prefix is None:
                    if key not in to_load:
                        missing.append(key)
                elif prefix in pending:
                    _load_subtree(pending.pop(prefix), parts[prefix], prefix,
                                  missing, unexpected, errors)
            for prefix, module in pending.items():  # (holding no tensors)
                _load_subtree(module, parts[prefix], prefix, missing,
                              unexpected, errors)
    except Exception:  # noqa: BLE001 - torch's load says it its way
        return None
    if errors:
        return None
    return _IncompatibleKeys(missing, unexpected)


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
    # Tensors on meta have no memory to load into: those (only) are
    # assigned, as new tensors of their dtype that the caller's state dict
    # does not share; the rest are copied into. A tied parameter gets one
    # nn.Parameter, set on every module that owns it (load_state_dict
    # would wrap a plain tensor in a new one per module, untying them).
    on_meta = {
        key
        for key, v in local.items()
        if isinstance(v, torch.Tensor)
        and (v.to_local() if _is_dtensor(v) else v).device.type == "meta"
    }
    to_load, to_assign, made = {}, {}, {}
    for fqn, value in state_dict.items():
        key = key_of.get(fqn, fqn)
        value = _localize(value, local.get(key))
        if key not in on_meta or not isinstance(value, torch.Tensor):
            to_load[key] = value
            continue
        template = local[key]
        if id(template) not in made:
            tensor = value.detach().to(dtype=template.dtype, copy=True)
            if isinstance(template, nn.Parameter):
                tensor = nn.Parameter(tensor,
                                      requires_grad=template.requires_grad)
            made[id(template)] = tensor
        to_assign[key] = made[id(template)]
    # strict=False so that the error, if any, names canonical FQNs.
    result = _copy_plainly(model, local, to_load)
    if result is None:
        result = model.load_state_dict(to_load, strict=False)
    missing_keys = set(result.missing_keys)
    if to_assign:
        assigned = model.load_state_dict(to_assign, strict=False, assign=True)
        missing_keys &= set(assigned.missing_keys)
    fqn_of = {key: fqn for fqn, key in key_of.items()}
    missing = [fqn_of.get(k, k) for k in result.missing_keys if k in missing_keys]
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
