"""The seed's storage classes (FileSystemWriter / FileSystemReader,
HuggingFaceStorageWriter / HuggingFaceStorageReader,
QuantizedHuggingFaceStorageReader, MegaStorageWriter / MegaStorageReader),
as option holders for the C ABI's writers and readers.

Each save or load creates its own C writer/reader from these options (and
frees it afterwards), so one Python object may serve consecutive and
concurrent saves. The seed's options that the engine has no use for are
accepted and documented below; the ones it cannot honour raise.
"""

from __future__ import annotations

import ctypes
import enum
import operator
import os
import pathlib

from . import _lib, errors
from .extensions import ExtensionRegistry, ZStandard, compression_of
from .interfaces import StorageReader, StorageWriter, check_storage

__all__ = ["FileSystemWriter", "FileSystemReader", "SerializationFormat",
           "HuggingFaceStorageWriter", "HuggingFaceStorageReader",
           "QuantizedHuggingFaceStorageReader", "MegaStorageWriter",
           "MegaStorageReader", "StorageWriter", "StorageReader"]

_SEED_COPY_AHEAD = 10_000_000


class SerializationFormat(enum.Enum):
    """The seed's choice of data file encoding. TORCH_SAVE (the default):
    dcp's own format (docs/FORMAT.md). SAFETENSORS: every data file is also
    a valid safetensors file (tensors named by fqn, chunks `fqn@o0,o1,...`,
    non-tensor values as 1-D uint8), which dcp still loads with resharding
    and checksums (docs/FORMAT.md section 2.1)."""
    TORCH_SAVE = "torch_save"
    SAFETENSORS = "safetensors"


# The most threads an engine pool may be asked for (kMaxThreadCount in
# capi/internal/options.cc), and the engine's other limits on options.
_MAX_THREADS = 1024
_MAX_COPY_AHEAD = 1 << 40
_MAX_CHECKSUM_BLOCK = 1 << 30  # kMaxChecksumBlockSize (io/metadata_format.h)
_INT64_MAX = (1 << 63) - 1


def _int_option(owner: str, name: str, value, low: int, high: int = _INT64_MAX,
                *, none_ok: bool = False):
    """`value` of the int option `name` of `owner` (a class name), checked
    here as the engine would check it at save or load time: TypeError for
    a value that is not an int (a float, a str, a bool), ValueError
    outside [low, high]; both name the option as Python passes it. None
    passes where `none_ok` (the engine's default)."""
    if value is None and none_ok:
        return None
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(
            f"{owner}: {name} must be an int{' or None' if none_ok else ''}"
            f", not {type(value).__name__} ({value!r})")
    value = operator.index(value)
    if value < low:
        raise ValueError(f"{owner}({name}={value}): {name} must be >= {low}")
    if value > high:
        raise ValueError(
            f"{owner}({name}={value}): {name} must be at most {high}")
    return value


def _threads(owner: str, name: str, value) -> int:
    return _int_option(owner, name, value, 1, _MAX_THREADS)


def _path(owner: str, path) -> str:
    """A storage object's directory: errors.checked_path naming `path`."""
    return errors.checked_path(path, f"{owner}: path")


def _fs_path(owner: str, path) -> pathlib.Path:
    """A FileSystem class's directory as a pathlib.Path; "" (which Path
    would make ".", the working directory) raises
    CheckpointIdMissingError."""
    text = _path(owner, path)
    if not text:
        raise errors.CheckpointIdMissingError(
            f"{owner}: path is empty; pass the checkpoint's directory")
    return pathlib.Path(text)


class _Storage:
    """What every storage class shares: the directory `path`, which is the
    checkpoint_id, and the seed's reset / validate_checkpoint_id."""

    path: str | pathlib.Path

    # The type `path` holds: a str, or pathlib.Path for the FileSystem
    # classes (as the seed's FileSystemWriter/Reader hold theirs).
    _path_type = str

    @property
    def checkpoint_id(self):
        return self.path

    def reset(self, checkpoint_id=None) -> None:
        """The seed's reset: points the storage at `checkpoint_id` when
        given and not empty. (Each save draws a fresh save id anyway.)"""
        if checkpoint_id is not None:
            text = errors.checked_path(checkpoint_id, "checkpoint_id")
            if text:  # as the seed's: an empty id leaves the path
                self.path = self._path_type(text)

    # The URL scheme of ids this class takes besides paths ("mega://").
    _scheme = None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        """Whether `checkpoint_id` is a local path this class can take: as
        torch's, False for a URL (`s3://...`), which needs other storage
        (the MEGA classes take `mega://DIR`)."""
        try:
            text = os.fspath(checkpoint_id)
        except TypeError:
            return False
        if isinstance(text, bytes):
            text = os.fsdecode(text)
        if cls._scheme is not None and text.startswith(cls._scheme):
            return True
        return "://" not in text


def _check_mapping(fqn_to_index_mapping):
    """A writer's fqn_to_index_mapping as a dict (None when empty); raises
    for a key that is not a str or an index that is not an int >= 1."""
    mapping = dict(fqn_to_index_mapping or {})
    for fqn, index in mapping.items():
        if not isinstance(fqn, str):
            raise TypeError(f"fqn_to_index_mapping key {fqn!r} is not a str")
        if isinstance(index, bool) or not isinstance(index, int) or index < 1:
            raise ValueError(f"fqn_to_index_mapping[{fqn!r}] is {index!r}; "
                             "file indices are ints >= 1")
    return mapping or None


def _mapping_arrays(mapping):
    """(fqns, file_indices, num_mappings) of the C options structs; the
    arrays must outlive the create call."""
    mapping = mapping or {}
    fqns = (ctypes.c_char_p * max(len(mapping), 1))(
        *[k.encode() for k in mapping])
    indices = (ctypes.c_int32 * max(len(mapping), 1))(*mapping.values())
    return fqns, indices, len(mapping)


class FileSystemWriter(_Storage):
    """Writes a checkpoint into the directory `path` (held as a
    pathlib.Path, as the seed's writer holds it).

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
    _extensions: None, or [dcp.ZStandard(level)] (dcp.extensions), the
      same as compression="zstd[:level]"; any other transform raises
      NotImplementedError.
    serialization_format: TORCH_SAVE (dcp's format) or SAFETENSORS (each
      data file also a safetensors file; written buffered; with
      compression the save raises ValueError).
    direct_io (dcp only, keyword): O_DIRECT data writes; None = the
      engine's default (on, with a buffered fallback where refused).
    compression (dcp only, keyword): None or "none", "zstd" or
      "zstd:LEVEL", or a dcp.ZStandard(level): host tensors over 64 KiB
      compressed block by block (loads decode it without an option; a bad
      string raises ValueError when the writer is used, another type
      TypeError at once).
    """

    _path_type = pathlib.Path

    def __init__(self, path, single_file_per_rank: bool = True,
                 sync_files: bool = True, thread_count: int = 1,
                 per_thread_copy_ahead: int = _SEED_COPY_AHEAD,
                 cache_staged_state_dict: bool = False,
                 overwrite: bool = True, _extensions=None,
                 serialization_format: SerializationFormat =
                 SerializationFormat.TORCH_SAVE, *, direct_io=None,
                 compression=None):
        if isinstance(compression, ZStandard):
            compression = compression._compression()
        elif compression is not None and not isinstance(compression, str):
            raise TypeError(
                f"FileSystemWriter: compression must be None, 'none', "
                f"'zstd', 'zstd:LEVEL' or a dcp.ZStandard, not "
                f"{compression!r}")
        chosen = compression_of(_extensions)
        if chosen is not None:
            if compression not in (None, "none", chosen):
                raise ValueError(
                    f"FileSystemWriter: _extensions asks for {chosen!r} and "
                    f"compression for {compression!r}; give one of them")
            compression = chosen
        if not isinstance(serialization_format, SerializationFormat):
            raise TypeError(
                f"FileSystemWriter: serialization_format must be a "
                f"SerializationFormat, not {serialization_format!r}")
        owner = "FileSystemWriter"
        self.path = _fs_path(owner, path)
        self.single_file_per_rank = bool(single_file_per_rank)
        self.sync_files = bool(sync_files)
        self.thread_count = _threads(owner, "thread_count", thread_count)
        # 0: the engine's default, as the seed's default is.
        self.per_thread_copy_ahead = _int_option(
            owner, "per_thread_copy_ahead", per_thread_copy_ahead, 0,
            _MAX_COPY_AHEAD)
        self.cache_staged_state_dict = bool(cache_staged_state_dict)
        self.overwrite = bool(overwrite)
        self.serialization_format = serialization_format
        self.direct_io = direct_io
        self.compression = compression

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
            direct_io=_lib.flag(self.direct_io),
            compression=(None if self.compression is None
                         else str(self.compression).encode()),
            serialization_format=(
                1 if self.serialization_format is
                SerializationFormat.SAFETENSORS else 0))

    def _create(self, path=None) -> ctypes.c_void_p:
        """A new dcp_storage_writer_t (the caller frees it)."""
        handle = ctypes.c_void_p()
        options = self._options()
        _lib.check(_lib.lib().dcp_fs_writer_create(
            _lib.encode_path(path if path is not None else self.path,
                             "path"),
            ctypes.byref(options), ctypes.byref(handle)))
        return handle

    def _spec(self):
        """Picklable options (the PROCESS writer rebuilds the writer)."""
        return dict(path=self.path,
                    single_file_per_rank=self.single_file_per_rank,
                    sync_files=self.sync_files,
                    thread_count=self.thread_count,
                    per_thread_copy_ahead=self.per_thread_copy_ahead,
                    overwrite=self.overwrite, direct_io=self.direct_io,
                    compression=self.compression,
                    serialization_format=self.serialization_format)

    def __repr__(self):
        return f"FileSystemWriter({str(self.path)!r})"


class FileSystemReader(_Storage):
    """Reads the checkpoint in directory `path` (held as a pathlib.Path,
    as the seed's reader holds it).

    _extension_registry: None or a dcp.ExtensionRegistry (loads decode
    the engine's extensions, zstd, either way). thread_count and direct_io (dcp only,
    keywords): reader threads, and O_DIRECT reads (None: buffered reads
    when most destination bytes are host memory that is not 4 KiB aligned,
    as torch's CPU tensors are, which O_DIRECT cannot read into; else the
    engine's default, O_DIRECT).
    """

    _path_type = pathlib.Path

    def __init__(self, path, _extension_registry=None, *,
                 thread_count: int = 1, direct_io=None):
        if _extension_registry is not None and not isinstance(
                _extension_registry, ExtensionRegistry):
            raise TypeError(
                f"FileSystemReader: _extension_registry must be a "
                f"dcp.ExtensionRegistry or None, not "
                f"{type(_extension_registry).__name__}")
        self.path = _fs_path("FileSystemReader", path)
        self.thread_count = _threads("FileSystemReader", "thread_count",
                                     thread_count)
        self.direct_io = direct_io

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
            _lib.encode_path(path if path is not None else self.path,
                             "path"),
            ctypes.byref(options), ctypes.byref(handle)))
        return handle

    def __repr__(self):
        return f"FileSystemReader({str(self.path)!r})"


class HuggingFaceStorageWriter(_Storage):
    """Writes a Hugging Face checkpoint (safetensors files and
    model.safetensors.index.json) into the directory `path`.

    fqn_to_index_mapping: tensor name -> 1-based file index; the files are
      model-0000I-of-0000N.safetensors. None or empty: every tensor in one
      file. A tensor the (non-empty) mapping lacks fails the save.
    thread_count: files written in parallel per rank.
    save_distributed: each rank writes its own shards,
      shard-0000R-model-0000I-of-0000N.safetensors (their offsets in the
      files' __metadata__), with no index, as PyTorch's writer does.
    enable_consolidation: with save_distributed, the shards go to sharded/
      and the coordinator then streams them into full tensors and writes
      the index.
    thread_count_consolidation: output files consolidated in parallel.
    sync_files, direct_io, consolidation_buffer_bytes (dcp only, keywords):
      None = the engine's defaults (fsync on, O_DIRECT with a buffered
      fallback, 256 MiB of consolidation buffers).

    Only tensors can be saved: any other value raises CheckpointValueError
    naming its key. A save commits atomically (the index last).
    """

    def __init__(self, path, fqn_to_index_mapping=None,
                 thread_count: int = 1, save_distributed: bool = False,
                 enable_consolidation: bool = False,
                 thread_count_consolidation: int = 1, *, sync_files=None,
                 direct_io=None, consolidation_buffer_bytes=None):
        owner = "HuggingFaceStorageWriter"
        self.path = _path(owner, path)
        self.thread_count = _threads(owner, "thread_count", thread_count)
        self.thread_count_consolidation = _threads(
            owner, "thread_count_consolidation", thread_count_consolidation)
        self.consolidation_buffer_bytes = _int_option(
            owner, "consolidation_buffer_bytes", consolidation_buffer_bytes,
            1, none_ok=True)
        self.fqn_to_index_mapping = _check_mapping(fqn_to_index_mapping)
        self.save_distributed = bool(save_distributed)
        self.enable_consolidation = bool(enable_consolidation)
        self.sync_files = sync_files
        self.direct_io = direct_io

    def _create(self, path=None) -> ctypes.c_void_p:
        """A new dcp_storage_writer_t (the caller frees it)."""
        fqns, indices, n = _mapping_arrays(self.fqn_to_index_mapping)
        options = _lib.sized(
            _lib.HfWriterOptions, fqns=fqns, file_indices=indices,
            num_mappings=n, thread_count=self.thread_count,
            save_distributed=_lib.flag(self.save_distributed),
            enable_consolidation=_lib.flag(self.enable_consolidation),
            thread_count_consolidation=self.thread_count_consolidation,
            sync_files=_lib.flag(self.sync_files),
            direct_io=_lib.flag(self.direct_io),
            consolidation_buffer_bytes=self.consolidation_buffer_bytes or 0)
        handle = ctypes.c_void_p()
        _lib.check(_lib.lib().dcp_hf_writer_create(
            _lib.encode_path(path if path is not None else self.path,
                             "path"),
            ctypes.byref(options), ctypes.byref(handle)))
        return handle

    def _spec(self):
        """Picklable options (the PROCESS writer rebuilds the writer)."""
        return dict(path=self.path,
                    fqn_to_index_mapping=self.fqn_to_index_mapping,
                    thread_count=self.thread_count,
                    save_distributed=self.save_distributed,
                    enable_consolidation=self.enable_consolidation,
                    thread_count_consolidation=(
                        self.thread_count_consolidation),
                    sync_files=self.sync_files, direct_io=self.direct_io,
                    consolidation_buffer_bytes=(
                        self.consolidation_buffer_bytes))

    def __repr__(self):
        return f"HuggingFaceStorageWriter({self.path!r})"


class HuggingFaceStorageReader(_Storage):
    """Reads the Hugging Face checkpoint in directory `path`: one
    model.safetensors, an index naming several files (as transformers and
    the `safetensors` library write them), or the sharded/ files of a
    distributed save. Global shapes come from the file headers; a rank
    asking for a slice of a tensor reads only that slice.

    thread_count: threads copying read bytes into the destinations.
    direct_io, read_window_bytes (dcp only, keywords): None = the engine's
    defaults (O_DIRECT where it applies, 64 MiB bounce windows).
    """

    def __init__(self, path, thread_count: int = 1, *, direct_io=None,
                 read_window_bytes=None):
        owner = "HuggingFaceStorageReader"
        self.path = _path(owner, path)
        self.thread_count = _threads(owner, "thread_count", thread_count)
        self.direct_io = direct_io
        self.read_window_bytes = _int_option(
            owner, "read_window_bytes", read_window_bytes, 1, none_ok=True)

    def _create(self, path=None) -> ctypes.c_void_p:
        handle = ctypes.c_void_p()
        options = _lib.sized(_lib.HfReaderOptions,
                             thread_count=self.thread_count,
                             direct_io=_lib.flag(self.direct_io),
                             read_window_bytes=self.read_window_bytes or 0)
        _lib.check(_lib.lib().dcp_hf_reader_create(
            _lib.encode_path(path if path is not None else self.path,
                             "path"),
            ctypes.byref(options), ctypes.byref(handle)))
        return handle

    def read_metadata(self):
        """The checkpoint's Metadata: every tensor's dtype and global shape
        from the safetensors headers, one chunk per file holding it (a
        distributed save's shards), without reading tensor data."""
        from .metadata import read_metadata_through
        return read_metadata_through(self)

    def __repr__(self):
        return f"HuggingFaceStorageReader({self.path!r})"


class QuantizedHuggingFaceStorageReader(_Storage):
    """Reads the Hugging Face checkpoint in directory `path` whose weights
    W are float8 E4M3 with float32 block scales W_scale_inv
    (DeepSeek-V3's layout), dequantizing while loading: element (i, j) is
    float32(W[i, j]) * W_scale_inv[i // block_size, j // block_size],
    rounded once to target_dtype. Other tensors (the scales included) are
    described and load as HuggingFaceStorageReader's.

    thread_count: threads reading and dequantizing.
    target_dtype: torch.float32 (None: the default), torch.bfloat16 or
      torch.float16; what quantized weights load as.
    block_size: the scales' tile edge; None: the checkpoint's config.json
      ``quantization_config.weight_block_size`` (``[edge, edge]``) when it
      has one, else 128.
    """

    _TARGETS = {"float32": 11, "bfloat16": 10, "float16": 9}

    def __init__(self, path, thread_count: int = 1, target_dtype=None,
                 block_size: int | None = None):
        owner = "QuantizedHuggingFaceStorageReader"
        path = _path(owner, path)
        thread_count = _threads(owner, "thread_count", thread_count)
        block_size = _int_option(owner, "block_size", block_size, 1,
                                 none_ok=True)
        name = ("float32" if target_dtype is None
                else str(target_dtype).replace("torch.", ""))
        if name not in self._TARGETS:
            raise ValueError(f"target_dtype {target_dtype!r}: quantized "
                             "weights load as torch.float32, torch.bfloat16 "
                             "or torch.float16")
        self.path = path
        self.thread_count = thread_count
        self.target_dtype = target_dtype
        self.block_size = block_size
        self._dcp_dtype = self._TARGETS[name]

    def _create(self, path=None) -> ctypes.c_void_p:
        handle = ctypes.c_void_p()
        options = _lib.sized(_lib.HfQuantizedReaderOptions,
                             thread_count=self.thread_count,
                             target_dtype=self._dcp_dtype,
                             block_size=self.block_size or 0)
        _lib.check(_lib.lib().dcp_hf_quantized_reader_create(
            _lib.encode_path(path if path is not None else self.path,
                             "path"),
            ctypes.byref(options), ctypes.byref(handle)))
        return handle

    def read_metadata(self):
        """The checkpoint's Metadata as this reader loads it: quantized
        weights in target_dtype, every other tensor as stored."""
        from .metadata import read_metadata_through
        return read_metadata_through(self)

    def __repr__(self):
        return f"QuantizedHuggingFaceStorageReader({self.path!r})"


class MegaStorageWriter(_Storage):
    """Writes a MEGA checkpoint (docs/FORMAT.md section 8) into directory
    `path`: `model.mega`, or with fqn_to_index_mapping (name -> 1-based file
    index, which must name every value saved) `model-0000I-of-0000N.mega`
    files, and `model.mega.index.json`. Every entry is 4 KiB aligned and
    covered by XXH3-64 block checksums; a save commits atomically.

    thread_count, checksum_block_size, sync_files, direct_io (dcp only,
      keywords): files written in parallel per rank; None = the engine's
      defaults (4 MiB checksum blocks, fsync on, O_DIRECT).
    """

    _scheme = "mega://"

    def __init__(self, path, fqn_to_index_mapping=None, *,
                 thread_count: int = 1, checksum_block_size=None,
                 sync_files=None, direct_io=None):
        owner = "MegaStorageWriter"
        self.path = _path(owner, path)
        self.thread_count = _threads(owner, "thread_count", thread_count)
        checksum_block_size = _int_option(
            owner, "checksum_block_size", checksum_block_size, 1,
            _MAX_CHECKSUM_BLOCK, none_ok=True)
        if checksum_block_size is not None and checksum_block_size % 4096:
            raise ValueError(
                f"{owner}(checksum_block_size={checksum_block_size}): "
                "checksum_block_size must be a multiple of 4096")
        self.checksum_block_size = checksum_block_size
        self.fqn_to_index_mapping = _check_mapping(fqn_to_index_mapping)
        self.sync_files = sync_files
        self.direct_io = direct_io

    def _create(self, path=None) -> ctypes.c_void_p:
        """A new dcp_storage_writer_t (the caller frees it)."""
        fqns, indices, n = _mapping_arrays(self.fqn_to_index_mapping)
        options = _lib.sized(
            _lib.MegaWriterOptions, fqns=fqns, file_indices=indices,
            num_mappings=n, thread_count=self.thread_count,
            checksum_block_size=self.checksum_block_size or 0,
            sync_files=_lib.flag(self.sync_files),
            direct_io=_lib.flag(self.direct_io))
        handle = ctypes.c_void_p()
        _lib.check(_lib.lib().dcp_mega_writer_create(
            _lib.encode_path(path if path is not None else self.path,
                             "path"),
            ctypes.byref(options), ctypes.byref(handle)))
        return handle

    def _spec(self):
        """Picklable options (the PROCESS writer rebuilds the writer)."""
        return dict(path=self.path,
                    fqn_to_index_mapping=self.fqn_to_index_mapping,
                    thread_count=self.thread_count,
                    checksum_block_size=self.checksum_block_size,
                    sync_files=self.sync_files, direct_io=self.direct_io)

    def __repr__(self):
        return f"MegaStorageWriter({self.path!r})"


class MegaStorageReader(_Storage):
    """Reads the MEGA checkpoint in directory `path`, resharding as needed;
    every byte read is checked against its block checksums (a mismatch
    raises CheckpointCorruptError naming the file).

    thread_count, direct_io (dcp only, keywords): reader threads, and
      O_DIRECT reads (None: the engine's default).
    """

    _scheme = "mega://"

    def __init__(self, path, *, thread_count: int = 1, direct_io=None):
        self.path = _path("MegaStorageReader", path)
        self.thread_count = _threads("MegaStorageReader", "thread_count",
                                     thread_count)
        self.direct_io = direct_io

    def _create(self, path=None) -> ctypes.c_void_p:
        handle = ctypes.c_void_p()
        options = _lib.sized(_lib.MegaReaderOptions,
                             thread_count=self.thread_count,
                             direct_io=_lib.flag(self.direct_io))
        _lib.check(_lib.lib().dcp_mega_reader_create(
            _lib.encode_path(path if path is not None else self.path,
                             "path"),
            ctypes.byref(options), ctypes.byref(handle)))
        return handle

    def read_metadata(self):
        """The checkpoint's Metadata, from the index and the files'
        headers, without reading tensor data."""
        from .metadata import read_metadata_through
        return read_metadata_through(self)

    def __repr__(self):
        return f"MegaStorageReader({self.path!r})"


# The storage classes dcp.save / dcp.load take.
WRITERS = (FileSystemWriter, HuggingFaceStorageWriter, MegaStorageWriter)
READERS = (FileSystemReader, HuggingFaceStorageReader,
           QuantizedHuggingFaceStorageReader, MegaStorageReader)
for _writer in WRITERS:
    StorageWriter.register(_writer)
for _reader in READERS:
    StorageReader.register(_reader)


def check_writer(storage_writer) -> None:
    """TypeError unless `storage_writer` is None or one of dcp's writers
    overriding no protocol method (dcp.interfaces.check_storage)."""
    check_storage(storage_writer, WRITERS, "storage_writer")


def check_reader(storage_reader) -> None:
    """TypeError unless `storage_reader` is None or one of dcp's readers
    overriding no protocol method (dcp.interfaces.check_storage)."""
    check_storage(storage_reader, READERS, "storage_reader")
