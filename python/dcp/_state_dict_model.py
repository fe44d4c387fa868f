"""Models for dcp.state_dict: canonical parameter names, model get and set.

_ModelIndex maps state_dict and named_parameters names to canonical FQNs
(wrapper components dropped) and parameters to their FQNs; the model's state
dict is built and loaded through it. Private to dcp.state_dict, whose
docstring states the contracts.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
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
    # As torch's: an OrderedDict keeping the modules' versions (_metadata),
    # which a module's _load_from_state_dict may need to read what it saved
    # (nnq.Linear does); also where torch's gathered or offloaded copies
    # lose them. Not for submodules without their prefixes (the versions
    # are keyed by the model's module names).
    state: dict[str, Any] = OrderedDict()
    metadata = getattr(raw, "_metadata", None)
    if submodules is not None and not options.keep_submodule_prefixes:
        metadata = None
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
        selected: dict[str, Any] = OrderedDict()
        for fqn, value in state.items():
            for prefix in prefixes:
                if fqn.startswith(prefix):
                    key = fqn if options.keep_submodule_prefixes else fqn[len(prefix):]
                    selected[key] = value
                    break
        state = selected
    state = _gather_and_offload(state, options)
    if metadata is not None and state:  # (empty: not rank 0 of a gather)
        if not isinstance(state, OrderedDict):
            state = OrderedDict(state)
        state._metadata = metadata  # type: ignore[attr-defined]
    return state


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


def _torch_loads_it(model: nn.Module) -> bool:
    """Whether only model.load_state_dict itself will do: the model
    overrides it, or torch swaps tensors on load."""
    future = getattr(torch, "__future__", None)
    swap = getattr(future, "get_swap_module_params_on_conversion", None)
    return (swap is not None and swap()) or getattr(
        model.load_state_dict, "__func__", None) is not \
        nn.Module.load_state_dict


def _load_as_torch_does(model: nn.Module,
                        state_dict: dict[str, Any]) -> _IncompatibleKeys:
    """model.load_state_dict(state_dict, strict=False), step for step as
    nn.Module's (each module's _load_from_state_dict with its prefix, then
    its children's in order, then its post hooks, all sharing one list of
    missing and unexpected keys; a RuntimeError for what the modules
    report), but with each module's keys split among its children in one
    pass where torch filters the whole dict once per child (quadratic for
    a module with many children)."""
    missing: list[str] = []
    unexpected: list[str] = []
    errors: list[str] = []

    metadata = getattr(state_dict, "_metadata", None)

    def load(module: nn.Module, local: dict[str, Any], prefix: str) -> None:
        local_metadata = {} if metadata is None else \
            metadata.get(prefix[:-1], {})
        module._load_from_state_dict(local, prefix, local_metadata, True,
                                     missing, unexpected, errors)
        if module._modules:
            # Each child's keys, as torch's startswith(child_prefix)
            # filter (after this module's load, which may change `local`)
            # picks them, in the same order.
            by_child: dict[str, dict[str, Any]] = {}
            cut = len(prefix)
            for key, value in local.items():
                if key.startswith(prefix):
                    dot = key.find(".", cut)
                    if dot >= 0:
                        by_child.setdefault(key[cut:dot], {})[key] = value
            for name, child in module._modules.items():
                if child is not None:
                    load(child, by_child.get(name, {}), f"{prefix}{name}.")
        incompatible = _IncompatibleKeys(missing, unexpected)
        for hook in module._load_state_dict_post_hooks.values():
            if hook(module, incompatible) is not None:
                raise AssertionError(
                    "Hooks registered with "
                    "``register_load_state_dict_post_hook`` are not expected "
                    "to return new values, if incompatible_keys need to be "
                    "modified, it should be done inplace.")

    load(model, dict(state_dict), "")
    if errors:
        raise RuntimeError(
            "Error(s) in loading state_dict for {}:\n\t{}".format(
                model.__class__.__name__, "\n\t".join(errors)))
    return _IncompatibleKeys(missing, unexpected)


def _copy_plainly(model: nn.Module, local: dict[str, Any],
                  to_load: dict[str, Any]) -> _IncompatibleKeys:
    """model.load_state_dict(to_load, strict=False). Where every module
    loads plainly (_module_loads_plainly) and every value is a non-DTensor
    tensor of its key's shape in the model (`local` is model.state_dict(
    keep_vars=True)), a plain copy of each value into the model's tensor
    (a copy that fails: the rest as torch loads it); otherwise
    _load_as_torch_does, or torch's own load where the model overrides it.
    torch's own load filters the state dict once per child module, which
    is quadratic for a module with many children (10,000 of them: 15 s)."""
    if _torch_loads_it(model):
        return model.load_state_dict(to_load, strict=False)
    from torch.nn.parameter import is_lazy
    pairs = []
    for key, value in to_load.items():
        target = local.get(key)
        if (not isinstance(value, torch.Tensor) or
                not isinstance(target, torch.Tensor) or
                is_lazy(value) or is_lazy(target) or
                _is_dtensor(value) or _is_dtensor(target) or
                value.shape != target.shape):
            return _load_as_torch_does(model, to_load)
        pairs.append((target, value))
    if not all(_module_loads_plainly(m) for m in model.modules()):
        return _load_as_torch_does(model, to_load)
    try:
        with torch.no_grad():
            for target, value in pairs:
                if value is not target:
                    target.copy_(value)
    except Exception:  # noqa: BLE001 - torch's steps say it their way
        return _load_as_torch_does(model, to_load)
    return _IncompatibleKeys([k for k in local if k not in to_load], [])


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
    to_load, to_assign, made = OrderedDict(), {}, {}
    # The modules' versions travel with the state dict, as in torch's load.
    metadata = getattr(state_dict, "_metadata", None)
    if metadata is not None:
        to_load._metadata = metadata  # type: ignore[attr-defined]
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
