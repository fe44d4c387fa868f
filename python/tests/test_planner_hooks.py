"""A planner's set_up_planner override is honoured (dcp._planner_hooks):
torch's _EmptyStateDictLoadPlanner, renaming planners, dcp subclasses."""

import pytest
import torch
import torch.distributed.checkpoint as torch_dcp
from torch.distributed.checkpoint.default_planner import (
    _EmptyStateDictLoadPlanner)

import dcp


def _state():
    return {"model": {"w": torch.arange(6.0).reshape(2, 3),
                      "b": torch.ones(2, dtype=torch.bfloat16)},
            "step": 7, "cfg": {"lr": 0.5, "names": ["a", "b"]}}


def _blank():
    return {"model": {"w": torch.zeros(2, 3),
                      "b": torch.zeros(2, dtype=torch.bfloat16)},
            "step": 0, "cfg": {"lr": 0.0, "names": ["", ""]}}


class _RenameSave(torch_dcp.DefaultSavePlanner):
    """The seed docs' renaming planner: every key gets a prefix."""

    def set_up_planner(self, state_dict, storage_meta=None,
                       is_coordinator=False):
        super().set_up_planner({"foo_" + k: v for k, v in state_dict.items()},
                               storage_meta, is_coordinator)


class _RenameLoad(torch_dcp.DefaultLoadPlanner):
    def set_up_planner(self, state_dict, metadata=None, is_coordinator=False):
        super().set_up_planner({"foo_" + k: v for k, v in state_dict.items()},
                               metadata, is_coordinator)


def test_torchs_empty_state_dict_planner_loads_everything(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    dcp.save(_state(), checkpoint_id=ckpt)
    out = {}
    dcp.load(out, checkpoint_id=ckpt, planner=_EmptyStateDictLoadPlanner())
    assert sorted(out) == ["cfg", "model", "step"]
    assert torch.equal(out["model"]["w"], _state()["model"]["w"])
    assert out["model"]["b"].dtype == torch.bfloat16
    assert torch.equal(out["model"]["b"], _state()["model"]["b"])
    assert out["step"] == 7
    assert out["cfg"] == {"lr": 0.5, "names": ["a", "b"]}
    some = {}
    dcp.load(some, checkpoint_id=ckpt,
             planner=_EmptyStateDictLoadPlanner(keys={"model.w", "step"}))
    assert sorted(some) == ["model", "step"] and list(some["model"]) == ["w"]
    assert torch.equal(some["model"]["w"], _state()["model"]["w"])
    assert some["step"] == 7


def test_renaming_planners_rename_as_torchs_do(tmp_path):
    """Saved under the renamed keys, nesting kept; loaded back through the
    renaming load planner: tensors in place, plain values where torch's
    loader puts them (the planner's own dict, shared nested dicts)."""
    ckpt = str(tmp_path / "ckpt")
    dcp.save(_state(), checkpoint_id=ckpt, planner=_RenameSave())
    md = dcp.read_metadata(ckpt)
    assert sorted(md.state_dict_metadata) == [
        "foo_cfg.lr", "foo_cfg.names", "foo_model.b", "foo_model.w",
        "foo_step"]
    assert md.planner_data["foo_model.w"] == ("foo_model", "w")
    back = _blank()
    dcp.load(back, checkpoint_id=ckpt, planner=_RenameLoad())
    assert torch.equal(back["model"]["w"], _state()["model"]["w"])
    assert torch.equal(back["model"]["b"], _state()["model"]["b"])
    assert back["cfg"] == {"lr": 0.5, "names": ["a", "b"]}
    # Top-level plain values land in the planner's renamed dict, as in
    # torch (its load_bytes sets them in planner.original_state_dict).
    assert back["step"] == 0
    # The same planners through torch's own save and load agree.
    theirs = str(tmp_path / "theirs")
    torch_dcp.save(_state(), checkpoint_id=theirs, planner=_RenameSave())
    expected = _blank()
    torch_dcp.load(expected, checkpoint_id=theirs, planner=_RenameLoad())
    assert back["step"] == expected["step"]
    assert back["cfg"] == expected["cfg"]
    # A plain load (no planner) of the renamed checkpoint finds the names.
    plain = {"foo_model": {"w": torch.zeros(2, 3)}}
    dcp.load(plain, checkpoint_id=ckpt)
    assert torch.equal(plain["foo_model"]["w"], _state()["model"]["w"])


@pytest.mark.parametrize("kind", ["THREAD", "PROCESS"])
def test_async_save_calls_set_up_planner(tmp_path, kind):
    ckpt = str(tmp_path / "ckpt")
    dcp.async_save(_state(), checkpoint_id=ckpt, planner=_RenameSave(),
                   async_checkpointer_type=getattr(
                       dcp.AsyncCheckpointerType, kind)).result()
    back = {"foo_model": {"w": torch.zeros(2, 3)}, "foo_step": 0}
    dcp.load(back, checkpoint_id=ckpt)
    assert torch.equal(back["foo_model"]["w"], _state()["model"]["w"])
    assert back["foo_step"] == 7


class _DropCaches(dcp.DefaultSavePlanner):
    """A dcp subclass: drops the "cache" entries before planning."""

    calls = []

    def set_up_planner(self, state_dict, storage_meta=None,
                       is_coordinator=False):
        self.calls.append((storage_meta.checkpoint_id, is_coordinator))
        kept = {k: v for k, v in state_dict.items() if k != "cache"}
        super().set_up_planner(kept, storage_meta, is_coordinator)


class _DefaultsOnLoad(dcp.DefaultLoadPlanner):
    """A dcp subclass: a key the checkpoint lacks is dropped from the
    load, having seen the metadata."""

    def set_up_planner(self, state_dict, metadata=None, is_coordinator=False):
        self.seen = sorted(metadata.state_dict_metadata)
        kept = {k: v for k, v in state_dict.items()
                if any(n == k or n.startswith(k + ".") for n in self.seen)}
        super().set_up_planner(kept, metadata, is_coordinator)


def test_dcp_subclasses_override_set_up_planner(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    state = dict(_state(), cache=torch.ones(1000))
    _DropCaches.calls.clear()
    dcp.save(state, checkpoint_id=ckpt, planner=_DropCaches(
        dedup_save_to_lowest_rank=True))
    assert _DropCaches.calls == [(ckpt, True)]
    md = dcp.read_metadata(ckpt)
    assert "cache" not in md.state_dict_metadata
    # The flattened dict is saved nested again.
    assert md.planner_data["model.w"] == ("model", "w")
    back = dict(_blank(), cache=torch.zeros(1000))
    planner = _DefaultsOnLoad()
    dcp.load(back, checkpoint_id=ckpt, planner=planner)
    assert "model.w" in planner.seen
    assert torch.equal(back["model"]["w"], _state()["model"]["w"])
    assert torch.equal(back["cache"], torch.zeros(1000))  # not loaded
    # A top-level plain value lands in the dict the planner planned for,
    # as with torch's planners; nested ones in the dicts both share.
    assert planner.state_dict["step"] == 7 and back["step"] == 0
    assert back["cfg"] == {"lr": 0.5, "names": ["a", "b"]}


def test_a_failing_set_up_planner_fails_the_call_and_refusals_come_first(
        tmp_path):
    ckpt = str(tmp_path / "ckpt")

    class Failing(dcp.DefaultSavePlanner):
        def set_up_planner(self, state_dict, storage_meta=None,
                           is_coordinator=False):
            raise KeyError("no such layer")

    with pytest.raises(KeyError, match="no such layer"):
        dcp.save(_state(), checkpoint_id=ckpt, planner=Failing())
    assert not (tmp_path / "ckpt" / ".metadata").exists()

    called = []

    class AlsoPlans(torch_dcp.DefaultLoadPlanner):
        def set_up_planner(self, state_dict, metadata=None,
                           is_coordinator=False):
            called.append(1)

        def create_local_plan(self):
            return super().create_local_plan()

    dcp.save(_state(), checkpoint_id=ckpt)
    with pytest.raises(TypeError, match="create_local_plan"):
        dcp.load(_blank(), checkpoint_id=ckpt, planner=AlsoPlans())
    assert called == []

    class NotADict(dcp.DefaultLoadPlanner):
        def set_up_planner(self, state_dict, metadata=None,
                           is_coordinator=False):
            self.state_dict = [1, 2]

    with pytest.raises(TypeError, match="left a list in planner.state_dict"):
        dcp.load(_blank(), checkpoint_id=ckpt, planner=NotADict())


def test_torchs_flattening_keeps_lists_of_plain_values_whole(tmp_path):
    """A torch planner subclass whose hook calls super() walks torch's flat
    dict: nested again, a list of plain values comes back at its saved
    length (as with no planner), into the caller's dict."""
    ckpt = str(tmp_path / "ckpt")
    dcp.save({"sched": {"milestones": [10, 20, 30], "pair": (1, 2)},
              "w": torch.arange(3.0)}, checkpoint_id=ckpt)

    class Logging(torch_dcp.DefaultLoadPlanner):
        def set_up_planner(self, state_dict, metadata=None,
                           is_coordinator=False):
            super().set_up_planner(state_dict, metadata, is_coordinator)

    back = {"sched": {"milestones": [0], "pair": (0, 0)}, "w": torch.zeros(3)}
    planner = Logging()
    dcp.load(back, checkpoint_id=ckpt, planner=planner)
    assert back["sched"] == {"milestones": [10, 20, 30], "pair": (1, 2)}
    assert torch.equal(back["w"], torch.arange(3.0))
    assert planner.state_dict["sched.milestones"] == [10, 20, 30]

    class UnderModel(dcp.DefaultLoadPlanner):
        def set_up_planner(self, state_dict, metadata=None,
                           is_coordinator=False):
            super().set_up_planner({"sched": state_dict}, metadata,
                                   is_coordinator)

    bare = {"milestones": [0], "pair": (0, 0)}
    dcp.load(bare, checkpoint_id=ckpt, planner=UnderModel())
    assert bare == {"milestones": [10, 20, 30], "pair": (1, 2)}


def _filtering_planners(base_save, base_load):
    class NoBias(base_save):
        def set_up_planner(self, state_dict, storage_meta=None,
                           is_coordinator=False):
            super().set_up_planner(state_dict, storage_meta, is_coordinator)
            self.state_dict = {k: v for k, v in self.state_dict.items()
                               if not k.endswith(".b")}

    class FromNet(base_load):
        def set_up_planner(self, state_dict, metadata=None,
                           is_coordinator=False):
            super().set_up_planner(state_dict, metadata, is_coordinator)
            self.state_dict = {k.replace("net.", "model."): v
                               for k, v in self.state_dict.items()}

    return NoBias, FromNet


@pytest.mark.parametrize("whose", ["dcp", "torch"])
def test_a_subclass_filters_and_renames_flattened_names(tmp_path, whose):
    """As in torch, the default set_up_planner flattens the state dict:
    an override after super() drops or renames keys by dotted name."""
    lib = dcp if whose == "dcp" else torch_dcp
    NoBias, FromNet = _filtering_planners(lib.DefaultSavePlanner,
                                          lib.DefaultLoadPlanner)
    ckpt = str(tmp_path / "ckpt")
    dcp.save(_state(), checkpoint_id=ckpt, planner=NoBias())
    md = dcp.read_metadata(ckpt)
    assert sorted(md.state_dict_metadata) == [
        "cfg.lr", "cfg.names", "model.w", "step"]
    assert md.planner_data["model.w"] == ("model", "w")  # nested again
    net = {"net": {"w": torch.zeros(2, 3)}, "step": 0,
           "cfg": {"lr": 0.0, "names": []}}
    dcp.load(net, checkpoint_id=ckpt, planner=FromNet())
    assert torch.equal(net["net"]["w"], _state()["model"]["w"])
    assert net["cfg"] == {"lr": 0.5, "names": ["a", "b"]}
    assert net["step"] == 7


def test_dcp_flattens_as_torch_flattens():
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    t = torch.ones(1)
    state = {"a": {"b": t, "c": [1, 2], "d": [t, {"e": 3}], "f": (t, 4),
                   "g": [[1], [t]], "h": {}, "i": []},
             "j": 5, 6: {"k": t}}
    flat, mappings = dcp.planner.flatten(state)
    torch_flat, torch_mappings = flatten_state_dict(state)
    assert list(flat) == list(torch_flat)
    assert all(flat[k] is torch_flat[k] for k in flat)
    # Paths keep the dict keys as they are (torch's are str(key)).
    assert mappings["6.k"] == (6, "k") and torch_mappings["6.k"] == ("6", "k")
    assert dict(mappings, **{"6.k": ("6", "k")}) == torch_mappings
    with pytest.raises(ValueError, match="duplicated flatten key a.b"):
        dcp.planner.flatten({"a.b": 1, "a": {"b": 2}})


def test_damaged_nesting_paths_are_refused_before_the_hook(tmp_path,
                                                          monkeypatch):
    # torch's _EmptyStateDictLoadPlanner builds its dict from the paths
    # (set_element pads a list up to any index): a damaged index is
    # refused first, as a corrupt checkpoint.
    import types
    from dcp import _planner_hooks
    ckpt = str(tmp_path / "ckpt")
    dcp.save(_state(), checkpoint_id=ckpt)
    md = dcp.read_metadata(ckpt)
    crafted = types.SimpleNamespace(
        state_dict_metadata=md.state_dict_metadata,
        planner_data={**md.planner_data, "step": ("step", 1 << 40)},
        storage_meta=md.storage_meta)
    monkeypatch.setattr(_planner_hooks, "read_metadata_for",
                        lambda *_: crafted)
    with pytest.raises(dcp.CheckpointCorruptError,
                       match=r"the metadata's nesting paths are damaged: "
                             r"state dict path \"step.1099511627776\""):
        dcp.load({}, checkpoint_id=ckpt,
                 planner=_EmptyStateDictLoadPlanner())


class _Passing(dcp.DefaultSavePlanner):
    """Overrides set_up_planner, changing nothing."""

    def set_up_planner(self, state_dict, storage_meta=None,
                       is_coordinator=False):
        super().set_up_planner(state_dict, storage_meta, is_coordinator)


class _PassingLoad(dcp.DefaultLoadPlanner):
    def set_up_planner(self, state_dict, metadata=None, is_coordinator=False):
        super().set_up_planner(state_dict, metadata, is_coordinator)


class _WrapAfter(dcp.DefaultLoadPlanner):
    """Puts the flattened dict under a key of its own, after super()."""

    def set_up_planner(self, state_dict, metadata=None, is_coordinator=False):
        super().set_up_planner(state_dict, metadata, is_coordinator)
        self.state_dict = {"wrapped": self.state_dict}


def test_int_keys_stay_dict_keys_through_the_flattening(tmp_path):
    # An optimizer's state keyed by parameter number, sparse (a frozen
    # parameter has none) and a negative key: dict keys, not list
    # indices, in the nesting that comes back.
    ckpt = str(tmp_path / "ckpt")
    state = {"optim": {"state": {0: {"step": 3, "m": torch.ones(2)},
                                 2: {"step": 5, "m": torch.full((2,), 2.)},
                                 -1: {"step": 9}}}}
    dcp.save(state, checkpoint_id=ckpt, planner=_Passing())
    md = dcp.read_metadata(ckpt)
    assert sorted(md.state_dict_metadata) == [
        "optim.state.-1.step", "optim.state.0.m", "optim.state.0.step",
        "optim.state.2.m", "optim.state.2.step"]
    assert md.planner_data["optim.state.2.m"] == ("optim", "state", "2", "m")
    back = {"optim": {"state": {0: {"step": 0, "m": torch.zeros(2)},
                                2: {"step": 0, "m": torch.zeros(2)},
                                -1: {"step": 0}}}}
    dcp.load(back, checkpoint_id=ckpt, planner=_PassingLoad())
    assert set(back["optim"]["state"]) == {0, 2, -1}
    assert back["optim"]["state"][2]["step"] == 5
    assert back["optim"]["state"][-1]["step"] == 9
    assert torch.equal(back["optim"]["state"][2]["m"], torch.full((2,), 2.))
    mappings = dcp.planner.flatten(state)[1]
    assert mappings["optim.state.2.m"] == ("optim", "state", 2, "m")
    assert type(dcp.planner.flatten({"l": [torch.ones(1)]})[1]["l.0"][1]) \
        is dcp.planner.ListIndex


def test_a_flattened_dict_wrapped_after_super_gets_its_values(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    dcp.save({"wrapped": {"m": {"w": torch.ones(2), "step": 7}}},
             checkpoint_id=ckpt)
    back = {"m": {"w": torch.zeros(2), "step": 0}}
    dcp.load(back, checkpoint_id=ckpt, planner=_WrapAfter())
    assert back["m"]["step"] == 7 and torch.equal(back["m"]["w"],
                                                   torch.ones(2))


class _WrapNestedAfter(dcp.DefaultLoadPlanner):
    """Puts the caller's own (nested) dict under a key, after super()."""

    def set_up_planner(self, state_dict, metadata=None, is_coordinator=False):
        super().set_up_planner(state_dict, metadata, is_coordinator)
        self.state_dict = {"nested": state_dict}


def test_an_inner_key_like_a_flat_name_is_not_put_back_there(tmp_path):
    # "m" holds a key "step" too: only the flat dict's keys are flat
    # names; the nested dict's values load in place.
    ckpt = str(tmp_path / "ckpt")
    dcp.save({"nested": {"step": 1, "m": {"step": 7, "w": torch.ones(2)}}},
             checkpoint_id=ckpt)
    back = {"step": 0, "m": {"step": 0, "w": torch.zeros(2)}}
    dcp.load(back, checkpoint_id=ckpt, planner=_WrapNestedAfter())
    assert back["step"] == 1 and back["m"]["step"] == 7
    assert torch.equal(back["m"]["w"], torch.ones(2))
