"""ctypes binding of dcp's C ABI (capi/dcp.h): the only door to libdcp.so.

Every function the package calls is declared here with its argtypes and
restype; nothing else in the package touches ctypes.CDLL. Structs mirror the
header field for field (ctypes lays them out as the C compiler does).

The library is found, in order, at: $DCP_LIBRARY; libdcp.so next to this
file (the wheel); the repository's bazel-bin/capi/libdcp.so (a checkout).
It is loaded on first use, so `import dcp` works without it.

Thread safety: ctypes releases the GIL for the duration of every call, so a
long save does not stall other Python threads; callbacks that dcp threads
run re-acquire it.
"""

from __future__ import annotations

import ctypes
import os
import threading
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char_p, c_double,
                    c_int, c_int32, c_int64, c_size_t, c_uint8, c_uint16,
                    c_uint64, c_void_p)

# dcp_status_t (absl::StatusCode numbers).
OK = 0
CANCELLED = 1
UNKNOWN = 2
INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
NOT_FOUND = 5
ALREADY_EXISTS = 6
PERMISSION_DENIED = 7
RESOURCE_EXHAUSTED = 8
FAILED_PRECONDITION = 9
ABORTED = 10
OUT_OF_RANGE = 11
UNIMPLEMENTED = 12
INTERNAL = 13
UNAVAILABLE = 14
DATA_LOSS = 15
UNAUTHENTICATED = 16

# dcp_flag_t.
DEFAULT = 0
TRUE = 1
FALSE = -1

# dcp_value_kind_t.
VALUE_NONE = 0
VALUE_TENSOR = 1
VALUE_SHARDED_TENSOR = 2
VALUE_INT = 3
VALUE_FLOAT = 4
VALUE_BOOL = 5
VALUE_STRING = 6
VALUE_BYTES = 7

# dcp_device_wait_kind_t, dcp_async_checkpointer_type_t, dcp_completion_t.
DEVICE_WAIT_NONE = 0
DEVICE_WAIT_STREAM = 1
DEVICE_WAIT_EVENT = 2
ASYNC_THREAD = 0
ASYNC_PROCESS = 1
STAGING = 0
UPLOAD = 1

# DLPack device types.
DL_CPU = 1
DL_CUDA = 2
DL_CUDA_HOST = 3


def flag(value: bool | None) -> int:
    """A Python bool (None: the default) as a dcp_flag_t."""
    if value is None:
        return DEFAULT
    return TRUE if value else FALSE


class DLDevice(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class DLTensor(Structure):
    _fields_ = [("data", c_void_p), ("device", DLDevice), ("ndim", c_int32),
                ("dtype", DLDataType), ("shape", POINTER(c_int64)),
                ("strides", POINTER(c_int64)), ("byte_offset", c_uint64)]


class PathElem(Structure):
    _fields_ = [("key", c_char_p), ("index", c_int64)]


class Path(Structure):
    _fields_ = [("elems", POINTER(PathElem)), ("len", c_size_t)]


class Shard(Structure):
    _fields_ = [("ndim", c_int32), ("global_shape", POINTER(c_int64)),
                ("offsets", POINTER(c_int64))]


class DeviceWait(Structure):
    _fields_ = [("kind", c_int32), ("device", c_int32), ("handle", c_void_p)]


class LeafInfo(Structure):
    _fields_ = [("struct_size", c_size_t), ("kind", c_int32),
                ("int_value", c_int64), ("float_value", c_double),
                ("bool_value", c_int32), ("data", c_void_p),
                ("size", c_size_t), ("dtype", c_int32), ("ndim", c_int32),
                ("shape", POINTER(c_int64))]


class FsWriterOptions(Structure):
    _fields_ = [("struct_size", c_size_t),
                ("single_file_per_rank", c_int32), ("sync_files", c_int32),
                ("thread_count", c_int32), ("overwrite", c_int32),
                ("per_thread_copy_ahead", c_int64), ("direct_io", c_int32),
                ("compression", c_char_p),
                ("serialization_format", c_int32)]


class FsReaderOptions(Structure):
    _fields_ = [("struct_size", c_size_t), ("thread_count", c_int32),
                ("direct_io", c_int32)]


class HfWriterOptions(Structure):
    _fields_ = [("struct_size", c_size_t), ("fqns", POINTER(c_char_p)),
                ("file_indices", POINTER(c_int32)),
                ("num_mappings", c_size_t), ("thread_count", c_int32),
                ("save_distributed", c_int32),
                ("enable_consolidation", c_int32),
                ("thread_count_consolidation", c_int32),
                ("sync_files", c_int32), ("direct_io", c_int32),
                ("consolidation_buffer_bytes", c_int64)]


class HfReaderOptions(Structure):
    _fields_ = [("struct_size", c_size_t), ("thread_count", c_int32),
                ("direct_io", c_int32), ("read_window_bytes", c_int64)]


class HfQuantizedReaderOptions(Structure):
    _fields_ = [("struct_size", c_size_t), ("thread_count", c_int32),
                ("target_dtype", c_int32), ("block_size", c_int64)]


class MegaWriterOptions(Structure):
    _fields_ = [("struct_size", c_size_t), ("fqns", POINTER(c_char_p)),
                ("file_indices", POINTER(c_int32)),
                ("num_mappings", c_size_t), ("thread_count", c_int32),
                ("checksum_block_size", c_int64), ("sync_files", c_int32),
                ("direct_io", c_int32)]


class MegaReaderOptions(Structure):
    _fields_ = [("struct_size", c_size_t), ("thread_count", c_int32),
                ("direct_io", c_int32)]


class ProcessGroupOptions(Structure):
    _fields_ = [("struct_size", c_size_t), ("backend", c_char_p),
                ("group_name", c_char_p), ("timeout_ms", c_int64),
                ("connect_timeout_ms", c_int64), ("cuda_device", c_int32)]


SINK_FN = CFUNCTYPE(None, c_void_p, c_void_p, c_size_t)
STORE_SET_FN = CFUNCTYPE(c_int, c_void_p, c_char_p, c_void_p, c_size_t)
STORE_GET_FN = CFUNCTYPE(c_int, c_void_p, c_char_p, c_int64, SINK_FN,
                         c_void_p)
STORE_REMOVE_FN = CFUNCTYPE(c_int, c_void_p, c_char_p)
DONE_FN = CFUNCTYPE(None, c_void_p, c_int)


class Store(Structure):
    _fields_ = [("struct_size", c_size_t), ("user", c_void_p),
                ("set", STORE_SET_FN), ("get", STORE_GET_FN),
                ("remove", STORE_REMOVE_FN)]


class SavePlannerOptions(Structure):
    _fields_ = [("struct_size", c_size_t),
                ("flatten_state_dict", c_int32),
                ("flatten_sharded_tensors", c_int32),
                ("dedup_save_to_lowest_rank", c_int32),
                ("enable_plan_caching", c_int32)]


class LoadPlannerOptions(Structure):
    _fields_ = [("struct_size", c_size_t),
                ("flatten_state_dict", c_int32),
                ("flatten_sharded_tensors", c_int32),
                ("allow_partial_load", c_int32),
                ("convert_dtypes", c_int32)]


class SaveOptions(Structure):
    _fields_ = [("struct_size", c_size_t), ("checkpoint_id", c_char_p),
                ("storage_writer", c_void_p),
                ("planner", POINTER(SavePlannerOptions)),
                ("process_group", c_void_p), ("coordinator_rank", c_int32),
                ("no_dist", c_int32), ("use_collectives", c_int32),
                ("device_wait", DeviceWait),
                ("async_checkpointer_type", c_int32),
                ("async_stager", c_void_p)]


class StagerOptions(Structure):
    _fields_ = [("struct_size", c_size_t), ("use_pinned_memory", c_int32),
                ("use_shared_memory", c_int32),
                ("use_async_staging", c_int32),
                ("use_non_blocking_copy", c_int32),
                ("cache_staged_state_dict", c_int32),
                ("copy_on_write", c_int32)]


class LoadOptions(Structure):
    _fields_ = [("struct_size", c_size_t), ("checkpoint_id", c_char_p),
                ("storage_reader", c_void_p),
                ("planner", POINTER(LoadPlannerOptions)),
                ("process_group", c_void_p), ("coordinator_rank", c_int32),
                ("no_dist", c_int32), ("device_wait", DeviceWait),
                ("metadata", c_void_p)]


class StorageInfo(Structure):
    _fields_ = [("struct_size", c_size_t), ("name", c_char_p),
                ("has_offsets", c_int32), ("ndim", c_int32),
                ("offsets", POINTER(c_int64)), ("relative_path", c_char_p),
                ("offset", c_int64), ("length", c_int64)]


class ItemInfo(Structure):
    _fields_ = [("struct_size", c_size_t), ("name", c_char_p),
                ("is_tensor", c_int32), ("dtype", c_int32),
                ("ndim", c_int32), ("shape", POINTER(c_int64)),
                ("num_chunks", c_size_t), ("requires_grad", c_int32),
                ("path_len", c_size_t)]


_INT_TYPES = (ctypes.c_int8, ctypes.c_int16, ctypes.c_int32, ctypes.c_int64,
              ctypes.c_uint8, ctypes.c_uint16, ctypes.c_uint32,
              ctypes.c_uint64)
_bounds_cache: dict = {}


def _int_bounds(struct_type):
    """{field name: (low, high)} of the integer fields of `struct_type`."""
    bounds = _bounds_cache.get(struct_type)
    if bounds is None:
        bounds = {}
        for name, ctype, *_ in struct_type._fields_:
            if any(ctype is t or ctype.__name__ == t.__name__
                   for t in _INT_TYPES):
                bits = 8 * ctypes.sizeof(ctype)
                signed = ctype(-1).value < 0
                bounds[name] = ((-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
                                if signed else (0, (1 << bits) - 1))
        _bounds_cache[struct_type] = bounds
    return bounds


def sized(struct_type, **fields):
    """A zeroed option struct with struct_size set, then `fields`. An int
    outside its field's C type raises ValueError naming the field and the
    value (ctypes would wrap it silently)."""
    s = struct_type()
    s.struct_size = ctypes.sizeof(struct_type)
    bounds = _int_bounds(struct_type)
    for name, value in fields.items():
        limits = bounds.get(name)
        if limits is not None and isinstance(value, int) and \
                not limits[0] <= value <= limits[1]:
            raise ValueError(f"{name}={value} is outside [{limits[0]}, "
                             f"{limits[1]}]")
        setattr(s, name, value)
    return s


def encode_path(path, argument: str = "checkpoint_id") -> bytes:
    """A checkpoint path (str, bytes or os.PathLike) as the C library takes
    it, through errors.checked_path: TypeError naming `argument` for
    another type, CheckpointValueError for an embedded NUL byte (C would
    cut the path there, and a save would replace another checkpoint).
    Every path the package hands the library goes through here."""
    from . import errors
    return os.fsencode(errors.checked_path(path, argument))


_P = c_void_p  # Opaque handles and arrays the package builds itself.
_PP = POINTER(c_void_p)
_PROTOTYPES = {
    "dcp_version": (c_char_p, []),
    "dcp_status_name": (c_char_p, [c_int]),
    "dcp_last_error_code": (c_int, []),
    "dcp_last_error_message": (c_char_p, []),
    "dcp_last_error_num_rank_failures": (c_size_t, []),
    "dcp_last_error_rank_failure": (
        c_int, [c_size_t, POINTER(c_int32), POINTER(c_int), POINTER(c_char_p)]),
    "dcp_dtype_name": (c_char_p, [c_int]),
    "dcp_state_dict_create": (c_int, [_PP]),
    "dcp_state_dict_free": (c_int, [_P]),
    "dcp_state_dict_set_tensor": (
        c_int, [_P, Path, POINTER(DLTensor), POINTER(Shard)]),
    # paths, tensors and shards are arrays the package lays out itself
    # (numpy buffers of the structs above): passed as addresses.
    "dcp_state_dict_set_tensors": (c_int, [_P, c_size_t, _P, _P, _P]),
    "dcp_state_dict_set_sharded_tensor": (
        c_int, [_P, Path, c_int32, POINTER(c_int64), c_size_t,
                POINTER(DLTensor), POINTER(POINTER(c_int64))]),
    "dcp_state_dict_set_dlpack": (c_int, [_P, Path, _P, POINTER(Shard)]),
    "dcp_state_dict_set_dlpack_versioned": (
        c_int, [_P, Path, _P, POINTER(Shard)]),
    "dcp_state_dict_mark_requires_grad": (c_int, [_P, c_size_t, _P]),
    "dcp_state_dict_set_none": (c_int, [_P, Path]),
    "dcp_state_dict_set_int": (c_int, [_P, Path, c_int64]),
    "dcp_state_dict_set_float": (c_int, [_P, Path, c_double]),
    "dcp_state_dict_set_bool": (c_int, [_P, Path, c_int32]),
    "dcp_state_dict_set_string": (c_int, [_P, Path, c_char_p, c_size_t]),
    "dcp_state_dict_set_bytes": (c_int, [_P, Path, c_char_p, c_size_t]),
    "dcp_state_dict_get": (c_int, [_P, Path, POINTER(LeafInfo)]),
    "dcp_state_dict_num_leaves": (c_int, [_P, POINTER(c_size_t)]),
    "dcp_state_dict_leaf": (
        c_int, [_P, c_size_t, POINTER(c_char_p), POINTER(LeafInfo)]),
    "dcp_state_dict_get_dlpack": (c_int, [_P, Path, _PP]),
    "dcp_state_dict_dtype_mismatches": (
        c_int, [_P, _P, c_size_t, POINTER(c_size_t), POINTER(c_int32),
                POINTER(c_size_t)]),
    "dcp_fs_writer_create": (
        c_int, [c_char_p, POINTER(FsWriterOptions), _PP]),
    "dcp_storage_writer_free": (c_int, [_P]),
    "dcp_fs_reader_create": (
        c_int, [c_char_p, POINTER(FsReaderOptions), _PP]),
    "dcp_storage_reader_free": (c_int, [_P]),
    "dcp_hf_writer_create": (
        c_int, [c_char_p, POINTER(HfWriterOptions), _PP]),
    "dcp_hf_reader_create": (
        c_int, [c_char_p, POINTER(HfReaderOptions), _PP]),
    "dcp_hf_quantized_reader_create": (
        c_int, [c_char_p, POINTER(HfQuantizedReaderOptions), _PP]),
    "dcp_mega_writer_create": (
        c_int, [c_char_p, POINTER(MegaWriterOptions), _PP]),
    "dcp_mega_reader_create": (
        c_int, [c_char_p, POINTER(MegaReaderOptions), _PP]),
    "dcp_process_group_create_from_env": (
        c_int, [POINTER(ProcessGroupOptions), _PP]),
    "dcp_process_group_create_from_store": (
        c_int, [POINTER(Store), c_int32, c_int32,
                POINTER(ProcessGroupOptions), _PP]),
    "dcp_process_group_rank": (c_int, [_P, POINTER(c_int32)]),
    "dcp_process_group_size": (c_int, [_P, POINTER(c_int32)]),
    "dcp_set_default_process_group": (c_int, [_P]),
    "dcp_process_group_free": (c_int, [_P]),
    "dcp_process_group_agree": (c_int, [_P, c_char_p, c_int, c_char_p]),
    "dcp_save": (c_int, [_P, POINTER(SaveOptions), _PP]),
    "dcp_load": (c_int, [_P, POINTER(LoadOptions)]),
    "dcp_async_save": (c_int, [_P, POINTER(SaveOptions), _PP]),
    "dcp_async_save_wait": (
        c_int, [_P, c_int32, c_int64, POINTER(c_int32)]),
    "dcp_async_save_on_done": (c_int, [_P, c_int32, DONE_FN, c_void_p]),
    "dcp_async_save_metadata": (c_int, [_P, _PP]),
    "dcp_async_save_free": (c_int, [_P]),
    "dcp_stager_create": (c_int, [POINTER(StagerOptions), _PP]),
    "dcp_stager_reserve": (c_int, [_P, _P]),
    "dcp_stager_free": (c_int, [_P]),
    "dcp_copy_host": (c_int, [_P, c_size_t, c_int]),
    "dcp_populate_host": (c_int, [_P, c_size_t]),
    "dcp_snapshot_host": (c_int, [_P, c_size_t, c_int, _PP]),
    "dcp_host_snapshot_wait": (c_int, [_P, POINTER(c_size_t)]),
    "dcp_host_snapshot_free": (c_int, [_P]),
    "dcp_stager_copy_on_write_bytes": (c_int, [_P, POINTER(c_size_t)]),
    "dcp_shutdown": (c_int, []),
    "dcp_metadata_read": (c_int, [c_char_p, _PP]),
    "dcp_metadata_free": (c_int, [_P]),
    "dcp_metadata_encode": (c_int, [_P, c_void_p, c_size_t,
                                    POINTER(c_size_t)]),
    "dcp_metadata_decode": (c_int, [c_void_p, c_size_t, c_char_p, _PP]),
    "dcp_metadata_num_items": (c_int, [_P, POINTER(c_size_t)]),
    "dcp_metadata_item": (c_int, [_P, c_size_t, POINTER(ItemInfo)]),
    "dcp_metadata_find": (c_int, [_P, c_char_p, POINTER(c_size_t)]),
    "dcp_metadata_find_path": (c_int, [_P, Path, POINTER(c_size_t)]),
    "dcp_metadata_find_prefix": (
        c_int, [_P, c_char_p, POINTER(c_size_t), POINTER(c_size_t),
                POINTER(c_size_t), POINTER(c_size_t)]),
    "dcp_metadata_chunk": (
        c_int, [_P, c_size_t, c_size_t, POINTER(POINTER(c_int64)),
                POINTER(POINTER(c_int64))]),
    "dcp_metadata_item_path": (
        c_int, [_P, c_size_t, c_size_t, POINTER(PathElem)]),
    "dcp_metadata_ids": (c_int, [_P, POINTER(c_char_p), POINTER(c_char_p)]),
    "dcp_metadata_version": (c_int, [_P, POINTER(c_char_p)]),
    "dcp_metadata_items_packed": (
        c_int, [_P, POINTER(POINTER(c_int64)), POINTER(c_size_t),
                POINTER(POINTER(ctypes.c_char)), POINTER(c_size_t)]),
    "dcp_metadata_storage_packed": (
        c_int, [_P, POINTER(POINTER(c_int64)), POINTER(c_size_t),
                POINTER(POINTER(ctypes.c_char)), POINTER(c_size_t)]),
    "dcp_metadata_num_storage": (c_int, [_P, POINTER(c_size_t)]),
    "dcp_metadata_storage": (c_int, [_P, c_size_t, POINTER(StorageInfo)]),
    "dcp_storage_reader_read_metadata": (c_int, [_P, c_char_p, _PP]),
}

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
library_path: str | None = None  # Where the loaded libdcp.so came from.


def candidate_paths() -> list[str]:
    """Where libdcp.so is looked for, in order."""
    paths = []
    env = os.environ.get("DCP_LIBRARY")
    if env:
        paths.append(env)
    here = os.path.dirname(os.path.abspath(__file__))
    paths.append(os.path.join(here, "libdcp.so"))
    # python/dcp/ in a checkout: the repository root is two levels up.
    paths.append(os.path.join(os.path.dirname(os.path.dirname(here)),
                              "bazel-bin", "capi", "libdcp.so"))
    return paths


def lib() -> ctypes.CDLL:
    """The loaded library (loaded and declared on the first call).

    Raises OSError listing every place looked in when there is none. An
    explicit $DCP_LIBRARY that does not exist is an error, not skipped.
    """
    global _lib, library_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        env = os.environ.get("DCP_LIBRARY")
        if env and not os.path.exists(env):
            raise OSError(f"DCP_LIBRARY={env} does not exist")
        tried = candidate_paths()
        path = next((p for p in tried if os.path.exists(p)), None)
        if path is None:
            raise OSError(
                "libdcp.so not found; looked in: " + ", ".join(tried) +
                " (set DCP_LIBRARY, install the wheel, or build "
                "//capi:libdcp.so)")
        handle = ctypes.CDLL(path)
        for name, (restype, argtypes) in _PROTOTYPES.items():
            fn = getattr(handle, name)
            fn.restype = restype
            fn.argtypes = argtypes
        library_path = path
        _lib = handle
        return handle


def version() -> str:
    """The loaded library's version, "MAJOR.MINOR.PATCH"."""
    return lib().dcp_version().decode()


def status_name(code: int) -> str:
    return lib().dcp_status_name(code).decode()


def last_error() -> tuple[int, str, list[tuple[int, int, str]]]:
    """(code, message, [(rank, code, message)...]) of this thread's last
    failed call."""
    L = lib()
    code = L.dcp_last_error_code()
    message = (L.dcp_last_error_message() or b"").decode("utf-8", "replace")
    failures = []
    n = L.dcp_last_error_num_rank_failures()
    rank, rcode, rmsg = c_int32(), c_int(), c_char_p()
    for i in range(n):
        if L.dcp_last_error_rank_failure(i, ctypes.byref(rank),
                                         ctypes.byref(rcode),
                                         ctypes.byref(rmsg)) != OK:
            break
        failures.append((rank.value, rcode.value,
                         (rmsg.value or b"").decode("utf-8", "replace")))
    return code, message, failures


def check(code: int, what: str | None = None) -> None:
    """Raises the exception for a failed call's status (errors.from_status)
    with this thread's last error; returns for DCP_OK."""
    if code == OK:
        return
    # Read first: an import may run a GC finalizer that calls dcp (freeing
    # a group) and overwrites this thread's last error.
    _, message, failures = last_error()
    from . import errors
    raise errors.from_status(code, message, failures, what)
