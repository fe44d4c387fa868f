"""save, load, save_state_dict, load_state_dict: the seed's synchronous API
over dcp_save / dcp_load.

One save is: walk the state dict once (dcp._state.Flat), one
dcp_state_dict_set_tensors call for every tensor, one call per plain
value, then dcp_save with the GIL released. The caller's tensors are
borrowed, never copied (see _state for the strided exceptions).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import gc
import os
import re
import threading

from . import _lib, _state, errors
from .metadata import Metadata, holds_checkpoint
from ._planner_hooks import set_up_load, set_up_save
from .planner import DefaultLoadPlanner, load_options, save_options
from .process_group import resolve, take_turn
from .stateful import is_stateful
from .storage import FileSystemReader, check_reader, check_writer

__all__ = ["save", "load", "save_state_dict", "load_state_dict"]


def _stateful_to_state_dict(state_dict):
    """The seed's rule: top-level values with a callable state_dict() (not
    tensors or containers) are saved as its result."""
    if not isinstance(state_dict, dict):
        raise TypeError(
            f"state_dict must be a dict, not {type(state_dict).__name__}")
    out = None
    for key, value in state_dict.items():
        if is_stateful(value, load=False):
            if out is None:
                out = dict(state_dict)
            out[key] = value.state_dict()
    return state_dict if out is None else out


class _Prepared:
    """The C objects of one save or load; free() releases them."""

    def __init__(self):
        self.sd = None
        self.values_sd = None
        self.writer = None
        self.reader = None
        self.metadata = None  # dcp_metadata_t read once for two loads
        self.flat = None
        self.keep = []

    def free(self):
        L = _lib._lib
        if L is None:
            return
        if self.sd is not None:
            L.dcp_state_dict_free(self.sd)
            self.sd = None
        if self.values_sd is not None:
            L.dcp_state_dict_free(self.values_sd)
            self.values_sd = None
        if self.writer is not None:
            L.dcp_storage_writer_free(self.writer)
            self.writer = None
        if self.reader is not None:
            L.dcp_storage_reader_free(self.reader)
            self.reader = None
        if self.metadata is not None:
            L.dcp_metadata_free(self.metadata)
            self.metadata = None


def _absolute(path: str) -> str:
    """A relative local `path` joined to the working directory now (not
    normalized: ".." after a symlink stays the kernel's to resolve), so a
    save or load finishing after an os.chdir (an async_save's upload, its
    writer process) uses the directory meant at the call (mega://DIR's
    DIR too). Other URIs ("://") and "" as they are."""
    scheme = ""
    if path.startswith("mega://"):
        scheme, path = "mega://", path[len("mega://"):]
    if not path or "://" in path or os.path.isabs(path):
        return scheme + path
    return scheme + os.path.join(os.getcwd(), path)


def _checkpoint_path(checkpoint_id, storage, kind):
    """The directory (or URI) a save/load of `kind` uses, as the seed's
    _storage_setup: checkpoint_id when given, and then a given `storage` is
    reset(checkpoint_id) to point there too; else the storage's path.
    A relative local path is made absolute (_absolute).
    Neither, or an empty path, raises errors.CheckpointIdMissingError (a
    ValueError and a RuntimeError); a path that is not a str, bytes
    (decoded as os.fsdecode does) or os.PathLike raises TypeError, one
    holding a NUL byte CheckpointValueError (errors.checked_path)."""
    storage_kind = f"storage_{'writer' if kind == 'save' else 'reader'}"
    if checkpoint_id is not None:
        path = _absolute(errors.checked_path(checkpoint_id, "checkpoint_id"))
        if path:
            reset = getattr(storage, "reset", None)
            if callable(reset):
                reset(path)
            return path
        raise errors.CheckpointIdMissingError(
            f"{kind}: checkpoint_id is empty; pass the checkpoint's "
            f"directory or a {storage_kind}")
    if storage is not None:
        path = _absolute(errors.checked_path(storage.path,
                                             f"{storage_kind} path"))
        if path:
            return path
        raise errors.CheckpointIdMissingError(
            f"{kind}: the {storage_kind}'s path is empty; pass the "
            "checkpoint's directory")
    raise errors.CheckpointIdMissingError(
        f"{kind}: pass checkpoint_id or a {storage_kind}")


def _holds_tensors_only(storage_writer, path) -> bool:
    """Whether the save goes to storage that holds tensors only (Hugging
    Face, MEGA), which refuses plain values."""
    from .storage import HuggingFaceStorageWriter, MegaStorageWriter
    if storage_writer is not None:
        return isinstance(storage_writer,
                          (HuggingFaceStorageWriter, MegaStorageWriter))
    return path.startswith("mega://")


def prepare_save(state_dict, *, checkpoint_id, storage_writer, planner,
                 where, coordinator_rank, use_collectives, allow_pickle,
                 flat=None):
    """The C state dict and options of a save (raises on bad input).
    `flat`: an already walked state dict (state_dict is then ignored)."""
    check_writer(storage_writer)
    path = _checkpoint_path(checkpoint_id, storage_writer, "save")
    in_the_way = errors.file_in_the_way(path, "save")
    if in_the_way is not None:
        raise in_the_way
    planner_options = save_options(planner)
    p = _Prepared()
    try:
        if flat is None:
            flat = _state.Flat(load=False, allow_pickle=allow_pickle)
            flat.add(state_dict)
        if _holds_tensors_only(storage_writer, path):
            flat.drop_empty_markers()
        p.flat = flat
        p.sd = flat.build()
        if storage_writer is not None:
            p.writer = storage_writer._create(path)
        options = _lib.sized(
            _lib.SaveOptions, checkpoint_id=_lib.encode_path(path),
            storage_writer=p.writer, process_group=where.handle,
            coordinator_rank=coordinator_rank,
            no_dist=_lib.flag(where.no_dist),
            use_collectives=_lib.flag(use_collectives),
            device_wait=_state.current_streams(flat),
            async_checkpointer_type=_lib.ASYNC_THREAD)
        if planner_options is not None:
            options.planner = ctypes.pointer(planner_options)
        p.keep += [options, planner_options]
        p.options = options
        return p
    except BaseException:
        p.free()
        raise


# Directories that async_saves of this process are still writing: their
# upload futures (register_in_flight).
_in_flight: dict = {}
_in_flight_lock = threading.Lock()


def _in_flight_key(path) -> str | None:
    """`path` (str, bytes, os.PathLike) as one spelling of its directory,
    or None for a URI or no path."""
    try:
        path = os.fsdecode(os.fspath(path))
        if not path or "://" in path:
            return None
        return os.path.realpath(_absolute(path))
    except (TypeError, ValueError, OSError):  # the save says what is wrong
        return None


def _forget_in_flight_after_fork() -> None:
    """In a child of fork(2): the parent's uploads are not the child's."""
    global _in_flight, _in_flight_lock
    _in_flight = {}
    _in_flight_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_in_flight_after_fork)


def register_in_flight(path, upload, staging=None, lane=None) -> None:
    """Notes that the future `upload` writes the checkpoint at `path`, until
    it is done (then forgotten: a done future holds its save's state).
    `staging`: the save's staging Future where a stager of the caller's
    completes it (then _wait_in_flight cannot wait while it is pending).
    `lane`: the queue that runs the upload in call order with the others
    of its lane ("engine", "process", "stager")."""
    path = _in_flight_key(path)
    if path is None:
        return
    with _in_flight_lock:
        _in_flight.setdefault(path, []).append((upload, staging, lane))

    # Finds its entry by the future it is called with: a closure holding
    # the entry (so the future) would be a cycle through the future's own
    # callbacks, freed only by a full garbage collection.
    def forget(done):
        with _in_flight_lock:
            entries = _in_flight.get(path)
            if entries is not None:
                entries[:] = [e for e in entries if e[0] is not done]
                if not entries:
                    del _in_flight[path]
    upload.add_done_callback(forget)


def _wait_in_flight(path, lane=None) -> None:
    """Waits for this process's async_saves still writing `path`, so a save
    there comes after them (their lock would refuse it, or, not begun yet,
    they would replace it). `lane`: those of that lane are not waited for
    (its queue runs them before the caller's own upload); None: all.
    Raises CheckpointException, waiting for none, where one still waits
    for its stager's Future: the caller may be the one to complete it. Not
    on dcp's own threads, whose uploads are what it would wait for."""
    path = _in_flight_key(path)
    if path is None or threading.current_thread().name.startswith("dcp-"):
        return
    with _in_flight_lock:
        pending = [(upload, staging) for upload, staging, of in
                   _in_flight.get(path, ()) if lane is None or of != lane]
        # The uploads of stagers of the caller's run one after another on
        # one thread: one queued behind another (into any directory) that
        # waits for its stager's Future waits for that too.
        stalled = any(staging is not None and not staging.done()
                      for entries in _in_flight.values()
                      for _, staging, _ in entries) and \
            any(staging is not None for _, staging in pending)
    if not pending:
        return
    if any(staging is not None and not staging.done()
           for _, staging in pending):
        raise errors.from_status(
            _lib.FAILED_PRECONDITION,
            f"an async_save of this process into {path} is still staging "
            "(its stager's Future is not done), and would replace this save "
            "once it is: wait for its staging_completion (or "
            "upload_completion) first")
    if stalled:
        raise errors.from_status(
            _lib.FAILED_PRECONDITION,
            f"an async_save of this process into {path} is queued behind "
            "another whose stager's Future is not done (the uploads of "
            "stagers of yours run one after another), so waiting for it "
            "could wait for you: complete that Future, or wait for the "
            "earlier saves' upload_completion, first")
    concurrent.futures.wait([upload for upload, _ in pending])


def _save(state_dict, *, process_group, no_dist, **kwargs):
    target = kwargs.get("checkpoint_id")
    if target is None:
        target = getattr(kwargs.get("storage_writer"), "path", None)
    _wait_in_flight(target)
    # In call order with the other operations on the group (Turn).
    with take_turn(resolve(process_group, no_dist)):
        return _save_in_turn(state_dict, process_group=process_group,
                             no_dist=no_dist, **kwargs)


def _save_in_turn(state_dict, *, checkpoint_id, storage_writer, planner,
                  process_group, coordinator_rank, no_dist, use_collectives,
                  allow_pickle, stateful):
    where = resolve(process_group, no_dist)
    p = None
    error = None
    try:
        sd = _stateful_to_state_dict(state_dict) if stateful else state_dict
        sd = set_up_save(planner, sd, checkpoint_id=checkpoint_id,
                         storage_writer=storage_writer,
                         is_coordinator=where.rank == coordinator_rank)
        p = prepare_save(sd, checkpoint_id=checkpoint_id,
                         storage_writer=storage_writer, planner=planner,
                         where=where, coordinator_rank=coordinator_rank,
                         use_collectives=use_collectives,
                         allow_pickle=allow_pickle)
    except BaseException as e:
        error = e
    try:
        # Raises on every rank when any failed: what this rank prepared is
        # freed then too.
        where.agree("save", error)
        return Metadata._from_handle(run_save(p, where.rank))
    finally:
        if p is not None:
            p.free()


def run_save(p, rank):
    """dcp_save of prepared save `p` (this process being `rank` of its
    group); the committed metadata's C handle, or raises (errors.from_status:
    a NOT_FOUND is a directory's, a save looks up no key)."""
    md = ctypes.c_void_p()
    code = _lib.lib().dcp_save(p.sd, ctypes.byref(p.options),
                               ctypes.byref(md))
    if code != _lib.OK:
        _, message, failures = _lib.last_error()
        raise errors.from_status(code, message, failures, rank=rank,
                                 not_found=errors.CheckpointFileNotFoundError)
    return md


def save(state_dict, *, checkpoint_id=None, storage_writer=None,
         planner=None, process_group=None, no_dist=False,
         use_collectives=True, allow_pickle=False):
    """Saves `state_dict` and commits the checkpoint; returns its Metadata.

    state_dict: nested dicts/lists/tuples of torch tensors (CPU or CUDA,
      any dtype dcp stores, DTensor and dcp.ShardedTensor chunks), numpy
      arrays and plain values; top-level Stateful objects are saved as
      their state_dict(). Nothing is copied: do not change the tensors
      until save returns.
    checkpoint_id: the checkpoint directory (or storage_writer's path);
      given with storage_writer, the writer is reset(checkpoint_id) to it.
      Neither raises errors.CheckpointIdMissingError (ValueError,
      RuntimeError).
    storage_writer: a FileSystemWriter, HuggingFaceStorageWriter or
      MegaStorageWriter (its options).
    planner: a DefaultSavePlanner (its options).
    process_group: None (torch.distributed's group when initialized, else
      a single process), a torch ProcessGroup (ignored, as None, while
      torch.distributed is not initialized) or a dcp.ProcessGroup.
    no_dist: save without any collective.
    use_collectives: False: each rank saves its own rank-local checkpoint.
    allow_pickle (dcp only): store other objects pickled; loading such a
      checkpoint then needs allow_pickle=True too (and runs pickle).

    Raises CheckpointException (a subclass by cause, see dcp.errors) when
    the engine fails on any rank (every rank raises it), TypeError for a
    value that cannot be saved.
    """
    return _save(state_dict, checkpoint_id=checkpoint_id,
                 storage_writer=storage_writer, planner=planner,
                 process_group=process_group, coordinator_rank=0,
                 no_dist=no_dist, use_collectives=use_collectives,
                 allow_pickle=allow_pickle, stateful=True)


def save_state_dict(state_dict, storage_writer, process_group=None,
                    coordinator_rank: int = 0, no_dist: bool = False,
                    planner=None, *, allow_pickle=False):
    """The seed's older entry point: save `state_dict` (Stateful values are
    not called) through `storage_writer`."""
    storage_writer.reset()
    return _save(state_dict, checkpoint_id=None,
                 storage_writer=storage_writer, planner=planner,
                 process_group=process_group,
                 coordinator_rank=coordinator_rank, no_dist=no_dist,
                 use_collectives=True, allow_pickle=allow_pickle,
                 stateful=False)


def _load_checked(sd, options, path, rank=0, file_system=False):
    """dcp_load; raises on failure (errors.from_status, this process being
    `rank`): CheckpointFileNotFoundError when there is no checkpoint at
    `path` (else NOT_FOUND is a key's: CheckpointNotFoundError); for a
    FileSystem checkpoint (`file_system`) whose .metadata
    torch.distributed.checkpoint wrote, CheckpointNotImplementedError
    saying how to convert it (errors.foreign_checkpoint_error)."""
    with _gc_resumed():
        code = _lib.lib().dcp_load(sd, ctypes.byref(options))
    if code == _lib.OK:
        return
    _, message, failures = _lib.last_error()
    if code == _lib.NOT_FOUND and not holds_checkpoint(path, rank):
        raise errors.from_status(code, message, failures, rank=rank,
                                 cls=errors.CheckpointFileNotFoundError)
    exc = errors.from_status(code, message, failures, rank=rank)
    foreign = errors.foreign_checkpoint_error(exc, path) \
        if file_system else None
    if foreign is not None:
        raise foreign from exc
    raise exc


def _plan_with_metadata(flat, p, path, rank, storage_reader) -> None:
    """Fits what `flat` loads to the checkpoint's metadata before the load:
    lists of plain values take the saved list's shape (_state.Flat
    .reshape_lists; then p.sd is built again), and tensors
    whose dtype differs from the checkpoint's load through temporaries of
    the saved dtype, converted into the destinations afterwards, as torch's
    DCP converts with copy_ (_state.Flat.convert_on_load). The metadata is
    what the load plans against (p.metadata), else read here: rank `rank`'s
    own of a rank-local checkpoint, else through the storage the load uses
    (a Hugging Face or MEGA directory without a storage_reader: the one the
    library picks). Where the metadata cannot be read, nothing changes and
    the load reports why; a refusal of the directory (FAILED_PRECONDITION:
    another format's files, a commit journal no one completed in time)
    raises here, which the load would repeat."""
    if not flat.t_objs and not flat.has_plain_lists():
        return
    if p.metadata is not None:
        _fit(flat, p, p.metadata)
        return
    L = _lib.lib()
    local = os.path.join(path, f"rank-{rank}")
    if "://" not in path and not os.path.exists(
            os.path.join(path, ".metadata")) and os.path.exists(
                os.path.join(local, ".metadata")):
        # A rank-local checkpoint (use_collectives=False): this rank's own.
        handle = ctypes.c_void_p()
        if L.dcp_metadata_read(_lib.encode_path(local),
                               ctypes.byref(handle)) == _lib.OK:
            try:
                _fit(flat, p, handle)
            finally:
                L.dcp_metadata_free(handle)
        return
    from .storage import MegaStorageReader
    reader = p.reader
    own_reader = None
    # MEGA metadata names items by their flattened names only.
    flat_names = isinstance(storage_reader, MegaStorageReader)
    try:
        if reader is None:
            from .metadata import _is_hf_directory, _is_mega_directory
            if _is_mega_directory(path):
                own_reader = MegaStorageReader(path)._create(path)
                flat_names = True
            elif "://" not in path and _is_hf_directory(path):
                from .storage import HuggingFaceStorageReader
                own_reader = HuggingFaceStorageReader(path)._create(path)
            reader = own_reader
        if reader is None:
            return
        handle = ctypes.c_void_p()
        code = L.dcp_storage_reader_read_metadata(reader, None,
                                                  ctypes.byref(handle))
        if code == _lib.FAILED_PRECONDITION:
            # The load's own read would refuse too, after waiting again as
            # long (a pending commit journal it cannot complete).
            _lib.check(code)
        if code != _lib.OK:
            return
        try:
            _fit(flat, p, handle, flat_names)
        finally:
            L.dcp_metadata_free(handle)
    finally:
        if own_reader is not None:
            L.dcp_storage_reader_free(own_reader)


def _fit(flat, p, metadata, flat_names=False) -> None:
    if flat.reshape_lists(metadata, flat_names):
        L = _lib.lib()
        L.dcp_state_dict_free(p.sd)
        p.sd = None
        p.sd = flat.build()
    if flat.t_objs:
        flat.convert_on_load(p.sd, metadata)


# The engine's kind mismatch for a plain destination (a bytes placeholder
# to it), the whole message or rank N's part of an agreed one.
_PLAIN_AS_BYTES = re.compile(
    r'(?P<head>^|rank (?P<rank>\d+): [A-Z_]+: )'
    r'"(?P<name>(?:[^"\\]|\\.)*)" is a bytes in the state dict but')


def _name_plain_destination(exc, flat, rank: int = 0) -> None:
    """A plain destination goes to the engine as a bytes placeholder (its
    type comes from the checkpoint), so the engine's kind mismatch calls it
    "a bytes": names the caller's type instead, in place, where this
    process (rank `rank`) holds the destination; "a plain value" in
    another rank's part of an agreed message."""
    if flat is None:
        return
    types = {}
    for path, (_, _, old) in zip(flat.v_paths, flat.v_slots):
        types.setdefault(flat.name(path), old)

    def named(m):
        own = m.group("rank") is None or int(m.group("rank")) == rank
        name = m.group("name")
        if own and name in types:
            old = types[name]
            what = "None" if old is None else \
                f"a value of type {type(old).__name__}"
        else:
            what = "a plain value"
        return m.group(0).replace(" is a bytes in the state dict",
                                  f" is {what} in the state dict", 1)
    msg = _PLAIN_AS_BYTES.sub(named, exc.msg)
    if msg != exc.msg:
        exc.msg = msg
        exc.args = (msg,)


# The engine's hint for keys the checkpoint lacks, in its C/C++ spelling,
# and whether the engine says the checkpoint holds the key in another shape.
_PARTIAL_LOAD_HINT = re.compile(
    r"; load with allow_partial_load to skip missing keys"
    r"(?P<other_shape>(?= \(the checkpoint holds ))?")


def _name_partial_load(exc) -> None:
    """The engine suggests allow_partial_load for keys the checkpoint lacks:
    spells it as Python passes it, in place; drops it where the checkpoint
    holds the key's value in another shape (the engine's "(the checkpoint
    holds ...)"), where skipping the key would drop that value silently."""
    msg = _PARTIAL_LOAD_HINT.sub(
        lambda m: "" if m.group("other_shape") is not None else
        "; load with planner=dcp.DefaultLoadPlanner(allow_partial_load=True)"
        " to skip missing keys", exc.msg)
    if msg == exc.msg:
        return
    exc.msg = msg
    exc.args = (msg,)
    for failure, _ in exc.failures.values():
        if isinstance(failure, errors.CheckpointException) and \
                failure is not exc:
            _name_partial_load(failure)


def _broadcasting_reader(storage_reader):
    """dcp's BroadcastingTorchSaveReader for `storage_reader` (torch's
    becomes dcp's, with its checkpoint_id and coordinator_rank), or None."""
    from .format_utils import BroadcastingTorchSaveReader
    if isinstance(storage_reader, BroadcastingTorchSaveReader):
        return storage_reader
    module = type(storage_reader).__module__ or ""
    if type(storage_reader).__name__ == "BroadcastingTorchSaveReader" and \
            module.startswith("torch.distributed.checkpoint"):
        return BroadcastingTorchSaveReader(
            getattr(storage_reader, "checkpoint_id", None),
            getattr(storage_reader, "coordinator_rank", 0))
    return None


_gc_state = threading.local()


@contextlib.contextmanager
def _gc_paused():
    """Python's cyclic GC paused while a load walks and builds: it
    allocates a few short-lived objects per leaf (freed by reference
    counting), which would otherwise trigger full collections of the
    caller's whole heap in the middle of it (0.1 s each on a large one).
    Resumed while the engine reads (_gc_resumed), where other threads
    run."""
    enabled = gc.isenabled()
    _gc_state.resume = enabled
    gc.disable()
    try:
        yield
    finally:
        _gc_state.resume = False
        if enabled:
            gc.enable()


@contextlib.contextmanager
def _gc_resumed():
    """Inside _gc_paused: the GC as it was before, for a long C call."""
    resume = getattr(_gc_state, "resume", False)
    if resume:
        gc.enable()
    try:
        yield
    finally:
        if resume:
            gc.disable()


def _load(state_dict, *, process_group, no_dist, **kwargs):
    # In call order with the other operations on the group (Turn).
    with take_turn(resolve(process_group, no_dist)), _gc_paused():
        return _load_in_turn(state_dict, process_group=process_group,
                             no_dist=no_dist, **kwargs)


def _load_in_turn(state_dict, *, checkpoint_id, storage_reader, planner,
                  process_group, coordinator_rank, no_dist, allow_pickle,
                  stateful):
    where = resolve(process_group, no_dist)
    broadcasting = _broadcasting_reader(storage_reader)
    if broadcasting is not None:
        from . import _broadcast_load
        return _broadcast_load.load(
            state_dict, reader=broadcasting, checkpoint_id=checkpoint_id,
            planner=planner, where=where, allow_pickle=allow_pickle,
            stateful=stateful)
    p = _Prepared()
    error = None
    statefuls = {}
    try:
        if not isinstance(state_dict, dict):
            raise TypeError(f"state_dict must be a dict, not "
                            f"{type(state_dict).__name__}")
        check_reader(storage_reader)
        path = _checkpoint_path(checkpoint_id, storage_reader, "load")
        in_the_way = errors.file_in_the_way(path, "load")
        if in_the_way is not None:
            raise in_the_way
        planner_options = load_options(planner)
        target = state_dict
        if stateful:
            for key, value in state_dict.items():
                if is_stateful(value, load=True):
                    statefuls[key] = (value, value.state_dict())
            if statefuls:
                target = dict(state_dict)
                for key, (_, sd) in statefuls.items():
                    target[key] = sd
        set_up = set_up_load(planner, target, storage_reader=storage_reader,
                             path=path, rank=where.rank,
                             is_coordinator=where.rank == coordinator_rank)
        flat = _state.Flat(load=True, allow_pickle=allow_pickle)
        flat.add(set_up.walked)
        p.flat = flat
        p.sd = flat.build(tensors_only=True)
        built = p.sd
        if storage_reader is None and "://" not in path and (
                os.path.exists(os.path.join(path, ".metadata")) or
                os.path.exists(os.path.join(path, "rank-0", ".metadata"))):
            storage_reader = FileSystemReader(path)
        # Otherwise the library picks the storage from the id: mega://DIR,
        # a MEGA or Hugging Face directory, else the native reader.
        if isinstance(storage_reader, FileSystemReader) and \
                storage_reader.direct_io is None and \
                flat.prefers_buffered_reads():
            # The engine's default, O_DIRECT, would bounce every byte of
            # these unaligned destinations (see prefers_buffered_reads).
            storage_reader = FileSystemReader(
                storage_reader.path, thread_count=storage_reader.thread_count,
                direct_io=False)
        if storage_reader is not None:
            p.reader = storage_reader._create(path)
        if isinstance(storage_reader, FileSystemReader) and \
                os.path.exists(os.path.join(path, ".metadata")):
            # Both loads plan against one read of the metadata. If the read
            # fails, each load reads it and reports why.
            handle = ctypes.c_void_p()
            if _lib.lib().dcp_storage_reader_read_metadata(
                    p.reader, None, ctypes.byref(handle)) == _lib.OK:
                p.metadata = handle
        _plan_with_metadata(flat, p, path, where.rank,
                            storage_reader)
        if p.sd is built:  # not built again with its values
            flat.set_values(p.sd)
        # The plain values load first, on their own: a value that cannot
        # be decoded (pickled without allow_pickle, an unpickling error)
        # then raises before the load of p.sd writes any caller tensor.
        # Every rank of a group takes both loads (they are collective).
        if flat.v_slots or not where.no_dist:
            p.values_sd = flat.build(values_only=True)
        options = _lib.sized(
            _lib.LoadOptions, checkpoint_id=_lib.encode_path(path),
            storage_reader=p.reader, process_group=where.handle,
            coordinator_rank=coordinator_rank,
            no_dist=_lib.flag(where.no_dist),
            device_wait=_state.current_streams(flat), metadata=p.metadata)
        if flat.engine_converts:
            if planner_options is None:
                planner_options = DefaultLoadPlanner()._options()
            planner_options.convert_dtypes = _lib.flag(True)
        if planner_options is not None:
            options.planner = ctypes.pointer(planner_options)
        p.keep += [options, planner_options]
    except BaseException as e:
        p.free()
        error = e
    # What _load_checked needs to name a failure.
    checked = dict(rank=where.rank, file_system=isinstance(
        storage_reader, FileSystemReader))
    try:
        # Raises on every rank when any failed: what this rank prepared is
        # freed then too.
        where.agree("load", error)
        values = []
        if p.values_sd is not None:
            first = None
            try:
                _load_checked(p.values_sd, options, path, **checked)
            except errors.CheckpointException as e:
                first = e
            if first is not None:
                # The engine's checks of keys and types fail the load of
                # every leaf too, before it writes anything, and name what
                # comes first in the state dict: raise that (outside the
                # handler, so it is not chained to the first). Any other
                # failure (I/O, damaged data) is raised as it is: a second
                # load could then succeed and write the caller's tensors.
                if first.code in (_lib.NOT_FOUND, _lib.INVALID_ARGUMENT):
                    _load_checked(p.sd, options, path, **checked)
                raise first
            error = None
            try:
                values = flat.read_values(p.values_sd)
            except BaseException as e:
                error = e
            where.agree("load", error)
        try:
            _load_checked(p.sd, options, path, **checked)
        finally:
            # Even a failed load may have written some of them.
            flat.mark_written()
        flat.write_back(values)
        set_up.finish()
    except errors.CheckpointValueError as e:
        _name_plain_destination(e, p.flat, where.rank)
        raise
    except errors.CheckpointNotFoundError as e:
        _name_partial_load(e)
        raise
    finally:
        p.free()
    if target is not state_dict:
        for key in state_dict:
            if key not in statefuls:
                state_dict[key] = target[key]
    # What the load put at the key: a state_dict() of plain values, or a
    # tuple, is replaced there rather than changed in place.
    for key, (value, _) in statefuls.items():
        value.load_state_dict(target[key])


def load(state_dict, *, checkpoint_id=None, storage_reader=None,
         planner=None, process_group=None, no_dist=False,
         allow_pickle=False):
    """Loads a checkpoint into `state_dict` in place.

    Tensors (torch CPU/CUDA, numpy, DTensor and ShardedTensor chunks) are
    filled in their own memory, resharded as needed; plain values are
    replaced in their containers (tuples rebuilt; a list of plain values
    takes the saved list's length, as in torch); top-level Stateful
    objects get load_state_dict() with their loaded state. A tensor of
    another dtype than the saved one is converted as torch's copy_
    converts (floats into CPU and CUDA tensors by the engine, a read window of
    host temporaries at a time). Keys the checkpoint lacks raise
    CheckpointNotFoundError unless the planner is
    DefaultLoadPlanner(allow_partial_load=True); a shape that differs, or
    a dtype that cannot load (float8 into numpy), raises
    CheckpointValueError naming the tensor; no checkpoint
    at checkpoint_id raises CheckpointFileNotFoundError; corrupt data
    raises CheckpointCorruptError naming the file; a directory written by
    torch.distributed.checkpoint raises CheckpointNotImplementedError. A
    value saved pickled needs allow_pickle=True (else ValueError).
    checkpoint_id, storage_reader and process_group as for save.
    """
    _load(state_dict, checkpoint_id=checkpoint_id,
          storage_reader=storage_reader, planner=planner,
          process_group=process_group, coordinator_rank=0, no_dist=no_dist,
          allow_pickle=allow_pickle, stateful=True)


def load_state_dict(state_dict, storage_reader, process_group=None,
                    coordinator_rank: int = 0, no_dist: bool = False,
                    planner=None, *, allow_pickle=False):
    """The seed's older entry point: load through `storage_reader`
    (Stateful values are not called)."""
    storage_reader.reset()
    _load(state_dict, checkpoint_id=None, storage_reader=storage_reader,
          planner=planner, process_group=process_group,
          coordinator_rank=coordinator_rank, no_dist=no_dist,
          allow_pickle=allow_pickle, stateful=False)
