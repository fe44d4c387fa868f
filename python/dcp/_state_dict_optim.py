"""Optimizers for dcp.state_dict: optimizer state keyed by parameter FQNs.

Getting (nested or flat), setting (each optimizer takes its own parameters'
entries, checked before any optimizer changes), and creating the state of an
optimizer that has never stepped. Private to dcp.state_dict, whose docstring
states the contracts.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from ._state_dict_dist import (_broadcast_tree, _comm_device,
                               _gather_and_offload, _is_dtensor, _localize,
                               _rank)
from ._state_dict_model import _ModelIndex

if TYPE_CHECKING:
    from .state_dict import StateDictOptions

_STATE = "state"
_PARAM_GROUPS = "param_groups"
_PARAMS = "params"


def _as_optimizers(optimizers: Any, optim_only: bool = True
                   ) -> tuple[torch.optim.Optimizer, ...]:
    """`optimizers` (one, or an iterable of them) as a tuple. None passed
    (an empty iterable) is a model-only call, as in torch, unless
    `optim_only` (the optimizer functions): RuntimeError, torch's type."""
    if isinstance(optimizers, torch.optim.Optimizer):
        result: tuple = (optimizers,)
    else:
        result = tuple(optimizers)
    if not result and optim_only:
        raise RuntimeError("no optimizer was passed (an optimizer function "
                           "needs one; get_state_dict and set_state_dict "
                           "take none)")
    for optim in result:
        if not isinstance(optim, torch.optim.Optimizer):
            raise TypeError(f"not a torch.optim.Optimizer: {type(optim).__name__}")
    return result


# --------------------------------------------------------------------------
# Lazily created optimizer state.


@torch.no_grad()
def _init_optimizer_state(optim: torch.optim.Optimizer) -> bool:
    """Creates the state of an optimizer that has none: one step, lr 0, zero
    grads. Whether it did. Not when a parameter has a gradient (as torch's
    helpers): the training loop is between a backward and its first step,
    and a step taken here would make its step the optimizer's second."""
    if optim.state:
        return False
    every = [p for group in optim.param_groups for p in group[_PARAMS]]
    params = [p for p in every if p.requires_grad]
    if not params or any(p.grad is not None for p in every):
        return False
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
    return True


# --------------------------------------------------------------------------
# Optimizer.


def _optimizer_state_dict(
    index: _ModelIndex,
    optimizers: tuple[torch.optim.Optimizer, ...],
    options: StateDictOptions,
) -> dict[str, Any]:
    # (fqn, entry, whether this call made the entry up, optimizer, param),
    # in optimizer order.
    entries: list[tuple[str, dict, bool, torch.optim.Optimizer, Any]] = []
    groups: list[dict[str, Any]] = []
    for optim in optimizers:
        made_up = _init_optimizer_state(optim)
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
                    # A copy of the entry's dict; its tensors stay shared.
                    entries.append((fqn, dict(native[_STATE][pid]), made_up,
                                    optim, param))
            entry = {k: v for k, v in saved.items() if k != _PARAMS}
            entry[_PARAMS] = fqns
            groups.append(entry)
    # A parameter several optimizers hold has one state entry, keyed by its
    # FQN: the real one (two real ones are ambiguous), else the first made
    # up. An optimizer that had no state for it keeps none: the state made
    # up for it here is dropped again.
    real: set[str] = set()
    for fqn, _, made_up, _, _ in entries:
        if not made_up:
            if fqn in real:
                raise ValueError(
                    f"parameter {fqn!r} is held by more than one optimizer"
                )
            real.add(fqn)
    state: dict[str, Any] = {}
    for fqn, entry, made_up, optim, param in entries:
        if made_up and (fqn in real or fqn in state):
            del optim.state[param]
            continue
        state[fqn] = entry
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
        # fqn -> every loaded group listing it, in order (nested source
        # only): several where optimizers share the parameter.
        self.groups_with: dict[str, list[dict[str, Any]]] = {}
        # id(group hyperparameters) -> the FQNs that group lists.
        self.group_fqns: dict[int, frozenset[str]] = {}
        # Hyperparameters of loaded groups without parameters, in order.
        self.empty_groups: list[dict[str, Any]] = []
        # id(group hyperparameters) -> its place in the state dict (nested:
        # the saved group's; flat: its first key's).
        self.group_order: dict[int, int] = {}
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
            self.group_fqns[id(hyper)] = frozenset(params)
            self.group_order[id(hyper)] = len(self.group_order)
            for fqn in params:
                self.group_of[fqn] = hyper
                self.groups_with.setdefault(fqn, []).append(hyper)

    def _read_flat(self, source: Mapping[str, Any], index: _ModelIndex) -> None:
        known = index.fqn_to_param
        for key, value in source.items():
            section, _, rest = key.partition(".")
            if section not in (_STATE, _PARAM_GROUPS):
                continue
            # The FQN is the longest dotted prefix of `rest` naming a parameter;
            # parameters are leaves, so at most one prefix can. Most keys
            # are "<fqn>.<name>": tried first.
            fqn, _, last = rest.rpartition(".")
            if fqn in known:
                tail = [last]
            else:
                parts = rest.split(".")
                for cut in range(len(parts) - 2, 0, -1):
                    fqn = ".".join(parts[:cut])
                    if fqn in known:
                        break
                else:
                    continue
                tail = parts[cut:]
            if section == _PARAM_GROUPS:
                group = self.group_of.setdefault(fqn, {})
                self.group_order.setdefault(id(group), len(self.group_order))
                group[".".join(tail)] = value
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


def _is_native(source: Mapping[str, Any]) -> bool:
    """Whether `source` is an optimizer's own state_dict(): state keyed by
    parameter ids (ints), param groups listing ids."""
    state, groups = source.get(_STATE), source.get(_PARAM_GROUPS)
    if not isinstance(state, Mapping) or not isinstance(groups, list):
        return False
    ids = [p for group in groups for p in group.get(_PARAMS, [])]
    return bool(ids) and all(
        isinstance(k, int) and not isinstance(k, bool) for k in [*state, *ids]
    )


def _native_by_fqn(
    index: _ModelIndex, optim: torch.optim.Optimizer, source: Mapping[str, Any]
) -> dict[str, Any]:
    """`source`, an optimizer's own state_dict(), keyed by FQNs: its ids
    number the parameters of its groups in order, matched group by group
    with `optim`'s, as Optimizer.load_state_dict matches them."""
    saved = source[_PARAM_GROUPS]
    if len(saved) != len(optim.param_groups):
        raise ValueError(
            f"the optimizer state_dict has {len(saved)} param groups, the "
            f"optimizer {len(optim.param_groups)}"
        )
    fqn_of: dict[int, str] = {}
    groups = []
    for g, (group, current) in enumerate(zip(saved, optim.param_groups)):
        ids = list(group.get(_PARAMS, []))
        if len(ids) != len(current[_PARAMS]):
            raise ValueError(
                f"param group {g} of the optimizer state_dict has {len(ids)} "
                f"parameters, the optimizer's {len(current[_PARAMS])}"
            )
        for i, param in zip(ids, current[_PARAMS]):
            fqn_of[i] = index.fqns(param)[0]
        hyper = {k: v for k, v in group.items() if k != _PARAMS}
        groups.append({**hyper, _PARAMS: [fqn_of[i] for i in ids]})
    state = {fqn_of[i]: entry for i, entry in source[_STATE].items() if i in fqn_of}
    return {_STATE: state, _PARAM_GROUPS: groups}


@torch.no_grad()
def _load_optimizers(
    index: _ModelIndex,
    optimizers: tuple[torch.optim.Optimizer, ...],
    source: Mapping[str, Any],
    options: StateDictOptions,
) -> None:
    if _is_native(source):
        # An optimizer's own state_dict() (an older checkpoint), as torch's
        # helpers take it; keyed by FQNs, it then loads as any other
        # (broadcast, re-sharded, checked, copied).
        if len(optimizers) != 1:
            raise ValueError(
                "an optimizer's own state_dict() (state keyed by parameter "
                f"ids) cannot be split between {len(optimizers)} optimizers; "
                "pass the one optimizer it came from"
            )
        source = _native_by_fqn(index, optimizers[0], source)
    # State made here only gives the load tensors to fill: a parameter the
    # state dict has no state for had none when saved (it never got a
    # gradient), and keeps none.
    made_up = {id(optim) for optim in optimizers if _init_optimizer_state(optim)}
    try:
        plans = _plan_optimizer_loads(index, optimizers, source, options, made_up)
    except BaseException:
        for optim in optimizers:
            if id(optim) in made_up:
                optim.state.clear()  # as it was: never stepped
        raise
    for optim, entries, native_groups in plans:
        native_state = {}
        for pid, (entry, param) in entries.items():
            current = optim.state.get(param, {})
            native_state[pid] = (
                current if entry is None else _localize_entry(entry, current, param)
            )
        groups = [{**g, _PARAMS: _id_list(g[_PARAMS])} for g in native_groups]
        optim.load_state_dict({_STATE: native_state, _PARAM_GROUPS: groups})


# Groups of at most this many parameters keep plain lists: a C-level scan
# of a short list beats a Python-level __contains__ call, and torch asks
# every group for every state value (3.5x slower with 5,000 groups of 2).
_ID_LIST_MIN = 64


def _id_list(ids):
    """`ids` as Optimizer.load_state_dict best searches them."""
    return _IdList(ids) if len(ids) > _ID_LIST_MIN else list(ids)


class _IdList(list):
    """A param group's parameter ids, for Optimizer.load_state_dict: it
    asks which group holds an id once per state value, by `in` on these
    lists (quadratic in the parameters with plain lists: 40,000 parameters
    took a minute); here `in` is a set lookup."""

    def __contains__(self, item) -> bool:
        members = self.__dict__.get("_members")
        if members is None or len(members) != len(self):
            members = self._members = set(self)
        return item in members


def _state_owners(optimizers: tuple[torch.optim.Optimizer, ...]):
    """takes(optim, param, entry): whether `optim` loads the state entry of
    `param`. The state dict keys an entry by FQN only, so for a parameter
    several optimizers hold it goes to those whose state for it (current,
    or made up for this load) has the entry's keys: the kind of optimizer
    that saved it (Adam's exp_avg, not SGD's momentum_buffer); the others
    keep none. Where none or several match, which one saved it is unknown
    and every holder loads it (as torch's set_optimizer_state_dict does)."""
    holders: dict[int, list[torch.optim.Optimizer]] = {}
    for optim in optimizers:
        for group in optim.param_groups:
            for param in group[_PARAMS]:
                holders.setdefault(id(param), []).append(optim)

    def takes(optim: torch.optim.Optimizer, param: torch.Tensor,
              entry: Any) -> bool:
        owners = holders.get(id(param), [])
        if len(owners) < 2 or not isinstance(entry, Mapping):
            return True
        matching = [o for o in owners
                    if set(o.state.get(param) or {}) == set(entry)]
        return not matching or any(o is optim for o in matching)

    return takes


def _common_group(loaded: _LoadedOptimizerState, index: _ModelIndex,
                  params: list) -> dict[str, Any] | None:
    """The loaded group that lists every one of `params` the loaded state
    dict names (the one that lists exactly those first), if one does: where
    optimizers share a parameter, its FQN is in several loaded groups, and
    this group's settings are those of the group it was saved from."""
    common: list[dict[str, Any]] | None = None
    fqns = set()
    for param in params:
        fqn = loaded.find(index.fqns(param))
        if fqn is None or fqn not in loaded.groups_with:
            continue
        fqns.add(fqn)
        groups = loaded.groups_with[fqn]
        common = (list(groups) if common is None else
                  [g for g in common if any(g is h for h in groups)])
    if not common:
        return None
    exact = [g for g in common if loaded.group_fqns[id(g)] == fqns]
    return (exact or common)[0]


def _plan_optimizer_loads(index, optimizers, source, options, made_up) -> list:
    """Per optimizer (optimizer, pid -> (loaded entry or None, param), param
    groups): what _load_optimizers loads, every strict check made."""
    if options.broadcast_from_rank0:
        source = _broadcast_optimizer_source(index, optimizers, source)
    loaded = _LoadedOptimizerState(source, index)
    empty_groups = iter(loaded.empty_groups)
    takes = _state_owners(optimizers)
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
            # Non-strict: the loaded groups whose settings differ from
            # hyper's, and the first difference.
            conflicting: list[dict[str, Any]] = []
            conflict = None
            ids = []
            if not group[_PARAMS]:
                hyper = next(empty_groups, None)
            else:
                hyper = _common_group(loaded, index, group[_PARAMS])
            for param in group[_PARAMS]:
                fqns = index.fqns(param)
                fqn = loaded.find(fqns)
                if (fqn is not None and fqn in loaded.state
                        and takes(optim, param, loaded.state[fqn])):
                    entries[pid] = (loaded.state[fqn], param)
                elif options.strict and param.requires_grad and \
                        loaded.state and (fqn is None or
                                          fqn not in loaded.state):
                    # As the seed: whether or not the optimizer has state
                    # of its own (a fresh one on resume has none); a state
                    # dict without any state (a stateless optimizer's)
                    # lacks nothing.
                    raise RuntimeError(
                        f"optimizer state for parameter {fqns[0]!r} is missing "
                        "from the state dict: it requires gradients but has no "
                        "saved optimizer state (StateDictOptions(strict=False) "
                        "loads anyway, keeping the optimizer's current state "
                        "for it)"
                    )
                elif optim.state.get(param) and id(optim) not in made_up:
                    entries[pid] = (None, param)
                if fqn is not None and fqn in loaded.group_of:
                    candidate = loaded.group_of[fqn]
                    if hyper is not None and any(
                            g is hyper for g in loaded.groups_with.get(fqn, ())):
                        candidate = hyper
                    if hyper is None:
                        hyper, hyper_from = candidate, fqn
                    elif candidate is not hyper and not any(
                            candidate is g for g in conflicting):
                        for k in sorted(set(hyper) | set(candidate), key=str):
                            if _same_value(hyper.get(k), candidate.get(k)):
                                continue
                            message = (
                                f"parameters {hyper_from!r} and {fqn!r} share "
                                f"a param group but their saved {k!r} differ: "
                                f"{hyper.get(k)!r} vs {candidate.get(k)!r}"
                            )
                            if options.strict:
                                raise RuntimeError(message)
                            conflicting.append(candidate)
                            conflict = conflict or message
                            break
                elif options.strict:
                    raise RuntimeError(
                        f"param group settings for parameter {fqns[0]!r} are "
                        "missing from the state dict"
                    )
                ids.append(pid)
                pid += 1
            if conflicting:
                # As torch's load: each setting from the last of the
                # loaded groups (in the state dict's order) that sets it.
                merged: dict[str, Any] = {}
                for g in sorted([hyper, *conflicting],
                                key=lambda g: loaded.group_order.get(id(g), 0)):
                    merged.update(g)
                hyper = merged
                warnings.warn(
                    f"{conflict}; with StateDictOptions(strict=False) the "
                    "group takes each setting from the last saved group "
                    "that sets it, as torch does", stacklevel=5)
            # Keys the state dict lacks keep the optimizer's current values.
            entry = {k: v for k, v in group.items() if k != _PARAMS}
            entry.update(hyper or {})
            entry[_PARAMS] = ids
            native_groups.append(entry)
        plans.append((optim, entries, native_groups))
    return plans


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
