"""torch.distributed.checkpoint.staging's names in dcp (the stager lives
in dcp.stager): `from dcp.staging import DefaultStager, StagingOptions`, and torch's
AsyncStager protocol and BlockingAsyncStager."""

from .stager import (AsyncStager, BlockingAsyncStager, DefaultStager,
                     StagingOptions)

__all__ = ["AsyncStager", "BlockingAsyncStager", "DefaultStager",
           "StagingOptions"]
