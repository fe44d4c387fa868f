"""torch.dtype, torch.device and complex values (common in a training run's
configuration) saved and loaded without pickle, behind their markers
(_state.TORCH_DTYPE_MARKER, TORCH_DEVICE_MARKER, COMPLEX_MARKER)."""

import math
import pickle

import pytest
import torch
import torch.distributed.checkpoint as tdcp

import dcp
import dcp.format_utils
from dcp import _state

DTYPES = sorted({v for v in vars(torch).values()
                 if isinstance(v, torch.dtype)}, key=str)
DEVICES = [torch.device("cpu"), torch.device("cuda"), torch.device("cuda", 3),
           torch.device("meta")]
COMPLEXES = [1.5 - 2j, complex(0, -0.0), complex(math.inf, -math.inf), 0j]


@pytest.fixture
def no_pickle(monkeypatch):
    """Makes any pickling or unpickling fail the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("typed values went through pickle")
    for name in ("loads", "load", "dumps", "dump", "Unpickler", "Pickler"):
        monkeypatch.setattr(pickle, name, refuse)


def test_dtypes_devices_and_complex_round_trip_without_pickle(ckpt,
                                                              no_pickle):
    config = {"dtypes": list(DTYPES), "devices": list(DEVICES),
              "z": list(COMPLEXES), "nan": complex(math.nan, 1.0),
              "param_dtype": torch.bfloat16, "w": torch.ones(2)}
    dcp.save({"config": config}, checkpoint_id=ckpt)
    dst = {"config": {"dtypes": [None] * len(DTYPES),
                      "devices": [None] * len(DEVICES),
                      "z": [0j] * len(COMPLEXES), "nan": 0j,
                      "param_dtype": torch.float32, "w": torch.zeros(2)}}
    dcp.load(dst, checkpoint_id=ckpt)
    loaded = dst["config"]
    assert loaded["dtypes"] == DTYPES
    assert loaded["devices"] == DEVICES
    assert all(type(a) is complex and
               (a.real, a.imag) == (b.real, b.imag) and
               math.copysign(1, a.imag) == math.copysign(1, b.imag)
               for a, b in zip(loaded["z"], COMPLEXES))
    assert math.isnan(loaded["nan"].real) and loaded["nan"].imag == 1.0
    assert loaded["param_dtype"] is torch.bfloat16
    # Into nothing (no destination to say the types) too.
    everything = dcp.format_utils.load_all(ckpt)["config"]
    assert everything["dtypes"] == DTYPES
    assert everything["devices"] == DEVICES
    assert everything["param_dtype"] is torch.bfloat16


def test_they_load_as_torchs_dcp_saves_them(tmp_path):
    # torch's DCP pickles them; the values dcp gives back are the same.
    state = {"dtype": torch.float16, "device": torch.device("cuda", 1),
             "z": 2 + 3j}
    dcp.save(state, checkpoint_id=str(tmp_path / "dcp"))
    tdcp.save(state, checkpoint_id=str(tmp_path / "torch"), no_dist=True)
    ours = {k: None for k in state}
    theirs = {k: None for k in state}
    dcp.load(ours, checkpoint_id=str(tmp_path / "dcp"))
    tdcp.load(theirs, checkpoint_id=str(tmp_path / "torch"), no_dist=True)
    assert ours == theirs == state


@pytest.mark.parametrize("marker,payload,what", [
    (_state.TORCH_DTYPE_MARKER, b"not_a_dtype", "torch.dtype"),
    (_state.TORCH_DTYPE_MARKER, b"Tensor", "torch.dtype"),  # not a dtype
    (_state.TORCH_DTYPE_MARKER, b"float32.__class__", "torch.dtype"),
    (_state.TORCH_DTYPE_MARKER, b"", "torch.dtype"),
    (_state.TORCH_DTYPE_MARKER, b"\xff", "torch.dtype"),
    (_state.TORCH_DEVICE_MARKER, b"nonsense:x", "torch.device"),
    (_state.TORCH_DEVICE_MARKER, b"", "torch.device"),
    (_state.TORCH_DEVICE_MARKER, b"cuda:\xff", "torch.device"),
    (_state.COMPLEX_MARKER, b"\x00" * 15, "complex"),
    (_state.COMPLEX_MARKER, b"\x00" * 17, "complex"),
])
def test_a_damaged_typed_value_raises_naming_the_key(ckpt, raw_values,
                                                     marker, payload, what):
    dcp.save({"w": torch.ones(2), "cfg": [1, raw_values(marker + payload)]},
             checkpoint_id=ckpt)
    dst = {"w": torch.zeros(2), "cfg": [0, None]}
    with pytest.raises(ValueError, match=rf"'cfg\.1': the saved {what}"):
        dcp.load(dst, checkpoint_id=ckpt)
    assert dst["cfg"] == [0, None] and not dst["w"].any()
