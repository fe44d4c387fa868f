"""Python ints outside int64: saved without allow_pickle (their decimal
digits behind a marker, _state.INT_MARKER) and loaded back as ints without
pickle, also as numpy scalars and inside lists, tuples and dicts."""

import pickle
import sys

import numpy as np
import pytest
import torch

import dcp
import dcp.format_utils
from dcp import _lib, _state

BIG = {
    "p63": 2**63, "m63": -2**63 - 1, "p200": 2**200, "m100": -(2**100),
    "p64": 2**64, "m64": -2**64,
}


def _no_pickle(monkeypatch):
    """Makes any unpickling fail the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("a load of ints called pickle")
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)


def test_big_ints_round_trip_without_pickle(ckpt, monkeypatch):
    src = dict(BIG, int64_max=2**63 - 1, int64_min=-2**63, true=True,
               false=False, small=-5)
    dcp.save(src, checkpoint_id=ckpt)
    _no_pickle(monkeypatch)
    # Into int placeholders, into big int placeholders, into others.
    for fill in (0, 2**70, None, "x"):
        dst = {k: fill for k in src}
        dcp.load(dst, checkpoint_id=ckpt)
        assert dst == src
        for k, v in src.items():
            assert type(dst[k]) is type(v), (k, fill)


def test_int64_bounds_stay_ints_and_bools_stay_bools():
    flat = _state.Flat(load=False, allow_pickle=False)
    assert flat._encode(2**63 - 1) == (_lib.VALUE_INT, 2**63 - 1)
    assert flat._encode(-2**63) == (_lib.VALUE_INT, -2**63)
    assert flat._encode(True) == (_lib.VALUE_BOOL, 1)
    assert flat._encode(np.bool_(False)) == (_lib.VALUE_BOOL, 0)
    assert flat._encode(2**63) == (
        _lib.VALUE_BYTES, _state.INT_MARKER + b"9223372036854775808")
    assert flat._encode(-2**63 - 1) == (
        _lib.VALUE_BYTES, _state.INT_MARKER + b"-9223372036854775809")
    assert flat._encode(np.uint64(2**64 - 1)) == (
        _lib.VALUE_BYTES, _state.INT_MARKER + b"18446744073709551615")


def test_plain_int_and_big_int_replace_each_other(ckpt):
    dcp.save({"a": 7, "b": 2**90}, checkpoint_id=ckpt)
    dst = {"a": 2**90, "b": 7}
    dcp.load(dst, checkpoint_id=ckpt)
    assert dst == {"a": 7, "b": 2**90}
    assert type(dst["a"]) is int and type(dst["b"]) is int


def test_big_ints_in_lists_tuples_and_nested_dicts(ckpt):
    src = {
        "l": [1, 2**64, [-(2**65), "s"]],
        "t": (2**100, (3, -(2**100))),
        "d": {"e": {"f": 2**128 - 1, "g": [2**63]}},
        "mixed": [torch.arange(3), 2**99],
    }
    dcp.save(src, checkpoint_id=ckpt)
    dst = {"l": [0, 0, [0, ""]], "t": (0, (0, 0)),
           "d": {"e": {"f": 0, "g": [0]}},
           "mixed": [torch.zeros(3, dtype=torch.int64), 0]}
    dcp.load(dst, checkpoint_id=ckpt)
    assert dst["l"] == src["l"] and dst["d"] == src["d"]
    assert dst["t"] == src["t"] and type(dst["t"][1]) is tuple
    assert torch.equal(dst["mixed"][0], src["mixed"][0])
    assert dst["mixed"][1] == 2**99
    # A list of plain values comes back as saved, also of another length.
    dst = {"l": [5], "t": (), "d": {"e": {"f": None, "g": []}},
           "mixed": [torch.zeros(3, dtype=torch.int64), 1]}
    dcp.load(dst, checkpoint_id=ckpt)
    assert dst["l"] == src["l"] and dst["d"] == src["d"]
    # (inner containers as saved)
    assert dst["t"] == (2**100, (3, -(2**100)))


def test_numpy_rng_state_round_trips(ckpt, monkeypatch):
    rng = np.random.default_rng(0)
    rng.random(5)
    state = rng.bit_generator.state
    assert state["state"]["state"] > 2**63  # 128-bit ints
    dcp.save({"rng": state}, checkpoint_id=ckpt)
    _no_pickle(monkeypatch)
    # Into nothing: the nested state dict the checkpoint holds.
    got = dcp.format_utils.load_all(ckpt)
    assert got == {"rng": state}
    # Into a fresh generator's state dict, then back into a generator.
    fresh = np.random.default_rng(123)
    dst = {"rng": fresh.bit_generator.state}
    assert dst["rng"] != state
    dcp.load(dst, checkpoint_id=ckpt)
    assert dst["rng"] == state
    fresh.bit_generator.state = dst["rng"]
    assert np.array_equal(fresh.random(8), rng.random(8))
    assert np.array_equal(fresh.integers(0, 2**63, 8, dtype=np.int64),
                          rng.integers(0, 2**63, 8, dtype=np.int64))


def test_uint64_numpy_scalars_above_int64_round_trip(ckpt):
    src = {"max": np.uint64(2**64 - 1), "mid": np.uint64(2**63),
           "low": np.uint64(5)}
    dcp.save(src, checkpoint_id=ckpt)
    dst = {k: np.uint64(0) for k in src}
    dcp.load(dst, checkpoint_id=ckpt)
    for k, v in src.items():
        assert type(dst[k]) is np.uint64 and dst[k] == v, k
    dst = {k: 0 for k in src}
    dcp.load(dst, checkpoint_id=ckpt)
    assert dst == {k: int(v) for k, v in src.items()}
    assert all(type(v) is int for v in dst.values())


@pytest.mark.parametrize("dest, value", [
    (np.int64(0), 2**63), (np.int64(0), -2**63 - 1),
    (np.uint64(0), 2**64), (np.uint64(0), -(2**70)),
    (np.int8(0), 2**100), (np.int32(0), -(2**64)),
])
def test_a_big_int_that_does_not_fit_a_numpy_scalar_raises(
        ckpt, dest, value):
    dcp.save({"w": torch.ones(2), "n": {"v": value}}, checkpoint_id=ckpt)
    dst = {"w": torch.zeros(2), "n": {"v": dest}}
    with pytest.raises(ValueError, match=(
            rf"'n\.v': the saved value {value} does not fit the state "
            rf"dict's {type(dest).__name__}")):
        dcp.load(dst, checkpoint_id=ckpt)
    # Refused before anything is written.
    assert dst["n"]["v"] == 0 and type(dst["n"]["v"]) is type(dest)
    assert not dst["w"].any()


def test_a_big_int_into_numpy_scalars_that_hold_it(ckpt):
    dcp.save({"a": 2**63, "b": -(2**63) - 1, "c": 2**64 - 1},
             checkpoint_id=ckpt)
    dst = {"a": np.uint64(0), "b": np.float64(0), "c": np.uint64(1)}
    dcp.load(dst, checkpoint_id=ckpt)
    assert type(dst["a"]) is np.uint64 and dst["a"] == 2**63
    assert type(dst["b"]) is np.float64 and dst["b"] == float(-(2**63) - 1)
    assert type(dst["c"]) is np.uint64 and dst["c"] == 2**64 - 1


@pytest.mark.parametrize("payload", [
    b"", b"-", b"12a", b" 12", b"12 ", b"+12", b"1_000", b"--1", b"0x10",
    b"1.5", b"\xd9\xa1", b"\x0012",
])
def test_a_damaged_int_marker_raises_naming_the_key(ckpt, raw_values,
                                                    payload):
    dcp.save({"w": torch.ones(2),
              "s": [1, raw_values(_state.INT_MARKER + payload)]},
             checkpoint_id=ckpt)
    dst = {"w": torch.zeros(2), "s": [0, 0]}
    with pytest.raises(ValueError, match=r"'s\.1': the saved int is "
                       r"damaged"):
        dcp.load(dst, checkpoint_id=ckpt)
    assert dst["s"] == [0, 0] and not dst["w"].any()


def test_the_int_marker_is_decimal_digits_as_written(ckpt, raw_values):
    # Leading zeros and "-0" are not what a save writes, but are digits.
    dcp.save({"a": raw_values(_state.INT_MARKER + b"-00012"),
              "b": raw_values(_state.INT_MARKER + b"-0"),
              "c": raw_values(_state.INT_MARKER + b"5")}, checkpoint_id=ckpt)
    dst = {"a": None, "b": None, "c": None}
    dcp.load(dst, checkpoint_id=ckpt)
    assert dst == {"a": -12, "b": 0, "c": 5}


def test_user_bytes_like_the_int_marker_stay_bytes(ckpt):
    raw = _state.INT_MARKER + b"123"
    dcp.save({"b": raw, "ba": bytearray(raw)}, checkpoint_id=ckpt)
    dst = {"b": b"", "ba": bytearray()}
    dcp.load(dst, checkpoint_id=ckpt)
    assert dst == {"b": raw, "ba": bytearray(raw)}
    assert type(dst["ba"]) is bytearray


@pytest.mark.parametrize("kind", ["THREAD", "PROCESS"])
def test_async_save_of_big_ints(tmp_path, kind):
    src = {"w": torch.ones(3), "rng": {"state": 2**127 + 1, "inc": -(2**90)}}
    path = str(tmp_path / kind)
    fut = dcp.async_save(src, checkpoint_id=path,
                         async_checkpointer_type=dcp.AsyncCheckpointerType[
                             kind])
    fut.result(120)
    dst = {"w": torch.zeros(3), "rng": {"state": 0, "inc": 0}}
    dcp.load(dst, checkpoint_id=path)
    assert dst["rng"] == src["rng"] and torch.equal(dst["w"], src["w"])


def test_mega_checkpoints_hold_big_ints(tmp_path):
    path = "mega://" + str(tmp_path / "mega")
    dcp.save({"a": 2**100, "l": [1, -(2**80)]}, checkpoint_id=path)
    dst = {"a": 0, "l": [0, 0]}
    dcp.load(dst, checkpoint_id=path)
    assert dst == {"a": 2**100, "l": [1, -(2**80)]}


@pytest.mark.skipif(not hasattr(sys, "set_int_max_str_digits"),
                    reason="no int/str digit limit in this Python")
def test_ints_past_the_digit_limit(ckpt):
    huge = 7 ** 10000  # 8451 decimal digits, past the default 4300
    limit = sys.get_int_max_str_digits()
    if limit == 0 or limit >= 8451:
        pytest.skip("the digit limit is off or high in this Python")
    # No decimal form: refused without allow_pickle, else pickled.
    with pytest.raises(TypeError, match=r"cannot save 'h': the int has "
                       r"more decimal digits"):
        dcp.save({"h": huge}, checkpoint_id=ckpt)
    dcp.save({"h": huge}, checkpoint_id=ckpt, allow_pickle=True)
    dst = {"h": 0}
    dcp.load(dst, checkpoint_id=ckpt, allow_pickle=True)
    assert dst["h"] == huge
    # Saved where the limit was off: a load under the limit names the key.
    other = ckpt + "-nolimit"
    sys.set_int_max_str_digits(0)
    try:
        dcp.save({"h": huge}, checkpoint_id=other)
    finally:
        sys.set_int_max_str_digits(limit)
    with pytest.raises(ValueError, match=r"'h': the saved int cannot be "
                       r"read"):
        dcp.load({"h": 0}, checkpoint_id=other)
    sys.set_int_max_str_digits(0)
    try:
        dst = {"h": 0}
        dcp.load(dst, checkpoint_id=other)
    finally:
        sys.set_int_max_str_digits(limit)
    assert dst["h"] == huge


def test_a_damaged_value_is_corrupt_data_and_a_value_error(ckpt, raw_values):
    dcp.save({"s": raw_values(_state.INT_MARKER + b"1x"),
              "p": raw_values(_state.PICKLE_MARKER + b"\x80\x04N.")},
             checkpoint_id=ckpt)
    with pytest.raises(dcp.CheckpointCorruptError) as e:
        dcp.load({"s": 0}, checkpoint_id=ckpt)
    assert isinstance(e.value, ValueError)
    assert str(e.value).startswith("'s': the saved int is damaged")
    # A pickle without allow_pickle is refused, not damaged.
    with pytest.raises(dcp.CheckpointValueError, match="'p' was saved "
                       "pickled"):
        dcp.load({"p": None}, checkpoint_id=ckpt)
