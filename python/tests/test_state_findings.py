"""Reviewed findings in dcp._state, each checked against torch's DCP:
aliased lists, empty containers in the destination, numpy scalars whose
.item() is no Python value, and tensors of dtypes dcp does not store as
tensors (allow_pickle)."""
import collections
import warnings

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as tdcp

import dcp

_NT = collections.namedtuple("_NT", "x y")


@pytest.fixture(autouse=True)
def _quiet():
    # torch's DCP warns that it runs without a process group; torch's
    # quantized tensors that they are deprecated.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _both(tmp_path, saved, **kw):
    """`saved` saved by dcp and by torch's DCP: (dcp dir, torch dir)."""
    pd, pt = str(tmp_path / "dcp"), str(tmp_path / "torch")
    dcp.save(saved, checkpoint_id=pd, **kw)
    tdcp.save(saved, checkpoint_id=pt, no_dist=True)
    return pd, pt


def _torch_load(dest, path):
    tdcp.load(dest, checkpoint_id=path, no_dist=True)
    return dest


# -- 1. lists reached by two paths --------------------------------------


def test_two_keys_sharing_one_list_each_get_their_saved_list(tmp_path):
    pd, pt = _both(tmp_path, {"a": [1.0, 2.0], "b": [3.0, 4.0]})
    shared = [0.0, 0.0]
    dst = {"a": shared, "b": shared}
    dcp.load(dst, checkpoint_id=pd)
    # Refilled in place, "a" showed "b"'s [3.0, 4.0].
    assert dst == {"a": [1.0, 2.0], "b": [3.0, 4.0]}
    assert dst == _torch_load({"a": [0.0, 0.0], "b": [0.0, 0.0]}, pt)
    # The first key keeps the shared object; the second gets a new list.
    assert dst["a"] is shared and dst["b"] is not shared
    # Not shared: refilled in place, as before.
    own = [0.0, 0.0]
    dst = {"a": own, "b": [0.0, 0.0]}
    dcp.load(dst, checkpoint_id=pd)
    assert dst["a"] is own and own == [1.0, 2.0]


def _aliased_cases():
    def keys():
        a = [0, 0]
        return {"a": a, "b": a}

    def in_tuple():
        a = [0, 0]
        return {"a": (a, a), "b": a}

    def in_namedtuple():
        a = [0, 0]
        return {"a": _NT(a, a), "b": a}

    def twice_in_one_list():
        x = [0, 0]
        return {"a": [x, x]}

    def nested():
        x = [0]
        outer = [x, 1]
        return {"a": outer, "b": outer, "c": x}

    def empty():
        a = []
        return {"a": a, "b": a}

    def with_tensors():
        a = [torch.zeros(1), 0]
        return {"a": a, "b": a}

    def under_a_dict():
        a = [0, 0]
        return {"a": a, "b": {"c": a}}

    return [
        ({"a": [1, 2, 3], "b": [4]}, keys),
        ({"a": [], "b": [7, 8]}, keys),
        ({"a": 9, "b": [1, 2]}, keys),
        ({"a": [1, 2], "b": 9}, keys),
        ({"a": ([1, 2], [3, 4]), "b": [5, 6]}, in_tuple),
        ({"a": _NT([1, 2], [3, 4]), "b": [5, 6]}, in_namedtuple),
        ({"a": [[1, 2], [3, 4]]}, twice_in_one_list),
        ({"a": [[1], 2], "b": [[3], 4], "c": [5]}, nested),
        ({"a": [1], "b": [2]}, empty),
        ({"a": [torch.ones(1), 1], "b": [torch.ones(1) * 2, 2]},
         with_tensors),
        ({"a": [1, 2], "b": {"c": [3, 4]}}, under_a_dict),
    ]


@pytest.mark.parametrize("saved, dest", [
    pytest.param(saved, dest, id=f"{dest.__name__}-{i}")
    for i, (saved, dest) in enumerate(_aliased_cases())])
def test_aliased_lists_load_as_torch_loads_them(tmp_path, saved, dest):
    pd, pt = _both(tmp_path, saved)
    dst = dest()
    dcp.load(dst, checkpoint_id=pd)
    assert repr(dst) == repr(_torch_load(dest(), pt))


def test_an_aliased_list_subclass_keeps_its_type(ckpt):
    class History(list):
        pass

    dcp.save({"a": [1, 2], "b": [3]}, checkpoint_id=ckpt)
    shared = History([0, 0])
    shared.tag = "t"
    dst = {"a": shared, "b": shared}
    dcp.load(dst, checkpoint_id=ckpt)
    assert dst["a"] is shared and shared == [1, 2]
    assert type(dst["b"]) is History and dst["b"] == [3]
    assert dst["b"].tag == "t"


def _sequential_lr():
    from torch.optim import lr_scheduler
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = lr_scheduler.SequentialLR(
        opt, [lr_scheduler.LinearLR(opt, 0.1, total_iters=3),
              lr_scheduler.ExponentialLR(opt, 0.9)], milestones=[3])
    return opt, sched


def test_sequential_lr_loads_as_torch_loads_it(tmp_path):
    # A fresh SequentialLR's state_dict() shares `_last_lr` with its first
    # scheduler's.
    opt, sched = _sequential_lr()
    for _ in range(3):
        opt.step()
        sched.step()
    pd, pt = _both(tmp_path, {"sched": sched})
    _, by_dcp = _sequential_lr()
    dcp.load({"sched": by_dcp}, checkpoint_id=pd)
    _, by_torch = _sequential_lr()
    _torch_load({"sched": by_torch}, pt)
    assert by_dcp.get_last_lr() == by_torch.get_last_lr() == \
        sched.get_last_lr()
    assert [s.get_last_lr() for s in by_dcp._schedulers] == \
        [s.get_last_lr() for s in by_torch._schedulers] == \
        [s.get_last_lr() for s in sched._schedulers]
    assert repr(by_dcp.state_dict()) == repr(by_torch.state_dict())


# -- 2. empty containers in the destination --------------------------------


def _saved_scores(tmp_path):
    return _both(tmp_path, {"scores": torch.tensor([0.9, 0.7]),
                            "hist": np.arange(3.0), "extra": {"n": 4},
                            "v": 5, "pl": [1, 2], "e": []})


@pytest.mark.parametrize("empty", [[], (), {}], ids=["list", "tuple", "dict"])
def test_an_empty_container_where_the_checkpoint_holds_a_tensor(tmp_path,
                                                               empty):
    pd, pt = _saved_scores(tmp_path)
    # torch raises ("expected BytesStorageMetadata but found
    # TensorStorageMetadata"); dcp loaded nothing and said nothing.
    with pytest.raises(tdcp.api.CheckpointException):
        _torch_load({"scores": type(empty)()}, pt)
    for key in ("scores", "hist"):  # hist: saved from a numpy array
        dst = {key: empty}
        with pytest.raises(dcp.CheckpointValueError) as e:
            dcp.load(dst, checkpoint_id=pd)
        assert str(e.value) == (
            f'"{key}" is a value of type {type(empty).__name__} in the '
            "state dict but a tensor in the checkpoint")
        assert dst[key] is empty
        # A tensor is no missing key: allow_partial_load does not skip it.
        with pytest.raises(dcp.CheckpointValueError, match=f'"{key}"'):
            dcp.load(dst, checkpoint_id=pd, planner=dcp.DefaultLoadPlanner(
                allow_partial_load=True))


@pytest.mark.parametrize("dest, name", [
    ({"replay": []}, "replay"), ({"replay": ()}, "replay"),
    ({"replay": [[], ()]}, "replay"), ({"cfg": {"layers": ()}}, "cfg.layers")])
def test_an_empty_list_or_tuple_the_checkpoint_lacks_is_a_missing_key(
        tmp_path, dest, name):
    pd, pt = _saved_scores(tmp_path)
    with pytest.raises(tdcp.api.CheckpointException,
                       match=f"Missing key in checkpoint state_dict: {name}"):
        _torch_load(dict(dest, scores=torch.zeros(2)), pt)
    w = torch.zeros(2)
    dst = dict(dest, scores=w)
    with pytest.raises(dcp.CheckpointNotFoundError) as e:
        dcp.load(dst, checkpoint_id=pd)
    assert str(e.value) == (
        f'the checkpoint has no "{name}"; load with planner='
        "dcp.DefaultLoadPlanner(allow_partial_load=True) to skip missing keys")
    assert torch.equal(w, torch.zeros(2))
    # As for any other missing key: allow_partial_load keeps it.
    kept = repr(dst)
    dcp.load(dst, checkpoint_id=pd,
             planner=dcp.DefaultLoadPlanner(allow_partial_load=True))
    assert torch.equal(w, torch.tensor([0.9, 0.7]))
    dst.pop("scores")
    assert repr(dict(dst, scores=torch.zeros(2))) == kept


def test_a_dict_saved_where_the_destination_has_an_empty_list(tmp_path):
    pd, pt = _saved_scores(tmp_path)
    with pytest.raises(tdcp.api.CheckpointException,
                       match="Missing key in checkpoint state_dict: extra"):
        _torch_load({"extra": []}, pt)
    for empty in ([], ()):
        dst = {"extra": empty}
        with pytest.raises(dcp.CheckpointNotFoundError) as e:
            dcp.load(dst, checkpoint_id=pd)
        assert str(e.value) == (
            'the checkpoint has no "extra" (the checkpoint holds "extra.n": '
            'a list or dict was saved at "extra" where the state dict has a '
            "value)")
        dcp.load(dst, checkpoint_id=pd,
                 planner=dcp.DefaultLoadPlanner(allow_partial_load=True))
        assert dst["extra"] is empty


def test_an_empty_dict_loads_as_in_torch(tmp_path):
    pd, pt = _saved_scores(tmp_path)
    # A dict saved under it, or nothing at all: it stays empty (empty
    # dicts are not stored; torch's flattened state dict has no key for
    # it either).
    for key in ("extra", "missing"):
        empty = {}
        dst = {key: empty}
        dcp.load(dst, checkpoint_id=pd)
        assert dst[key] is empty and empty == {}
        assert _torch_load({key: {}}, pt) == {key: {}}
    # A plain value, or a list of plain values, saved at its key replaces
    # it, as torch's load does.
    for key, want in (("v", 5), ("pl", [1, 2]), ("e", [])):
        dst = {key: {}}
        dcp.load(dst, checkpoint_id=pd)
        assert dst == {key: want} == _torch_load({key: {}}, pt)
        assert type(dst[key]) is type(want)


def test_empty_containers_against_storage_holding_tensors_only(tmp_path):
    # Hugging Face and MEGA leave empty lists out: one the checkpoint
    # lacks is kept; a tensor saved at its name is still reported.
    state = {"w": torch.ones(2), "h": []}
    hf, mega = str(tmp_path / "hf"), str(tmp_path / "mega")
    dcp.save(state, storage_writer=dcp.HuggingFaceStorageWriter(hf))
    dcp.save(state, checkpoint_id="mega://" + mega)
    for path in (hf, mega):
        h = []
        dst = {"w": torch.zeros(2), "h": h, "d": {}}
        dcp.load(dst, checkpoint_id=path)
        assert dst["h"] is h and h == [] and dst["d"] == {}
        assert torch.equal(dst["w"], torch.ones(2))
        for empty in ([], (), {}):
            with pytest.raises(dcp.CheckpointValueError, match='"w"'):
                dcp.load({"w": empty}, checkpoint_id=path)


# -- 3. numpy scalars whose .item() is no Python value ---------------------


_OBJECT_SCALARS = {
    "ld": np.longdouble(1.5), "cld": np.clongdouble(1 + 2j),
    "s": np.str_("ab"), "b": np.bytes_(b"ab"),
    "day": np.datetime64("2024-01-01"),
    "ns": np.datetime64("2024-01-01T00:00:00.000000001"),
    "td": np.timedelta64(5, "s")}


@pytest.mark.parametrize("key", list(_OBJECT_SCALARS))
def test_numpy_scalars_without_a_python_value_are_objects(tmp_path, key):
    value = _OBJECT_SCALARS[key]
    ckpt = str(tmp_path / "c")
    # np.longdouble: RecursionError (its .item() is itself).
    with pytest.raises(TypeError) as e:
        dcp.save({key: value}, checkpoint_id=ckpt)
    t = type(value)
    assert str(e.value) == (
        f"cannot save '{key}': {t.__module__}.{t.__qualname__} is not a "
        "tensor, container or plain value (None, bool, int, float, "
        "complex, str, bytes, torch.dtype, torch.device); pass "
        "allow_pickle=True to store it pickled (loading it then runs pickle "
        "too)")
    dcp.save({key: value}, checkpoint_id=ckpt, allow_pickle=True)
    dst = {key: None}
    dcp.load(dst, checkpoint_id=ckpt, allow_pickle=True)
    assert type(dst[key]) is t and dst[key] == value
    torch_dir = str(tmp_path / "t")
    tdcp.save({key: value}, checkpoint_id=torch_dir, no_dist=True)
    assert type(_torch_load({key: None}, torch_dir)[key]) is t


def test_numpy_scalars_with_a_python_value_stay_plain(ckpt):
    values = {"f16": np.float16(1.5), "f64": np.float64(0.25),
              "i8": np.int8(-3), "u64": np.uint64(2 ** 64 - 1),
              "bool": np.bool_(True), "c64": np.complex64(1 + 2j),
              "c128": np.complex128(-0.5j)}
    dcp.save(values, checkpoint_id=ckpt)  # no pickle needed
    dst = {k: type(v)(0) for k, v in values.items()}
    dcp.load(dst, checkpoint_id=ckpt)
    assert all(type(dst[k]) is type(v) and dst[k] == v
               for k, v in values.items())


# -- 4. arrays and tensors of dtypes dcp does not store as tensors --------


_ARRAYS = {
    "class_names": np.array(["cat", "dog"]), "tokens": np.array([b"ab"]),
    "meta": np.array([1, "a"], dtype=object),
    "seen_at": np.array(["2024-01-01"], dtype="datetime64[D]"),
    "rec": np.array([(1, 2.5)], dtype=[("a", "i4"), ("b", "f8")]),
    "acc": np.ones(2, np.longdouble),
    "big_endian": np.arange(3.0, dtype=">f4"),
    "reversed": np.array(["a", "b", "c"])[::-1]}


@pytest.mark.parametrize("key", list(_ARRAYS))
def test_numpy_arrays_of_other_dtypes_are_stored_pickled(tmp_path, key):
    array = _ARRAYS[key]
    ckpt = str(tmp_path / "c")
    with pytest.raises(TypeError) as e:
        dcp.save({key: array}, checkpoint_id=ckpt)
    assert str(e.value) == (
        f"cannot save '{key}': numpy dtype {array.dtype} is not supported by "
        "dcp as a tensor; pass allow_pickle=True to store it pickled "
        "(loading it then needs allow_pickle=True too)")
    dcp.save({key: array, "w": torch.ones(2)}, checkpoint_id=ckpt,
             allow_pickle=True)
    dest = np.zeros(1, dtype=array.dtype)
    dst = {key: dest, "w": torch.zeros(2)}
    with pytest.raises(ValueError, match=f"'{key}' was saved pickled"):
        dcp.load(dst, checkpoint_id=ckpt)
    assert dst[key] is dest
    dcp.load(dst, checkpoint_id=ckpt, allow_pickle=True)
    # Loaded whole, replacing the destination's array, as in torch.
    assert dst[key] is not dest and dst[key].dtype == array.dtype
    assert np.array_equal(dst[key], array)
    assert torch.equal(dst["w"], torch.ones(2))
    torch_dir = str(tmp_path / "t")
    tdcp.save({key: array}, checkpoint_id=torch_dir, no_dist=True)
    assert np.array_equal(
        _torch_load({key: np.zeros(1, array.dtype)}, torch_dir)[key], array)


def test_pickled_arrays_inside_lists_tuples_and_int_keyed_dicts(ckpt):
    names = np.array(["x", "yz"])
    state = {"l": [names, torch.ones(1)], "t": (names, torch.ones(1)),
             "d": {0: names}}
    dcp.save(state, checkpoint_id=ckpt, allow_pickle=True)
    one = torch.zeros(1)
    lst = [np.array([""]), one]
    dst = {"l": lst, "t": (np.array([""]), torch.zeros(1)),
           "d": {0: np.array([""])}}
    dcp.load(dst, checkpoint_id=ckpt, allow_pickle=True)
    assert dst["l"] is lst and lst[1] is one and torch.equal(one,
                                                             torch.ones(1))
    assert type(dst["t"]) is tuple
    for got in (lst[0], dst["t"][0], dst["d"][0]):
        assert np.array_equal(got, names)
    assert torch.equal(dst["t"][1], torch.ones(1))


def test_supported_arrays_and_tensors_still_load_in_place(ckpt):
    state = {"w": torch.ones(3), "n": np.arange(4.0),
             "s": np.array(["a"])}
    dcp.save(state, checkpoint_id=ckpt, allow_pickle=True)
    md = dcp.FileSystemReader(ckpt).read_metadata()
    assert type(md.state_dict_metadata["w"]).__name__ == \
        "TensorStorageMetadata"
    assert type(md.state_dict_metadata["n"]).__name__ == \
        "TensorStorageMetadata"
    assert type(md.state_dict_metadata["s"]).__name__ == \
        "BytesStorageMetadata"
    w, n = torch.zeros(3), np.zeros(4)
    dst = {"w": w, "n": n, "s": np.array([""])}
    dcp.load(dst, checkpoint_id=ckpt, allow_pickle=True)
    assert dst["w"] is w and dst["n"] is n
    assert torch.equal(w, torch.ones(3)) and np.array_equal(n, np.arange(4.0))


def test_a_saved_tensor_into_a_destination_of_another_kind_of_dtype(ckpt):
    dcp.save({"n": np.ones(2)}, checkpoint_id=ckpt)
    dst = {"n": np.array(["a", "b"])}
    with pytest.raises(dcp.CheckpointValueError) as e:
        dcp.load(dst, checkpoint_id=ckpt)
    assert str(e.value).startswith(
        "'n': the checkpoint holds a tensor where the state dict has one of "
        "<U1, a dtype dcp does not load tensors into")


def test_a_sharded_tensor_of_another_dtype_is_refused(ckpt):
    chunk = dcp.ShardedTensor(np.array(["a", "b"]), (4,), (0,))
    with pytest.raises(TypeError) as e:
        dcp.save({"s": chunk}, checkpoint_id=ckpt, allow_pickle=True)
    assert str(e.value) == (
        "'s': numpy dtype <U1 is not supported by dcp; a sharded tensor of "
        "it cannot be stored as one pickled value")


def _quantized(seed):
    torch.manual_seed(seed)
    return torch.ao.quantization.quantize_dynamic(
        torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(),
                            torch.nn.Linear(4, 3)),
        {torch.nn.Linear}, dtype=torch.qint8)


def test_a_quantized_tensor_needs_allow_pickle(ckpt):
    q = torch.quantize_per_tensor(torch.tensor([0.5, 1.0]), 0.1, 0,
                                  torch.qint8)
    with pytest.raises(TypeError) as e:
        dcp.save({"q": q}, checkpoint_id=ckpt)
    assert str(e.value) == (
        "cannot save 'q': dtype torch.qint8 is not supported by dcp as a "
        "tensor; pass allow_pickle=True to store it pickled (loading it "
        "then needs allow_pickle=True too)")


def test_a_quantized_model_round_trips_with_allow_pickle(tmp_path):
    model = _quantized(0)
    x = torch.randn(5, 4)
    pd, pt = str(tmp_path / "dcp"), str(tmp_path / "torch")
    with pytest.raises(TypeError, match="allow_pickle=True"):
        dcp.save({"model": model}, checkpoint_id=pd)
    dcp.save({"model": model}, checkpoint_id=pd, allow_pickle=True)
    tdcp.save({"model": model}, checkpoint_id=pt, no_dist=True)
    by_dcp, by_torch = _quantized(1), _quantized(1)
    assert not torch.equal(by_dcp(x), model(x))
    dcp.load({"model": by_dcp}, checkpoint_id=pd, allow_pickle=True)
    _torch_load({"model": by_torch}, pt)
    assert torch.equal(by_dcp(x), model(x))
    assert torch.equal(by_dcp(x), by_torch(x))
    # Its state dict, loaded and then set.
    fresh = _quantized(2)
    dst = {"model": fresh.state_dict()}
    dcp.load(dst, checkpoint_id=pd, allow_pickle=True)
    fresh.load_state_dict(dst["model"])
    assert torch.equal(fresh(x), model(x))


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_async_save_stores_them_pickled_too(tmp_path, kind):
    q = torch.quantize_per_tensor(torch.tensor([0.5, 1.0]), 0.1, 0,
                                  torch.qint8)
    state = {"names": np.array(["a", "bc"]), "q": q, "w": torch.ones(3)}
    path = str(tmp_path / "c")
    with pytest.raises(TypeError, match="'names'.*allow_pickle=True"):
        dcp.async_save(state, checkpoint_id=path,
                       async_checkpointer_type=kind).result()
    dcp.async_save(state, checkpoint_id=path, async_checkpointer_type=kind,
                   allow_pickle=True).result()
    w = torch.zeros(3)
    dst = {"names": np.array([""]),
           "q": torch.quantize_per_tensor(torch.zeros(2), 0.1, 0,
                                          torch.qint8), "w": w}
    dcp.load(dst, checkpoint_id=path, allow_pickle=True)
    assert np.array_equal(dst["names"], state["names"])
    assert torch.equal(dst["q"].dequantize(), q.dequantize())
    assert dst["w"] is w and torch.equal(w, torch.ones(3))
