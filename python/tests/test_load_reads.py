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
