"""A load into tensors of another dtype than the checkpoint's converts, as
torch's DCP does with copy_: through a temporary of the saved dtype."""

import os

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import dcp


def test_loads_convert_between_dtypes(ckpt):
    w = torch.linspace(-3, 3, 24).reshape(4, 6)
    dcp.save({"f32": w, "bf16": w.to(torch.bfloat16),
              "i64": torch.arange(-5, 5), "f64": w.double()},
             checkpoint_id=ckpt)
    out = {"f32": torch.zeros(4, 6, dtype=torch.bfloat16),
           "bf16": torch.zeros(4, 6),
           "i64": torch.zeros(10, dtype=torch.int32),
           "f64": torch.zeros(4, 6, dtype=torch.float16)}
    ptrs = {k: v.data_ptr() for k, v in out.items()}
    dcp.load(out, checkpoint_id=ckpt)
    assert out["f32"].dtype == torch.bfloat16  # in place, own dtype
    assert torch.equal(out["f32"], w.to(torch.bfloat16))
    assert torch.equal(out["bf16"], w.to(torch.bfloat16).float())
    assert torch.equal(out["i64"], torch.arange(-5, 5, dtype=torch.int32))
    assert torch.equal(out["f64"], w.double().half())
    assert {k: v.data_ptr() for k, v in out.items()} == ptrs


def test_converting_load_into_strided_views_and_nested_keys(ckpt):
    w = torch.arange(12.0).reshape(3, 4)
    dcp.save({"m": {"w": w, "same": torch.ones(3)}}, checkpoint_id=ckpt)
    base = torch.zeros(4, 3, dtype=torch.float64)
    view = base.t()  # 3x4, not contiguous
    same = torch.zeros(3)
    dcp.load({"m": {"w": view, "same": same}}, checkpoint_id=ckpt)
    assert torch.equal(base, w.double().t())
    assert torch.equal(same, torch.ones(3))


def test_converted_destinations_count_as_modified_by_autograd(ckpt):
    dcp.save({"p": torch.full((3,), 2.0, dtype=torch.bfloat16)},
             checkpoint_id=ckpt)
    p = torch.ones(3, requires_grad=True)
    loss = (p * p).sum()
    dcp.load({"p": p}, checkpoint_id=ckpt)
    assert torch.equal(p.detach(), torch.full((3,), 2.0))
    with pytest.raises(RuntimeError, match="modified by an inplace"):
        loss.backward()


def test_numpy_destinations_convert_where_numpy_has_the_dtype(ckpt):
    dcp.save({"a": np.arange(6, dtype=np.float32),
              "b": torch.arange(3.0).to(torch.bfloat16)}, checkpoint_id=ckpt)
    a = np.zeros(6, dtype=np.float64)
    dcp.load({"a": a}, checkpoint_id=ckpt,
             planner=dcp.DefaultLoadPlanner(allow_partial_load=True))
    assert (a == np.arange(6)).all()
    # numpy has no bfloat16 to load through: the load refuses, naming it.
    b = np.zeros(3, dtype=np.float32)
    with pytest.raises(dcp.CheckpointValueError,
                       match=r'"b": the state dict has dtype F32 but the '
                       r'checkpoint has BF16'):
        dcp.load({"b": b}, checkpoint_id=ckpt,
                 planner=dcp.DefaultLoadPlanner(allow_partial_load=True))
    assert (b == 0).all()


def test_hugging_face_weights_convert_with_and_without_a_reader(tmp_path):
    d = str(tmp_path / "hf")
    os.makedirs(d)
    w = torch.linspace(0, 1, 8).to(torch.bfloat16)
    save_file({"w": w}, os.path.join(d, "model.safetensors"))
    for reader in (None, dcp.HuggingFaceStorageReader(d)):
        out = {"w": torch.zeros(8)}
        dcp.load(out, checkpoint_id=d, storage_reader=reader)
        assert torch.equal(out["w"], w.float())


def test_shape_mismatches_still_fail_before_writing(ckpt):
    dcp.save({"w": torch.ones(4), "v": torch.ones(2)}, checkpoint_id=ckpt)
    w = torch.zeros(5, dtype=torch.float64)
    v = torch.zeros(2, dtype=torch.float64)
    with pytest.raises(dcp.CheckpointValueError, match=r'"w".*shape'):
        dcp.load({"v": v, "w": w}, checkpoint_id=ckpt)
    assert torch.equal(v, torch.zeros(2, dtype=torch.float64))
