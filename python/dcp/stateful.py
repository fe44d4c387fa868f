"""Stateful: objects that save and load through state_dict() and
load_state_dict(), as in the seed. A top-level value of the state dict that
has both is saved as its state_dict() and, on load, loaded into that dict
and handed to its load_state_dict()."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

__all__ = ["Stateful"]


@runtime_checkable
class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]:
        ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        ...


def is_stateful(value, load: bool) -> bool:
    """A top-level value dcp calls (tensors and containers never are): for
    a save, one with state_dict() (the seed's saver); for a load, one with
    load_state_dict() too."""
    if isinstance(value, (dict, list, tuple)):
        return False
    try:
        import torch
        if isinstance(value, torch.Tensor):
            return False
    except ImportError:
        pass
    if not callable(getattr(value, "state_dict", None)):
        return False
    return not load or callable(getattr(value, "load_state_dict", None))
