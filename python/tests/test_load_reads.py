"""How a load reads: buffered when most destination bytes are host memory
that O_DIRECT cannot read into (not 4 KiB aligned, as torch's CPU tensors
are), O_DIRECT otherwise or when asked; every way loads the same bytes."""

import numpy as np
import pytest
import torch

import dcp
from dcp import _lib, _state


def _views(nbytes):
    """A 4 KiB aligned and an unaligned uint8 array of nbytes each."""
    buf = np.zeros(2 * nbytes + 3 * 4096, dtype=np.uint8)
    start = (-buf.ctypes.data) % 4096
    aligned = buf[start:start + nbytes]
    unaligned = buf[start + nbytes + 4096 + 64:][:nbytes]
    return aligned, unaligned


def _prefers_buffered(state):
    flat = _state.Flat(load=True, allow_pickle=False)
    flat.add(state)
    sd = flat.build()
    _lib.lib().dcp_state_dict_free(sd)
    return flat.prefers_buffered_reads()


def test_the_choice_follows_the_destination_bytes():
    aligned, unaligned = _views(1 << 20)
    assert _prefers_buffered({"a": unaligned})
    assert not _prefers_buffered({"a": aligned})
    small_aligned, small_unaligned = _views(1 << 10)
    assert not _prefers_buffered({"a": aligned, "b": small_unaligned})
    assert _prefers_buffered({"a": small_aligned, "b": unaligned})
    assert not _prefers_buffered({"n": 3})  # no tensor: the default


@pytest.mark.parametrize("direct_io", [None, True, False])
def test_every_read_mode_loads_the_same_bytes(ckpt, direct_io):
    g = torch.Generator().manual_seed(3)
    src = {"w": torch.randn(1000, 300, generator=g),
           "b": torch.randint(0, 255, (5000,), dtype=torch.uint8,
                              generator=g)}
    dcp.save(src, checkpoint_id=ckpt)
    aligned, unaligned = _views(5000)
    dest = {"w": torch.zeros(1000, 300), "b": torch.from_numpy(unaligned)}
    dcp.load(dest, storage_reader=dcp.FileSystemReader(
        ckpt, direct_io=direct_io))
    assert dest["w"].equal(src["w"]) and dest["b"].equal(src["b"])
    dest = {"w": torch.zeros(1000, 300), "b": torch.from_numpy(aligned)}
    dcp.load(dest, checkpoint_id=ckpt)
    assert dest["w"].equal(src["w"]) and dest["b"].equal(src["b"])


def test_a_load_with_plain_values_reads_the_metadata_once(ckpt, monkeypatch):
    # The plain values load first, then everything (see checkpoint.py):
    # both steps plan against the one metadata read before them.
    src = {"w": torch.arange(12.0), "step": 7, "name": "run-1"}
    dcp.save(src, checkpoint_id=ckpt)
    L = _lib.lib()
    real_load, real_read = L.dcp_load, L.dcp_storage_reader_read_metadata
    given, reads = [], []

    def load(sd, options):
        given.append(options._obj.metadata)
        return real_load(sd, options)

    def read(*args):
        reads.append(args)
        return real_read(*args)

    monkeypatch.setattr(L, "dcp_load", load)
    monkeypatch.setattr(L, "dcp_storage_reader_read_metadata", read)
    dest = {"w": torch.zeros(12), "step": 0, "name": ""}
    dcp.load(dest, checkpoint_id=ckpt)
    assert dest["w"].equal(src["w"]) and dest["step"] == 7 and \
        dest["name"] == "run-1"
    assert len(reads) == 1 and len(given) == 2
    assert given[0] is not None and given[0] == given[1]

    # A metadata file that no longer decodes: each step reads it and the
    # load fails naming it, as without the read before.
    with open(f"{ckpt}/.metadata", "wb") as f:
        f.write(b"not a checkpoint")
    given.clear()
    with pytest.raises(dcp.CheckpointException, match=r"\.metadata"):
        dcp.load(dest, checkpoint_id=ckpt)
    assert given and all(g is None for g in given)
    assert dest["step"] == 7


def test_contiguous_run_bytes_of_strided_layouts():
    """The rule that sends a load into a strided device tensor through a
    contiguous temporary: the bytes adjacent from a run's start."""
    from dcp._state import contiguous_run_bytes
    t = torch.zeros(64, 128)
    assert contiguous_run_bytes(t.shape, t.stride(), 4) == 64 * 128 * 4
    assert contiguous_run_bytes(t.t().shape, t.t().stride(), 4) == 4
    assert contiguous_run_bytes(t[:, :32].shape, t[:, :32].stride(), 4) \
        == 32 * 4
    u = torch.zeros(8, 1, 16)[::2]
    assert contiguous_run_bytes(u.shape, u.stride(), 4) == 16 * 4


def test_a_save_or_load_during_cuda_graph_capture_is_refused(monkeypatch):
    """The engine's allocations, synchronizations and events would break a
    capture: a state with CUDA tensors on a device whose current stream is
    capturing is refused before anything runs, naming the device."""
    import contextlib
    import types
    from dcp import _state
    monkeypatch.setattr(torch.cuda, "device",
                        lambda d: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing",
                        lambda: True)
    flat = types.SimpleNamespace(has_cuda=True, cuda_devices={1})
    with pytest.raises(RuntimeError, match=r"cuda:1 tensors while a CUDA "
                       r"graph is being captured"):
        _state.current_streams(flat)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing",
                        lambda: False)
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda d: types.SimpleNamespace(cuda_stream=7))
    wait = _state.current_streams(flat)
    assert wait.device == 1 and wait.handle == 7
