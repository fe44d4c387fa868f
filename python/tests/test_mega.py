"""MEGA checkpoints and storage chosen from the checkpoint_id, through the
C ABI's dcp_save / dcp_load (no storage object): mega://DIR saves MEGA
files, a plain path holding them loads them, a Hugging Face directory
loads by its path, and an unknown scheme is refused naming the known
ones."""

import os

import pytest

torch = pytest.importorskip("torch")

import dcp  # noqa: E402


def _state():
    g = torch.Generator().manual_seed(3)
    return {
        "w": torch.randn(33, 7, generator=g).to(torch.bfloat16),
        "b": torch.randn(7, generator=g),
        "ids": torch.arange(12, dtype=torch.int64).reshape(3, 4),
        "scalar": torch.tensor(1.5, dtype=torch.float64),
    }


def _zeros_like(state):
    return {k: torch.zeros_like(v) for k, v in state.items()}


def _assert_same(want, got):
    for k, v in want.items():
        assert torch.equal(v, got[k]), k


def test_mega_uri_saves_mega_files_and_plain_path_loads_them(ckpt):
    state = _state()
    dcp.save(state, checkpoint_id="mega://" + os.path.abspath(ckpt))
    assert sorted(os.listdir(ckpt)) == ["model.mega", "model.mega.index.json"]
    with open(os.path.join(ckpt, "model.mega"), "rb") as f:
        assert f.read(8) == b"\x89MEGA\r\n\x1a"
    for checkpoint_id in (ckpt, "mega://" + os.path.abspath(ckpt)):
        loaded = _zeros_like(state)
        dcp.load(loaded, checkpoint_id=checkpoint_id)
        _assert_same(state, loaded)


def test_hugging_face_directory_loads_by_its_path(ckpt):
    state = _state()
    dcp.save(state, storage_writer=dcp.HuggingFaceStorageWriter(ckpt))
    loaded = _zeros_like(state)
    dcp.load(loaded, checkpoint_id=ckpt)
    _assert_same(state, loaded)


def test_unknown_scheme_names_the_known_ones(ckpt):
    with pytest.raises(Exception) as info:
        dcp.save(_state(), checkpoint_id="s3://bucket/run")
    assert "mega://" in str(info.value)
