"""FileSystemWriter(serialization_format=SAFETENSORS): every data file dcp
writes opens with the reference `safetensors` library and holds the saved
arrays bit for bit, and dcp loads the checkpoint back."""

import glob
import os

import numpy as np
import pytest

st_numpy = pytest.importorskip("safetensors.numpy")
from safetensors import safe_open  # noqa: E402

import dcp  # noqa: E402


def _state():
    rng = np.random.default_rng(3)
    state = {
        "f32": rng.standard_normal((4, 5)).astype(np.float32),
        "f64": rng.standard_normal(7),
        "f16": rng.standard_normal((2, 3)).astype(np.float16),
        "i8": np.arange(-5, 5, dtype=np.int8),
        "u8": np.arange(9, dtype=np.uint8).reshape(3, 3),
        "i16": np.arange(-6, 6, dtype=np.int16),
        "u16": np.arange(6, dtype=np.uint16),
        "i32": np.arange(-4, 8, dtype=np.int32).reshape(3, 4),
        "u32": np.arange(5, dtype=np.uint32),
        "i64": np.arange(-3, 3, dtype=np.int64),
        "u64": np.arange(4, dtype=np.uint64),
        "mask": rng.random(6) > 0.5,
        "scalar": np.array(2.5, dtype=np.float64),
        "empty": np.zeros((0, 4), dtype=np.float32),
    }
    return state


def _data_files(ckpt):
    files = sorted(glob.glob(os.path.join(ckpt, "*.distcp")))
    assert files
    return files


@pytest.mark.parametrize("thread_count", [1, 3])
def test_every_data_file_is_safetensors(ckpt, thread_count):
    state = _state()
    writer = dcp.FileSystemWriter(
        ckpt, thread_count=thread_count,
        serialization_format=dcp.SerializationFormat.SAFETENSORS)
    dcp.save(dict(state, step=7), storage_writer=writer)
    files = _data_files(ckpt)
    assert len(files) == thread_count
    seen = {}
    for path in files:
        loaded = st_numpy.load_file(path)
        with safe_open(path, framework="np") as f:
            assert f.metadata() == {"format": "pt"}
            assert sorted(f.keys()) == sorted(loaded)
        for name, array in loaded.items():
            assert name not in seen
            seen[name] = array
    # The non-tensor value is stored as a 1-D uint8 tensor.
    assert seen.pop("step").dtype == np.uint8
    assert sorted(seen) == sorted(state)
    for name, want in state.items():
        got = seen[name]
        assert got.dtype == want.dtype, name
        assert got.shape == want.shape, name
        assert got.tobytes() == want.tobytes(), name

    out = {name: np.zeros_like(v) for name, v in state.items()}
    out["step"] = 0
    dcp.load(out, checkpoint_id=ckpt)
    assert out["step"] == 7
    for name, want in state.items():
        assert out[name].tobytes() == want.tobytes(), name


def test_torch_dtypes_read_by_the_reference(ckpt):
    torch = pytest.importorskip("torch")
    st_torch = pytest.importorskip("safetensors.torch")
    g = torch.Generator().manual_seed(5)
    state = {
        "bf16": torch.randn(3, 4, generator=g).to(torch.bfloat16),
        "e4m3": torch.randn(8, generator=g).to(torch.float8_e4m3fn),
        "e5m2": torch.randn(2, 2, generator=g).to(torch.float8_e5m2),
    }
    dcp.save(state, storage_writer=dcp.FileSystemWriter(
        ckpt, serialization_format=dcp.SerializationFormat.SAFETENSORS))
    (path,) = _data_files(ckpt)
    loaded = st_torch.load_file(path)
    assert sorted(loaded) == sorted(state)
    for name, want in state.items():
        assert loaded[name].dtype == want.dtype
        assert torch.equal(loaded[name].view(torch.uint8),
                           want.view(torch.uint8)), name


def test_compression_with_safetensors_is_refused(ckpt):
    writer = dcp.FileSystemWriter(
        ckpt, compression="zstd",
        serialization_format=dcp.SerializationFormat.SAFETENSORS)
    with pytest.raises(Exception, match="safetensors"):
        dcp.save({"a": np.ones(100000, dtype=np.float32)},
                 storage_writer=writer)
    assert not os.path.exists(os.path.join(ckpt, ".metadata"))


def test_native_default_is_not_safetensors(ckpt):
    assert dcp.FileSystemWriter(ckpt).serialization_format is \
        dcp.SerializationFormat.TORCH_SAVE
    dcp.save({"a": np.arange(4, dtype=np.float32)}, checkpoint_id=ckpt)
    (path,) = _data_files(ckpt)
    with pytest.raises(Exception):
        st_numpy.load_file(path)
