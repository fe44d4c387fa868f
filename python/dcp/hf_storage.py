"""torch.distributed.checkpoint.hf_storage's names in dcp (they live in
dcp.storage)."""

from .storage import HuggingFaceStorageReader, HuggingFaceStorageWriter

__all__ = ["HuggingFaceStorageWriter", "HuggingFaceStorageReader"]
