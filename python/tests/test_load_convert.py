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


def test_numpy_destinations_convert(ckpt):
    w = torch.linspace(-2, 2, 6)
    dcp.save({"a": np.arange(6, dtype=np.float32),
              "b": torch.arange(3.0).to(torch.bfloat16),
              "i": np.arange(4, dtype=np.int32),
              "f8": w.to(torch.float8_e4m3fn), "t": w},
             checkpoint_id=ckpt)
    partial = dcp.DefaultLoadPlanner(allow_partial_load=True)
    a = np.zeros(6, dtype=np.float64)
    b = np.zeros(3, dtype=np.float32)  # from bf16, which numpy lacks
    i = np.zeros(4, dtype=np.int64)  # through a numpy temporary
    dcp.load({"a": a, "b": b, "i": i}, checkpoint_id=ckpt, planner=partial)
    assert (a == np.arange(6)).all()
    assert (b == np.arange(3)).all()
    assert (i == np.arange(4)).all()
    # numpy has no float8 to load through: the load refuses, naming it,
    # also when a torch tensor of the same load converts in the engine.
    f8 = np.zeros(6, dtype=np.float32)
    t = torch.zeros(6, dtype=torch.float64)
    with pytest.raises(dcp.CheckpointValueError,
                       match=r'"f8": the state dict has dtype F32 but the '
                       r'checkpoint has F8_E4M3'):
        dcp.load({"f8": f8, "t": t}, checkpoint_id=ckpt, planner=partial)
    assert (f8 == 0).all()


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


_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_BITS = {torch.float16: torch.int16, torch.bfloat16: torch.int16,
         torch.float32: torch.int32, torch.float64: torch.int64}


def _every_kind_of_value(dtype, n=4096):
    """Random bit patterns of `dtype` (subnormals, NaNs, infinities, huge
    values and rounding ties among them) and the named special values."""
    g = torch.Generator().manual_seed(7)
    bits = _BITS[dtype]
    info = torch.iinfo(bits)
    raw = torch.randint(info.min, info.max, (n,), generator=g, dtype=bits)
    fi = torch.finfo(dtype)
    special = torch.tensor(
        [0.0, -0.0, float("inf"), float("-inf"), float("nan"), fi.max,
         -fi.max, fi.tiny, fi.smallest_normal / 3, 1.0 + fi.eps / 2, 65520.0,
         1e-8, 3.0e38], dtype=torch.float64).to(dtype)
    return torch.cat([raw.view(dtype), special])


@pytest.mark.parametrize("saved", _FLOATS, ids=str)
def test_engine_conversions_match_torch_copy(ckpt, saved):
    """Every value converts as torch's copy_ converts it (NaN stays NaN;
    its payload is not compared)."""
    src = _every_kind_of_value(saved)
    dcp.save({"x": src, "grid": src[:1024].reshape(32, 32)},
             checkpoint_id=ckpt)
    for dest in _FLOATS:
        if dest == saved:
            continue
        out = {"x": torch.zeros(src.shape, dtype=dest),
               # A strided destination: the transpose of a buffer.
               "grid": torch.zeros(32, 32, dtype=dest).t()}
        dcp.load(out, checkpoint_id=ckpt)
        for name, want in (("x", src.to(dest)),
                           ("grid", src[:1024].reshape(32, 32).to(dest))):
            got = out[name]
            nan = torch.isnan(want)
            assert torch.equal(torch.isnan(got), nan), (saved, dest, name)
            assert torch.equal(got[~nan].view(_BITS[dest]),
                               want[~nan].view(_BITS[dest])), \
                (saved, dest, name)


MEMORY_SCRIPT = r"""
import resource, sys
sys.path.insert(0, sys.argv[2])
import torch
import dcp

out = {f"w{i}": torch.ones(1 << 23) for i in range(24)}  # 768 MiB F32
dcp.library_version()
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
dcp.load(out, checkpoint_id=sys.argv[1])
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
assert all(torch.equal(t[:: 1 << 16], torch.full((128,), float(i) / 8))
           for i, t in enumerate(out.values())), "wrong values"
print(f"{base:.0f} {peak:.0f}")
"""


def test_a_converting_load_holds_a_window_of_temporaries(tmp_path):
    """Loading 384 MiB of bf16 tensors into fp32 ones holds a read window
    of temporaries at a time (under +192 MiB peak RSS), not all of them
    (+384 MiB), measured in a fresh process."""
    import subprocess
    import sys
    ckpt = str(tmp_path / "ckpt")
    dcp.save({f"w{i}": torch.full((1 << 23,), i / 8, dtype=torch.bfloat16)
              for i in range(24)}, checkpoint_id=ckpt)
    here = os.path.dirname(os.path.abspath(__file__))
    run = subprocess.run(
        [sys.executable, "-c", MEMORY_SCRIPT, ckpt, os.path.dirname(here)],
        capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    base, peak = map(float, run.stdout.split())
    assert peak - base < 192, f"+{peak - base:.0f} MiB peak RSS"


@pytest.mark.parametrize("shape", [(), (1,), (3, 5), (1000, 7)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32,
                                   torch.int64, torch.float8_e4m3fn])
def test_device_conversion_temporaries_are_page_aligned(shape, dtype):
    # What a load into a CUDA tensor of another dtype reads into: O_DIRECT
    # reads go straight into it only if it starts on a 4 KiB boundary.
    from dcp._state import _aligned_host_empty
    t = _aligned_host_empty(shape, dtype)
    assert t.device.type == "cpu" and t.dtype == dtype
    assert tuple(t.shape) == shape and t.is_contiguous()
    assert t.data_ptr() % 4096 == 0
    t.fill_(1)
    assert bool((t == 1).all())
