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
