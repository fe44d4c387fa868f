"""Lists of plain values come back as the checkpoint holds them, as torch's
load returns such a list whole (Flat.reshape_lists)."""
import collections
import re
import struct

import numpy as np
import pytest
import torch

import dcp
from dcp import _state


def test_a_list_that_grew_comes_back_whole_in_the_same_object(ckpt):
    saved = [1, 2.5, "x", None, b"raw", True]
    dcp.save({"history": saved, "w": torch.ones(2)}, checkpoint_id=ckpt)
    history = []
    dst = {"history": history, "w": torch.zeros(2)}
    dcp.load(dst, checkpoint_id=ckpt)
    assert dst["history"] is history
    assert history == saved
    assert [type(v) for v in history] == [type(v) for v in saved]
    assert torch.equal(dst["w"], torch.ones(2))


def test_a_longer_destination_list_takes_the_saved_length(ckpt):
    dcp.save({"h": [1, 2]}, checkpoint_id=ckpt)
    dst = {"h": [0, 0, 0, 0]}
    dcp.load(dst, checkpoint_id=ckpt)
    assert dst["h"] == [1, 2]


def test_nested_lists_and_tuples_take_the_saved_shape(ckpt):
    dcp.save({"pairs": [[1, 0.5], [2, 0.25], [3, 0.125]],
              "t": (1, 2, 3), "cfg": {"betas": (0.9, 0.99, 0.999)}},
             checkpoint_id=ckpt)
    dst = {"pairs": [], "t": (), "cfg": {"betas": (0.0, 0.0)}}
    dcp.load(dst, checkpoint_id=ckpt)
    assert dst["pairs"] == [[1, 0.5], [2, 0.25], [3, 0.125]]
    assert dst["t"] == (1, 2, 3) and type(dst["t"]) is tuple
    assert dst["cfg"]["betas"] == (0.9, 0.99, 0.999)
    # The inner containers come back as saved, as from torch's load.
    dst = {"pairs": [(0, 0.0)], "t": [0]}
    dcp.load(dst, checkpoint_id=ckpt)
    assert dst["pairs"] == [[1, 0.5], [2, 0.25], [3, 0.125]]
    assert dst["t"] == (1, 2, 3)  # a saved tuple where the state has a list
    dst = {"pairs": [[0, 0], [0], [0, 0]], "t": torch.Size([1])}
    dcp.load(dst, checkpoint_id=ckpt)
    assert dst["t"] == (1, 2, 3) and type(dst["t"]) is torch.Size


def test_lists_saved_item_by_item_take_the_destinations_kinds(
        ckpt, per_item_lists):
    # Checkpoints that stored plain lists item by item hold no container
    # types: where the destination has a tuple at an index, the saved items
    # come back in a tuple there; elsewhere in lists.
    dcp.save({"pairs": [[1, 0.5], [2, 0.25], [3, 0.125]], "t": (1, 2, 3)},
             checkpoint_id=ckpt)
    assert "pairs.0.1" in dcp.read_metadata(ckpt).state_dict_metadata
    dst = {"pairs": [(0, 0.0)], "t": (0,)}
    dcp.load(dst, checkpoint_id=ckpt)
    assert dst["pairs"] == [(1, 0.5), [2, 0.25], [3, 0.125]]
    assert dst["t"] == (1, 2, 3) and type(dst["t"]) is tuple


def test_a_plain_list_is_one_item_that_keeps_its_types(ckpt):
    """Stored whole (one item, as torch's DCP stores it): every plain type,
    tuples inside lists and lists inside tuples, come back as saved, also
    where the load has no destination to go by (load_all)."""
    value = [1, -2**63, 2**63 - 1, 2**70, 2.5, float("inf"), -0.0, "x",
             "\u00e9\u4e2d", "", None, True, False, b"", b"\x00dcp.pickle.v1\x00",
             1 + 2j, torch.bfloat16, torch.device("cpu"), (1, [2, (3,)]), [],
             ()]
    state = {"v": value, "t": (0.9, 0.999), "w": torch.ones(2)}
    dcp.save(state, checkpoint_id=ckpt)
    assert set(dcp.read_metadata(ckpt).state_dict_metadata) == {"v", "t", "w"}
    mine = []
    dst = {"v": mine, "t": (), "w": torch.zeros(2)}
    dcp.load(dst, checkpoint_id=ckpt)
    assert dst["v"] is mine and mine == value and dst["t"] == (0.9, 0.999)
    assert [type(x) for x in mine] == [type(x) for x in value]
    assert str(mine[6]) == "-0.0" and type(mine[18][1][1]) is tuple
    back = dcp.format_utils.load_all(ckpt)
    assert back["v"] == value and type(back["t"]) is tuple
    assert [type(x) for x in back["v"]] == [type(x) for x in value]


def test_a_list_of_the_same_shape_loads_item_by_item(ckpt):
    dcp.save({"h": [[1, 2], [3]], "e": [[1, 2], [], [3]]},
             checkpoint_id=ckpt)
    inner = [0, 0]
    dst = {"h": [inner, [0]], "e": [[0, 0], [], [0]]}
    dcp.load(dst, checkpoint_id=ckpt)
    # Same shape: the destination's own inner lists are filled.
    assert dst["h"] == [[1, 2], [3]] and dst["h"][0] is inner
    assert dst["e"] == [[1, 2], [], [3]]


def _save_as_before_empty_markers(monkeypatch, state, ckpt):
    """Saves `state` as dcp did before it stored empty lists and tuples
    (as it still saves to storage that holds tensors only)."""
    from dcp import _state, checkpoint
    with monkeypatch.context() as m:
        m.setattr(checkpoint, "_holds_tensors_only", lambda *_: True)
        m.setattr(_state, "PACK_PLAIN_LISTS", False)
        dcp.save(state, checkpoint_id=ckpt)


def test_empty_lists_and_tuples_load_back_as_torch_returns_them(ckpt):
    saved = {"h": [], "t": (), "n": [1, [], 2, []], "d": {"x": []},
             "deep": [[[]], ()], "w": torch.ones(2)}
    dcp.save(saved, checkpoint_id=ckpt)
    for dst in ({"h": [5, 6], "t": (1,), "n": [0, 0, 0, 0], "d": {"x": None},
                 "deep": [], "w": torch.zeros(2)},
                {"h": [], "t": (), "n": [9], "d": {"x": 3}, "deep": [1, 2],
                 "w": torch.zeros(2)}):
        dcp.load(dst, checkpoint_id=ckpt)
        assert {k: v for k, v in dst.items() if k != "w"} == \
            {k: v for k, v in saved.items() if k != "w"}
        assert type(dst["t"]) is tuple and type(dst["deep"][1]) is tuple
        assert type(dst["n"][1]) is list and type(dst["n"][3]) is list


def test_a_value_saved_where_the_destination_has_a_list_replaces_it(ckpt):
    dcp.save({"h": 5, "t": "s", "e": []}, checkpoint_id=ckpt)
    dst = {"h": [1, 2], "t": (1,), "e": (3, 4)}
    dcp.load(dst, checkpoint_id=ckpt)
    assert dst == {"h": 5, "t": "s", "e": []}


def test_storage_holding_tensors_only_leaves_empty_lists_out(tmp_path):
    state = {"w": torch.ones(2), "h": [], "m": {"t": ()}}
    for writer in (dcp.HuggingFaceStorageWriter(str(tmp_path / "hf")),
                   dcp.MegaStorageWriter(str(tmp_path / "mega"))):
        dcp.save(state, storage_writer=writer)
        dst = {"w": torch.zeros(2)}
        dcp.load(dst, checkpoint_id=writer.path)
        assert torch.equal(dst["w"], torch.ones(2))


def test_checkpoints_without_empty_markers_load_as_before(ckpt, monkeypatch):
    # A saved empty list was not stored; one followed by items was a None.
    _save_as_before_empty_markers(monkeypatch, {"h": [[], [1, 2]]}, ckpt)
    dst = {"h": [(), [0]]}
    dcp.load(dst, checkpoint_id=ckpt)
    assert dst["h"] == [(), [1, 2]]
    dst = {"h": []}
    dcp.load(dst, checkpoint_id=ckpt)
    assert dst["h"] == [None, [1, 2]]
    # Now stored: it comes back whole.
    dcp.save({"h": [[], [1, 2]]}, checkpoint_id=ckpt)
    for dst in ({"h": [(), [0]]}, {"h": []}):
        dcp.load(dst, checkpoint_id=ckpt)
        assert dst["h"] == [[], [1, 2]]


def test_lists_holding_tensors_or_maps_still_load_item_by_item(ckpt):
    dcp.save({"t": [torch.ones(2), 5], "m": [{"a": 1}]}, checkpoint_id=ckpt)
    # An empty destination list has nothing to load them into: missing
    # (test_a_list_of_tensors_into_an_empty_list_is_a_missing_key).
    dst = {"t": [], "m": []}
    dcp.load(dst, checkpoint_id=ckpt,
             planner=dcp.DefaultLoadPlanner(allow_partial_load=True))
    assert dst == {"t": [], "m": []}
    two = torch.zeros(2)
    dst = {"t": [two, 0], "m": [{"a": 0}]}
    dcp.load(dst, checkpoint_id=ckpt)
    assert torch.equal(two, torch.ones(2)) and dst["t"][1] == 5
    assert dst["m"] == [{"a": 1}]


def test_a_list_the_checkpoint_lacks_is_still_a_missing_key(ckpt):
    dcp.save({"other": [1]}, checkpoint_id=ckpt)
    dst = {"h": [0, 0]}
    with pytest.raises(dcp.CheckpointNotFoundError, match='"h.0"'):
        dcp.load(dst, checkpoint_id=ckpt)
    assert dst == {"h": [0, 0]}


def test_a_failed_load_leaves_the_list_unchanged(ckpt):
    dcp.save({"h": [1, 2, 3], "w": torch.ones(3)}, checkpoint_id=ckpt)
    history = []
    dst = {"h": history, "w": torch.zeros(4)}  # wrong shape: the load fails
    with pytest.raises(dcp.CheckpointValueError, match="w"):
        dcp.load(dst, checkpoint_id=ckpt)
    assert history == []


def test_a_pickled_item_of_a_grown_list_needs_allow_pickle(ckpt):
    dcp.save({"h": [1, {2, 70}]}, checkpoint_id=ckpt, allow_pickle=True)
    history = []
    with pytest.raises(ValueError, match="'h.1'.*allow_pickle=True"):
        dcp.load({"h": history}, checkpoint_id=ckpt)
    assert history == []
    dcp.load({"h": history}, checkpoint_id=ckpt, allow_pickle=True)
    assert history == [1, {2, 70}]


def test_an_optimizer_param_group_takes_the_saved_params(ckpt):
    # The params list of a param group is a list of plain values.
    group = {"params": ["a.weight", "a.bias"], "lr": 0.1}
    dcp.save({"optim": {"param_groups": [group]}}, checkpoint_id=ckpt)
    dst = {"optim": {"param_groups": [{"params": ["a.weight"], "lr": 0.0}]}}
    dcp.load(dst, checkpoint_id=ckpt)
    assert dst["optim"]["param_groups"] == [group]


def test_a_key_with_a_dot_is_not_taken_for_a_list_item(ckpt):
    # "h.0" at the top level has the name of h's item 0.
    # So the checkpoint has no list h (or g), which a load asks for, as
    # torch's does ("Missing key"); a partial load keeps the empty lists.
    dcp.save({"h.0": 7, "g": {"0": 1}}, checkpoint_id=ckpt)
    for key in ("h", "g"):
        dst = {key: []}
        with pytest.raises(dcp.CheckpointNotFoundError, match=f'"{key}"'):
            dcp.load(dst, checkpoint_id=ckpt)
        assert dst[key] == []
        dcp.load(dst, checkpoint_id=ckpt,
                 planner=dcp.DefaultLoadPlanner(allow_partial_load=True))
        assert dst[key] == []  # not reshaped: a key is not a list index


def test_a_list_of_as_many_items_but_another_shape_takes_the_saved_one(ckpt):
    dcp.save({"nested": [[1], [2, 3]], "flat": [[1, 2], 3]},
             checkpoint_id=ckpt)
    dst = {"nested": [[0, 0], [0]], "flat": [0, 0, 0]}
    dcp.load(dst, checkpoint_id=ckpt)
    assert dst == {"nested": [[1], [2, 3]], "flat": [[1, 2], 3]}


def test_a_saved_value_where_the_destination_has_an_empty_list(ckpt):
    dcp.save({"a": [5, 6, 7], "b": ["x", 6], "c": [None, [1]]},
             checkpoint_id=ckpt)
    dst = {"a": [[], 0], "b": [(), 0], "c": [(), [0]]}
    dcp.load(dst, checkpoint_id=ckpt)
    assert dst == {"a": [5, 6, 7], "b": ["x", 6], "c": [None, [1]]}


def test_a_none_saved_item_by_item_keeps_an_empty_container(
        ckpt, per_item_lists):
    # Item by item, the None an empty list was stored as (before empty
    # lists were stored) keeps the destination's empty container; any
    # other saved value replaces it.
    dcp.save({"a": [5, 6, 7], "b": ["x", 6], "c": [None, [1]]},
             checkpoint_id=ckpt)
    dst = {"a": [[], 0], "b": [(), 0], "c": [(), [0]]}
    dcp.load(dst, checkpoint_id=ckpt)
    assert dst == {"a": [5, 6, 7], "b": ["x", 6], "c": [(), [1]]}


def test_a_key_that_starts_with_the_lists_name_is_not_in_its_way(ckpt):
    dcp.save({"h": [1, 2, 3], "h.x": 5, "h.0.y": 6}, checkpoint_id=ckpt)
    dst = {"h": []}
    dcp.load(dst, checkpoint_id=ckpt)
    assert dst == {"h": [1, 2, 3]}


def test_a_dotted_key_next_to_the_list_does_not_hide_its_length(ckpt):
    # "h.x.y" has as many path elements as an item of h: h's last index
    # decides.
    dcp.save({"h": [1, 2], "h.x": {"y": 5}}, checkpoint_id=ckpt)
    dst = {"h": [0, 0, 0]}
    dcp.load(dst, checkpoint_id=ckpt,
             planner=dcp.DefaultLoadPlanner(allow_partial_load=True))
    assert dst == {"h": [1, 2]}


@pytest.mark.parametrize("packed", [True, False], ids=["whole", "per_item"])
def test_mega_checkpoints_return_lists_whole(tmp_path, monkeypatch, packed):
    # MEGA stores flattened names only: the indices come from the names
    # (lists saved item by item), or the list is one value at its name.
    monkeypatch.setattr(_state, "PACK_PLAIN_LISTS", packed)
    path = str(tmp_path / "mega")
    dcp.save({"h": [1, 2, 3], "n": [[1], [2, 3]], "w": torch.ones(2)},
             checkpoint_id="mega://" + path)
    for kw in ({"checkpoint_id": "mega://" + path},
               {"checkpoint_id": path},
               {"storage_reader": dcp.MegaStorageReader(path)}):
        dst = {"h": [0], "n": [], "w": torch.zeros(2)}
        dcp.load(dst, **kw)
        assert dst["h"] == [1, 2, 3] and dst["n"] == [[1], [2, 3]], kw
        assert torch.equal(dst["w"], torch.ones(2))


def test_keys_with_dots_on_the_lists_path_do_not_lend_it_items(ckpt):
    # "a.b.1" is also the name of key "b.1" under "a"; "h.0.1" of key "1"
    # under a top-level "h.0".
    dcp.save({"a.b": [1], "a": {"b.1": 7, "b.2": 8}, "h": [[7]],
              "h.0": {"1": 5}}, checkpoint_id=ckpt)
    dst = {"a.b": [0, 0, 0], "h": [[0, 0]]}
    dcp.load(dst, checkpoint_id=ckpt)
    assert dst == {"a.b": [1], "h": [[7]]}


def test_a_mega_key_like_an_index_with_a_leading_zero_is_not_one(
        tmp_path, per_item_lists):
    path = "mega://" + str(tmp_path / "mega")
    dcp.save({"h": [5], "h.01": 2}, checkpoint_id=path)
    dst = {"h": [0]}
    dcp.load(dst, checkpoint_id=path)
    assert dst == {"h": [5]}


def test_old_checkpoints_pad_an_empty_list_beside_tensors(ckpt, monkeypatch):
    # Saved before empties were stored: the engine padded the empty list
    # with a None, which loads as an empty container of the destination's
    # kind.
    _save_as_before_empty_markers(
        monkeypatch, {"h": [[], torch.ones(2)], "m": [[], {"a": 1}]}, ckpt)
    for inner, want in (([], []), ((), ()), ([5, 6], [])):
        dst = {"h": [inner, torch.zeros(2)], "m": [[], {"a": 0}]}
        dcp.load(dst, checkpoint_id=ckpt)
        assert dst["h"][0] == want and type(dst["h"][0]) is type(want)
        assert torch.equal(dst["h"][1], torch.ones(2))
        assert dst["m"] == [[], {"a": 1}]


def test_a_key_extending_the_lists_name_does_not_stop_its_replacement(ckpt):
    dcp.save({"h": [], "h.x": 1, "g": 7, "g.y": 2}, checkpoint_id=ckpt)
    dst = {"h": [5], "h.x": 0, "g": (1, 2), "g.y": 0}
    dcp.load(dst, checkpoint_id=ckpt)
    assert dst == {"h": [], "h.x": 1, "g": 7, "g.y": 2}


def test_a_marker_this_version_does_not_know_raises(ckpt, monkeypatch):
    from dcp import _state
    with monkeypatch.context() as m:
        m.setattr(_state, "EMPTY_LIST_MARKER", b"\x00dcp.future.v9\x00")
        dcp.save({"h": []}, checkpoint_id=ckpt)
    with pytest.raises(ValueError, match=r"'h' holds a value this version"):
        dcp.load({"h": None}, checkpoint_id=ckpt)


def test_a_saved_list_index_far_past_the_end_is_refused_before_building(
        tmp_path):
    # MEGA reads list indices off the flat names: keys "h.0" and "h.2^40"
    # make a list whose last index is 2^40. The engine refuses an index
    # more than 2^20 past a list's end; Python refuses it too, before it
    # builds a list that long (8 TiB of slots).
    path = "mega://" + str(tmp_path / "mega")
    dcp.save({"h.0": 1, f"h.{1 << 40}": 2}, checkpoint_id=path)
    dst = {"h": [0]}
    with pytest.raises(dcp.CheckpointValueError) as e:
        dcp.load(dst, checkpoint_id=path)
    assert str(e.value) == (
        f'state dict path "h.{1 << 40}" has list index {1 << 40} at element '
        "1, more than 1048576 past the end of its list (1 entries)")
    assert dst == {"h": [0]}


def test_list_growth_is_checked_as_the_engine_checks_it():
    from dcp._state import MAX_LIST_GROWTH, check_list_growth

    def name_at(i):
        return f"h.{i}", 1
    # The list is built from empty in increasing index order: each index
    # may lie up to MAX_LIST_GROWTH past the end reached so far.
    check_list_growth([MAX_LIST_GROWTH], name_at)
    check_list_growth([MAX_LIST_GROWTH + 1, 0], name_at)
    check_list_growth(range(0, 5 * MAX_LIST_GROWTH, MAX_LIST_GROWTH), name_at)
    for indices, size in (([MAX_LIST_GROWTH + 1], 0),
                          ([0, MAX_LIST_GROWTH + 2], 1),
                          ([7, 3, 2 * MAX_LIST_GROWTH + 9], 8)):
        with pytest.raises(dcp.CheckpointValueError) as e:
            check_list_growth(indices, name_at)
        bad = max(indices)
        assert str(e.value) == (
            f'state dict path "h.{bad}" has list index {bad} at element 1, '
            f"more than {MAX_LIST_GROWTH} past the end of its list ({size} "
            "entries)")


class _Pair(tuple):
    """A tuple subclass whose constructor takes an iterable, as tuple's."""


class _History(list):
    """A list subclass."""


def test_tuple_and_list_subclasses_take_the_saved_length(ckpt):
    """torch.Size and other non-namedtuple tuple subclasses, and list
    subclasses, are lists of plain values: they come back as saved
    whatever the destination's length, in the destination's type (torch's
    load returns the saved object)."""
    dcp.save({"meta": {"shape": torch.Size([4, 5, 6])},
              "pair": _Pair((2, 3)), "h": _History([1, 2, 3]),
              "nested": [torch.Size([7, 8]), _History([9])],
              "w": torch.ones(2)}, checkpoint_id=ckpt)
    for shape in (torch.Size([]), torch.Size([0]), torch.Size([0] * 5)):
        history, inner = _History([0]), _History()
        dst = {"meta": {"shape": shape}, "pair": _Pair((0,)), "h": history,
               "nested": [torch.Size([0]), inner], "w": torch.zeros(2)}
        dcp.load(dst, checkpoint_id=ckpt)
        assert dst["meta"]["shape"] == torch.Size([4, 5, 6])
        assert type(dst["meta"]["shape"]) is torch.Size
        assert type(dst["pair"]) is _Pair and dst["pair"] == (2, 3)
        assert dst["h"] is history and history == [1, 2, 3]
        assert dst["nested"] == [(7, 8), [9]]
        assert type(dst["nested"][0]) is torch.Size
        assert dst["nested"][1] is inner
        assert torch.equal(dst["w"], torch.ones(2))


def test_an_empty_torch_size_saved_loads_as_one(ckpt):
    dcp.save({"shape": torch.Size([])}, checkpoint_id=ckpt)
    dst = {"shape": torch.Size([3])}
    dcp.load(dst, checkpoint_id=ckpt)
    assert dst["shape"] == () and type(dst["shape"]) is torch.Size


class _Point2(tuple):
    """A tuple subclass whose constructor takes its items one by one."""

    def __new__(cls, x, y):
        return super().__new__(cls, (x, y))


def test_a_tuple_subclass_that_cannot_be_rebuilt_raises_before_loading(
        ckpt):
    dcp.save({"p": _Point2(1, 2), "w": torch.ones(2)}, checkpoint_id=ckpt)
    dst = {"p": _Point2(0, 0), "w": torch.zeros(2)}
    with pytest.raises(dcp.CheckpointValueError,
                       match=r"^'p': the state dict's _Point2 cannot be "
                             r"rebuilt from its items \(TypeError: "):
        dcp.load(dst, checkpoint_id=ckpt)
    assert dst["p"] == (0, 0) and torch.equal(dst["w"], torch.zeros(2))


_NT = collections.namedtuple("_NT", "x y")
_NT3 = collections.namedtuple("_NT3", "x y z")
_NT0 = collections.namedtuple("_NT0", "")


def test_a_list_holding_namedtuples_comes_back_at_the_saved_length(ckpt):
    """A namedtuple in a list of plain values was loaded item by item: a
    shorter destination list lost the saved items past its end without an
    error, a longer one raised. It is a list of plain values: it comes back
    as saved, a namedtuple where the destination has one at that index."""
    dcp.save({"h": [_NT(1, 2), 1.0, 5], "d": {"a": [_NT(3, 4), 7]},
              "e": [_NT0(), 1], "g": [_NT([1, 2, 3], 4)], "w": torch.ones(2)},
             checkpoint_id=ckpt)
    for h in ([_NT(0, 0)], [_NT(0, 0), 0.0, False, 9]):
        dst = {"h": h, "d": {"a": [_NT(0, 0)]}, "e": [_NT0()],
               "g": [_NT([0], 0)], "w": torch.zeros(2)}
        dcp.load(dst, checkpoint_id=ckpt)
        assert dst["h"] is h and h == [_NT(1, 2), 1.0, 5]
        assert [type(v) for v in h] == [_NT, float, int]
        assert dst["d"] == {"a": [_NT(3, 4), 7]}
        assert type(dst["d"]["a"][0]) is _NT
        assert dst["e"] == [_NT0(), 1] and type(dst["e"][0]) is _NT0
        assert dst["g"] == [_NT([1, 2, 3], 4)] and type(dst["g"][0]) is _NT
        assert torch.equal(dst["w"], torch.ones(2))
    # Where the destination has none at that index, or one of other
    # fields, the saved items come back in a list or a tuple.
    dcp.save({"h": [_NT3(1, 2, 3), _NT(4, 5)]}, checkpoint_id=ckpt)
    dst = {"h": [_NT(0, 0)]}
    dcp.load(dst, checkpoint_id=ckpt)
    assert dst["h"] == [(1, 2, 3), [4, 5]]
    assert type(dst["h"][0]) is tuple and type(dst["h"][1]) is list


def test_a_namedtuple_of_other_fields_raises_before_loading(ckpt):
    # A namedtuple outside a list of plain values loads field by field.
    dcp.save({"p": _NT3(1, 2, 3), "w": torch.ones(2)}, checkpoint_id=ckpt)
    dst = {"p": _NT(0, 0), "w": torch.zeros(2)}
    with pytest.raises(dcp.CheckpointValueError) as e:
        dcp.load(dst, checkpoint_id=ckpt)
    assert str(e.value) == (
        "'p' was saved with 3 items, the state dict's _NT (a tuple) has 2; "
        "a tuple holding tensors or dicts (or a namedtuple) loads item by "
        "item into the state dict's, which needs the saved length (torch's "
        "load returns the saved tuple whole)")
    assert dst["p"] == _NT(0, 0) and torch.equal(dst["w"], torch.zeros(2))


def test_a_tuple_of_tensors_of_another_length_raises_before_loading(ckpt):
    """A tuple holding tensors loads item by item into the destination's
    tensors; a shorter destination tuple dropped the saved items past its
    end without an error."""
    one, two = torch.tensor([1.0, 2.0]), torch.tensor([2.0, 4.0])
    dcp.save({"h": (one, two), "m": (one, 5), "n": [(one, two)],
              "p": _NT(one, two), "w": torch.ones(2)}, checkpoint_id=ckpt)
    msg = ("'{}' was saved with {} item{}, the state dict's {} has {}; a "
           "tuple holding tensors or dicts (or a namedtuple) loads item by "
           "item into the state dict's, which needs the saved length "
           "(torch's load returns the saved tuple whole)")
    partial = dcp.DefaultLoadPlanner(allow_partial_load=True)
    for key, dest, want in (
            ("h", (torch.zeros(2),), ("h", 2, "s", "tuple", 1)),
            ("m", (torch.zeros(2),), ("m", 2, "s", "tuple", 1)),
            ("n", [(torch.zeros(2),)], ("n.0", 2, "s", "tuple", 1))):
        for kw in ({}, {"planner": partial}):
            w = torch.zeros(2)
            dst = {key: dest, "w": w}
            with pytest.raises(dcp.CheckpointValueError) as e:
                dcp.load(dst, checkpoint_id=ckpt, **kw)
            assert str(e.value) == msg.format(*want)
            assert dst[key] is dest and torch.equal(w, torch.zeros(2))
            assert all(torch.equal(t, torch.zeros(2)) for t in
                       (dest[0] if key == "n" else dest))
    # A longer destination: its extra items are missing keys, which
    # allow_partial_load keeps.
    x, y, z = torch.zeros(2), torch.zeros(2), torch.zeros(2)
    dst = {"p": (x, y, z)}
    with pytest.raises(dcp.CheckpointNotFoundError, match='"p.2"'):
        dcp.load(dst, checkpoint_id=ckpt)
    dcp.load(dst, checkpoint_id=ckpt, planner=partial)
    assert torch.equal(x, one) and torch.equal(y, two)
    assert torch.equal(z, torch.zeros(2)) and dst["p"][2] is z
    dcp.save({"h": (one, two, one)}, checkpoint_id=ckpt)
    dst = {"h": _NT(torch.zeros(2), torch.zeros(2))}
    with pytest.raises(dcp.CheckpointValueError) as e:
        dcp.load(dst, checkpoint_id=ckpt)
    assert str(e.value) == msg.format("h", 3, "s", "_NT (a tuple)", 2)
    # Of the saved length: loaded in place into the caller's tensors.
    dcp.save({"h": (one, two), "p": _NT(one, 5)}, checkpoint_id=ckpt)
    a, b, c = torch.zeros(2), torch.zeros(2), torch.zeros(2)
    dst = {"h": (a, b), "p": _NT(c, 0)}
    dcp.load(dst, checkpoint_id=ckpt)
    assert dst["h"][0] is a and dst["h"][1] is b and dst["p"].x is c
    assert torch.equal(a, one) and torch.equal(b, two)
    assert torch.equal(c, one) and dst["p"].y == 5 and type(dst["p"]) is _NT


def test_tuple_lengths_are_read_off_flattened_names_too(tmp_path):
    # Hugging Face and MEGA store flattened names only ("h.0", "h.1").
    one = torch.tensor([1.0, 2.0])
    for kind in ("hf", "mega"):
        path = str(tmp_path / kind)
        if kind == "hf":
            dcp.save({"h": (one, one * 2, ())},
                     storage_writer=dcp.HuggingFaceStorageWriter(path))
        else:
            dcp.save({"h": (one, one * 2)}, checkpoint_id="mega://" + path)
        dst = {"h": (torch.zeros(2),)}
        with pytest.raises(dcp.CheckpointValueError,
                           match=r"^'h' was saved with 2 items, the state "
                                 r"dict's tuple has 1; "):
            dcp.load(dst, checkpoint_id=path)
        assert torch.equal(dst["h"][0], torch.zeros(2))
        # An empty container the storage left out is not an item missing.
        dst = {"h": (torch.zeros(2), torch.zeros(2), ())}
        dcp.load(dst, checkpoint_id=path)
        assert torch.equal(dst["h"][1], one * 2) and dst["h"][2] == ()


def test_a_list_of_tensors_into_an_empty_list_is_a_missing_key(ckpt):
    """torch's load raises "Missing key" there; dcp loaded nothing and said
    nothing. With allow_partial_load the destination's list stays."""
    dcp.save({"l": [torch.ones(2), torch.ones(3)], "m": [{"a": 1}],
              "p": [1, 2], "w": torch.ones(2)}, checkpoint_id=ckpt)
    for key, dest in (("l", []), ("l", [[]]), ("l", ()), ("m", [])):
        w = torch.zeros(2)
        dst = {key: dest, "w": w}
        with pytest.raises(dcp.CheckpointNotFoundError) as e:
            dcp.load(dst, checkpoint_id=ckpt)
        first = "l.0" if key == "l" else "m.0.a"
        assert str(e.value) == (
            f'the checkpoint has no "{key}" (the checkpoint holds "{first}": '
            f'a list or dict was saved at "{key}" where the state dict has '
            "a value)")
        assert dst[key] is dest and torch.equal(w, torch.zeros(2))
        dcp.load(dst, checkpoint_id=ckpt,
                 planner=dcp.DefaultLoadPlanner(allow_partial_load=True))
        assert dst[key] is dest and dest == type(dest)(
            [[]] if dest == [[]] else [])
        assert torch.equal(w, torch.ones(2))
    # A list of plain values comes back at the saved length, as before.
    p = []
    dst = {"p": p}
    dcp.load(dst, checkpoint_id=ckpt)
    assert dst["p"] is p and p == [1, 2]


def test_a_list_of_tensors_into_an_empty_list_from_flattened_names(
        tmp_path):
    # Hugging Face and MEGA store flattened names only ("l.0").
    state = {"l": [torch.ones(2), torch.ones(3)], "w": torch.ones(1)}
    hf, mega = str(tmp_path / "hf"), str(tmp_path / "mega")
    dcp.save(state, storage_writer=dcp.HuggingFaceStorageWriter(hf))
    dcp.save(state, checkpoint_id="mega://" + mega)
    for path in (hf, mega):
        dst = {"l": [], "w": torch.zeros(1)}
        with pytest.raises(dcp.CheckpointNotFoundError,
                           match=r'^the checkpoint has no "l" \(the '
                                 r'checkpoint holds "l\.0"'):
            dcp.load(dst, checkpoint_id=path)
        assert dst == {"l": []} | {"w": dst["w"]}
        assert torch.equal(dst["w"], torch.zeros(1))
        dcp.load(dst, checkpoint_id=path,
                 planner=dcp.DefaultLoadPlanner(allow_partial_load=True))
        assert dst["l"] == [] and torch.equal(dst["w"], torch.ones(1))


def _seq(*parts):
    return _state.SEQ_MARKER + b"".join(parts)


def _u32(n):
    return struct.pack("<I", n)


def _marked(raw):
    return b"x" + _u32(len(raw)) + raw


@pytest.mark.parametrize("payload,why", [
    (b"", "no list at byte"),
    (b"{" + _u32(0), "no list at byte"),
    (b"[" + _u32(1), "1 items in 0 bytes"),
    (b"[" + _u32(2) + b"N", "2 items in 1 bytes"),
    (b"[" + _u32(1) + b"s" + _u32(10) + b"ab", "a str past the end"),
    (b"[" + _u32(1) + b"s" + _u32(1) + b"\xff", "a str that is not UTF-8"),
    (b"[" + _u32(1) + b"b" + _u32(9) + b"ab", "bytes past the end"),
    (b"[" + _u32(1) + b"i" + b"\x00" * 3, "unpack_from requires"),
    (b"[" + _u32(1) + b"Z", "an unknown item tag 90"),
    (b"[" + _u32(1) + b"N" + b"more", "4 byte(s) after its end"),
    (b"[" + _u32(1) + _marked(_state.PICKLE_MARKER + b"\x80\x04N."),
     "an unknown value"),
    (b"[" + _u32(1) + _marked(_state.INT_MARKER + b"1x"),
     "the saved int is damaged"),
    ((b"[" + _u32(1)) * 300 + b"N", "lists nest deeper than 200"),
    ((b"[" + _u32(1_000_000)) * 200 + b"N" * 1_000_000, "index out of range"),
], ids=["empty", "not_a_list", "count_past_end", "count_past_items",
        "str_past_end", "str_not_utf8", "bytes_past_end", "int_cut",
        "unknown_tag", "trailing", "pickle_inside", "bad_int", "too_deep",
        "claimed_counts"])
def test_a_damaged_list_raises_naming_the_key(ckpt, raw_values, payload, why):
    dcp.save({"w": torch.ones(2), "s": raw_values(_seq(payload))},
             checkpoint_id=ckpt)
    for dst in ({"w": torch.zeros(2), "s": [0]}, {"w": torch.zeros(2),
                                                  "s": None}):
        with pytest.raises(ValueError, match=r"'s': the saved list is "
                           r"damaged \(.*" + re.escape(why)):
            dcp.load(dst, checkpoint_id=ckpt)
        assert not dst["w"].any()


def test_lists_holding_other_values_are_saved_item_by_item(ckpt):
    # A namedtuple, a numpy scalar, a list subclass or a pickled object
    # inside: the list is stored item by item (their types need the
    # destination, or pickle), and loads as before.
    state = {"nt": [_NT(1, 2), 3], "np": [np.int16(4), 5],
             "sub": [_History([6])], "obj": [1, _Pickled(7)],
             "plain": [[1], (2,)]}
    dcp.save(state, checkpoint_id=ckpt, allow_pickle=True)
    names = set(dcp.read_metadata(ckpt).state_dict_metadata)
    assert names == {"nt.0.0", "nt.0.1", "nt.1", "np.0", "np.1", "sub.0.0",
                     "obj.0", "obj.1", "plain"}
    dst = {"nt": [_NT(0, 0), 0], "np": [np.int16(0), 0],
           "sub": [_History()], "obj": [0, None], "plain": []}
    dcp.load(dst, checkpoint_id=ckpt, allow_pickle=True)
    assert dst == state and type(dst["np"][0]) is np.int16
    assert type(dst["nt"][0]) is _NT and dst["plain"][1] == (2,)


class _Pickled:
    def __init__(self, v):
        self.v = v

    def __eq__(self, other):
        return isinstance(other, _Pickled) and other.v == self.v


def test_a_long_list_of_names_is_one_item(ckpt):
    names = [f"layers.{i}.mlp.weight" for i in range(30000)]
    dcp.save({"params": names}, checkpoint_id=ckpt)
    assert list(dcp.read_metadata(ckpt).state_dict_metadata) == ["params"]
    dst = {"params": []}
    dcp.load(dst, checkpoint_id=ckpt)
    assert dst["params"] == names


def test_claimed_item_counts_cost_no_memory_before_their_items():
    # 200 nested lists, each claiming 1,000,000 items, over 1 MB: memory
    # must follow the bytes decoded (it took 1.5 GB when each list was
    # allocated at its claimed length). Decoded under an address-space
    # limit of 300 MB more than the process has.
    import subprocess
    import sys
    code = r"""
import resource, struct
from dcp import _state
payload = _state.SEQ_MARKER + (b"[" + struct.pack("<I", 1_000_000)) * 200 \
    + b"N" * 1_000_000
for line in open("/proc/self/status"):
    if line.startswith("VmSize:"):
        now = int(line.split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (now + (300 << 20),) * 2)
flat = _state.Flat(load=True, allow_pickle=False)
try:
    flat._unpack(payload, ())
except ValueError as e:
    print("refused:", e)
"""
    import os
    env = dict(os.environ, PYTHONPATH=os.path.dirname(
        os.path.dirname(dcp.__file__)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "the saved list is damaged (index out of range)" in out.stdout


def test_a_tuple_saved_whole_loads_into_a_namedtuple(ckpt):
    dcp.save({"t": (1, 2), "l": [(3, 4)], "w": torch.ones(1)},
             checkpoint_id=ckpt)
    for planner in (None, dcp.DefaultLoadPlanner(allow_partial_load=True)):
        dst = {"t": _NT(0, 0), "l": [_NT(0, 0)], "w": torch.zeros(1)}
        dcp.load(dst, checkpoint_id=ckpt, planner=planner)
        assert dst["t"] == _NT(1, 2) and type(dst["t"]) is _NT
        assert dst["l"] == [_NT(3, 4)] and type(dst["l"][0]) is _NT
        assert torch.equal(dst["w"], torch.ones(1))


def test_lists_inside_tuples_are_refilled_in_place(ckpt):
    dcp.save({"a": ([1, 2], 5), "b": [([3],)]}, checkpoint_id=ckpt)
    inner, deep = [0, 0], [0]
    dst = {"a": (inner, 0), "b": [(deep,)]}
    dcp.load(dst, checkpoint_id=ckpt)
    assert dst == {"a": ([1, 2], 5), "b": [([3],)]}
    assert dst["a"][0] is inner and dst["b"][0][0] is deep


def test_items_take_the_destinations_numpy_and_bytearray_types(ckpt):
    dcp.save({"l": [1.5, 7, b"ab", [2]], "w": torch.ones(1)},
             checkpoint_id=ckpt)
    dst = {"l": [np.float32(0), np.int16(0), bytearray(), [np.int64(0)]],
           "w": torch.zeros(1)}
    dcp.load(dst, checkpoint_id=ckpt)
    assert dst["l"] == [1.5, 7, b"ab", [2]]
    assert [type(v) for v in dst["l"][:3]] == [np.float32, np.int16,
                                               bytearray]
    assert type(dst["l"][3][0]) is np.int64
    # One that does not fit is refused, naming it, before any tensor is
    # written.
    dcp.save({"l": [1, 70000], "w": torch.ones(1)}, checkpoint_id=ckpt + "2")
    dst = {"l": [np.int16(0), np.int16(0)], "w": torch.zeros(1)}
    with pytest.raises(dcp.CheckpointValueError,
                       match=r"^'l\.1': the saved value 70000 does not fit "
                             r"the state dict's int16"):
        dcp.load(dst, checkpoint_id=ckpt + "2")
    assert not dst["w"].any() and dst["l"] == [0, 0]


def test_a_torch_size_that_cannot_hold_the_saved_items_is_refused_first(
        ckpt):
    dcp.save({"s": (1, "x"), "w": torch.ones(1)}, checkpoint_id=ckpt)
    dst = {"s": torch.Size([0, 0]), "w": torch.zeros(1)}
    with pytest.raises(dcp.CheckpointValueError,
                       match=r"^'s': the state dict's Size cannot be made "
                             r"from the saved items \(TypeError: "):
        dcp.load(dst, checkpoint_id=ckpt)
    assert not dst["w"].any() and dst["s"] == (0, 0)
