"""torch.distributed.checkpoint.filesystem's names in dcp (the storage
classes live in dcp.storage)."""

from .interfaces import FileSystem, FileSystemBase
from .storage import FileSystemReader, FileSystemWriter, SerializationFormat

__all__ = ["FileSystemWriter", "FileSystemReader", "FileSystem",
           "FileSystemBase", "SerializationFormat"]
