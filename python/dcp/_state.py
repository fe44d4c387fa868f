"""A Python state dict as a dcp_state_dict_t, and the loaded values back.

Save: `flatten()` walks the caller's nested dicts, lists and tuples once,
collecting tensor leaves (torch tensors, numpy arrays, DTensor and
ShardedTensor chunks) and plain values, then hands every tensor to the
engine in ONE dcp_state_dict_set_tensors call: the DLTensor, path and shard
arrays are laid out in numpy buffers column by column, so the per-tensor
Python work is reading data_ptr/shape/stride/dtype/device into lists (no
ctypes object per tensor, no DLPack capsule). Plain values take one C call
each (they are few).

Load: the same walk, in "load" mode. Tensors are the destinations (the
engine writes into their memory); plain values get a placeholder that the
engine replaces when the checkpoint holds the key, and `Flat.write_back()`
puts each loaded value into the caller's container: dicts and lists in
place (a list reached by two paths: a new one at the later, as torch's load
gives each key its own), tuples rebuilt from the caller's structure (so
they stay tuples, and namedtuples stay namedtuples), numpy scalars
converted back to their type.

Values: None, bool, int, float, str, bytes round-trip with their type
(bytes and bytearray are stored alike: a load gives the destination's of
the two). An int outside int64 (a 128-bit RNG state, a hash) is stored as
bytes: a marker and its decimal digits, decoded without pickle; so are
complex, torch.dtype and torch.device values (their own markers). A list
or tuple of such values only (and of lists and tuples of them) is one
value too, stored whole (SEQ_MARKER, _pack), as torch's DCP stores it. Other
objects are stored as pickled bytes behind a marker, only with
allow_pickle=True on save and on load (unpickling runs code): so are numpy
arrays and torch tensors of dtypes dcp does not store as tensors (str,
object, datetime64, float128 arrays; quantized tensors), which build()
makes plain values (Flat._unstorable_as_values). A user bytes
value that happens to start with a marker's prefix is escaped, so no bytes
value is ever mistaken for a pickle or another marked value.

Keys: str, and int (as str(k); optimizer state uses int keys) mapping back
to the caller's key on load. Other key types raise TypeError.

Memory: tensors are borrowed, never copied, except (a) non-contiguous
tensors where the engine path cannot take strides (see the flags below)
and (b) numpy arrays with negative strides (np.flip, a[::-1]), which
DLPack cannot describe: a save takes a contiguous copy, a load goes
through a contiguous temporary copied back. The Flat object keeps every
tensor it passed alive; keep it until the save (or the staging of an
async save) is done.
"""

from __future__ import annotations

import copy
import ctypes
import itertools
import math
import pickle
import struct
import sys

import numpy as np

from . import _lib, errors
from ._lib import Path

try:
    import torch
except ImportError:  # numpy-only use
    torch = None

# A synchronous save of a strided (non-contiguous) CPU tensor: False makes a
# contiguous copy in Python first. Decided by tests against libdcp.so.
SAVE_STRIDED_CPU = True
# A load into a strided tensor: False loads into a contiguous temporary
# and copies it back.
LOAD_STRIDED = True
# A load into a strided device tensor whose elements lie in runs shorter
# than this many bytes (a transposed matrix: one element) goes through a
# contiguous device temporary and copy_: the engine uploads a strided
# destination one run per copy, and a copy costs microseconds.
DEVICE_LOAD_RUN_BYTES = 256 << 10


def contiguous_run_bytes(shape, strides, element_size) -> int:
    """Bytes of a tensor of `shape`/`strides` (in elements) adjacent in
    memory from any element that starts a run: its trailing dimensions
    whose stride equals the element count inside them (size-1 dimensions
    never step)."""
    run = 1
    for size, stride in zip(reversed(tuple(shape)), reversed(tuple(strides))):
        if size == 1:
            continue
        if stride != run:
            break
        run *= size
    return run * element_size

PICKLE_MARKER = b"\x00dcp.pickle.v1\x00"
# What an empty list or tuple is saved as (a plain leaf at its path: torch's
# DCP stores it whole, and its load returns it), so that it loads back.
EMPTY_LIST_MARKER = b"\x00dcp.empty.list.v1\x00"
EMPTY_TUPLE_MARKER = b"\x00dcp.empty.tuple.v1\x00"
BYTES_ESCAPE = b"\x00dcp.bytes.v1\x00"
# An int outside int64 (VALUE_INT holds those in it): this marker, then
# its decimal ASCII digits, "-" first if negative (2**64 is stored as
# b"\x00dcp.int.v1\x0018446744073709551616").
INT_MARKER = b"\x00dcp.int.v1\x00"
# Values of a few types common in a training run's configuration, stored
# without pickle: a torch.dtype by its name in torch ("bfloat16"), a
# torch.device by str() ("cuda:0"), a complex by its real and imaginary
# parts as two float64 (little-endian).
TORCH_DTYPE_MARKER = b"\x00dcp.torch.dtype.v1\x00"
TORCH_DEVICE_MARKER = b"\x00dcp.torch.device.v1\x00"
COMPLEX_MARKER = b"\x00dcp.complex.v1\x00"
# A list or tuple of plain values only (lists and tuples of them too, at
# any depth up to _MAX_SEQ_DEPTH), stored whole as one value at its path,
# as torch's DCP stores such a list: this marker, then the encoding of
# _pack (FORMAT.md section 5). One item instead of one per element, and
# tuples come back as tuples where the load has no destination to go by.
SEQ_MARKER = b"\x00dcp.seq.v1\x00"
# Save: False stores such lists item by item, as dcp did before SEQ_MARKER
# (tests make such checkpoints with it; loads read both).
PACK_PLAIN_LISTS = True
_MAX_SEQ_DEPTH = 200
_MARKER_PREFIX = b"\x00dcp."
# Placeholder of a plain value before a load: what the engine leaves when
# the checkpoint lacks the key (allow_partial_load).
_UNLOADED = b"\x00dcp.unloaded\x00" + bytes(range(16))

# The engine's cap on how far past its end one path may grow a list
# (capi/internal/state_tree.cc kMaxListGrowth): a larger index is a
# mistake, and growing a list to it could take all memory.
MAX_LIST_GROWTH = 1 << 20

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1

# DLPack (code, bits) and dcp_dtype_t by dtype.
_DL_BOOL = 6
_DL_INT, _DL_UINT, _DL_FLOAT, _DL_BFLOAT, _DL_COMPLEX = 0, 1, 2, 4, 5
_DL_F8_E4M3FN, _DL_F8_E4M3FNUZ, _DL_F8_E5M2, _DL_F8_E5M2FNUZ = 10, 11, 12, 13
_DL_F8_E8M0FNU, _DL_F4_E2M1FN = 14, 17

# name -> (dl code, bits, dcp dtype)
_BY_NAME = {
    "bool": (_DL_BOOL, 8, 0), "uint8": (_DL_UINT, 8, 1),
    "int8": (_DL_INT, 8, 2), "uint16": (_DL_UINT, 16, 3),
    "int16": (_DL_INT, 16, 4), "uint32": (_DL_UINT, 32, 5),
    "int32": (_DL_INT, 32, 6), "uint64": (_DL_UINT, 64, 7),
    "int64": (_DL_INT, 64, 8), "float16": (_DL_FLOAT, 16, 9),
    "bfloat16": (_DL_BFLOAT, 16, 10), "float32": (_DL_FLOAT, 32, 11),
    "float64": (_DL_FLOAT, 64, 12), "float8_e4m3fn": (_DL_F8_E4M3FN, 8, 13),
    "float8_e5m2": (_DL_F8_E5M2, 8, 14), "complex64": (_DL_COMPLEX, 64, 15),
    "complex128": (_DL_COMPLEX, 128, 16),
    "float8_e4m3fnuz": (_DL_F8_E4M3FNUZ, 8, 17),
    "float8_e5m2fnuz": (_DL_F8_E5M2FNUZ, 8, 18),
    "float8_e8m0fnu": (_DL_F8_E8M0FNU, 8, 19),
    # Two 4-bit lanes per element (one byte), as torch's DLPack has it.
    "float4_e2m1fn_x2": (_DL_F4_E2M1FN, 4, 20),
    "complex32": (_DL_COMPLEX, 32, 21),
}
_LANES = {"float4_e2m1fn_x2": 2}
# dcp dtype -> name
DCP_DTYPE_NAMES = {v[2]: k for k, v in _BY_NAME.items()}

# The dtypes the engine converts between on load (convert_dtypes): dcp
# codes (float16, bfloat16, float32, float64) and their torch dtypes.
_ENGINE_CONVERTS = frozenset((9, 10, 11, 12))
_ENGINE_CONVERTS_TORCH = frozenset(
    getattr(torch, n) for n in ("float16", "bfloat16", "float32", "float64")
) if torch is not None else frozenset()
_ENGINE_CONVERTS_NUMPY = frozenset(
    np.dtype(n) for n in ("float16", "float32", "float64"))

# torch.dtype -> packed DLDataType (code | bits << 8 | lanes << 16).
_TORCH_DL = {}
if torch is not None:
    for _name, (_code, _bits, _) in _BY_NAME.items():
        _dt = getattr(torch, _name, None)
        if _dt is not None:
            _TORCH_DL[_dt] = _code | (_bits << 8) | (
                _LANES.get(_name, 1) << 16)


def torch_dtype(dcp_dtype: int):
    """The torch.dtype of a dcp dtype code (its name without torch)."""
    name = DCP_DTYPE_NAMES.get(dcp_dtype)
    if name is None:
        return None
    if torch is not None:
        return getattr(torch, name, name)
    return name


# numpy-compatible structured layouts of the C structs.
DLTENSOR_DTYPE = np.dtype({
    "names": ["data", "device_type", "device_id", "ndim", "dtype", "shape",
              "strides", "byte_offset"],
    "formats": ["<u8", "<i4", "<i4", "<i4", "<u4", "<u8", "<u8", "<u8"],
    "offsets": [0, 8, 12, 16, 20, 24, 32, 40],
    "itemsize": 48,
})
PATH_ELEM_DTYPE = np.dtype({"names": ["key", "index"],
                            "formats": ["<u8", "<i8"],
                            "offsets": [0, 8], "itemsize": 16})
PATH_DTYPE = np.dtype({"names": ["elems", "len"], "formats": ["<u8", "<u8"],
                       "offsets": [0, 8], "itemsize": 16})
SHARD_DTYPE = np.dtype({"names": ["ndim", "global_shape", "offsets"],
                        "formats": ["<i4", "<u8", "<u8"],
                        "offsets": [0, 8, 16], "itemsize": 24})
assert DLTENSOR_DTYPE.itemsize == ctypes.sizeof(_lib.DLTensor)
assert PATH_DTYPE.itemsize == ctypes.sizeof(_lib.Path)
assert SHARD_DTYPE.itemsize == ctypes.sizeof(_lib.Shard)


def _addr(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


class ShardedTensor:
    """This rank's chunk of a tensor sharded across ranks.

    `local` is the chunk (a torch tensor or numpy array), `global_shape` the
    whole tensor's shape and `offsets` where the chunk starts in it. Saving
    the same name from every rank with its own chunk writes one global
    tensor; loading fills `local` with that box of the checkpoint, whatever
    sharding saved it. (DTensor values are handled without this wrapper.)
    """

    __slots__ = ("local", "global_shape", "offsets")

    def __init__(self, local, global_shape, offsets):
        self.local = local
        self.global_shape = tuple(int(s) for s in global_shape)
        self.offsets = tuple(int(o) for o in offsets)
        if len(self.global_shape) != len(self.offsets) or len(
                self.offsets) != len(local.shape):
            raise ValueError(
                f"ShardedTensor: local shape {tuple(local.shape)}, global "
                f"shape {self.global_shape} and offsets {self.offsets} must "
                "have the same length")

    def __repr__(self):
        return (f"ShardedTensor(local={tuple(self.local.shape)}, "
                f"global_shape={self.global_shape}, offsets={self.offsets})")


def _is_dtensor(value) -> bool:
    return (hasattr(value, "device_mesh") and hasattr(value, "placements")
            and callable(getattr(value, "to_local", None)))


def _strided_shard_type():
    """torch's _StridedShard (FSDP2 over TP), or None in a torch without
    it. Not a Shard subclass in every torch."""
    try:
        from torch.distributed.tensor.placement_types import _StridedShard
    except ImportError:
        return None
    return _StridedShard


def _chunk_runs(runs, n, i):
    """Piece `i` of the index runs [(start, stop), ...] split in `n` as
    torch.chunk splits (pieces of ceil(len / n), the last ones shorter or
    empty)."""
    total = sum(b - a for a, b in runs)
    size = -(-total // n)
    lo, hi = min(i * size, total), min((i + 1) * size, total)
    out, pos = [], 0
    for a, b in runs:
        s, e = max(a, a + lo - pos), min(b, a + hi - pos)
        if s < e:
            out.append((s, e))
        pos += b - a
    return out


def _check_box(value, name, placements, strided, local_shape, offsets):
    """Raises unless this rank's elements of a DTensor with _StridedShard
    placements are the box (local_shape, offsets): a _StridedShard applied
    after another shard of its dim can give every rank strided rows, which
    one chunk cannot describe."""
    from torch.distributed.tensor import Replicate
    coord = value.device_mesh.get_coordinate()
    mesh_shape = value.device_mesh.shape
    runs = {}
    for mesh_dim, p in enumerate(placements):
        if isinstance(p, Replicate):
            continue
        d = p.dim
        cur = runs.get(d, [(0, value.shape[d])])
        n, r = mesh_shape[mesh_dim], coord[mesh_dim]
        if strided is not None and isinstance(p, strided):
            cur = [run for j in range(p.split_factor)
                   for run in _chunk_runs(_chunk_runs(cur, p.split_factor, j),
                                          n, r)]
        else:
            cur = _chunk_runs(cur, n, r)
        runs[d] = cur
    for d, cur in runs.items():
        merged = []
        for a, b in cur:
            if merged and merged[-1][1] == a:
                merged[-1] = (merged[-1][0], b)
            else:
                merged.append((a, b))
        if not merged or len(merged) == 1 and merged[0] == (
                offsets[d], offsets[d] + local_shape[d]):
            continue
        raise ValueError(
            f"'{name}': DTensor placements {placements} give this rank the "
            f"indices {merged} of dim {d}, not one contiguous range; dcp "
            "saves and loads one box per rank")


def _is_async_collective(t) -> bool:
    """Whether `t` is torch's AsyncCollectiveTensor (a collective's
    result not yet waited for)."""
    try:
        from torch.distributed._functional_collectives import \
            AsyncCollectiveTensor
    except ImportError:
        return False
    return isinstance(t, AsyncCollectiveTensor)


def _dtensor_chunk(value, name):
    """(local tensor, global shape, offsets) of a DTensor; offsets None when
    every placement is Replicate (the tensor is saved as a plain one). On a
    rank outside the DTensor's mesh: an empty chunk of it, or None (a 0-d
    one, which has no empty chunk): that rank saves and loads none of it."""
    from torch.distributed.tensor import Replicate, Shard
    strided = _strided_shard_type()
    placements = tuple(value.placements)
    for p in placements:
        if isinstance(p, (Replicate, Shard)) or (
                strided is not None and isinstance(p, strided)):
            continue
        if getattr(p, "is_partial", lambda: False)():
            raise ValueError(
                f"'{name}': DTensor placement {p} holds partial values "
                "(Partial); redistribute it to Replicate or Shard first")
        raise ValueError(
            f"'{name}': DTensor placement {p} is not supported (only Shard, "
            "_StridedShard and Replicate)")
    local = value.to_local()
    if _is_async_collective(local):
        # The result of an async_op redistribute: a wrapper without
        # storage until its collective is waited for.
        local = local.wait()
    in_mesh = value.device_mesh.get_coordinate() is not None
    if not in_mesh:
        gshape = tuple(int(s) for s in value.shape)
        if not gshape:
            return None
        empty = (0,) + gshape[1:]
        if local.numel() != 0:
            local = local.new_empty(empty)
        return local.reshape(empty), gshape, (0,) * len(gshape)
    if all(isinstance(p, Replicate) for p in placements):
        if tuple(local.shape) != tuple(value.shape):
            raise ValueError(
                f"'{name}': replicated DTensor of shape "
                f"{tuple(value.shape)} has a local tensor of shape "
                f"{tuple(local.shape)}")
        return local, None, None
    from torch.distributed.tensor._utils import \
        compute_local_shape_and_global_offset
    local_shape, offsets = compute_local_shape_and_global_offset(
        value.shape, value.device_mesh, placements)
    local_shape = tuple(int(s) for s in local_shape)
    offsets = tuple(int(o) for o in offsets)
    if tuple(local.shape) != local_shape:
        raise ValueError(
            f"'{name}': DTensor local tensor has shape "
            f"{tuple(local.shape)} but its placements {placements} give "
            f"this rank {local_shape} of the global shape "
            f"{tuple(value.shape)} (dcp needs the torch.chunk split "
            "DTensor makes; uneven from_local shards are not supported)")
    if strided is not None and any(isinstance(p, strided)
                                   for p in placements):
        _check_box(value, name, placements, strided, local_shape, offsets)
    return local, tuple(value.shape), offsets


def _may_overlap(shape, strides, item) -> bool:
    """Whether two elements of a view with `shape` and `strides` (in units
    where one element spans `item`) may share memory. Conservative: False
    proves they do not (each dimension, by increasing stride, steps past
    everything the smaller ones span); a rare interleaved layout that does
    not overlap still gets True."""
    if 0 in shape:
        return False
    reach = 0  # the span of the dimensions so far, less one element
    for stride, n in sorted((abs(st), n) for st, n in zip(strides, shape)
                            if n > 1):
        if stride < reach + item:
            return True
        reach += stride * (n - 1)
    return False


def _tensor_may_overlap(t) -> bool:
    """Whether elements of torch tensor `t` may share memory: torch's own
    test when this torch has it and can tell, else _may_overlap."""
    check = getattr(torch, "_debug_has_internal_overlap", None)
    if check is not None:
        verdict = check(t)  # 0: no, 1: yes, 2: too hard to tell
        if verdict in (0, 1):
            return verdict == 1
    return _may_overlap(t.shape, t.stride(), 1)


def storages_of(objs) -> list:
    """What keeps the memory of `objs` (torch tensors, numpy arrays)
    allocated even if a tensor is given another storage: the storages of
    the torch tensors, the arrays themselves. (Resizing a storage in place,
    `resize_`, still frees its memory.)"""
    return [o if isinstance(o, np.ndarray) else o.untyped_storage()
            for o in objs]


class _Extras:
    """What Flat keeps for few state dicts, in one attribute (Flat._x)."""

    __slots__ = ("list_ids", "aliases", "empty_dicts", "unstorable", "root",
                 "tensors_only", "plain_tuples")

    def __init__(self):
        # Load only: the ids of the caller's lists walked, and (parent,
        # key, new list) where write_back puts a new list: for a list
        # reached again by another path (Flat._unalias), or the saved list
        # an empty dict takes (reshape_lists).
        self.list_ids: set = set()
        self.aliases: list = []
        # Load only: the empty dicts below the top level: (path, the dict,
        # parent, key, len(v_paths) when walked), which reshape_lists
        # checks against the checkpoint (they have no leaf to load).
        self.empty_dicts: list = []
        # Load only: (path, dtype) of the tensor destinations of a dtype
        # dcp does not store as a tensor, which load a saved (pickled) value
        # instead (Flat._unstorable_as_values).
        self.unstorable: list = []
        # The top-level state dict (Flat.add).
        self.root = None
        # Flat._tensors_only's answer by metadata handle.
        self.tensors_only: dict = {}
        # Load only: the namedtuples of plain values (no container inside)
        # outside lists of plain values, as _plain_lists entries (Flat):
        # they load item by item, or whole where the checkpoint holds a
        # tuple saved whole at their path (reshape_lists).
        self.plain_tuples: list = []


class Flat:
    """One state dict, flattened (see the module comment)."""

    def __init__(self, load: bool, allow_pickle: bool):
        self.load = load
        self.allow_pickle = allow_pickle
        self._key_ids: dict[str, int] = {}
        self._keys: list[bytes] = []
        self._path: list[int] = []
        # Tensor leaves: path, the object whose memory goes to C, and the
        # shard (global shape, offsets) or None.
        self.t_paths: list[tuple] = []
        self.t_objs: list = []
        self.t_shards: list = []
        # Tensors that are chunks of one sharded tensor with several local
        # chunks (a CheckpointableTensor with several shards): lists of
        # indices into t_paths (one path each).
        self._multi: list[list[int]] = []
        # Save only: indices (into t_paths) of tensors with requires_grad,
        # recorded in the metadata's TensorProperties.
        self.t_grad: list[int] = []
        # Plain leaves: path, (kind, payload) to set.
        self.v_paths: list[tuple] = []
        self.v_vals: list = []
        # Load only: where each plain leaf goes back (container, key, old).
        self.v_slots: list = []
        # Load only: (tuple container as list, type, parent, key) to rebuild.
        self._tuples: list = []
        # Load only: the outermost lists and tuples holding plain values
        # only (nested ones too, no tensor, no map), which a load replaces
        # whole when the checkpoint's list differs (reshape_lists): (path,
        # the list or tuple, its target, first and end index of its plain
        # leaves, first and end index of the _tuples inside it, whether it
        # holds lists or tuples).
        self._plain_lists: list = []
        self._not_plain = 0  # maps and other containers walked, load only
        # Load only: the tuples (namedtuples too) loading item by item (not
        # in a list of plain values): (path, the tuple, leaves inside,
        # whether it may hold containers).
        self._item_tuples: list = []
        # Load only: (target, new items, tuples inside to rebuild) of the
        # lists reshape_lists replaced.
        self._replaced: list = []
        # What few state dicts need (_Extras). One attribute for them all:
        # past 30 attributes CPython (3.11+) keeps an instance's attributes
        # in a dict of its own, and every self.x of the walk gets slower
        # (5% of a 100k-tensor walk).
        self._x = _Extras()
        # Load only: (destination, contiguous temporary).
        self.copy_back: list = []
        # Load only: the engine converts some tensors to their destination
        # dtype (convert_on_load): the load must ask for convert_dtypes.
        self.engine_converts = False
        # Load only: DTensor destinations (their local tensors are in
        # t_objs).
        self._wrappers: list = []
        self.has_cuda = False
        self.cuda_devices: set = set()
        # Load only, after build(): bytes of host destinations whose memory
        # is not 4 KiB aligned, and of all host destinations.
        self.unaligned_host_bytes = 0
        self.host_bytes = 0
        self._arrays = []  # numpy buffers the C state dict points into
        self._paths_arr = None
        self._values_paths_arr = None

    # -- the walk ----------------------------------------------------------

    def name(self, path=None) -> str:
        path = self._path if path is None else path
        keys = self._keys
        return ".".join(keys[e >> 1].decode() if not e & 1 else str(e >> 1)
                        for e in path)

    def _key(self, key) -> int:
        if type(key) is not str:
            if isinstance(key, bool) or not isinstance(key, (str, int)):
                raise TypeError(
                    f"state dict key {key!r} at '{self.name()}' is a "
                    f"{type(key).__name__}; dcp supports str and int keys")
            key = str(key) if isinstance(key, int) else str.__str__(key)
        kid = self._key_ids.get(key)
        if kid is None:
            if "\0" in key:
                raise ValueError(f"state dict key {key!r} contains NUL")
            try:
                encoded = key.encode()
            except UnicodeEncodeError:
                raise ValueError(
                    f"state dict key {key!r} at '{self.name()}' is not "
                    "valid Unicode (a lone surrogate); dcp stores keys as "
                    "UTF-8") from None
            kid = len(self._keys)
            self._key_ids[key] = kid
            self._keys.append(encoded)
        return kid << 1

    def add(self, obj) -> None:
        """Walks the top-level state dict (a dict)."""
        if not isinstance(obj, dict):
            raise TypeError(
                f"state_dict must be a dict, not {type(obj).__name__}")
        self._x.root = obj
        self._dict(obj, None, None)

    def _dict(self, d, parent, key) -> None:
        path = self._path
        seen = None
        self._not_plain += 1
        if not d and self.load and path:
            self._x.empty_dicts.append((tuple(path), d, parent, key,
                                        len(self.v_paths)))
        for k, v in d.items():
            enc = self._key(k)
            if type(k) is not str:
                seen = seen if seen is not None else {
                    kk for kk in d if type(kk) is str}
                if str(k) in seen:
                    raise ValueError(
                        f"keys {k!r} and {str(k)!r} at '{self.name()}' "
                        "collide (int keys are stored as str)")
                seen.add(str(k))
            path.append(enc)
            self._value(v, d, k)
            path.pop()

    def _seq(self, seq, parent, key) -> None:
        path = self._path
        if not self.load:
            if not seq:
                self.v_paths.append(tuple(path))
                self.v_vals.append((_lib.VALUE_BYTES, EMPTY_TUPLE_MARKER
                                    if isinstance(seq, tuple) else
                                    EMPTY_LIST_MARKER))
                return
            packed = _pack(seq) if PACK_PLAIN_LISTS and (
                type(seq) is list or type(seq) is tuple) else None
            if packed is not None:
                self.v_paths.append(tuple(path))
                self.v_vals.append((_lib.VALUE_BYTES, packed))
                return
        target = seq
        if not isinstance(seq, list):  # a tuple: rebuilt after a load
            if self.load:
                if type(seq) is not tuple and _is_seq(seq):
                    self._check_rebuilds(seq)
                target = list(seq)
                self._tuples.append((target, type(seq), parent, key))
        elif self.load:
            ids = self._x.list_ids
            if id(seq) in ids:
                # Reached before by another path: loads into a new list.
                seq = target = self._unalias(seq, parent, key)
            else:
                ids.add(id(seq))
        if self.load:
            mark = (len(self.t_paths), len(self.v_paths), len(self._tuples),
                    len(self._plain_lists), self._not_plain,
                    len(self._item_tuples), len(self._x.plain_tuples))
        if self.load and all(map(_SCALAR_TYPES.__contains__,
                                 map(type, seq))):
            # Scalars only: what _plain appends for each, at once.
            base = tuple(path)
            self.v_paths += [base + ((i << 1) | 1,) for i in range(len(seq))]
            self.v_slots += [(target, i, v) for i, v in enumerate(seq)]
            self.v_vals += [(_lib.VALUE_BYTES, _UNLOADED)] * len(seq)
        else:
            for i, v in enumerate(seq):
                path.append((i << 1) | 1)
                self._value(v, target, i)
                path.pop()
        if self.load:
            t0, v0, tu0, pl0, np0, it0, pt0 = mark
            if len(self.t_paths) == t0 and self._not_plain == np0 and \
                    _is_seq(seq):
                # Plain values only: replaces the plain lists inside (and
                # rebuilds the namedtuples inside).
                nested = len(self._plain_lists) > pl0 or \
                    len(self._tuples) > tu0
                del self._plain_lists[pl0:]
                del self._item_tuples[it0:]
                del self._x.plain_tuples[pt0:]
                self._plain_lists.append((tuple(path), seq, target, v0,
                                          len(self.v_paths), tu0,
                                          len(self._tuples), nested,
                                          parent, key))
            else:
                if target is not seq:
                    # A tuple loading item by item: its saved length must
                    # be its own (check_tuple_lengths).
                    self._item_tuples.append(
                        (tuple(path), seq, len(self.t_paths) - t0 +
                         len(self.v_paths) - v0, len(self._tuples) > tu0 or
                         len(self._plain_lists) > pl0 or
                         self._not_plain != np0))
                    if len(self.t_paths) == t0 and self._not_plain == np0 \
                            and len(self._tuples) == tu0 and \
                            len(self._plain_lists) == pl0:
                        # A namedtuple of plain values, none a container:
                        # a plain list's entry, which reshape_lists fits
                        # only to a value saved at its path (a tuple saved
                        # whole).
                        self._x.plain_tuples.append(
                            (tuple(path), seq, target, v0, len(self.v_paths),
                             tu0, tu0, False, parent, key))
                if len(self.t_paths) != t0 or self._not_plain != np0:
                    self._not_plain += 1
                # else a namedtuple of plain values: plain to a list around
                # it (which reshape_lists may rebuild it in), its fields
                # fixed (not refitted on its own).

    def _unalias(self, seq, parent, key):
        """Load only: a new list of the items of the caller's list `seq`
        (at `parent[key]`), which an earlier path of this walk reached too
        (the same object under two keys, as SequentialLR's state_dict()
        shares `_last_lr` with its first scheduler's): the walk loads into
        it and write_back puts it at parent[key] first, before any value,
        so each key gets its own saved values, as in torch (whose load
        gives every list of the state dict a new list). Filled in place,
        the first key's list would show the last key's values. `seq`, the
        one object, stays at the first path (refilled in place there)."""
        fresh = seq[:] if type(seq) is list else _copy_list(seq)
        self._x.aliases.append((parent, key, fresh))
        return fresh

    def _check_rebuilds(self, seq) -> None:
        """Load only: raises, naming the key, unless tuple subclass `seq`'s
        type can be rebuilt from a list of items, as write_back rebuilds it
        (torch.Size can), before the load writes anything."""
        try:
            type(seq)(list(seq))
        except Exception as e:
            raise errors.from_status(
                _lib.INVALID_ARGUMENT,
                f"'{self.name()}': the state dict's {type(seq).__name__} "
                "cannot be rebuilt from its items "
                f"({type(e).__name__}: {e}); a load rebuilds a tuple by "
                "calling its type with a list of the loaded items") from None

    def _value(self, v, parent, key) -> None:
        t = type(v)
        if torch is not None and (t is torch.Tensor or
                                  t is torch.nn.Parameter):
            if getattr(v, "global_shape", None) is None:
                self._tensor(v, None)
            else:
                self._checkpointable(v)
        elif t is dict:
            self._dict(v, parent, key)
        elif t is list or t is tuple:
            self._seq(v, parent, key)
        elif t is int or t is float or t is str or t is bool or v is None:
            self._plain(v, parent, key)
        else:
            self._other(v, parent, key)

    def _other(self, v, parent, key) -> None:
        if torch is not None and isinstance(v, torch.Tensor):
            if _is_dtensor(v):
                if self.load:
                    # Autograd saves the wrapper, whose version counter is
                    # its own (mark_written).
                    self._wrappers.append(v)
                chunk = _dtensor_chunk(v, self.name())
                if chunk is None:  # none of it on this rank
                    if isinstance(parent, (list, tuple)):
                        raise ValueError(
                            f"'{self.name()}': this rank is outside the "
                            "mesh of this 0-d DTensor and holds none of "
                            "it, which a list or tuple cannot leave out "
                            "(hold it in a dict)")
                else:
                    local, gshape, offsets = chunk
                    self._tensor(local, None if offsets is None else
                                 (gshape, offsets))
            elif _is_async_collective(v):
                self._tensor(v.wait(), None)
            elif getattr(v, "global_shape", None) is not None:
                self._checkpointable(v)
            else:
                self._tensor(v, None)
        elif isinstance(v, ShardedTensor):
            self._tensor(v.local, (v.global_shape, v.offsets))
        elif isinstance(v, np.ndarray):
            self._tensor(v, None)
        elif isinstance(v, dict):
            self._dict(v, parent, key)
        elif isinstance(v, (list, tuple)):
            self._seq(v, parent, key)
        else:
            self._plain(v, parent, key)

    def _checkpointable(self, t) -> None:
        """A CheckpointableTensor (dcp.interfaces): a local tensor holding
        a shard of the global tensor of shape t.global_shape."""
        name = self.name()
        try:
            gshape = tuple(int(s) for s in t.global_shape)
            goffsets = [tuple(int(o) for o in g) for g in t.global_offsets]
            loffsets = [tuple(int(o) for o in g) for g in t.local_offsets]
            lsizes = [tuple(int(s) for s in g) for g in t.local_sizes]
        except (AttributeError, TypeError, ValueError) as e:
            raise ValueError(
                f"'{name}': a tensor with global_shape must also carry "
                "global_offsets, local_offsets and local_sizes, one tuple "
                f"of ints per shard (CheckpointableTensor): {e}") from None
        if not (len(goffsets) == len(loffsets) == len(lsizes)):
            raise ValueError(
                f"'{name}': global_offsets, local_offsets and local_sizes "
                f"list {len(goffsets)}, {len(loffsets)} and {len(lsizes)} "
                "shards; they must list the same shards")
        if not goffsets:
            raise ValueError(f"'{name}': a CheckpointableTensor lists no "
                             "shards")
        ndim = t.dim()
        boxes = []
        for k in range(len(goffsets)):
            for what, v in (("global_shape", gshape),
                            ("global_offsets", goffsets[k]),
                            ("local_offsets", loffsets[k]),
                            ("local_sizes", lsizes[k])):
                if len(v) != ndim:
                    raise ValueError(
                        f"'{name}': {what} {v} has {len(v)} dims, the tensor "
                        f"{ndim}")
            box = []
            for d in range(ndim):
                lo, size = loffsets[k][d], lsizes[k][d]
                if lo < 0 or size < 0 or lo + size > t.shape[d] or \
                        goffsets[k][d] < 0 or \
                        goffsets[k][d] + size > gshape[d]:
                    raise ValueError(
                        f"'{name}': shard {k} of local offsets {loffsets[k]} "
                        f"and sizes {lsizes[k]} at global offsets "
                        f"{goffsets[k]} does not fit the local shape "
                        f"{tuple(t.shape)} and the global shape {gshape}")
                box.append(slice(lo, lo + size))
            boxes.append(box)
        if len(boxes) == 1:
            self._tensor(t[tuple(boxes[0])] if ndim else t,
                         (gshape, goffsets[0]))
            return
        if self.load:
            # Two shards loading into the same local memory: one would
            # silently overwrite the other.
            for j in range(len(boxes)):
                for k in range(j):
                    if all(a.start < b.stop and b.start < a.stop and
                           a.start < a.stop and b.start < b.stop
                           for a, b in zip(boxes[j], boxes[k])):
                        raise ValueError(
                            f"'{name}': shards {k} and {j} share local "
                            f"memory (local offsets {loffsets[k]} and "
                            f"{loffsets[j]}, sizes {lsizes[k]} and "
                            f"{lsizes[j]}); a load would write both there")
        # Several chunks at one path: the engine takes them as one sharded
        # tensor (_set_multi); their global boxes overlap nowhere (it
        # checks).
        first = len(self.t_paths)
        for k, box in enumerate(boxes):
            self._tensor(t[tuple(box)], (gshape, goffsets[k]))
        self._multi.append(list(range(first, len(self.t_paths))))

    def _tensor(self, t, shard) -> None:
        if not isinstance(t, np.ndarray) and (t.layout is not torch.strided
                                              or t.is_nested):
            raise ValueError(
                f"'{self.name()}': "
                + ("nested tensors are not supported by dcp (only dense, "
                   "strided ones)" if t.is_nested else
                   f"{t.layout} tensors are not supported by dcp (only "
                   "dense, strided ones; convert with to_dense())"))
        if self.load:
            t = self._load_destination(t)
        elif isinstance(t, np.ndarray):
            if any(s < 0 for s in t.strides):
                # DLPack has no negative strides. A copy, not
                # ascontiguousarray: it keeps one-item dimensions' strides.
                t = np.array(t, order="C")
        else:
            if t.requires_grad:
                self.t_grad.append(len(self.t_paths))
            if t.is_conj() or t.is_neg():
                # A lazily conjugated or negated view: its memory holds the
                # values before the conjugation or negation.
                t = t.resolve_conj().resolve_neg()
            if not SAVE_STRIDED_CPU and not t.is_cuda and \
                    not t.is_contiguous():
                t = t.contiguous()
        self.t_paths.append(tuple(self._path))
        self.t_objs.append(t)
        self.t_shards.append(shard)

    def copy_pinned(self) -> None:
        """Replaces every page-locked (pinned) CPU tensor leaf by a copy:
        a copy-on-write snapshot protects pages against the CPU's writes,
        but a device's DMA into pinned memory (a non_blocking copy of CPU
        offload) bypasses the protection and would reach the snapshot."""
        for i, t in enumerate(self.t_objs):
            if (torch is not None and isinstance(t, torch.Tensor)
                    and not t.is_cuda and t.is_pinned()):
                self.t_objs[i] = t.clone()

    def _load_destination(self, t):
        if isinstance(t, np.ndarray):
            if not t.flags.writeable:
                raise ValueError(
                    f"'{self.name()}': cannot load into a read-only numpy "
                    "array")
            if not t.flags.c_contiguous and _may_overlap(t.shape, t.strides,
                                                         t.itemsize):
                raise ValueError(
                    f"'{self.name()}': cannot load into a numpy array whose "
                    f"elements may share memory (shape {t.shape}, strides "
                    f"{t.strides} bytes; e.g. from as_strided or "
                    "broadcast_to)")
            if (not LOAD_STRIDED and not t.flags.c_contiguous) or \
                    any(s < 0 for s in t.strides):
                # A copy of the destination: what copy-back writes where the
                # checkpoint lacks the key (allow_partial_load). DLPack has
                # no negative strides (np.flip, a[::-1]).
                tmp = np.array(t, order="C")
                self.copy_back.append((t, tmp))
                return tmp
            return t
        if not t.is_contiguous() and _tensor_may_overlap(t):
            raise ValueError(
                f"'{self.name()}': cannot load into a tensor whose elements "
                f"share memory (shape {tuple(t.shape)}, strides "
                f"{tuple(t.stride())}; e.g. from expand, unfold or "
                "as_strided)")
        if t.is_conj() or t.is_neg() or (not LOAD_STRIDED and
                                         not t.is_contiguous()) or \
                (t.device.type != "cpu" and not t.is_contiguous() and
                 contiguous_run_bytes(t.shape, t.stride(), t.element_size())
                 < DEVICE_LOAD_RUN_BYTES):
            # copy_ back applies a lazy conjugation or negation. The
            # temporary starts as the values the destination shows: a key
            # the checkpoint lacks (allow_partial_load) copies them back
            # unchanged.
            tmp = torch.empty(t.shape, dtype=t.dtype, device=t.device)
            tmp.copy_(t)
            self.copy_back.append((t, tmp))
            return tmp
        return t

    def convert_on_load(self, sd, metadata) -> None:
        """Load only, before the load of `sd` (this Flat's build): where a
        destination tensor's dtype differs from the checkpoint's (the C
        metadata handle `metadata`), has it converted as torch's copy_
        converts. A torch tensor in host or CUDA memory, or a
        float16/32/64 numpy array, whose dtype and the saved one are both
        float64, float32, bfloat16 or float16 is converted by the engine
        (sets engine_converts: the load asks for convert_dtypes, which
        converts every tensor of those dtypes), reading a window of
        tensors at a time into host temporaries of the saved dtype (a CUDA
        destination's converted values go up through the load's pinned
        staging chunks). Any other loads into a host
        temporary of the saved dtype instead (for a device destination
        too), set in `sd` in the destination's place, which write_back
        copies into the destination (numpy: assignment). numpy destinations of other dtypes where numpy lacks
        the saved one (float8) are left for the load to refuse."""
        L = _lib.lib()
        count = ctypes.c_size_t()
        _lib.check(L.dcp_state_dict_dtype_mismatches(
            sd, metadata, 0, None, None, ctypes.byref(count)))
        if count.value == 0:
            return
        n = count.value
        indices = (ctypes.c_size_t * n)()
        dtypes = (ctypes.c_int32 * n)()
        _lib.check(L.dcp_state_dict_dtype_mismatches(
            sd, metadata, n, indices, dtypes, ctypes.byref(count)))
        info = _lib.sized(_lib.LeafInfo)
        name = ctypes.c_char_p()
        saved = {}
        for k in range(n):
            _lib.check(L.dcp_state_dict_leaf(sd, indices[k],
                                             ctypes.byref(name),
                                             ctypes.byref(info)))
            saved[name.value.decode()] = dtypes[k]
        # The temporaries already standing in for strided destinations.
        standing = {id(tmp): j for j, (_, tmp) in enumerate(self.copy_back)}
        changed = []
        seen = 0
        # Chunks of a sharded tensor after its first share its leaf.
        later_chunks = {i for g in self._multi for i in g[1:]}
        for i, path in enumerate(self.t_paths):
            # A sharded tensor's chunks are consecutive: its later chunks
            # come before the break.
            if seen == len(saved) and i not in later_chunks:
                break
            code = saved.get(self.name(path))
            if code is None:
                continue
            if i not in later_chunks:
                seen += 1
            t = self.t_objs[i]
            if code in _ENGINE_CONVERTS and (
                    (isinstance(t, np.ndarray)
                     and t.dtype in _ENGINE_CONVERTS_NUMPY)
                    or (torch is not None and isinstance(t, torch.Tensor)
                        and t.device.type in ("cpu", "cuda")
                        and t.dtype in _ENGINE_CONVERTS_TORCH)):
                self.engine_converts = True
                continue
            # The checkpoint holds the tensor (else it would not mismatch),
            # so a load that succeeds fills the whole temporary, and
            # write_back runs only after one: it needs no initial values.
            if isinstance(t, np.ndarray):
                np_name = DCP_DTYPE_NAMES.get(code)
                if np_name is None or not hasattr(np, np_name):
                    continue
                tmp = np.empty(t.shape, dtype=getattr(np, np_name))
            else:
                dtype = torch_dtype(code)
                if not isinstance(dtype, torch.dtype):
                    continue
                # On the host for a device destination too: write_back's
                # blocking copy_ converts on the CPU and uploads, holding
                # no device memory for the temporary (torch's DCP loads so
                # too). 4 KiB aligned, as O_DIRECT reads want.
                tmp = _aligned_host_empty(t.shape, dtype) \
                    if t.device.type != "cpu" else \
                    torch.empty(t.shape, dtype=dtype)
            j = standing.get(id(t))
            if j is not None:
                self.copy_back[j] = (self.copy_back[j][0], tmp)
            else:
                self.copy_back.append((t, tmp))
            self.t_objs[i] = tmp
            changed.append(i)
        if changed:
            self._set_tensors(L, sd, changed)

    def has_plain_lists(self) -> bool:
        """Whether reshape_lists has anything to fit or check."""
        x = self._x
        return bool(self._plain_lists or self._item_tuples or
                    x.empty_dicts or x.unstorable)

    def reshape_lists(self, metadata, flat_names: bool = False) -> bool:
        """Load only, after build() (build again when it returns True;
        without a build it still works, only slower): a list or tuple
        of plain values only (lists and tuples of them too) comes back as
        the checkpoint holds it, as torch's load returns such a list whole:
        where the saved list's shape differs (a `history` list that grew
        since the destination state was made), its plain leaves are the
        saved ones, in new lists that write_back puts in the destination
        list's place (its items replaced in place; inner tuples where the
        destination had a tuple at that index). Left as it is, for the
        load to check item by item: a list the checkpoint holds nothing
        under (absent, or saved empty: the format cannot tell), or holds
        tensors or maps under. `metadata`: the C metadata handle;
        `flat_names`: its items carry their flattened names only (MEGA), so
        the list indices are read off the names. An empty
        list or tuple inside is not stored (a None pads it where later
        items follow): the destination's empty container at that index is
        kept. Returns whether any list changed.

        Also refuses, naming the key, a tuple loading item by item (holding
        tensors or dicts, or a namedtuple outside a list of plain values)
        whose saved one has another number of items (check_tuple_lengths),
        and checks the state dict's containers without leaves, which
        nothing would load into, as torch's load checks them (it stores an
        empty list or tuple whole, at its key). A list or tuple without
        leaves (empty, or holding empty ones only) that the checkpoint
        holds no plain value at goes to the load as a placeholder at its
        key: where the checkpoint holds nothing there, or tensors or dicts
        under it, the load raises CheckpointNotFoundError naming it (with
        allow_partial_load the destination's stays); where it holds a
        tensor there, CheckpointValueError naming it. Storage that holds
        tensors only (Hugging Face, MEGA) leaves empty lists out, so there
        only a tensor at its name is reported. An empty dict (below the
        top level) is no missing key (empty dicts are not stored, as in
        torch) and loads nothing from dicts (or lists of tensors) saved
        under its key, as in torch, where the flattened state dict has no
        key for it; a plain value saved at its key replaces it and a list
        of plain values saved there comes back in a new list (torch's load
        does so only where a tensor is saved beside it, and keeps {}
        otherwise: dcp never drops a saved value silently); a tensor there
        makes the load raise
        CheckpointValueError naming it. A tensor of a dtype dcp does not
        store as a tensor (Flat._unstorable_as_values) where the checkpoint
        holds a tensor raises CheckpointValueError naming it."""
        if self._item_tuples:
            self.check_tuple_lengths(metadata, flat_names)
        if self._x.unstorable:
            self._check_unstorable(metadata, flat_names)
        if not self._plain_lists and not self._x.empty_dicts and \
                not self._x.plain_tuples:
            return False
        L = _lib.lib()
        first, count = ctypes.c_size_t(), ctypes.c_size_t()
        shortest, longest = ctypes.c_size_t(), ctypes.c_size_t()
        index = ctypes.c_size_t()
        # (first value index, 0 for an empty dict and 1 for a list, its
        # entry, what it takes), applied from the last: each replaces its
        # own range of the value leaves.
        changes = []
        for entry in self._plain_lists:
            path, seq, _, v0, v1, _, _, nested, _, _ = entry
            base = self.name(path) + "."
            _lib.check(L.dcp_metadata_find_prefix(
                metadata, base.encode(), ctypes.byref(first),
                ctypes.byref(count), ctypes.byref(shortest),
                ctypes.byref(longest)))
            n = count.value
            if n == 0:
                # Nothing saved under it: a value saved at its own path (an
                # empty list, or a value of another kind) replaces it, as
                # torch's load replaces it; else the load reports it missing
                # (without leaves, as a placeholder at its path).
                if self._holds_value_at(L, metadata, path, index,
                                        flat_names):
                    changes.append((v0, 1, entry, None))
                elif v0 == v1 and self._reports_leafless(
                        L, metadata, path, index, flat_names):
                    changes.append((v0, 1, entry, _NOT_PLAIN))
                continue
            if n == v1 - v0 and not flat_names and self._paths_arr is not None:
                # As many items as it has leaves, and its leaves saved at
                # their own paths (not another split of the same names):
                # the same shape. A flat list needs only its last item
                # saved, all items one level down: saved indices are
                # contiguous, so its own items fill the range.
                rows = range(len(self.t_paths) + v0, len(self.t_paths) + v1)
                if not nested:
                    if shortest.value == longest.value == len(path) + 1 \
                            and self._saved_at(L, metadata, rows[-1], index):
                        continue
                elif not _holds_empty(seq) and all(
                        self._saved_at(L, metadata, row, index)
                        for row in rows):
                    continue
            saved = self._saved_tree(L, metadata, path, first.value, n,
                                     base if flat_names else None)
            if saved is None or saved is _NOT_PLAIN:
                # No list items of plain values under it (keys that extend
                # its name; tensors or dicts): as for nothing saved under
                # it.
                if self._holds_value_at(L, metadata, path, index,
                                        flat_names):
                    changes.append((v0, 1, entry, None))
                elif v0 == v1 and (saved is _NOT_PLAIN or
                                   self._reports_leafless(
                                       L, metadata, path, index, flat_names)):
                    # Tensors or dicts at its indices or keys, and no leaf
                    # of the destination to load them into: a missing key.
                    changes.append((v0, 1, entry, _NOT_PLAIN))
                continue
            self._check_list_growth(saved, list(path))
            if _same_shape(seq, saved):
                continue
            changes.append((v0, 1, entry, saved))
        for entry in self._x.plain_tuples:
            path = entry[0]
            _lib.check(L.dcp_metadata_find_prefix(
                metadata, (self.name(path) + ".").encode(),
                ctypes.byref(first), ctypes.byref(count),
                ctypes.byref(shortest), ctypes.byref(longest)))
            if count.value == 0 and self._holds_value_at(
                    L, metadata, path, index, flat_names):
                changes.append((entry[3], 1, entry, None))
        for entry in self._x.empty_dicts:
            saved = self._fit_empty_dict(L, metadata, entry, flat_names,
                                         index)
            if saved is not None:
                changes.append((entry[4], 0, entry, saved))
        changes.sort(key=lambda c: c[:2])
        for _, is_list, entry, saved in reversed(changes):
            if not is_list:
                path, d, parent, key, at = entry
                if saved is _NOT_PLAIN:
                    # A value at its path, which replaces it, or a tensor,
                    # which the engine refuses naming the key.
                    paths, slots = [path], [(parent, key, d)]
                else:  # a list of plain values, loaded into a new list
                    paths, slots = [], []
                    items = _rebuild(None, saved, list(path), paths, slots,
                                     [])
                    self._x.aliases.append((parent, key, items))
                self.v_paths[at:at] = paths
                self.v_vals[at:at] = [(_lib.VALUE_BYTES, _UNLOADED)] * len(
                    paths)
                self.v_slots[at:at] = slots
                continue
            path, seq, target, v0, v1, tu0, tu1, _, parent, key = entry
            if saved is _NOT_PLAIN:
                # A placeholder at its path, which the checkpoint holds no
                # value at: the engine reports the key missing (or a tensor
                # there: "a value of type list in the state dict but a
                # tensor"), or skips it (allow_partial_load: the
                # destination's stays).
                self.v_paths[v0:v1] = [path]
                self.v_vals[v0:v1] = [(_lib.VALUE_BYTES, _UNLOADED)]
                self.v_slots[v0:v1] = [(parent, key, seq)]
                continue
            if saved is None:  # replaced whole by the value at its path
                # A None there is how checkpoints saved before empty lists
                # were stored padded one: it loads as an empty one of the
                # destination's kind (_EmptyHint).
                self.v_paths[v0:v1] = [path]
                self.v_vals[v0:v1] = [(_lib.VALUE_BYTES, _UNLOADED)]
                self.v_slots[v0:v1] = [(parent, key, _EmptyHint(seq))]
                del self._tuples[tu0:tu1]
                if target is not seq:  # a tuple: not rebuilt from target
                    del self._tuples[tu0 - 1]
                continue
            paths, slots, tuples = [], [], []
            items = _rebuild(seq, saved, list(path), paths, slots, tuples)
            self.v_paths[v0:v1] = paths
            self.v_vals[v0:v1] = [(_lib.VALUE_BYTES, _UNLOADED)] * len(paths)
            self.v_slots[v0:v1] = slots
            del self._tuples[tu0:tu1]
            self._replaced.append((target, items, tuples))
        return bool(changes)

    def check_tuple_lengths(self, metadata, flat_names: bool = False
                            ) -> None:
        """Load only, after build(): raises CheckpointValueError, naming
        the key and both lengths, where a tuple loading item by item (one
        holding tensors or dicts, or a namedtuple outside a list of plain
        values: _item_tuples) has a saved one of more items, before
        anything is loaded: the destination would drop the saved items
        past its end without a word (torch's load returns the saved tuple
        whole). A longer destination is left to the load: its extra items
        are missing keys (kept with allow_partial_load). One the
        checkpoint holds nothing under (absent, a plain value, a dict) is
        left to the load too. `metadata`, `flat_names`: as
        reshape_lists."""
        L = _lib.lib()
        first, count = ctypes.c_size_t(), ctypes.c_size_t()
        shortest, longest = ctypes.c_size_t(), ctypes.c_size_t()
        for path, seq, leaves, nested in self._item_tuples:
            name = self.name(path)
            _lib.check(L.dcp_metadata_find_prefix(
                metadata, (name + ".").encode(), ctypes.byref(first),
                ctypes.byref(count), ctypes.byref(shortest),
                ctypes.byref(longest)))
            n = count.value
            if n == 0:
                continue
            if n == len(seq) == leaves and not nested and not flat_names \
                    and shortest.value == longest.value == len(path) + 1:
                # As many items as it has, all one level down: its own.
                continue
            saved = self._saved_length(L, metadata, path, first.value, n,
                                       name + ".")
            if saved is None or saved <= len(seq):
                # (Longer: missing keys, or empty dicts and empty lists,
                # which storage holding tensors only, or saves before they
                # were stored, do not keep.)
                continue
            what = "tuple" if type(seq) is tuple else \
                f"{type(seq).__name__} (a tuple)"
            raise errors.from_status(
                _lib.INVALID_ARGUMENT,
                f"'{name}' was saved with {saved} item"
                f"{'s' if saved != 1 else ''}, the state dict's {what} has "
                f"{len(seq)}; a tuple holding tensors or dicts (or a "
                "namedtuple) loads item by item into the state dict's, "
                "which needs the saved length (torch's load returns the "
                "saved tuple whole)")

    def _saved_length(self, L, metadata, path, first, n, base):
        """The number of items of the list or tuple the checkpoint holds
        at `path` (its last index + 1), from items first..first+n-1 (those
        whose names start with `base`, its name and a dot); None if it
        holds none, or a map key right under `path`. Items saved with
        their flattened names only (Hugging Face, MEGA, dotted keys), which
        the load matches by name, give their indices by their names."""
        info = _lib.sized(_lib.ItemInfo)
        elem = _lib.PathElem()
        depth = len(path)
        keys = [None if e & 1 else self._keys[e >> 1] for e in path]
        last = by_name = -1
        names_are_indices = True
        for index in range(first, first + n):
            _lib.check(L.dcp_metadata_item(metadata, index,
                                           ctypes.byref(info)))
            part = info.name.decode(errors="replace")[len(base):]
            part = part.split(".", 1)[0]
            if part.isascii() and part.isdigit() and str(int(part)) == part:
                by_name = max(by_name, int(part))
            else:
                names_are_indices = False
            if info.path_len <= depth:
                continue  # another key that starts with its name
            rel = self._relative_indices(L, metadata, index, info, path,
                                         keys, elem)
            if rel is None:
                continue  # under another key of the same name
            if rel[0] is None:
                return None
            last = max(last, rel[0])
        if last < 0 and names_are_indices:
            last = by_name
        return last + 1 if last >= 0 else None

    def _holds_value_at(self, L, metadata, path, index,
                        flat_names=False) -> bool:
        """Whether the checkpoint holds a plain value at `path` itself (by
        its flattened name where the items carry only that: MEGA)."""
        if not flat_names:
            return self._item_at(L, metadata, path, index) is False
        if L.dcp_metadata_find(metadata, self.name(path).encode(),
                               ctypes.byref(index)) != _lib.OK:
            return False
        info = _lib.sized(_lib.ItemInfo)
        _lib.check(L.dcp_metadata_item(metadata, index.value,
                                       ctypes.byref(info)))
        return not info.is_tensor

    def _item_at(self, L, metadata, path, index):
        """None if the checkpoint holds no item at `path` itself, else
        whether it is a tensor."""
        elems = (_lib.PathElem * max(len(path), 1))()
        for j, e in enumerate(path):
            if e & 1:
                elems[j].index = e >> 1
            else:
                elems[j].key = self._keys[e >> 1]
        if L.dcp_metadata_find_path(metadata, Path(elems, len(path)),
                                    ctypes.byref(index)) != _lib.OK:
            return None
        info = _lib.sized(_lib.ItemInfo)
        _lib.check(L.dcp_metadata_item(metadata, index.value,
                                       ctypes.byref(info)))
        return bool(info.is_tensor)

    def _tensor_at_name(self, L, metadata, path, index) -> bool:
        """Whether the checkpoint, of storage that holds tensors only,
        holds a tensor named as `path` (its flattened name, which such
        storage matches by)."""
        return L.dcp_metadata_find(metadata, self.name(path).encode(),
                                   ctypes.byref(index)) == _lib.OK

    def _tensors_only(self, L, metadata, flat_names) -> bool:
        """Whether the checkpoint is of storage that holds tensors only,
        which leaves empty lists and tuples out: MEGA (`flat_names`) or
        Hugging Face (format "safetensors"). Read once per metadata."""
        if flat_names:
            return True
        key = getattr(metadata, "value", metadata)
        known = self._x.tensors_only
        if key not in known:
            version = ctypes.c_char_p()
            known[key] = L.dcp_metadata_version(
                metadata, ctypes.byref(version)) == _lib.OK and \
                version.value == b"safetensors"
        return known[key]

    def _reports_leafless(self, L, metadata, path, index, flat_names
                          ) -> bool:
        """Whether a list or tuple without leaves at `path`, which the
        checkpoint holds no plain value at or under, goes to the load as a
        placeholder (which the load reports, naming it: missing, or a
        tensor where the state dict has a value): always, but where the
        storage holds tensors only and left it out (no tensor at its
        name)."""
        if not self._tensors_only(L, metadata, flat_names):
            return True
        return self._tensor_at_name(L, metadata, path, index)

    def _check_unstorable(self, metadata, flat_names) -> None:
        """Raises CheckpointValueError naming the key where a destination
        tensor of a dtype dcp does not store as a tensor (which loads the
        value saved at its key, pickled) has a tensor in the checkpoint:
        dcp loads none into it."""
        L = _lib.lib()
        index = ctypes.c_size_t()
        for path, dtype in self._x.unstorable:
            if self._item_at(L, metadata, path, index) or (
                    self._tensors_only(L, metadata, flat_names) and
                    self._tensor_at_name(L, metadata, path, index)):
                raise errors.from_status(
                    _lib.INVALID_ARGUMENT,
                    f"'{self.name(path)}': the checkpoint holds a tensor "
                    f"where the state dict has one of {dtype}, a dtype dcp "
                    "does not load tensors into (it saves such tensors "
                    "pickled, with allow_pickle=True); load it into a "
                    "tensor of a supported dtype")

    def _fit_empty_dict(self, L, metadata, entry, flat_names, index):
        """What the empty dict of `entry` (_Extras.empty_dicts) takes from the
        checkpoint (reshape_lists): _NOT_PLAIN for an item at its path (a
        plain value, which replaces it; a tensor, which the load refuses),
        the saved tree (Flat._saved_tree) of a list of plain values saved
        under it, or None: nothing (also dicts or lists of tensors under
        it, where it stays empty, as in torch)."""
        path = entry[0]
        if self._item_at(L, metadata, path, index) is not None or (
                self._tensors_only(L, metadata, flat_names) and
                self._tensor_at_name(L, metadata, path, index)):
            return _NOT_PLAIN
        if flat_names:
            return None
        first, count = ctypes.c_size_t(), ctypes.c_size_t()
        shortest, longest = ctypes.c_size_t(), ctypes.c_size_t()
        _lib.check(L.dcp_metadata_find_prefix(
            metadata, (self.name(path) + ".").encode(), ctypes.byref(first),
            ctypes.byref(count), ctypes.byref(shortest),
            ctypes.byref(longest)))
        if count.value == 0:
            return None
        saved = self._saved_tree(L, metadata, path, first.value, count.value)
        if saved is None or saved is _NOT_PLAIN:
            return None
        self._check_list_growth(saved, list(path))
        return saved

    def _saved_at(self, L, metadata, row, index) -> bool:
        """Whether the checkpoint holds an item at the path of leaf `row`
        of the built paths (tensors first)."""
        return L.dcp_metadata_find_path(
            metadata, Path.from_buffer(self._paths_arr, row * 16),
            ctypes.byref(index)) == _lib.OK

    def _saved_tree(self, L, metadata, path, first, n, base=None):
        """The checkpoint's items under `path` among items first..first+n-1
        (those whose names start with its name) as a tree: {index: subtree
        or item index}; None if there are none, or a map key is right under
        `path`; _NOT_PLAIN if any item at its list indices is not a plain
        value (a tensor, or under a map key). `base` (MEGA): the list's
        name and a dot; the indices are read off the items' names."""
        info = _lib.sized(_lib.ItemInfo)
        elem = _lib.PathElem()
        depth = len(path)
        keys = [None if e & 1 else self._keys[e >> 1] for e in path]
        tree: dict = {}
        not_plain = False
        skip = len(self.name(path).encode()) + 1  # the name and a dot
        for index in range(first, first + n):
            _lib.check(L.dcp_metadata_item(metadata, index,
                                           ctypes.byref(info)))
            if base is not None:
                name = info.name.decode(errors="replace")
                rel = [int(p) if p.isascii() and p.isdigit() and
                       str(int(p)) == p else None
                       for p in name[len(base):].split(".")]
                if None in rel:
                    rel = rel[:rel.index(None) + 1]
            elif info.path_len <= depth:
                # Another key that starts with the list's name, or a tensor
                # saved with its flattened name only (Hugging Face), which
                # the load matches by name: an item where that is an index.
                if info.is_tensor and info.path_len == 1:
                    part = info.name[skip:].split(b".", 1)[0]
                    if part.isdigit() and str(int(part)).encode() == part:
                        not_plain = True
                continue
            else:
                rel = self._relative_indices(L, metadata, index, info, path,
                                             keys, elem)
                if rel is None:
                    continue  # under another key of the same name
            if rel[0] is None:
                return None  # a map key under it: not a list
            if rel[-1] is None or info.is_tensor:
                not_plain = True  # under a map at an index, or a tensor
                continue
            if not_plain:
                continue
            node = tree
            for i in rel[:-1]:
                node = node.setdefault(i, {})
                if not isinstance(node, dict):
                    return None
            if rel[-1] in node:
                return None
            node[rel[-1]] = index
        if not_plain:
            return _NOT_PLAIN
        return tree or None

    def _check_list_growth(self, saved, path) -> None:
        """Raises what the engine would for the lists of the saved tree
        (Flat._saved_tree) under `path`, before _rebuild makes them: the
        engine builds each from empty, index by index, and refuses one
        more than MAX_LIST_GROWTH past its end (check_list_growth)."""
        def name_at(i):
            leaf, node = path + [(i << 1) | 1], saved[i]
            while isinstance(node, dict):
                j = min(node)
                leaf, node = leaf + [(j << 1) | 1], node[j]
            return self.name(leaf), len(path)
        check_list_growth(saved, name_at)
        for i, inner in saved.items():
            if isinstance(inner, dict):
                self._check_list_growth(inner, path + [(i << 1) | 1])

    @staticmethod
    def _relative_indices(L, metadata, index, info, path, keys, elem):
        """The list indices of item `index`'s path after `path`, ending
        in None where a map key follows them; None if its path does not
        start with `path`."""
        rel = []
        depth = len(path)
        for j in range(info.path_len):
            _lib.check(L.dcp_metadata_item_path(metadata, index, j,
                                                ctypes.byref(elem)))
            if j < depth:
                if keys[j] is not None:
                    if elem.key != keys[j]:
                        return None
                elif elem.key is not None or elem.index != path[j] >> 1:
                    return None
            elif elem.key is not None or elem.index < 0:
                rel.append(None)
                return rel
            else:
                rel.append(elem.index)
        return rel

    def _set_tensors(self, L, sd, indices) -> None:
        """Sets tensors `indices` (t_objs order) in `sd` again, replacing
        the leaves at their paths (after _fill)."""
        groups = []
        if self._multi:
            # A chunk of a sharded tensor with several: all of them again.
            wanted = set(indices)
            groups = [g for g in self._multi if wanted.intersection(g)]
            for g in groups:
                wanted.update(g)
            indices = sorted(wanted)
        objs, shards = self.t_objs, self.t_shards
        self.t_objs = [objs[i] for i in indices]
        self.t_shards = [shards[i] for i in indices]
        try:
            tensors, sub_shards = self._tensor_arrays()
        finally:
            self.t_objs, self.t_shards = objs, shards
        paths = self._paths_arr[np.asarray(indices, dtype=np.int64)]
        self._arrays.append(paths)
        _lib.check(L.dcp_state_dict_set_tensors(
            sd, len(indices), _addr(paths), _addr(tensors),
            None if sub_shards is None else _addr(sub_shards)))
        if groups:
            at = {i: k for k, i in enumerate(indices)}
            self._set_multi(L, sd, paths, tensors, sub_shards,
                            [[at[i] for i in g] for g in groups])

    def _set_multi(self, L, sd, paths, tensors, shards, groups) -> None:
        """Sets each group of chunks (indices into the arrays `paths`,
        `tensors` and `shards`, one path per group) as one sharded tensor,
        replacing the one-chunk leaf set_tensors left at the path."""
        for group in groups:
            idx = np.asarray(group, dtype=np.int64)
            chunks = np.ascontiguousarray(tensors[idx])
            offsets = np.ascontiguousarray(shards["offsets"][idx],
                                           dtype=np.uint64)
            self._arrays += [chunks, offsets]
            first = group[0]
            _lib.check(L.dcp_state_dict_set_sharded_tensor(
                sd, Path.from_buffer(paths, first * 16),
                int(shards["ndim"][first]),
                ctypes.cast(int(shards["global_shape"][first]),
                            ctypes.POINTER(ctypes.c_int64)),
                len(group),
                ctypes.cast(_addr(chunks), ctypes.POINTER(_lib.DLTensor)),
                ctypes.cast(_addr(offsets),
                            ctypes.POINTER(ctypes.POINTER(ctypes.c_int64)))))

    def _plain(self, v, parent, key) -> None:
        self.v_paths.append(tuple(self._path))
        if self.load:
            self.v_slots.append((parent, key, v))
            self.v_vals.append((_lib.VALUE_BYTES, _UNLOADED))
            return
        self.v_vals.append(self._encode(v))

    def _encode(self, v):
        t = type(v)
        if v is None:
            return (_lib.VALUE_NONE, None)
        if t is bool:
            return (_lib.VALUE_BOOL, 1 if v else 0)
        if t is int:
            if _INT64_MIN <= v <= _INT64_MAX:
                return (_lib.VALUE_INT, v)
        elif t is float:
            return (_lib.VALUE_FLOAT, v)
        elif t is str:
            try:
                return (_lib.VALUE_STRING, v.encode())
            except UnicodeEncodeError:
                pass
        elif t is bytes or t is bytearray:
            b = bytes(v)
            if b.startswith(_MARKER_PREFIX):
                b = BYTES_ESCAPE + b
            return (_lib.VALUE_BYTES, b)
        elif isinstance(v, np.generic) and v.dtype.kind in "biufc":
            # A numpy bool, int, float or complex scalar: its Python value,
            # where .item() gives one (np.longdouble gives itself: an
            # object).
            item = v.item()
            if type(item) in _PLAIN_ITEMS:
                return self._encode(item)
        marked = _marked(v)
        if marked is not None:
            return (_lib.VALUE_BYTES, marked)
        if not self.allow_pickle and t is str:
            raise TypeError(
                f"cannot save '{self.name()}': the str is not valid Unicode "
                "(a lone surrogate), so it has no UTF-8 form; pass "
                "allow_pickle=True to store it pickled")
        if not self.allow_pickle and t is int:
            raise TypeError(
                f"cannot save '{self.name()}': the int has more decimal "
                "digits than Python converts (sys.set_int_max_str_digits); "
                "pass allow_pickle=True to store it pickled")
        if not self.allow_pickle:
            raise TypeError(
                f"cannot save '{self.name()}': {t.__module__}.{t.__qualname__}"
                " is not a tensor, container or plain value (None, bool, int,"
                " float, complex, str, bytes, torch.dtype, torch.device); "
                "pass allow_pickle=True to store it pickled (loading it then "
                "runs pickle too)")
        return (_lib.VALUE_BYTES,
                PICKLE_MARKER + pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL))

    # -- the C state dict --------------------------------------------------

    def build(self, values_only: bool = False, tensors_only: bool = False):
        """A new dcp_state_dict_t holding every leaf (the caller frees it
        with dcp_state_dict_free). Raises from the engine's checks.

        tensors_only (load): the tensor leaves only, for a state dict that
        reshape_lists may change (it builds again when it does);
        set_values adds the plain leaves where it did not.

        values_only (load): only the plain leaves, each list index in their
        paths made a map key ("3"): the same flattened names, without the
        list slots of the tensors (a list would fill them with None leaves
        to load). read_values() reads it back."""
        L = _lib.lib()
        sd = ctypes.c_void_p()
        _lib.check(L.dcp_state_dict_create(ctypes.byref(sd)))
        try:
            if values_only:
                self._fill_values(L, sd)
            else:
                self._fill(L, sd, values=not tensors_only)
        except BaseException:
            L.dcp_state_dict_free(sd)
            raise
        return sd

    def _paths(self, all_paths=None):
        """The paths array of tensor leaves then value leaves (or of
        `all_paths`)."""
        if all_paths is None:
            all_paths = self.t_paths + self.v_paths
        n = len(all_paths)
        lens = np.fromiter(map(len, all_paths), dtype=np.int64, count=n)
        total = int(lens.sum())
        enc = np.fromiter(itertools.chain.from_iterable(all_paths),
                          dtype=np.int64, count=total)
        blob = b"".join(k + b"\0" for k in self._keys)
        blob_arr = np.frombuffer(blob, dtype=np.uint8) if blob else \
            np.zeros(1, np.uint8)
        key_lens = np.fromiter((len(k) + 1 for k in self._keys),
                               dtype=np.int64, count=len(self._keys))
        key_addr = np.empty(len(self._keys) + 1, dtype=np.uint64)
        key_addr[0] = _addr(blob_arr)
        np.cumsum(key_lens, out=key_addr[1:].view(np.int64))
        key_addr[1:] += key_addr[0]
        is_index = (enc & 1).astype(bool)
        half = enc >> 1
        elems = np.zeros(max(total, 1), dtype=PATH_ELEM_DTYPE)
        elems["key"][:total] = np.where(is_index, 0,
                                        key_addr[np.where(is_index, 0, half)])
        elems["index"][:total] = np.where(is_index, half, 0)
        starts = np.zeros(n, dtype=np.uint64)
        if n > 1:
            np.cumsum(lens[:-1], out=starts[1:].view(np.int64))
        paths = np.empty(max(n, 1), dtype=PATH_DTYPE)
        paths["elems"][:n] = _addr(elems) + 16 * starts
        paths["len"][:n] = lens
        self._arrays += [blob, blob_arr, elems]
        return paths

    def set_values(self, sd) -> None:
        """Adds the plain leaves to `sd`, built with tensors_only=True."""
        self._set_values(_lib.lib(), sd, self._paths_arr, len(self.t_objs))

    def _fill(self, L, sd, values: bool = True) -> None:
        tensors = shards = None
        if self.t_objs:
            try:
                tensors, shards = self._tensor_arrays()
            except _Unstorable:
                self._unstorable_as_values()
                self.has_cuda, self.cuda_devices = False, set()
                self.host_bytes = self.unaligned_host_bytes = 0
                if self.t_objs:
                    tensors, shards = self._tensor_arrays()
        paths = self._paths_arr = self._paths()
        nt = len(self.t_objs)
        if nt:
            _lib.check(L.dcp_state_dict_set_tensors(
                sd, nt, _addr(paths), _addr(tensors),
                None if shards is None else _addr(shards)))
            if self._multi:
                self._set_multi(L, sd, paths, tensors, shards, self._multi)
            if self.t_grad:
                marked = paths[np.asarray(self.t_grad, dtype=np.int64)]
                self._arrays.append(marked)
                _lib.check(L.dcp_state_dict_mark_requires_grad(
                    sd, len(self.t_grad), _addr(marked)))
        if values:
            self._set_values(L, sd, paths, nt)

    def _fill_values(self, L, sd) -> None:
        keyed = [tuple(self._key(str(e >> 1)) if e & 1 else e for e in path)
                 for path in self.v_paths]
        self._values_paths_arr = self._paths(keyed)
        self._set_values(L, sd, self._values_paths_arr, 0)

    def _set_values(self, L, sd, paths, first) -> None:
        """Sets every plain leaf; value i's path is paths[first + i]."""
        setters = {
            _lib.VALUE_NONE: lambda p, _: L.dcp_state_dict_set_none(sd, p),
            _lib.VALUE_BOOL: lambda p, v: L.dcp_state_dict_set_bool(sd, p, v),
            _lib.VALUE_INT: lambda p, v: L.dcp_state_dict_set_int(sd, p, v),
            _lib.VALUE_FLOAT:
                lambda p, v: L.dcp_state_dict_set_float(sd, p, v),
            _lib.VALUE_STRING:
                lambda p, v: L.dcp_state_dict_set_string(sd, p, v, len(v)),
            _lib.VALUE_BYTES:
                lambda p, v: L.dcp_state_dict_set_bytes(sd, p, v, len(v)),
        }
        for i, (kind, payload) in enumerate(self.v_vals):
            path = Path.from_buffer(paths, (first + i) * 16)
            _lib.check(setters[kind](path, payload))

    def _tensor_arrays(self):
        """The DLTensor array (and shard array, or None) of the tensors."""
        objs = self.t_objs
        n = len(objs)
        ptrs: list[int] = []
        dls: list[int] = []
        ndims: list[int] = []
        devs: list[int] = []  # device_type | device_id << 32
        dims: list[int] = []  # shape then strides, per tensor
        add_ptr, add_dl, add_ndim, add_dev = (ptrs.append, dls.append,
                                              ndims.append, devs.append)
        add_dims = dims.extend
        torch_dl = _TORCH_DL
        cpu = _lib.DL_CPU
        for t in objs:
            if isinstance(t, np.ndarray):
                ptr, dl, dev = self._numpy_info(t, len(ptrs))
                if self.load:
                    self.host_bytes += t.nbytes
                    if ptr & 4095:
                        self.unaligned_host_bytes += t.nbytes
                add_ptr(ptr)
                add_dl(dl)
                add_dev(dev)
                add_ndim(t.ndim)
                add_dims(t.shape)
                item = t.itemsize
                add_dims(s // item for s in t.strides)
                continue
            dl = torch_dl.get(t.dtype)
            if dl is None:
                raise _Unstorable(f"'{self.name(self.t_paths[len(ptrs)])}': "
                                  f"dtype {t.dtype} is not supported by dcp")
            add_dl(dl)
            add_ptr(t.data_ptr())
            shape = t.shape
            add_ndim(len(shape))
            add_dims(shape)
            add_dims(t.stride())
            if t.is_cpu:
                add_dev(cpu)
                if self.load:
                    nbytes = t.nbytes
                    self.host_bytes += nbytes
                    if ptrs[-1] & 4095:
                        self.unaligned_host_bytes += nbytes
            elif t.is_cuda:
                index = t.get_device()
                add_dev(_lib.DL_CUDA | (index << 32))
                self.has_cuda = True
                self.cuda_devices.add(index)
            else:
                raise ValueError(f"'{self.name(self.t_paths[len(devs)])}': "
                                 f"tensors on {t.device} are not supported "
                                 "by dcp")
        dims_arr = np.array(dims, dtype=np.int64) if dims else \
            np.zeros(1, np.int64)
        nd = np.array(ndims, dtype=np.int64)
        starts = np.zeros(n, dtype=np.uint64)
        if n > 1:
            np.cumsum(2 * nd[:-1], out=starts[1:].view(np.int64))
        base = _addr(dims_arr)
        arr = np.zeros(n, dtype=DLTENSOR_DTYPE)
        arr["data"] = np.array(ptrs, dtype=np.uint64)
        devs_arr = np.array(devs, dtype=np.int64)
        arr["device_type"] = devs_arr & 0xFFFFFFFF
        arr["device_id"] = devs_arr >> 32
        arr["ndim"] = nd
        arr["dtype"] = np.array(dls, dtype=np.uint32)
        arr["shape"] = base + 8 * starts
        arr["strides"] = base + 8 * (starts + nd.astype(np.uint64))
        self._arrays += [dims_arr, arr]
        shards = None
        if any(s is not None for s in self.t_shards):
            sdims: list[int] = []
            sh = np.zeros(n, dtype=SHARD_DTYPE)
            pos = []
            for i, s in enumerate(self.t_shards):
                if s is None:
                    continue
                gshape, offsets = s
                if len(gshape) != ndims[i] or len(offsets) != ndims[i]:
                    raise ValueError(
                        f"'{self.name(self.t_paths[i])}': chunk of "
                        f"{ndims[i]} dims with global shape {gshape} and "
                        f"offsets {offsets}")
                pos.append((i, len(sdims), len(gshape)))
                sdims.extend(gshape)
                sdims.extend(offsets)
            sdims_arr = np.array(sdims or [0], dtype=np.int64)
            sbase = _addr(sdims_arr)
            for i, start, nd_i in pos:
                sh[i]["ndim"] = nd_i
                sh[i]["global_shape"] = sbase + 8 * start
                sh[i]["offsets"] = sbase + 8 * (start + nd_i)
            self._arrays += [sdims_arr, sh]
            shards = sh
        return arr, shards

    def prefers_buffered_reads(self) -> bool:
        """Load only: whether most destination bytes are host memory that
        is not 4 KiB aligned (torch's CPU allocator aligns to 64 bytes).
        O_DIRECT cannot read into such memory, so the reader would bounce
        every byte through its aligned buffers and copy it; a buffered read
        lets the kernel's read-ahead and copy do that work instead, and ran
        about 1.35x faster on a 3.3 GB torch state (docs/BENCHMARKS.md,
        "Python package vs torch DCP")."""
        return self.unaligned_host_bytes * 2 > self.host_bytes

    def drop_empty_markers(self) -> None:
        """Save only: leaves out the values standing for empty lists and
        tuples, for storage that holds tensors only (Hugging Face, MEGA),
        where an empty container is not saved at all."""
        keep = [i for i, (kind, payload) in enumerate(self.v_vals)
                if kind != _lib.VALUE_BYTES or payload not in
                (EMPTY_LIST_MARKER, EMPTY_TUPLE_MARKER)]
        if len(keep) != len(self.v_vals):
            self.v_paths = [self.v_paths[i] for i in keep]
            self.v_vals = [self.v_vals[i] for i in keep]

    def check_tensors(self) -> None:
        """Raises what build() would for a tensor dcp cannot take (a
        sharded one of a dtype it does not support, an oddly strided numpy
        array), without building: for callers that hand the tensors on. As
        build() does, first makes the tensors of a dtype dcp does not store
        as tensors plain values (_unstorable_as_values: pickled, or a
        TypeError without allow_pickle)."""
        if not all(map(_storable, self.t_objs)):
            self._unstorable_as_values()
        for i, t in enumerate(self.t_objs):
            if isinstance(t, np.ndarray):
                self._numpy_info(t, i)

    def _unstorable_as_values(self) -> None:
        """Makes every tensor leaf of a dtype dcp does not store as a
        tensor (_storable: a numpy array of str, bytes, objects, datetimes,
        records, float128 or big-endian numbers; a quantized torch tensor)
        a plain value leaf, as torch's DCP stores such a value (pickled).
        Save: the array or tensor pickled, with allow_pickle (loading it
        then needs allow_pickle too); without it, TypeError naming the key
        and saying that allow_pickle=True stores it. Load: a placeholder
        that the saved value (pickled) replaces whole in the state dict, as
        torch's load replaces it. A chunk of a sharded or DTensor of such a
        dtype raises TypeError naming the key (one value cannot stand for
        one rank's chunk). The supported tensors are left as they are."""
        moved = [i for i, t in enumerate(self.t_objs) if not _storable(t)]
        multi = {i for g in self._multi for i in g}
        slots = []
        for i in moved:
            path, t = self.t_paths[i], self.t_objs[i]
            name = self.name(path)
            what = (f"numpy dtype {t.dtype}" if isinstance(t, np.ndarray)
                    else f"dtype {t.dtype}")
            try:
                parent, key = self._slot_of(path)
                old = parent[key]
            except (LookupError, StopIteration, TypeError, ValueError):
                if self.load:  # nowhere to put the loaded value
                    raise TypeError(
                        f"'{name}': {what} is not supported by dcp"
                    ) from None
                parent = key = old = None
            if self.t_shards[i] is not None or i in multi or \
                    _is_dtensor(old) or isinstance(old, ShardedTensor):
                raise TypeError(
                    f"'{name}': {what} is not supported by dcp; a sharded "
                    "tensor of it cannot be stored as one pickled value")
            if not self.load and not self.allow_pickle:
                raise TypeError(
                    f"cannot save '{name}': {what} is not supported by dcp "
                    "as a tensor; pass allow_pickle=True to store it pickled "
                    "(loading it then needs allow_pickle=True too)")
            slots.append((parent, key, old))
        self.v_paths += [self.t_paths[i] for i in moved]
        if self.load:
            self.v_vals += [(_lib.VALUE_BYTES, _UNLOADED)] * len(moved)
            self.v_slots += slots
            self._x.unstorable += [(self.t_paths[i], self.t_objs[i].dtype)
                                   for i in moved]
            tmps = {id(self.t_objs[i]) for i in moved}
            self.copy_back = [(d, tmp) for d, tmp in self.copy_back
                              if id(tmp) not in tmps]
        else:
            for i in moved:
                try:
                    self.v_vals.append((
                        _lib.VALUE_BYTES, PICKLE_MARKER + pickle.dumps(
                            self.t_objs[i],
                            protocol=pickle.HIGHEST_PROTOCOL)))
                except Exception as e:
                    raise TypeError(
                        f"cannot save '{self.name(self.t_paths[i])}': "
                        f"pickling it failed: {type(e).__name__}: {e}"
                    ) from e
        gone = set(moved)
        new_index = {}
        for i in range(len(self.t_objs)):
            if i not in gone:
                new_index[i] = len(new_index)
        keep = list(new_index)
        self.t_paths = [self.t_paths[i] for i in keep]
        self.t_objs = [self.t_objs[i] for i in keep]
        self.t_shards = [self.t_shards[i] for i in keep]
        self.t_grad = [new_index[i] for i in self.t_grad if i in new_index]
        self._multi = [[new_index[i] for i in g] for g in self._multi]

    def _slot_of(self, path):
        """(container, key) of the leaf at `path` of the walked state dict:
        the caller's dicts and lists, and on a load for a tuple the list
        that write_back rebuilds it from (Flat._tuples)."""
        cur = self._x.root
        last = len(path) - 1
        for depth, e in enumerate(path):
            if e & 1:
                key = e >> 1
            else:
                key = self._keys[e >> 1].decode()
                if key not in cur:  # an int key, stored as its str
                    key = next(k for k in cur if type(k) is not str and
                               str(k) == key)
            if depth == last:
                return cur, key
            inner = cur[key]
            if self.load and isinstance(inner, tuple):
                inner = next(target for target, _, parent, k in self._tuples
                             if parent is cur and (k is key or k == key))
            elif self.load and isinstance(inner, list):
                # An aliased list: the new one the walk went into.
                inner = next((fresh for parent, k, fresh in self._x.aliases
                              if parent is cur and (k is key or k == key)),
                             inner)
            cur = inner
        raise ValueError("a leaf's path is empty")

    def _numpy_info(self, a, i):
        name = a.dtype.name
        info = _BY_NAME.get(name)
        if info is None or a.dtype.byteorder == ">":
            raise _Unstorable(f"'{self.name(self.t_paths[i])}': numpy dtype "
                              f"{a.dtype} is not supported by dcp")
        code, bits, _ = info
        ptr = a.__array_interface__["data"][0]
        if any(s % a.itemsize for s in a.strides):
            raise ValueError(f"'{self.name(self.t_paths[i])}': numpy strides "
                             f"{a.strides} are not multiples of the item size")
        return ptr, code | (bits << 8) | (1 << 16), _lib.DL_CPU

    # -- after a load ------------------------------------------------------

    def read_values(self, sd) -> list:
        """Load only: the loaded plain values of `sd` (built with
        values_only), decoded, in v_slots order (_SKIP where the checkpoint
        lacked the key). Raises, naming the key, on a value that cannot be
        decoded (pickled without allow_pickle, an unpickling error); writes
        nothing into the caller's containers."""
        if not self.v_slots:
            return []
        L = _lib.lib()
        info = _lib.sized(_lib.LeafInfo)
        paths = self._values_paths_arr
        out = []
        for i, (_, _, old) in enumerate(self.v_slots):
            path = Path.from_buffer(paths, i * 16)
            _lib.check(L.dcp_state_dict_get(sd, path, ctypes.byref(info)))
            try:
                out.append(self._decode(info, old, self.v_paths[i]))
            except errors.CheckpointException:
                raise
            except ValueError as e:
                # A saved value that cannot be decoded: damaged data.
                raise errors.from_status(
                    _lib.DATA_LOSS, str(e),
                    cls=errors.CheckpointCorruptValueError) from e
        return out

    def mark_written(self) -> None:
        """Load only: bumps the autograd version counter of every torch
        destination, as torch's in-place copy_ would, since the engine
        wrote their memory behind torch's back: a graph that saved one of
        them for backward then refuses to use the overwritten values."""
        tensors = [t for t in self.t_objs if not isinstance(t, np.ndarray)]
        tensors += self._wrappers
        if tensors:
            _increment_versions(tensors)

    def write_back(self, values) -> None:
        """Load only, after every check passed: copies temporaries into
        strided (and conjugated/negated) destinations, puts the plain
        values of read_values() into the caller's containers and rebuilds
        tuples. The new lists of aliased lists (and of empty dicts that
        take a saved list) go in first: the values then fill them."""
        for parent, key, fresh in self._x.aliases:
            parent[key] = fresh
        for dst, tmp in self.copy_back:
            if isinstance(dst, np.ndarray):
                dst[...] = tmp
            else:
                # A parameter (a leaf that requires grad) takes the values
                # as torch's DCP gives them; the copy bumps its version.
                with torch.no_grad():
                    dst.copy_(tmp)
        for (parent, key, old), value in zip(self.v_slots, values):
            if value is not _SKIP:
                if type(old) is _EmptyHint and (value is None or (
                        _is_seq(value) and
                        isinstance(old.dest, type(value)))):
                    # The saved list (or an empty one) in the destination's
                    # list, refilled in place (its inner lists too), or
                    # tuple subclass.
                    if value is None:
                        value = []
                    else:
                        items = list(value)
                        _refill(old.dest, items)
                        value = items
                    value = _remake(old.dest, value)
                parent[key] = value
        for target, items, tuples in self._replaced:
            for parent, i, dest in tuples:
                parent[i] = _remake(dest, parent[i])
            target[:] = items
        for target, typ, parent, key in reversed(self._tuples):
            if hasattr(typ, "_fields"):  # namedtuple
                parent[key] = typ(*target)
            else:
                parent[key] = typ(target)

    def _decode(self, info, old, path):
        kind = info.kind
        if kind == _lib.VALUE_NONE:
            return None
        if kind == _lib.VALUE_INT:
            value = info.int_value
        elif kind == _lib.VALUE_FLOAT:
            value = info.float_value
        elif kind == _lib.VALUE_BOOL:
            value = bool(info.bool_value)
        elif kind == _lib.VALUE_STRING:
            raw = ctypes.string_at(info.data, info.size)
            try:
                return raw.decode()
            except UnicodeDecodeError as e:
                raise ValueError(f"'{self.name(path)}': the saved string is "
                                 f"not UTF-8 ({e})") from e
        elif kind == _lib.VALUE_BYTES:
            b = ctypes.string_at(info.data, info.size) if info.size else b""
            if b.startswith(_MARKER_PREFIX):
                if b == _UNLOADED:
                    return _SKIP
                if b == EMPTY_LIST_MARKER:
                    return []
                if b == EMPTY_TUPLE_MARKER:
                    return ()
                if b.startswith(SEQ_MARKER):
                    value = self._unpack(b, path)
                    if type(old) is _EmptyHint:
                        value = self._fit_seq(old.dest, value, list(path))
                    return value
                if b.startswith(INT_MARKER):
                    return self._fit(self._big_int(b, path), old, path)
                if b.startswith((TORCH_DTYPE_MARKER, TORCH_DEVICE_MARKER,
                                 COMPLEX_MARKER)):
                    return self._fit(self._typed(b, path), old, path)
                if not b.startswith((PICKLE_MARKER, BYTES_ESCAPE)):
                    # Saved bytes that start so are escaped (BYTES_ESCAPE):
                    # this is a kind of value a newer dcp stores.
                    raise _refused(
                        f"'{self.name(path)}' holds a value this version "
                        f"of dcp does not know ({b[:32]!r}); load it with "
                        "the dcp that saved it")
                if b.startswith(PICKLE_MARKER):
                    if not self.allow_pickle:
                        raise _refused(
                            f"'{self.name(path)}' was saved pickled; loading "
                            "it runs pickle (arbitrary code): pass "
                            "allow_pickle=True if you trust the checkpoint")
                    try:
                        return pickle.loads(b[len(PICKLE_MARKER):])
                    except Exception as e:
                        raise ValueError(
                            f"'{self.name(path)}': unpickling the saved value "
                            f"failed: {type(e).__name__}: {e}") from e
                if b.startswith(BYTES_ESCAPE):
                    b = b[len(BYTES_ESCAPE):]
            if type(old) is bytearray:
                return bytearray(b)
            return b
        else:
            raise _refused(f"'{self.name(path)}': the checkpoint holds a "
                           "tensor where the state dict has a plain value")
        if isinstance(old, np.generic):
            return self._fit(value, old, path)
        return value

    def _unpack(self, b, path):
        """The list or tuple a SEQ_MARKER value `b` holds (_pack), made
        without pickle; ValueError naming the key for a damaged one."""
        try:
            value, end = self._unpack_at(b, len(SEQ_MARKER), path, 0)
            if end == len(b):
                return value
            why = f"{len(b) - end} byte(s) after its end"
        except (ValueError, IndexError, struct.error) as e:
            why = str(e)
        raise ValueError(f"'{self.name(path)}': the saved list is damaged "
                         f"({why})")

    def _unpack_at(self, b, pos, path, depth):
        """(the list or tuple _pack encoded at b[pos:], the offset after
        it). Items are appended as they are decoded, so memory follows the
        bytes read, whatever count a damaged payload claims."""
        tag = b[pos:pos + 1]
        if tag not in (b"[", b"("):
            raise ValueError(f"no list at byte {pos}")
        if depth > _MAX_SEQ_DEPTH:
            raise ValueError(f"lists nest deeper than {_MAX_SEQ_DEPTH}")
        is_tuple = tag == b"("
        (count,) = _U32.unpack_from(b, pos + 1)
        pos += 5
        if count > len(b) - pos:  # every item takes a byte at least
            raise ValueError(f"{count} items in {len(b) - pos} bytes")
        items = []
        append = items.append
        for _ in range(count):
            tag = b[pos]
            pos += 1
            if tag == 0x73:  # s: str
                (n,) = _U32.unpack_from(b, pos)
                end = pos + 4 + n
                if end > len(b):
                    raise ValueError(f"a str past the end at byte {pos}")
                try:
                    append(b[pos + 4:end].decode())
                except UnicodeDecodeError as e:
                    raise ValueError(f"a str that is not UTF-8 ({e})") \
                        from None
                pos = end
            elif tag == 0x69:  # i: int64
                append(_I64.unpack_from(b, pos)[0])
                pos += 8
            elif tag == 0x66:  # f: float64
                append(_F64.unpack_from(b, pos)[0])
                pos += 8
            elif tag == 0x4E:  # N: None
                append(None)
            elif tag == 0x54 or tag == 0x46:  # T, F: bool
                append(tag == 0x54)
            elif tag == 0x62 or tag == 0x78:  # b: bytes, x: marked value
                (n,) = _U32.unpack_from(b, pos)
                end = pos + 4 + n
                if end > len(b):
                    raise ValueError(f"bytes past the end at byte {pos}")
                raw = b[pos + 4:end]
                pos = end
                if tag == 0x62:
                    append(raw)
                else:
                    append(self._marked_item(raw, path))
            elif tag == 0x5B or tag == 0x28:  # [, (: a list or tuple
                item, pos = self._unpack_at(b, pos - 1, path, depth + 1)
                append(item)
            else:
                raise ValueError(f"an unknown item tag {tag} at byte "
                                 f"{pos - 1}")
        return (tuple(items) if is_tuple else items), pos

    def _fit_seq(self, dest, saved, path):
        """Saved list or tuple `saved` for destination `dest` (a list or
        tuple): where `dest` holds a numpy scalar or a bytearray at the
        same index (in lists and tuples of both, at any depth), the saved
        value in that type (_fit: CheckpointValueError naming the key
        where it does not fit); and CheckpointValueError where write_back
        could not rebuild `dest`'s tuple subclass from it."""
        items = None
        for i in range(min(len(dest), len(saved))):
            d, s = dest[i], saved[i]
            new = s
            if isinstance(d, np.generic) and not isinstance(s, (list, tuple)):
                new = self._fit(s, d, path + [(i << 1) | 1])
            elif type(d) is bytearray and type(s) is bytes:
                new = bytearray(s)
            elif isinstance(d, (list, tuple)) and isinstance(s, (list, tuple)):
                new = self._fit_seq(d, s, path + [(i << 1) | 1])
            if new is not s:
                if items is None:
                    items = list(saved)
                items[i] = new
        if items is not None:
            saved = tuple(items) if type(saved) is tuple else items
        if not isinstance(dest, list) and type(dest) is not tuple and \
                isinstance(dest, type(saved)):
            try:
                _remake(dest, list(saved))
            except Exception as e:
                raise _refused(
                    f"'{self.name(path)}': the state dict's "
                    f"{type(dest).__name__} cannot be made from the saved "
                    f"items ({type(e).__name__}: {e})") from None
        return saved

    def _marked_item(self, raw, path):
        """The value of marked bytes `raw` (an "x" item of _pack)."""
        try:
            if raw.startswith(INT_MARKER):
                return self._big_int(raw, path)
            if raw.startswith((TORCH_DTYPE_MARKER, TORCH_DEVICE_MARKER,
                               COMPLEX_MARKER)):
                return self._typed(raw, path)
        except ValueError as e:
            # Its message names the key, which the list's names already.
            raise ValueError(str(e).removeprefix(
                f"'{self.name(path)}': ")) from None
        raise ValueError(f"an unknown value {raw[:32]!r}")

    def _typed(self, b, path):
        """The torch.dtype, torch.device or complex a TORCH_DTYPE_MARKER,
        TORCH_DEVICE_MARKER or COMPLEX_MARKER value `b` holds, made
        without pickle (a dtype only among torch's own attributes);
        ValueError naming the key for a payload that is none."""
        name = self.name(path)
        if b.startswith(COMPLEX_MARKER):
            payload = b[len(COMPLEX_MARKER):]
            if len(payload) == 16:
                return complex(*struct.unpack("<dd", payload))
            raise ValueError(f"'{name}': the saved complex is damaged "
                             f"({b[:48]!r})")
        if torch is None:
            raise _refused(f"'{name}' holds a torch.dtype or torch.device, "
                           "which needs torch installed to load")
        if b.startswith(TORCH_DTYPE_MARKER):
            text = b[len(TORCH_DTYPE_MARKER):]
            dtype = (getattr(torch, text.decode(), None)
                     if text.isascii() and text.decode().isidentifier()
                     else None)
            if isinstance(dtype, torch.dtype):
                return dtype
            raise ValueError(
                f"'{name}': the saved torch.dtype {text[:48]!r} is not one "
                "of this torch's dtypes")
        text = b[len(TORCH_DEVICE_MARKER):]
        try:
            return torch.device(text.decode("ascii"))
        except (UnicodeDecodeError, RuntimeError, ValueError) as e:
            raise ValueError(
                f"'{name}': the saved torch.device {text[:48]!r} is not a "
                f"device this torch knows ({e})") from None

    def _big_int(self, b, path) -> int:
        """The int an INT_MARKER value `b` holds: "-" or not, then ASCII
        decimal digits (int() alone would take spaces, "+" and "_")."""
        digits = b[len(INT_MARKER):]
        if digits[:1] == b"-":
            digits = digits[1:]
        if digits.isdigit():  # bytes: ASCII digits only
            try:
                return int(b[len(INT_MARKER):])
            except ValueError as e:  # past sys.get_int_max_str_digits()
                raise ValueError(
                    f"'{self.name(path)}': the saved int cannot be read: "
                    f"{e}") from e
        raise ValueError(
            f"'{self.name(path)}': the saved int is damaged ({b[:48]!r} is "
            "not the int marker followed by decimal digits)")

    def _fit(self, value, old, path):
        """`value` as the type of `old` where that is a numpy scalar (an int
        outside an integer dtype's range raises rather than wrapping, which
        numpy before 2.0 did), else `value`."""
        if not isinstance(old, np.generic):
            return value
        try:
            if type(value) is int and old.dtype.kind in "iu":
                lim = np.iinfo(old.dtype)
                if not lim.min <= value <= lim.max:
                    raise OverflowError(f"outside [{lim.min}, {lim.max}]")
            return type(old)(value)
        except (OverflowError, ValueError, TypeError) as e:
            raise _refused(
                f"'{self.name(path)}': the saved value {value!r} does not "
                f"fit the state dict's {type(old).__name__}") from e


_SKIP = object()


def _refused(message: str):
    """CheckpointValueError (INVALID_ARGUMENT): a saved value this load
    will not decode into the state dict (pickled without allow_pickle, of
    another kind, one that does not fit)."""
    return errors.from_status(_lib.INVALID_ARGUMENT, message)


class _Unstorable(TypeError):
    """A tensor leaf of a dtype dcp does not store as a tensor (build()
    then makes such leaves plain values: Flat._unstorable_as_values)."""


def _storable(t) -> bool:
    """Whether tensor leaf `t` (a torch tensor or numpy array) has a dtype
    dcp stores as a tensor."""
    if isinstance(t, np.ndarray):
        return t.dtype.name in _BY_NAME and t.dtype.byteorder != ">"
    return t.dtype in _TORCH_DL

# What .item() of a numpy bool, int or float scalar stored as its Python
# value gives (Flat._encode).
_PLAIN_ITEMS = (bool, int, float, complex)
# The types _value hands to _plain directly.
_SCALAR_TYPES = frozenset((bool, int, float, str, type(None)))
# Flat._saved_tree: tensors or maps at the list's indices.
_NOT_PLAIN = object()


_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")


def _marked(v):
    """The marked bytes (INT_MARKER, COMPLEX_MARKER, TORCH_DTYPE_MARKER,
    TORCH_DEVICE_MARKER) `v` is stored as without pickle, or None: an int
    outside int64, a complex, a torch.dtype or a torch.device."""
    t = type(v)
    if t is int:
        if not _INT64_MIN <= v <= _INT64_MAX:
            try:
                return INT_MARKER + b"%d" % v
            except ValueError:  # past sys.get_int_max_str_digits()
                return None
    elif t is complex:
        return COMPLEX_MARKER + struct.pack("<dd", v.real, v.imag)
    elif torch is not None and t is torch.dtype:
        return TORCH_DTYPE_MARKER + str(v).removeprefix("torch.").encode()
    elif torch is not None and t is torch.device:
        return TORCH_DEVICE_MARKER + str(v).encode()
    return None


def _pack(seq):
    """SEQ_MARKER and the encoding of list or tuple `seq` (Flat._unpack
    decodes it), or None where it holds anything but plain values without
    pickle (None, bool, int, float, str, bytes, and what _marked stores)
    and lists and tuples of them (exactly list or tuple: no subclass, no
    namedtuple), or a str that is not valid Unicode, or nests deeper than
    _MAX_SEQ_DEPTH. The encoding: "[" (list) or "(" (tuple) and the item
    count (uint32), then per item a tag: "N" None, "T"/"F" bool, "i" int64,
    "f" float64, "s" str (uint32 length, UTF-8), "b" bytes (uint32 length,
    the bytes), "x" a marked value (uint32 length, its marked bytes), or a
    list or tuple encoded so (all little-endian)."""
    out = [SEQ_MARKER]
    return b"".join(out) if _pack_into(seq, out, 0) else None


def _pack_into(seq, out, depth) -> bool:
    if depth > _MAX_SEQ_DEPTH or len(seq) > 0xFFFFFFFF:
        return False
    append = out.append
    append((b"[" if type(seq) is list else b"(") + _U32.pack(len(seq)))
    for v in seq:
        t = type(v)
        if t is str:
            try:
                raw = v.encode()
            except UnicodeEncodeError:
                return False
            if len(raw) > 0xFFFFFFFF:
                return False
            append(b"s" + _U32.pack(len(raw)))
            append(raw)
        elif t is int and _INT64_MIN <= v <= _INT64_MAX:
            append(b"i" + _I64.pack(v))
        elif t is float:
            append(b"f" + _F64.pack(v))
        elif v is None:
            append(b"N")
        elif t is bool:
            append(b"T" if v else b"F")
        elif t is list or t is tuple:
            if not _pack_into(v, out, depth + 1):
                return False
        else:
            raw = bytes(v) if t is bytes else _marked(v)
            if raw is None or len(raw) > 0xFFFFFFFF:
                return False
            append((b"b" if t is bytes else b"x") + _U32.pack(len(raw)))
            append(raw)
    return True


def _is_seq(v) -> bool:
    """Whether `v` is a list or a tuple other than a namedtuple (whose
    fields are not a sequence a load may resize): subclasses such as
    torch.Size too."""
    return isinstance(v, list) or isinstance(v, tuple) and not hasattr(
        type(v), "_fields")


def _copy_list(seq) -> list:
    """A new list of the items of list subclass `seq`, in its type (a
    shallow copy.copy, its attributes too) where that works, else a list."""
    try:
        fresh = copy.copy(seq)
    except Exception:
        fresh = None
    if type(fresh) is not type(seq) or fresh is seq or \
            len(fresh) != len(seq):
        return list(seq)
    return fresh


def _refill(dest, saved: list, seen=None) -> None:
    """Puts into `saved` (a new list of the saved items) the destination's
    lists where both hold a list at an index (in tuples too), each
    refilled in place with the saved one's items so (a list the caller
    holds keeps showing the state), once: a list the destination holds
    twice (a tuple's items are not unaliased by the walk) takes the saved
    one's items at its first place only; a saved tuple where the
    destination has a tuple (namedtuple, torch.Size) is made in the
    destination's type there (_remake)."""
    if seen is None:
        seen = {id(dest)}
    for i in range(min(len(dest), len(saved))):
        d, s = dest[i], saved[i]
        if type(d) is list and type(s) is list and id(d) not in seen:
            seen.add(id(d))
            _refill(d, s, seen)
            d[:] = s
            saved[i] = d
        elif isinstance(d, tuple) and type(s) is tuple:
            items = list(s)
            _refill(d, items, seen)
            saved[i] = _remake(d, items)  # a namedtuple, torch.Size too


def _remake(dest, items):
    """`items` in a container of `dest`'s type: a list refilled in place,
    a tuple (or tuple subclass, Flat._check_rebuilds) built from them, a
    namedtuple from them as its fields where they are as many (else a
    tuple: the saved items are kept, not the type)."""
    if isinstance(dest, list):
        dest[:] = items
        return dest
    typ = type(dest)
    if typ is tuple:
        return tuple(items)
    fields = getattr(typ, "_fields", None)
    if fields is None:
        return typ(items)
    if len(items) == len(fields):
        try:
            return typ(*items)
        except Exception:  # a namedtuple subclass with its own __new__
            pass
    return tuple(items)


def _leafless(v) -> bool:
    """Whether `v` is a dict, list or tuple holding no leaf at any depth
    (what a checkpoint may not store at all)."""
    if isinstance(v, dict):
        return all(map(_leafless, v.values()))
    return isinstance(v, (list, tuple)) and all(map(_leafless, v))


def _holds_empty(seq) -> bool:
    """Whether list or tuple `seq` holds an empty one (a namedtuple too)
    at any depth."""
    return any(isinstance(v, (list, tuple)) and (not v or _holds_empty(v))
               for v in seq)


def _aligned_host_empty(shape, dtype):
    """An uninitialized CPU tensor whose data starts on a 4 KiB boundary
    (torch's CPU allocator aligns to 64 bytes)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    nbytes = math.prod(shape) * itemsize
    raw = torch.empty(nbytes + 4096, dtype=torch.uint8)
    start = -raw.data_ptr() % 4096
    return raw[start:start + nbytes].view(dtype).reshape(shape)


class _EmptyHint:
    """The destination's list or tuple where the checkpoint holds a plain
    value: a None there is how an empty one was stored, and write_back puts
    an empty container of its type in its place; a saved list or tuple
    (whole, or an empty one) of its kind goes into it (a destination list
    refilled in place; a saved `()` into a torch.Size gives
    `torch.Size([])`)."""
    __slots__ = ("dest",)

    def __init__(self, dest):
        self.dest = dest


def _same_shape(dest, saved) -> bool:
    """Whether the saved tree (Flat._saved_tree) has the shape of `dest`, a
    list or tuple of plain values (namedtuples of them too): the same
    length and the same shape at each index, where an empty list or tuple
    of the destination matches nothing saved (a saved value there, perhaps
    the None an empty one is stored as, is loaded: _rebuild)."""
    if not isinstance(saved, dict) or (saved and max(saved) >= len(dest)):
        return False
    for i, d in enumerate(dest):
        s = saved.get(i)
        if isinstance(d, (list, tuple)):
            if not d:
                if s is not None:
                    return False
            elif s is None or not _same_shape(d, s):
                return False
        elif s is None or isinstance(s, dict):
            return False
    return True


def check_list_growth(indices, name_at) -> None:
    """Raises CheckpointValueError, as the engine does (capi/internal/
    state_tree.cc CheckListGrowth), when a list built from empty by setting
    `indices` in increasing order would grow more than MAX_LIST_GROWTH past
    its end at once. name_at(index) -> (the name of a leaf path through
    that index, the index's element number in the path), for the message.
    """
    size = 0
    for i in sorted(indices):
        if i > size + MAX_LIST_GROWTH:
            name, element = name_at(i)
            raise errors.from_status(
                _lib.INVALID_ARGUMENT,
                f'state dict path "{name}" has list index {i} at element '
                f"{element}, more than {MAX_LIST_GROWTH} past the end of its "
                f"list ({size} entries)")
        size = i + 1


# The deepest nesting path a checkpoint's metadata may give a whole-
# checkpoint load (load_all, a planner built from the metadata): Python's
# default recursion limit; the package's own walk of a state dict stops
# near half of it.
MAX_PATH_DEPTH = 1000


def check_saved_paths(paths, source) -> None:
    """Raises CheckpointCorruptError naming checkpoint `source` where the
    nesting paths a checkpoint's metadata gives (tuples of str keys and int
    list indices, as planner_data holds them) cannot be a state dict: a
    path that is empty, starts with a list index or nests deeper than
    MAX_PATH_DEPTH, or a list index more than MAX_LIST_GROWTH past the end
    of its list (check_list_growth), before anything builds them (torch's
    set_element pads a list with None up to any index). Linear in the
    paths' total length."""
    def corrupt(why):
        return errors.from_status(
            _lib.DATA_LOSS, f"{source}: the metadata's nesting paths are "
            f"damaged: {why}")

    # A trie of the paths: node -> [children by element, list indices
    # set under it, parent, the element leading to it].
    root = [{}, None, None, None]
    for path in paths:
        if not path or isinstance(path[0], int):
            raise corrupt(f"path {tuple(path)!r} does not start with a key")
        if len(path) > MAX_PATH_DEPTH:
            raise corrupt(f"a path nests {len(path)} deep (at most "
                          f"{MAX_PATH_DEPTH})")
        node = root
        for part in path:
            if isinstance(part, int):
                if part < 0:
                    raise corrupt(f"a negative list index {part}")
                if node[1] is None:
                    node[1] = set()
                node[1].add(part)
            child = node[0].get(part)
            if child is None:
                child = node[0][part] = [{}, None, node, part]
            node = child
    stack = [root]
    while stack:
        node = stack.pop()
        stack.extend(node[0].values())
        if node[1] is None:
            continue

        def name_at(i, node=node):
            parts = []
            up = node
            while up[2] is not None:
                parts.append(str(up[3]))
                up = up[2]
            return ".".join(reversed(parts)) + f".{i}", len(parts)

        try:
            check_list_growth(node[1], name_at)
        except errors.CheckpointException as e:
            raise corrupt(str(e)) from None


def _rebuild(dest, saved, path, paths, slots, tuples) -> list:
    """New nested lists of the saved tree's shape: appends each plain leaf's
    path (under `path`) to `paths` and where write_back puts it (the new
    list, its index, the destination's value there as the decoding's type
    hint) to `slots`, and (list, index, the destination's container there)
    of each list inside that write_back gives the destination's type
    (_remake) to `tuples` (inner ones first). An index the checkpoint holds
    nothing at: an empty container (the destination's type there, else a
    list); a plain value where the destination has an empty list or tuple:
    that value, unless it is None (then the destination's empty kind).
    A namedtuple of the destination counts as a tuple (of its type where
    the saved items are as many as its fields: _remake). Changes nothing
    of the destination."""
    size = max(saved) + 1 if saved else 0
    items = [None] * size
    for i in range(size):
        d = dest[i] if dest is not None and i < len(dest) else None
        s = saved.get(i)
        if isinstance(s, dict):
            inner = d if isinstance(d, (list, tuple)) else None
            items[i] = _rebuild(inner, s, path + [(i << 1) | 1], paths, slots,
                                tuples)
            if inner is not None and type(inner) is not list:
                tuples.append((items, i, inner))
        elif s is None:
            items[i] = () if type(d) is tuple else []
            if isinstance(d, (list, tuple)) and type(d) is not list and \
                    type(d) is not tuple:
                tuples.append((items, i, d))
        else:
            paths.append(tuple(path + [(i << 1) | 1]))
            hint = d
            if isinstance(d, (list, tuple)):
                hint = None if d else _EmptyHint(d)
            slots.append((items, i, hint))
    return items


def refuse_graph_capture(devices) -> None:
    """RuntimeError naming the device where a CUDA graph is being captured
    on the current stream of one of `devices` (CUDA device indices): the
    engine's allocations, synchronizations and events would invalidate the
    capture (and could not be replayed)."""
    for d in devices:
        with torch.cuda.device(d):
            capturing = torch.cuda.is_current_stream_capturing()
        if capturing:
            raise RuntimeError(
                f"dcp cannot save or load cuda:{d} tensors while a CUDA "
                "graph is being captured on that device's current stream; "
                "call it outside torch.cuda.graph(...)")


def current_streams(flat: Flat):
    """The dcp_device_wait_t for a save or load of `flat`'s tensors: the
    current torch stream of their CUDA device (a save's copies start after
    the work queued on it; a load writes the tensors after it). Tensors on
    several devices: each device's current stream is synchronized and no
    wait is passed (the engine orders against one device's stream)."""
    wait = _lib.DeviceWait()
    if not flat.has_cuda:
        return wait
    devices = sorted(flat.cuda_devices)
    refuse_graph_capture(devices)
    if len(devices) == 1:
        stream = torch.cuda.current_stream(devices[0])
        wait.kind = _lib.DEVICE_WAIT_STREAM
        wait.device = devices[0]
        wait.handle = stream.cuda_stream or None
        return wait
    for d in devices:
        torch.cuda.current_stream(d).synchronize()
    return wait


def _increment_versions(tensors) -> None:
    """torch.autograd.graph.increment_version over `tensors` (one call where
    this torch takes a list, else one per tensor)."""
    from torch.autograd.graph import increment_version
    try:
        increment_version(tensors)
    except (TypeError, RuntimeError):
        # A torch that takes one tensor at a time, or an inference tensor
        # among them (older torch refuses those: they keep no version).
        for t in tensors:
            try:
                increment_version(t)
            except RuntimeError:
                pass
