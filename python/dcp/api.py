"""torch.distributed.checkpoint.api's name in dcp."""

from .errors import CheckpointException

__all__ = ["CheckpointException"]
