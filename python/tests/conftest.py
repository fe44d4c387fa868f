"""Test setup: the package from this checkout (python/), the library from
$DCP_LIBRARY or the build (see dcp._lib)."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import pytest  # noqa: E402


@pytest.fixture
def ckpt(tmp_path):
    """A checkpoint directory path (not created)."""
    return str(tmp_path / "ckpt")


@pytest.fixture
def per_item_lists(monkeypatch):
    """Saves lists of plain values item by item, as dcp did before it
    stored them whole (SEQ_MARKER): checkpoints of that format, which loads
    still read."""
    from dcp import _state
    monkeypatch.setattr(_state, "PACK_PLAIN_LISTS", False)


class _Raw:
    """Bytes a test stores as a value as they are (no escape)."""

    def __init__(self, raw):
        self.raw = raw


@pytest.fixture
def raw_values(monkeypatch):
    """Lets a test store bytes that start with a marker as they are (how a
    damaged or foreign checkpoint could hold a marker the package never
    writes): a save stores `raw_values(b"...")` unescaped."""
    from dcp import _lib, _state
    encode = _state.Flat._encode

    def raw_encode(self, v):
        if isinstance(v, _Raw):
            return (_lib.VALUE_BYTES, v.raw)
        return encode(self, v)
    monkeypatch.setattr(_state.Flat, "_encode", raw_encode)
    return _Raw
