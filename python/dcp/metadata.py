"""What a checkpoint holds, as read-only Python objects (the seed's Metadata
and friends), read through dcp_metadata_* without loading any data.

A Metadata made from a library handle reads its items lazily, on the first
access of state_dict_metadata / planner_data, and frees the handle when it
(and whatever shares its handle's owner) is garbage collected; copy,
deepcopy and pickle give a plain Metadata (every item read, no handle).
The value objects are frozen dataclasses with the seed's fields;
state_dict_metadata is a read-only mapping.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import enum
import gc
import math
import os
import pickle
import types
import weakref
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from . import _lib, errors
from ._state import torch, torch_dtype

__all__ = [
    "Metadata", "TensorStorageMetadata", "ChunkStorageMetadata",
    "BytesStorageMetadata", "TensorProperties", "MetadataIndex",
    "StorageMeta", "StorageInfo", "read_metadata",
]

# The format this library writes (docs/FORMAT.md); a checkpoint's own is
# Metadata.version.
FORMAT_VERSION = "dcp-1"


@dataclass(frozen=True)
class ChunkStorageMetadata:
    """One saved chunk: where it starts in the global tensor, and its size
    (torch.Size in a checkpoint's metadata where torch is installed, as in
    torch's; tuples otherwise)."""
    offsets: tuple
    sizes: tuple


def _default_dtype():
    """The seed's default TensorProperties.dtype: torch's default dtype
    (torch.get_default_dtype(), read when the object is made); None
    without torch."""
    return torch.get_default_dtype() if torch is not None else None


def _default_layout():
    return torch.strided if torch is not None else "strided"


def _default_memory_format():
    return torch.contiguous_format if torch is not None else "contiguous"


class _MemoryFormat(enum.Enum):
    """A torch.memory_format in a pickle. pickle (protocols 0-3, which
    torch.save uses) cannot store a torch.memory_format: its __reduce__
    names "torch.contiguous_format", which those protocols cannot look up.
    The seed's TensorProperties stores an enum for the same reason."""
    CONTIGUOUS_FORMAT = "contiguous_format"
    CHANNELS_LAST = "channels_last"
    CHANNELS_LAST_3D = "channels_last_3d"
    PRESERVE_FORMAT = "preserve_format"


@dataclass(frozen=True)
class TensorProperties:
    """dtype is a torch.dtype when torch is importable, else its name;
    layout and memory_format likewise. Defaults: torch.get_default_dtype()
    (None without torch), torch.strided and torch.contiguous_format.

    Picklable with every protocol: a torch.memory_format is pickled as a
    _MemoryFormat and restored as the same torch.memory_format."""
    dtype: Any = field(default_factory=_default_dtype)
    layout: Any = field(default_factory=_default_layout)
    requires_grad: bool = False
    memory_format: Any = field(default_factory=_default_memory_format)
    pin_memory: bool = False

    def __getstate__(self):
        memory_format = self.memory_format
        if torch is not None and isinstance(memory_format,
                                            torch.memory_format):
            name = str(memory_format).removeprefix("torch.")
            try:
                memory_format = _MemoryFormat(name)
            except ValueError:
                raise pickle.PicklingError(
                    f"TensorProperties: unknown torch.memory_format "
                    f"{memory_format}") from None
        return (self.dtype, self.layout, self.requires_grad, memory_format,
                self.pin_memory)

    def __setstate__(self, state):
        if isinstance(state, dict):
            # Pickled before __getstate__ existed: the fields by name.
            state = tuple(state.get(name, default) for name, default in (
                ("dtype", None), ("layout", _default_layout()),
                ("requires_grad", False),
                ("memory_format", _default_memory_format()),
                ("pin_memory", False)))
        dtype, layout, requires_grad, memory_format, pin_memory = state
        if isinstance(memory_format, _MemoryFormat):
            memory_format = (getattr(torch, memory_format.value)
                             if torch is not None else memory_format.value)
        for name, value in (("dtype", dtype), ("layout", layout),
                            ("requires_grad", requires_grad),
                            ("memory_format", memory_format),
                            ("pin_memory", pin_memory)):
            object.__setattr__(self, name, value)


@dataclass(frozen=True)
class TensorStorageMetadata:
    properties: TensorProperties
    size: tuple
    chunks: tuple  # of ChunkStorageMetadata


@dataclass(frozen=True)
class BytesStorageMetadata:
    """A non-tensor value (stored as bytes)."""


@dataclass(frozen=True)
class MetadataIndex:
    fqn: str
    offset: Optional[Sequence[int]] = None
    index: Optional[int] = field(default=None, compare=False)

    def __post_init__(self):
        if self.offset is not None:
            object.__setattr__(self, "offset", tuple(self.offset))


@dataclass(frozen=True)
class StorageInfo:
    """Where one stored item lives (the seed's _StorageInfo): its data
    file relative to the checkpoint directory, byte offset and length."""
    relative_path: str
    offset: int
    length: int


@dataclass(frozen=True)
class StorageMeta:
    checkpoint_id: Any = None
    save_id: Optional[str] = None
    load_id: Optional[str] = None
    modules: list = field(default_factory=list)


@contextlib.contextmanager
def _gc_paused():
    """Pauses Python's cyclic garbage collector while a Metadata's items are
    made: hundreds of thousands of new objects, none in a cycle, would
    otherwise start collections that scan the whole heap (most of the time
    of a large read)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class _Handle:
    """A dcp_metadata_t and the finalizer that frees it once no object
    holds this owner any more (a Metadata, or a shallow copy of its
    attributes)."""

    __slots__ = ("value", "_finalizer", "__weakref__")

    def __init__(self, handle: ctypes.c_void_p):
        self.value = handle
        self._finalizer = weakref.finalize(self, _lib.lib().dcp_metadata_free,
                                           handle.value)


def plain_fields(md) -> dict:
    """Metadata(**result) rebuilds `md` without its C handle (every item
    read; picklable)."""
    return dict(state_dict_metadata=dict(md.state_dict_metadata),
                planner_data=(dict(md.planner_data)
                              if md.planner_data is not None else None),
                storage_data=(dict(md.storage_data)
                              if md.storage_data is not None else None),
                storage_meta=md.storage_meta, version=md.version)


class Metadata:
    """A committed checkpoint's metadata.

    state_dict_metadata: flattened name -> TensorStorageMetadata or
    BytesStorageMetadata (read-only mapping, sorted by name).
    planner_data: flattened name -> the nesting path in the saver's state
    dict (a tuple of str keys and int list indices).
    storage_meta: StorageMeta(checkpoint_id, save_id).
    storage_data: MetadataIndex -> StorageInfo(relative_path, offset,
      length): where each stored item (tensor chunk or plain value) lives.
    version: the checkpoint's format: "dcp-1" (dcp's own; "dcp-2" with
      compressed items, "dcp-3" with a tensor of a dtype added later, such
      as float8_e8m0fnu: docs/FORMAT.md), "safetensors" (a Hugging Face
      directory).

    Two Metadata are equal when all five fields are (a read of a library
    handle and a plain Metadata alike: two reads of one checkpoint compare
    equal). Like the seed's (a mutable dataclass), Metadata is unhashable.
    """

    def __init__(self, state_dict_metadata=None, planner_data=None,
                 storage_data=None, storage_meta=None, version=None):
        self._handle = None
        self._owner = None
        self._sdm = (types.MappingProxyType(dict(state_dict_metadata))
                     if state_dict_metadata is not None else
                     types.MappingProxyType({}))
        self._planner_data = planner_data
        self._storage_data = storage_data
        self._storage_meta = storage_meta
        self._version = version

    @classmethod
    def _from_handle(cls, handle: ctypes.c_void_p,
                     source: str | None = None) -> "Metadata":
        """Takes ownership of a dcp_metadata_t, read from checkpoint
        `source` (named in errors; None: one this process saved)."""
        self = cls.__new__(cls)
        self._source = source
        # The handle is freed with its owner, which every (shallow) copy
        # of this object's attributes shares.
        self._owner = _Handle(handle)
        self._handle = handle
        self._sdm = None
        self._planner_data = None
        self._storage_data = None
        L = _lib.lib()
        ckpt, save = ctypes.c_char_p(), ctypes.c_char_p()
        _lib.check(L.dcp_metadata_ids(handle, ctypes.byref(ckpt),
                                      ctypes.byref(save)))
        version = ctypes.c_char_p()
        _lib.check(L.dcp_metadata_version(handle, ctypes.byref(version)))
        self._version = self._text(version.value, "version") or None
        self._storage_meta = StorageMeta(
            checkpoint_id=self._text(ckpt.value, "checkpoint id") or None,
            save_id=self._text(save.value, "save id") or None)
        return self

    def _text(self, raw: bytes | None, what: str) -> str:
        """`raw` from the metadata, decoded; CheckpointCorruptError naming
        the checkpoint where it is not UTF-8."""
        try:
            return (raw or b"").decode()
        except UnicodeDecodeError as e:
            where = getattr(self, "_source", None)
            where = f"the checkpoint in {where}" if where else "a checkpoint"
            raise errors.from_status(
                _lib.DATA_LOSS,
                f"{where} is corrupt: its metadata holds a {what} that is "
                f"not UTF-8 ({raw[:64]!r}: {e.reason} at byte {e.start})",
                cls=errors.CheckpointCorruptError) from None

    @property
    def state_dict_metadata(self):
        if self._sdm is None:
            self._read_items()
        return self._sdm

    @property
    def planner_data(self):
        if self._planner_data is None and self._handle is not None:
            self._read_items()
        return self._planner_data

    @property
    def storage_data(self):
        if self._storage_data is None and self._handle is not None:
            self._read_storage()
        return self._storage_data

    @property
    def storage_meta(self):
        return self._storage_meta

    @property
    def version(self):
        return self._version

    def __eq__(self, other):
        if not isinstance(other, Metadata):
            return NotImplemented
        if self is other:
            return True
        # Cheap fields first; the items and storage are read only if needed.
        # (A read-only mapping equals a dict with the same items.)
        return (self.version == other.version and
                self.storage_meta == other.storage_meta and
                self.state_dict_metadata == other.state_dict_metadata and
                self.planner_data == other.planner_data and
                self.storage_data == other.storage_data)

    __hash__ = None  # equal by value, and the seed's is unhashable

    def __reduce__(self):
        return (_from_plain_fields, (plain_fields(self),))

    def __copy__(self):
        return Metadata(**plain_fields(self))

    def __deepcopy__(self, memo):
        return Metadata(**copy.deepcopy(plain_fields(self), memo))

    def __repr__(self):
        n = len(self.state_dict_metadata)
        return (f"Metadata({n} items, version={self._version!r}, "
                f"storage_meta={self._storage_meta!r})")

    def _packed(self, function) -> tuple[list, bytes]:
        """The records (ints) and text of dcp_metadata_items_packed or
        dcp_metadata_storage_packed (`function`), in one C call."""
        records = ctypes.POINTER(ctypes.c_int64)()
        text = ctypes.POINTER(ctypes.c_char)()
        num_records, text_size = ctypes.c_size_t(), ctypes.c_size_t()
        _lib.check(function(self._handle, ctypes.byref(records),
                            ctypes.byref(num_records), ctypes.byref(text),
                            ctypes.byref(text_size)))
        values = (np.ctypeslib.as_array(records, (num_records.value,))
                  .tolist() if num_records.value else [])
        return values, ctypes.string_at(text, text_size.value)

    def _strings(self, text: bytes):
        """A function of (offset, size, what) giving the str at `offset` of
        `text`, decoded once per distinct string; CheckpointCorruptError
        (as _text) when it is not UTF-8."""
        known = {}

        def string(offset: int, size: int, what: str) -> str:
            if not size:
                return ""  # (a string after it may start at its offset)
            value = known.get(offset)
            if value is None:
                raw = text[offset:offset + size]
                try:
                    value = raw.decode()
                except UnicodeDecodeError:
                    self._text(raw, what)  # raises
                known[offset] = value
            return value
        return string

    @_gc_paused()
    def _read_storage(self) -> None:
        r, text = self._packed(_lib.lib().dcp_metadata_storage_packed)
        string = self._strings(text)
        out = {}
        i, end = 0, len(r)
        while i < end:
            name = string(r[i], r[i + 1], "name")
            has_offsets, ndim = r[i + 2], r[i + 3]
            i += 4
            offset = tuple(r[i:i + ndim]) if has_offsets else None
            i += ndim
            out[MetadataIndex(name, offset)] = StorageInfo(
                string(r[i], r[i + 1], "file name"), r[i + 2], r[i + 3])
            i += 4
        self._storage_data = types.MappingProxyType(out)

    @_gc_paused()
    def _read_items(self) -> None:
        r, text = self._packed(_lib.lib().dcp_metadata_items_packed)
        string = self._strings(text)
        sdm = {}
        planner_data = {}
        bytes_md = BytesStorageMetadata()
        # One TensorProperties per dtype and requires_grad (frozen, so
        # shared): making one costs several times the rest of an item.
        properties = {}
        # Sizes and offsets as torch.Size, as torch's metadata has them
        # (`.numel()`), where torch is installed.
        size_type = torch.Size if torch is not None else tuple
        i, end = 0, len(r)
        while i < end:
            name = string(r[i], r[i + 1], "name")
            is_tensor, dtype, requires_grad, ndim, path_len, num_chunks = \
                r[i + 2:i + 8]
            i += 8
            shape = size_type(r[i:i + ndim])
            i += ndim
            path = []
            for _ in range(path_len):
                at, size = r[i], r[i + 1]
                path.append(size if at < 0 else string(at, size, "key"))
                i += 2
            planner_data[name] = tuple(path)
            if not is_tensor:
                sdm[name] = bytes_md
                continue
            props = properties.get((dtype, requires_grad))
            if props is None:
                props = properties[(dtype, requires_grad)] = \
                    TensorProperties(dtype=torch_dtype(dtype),
                                     requires_grad=bool(requires_grad))
            chunks = []
            for _ in range(num_chunks):
                middle = i + ndim
                chunks.append(ChunkStorageMetadata(
                    size_type(r[i:middle]),
                    size_type(r[middle:middle + ndim])))
                i = middle + ndim
            sdm[name] = TensorStorageMetadata(props, shape, tuple(chunks))
        self._sdm = types.MappingProxyType(sdm)
        self._planner_data = types.MappingProxyType(planner_data)


def check_chunk_coverage(name, item, source) -> None:
    """Raises CheckpointCorruptError naming checkpoint `source` and key
    `name` where the saved chunks of tensor `item` (TensorStorageMetadata)
    hold fewer elements than its shape: a tensor of that shape must not be
    allocated before the load refuses it (a damaged shape may be huge)."""
    total = math.prod(item.size)
    held = sum(math.prod(c.sizes) for c in item.chunks)
    if held < total:
        raise errors.from_status(
            _lib.DATA_LOSS, f"{source}: \"{name}\": the metadata's chunks "
            f"hold {held} of the tensor's {total} elements")


def _from_plain_fields(fields: dict) -> Metadata:
    """Unpickling: the plain Metadata of plain_fields()."""
    return Metadata(**fields)


def _metadata_or_raise(code: int, handle: ctypes.c_void_p,
                       directory=None, source=None) -> Metadata:
    """The Metadata of a successful read of checkpoint `source` (named in
    its errors), else raises: NOT_FOUND as
    CheckpointFileNotFoundError; DATA_LOSS from the FileSystem checkpoint
    in `directory` (None: not one) whose .metadata torch.distributed
    .checkpoint wrote as CheckpointNotImplementedError
    (errors.foreign_checkpoint_error)."""
    if code == _lib.OK:
        return Metadata._from_handle(handle, source)
    _, message, failures = _lib.last_error()
    if code == _lib.NOT_FOUND:
        raise errors.from_status(code, message, failures,
                                 cls=errors.CheckpointFileNotFoundError)
    exc = errors.from_status(code, message, failures)
    foreign = (errors.foreign_checkpoint_error(exc, directory)
               if directory is not None else None)
    if foreign is not None:
        raise foreign from exc
    raise exc


_MEGA_SCHEME = "mega://"
# What marks a MEGA directory (io/mega_format.h): its index, or the journal
# of a commit that did not finish (the reader then says so).
_MEGA_FILES = ("model.mega.index.json", ".dcp-mega-commit")


def _has_dcp_metadata(path: str) -> bool:
    return os.path.exists(os.path.join(path, ".metadata")) or \
        os.path.exists(os.path.join(path, "rank-0", ".metadata"))


def _is_mega_directory(path: str) -> bool:
    """mega://DIR, or a directory without dcp metadata holding a MEGA
    index: the checkpoints a load without a storage_reader reads as MEGA
    (io/storage_registry.h)."""
    if path.startswith(_MEGA_SCHEME):
        return True
    return not _has_dcp_metadata(path) and any(
        os.path.exists(os.path.join(path, name)) for name in _MEGA_FILES)


def holds_checkpoint(path: str, rank: int = 0) -> bool:
    """Whether `path` holds a checkpoint that a load reads: dcp's .metadata
    (rank `rank`'s of a rank-local one), a MEGA index (also as mega://DIR)
    or Hugging Face files; so a NOT_FOUND from its load names a key, not
    the checkpoint. False for other URIs."""
    if path.startswith(_MEGA_SCHEME):
        return os.path.exists(os.path.join(path[len(_MEGA_SCHEME):],
                                           _MEGA_FILES[0]))
    if "://" in path:
        return False
    return os.path.exists(os.path.join(path, ".metadata")) or \
        os.path.exists(os.path.join(path, f"rank-{rank}", ".metadata")) or \
        os.path.exists(os.path.join(path, _MEGA_FILES[0])) or \
        _is_hf_directory(path)


def _is_hf_directory(path: str) -> bool:
    """No dcp .metadata, but safetensors files (or a distributed save's
    shards in sharded/; an empty sharded/ is none): a Hugging Face
    checkpoint, as io/checkpoint_formats.h tells."""
    if os.path.exists(os.path.join(path, ".metadata")):
        return False
    try:
        names = os.listdir(path)
    except OSError:
        return False
    if any(n.endswith(".safetensors") for n in names):
        return True
    try:
        return any(n.endswith(".safetensors")
                   for n in os.listdir(os.path.join(path, "sharded")))
    except OSError:
        return False


def read_metadata(checkpoint_id) -> Metadata:
    """The metadata of the checkpoint in directory `checkpoint_id`, without
    loading anything else, read from the storage a load without a
    storage_reader picks: a dcp checkpoint; a MEGA directory (or
    mega://DIR; read as MegaStorageReader(checkpoint_id).read_metadata()
    does); a Hugging Face directory (safetensors files; read as
    HuggingFaceStorageReader(checkpoint_id).read_metadata() does).
    CheckpointFileNotFoundError when there is none; CheckpointCorruptError
    when it does not decode; CheckpointNotImplementedError for a directory
    that torch.distributed.checkpoint wrote."""
    path = errors.checked_path(checkpoint_id)
    in_the_way = errors.file_in_the_way(path, "load")
    if in_the_way is not None:
        raise in_the_way
    if _is_mega_directory(path):
        from .storage import MegaStorageReader
        return read_metadata_through(MegaStorageReader(path))
    if _is_hf_directory(path):
        from .storage import HuggingFaceStorageReader
        return read_metadata_through(HuggingFaceStorageReader(path))
    handle = ctypes.c_void_p()
    code = _lib.lib().dcp_metadata_read(path.encode(), ctypes.byref(handle))
    return _metadata_or_raise(code, handle, directory=path, source=path)


def read_metadata_through(storage_reader) -> Metadata:
    """The metadata of the checkpoint `storage_reader` (a FileSystemReader,
    HuggingFaceStorageReader, QuantizedHuggingFaceStorageReader or
    MegaStorageReader) points at, read by its C reader."""
    in_the_way = errors.file_in_the_way(storage_reader.path, "load")
    if in_the_way is not None:
        raise in_the_way
    L = _lib.lib()
    reader = storage_reader._create()
    try:
        handle = ctypes.c_void_p()
        code = L.dcp_storage_reader_read_metadata(reader, None,
                                                  ctypes.byref(handle))
        from .storage import FileSystemReader
        return _metadata_or_raise(
            code, handle, directory=(
                storage_reader.path
                if isinstance(storage_reader, FileSystemReader) else None),
            source=storage_reader.path)
    finally:
        L.dcp_storage_reader_free(reader)
