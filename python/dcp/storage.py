"""FileSystemWriter / FileSystemReader: the seed's storage classes, as
option holders for the C ABI's file-system writer and reader.

Each save or load creates its own C writer/reader from these options (and
frees it afterwards), so one Python object may serve consecutive and
concurrent saves. The seed's options that the engine has no use for are
accepted and documented below; the ones it cannot honour raise.
"""

from __future__ import annotations

import ctypes
import enum
import os

from . import _lib

__all__ = ["FileSystemWriter", "FileSystemReader", "SerializationFormat"]

_SEED_COPY_AHEAD = 10_000_000


class SerializationFormat(enum.Enum):
    """The seed's choice of data file encoding. dcp writes its own format
    (docs/FORMAT.md) for TORCH_SAVE, the default; SAFETENSORS is not
    supported."""
    TORCH_SAVE = "torch_save"
    SAFETENSORS = "safetensors"


class FileSystemWriter:
    """Writes a checkpoint into the directory `path`.

    single_file_per_rank: one data file per rank and writer thread (True)
      or one per item (False).
    sync_files: fsync data, metadata and directory before the commit.
    thread_count: writer threads (data files per rank).
    per_thread_copy_ahead: bytes each thread stages ahead; the seed's
      default (10_000_000) leaves the engine's own default.
    cache_staged_state_dict: accepted; the engine's async stager keeps its
      staging buffers between saves in any case.
    overwrite: False refuses a directory that holds a checkpoint
      (CheckpointExistsError).
    _extensions: must be None (stream transforms are not supported).
    serialization_format: TORCH_SAVE (dcp's format); SAFETENSORS raises.
    direct_io (dcp only, keyword): O_DIRECT data writes; None = the
      engine's default (on, with a buffered fallback where refused).
    """

    def __init__(self, path, single_file_per_rank: bool = True,
                 sync_files: bool = True, thread_count: int = 1,
                 per_thread_copy_ahead: int = _SEED_COPY_AHEAD,
                 cache_staged_state_dict: bool = False,
                 overwrite: bool = True, _extensions=None,
                 serialization_format: SerializationFormat =
                 SerializationFormat.TORCH_SAVE, *, direct_io=None):
        if _extensions:
            raise NotImplementedError(
                "FileSystemWriter: stream transform _extensions are not "
                "supported by dcp")
        if serialization_format is not SerializationFormat.TORCH_SAVE:
            raise NotImplementedError(
                f"FileSystemWriter: serialization_format "
                f"{serialization_format} is not supported (dcp writes its "
                "own format)")
        if thread_count < 1:
            raise ValueError(f"thread_count must be >= 1, not {thread_count}")
        self.path = os.fspath(path)
        self.single_file_per_rank = bool(single_file_per_rank)
        self.sync_files = bool(sync_files)
        self.thread_count = int(thread_count)
        self.per_thread_copy_ahead = int(per_thread_copy_ahead)
        self.cache_staged_state_dict = bool(cache_staged_state_dict)
        self.overwrite = bool(overwrite)
        self.serialization_format = serialization_format
        self.direct_io = direct_io

    @property
    def checkpoint_id(self):
        return self.path

    def reset(self, checkpoint_id=None) -> None:
        """The seed's reset: points the writer at `checkpoint_id` when
        given. (Each save draws a fresh save id anyway.)"""
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        try:
            os.fspath(checkpoint_id)
            return True
        except TypeError:
            return False

    def _options(self) -> _lib.FsWriterOptions:
        copy_ahead = self.per_thread_copy_ahead
        return _lib.sized(
            _lib.FsWriterOptions,
            single_file_per_rank=_lib.flag(self.single_file_per_rank),
            sync_files=_lib.flag(self.sync_files),
            thread_count=self.thread_count,
            overwrite=_lib.flag(self.overwrite),
            per_thread_copy_ahead=(0 if copy_ahead == _SEED_COPY_AHEAD
                                   else copy_ahead),
            direct_io=_lib.flag(self.direct_io))

    def _create(self, path=None) -> ctypes.c_void_p:
        """A new dcp_storage_writer_t (the caller frees it)."""
        handle = ctypes.c_void_p()
        options = self._options()
        _lib.check(_lib.lib().dcp_fs_writer_create(
            os.fspath(path if path is not None else self.path).encode(),
            ctypes.byref(options), ctypes.byref(handle)))
        return handle

    def _spec(self):
        """Picklable options (the PROCESS writer rebuilds the writer)."""
        return dict(path=self.path,
                    single_file_per_rank=self.single_file_per_rank,
                    sync_files=self.sync_files,
                    thread_count=self.thread_count,
                    per_thread_copy_ahead=self.per_thread_copy_ahead,
                    overwrite=self.overwrite, direct_io=self.direct_io)

    def __repr__(self):
        return f"FileSystemWriter({self.path!r})"


class FileSystemReader:
    """Reads the checkpoint in directory `path`.

    _extension_registry: must be None. thread_count and direct_io (dcp only,
    keywords): reader threads, and O_DIRECT reads (None: the engine's
    default).
    """

    def __init__(self, path, _extension_registry=None, *,
                 thread_count: int = 1, direct_io=None):
        if _extension_registry is not None:
            raise NotImplementedError(
                "FileSystemReader: _extension_registry is not supported by "
                "dcp")
        if thread_count < 1:
            raise ValueError(f"thread_count must be >= 1, not {thread_count}")
        self.path = os.fspath(path)
        self.thread_count = int(thread_count)
        self.direct_io = direct_io

    @property
    def checkpoint_id(self):
        return self.path

    def reset(self, checkpoint_id=None) -> None:
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return FileSystemWriter.validate_checkpoint_id(checkpoint_id)

    def read_metadata(self):
        """The checkpoint's Metadata (see dcp.read_metadata)."""
        from .metadata import read_metadata
        return read_metadata(self.path)

    def _create(self, path=None) -> ctypes.c_void_p:
        handle = ctypes.c_void_p()
        options = _lib.sized(_lib.FsReaderOptions,
                             thread_count=self.thread_count,
                             direct_io=_lib.flag(self.direct_io))
        _lib.check(_lib.lib().dcp_fs_reader_create(
            os.fspath(path if path is not None else self.path).encode(),
            ctypes.byref(options), ctypes.byref(handle)))
        return handle

    def __repr__(self):
        return f"FileSystemReader({self.path!r})"
