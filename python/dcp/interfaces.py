"""The seed's planning and storage interfaces: the plan data classes
(WriteItem, ReadItem, SavePlan, LoadPlan and their parts), the abstract
SavePlanner / LoadPlanner / StorageWriter / StorageReader, the
FileSystemBase / FileSystem stream interface and the CheckpointableTensor
protocol.

dcp plans and does its I/O in the engine (libdcp.so), not through these
methods: save and load call none of them. DefaultSavePlanner,
DefaultLoadPlanner and the storage classes of dcp.storage count as
instances of the abstract classes (isinstance holds), and their options
are honoured. A planner or storage object of any other class, or a
subclass of dcp's that overrides one of the protocol's methods, is refused
at save/load with TypeError naming the class and the method
(check_planner, check_storage): running without the override would
silently ignore it. The data classes are here so that code written
against the seed can name them, build them and inspect them.

A CheckpointableTensor is a torch tensor carrying global_shape,
global_offsets, local_offsets and local_sizes: save stores each local
shard of it as a chunk of the global tensor (dcp._state).
"""

from __future__ import annotations

import abc
import enum
import io
import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import (Any, Generator, Optional, Protocol, Union,
                    runtime_checkable)

from .metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties

__all__ = [
    "WriteItemType", "LoadItemType", "BytesIOWriteData", "TensorWriteData",
    "WriteItem", "ReadItem", "SavePlan", "LoadPlan", "SavePlanner",
    "LoadPlanner", "StorageWriter", "StorageReader", "FileSystemBase",
    "FileSystem", "CheckpointableTensor",
]


class WriteItemType(enum.Enum):
    """What a WriteItem writes: a whole tensor, one shard of a sharded
    tensor, or a value serialized to bytes."""
    TENSOR = enum.auto()
    SHARD = enum.auto()
    BYTE_IO = enum.auto()


class LoadItemType(enum.Enum):
    """What a ReadItem reads: tensor elements or a serialized value."""
    TENSOR = enum.auto()
    BYTE_IO = enum.auto()


@dataclass(frozen=True)
class BytesIOWriteData:
    """A serialized value's size in bytes."""
    nbytes: int


@dataclass(frozen=True)
class TensorWriteData:
    """The chunk a WriteItem writes, with the global tensor's properties
    and size."""
    chunk: ChunkStorageMetadata
    properties: TensorProperties
    size: tuple


@dataclass(frozen=True)
class WriteItem:
    """One item of a SavePlan: `index` names the value (and chunk)."""
    index: MetadataIndex
    type: WriteItemType
    bytes_io_data: Optional[BytesIOWriteData] = None
    tensor_data: Optional[TensorWriteData] = None

    def tensor_storage_size(self) -> Optional[int]:
        """Bytes of the chunk's elements; None for a non-tensor item or
        when the dtype's size is unknown (no torch)."""
        if self.tensor_data is None:
            return None
        count = 1
        for size in self.tensor_data.chunk.sizes:
            count *= int(size)
        dtype = self.tensor_data.properties.dtype
        itemsize = getattr(dtype, "itemsize", None)
        return None if itemsize is None else count * itemsize


@dataclass(frozen=True)
class ReadItem:
    """One item of a LoadPlan: copy the box of `lengths` starting at
    `storage_offsets` of the stored `storage_index` to `dest_offsets` of
    the destination `dest_index`."""
    type: LoadItemType
    dest_index: MetadataIndex
    dest_offsets: tuple
    storage_index: MetadataIndex
    storage_offsets: tuple
    lengths: tuple


@dataclass(frozen=True)
class SavePlan:
    """A rank's write items and what the planner and storage attach."""
    items: list
    storage_data: Any = None
    planner_data: Any = None
    usable: bool = True


@dataclass
class LoadPlan:
    """A rank's read items and what the planner and storage attach."""
    items: list
    storage_data: Any = None
    planner_data: Any = None


class SavePlanner(abc.ABC):
    """The seed's save planner protocol. dcp's planning runs in the
    engine; see the module docstring."""

    @abc.abstractmethod
    def set_up_planner(self, state_dict, storage_meta=None,
                       is_coordinator: bool = False) -> None:
        """Receives the state dict before planning."""

    @abc.abstractmethod
    def create_local_plan(self) -> SavePlan:
        """This rank's plan."""

    @abc.abstractmethod
    def create_global_plan(self, all_plans):
        """On the coordinator: every rank's plan, to (plans, Metadata)."""

    @abc.abstractmethod
    def finish_plan(self, new_plan: SavePlan) -> SavePlan:
        """This rank's plan as the coordinator returned it."""

    @abc.abstractmethod
    def resolve_data(self, write_item: WriteItem):
        """The tensor or io.BytesIO that `write_item` writes."""


class LoadPlanner(abc.ABC):
    """The seed's load planner protocol. dcp's planning runs in the
    engine; see the module docstring."""

    @abc.abstractmethod
    def set_up_planner(self, state_dict, metadata=None,
                       is_coordinator: bool = False) -> None:
        """Receives the destination state dict and the checkpoint's
        metadata."""

    @abc.abstractmethod
    def create_local_plan(self) -> LoadPlan:
        """This rank's plan."""

    @abc.abstractmethod
    def create_global_plan(self, global_plan):
        """On the coordinator: every rank's plan, adjusted."""

    @abc.abstractmethod
    def finish_plan(self, central_plan: LoadPlan) -> LoadPlan:
        """This rank's plan as the coordinator returned it."""

    @abc.abstractmethod
    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        """Stores a value read from the checkpoint."""

    def resolve_bytes(self, read_item: ReadItem) -> io.BytesIO:
        """The buffer a value is read into."""
        raise NotImplementedError("LoadPlanner.resolve_bytes")

    @abc.abstractmethod
    def resolve_tensor(self, read_item: ReadItem):
        """The tensor `read_item` is read into."""

    @abc.abstractmethod
    def commit_tensor(self, read_item: ReadItem, tensor) -> None:
        """Called once `tensor` (from resolve_tensor) holds the data."""


class StorageWriter(abc.ABC):
    """The seed's storage writer protocol. dcp's writers do their I/O in
    the engine; see the module docstring."""

    @abc.abstractmethod
    def reset(self, checkpoint_id=None) -> None:
        """Points the writer at a new checkpoint."""

    @abc.abstractmethod
    def set_up_storage_writer(self, is_coordinator: bool, *args,
                              **kwargs) -> None:
        """Called before planning."""

    @abc.abstractmethod
    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        """Adds storage data to this rank's plan."""

    @abc.abstractmethod
    def prepare_global_plan(self, plans):
        """On the coordinator: adds storage data to every rank's plan."""

    @abc.abstractmethod
    def write_data(self, plan: SavePlan, planner: SavePlanner):
        """Writes this rank's items; a future of their WriteResults."""

    @abc.abstractmethod
    def finish(self, metadata, results) -> None:
        """On the coordinator: commits the checkpoint."""

    @classmethod
    @abc.abstractmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        """Whether this writer can write `checkpoint_id`."""

    def storage_meta(self):
        """What the writer tells the planner about the storage."""
        return None


class StorageReader(abc.ABC):
    """The seed's storage reader protocol. dcp's readers do their I/O in
    the engine; see the module docstring."""

    @abc.abstractmethod
    def reset(self, checkpoint_id=None) -> None:
        """Points the reader at another checkpoint."""

    @abc.abstractmethod
    def read_metadata(self, *args, **kwargs):
        """The checkpoint's Metadata."""

    @abc.abstractmethod
    def set_up_storage_reader(self, metadata, is_coordinator: bool, *args,
                              **kwargs) -> None:
        """Called before planning."""

    @abc.abstractmethod
    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        """Adds storage data to this rank's plan."""

    @abc.abstractmethod
    def prepare_global_plan(self, plans):
        """On the coordinator: adds storage data to every rank's plan."""

    @abc.abstractmethod
    def read_data(self, plan: LoadPlan, planner: LoadPlanner):
        """Reads this rank's items through the planner; a future."""

    @classmethod
    @abc.abstractmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        """Whether this reader can read `checkpoint_id`."""


class FileSystemBase(abc.ABC):
    """The seed's file-system interface under its file-system storage:
    streams, paths and renames."""

    @contextmanager
    @abc.abstractmethod
    def create_stream(self, path, mode: str) -> Generator[io.IOBase, None,
                                                          None]:
        """A binary stream on `path` opened with `mode`."""

    @abc.abstractmethod
    def concat_path(self, path, suffix: str):
        """`path` joined with `suffix`."""

    @abc.abstractmethod
    def rename(self, path, new_path) -> None:
        """Renames `path` to `new_path`, replacing it."""

    @abc.abstractmethod
    def init_path(self, path):
        """`path` in this file system's form."""

    @abc.abstractmethod
    def mkdir(self, path) -> None:
        """Creates the directory `path` and its parents."""

    @classmethod
    @abc.abstractmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        """Whether `checkpoint_id` names a path of this file system."""

    @abc.abstractmethod
    def exists(self, path) -> bool:
        """Whether `path` exists."""

    @abc.abstractmethod
    def rm_file(self, path) -> None:
        """Removes the file `path`."""


class FileSystem(FileSystemBase):
    """The local file system through pathlib and the built-in open."""

    @contextmanager
    def create_stream(self, path, mode: str):
        if "b" not in mode:
            raise ValueError(f"FileSystem.create_stream: mode {mode!r} is "
                             "not binary")
        with open(path, mode) as stream:
            yield stream

    def concat_path(self, path, suffix: str) -> Path:
        return Path(path) / suffix

    def rename(self, path, new_path) -> None:
        os.replace(path, new_path)

    def init_path(self, path) -> Path:
        return Path(path)

    def mkdir(self, path) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        if isinstance(checkpoint_id, Path):
            return True
        if not isinstance(checkpoint_id, str) or "://" in checkpoint_id:
            return False
        for parent in Path(checkpoint_id).absolute().parents:
            if parent.exists() and os.access(parent, os.W_OK):
                return True
        return False

    def exists(self, path) -> bool:
        return Path(path).exists()

    def rm_file(self, path) -> None:
        Path(path).unlink()

    def rm_tree(self, path) -> None:
        """Removes the directory `path` and everything under it."""
        shutil.rmtree(path)


@runtime_checkable
class CheckpointableTensor(Protocol):
    """A local tensor that holds shards of a larger, global tensor:
    global_shape is the global tensor's shape; shard i is the box of
    local_sizes[i] starting at local_offsets[i] in the local tensor, and
    starts at global_offsets[i] in the global tensor. A plain torch tensor
    with these four attributes set is saved as those chunks and loaded
    from the checkpoint's boxes (whatever sharding saved them)."""

    global_shape: tuple
    global_offsets: tuple
    local_offsets: tuple
    local_sizes: tuple


# The protocol methods whose override dcp cannot honour (set_up_planner it
# honours: dcp._planner_hooks; resolve_bytes no reader of torch's calls).
_SAVE_PLANNER_METHODS = ("create_local_plan",
                         "create_global_plan", "finish_plan", "resolve_data",
                         "transform_object", "lookup_object")
_LOAD_PLANNER_METHODS = ("create_local_plan",
                         "create_global_plan", "finish_plan", "load_bytes",
                         "resolve_tensor", "commit_tensor",
                         "transform_tensor", "lookup_tensor")
_WRITER_METHODS = ("set_up_storage_writer", "prepare_local_plan",
                   "prepare_global_plan", "write_data", "finish",
                   "storage_meta")
_READER_METHODS = ("read_metadata", "set_up_storage_reader",
                   "prepare_local_plan", "prepare_global_plan", "read_data")


def _overridden(obj, base: type, methods) -> Optional[str]:
    """The first of `methods` that type(obj) defines below `base` (a class
    of dcp's), or None."""
    for klass in type(obj).__mro__:
        if klass is base:
            return None
        for name in methods:
            if name in vars(klass):
                return f"{klass.__qualname__}.{name}"
    return None


def _refuse(what: str, obj, method: str, supported: str) -> TypeError:
    return TypeError(
        f"{what} {type(obj).__qualname__} overrides {method}, which dcp "
        "would not call: dcp plans and does its I/O in the engine "
        "(libdcp.so), so only the options of its own classes take effect. "
        f"Pass {supported}, or a subclass that overrides none of the "
        "protocol's methods")


def _qualified(cls: type) -> str:
    """`module.Class`, so that torch's class of the same name as dcp's
    reads as torch's ("torch.distributed.checkpoint.default_planner
    .DefaultSavePlanner")."""
    module = getattr(cls, "__module__", None)
    if not module or module == "builtins":
        return cls.__qualname__
    return f"{module}.{cls.__qualname__}"


def check_planner(planner, default: type, kind: str,
                  torch_class: bool = False) -> None:
    """Raises TypeError unless `planner` is None or a `default` (dcp's
    DefaultSavePlanner / DefaultLoadPlanner, or with `torch_class` torch's)
    overriding no protocol method. `kind` is "save" or "load"."""
    if planner is None:
        return
    if not isinstance(planner, default):
        raise TypeError(
            f"planner {_qualified(type(planner))} is not supported: dcp "
            f"plans in the engine; pass dcp.{default.__name__}(...) or "
            f"torch's (their options are honoured)")
    methods = _SAVE_PLANNER_METHODS if kind == "save" else \
        _LOAD_PLANNER_METHODS
    method = _overridden(planner, default, methods)
    if method is not None:
        raise _refuse("planner", planner, method,
                      f"a {default.__name__}" + (" (dcp's or torch's)"
                                                 if not torch_class else
                                                 " (torch's or dcp's)"))


def check_storage(storage, classes: tuple, kind: str) -> None:
    """Raises TypeError unless `storage` is None or an instance of one of
    `classes` (dcp's writers or readers) overriding no protocol method.
    `kind` is "storage_writer" or "storage_reader"."""
    if storage is None:
        return
    names = ", ".join(f"dcp.{c.__name__}" for c in classes)
    # The most derived of dcp's classes that `storage` is an instance of.
    base = next((c for c in type(storage).__mro__ if c in classes), None)
    if base is None:
        raise TypeError(
            f"{kind} {_qualified(type(storage))} is not supported: dcp "
            f"does its I/O in the engine; pass one of {names}")
    methods = _WRITER_METHODS if kind == "storage_writer" else \
        _READER_METHODS
    method = _overridden(storage, base, methods)
    if method is not None:
        raise _refuse(kind, storage, method, f"one of {names}")
