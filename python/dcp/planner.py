"""DefaultSavePlanner / DefaultLoadPlanner: the seed's planners as option
holders, mapped onto dcp_save_planner_options_t / dcp_load_planner_options_t.
The planning itself runs in the engine: they count as instances of the
seed's SavePlanner / LoadPlanner (dcp.interfaces). torch's own
DefaultSavePlanner / DefaultLoadPlanner are taken for their options; other
planners, or subclasses overriding a protocol method (create_local_plan
etc.), raise TypeError at save/load.
"""

from __future__ import annotations

import sys

import numpy as np

from . import _lib
from .interfaces import (BytesIOWriteData, LoadItemType, LoadPlan,
                         LoadPlanner, ReadItem, SavePlan, SavePlanner,
                         TensorWriteData, WriteItem, WriteItemType,
                         check_planner)

# The planner protocol's names too, as torch.distributed.checkpoint.planner
# holds them.
__all__ = ["DefaultSavePlanner", "DefaultLoadPlanner", "WriteItemType",
           "LoadItemType", "BytesIOWriteData", "TensorWriteData", "WriteItem",
           "ReadItem", "SavePlan", "LoadPlan", "SavePlanner", "LoadPlanner"]


class DefaultSavePlanner:
    """flatten_state_dict: store nested dicts/lists under dotted names (False:
    every top-level value must be a leaf, else CheckpointValueError).
    flatten_sharded_tensors: accepted (shards are always chunks of one
    global tensor). dedup_replicated_tensors: deprecated in the seed;
    ignored (replicated tensors are always saved once). dedup_save_to_lowest_rank: a tensor
    several ranks hold is written by the lowest rank instead of balancing.
    enable_plan_caching: reuse the global plan when the local plans did not
    change since the last save with this planner's options."""

    def __init__(self, flatten_state_dict: bool = True,
                 flatten_sharded_tensors: bool = True,
                 dedup_replicated_tensors: bool | None = None,
                 dedup_save_to_lowest_rank: bool = False,
                 enable_plan_caching: bool = False):
        self.flatten_state_dict = bool(flatten_state_dict)
        self.flatten_sharded_tensors = bool(flatten_sharded_tensors)
        self.dedup_replicated_tensors = dedup_replicated_tensors
        self.dedup_save_to_lowest_rank = bool(dedup_save_to_lowest_rank)
        self.enable_plan_caching = bool(enable_plan_caching)

    def set_up_planner(self, state_dict, storage_meta=None,
                       is_coordinator: bool = False) -> None:
        """The seed's hook, called before planning when a subclass
        overrides it: the save then walks self.state_dict. As torch's, this
        default flattens the dict (flatten_state_dict=True; flatten()):
        self.state_dict maps dotted names to leaves, self.mappings each
        name to its path, so an override filters or rewrites it by name;
        the save walks it nested again (keys it renamed stay flat names)."""
        self.storage_meta = storage_meta
        self.is_coordinator = is_coordinator
        if self.flatten_state_dict:
            self.state_dict, self.mappings = flatten(state_dict)
        else:
            self.state_dict, self.mappings = state_dict, {}

    def _options(self) -> _lib.SavePlannerOptions:
        return _lib.sized(
            _lib.SavePlannerOptions,
            flatten_state_dict=_lib.flag(self.flatten_state_dict),
            flatten_sharded_tensors=_lib.flag(self.flatten_sharded_tensors),
            dedup_save_to_lowest_rank=_lib.flag(
                self.dedup_save_to_lowest_rank),
            enable_plan_caching=_lib.flag(self.enable_plan_caching))

    def _spec(self):
        return dict(flatten_state_dict=self.flatten_state_dict,
                    flatten_sharded_tensors=self.flatten_sharded_tensors,
                    dedup_replicated_tensors=self.dedup_replicated_tensors,
                    dedup_save_to_lowest_rank=self.dedup_save_to_lowest_rank,
                    enable_plan_caching=self.enable_plan_caching)

    def __repr__(self):
        return f"DefaultSavePlanner({self._spec()})"


class DefaultLoadPlanner:
    """allow_partial_load: keys of the state dict that the checkpoint lacks
    keep their values instead of failing (CheckpointNotFoundError)."""

    def __init__(self, flatten_state_dict: bool = True,
                 flatten_sharded_tensors: bool = True,
                 allow_partial_load: bool = False):
        self.flatten_state_dict = bool(flatten_state_dict)
        self.flatten_sharded_tensors = bool(flatten_sharded_tensors)
        self.allow_partial_load = bool(allow_partial_load)

    def set_up_planner(self, state_dict, metadata=None,
                       is_coordinator: bool = False) -> None:
        """The seed's hook, called before planning when a subclass
        overrides it, with the checkpoint's Metadata: the load then loads
        into self.state_dict. As torch's, this default flattens the dict
        (flatten_state_dict=True; flatten(); as DefaultSavePlanner's); the
        load walks it nested again and puts each plain value it reads into
        self.original_state_dict at its path."""
        self.original_state_dict = state_dict
        self.metadata = metadata
        self.is_coordinator = is_coordinator
        if self.flatten_state_dict:
            self.state_dict, self.mappings = flatten(state_dict)
        else:
            self.state_dict, self.mappings = state_dict, {}

    def _options(self) -> _lib.LoadPlannerOptions:
        return _lib.sized(
            _lib.LoadPlannerOptions,
            flatten_state_dict=_lib.flag(self.flatten_state_dict),
            flatten_sharded_tensors=_lib.flag(self.flatten_sharded_tensors),
            allow_partial_load=_lib.flag(self.allow_partial_load))

    def __repr__(self):
        return (f"DefaultLoadPlanner(allow_partial_load="
                f"{self.allow_partial_load})")


def _is_tensor(value) -> bool:
    from . import _state
    torch = _state.torch
    return (torch is not None and isinstance(value, torch.Tensor)) or \
        isinstance(value, (np.ndarray, _state.ShardedTensor))


class ListIndex(int):
    """A list index in a path of flatten()'s mappings: an int, told apart
    from an int dict key (which flatten keeps as it is)."""

    __slots__ = ()


def flatten(state_dict) -> tuple[dict, dict]:
    """(flat, mappings), as torch's flatten_state_dict makes them: `flat`
    maps each leaf's dotted name to it, `mappings` the name to its path (a
    tuple of the dict keys, as they are, and list indices, ListIndex
    ints). Dicts are
    walked (an empty one has no leaf); a list is a leaf unless it holds a
    tensor or a dict at some depth (then its items are walked); a tuple is
    a leaf. ValueError for two leaves of one name."""
    flat: dict = {}
    mappings: dict = {}

    def terminal(value) -> bool:
        if isinstance(value, dict):
            return False
        if not isinstance(value, list):
            return True
        return not any((isinstance(v, (dict, list)) and not terminal(v))
                       or _is_tensor(v) for v in value)

    def visit(path, value) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                visit(path + (k,), v)
        elif terminal(value):
            name = ".".join(map(str, path))
            if name in flat:
                raise ValueError(f"duplicated flatten key {name}")
            flat[name] = value
            mappings[name] = path
        else:
            for i, v in enumerate(value):
                visit(path + (ListIndex(i),), v)

    for key, value in state_dict.items():
        visit((key,), value)
    return flat, mappings


def _torch_default(kind: str):
    """torch's DefaultSavePlanner ("save") or DefaultLoadPlanner ("load"),
    or None when torch's checkpoint package was never imported (then no
    planner can be one of its)."""
    module = sys.modules.get("torch.distributed.checkpoint.default_planner")
    if module is None:
        return None
    return getattr(module, "DefaultSavePlanner" if kind == "save"
                   else "DefaultLoadPlanner", None)


def as_dcp_planner(planner, kind: str):
    """`planner` as dcp's DefaultSavePlanner ("save") or DefaultLoadPlanner
    ("load"), None for None. torch's own DefaultSavePlanner /
    DefaultLoadPlanner, or a subclass of them overriding none of the
    planner protocol's methods, becomes dcp's with the same options (what
    programs that pass torch's planner for its options, such as
    allow_partial_load, rely on). TypeError for anything else
    (dcp.interfaces.check_planner)."""
    default = DefaultSavePlanner if kind == "save" else DefaultLoadPlanner
    theirs = _torch_default(kind)
    if planner is None or isinstance(planner, default) or theirs is None or \
            not isinstance(planner, theirs):
        check_planner(planner, default, kind)
        return planner
    check_planner(planner, theirs, kind, torch_class=True)
    options = dict(
        flatten_state_dict=getattr(planner, "flatten_state_dict", True),
        flatten_sharded_tensors=getattr(planner, "flatten_sharded_tensors",
                                        True))
    if kind == "save":
        options.update(
            dedup_save_to_lowest_rank=getattr(
                planner, "dedup_save_to_lowest_rank", False),
            enable_plan_caching=getattr(planner, "_enable_plan_caching",
                                        False))
    else:
        options.update(allow_partial_load=getattr(
            planner, "allow_partial_load", False))
    return default(**options)


def save_options(planner):
    """The C options of `planner` (None: defaults; as_dcp_planner)."""
    planner = as_dcp_planner(planner, "save")
    return None if planner is None else planner._options()


def load_options(planner):
    planner = as_dcp_planner(planner, "load")
    return None if planner is None else planner._options()


SavePlanner.register(DefaultSavePlanner)
LoadPlanner.register(DefaultLoadPlanner)
