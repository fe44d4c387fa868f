"""torch.distributed.checkpoint.staging's names in dcp (the stager lives
in dcp.stager): `from dcp.staging import DefaultStager, StagingOptions`."""

from .stager import DefaultStager, StagingOptions

__all__ = ["DefaultStager", "StagingOptions"]
