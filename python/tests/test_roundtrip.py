"""Round trips through save and load: every dtype, value type and nesting,
loaded in place into the caller's own objects."""

import collections
import math
import os

import numpy as np
import pytest
import torch

import dcp

TORCH_DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32,
    torch.int64, torch.uint16, torch.uint32, torch.uint64, torch.float16,
    torch.bfloat16, torch.float32, torch.float64, torch.complex64,
    torch.complex128, torch.float8_e4m3fn, torch.float8_e5m2,
    # ROCm's float8, MX block scales, NVFP4 (two values a byte), chalf.
    torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.float8_e8m0fnu,
    torch.float4_e2m1fn_x2, torch.complex32,
]


def _random(shape, dtype, seed):
    """Random bit patterns of `dtype` (every bit exercised)."""
    g = torch.Generator().manual_seed(seed)
    n = int(np.prod(shape)) if shape else 1
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (n * itemsize,), dtype=torch.uint8,
                        generator=g)
    if dtype is torch.bool:
        return (raw % 2).bool().view(shape)
    return raw.view(dtype).view(shape)


def _same_bits(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a.reshape(-1).contiguous().view(torch.uint8),
                       b.reshape(-1).contiguous().view(torch.uint8))


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
def test_torch_dtype_round_trip(dtype, ckpt):
    src = {
        "t": _random((3, 5), dtype, 1),
        "scalar": _random((), dtype, 2),
        "empty": torch.empty((0, 4), dtype=dtype),
        # Strided views: a transpose and every other column.
        "transposed": _random((4, 6), dtype, 3).t(),
        "sliced": _random((5, 8), dtype, 4)[:, ::2],
    }
    dcp.save(src, checkpoint_id=ckpt)
    # Destinations with the sources' strides (strided loads too).
    # (float4_e2m1fn_x2 has no fill: left as allocated, overwritten.)
    dst = {k: torch.empty_strided(v.shape, v.stride(), dtype=dtype)
           for k, v in src.items()}
    if dtype is not torch.float4_e2m1fn_x2:
        for v in dst.values():
            v.zero_()
    ptrs = {k: v.data_ptr() for k, v in dst.items()}
    dcp.load(dst, checkpoint_id=ckpt)
    for k in src:
        _same_bits(dst[k], src[k])
        assert dst[k].data_ptr() == ptrs[k], k


@pytest.mark.parametrize("dtype", [np.bool_, np.uint8, np.int8, np.int16,
                                   np.int32, np.int64, np.uint16, np.uint32,
                                   np.uint64, np.float16, np.float32,
                                   np.float64, np.complex64, np.complex128],
                         ids=lambda d: np.dtype(d).name)
def test_numpy_round_trip(dtype, ckpt):
    rng = np.random.default_rng(7)
    a = rng.integers(0, 256, size=48, dtype=np.uint8).view(np.uint8)
    a = (a % 2).astype(np.bool_) if dtype is np.bool_ else \
        np.frombuffer(rng.bytes(48 * np.dtype(dtype).itemsize),
                      dtype=dtype).copy()
    src = {"a": a.reshape(6, 8), "strided": a.reshape(6, 8)[::2, 1::3]}
    dcp.save(src, checkpoint_id=ckpt)
    dst = {"a": np.zeros((6, 8), dtype=dtype),
           "strided": np.zeros((12, 8), dtype=dtype)[::4, 1::3]}
    dcp.load(dst, checkpoint_id=ckpt)
    for k in src:
        assert dst[k].tobytes() == src[k].tobytes(), k
    # numpy and torch read each other's checkpoints.
    t = {"a": torch.zeros(6, 8, dtype=torch.from_numpy(a).dtype),
         "strided": torch.zeros(src["strided"].shape,
                                dtype=torch.from_numpy(a).dtype)}
    dcp.load(t, checkpoint_id=ckpt)
    assert t["a"].numpy().tobytes() == src["a"].tobytes()


def test_numpy_arrays_with_negative_strides_round_trip(ckpt):
    # np.flip and a[::-1] views: saved from a copy, loaded through a
    # temporary copied back into the view (DLPack has no negative strides).
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    src = {"rows": a[::-1], "both": np.flip(a), "cols": a[:, ::-2],
           "one": np.arange(1, dtype=np.float32)[::-1]}
    dcp.save(src, checkpoint_id=ckpt)
    md = dcp.read_metadata(ckpt)
    assert md.state_dict_metadata["both"].size == (4, 6)
    plain = {k: np.zeros(v.shape, v.dtype) for k, v in src.items()}
    dcp.load(plain, checkpoint_id=ckpt)
    for k in src:
        assert np.array_equal(plain[k], src[k]), k
    bases = {k: np.zeros((4, 6), np.float32) for k in ("rows", "both",
                                                       "cols")}
    one = np.zeros(1, np.float32)
    views = {"rows": bases["rows"][::-1], "both": np.flip(bases["both"]),
             "cols": bases["cols"][:, ::-2], "one": one[::-1]}
    dcp.load(views, checkpoint_id=ckpt)
    for k in src:
        assert np.array_equal(views[k], src[k]), k
    # Through the views into the arrays under them.
    assert np.array_equal(bases["rows"], a) and \
        np.array_equal(bases["both"], a)
    assert np.array_equal(bases["cols"][:, 1::2], a[:, 1::2])
    assert not bases["cols"][:, ::2].any() and one[0] == 0


Point = collections.namedtuple("Point", "x y")


def _values():
    return {
        "int": 42, "neg": -7, "int64_max": 2**63 - 1, "int64_min": -2**63,
        # Past int64: decimal digits behind a marker, no pickle.
        "int64_max+1": 2**63, "int64_min-1": -2**63 - 1, "big": 2**200,
        "neg_big": -(2**100), "np_uint64_max": np.uint64(2**64 - 1),
        "float": 1.5, "nan": math.nan, "inf": -math.inf, "negzero": -0.0,
        "true": True, "false": False, "none": None,
        "str": "héllo wörld ✓", "str_nul": "a\0b", "empty_str": "",
        "bytes": b"\x00\x01\xff", "empty_bytes": b"",
        # Starts like dcp's own markers: escaped, so it stays bytes.
        "marker_like": b"\x00dcp.pickle.v1\x00not a pickle",
        "bytearray": bytearray(b"abc"),
        "np_int": np.int32(5), "np_float": np.float64(2.25),
        "np_bool": np.bool_(True),
    }


def _blank(v):
    """A value of the same type, different content."""
    if isinstance(v, bool):
        return not v
    if isinstance(v, np.generic):
        return type(v)(0)
    if isinstance(v, (int, float)):
        return type(v)(3)
    if isinstance(v, (str, bytes, bytearray)):
        return type(v)()
    return 0


def test_plain_values_keep_their_types(ckpt):
    src = _values()
    dcp.save(src, checkpoint_id=ckpt)
    dst = {k: _blank(v) for k, v in src.items()}
    dcp.load(dst, checkpoint_id=ckpt)
    for k, v in src.items():
        got = dst[k]
        assert type(got) is type(v), (k, type(got), type(v))
        if isinstance(v, float) and math.isnan(v):
            assert math.isnan(got)
        elif isinstance(v, float):
            assert got == v and math.copysign(1, got) == math.copysign(1, v)
        else:
            assert got == v, k


def test_nested_structures_and_tuples(ckpt):
    src = {
        "model": collections.OrderedDict(
            w=torch.arange(6.0).view(2, 3), b=torch.ones(3)),
        "opt": {
            "state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.ones(4)},
                      1: {"step": torch.tensor(5.0)}},
            "param_groups": [{"lr": 0.1, "betas": (0.9, 0.999),
                              "params": [0, 1], "name": None}],
        },
        "tup": (1, (2.0, "three", (torch.full((2,), 4.0),)), [5, (6,)]),
        "point": Point(1, torch.tensor([2, 3])),
        "deep": {"a": [[[{"b": [1, 2, {"c": torch.tensor(7)}]}]]]},
    }
    dcp.save(src, checkpoint_id=ckpt)
    dst = {
        "model": collections.OrderedDict(w=torch.zeros(2, 3),
                                         b=torch.zeros(3)),
        "opt": {
            "state": {0: {"step": torch.tensor(0.0),
                          "exp_avg": torch.zeros(4)},
                      1: {"step": torch.tensor(0.0)}},
            "param_groups": [{"lr": 0.0, "betas": (0.0, 0.0),
                              "params": [9, 9], "name": "x"}],
        },
        "tup": (0, (0.0, "", (torch.zeros(2),)), [0, (0,)]),
        "point": Point(0, torch.zeros(2, dtype=torch.int64)),
        "deep": {"a": [[[{"b": [0, 0, {"c": torch.tensor(0)}]}]]]},
    }
    inner = dst["tup"][1][2][0]
    dcp.load(dst, checkpoint_id=ckpt)
    assert isinstance(dst["model"], collections.OrderedDict)
    assert torch.equal(dst["model"]["w"], src["model"]["w"])
    st = dst["opt"]["state"]
    assert list(st) == [0, 1]  # int keys stay ints
    assert st[0]["step"].item() == 3.0 and st[1]["step"].item() == 5.0
    assert dst["opt"]["param_groups"] == [
        {"lr": 0.1, "betas": (0.9, 0.999), "params": [0, 1], "name": None}]
    tup = dst["tup"]
    assert type(tup) is tuple and type(tup[1]) is tuple
    assert type(tup[2]) is list and type(tup[2][1]) is tuple
    assert tup[0] == 1 and tup[1][:2] == (2.0, "three") and tup[2][1] == (6,)
    assert tup[1][2][0] is inner and torch.equal(inner, torch.full((2,), 4.))
    assert type(dst["point"]) is Point and dst["point"].x == 1
    assert dst["point"].y.tolist() == [2, 3]
    assert dst["deep"]["a"][0][0][0]["b"][:2] == [1, 2]
    assert dst["deep"]["a"][0][0][0]["b"][2]["c"].item() == 7


def test_in_place_load_keeps_storage(ckpt):
    model = torch.nn.Linear(16, 8)
    dcp.save({"model": model.state_dict()}, checkpoint_id=ckpt)
    fresh = torch.nn.Linear(16, 8)
    before = {k: v.data_ptr() for k, v in fresh.state_dict().items()}
    sd = {"model": fresh.state_dict()}
    dcp.load(sd, checkpoint_id=ckpt)
    for k, v in fresh.state_dict().items():
        assert v.data_ptr() == before[k]
        assert torch.equal(v, model.state_dict()[k])


def test_parameters_with_requires_grad(ckpt):
    p = torch.nn.Parameter(torch.randn(4, 4))
    dcp.save({"p": p}, checkpoint_id=ckpt)
    q = torch.nn.Parameter(torch.zeros(4, 4))
    dcp.load({"p": q}, checkpoint_id=ckpt)
    assert torch.equal(q.detach(), p.detach()) and q.requires_grad
    # (TensorProperties.requires_grad stays False: a DLTensor carries no
    # requires_grad and the C ABI has no per-tensor flag for it.)


def test_tied_tensors_and_empty_containers(ckpt):
    w = torch.randn(3, 3)
    src = {"a": w, "b": w, "empty_dict": {}, "empty_list": [], "x": 1}
    dcp.save(src, checkpoint_id=ckpt)
    t = torch.zeros(3, 3)
    dst = {"a": t, "b": t, "empty_dict": {}, "empty_list": [], "x": 0}
    dcp.load(dst, checkpoint_id=ckpt)
    assert torch.equal(t, w) and dst["x"] == 1
    assert dst["empty_dict"] == {} and dst["empty_list"] == []


class Counter:
    def __init__(self, n=0):
        self.n = n
        self.weights = torch.full((4,), float(n))
        self.loaded = None

    def state_dict(self):
        return {"n": self.n, "weights": self.weights}

    def load_state_dict(self, sd):
        self.loaded = sd
        self.n = sd["n"]


def test_stateful(ckpt):
    assert isinstance(Counter(), dcp.Stateful)
    dcp.save({"counter": Counter(5), "x": torch.ones(2)}, checkpoint_id=ckpt)
    c = Counter(0)
    sd = {"counter": c, "x": torch.zeros(2)}
    dcp.load(sd, checkpoint_id=ckpt)
    assert sd["counter"] is c and c.n == 5
    assert torch.equal(c.weights, torch.full((4,), 5.0))  # in place
    assert c.loaded["weights"] is c.weights
    assert torch.equal(sd["x"], torch.ones(2))


class Scalar:
    """A Stateful whose state_dict() is not a dict."""

    def __init__(self, value):
        self.value = value

    def state_dict(self):
        return self.value

    def load_state_dict(self, sd):
        self.value = sd


def test_stateful_with_a_plain_or_tuple_state_gets_the_loaded_one(ckpt):
    """A plain value or tuple is replaced where the load puts it, not
    changed in place: load_state_dict gets what was loaded."""
    dcp.save({"step": Scalar(1000), "pair": Scalar((1, 2.5)),
              "name": Scalar("run-7")}, checkpoint_id=ckpt)
    sd = {"step": Scalar(0), "pair": Scalar((0, 0.0)), "name": Scalar("")}
    dcp.load(sd, checkpoint_id=ckpt)
    assert sd["step"].value == 1000
    assert sd["pair"].value == (1, 2.5) and type(sd["pair"].value) is tuple
    assert sd["name"].value == "run-7"


class Opaque:
    def __init__(self, v):
        self.v = v

    def __eq__(self, other):
        return isinstance(other, Opaque) and other.v == self.v


def test_pickle_needs_allow_pickle_both_ways(ckpt):
    # (An int past int64 needs no pickle: test_big_ints.py.)
    state = {"obj": Opaque([1, 2]), "set": {2, 70}, "t": torch.ones(2)}
    with pytest.raises(TypeError, match="'obj'.*allow_pickle=True"):
        dcp.save(state, checkpoint_id=ckpt)
    dcp.save(state, checkpoint_id=ckpt, allow_pickle=True)
    dst = {"obj": None, "set": 0, "t": torch.zeros(2)}
    with pytest.raises(ValueError, match="'(obj|set)'.*allow_pickle=True"):
        dcp.load(dst, checkpoint_id=ckpt)
    dcp.load(dst, checkpoint_id=ckpt, allow_pickle=True)
    assert dst["obj"] == Opaque([1, 2]) and dst["set"] == {2, 70}


def test_sharded_tensor_wrapper_single_process(ckpt):
    full = torch.arange(24.0).view(6, 4)
    # One process holds the whole tensor; a load reads any box of it.
    dcp.save({"w": dcp.ShardedTensor(full, (6, 4), (0, 0)),
              "plain": full}, checkpoint_id=ckpt)
    md = dcp.read_metadata(ckpt)
    assert md.state_dict_metadata["w"].size == (6, 4)
    part = torch.zeros(2, 3)
    strided = torch.zeros(4, 6).t()[1:5, :2]  # (4, 2), not contiguous
    dcp.load({"w": dcp.ShardedTensor(part, (6, 4), (3, 1)),
              "plain": dcp.ShardedTensor(strided, (6, 4), (1, 2))},
             checkpoint_id=ckpt)
    assert torch.equal(part, full[3:5, 1:4])
    assert torch.equal(strided, full[1:5, 2:4])


def test_save_state_dict_and_load_state_dict(ckpt):
    writer = dcp.FileSystemWriter(ckpt, thread_count=2,
                                  single_file_per_rank=True)
    src = {"a": torch.randn(300, 300), "b": torch.randn(300, 300), "n": 3}
    dcp.save_state_dict(src, writer)
    dst = {"a": torch.zeros(300, 300), "b": torch.zeros(300, 300), "n": 0}
    dcp.load_state_dict(dst, dcp.FileSystemReader(ckpt))
    assert torch.equal(dst["a"], src["a"]) and dst["n"] == 3


def test_zstd_compression_round_trips_and_shrinks(tmp_path):
    state = {"w": torch.arange(200_000, dtype=torch.float32) % 7,
             "m": torch.randn(100_000)}
    plain, packed = str(tmp_path / "plain"), str(tmp_path / "zstd")
    dcp.save(state, checkpoint_id=plain)
    dcp.save(state, storage_writer=dcp.FileSystemWriter(
        packed, compression="zstd:3"))
    dst = {k: torch.zeros_like(v) for k, v in state.items()}
    dcp.load(dst, checkpoint_id=packed)
    assert all(torch.equal(dst[k], state[k]) for k in state)

    def size(d):
        return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    assert size(packed) < size(plain)
    with pytest.raises(ValueError, match="compression"):
        dcp.save(state, storage_writer=dcp.FileSystemWriter(
            str(tmp_path / "bad"), compression="zstd:99"))


def test_seed_extensions_select_zstd(tmp_path):
    state = {"w": torch.arange(200_000, dtype=torch.float32) % 7}
    packed = str(tmp_path / "zstd")
    dcp.save(state, storage_writer=dcp.FileSystemWriter(
        packed, _extensions=[dcp.ZStandard(level=5)]))
    md = dcp.FileSystemReader(packed).read_metadata()
    stored = [info for info in md.storage_data.values()]
    assert stored and all(info.length < 800_000 for info in stored)
    dst = {"w": torch.zeros(200_000)}
    dcp.load(dst, storage_reader=dcp.FileSystemReader(
        packed, _extension_registry=dcp.ExtensionRegistry()))
    assert torch.equal(dst["w"], state["w"])

    class Rot13(dcp.StreamTransformExtension):
        pass
    with pytest.raises(NotImplementedError, match="Rot13"):
        dcp.FileSystemWriter(str(tmp_path / "x"), _extensions=[Rot13()])
    with pytest.raises(NotImplementedError, match="Rot13"):
        dcp.ExtensionRegistry().register(Rot13)
    with pytest.raises(ValueError, match="outside 1-22"):
        dcp.ZStandard(level=99)
    with pytest.raises(ValueError, match="give one"):
        dcp.FileSystemWriter(str(tmp_path / "y"), compression="zstd:1",
                             _extensions=[dcp.ZStandard(level=5)])
    with pytest.raises(TypeError, match="ExtensionRegistry"):
        dcp.FileSystemReader(packed, _extension_registry=object())


def test_compression_takes_a_zstandard_object(tmp_path):
    state = {"w": torch.arange(200_000, dtype=torch.float32) % 7}
    packed = str(tmp_path / "zstd")
    writer = dcp.FileSystemWriter(packed, compression=dcp.ZStandard(level=5))
    assert writer.compression == "zstd:5"
    dcp.save(state, storage_writer=writer)
    stored = list(dcp.read_metadata(packed).storage_data.values())
    assert stored and all(info.length < 800_000 for info in stored)
    dst = {"w": torch.zeros(200_000)}
    dcp.load(dst, checkpoint_id=packed)
    assert torch.equal(dst["w"], state["w"])
    with pytest.raises(TypeError, match=r"compression must be None, 'none', "
                       r"'zstd', 'zstd:LEVEL' or a dcp.ZStandard, not True"):
        dcp.FileSystemWriter(str(tmp_path / "x"), compression=True)


def test_overwrite_false_refuses_an_existing_checkpoint(ckpt):
    dcp.save({"a": torch.ones(1)}, checkpoint_id=ckpt)
    with pytest.raises(dcp.CheckpointExistsError) as e:
        dcp.save({"a": torch.ones(1)},
                 storage_writer=dcp.FileSystemWriter(ckpt, overwrite=False))
    assert isinstance(e.value, FileExistsError)
    assert e.value.code == dcp.errors._lib.ALREADY_EXISTS


def test_writer_options_reach_the_engine(tmp_path):
    state = {f"t{i}": torch.full((100_000,), float(i)) for i in range(4)}
    one = str(tmp_path / "one")
    dcp.save(state, storage_writer=dcp.FileSystemWriter(
        one, thread_count=1, sync_files=False, direct_io=False))
    many = str(tmp_path / "many")
    dcp.save(state, storage_writer=dcp.FileSystemWriter(
        many, single_file_per_rank=False))
    import os
    n_one = [f for f in os.listdir(one) if f.endswith(".distcp")]
    n_many = [f for f in os.listdir(many) if f.endswith(".distcp")]
    assert len(n_one) == 1 and len(n_many) == 4
    dst = {k: torch.zeros(100_000) for k in state}
    dcp.load(dst, storage_reader=dcp.FileSystemReader(many, thread_count=2))
    assert all(torch.equal(dst[k], state[k]) for k in state)


@pytest.mark.parametrize("mode", ["sync", "thread"])
def test_conjugate_and_negative_views_save_and_load_their_values(ckpt, mode):
    """Lazily conjugated or negated views (their memory holds the values
    before the conjugation or negation) save the values they show, and a
    load into such a view gives it the saved values."""
    g = torch.Generator().manual_seed(3)
    z = torch.randn(6, 4, dtype=torch.complex64, generator=g)
    conj = z.conj()
    neg = z.conj().imag  # a negated view
    assert conj.is_conj() and neg.is_neg()
    state = {"conj": conj, "neg": neg}
    want = {"conj": conj.resolve_conj(), "neg": neg.resolve_neg()}
    if mode == "sync":
        dcp.save(state, checkpoint_id=ckpt)
    else:
        dcp.async_save(state, checkpoint_id=ckpt).upload_completion.result()
    plain = {"conj": torch.zeros(6, 4, dtype=torch.complex64),
             "neg": torch.zeros(6, 4)}
    dcp.load(plain, checkpoint_id=ckpt)
    assert torch.equal(plain["conj"], want["conj"])
    assert torch.equal(plain["neg"], want["neg"])
    base = torch.zeros(6, 4, dtype=torch.complex64)
    into = {"conj": base.conj(), "neg": torch.zeros(6, 4)}
    dcp.load(into, checkpoint_id=ckpt)
    assert torch.equal(into["conj"].resolve_conj(), want["conj"])
    assert torch.equal(base, want["conj"].conj())


def test_partial_load_leaves_views_of_missing_keys_unchanged(
        ckpt, monkeypatch):
    """allow_partial_load: destinations loaded through a temporary (lazily
    conjugated or negated views; strided ones when LOAD_STRIDED is off)
    whose key the checkpoint lacks keep their values."""
    dcp.save({"a": torch.ones(2)}, checkpoint_id=ckpt)
    partial = dcp.DefaultLoadPlanner(allow_partial_load=True)
    base = torch.full((4,), 1 + 1j, dtype=torch.complex64)
    nbase = torch.full((4,), 5.0)
    dst = {"a": torch.zeros(2), "missing_c": base.conj(),
           "missing_n": nbase._neg_view()}
    dcp.load(dst, checkpoint_id=ckpt, planner=partial)
    assert torch.equal(dst["a"], torch.ones(2))
    assert torch.equal(base, torch.full((4,), 1 + 1j, dtype=torch.complex64))
    assert torch.equal(nbase, torch.full((4,), 5.0))
    monkeypatch.setattr(dcp._state, "LOAD_STRIDED", False)
    tbase = torch.arange(12.0).reshape(3, 4)
    nparr = np.arange(12.0, dtype=np.float32).reshape(3, 4)
    dst = {"a": torch.zeros(2), "missing_t": tbase.T,
           "missing_np": nparr.T}
    dcp.load(dst, checkpoint_id=ckpt, planner=partial)
    assert torch.equal(dst["a"], torch.ones(2))
    assert torch.equal(tbase, torch.arange(12.0).reshape(3, 4))
    assert np.array_equal(nparr,
                          np.arange(12.0, dtype=np.float32).reshape(3, 4))


def test_load_into_an_expanded_tensor_is_refused(ckpt):
    dcp.save({"w": torch.arange(12.0).reshape(3, 4)}, checkpoint_id=ckpt)
    base = torch.zeros(1, 4)
    with pytest.raises(ValueError, match=r"'w': cannot load into a tensor "
                                         r"whose elements share memory"):
        dcp.load({"w": base.expand(3, 4)}, checkpoint_id=ckpt)
    assert torch.equal(base, torch.zeros(1, 4))


def test_load_into_self_overlapping_views_is_refused(ckpt):
    """unfold / as_strided views whose elements share memory (torch and
    numpy) raise naming the key and are left as they were; strided views
    that do not overlap load."""
    full = torch.arange(9.0).reshape(3, 3)
    dcp.save({"x": full, "s": full[:, ::2]}, checkpoint_id=ckpt)
    base = torch.zeros(5)
    for view in (base.unfold(0, 3, 1), base.as_strided((3, 3), (1, 1))):
        with pytest.raises(ValueError, match=r"'x': cannot load into a "
                                             r"tensor whose elements share"):
            dcp.load({"x": view}, checkpoint_id=ckpt)
    assert torch.equal(base, torch.zeros(5))
    nbase = np.zeros(5, np.float32)
    for shape, strides in (((3, 3), (4, 4)), ((3, 3), (0, 4))):
        view = np.lib.stride_tricks.as_strided(nbase, shape, strides,
                                               writeable=True)
        with pytest.raises(ValueError, match=r"'x': cannot load into a "
                                             r"numpy array whose elements"):
            dcp.load({"x": view}, checkpoint_id=ckpt)
    assert np.array_equal(nbase, np.zeros(5, np.float32))
    tbig, nbig = torch.zeros(3, 6), np.zeros((3, 6), np.float32)
    dst = {"x": tbig[:, ::2].T, "s": nbig[:, 1::3]}
    dcp.load(dst, checkpoint_id=ckpt)
    assert torch.equal(tbig[:, ::2], full.T)
    assert np.array_equal(nbig[:, 1::3], full[:, ::2].numpy())


def test_a_load_bumps_autograd_version_counters(ckpt):
    # As torch's in-place copy_ would: a graph that saved a tensor for
    # backward refuses the values a load put there.
    w = torch.nn.Parameter(torch.full((3,), 2.0))
    dcp.save({"w": w}, checkpoint_id=ckpt)
    x = torch.ones(3, requires_grad=True)
    loss = (w * x).sum()  # keeps w for x's gradient
    before = w._version
    dcp.load({"w": w}, checkpoint_id=ckpt)
    assert w._version > before
    with pytest.raises(RuntimeError, match="modified by an inplace"):
        loss.backward()
    with torch.inference_mode():
        frozen = torch.zeros(3)
    dcp.load({"w": frozen}, checkpoint_id=ckpt)
    assert frozen.equal(torch.full((3,), 2.0))


@pytest.mark.parametrize("kind", ["sync", "THREAD", "PROCESS"])
def test_numpy_subclasses_round_trip(tmp_path, kind):
    """np.memmap and other ndarray subclasses are numpy arrays to dcp."""
    mm = np.memmap(str(tmp_path / "mm.bin"), dtype=np.float32, mode="w+",
                   shape=(4, 5))
    mm[:] = np.arange(20, dtype=np.float32).reshape(4, 5)

    class Sub(np.ndarray):
        pass

    sub = np.arange(6, dtype=np.int16).view(Sub)
    ckpt = str(tmp_path / "ckpt")
    if kind == "sync":
        dcp.save({"mm": mm, "sub": sub}, checkpoint_id=ckpt)
    else:
        dcp.async_save({"mm": mm, "sub": sub}, checkpoint_id=ckpt,
                       async_checkpointer_type=dcp.AsyncCheckpointerType[
                           kind]).result(120)
    back = np.memmap(str(tmp_path / "back.bin"), dtype=np.float32,
                     mode="w+", shape=(4, 5))
    out_sub = np.zeros(6, dtype=np.int16).view(Sub)
    dcp.load({"mm": back, "sub": out_sub}, checkpoint_id=ckpt)
    assert (np.asarray(back) == np.asarray(mm)).all()
    assert (np.asarray(out_sub) == np.arange(6)).all()


def test_an_empty_top_level_key_is_named_as_torch_names_it(ckpt):
    # {"": {"w": ...}} is ".w", apart from a top-level "w"; the list and
    # dtype checks find its leaves by that name.
    dcp.save({"": {"w": torch.tensor([1, 2], dtype=torch.int16),
                   "hist": [1, 2, 3]}, "w": torch.zeros(2)},
             checkpoint_id=ckpt)
    md = dcp.read_metadata(ckpt)
    assert sorted(md.state_dict_metadata) == [".hist", ".w", "w"]
    dst = {"": {"w": torch.zeros(2), "hist": [0]}, "w": torch.ones(2)}
    dcp.load(dst, checkpoint_id=ckpt)
    assert torch.equal(dst[""]["w"], torch.tensor([1.0, 2.0]))
    assert dst[""]["hist"] == [1, 2, 3]
    assert torch.equal(dst["w"], torch.zeros(2))


def test_dtypes_safetensors_lacks_are_refused_by_its_writers(tmp_path):
    """F8_E8M0 and the FNUZ float8s are safetensors dtypes (its own reader
    loads dcp's files); float4_e2m1fn_x2 (whose safetensors "F4" counts
    4-bit elements) and complex32 are not: refused naming the tensor."""
    import safetensors.torch
    src = {name: _random((2, 3), getattr(torch, name), i) for i, name in
           enumerate(("float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"))}
    where = tmp_path / "hf"
    dcp.save(src, storage_writer=dcp.HuggingFaceStorageWriter(str(where)))
    (file,) = where.glob("*.safetensors")
    theirs = safetensors.torch.load_file(str(file))
    for k in src:
        _same_bits(theirs[k], src[k])
    for dtype, name in ((torch.float4_e2m1fn_x2, "F4_E2M1_X2"),
                        (torch.complex32, "C32")):
        with pytest.raises(dcp.CheckpointValueError) as e:
            dcp.save({"w": _random((2, 2), dtype, 1)},
                     storage_writer=dcp.HuggingFaceStorageWriter(
                         str(tmp_path / name)))
        assert f'"w" has dtype {name}, which safetensors lacks' in str(e.value)
