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
  A parameter several optimizers hold has one entry: the state of the one
  that has any (state made up for the others is dropped again; two with
  state raise ValueError); on set it goes to the holders whose state for it
  has the entry's keys (all of them where none or several do).
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
read 1, as torch's implementation of the seed leaves them). Not while a
parameter has a gradient (as torch: the loop is between a backward and its
first step, which must stay the optimizer's first); `get_*` then returns no
state for that optimizer. Optimizers whose `step()` needs a closure (LBFGS)
are not supported. `set_*` also takes an optimizer's own `state_dict()`
(state keyed by parameter ids, numbered in the optimizer's group order) for
a single optimizer, as torch's helpers do; it is keyed by FQNs first and
then loads as any other (broadcast, re-sharded, checked, copied).

Threading: none of these functions is thread-safe with respect to the model
or optimizer they touch. With a process group, every rank must make the same
calls in the same order (gathering, broadcasting and re-sharding are
collectives).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.nn as nn
from torch.nn.modules.module import _IncompatibleKeys

# The parts: _state_dict_dist (DTensors, gathering, broadcasting),
# _state_dict_model (canonical FQNs, model get and set), _state_dict_optim
# (optimizer get and set); this module holds the public API.
from ._state_dict_dist import _dist_initialized, _is_dtensor
from ._state_dict_model import _load_model, _ModelIndex, _model_state_dict
from ._state_dict_optim import (_STATE, _as_optimizers, _load_optimizers,
                                _optimizer_state_dict)

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
    """Returns (get_model_state_dict(...), get_optimizer_state_dict(...));
    the second is {} where `optimizers` is empty (a model-only call, as in
    torch)."""
    options = _check_options(options)
    optims = _as_optimizers(optimizers, optim_only=False)
    index = _ModelIndex(model, options.dsd_fqn_modifiers)
    with torch.no_grad():
        model_state = _model_state_dict(model, index, submodules, options)
        optim_state = _optimizer_state_dict(index, optims, options) \
            if optims else {}
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
    with different settings; without strict, such a group takes each
    setting from the last saved group that sets it (torch's choice), with
    a UserWarning.
    """
    options = _check_options(options, loading=True)
    optims = _as_optimizers(optimizers)
    _refuse_empty_optim_state_dict(optim_state_dict, options)
    index = _ModelIndex(model, options.dsd_fqn_modifiers)
    _load_optimizers(index, optims, optim_state_dict, options)


def _refuse_empty_optim_state_dict(optim_state_dict, options) -> None:
    """As the seed: an empty optimizer state dict (a resume that lost the
    optimizer's state, a wrong key) is a RuntimeError whatever `strict`
    says, but where the options let a rank pass none (broadcast_from_rank0;
    cpu_offload with full_state_dict)."""
    if not optim_state_dict and not options.broadcast_from_rank0 and not (
            options.cpu_offload and options.full_state_dict):
        raise RuntimeError(
            "the optimizer state dict to load is empty "
            f"({optim_state_dict!r}): it has neither state nor param_groups")


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
    optims = _as_optimizers(optimizers, optim_only=False)
    if optims:
        _refuse_empty_optim_state_dict(optim_state_dict, options)
    index = _ModelIndex(model, options.dsd_fqn_modifiers)
    if optims:
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
        if len(parts) > 2 or (len(parts) == 2 and not parts[0].isdigit()):
            # A parameter the model state dict lacks: state.<fqn>.<name>,
            # the FQN whole (a key, never list indices), as the saver's
            # planner_data would give it. Only `state.<id>.<name>` is an
            # optimizer's own state dict, keyed by parameter id.
            return (optimizer_key, _STATE, ".".join(parts[:-1]), parts[-1])
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
