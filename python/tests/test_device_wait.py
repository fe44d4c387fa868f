"""The stream rule's plumbing, testable without a GPU: save and load hand
the engine the caller's current stream (dcp_device_wait_t) through their
option structs. With host tensors there is nothing to order, so a wait is
accepted and ignored; a malformed one is refused by the engine, which
proves the field reaches it. (tests/gpu/python_cuda_check.py runs the
rule on CUDA tensors.)"""

import pytest
import torch

import dcp
from dcp import _lib, _state


def _spy(kind, seen):
    def current_streams(flat):
        seen.append(flat.load)
        wait = _lib.DeviceWait()
        wait.kind = kind
        return wait
    return current_streams


def test_load_hands_the_engine_the_current_stream(ckpt, monkeypatch):
    src = {"w": torch.arange(4.0), "n": 3}
    dcp.save(src, checkpoint_id=ckpt)
    seen = []
    monkeypatch.setattr(_state, "current_streams",
                        _spy(_lib.DEVICE_WAIT_STREAM, seen))
    dest = {"w": torch.zeros(4), "n": 0}
    dcp.load(dest, checkpoint_id=ckpt)
    assert seen == [True]
    assert dest["w"].equal(src["w"]) and dest["n"] == 3

    monkeypatch.setattr(_state, "current_streams", _spy(7, seen))
    with pytest.raises(dcp.CheckpointValueError, match="kind is 7"):
        dcp.load(dest, checkpoint_id=ckpt)


def test_save_hands_the_engine_the_current_stream(ckpt, monkeypatch):
    seen = []
    monkeypatch.setattr(_state, "current_streams", _spy(7, seen))
    with pytest.raises(dcp.CheckpointValueError, match="kind is 7"):
        dcp.save({"w": torch.ones(2)}, checkpoint_id=ckpt)
    assert seen == [False]
