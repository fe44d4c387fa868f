"""The seed's DefaultStager and StagingOptions, backed by the engine's stager.

Pass a DefaultStager as ``async_stager=`` to :func:`dcp.async_save` (THREAD)
and keep it for every save of the run: it keeps its staging memory between
saves, so only its first use maps fresh memory, and ``reserve(state_dict)``
moves even that off the training loop's critical path::

    stager = dcp.DefaultStager()
    stager.reserve(state)                # when the loop starts
    for step in ...:
        ...
        r = dcp.async_save(state, checkpoint_id=..., async_stager=stager)
        r.staging_completion.result()

With ``AsyncCheckpointerType.PROCESS`` saves stage into the writer
process's shared memory instead; ``reserve(state_dict,
AsyncCheckpointerType.PROCESS)`` maps and faults in that memory and starts
the writer process ahead of the first save, for the same effect.
"""

import abc
import contextlib
import copy
import ctypes
import dataclasses
import threading

import numpy as np

from . import _lib, _state


@dataclasses.dataclass(frozen=True)
class StagingOptions:
    """The seed's StagingOptions (defaults: every switch on).

    ``use_pinned_memory`` page-locks the staging memory (fast device-to-host
    copies; limited by RLIMIT_MEMLOCK), ``use_shared_memory`` puts it in a
    memfd, ``use_async_staging`` stages on a background thread,
    ``use_non_blocking_copy`` returns before device copies finish.
    ``cache_staged_state_dict`` (dcp's) keeps the memory between saves.

    ``copy_on_write`` (dcp's, off by default): CPU tensors are not copied
    before staging completes but write-protected (Linux userfaultfd) and
    copied in the background; a write to a page not yet copied waits while
    it is. ``staging_completion`` then comes in the time it takes to
    protect the pages (~10 ms per GB), not to copy them. The tensors may
    change after ``staging_completion`` but stay referenced by dcp until
    ``upload_completion``. Pinned (page-locked) CPU tensors are copied as
    usual: a device's DMA into them would bypass the protection. Needs
    Linux 6.4 and the right to use userfaultfd (root, CAP_SYS_PTRACE or
    ``vm.unprivileged_userfaultfd=1``); without it tensors are copied.
    """
    use_pinned_memory: bool = True
    use_shared_memory: bool = True
    use_async_staging: bool = True
    use_non_blocking_copy: bool = True
    cache_staged_state_dict: bool = True
    copy_on_write: bool = False


class AsyncStager(metaclass=abc.ABCMeta):
    """torch's AsyncStager protocol, to subclass for a stager of your own:
    ``stage(state_dict)`` returns a copy of the state dict that later
    training steps do not change (or a Future of one); async_save writes
    that copy in the background. ``should_synchronize_after_execute``
    (default True) makes async_save call ``synchronize_staging()`` before
    it returns, where ``stage`` returned a dict whose copies may still be
    running. isinstance() is True for any object with these methods
    (dcp's DefaultStager among them)."""

    _synchronize_after_execute: bool = True

    @property
    def should_synchronize_after_execute(self) -> bool:
        return self._synchronize_after_execute

    def stage(self, state_dict):
        raise NotImplementedError(
            f"{type(self).__name__} must implement stage()")

    def synchronize_staging(self) -> None:
        """Waits until what stage() returned is complete (no-op here)."""

    def close(self) -> None:
        """Releases what the stager holds (no-op here)."""

    @classmethod
    def __subclasshook__(cls, other):
        if cls is AsyncStager:
            return all(callable(getattr(other, name, None))
                       for name in ("stage", "synchronize_staging", "close"))
        return NotImplemented


class BlockingAsyncStager(AsyncStager):
    """torch's BlockingAsyncStager: stage() returns a copy of the state dict
    with every tensor in host memory, made in the call.
    ``cache_staged_state_dict`` keeps that copy (in page-locked memory
    where a GPU allows) and copies into it again on the next stage() of a
    state dict of the same structure, shapes and dtypes: reuse one stager
    for every save. The next stage() first waits for the async_save that
    still writes the copy (so each checkpoint holds its own step); a copy
    staged by hand is yours to stop using first. ``type_check`` is
    accepted for torch's signature. For the engine's faster staging, pass
    dcp.DefaultStager instead."""

    _synchronize_after_execute: bool = False

    def __init__(self, cache_staged_state_dict: bool = False,
                 type_check: bool = False):
        self.cache_staged_state_dict = cache_staged_state_dict
        self.type_check = type_check
        self.state_dict_cache = None
        self._writing = None  # the upload still reading the cache

    def _lease(self, upload) -> None:
        """async_save: `upload` reads what stage() returned until done."""
        self._writing = upload

    def stage(self, state_dict):
        writing = self._writing
        reuse = self.cache_staged_state_dict
        if reuse and writing is not None and not writing.done():
            if threading.current_thread().name.startswith("dcp-"):
                # On dcp's threads (a done-callback), which may be the one
                # the upload needs: a fresh copy this time.
                return _host_copy(state_dict, True)
            from concurrent.futures import wait
            wait([writing])
        self._writing = None
        if reuse and self.state_dict_cache is not None \
                and _copy_into(self.state_dict_cache, state_dict):
            return self.state_dict_cache
        staged = _host_copy(state_dict, self.cache_staged_state_dict)
        if self.cache_staged_state_dict:
            self.state_dict_cache = staged
        return staged

    def close(self) -> None:
        self.state_dict_cache = None


def _copy_into(staged, value) -> bool:
    """Copies `value`'s tensors into the host copy `staged` made of a value
    of the same structure (plain values taken as they are); False, having
    copied nothing, where the structure, a shape or a dtype differs."""
    pairs = []

    def match(a, b) -> bool:
        torch = _state.torch
        if isinstance(b, np.ndarray):
            if not isinstance(a, np.ndarray) or a.shape != b.shape or \
                    a.dtype != b.dtype:
                return False
            pairs.append((a, b))
            return True
        if torch is not None and isinstance(b, torch.Tensor):
            if not isinstance(a, torch.Tensor) or _state._is_dtensor(b) or \
                    a.shape != b.shape or a.dtype != b.dtype:
                return False
            pairs.append((a, b))
            return True
        if isinstance(b, dict):
            return isinstance(a, dict) and a.keys() == b.keys() and all(
                match(a[k], b[k]) for k in b)
        if isinstance(b, (list, tuple)):
            return type(a) is type(b) and len(a) == len(b) and all(
                match(x, y) for x, y in zip(a, b))
        return not isinstance(b, _state.ShardedTensor)

    if not match(staged, value):
        return False
    for a, b in pairs:
        if isinstance(b, np.ndarray):
            np.copyto(a, b)
        else:
            a.copy_(b.detach())
            for name in _CHECKPOINTABLE:  # where this shard lies, anew
                if hasattr(b, name):
                    setattr(a, name, getattr(b, name))
    _refresh_plain(staged, value)
    return True


def _refresh_plain(staged, value):
    """`staged` (a host copy of a value of `value`'s structure, its tensors
    already copied) holding `value`'s plain values: dicts and lists
    updated in place, tuples rebuilt."""
    if isinstance(value, dict):
        for k, v in value.items():
            staged[k] = _refresh_plain(staged[k], v)
        return staged
    if isinstance(value, list):
        for i, v in enumerate(value):
            staged[i] = _refresh_plain(staged[i], v)
        return staged
    if isinstance(value, tuple):
        return _tuple_like(value, [_refresh_plain(a, b)
                                   for a, b in zip(staged, value)])
    torch = _state.torch
    if isinstance(value, np.ndarray) or (
            torch is not None and isinstance(value, torch.Tensor)):
        return staged
    return value


def _pinned(t) -> bool:
    """Whether `t` is a page-locked CPU torch tensor."""
    return (not isinstance(t, np.ndarray) and t.device.type == "cpu" and
            t.is_pinned())


class DefaultStager:
    """The engine's DefaultStager (see the module docstring)."""

    def __init__(self, config: StagingOptions = StagingOptions()):
        if not isinstance(config, StagingOptions):
            raise TypeError("config must be a dcp.StagingOptions, not "
                            f"{type(config).__name__}")
        self.config = config
        self._lock = threading.Lock()
        self._staging = []  # stage() futures not known to be done
        self._closed = False
        self._users = 0  # _use blocks running: close() frees after them
        self._handle = self._create(config)
        # Without copy-on-write, for states holding pinned CPU tensors;
        # made on first need.
        self._copying = None
        # Bytes PROCESS async_saves with this stager copied on write (their
        # snapshots are taken outside the C stager).
        self._process_copied_on_write = 0
        self._counter_lock = threading.Lock()

    @staticmethod
    def _create(config):
        options = _lib.sized(
            _lib.StagerOptions,
            **{f.name: _lib.flag(getattr(config, f.name))
               for f in dataclasses.fields(StagingOptions)})
        handle = ctypes.c_void_p()
        _lib.check(_lib.lib().dcp_stager_create(ctypes.byref(options),
                                                ctypes.byref(handle)))
        return handle

    @property
    def copy_on_write_bytes(self) -> int:
        """Bytes staged by copy-on-write snapshots so far, THREAD and
        PROCESS async_saves with this stager: copied after staging
        completed (0 without ``copy_on_write`` or userfaultfd)."""
        out = ctypes.c_size_t()
        with self._use() as handle:
            _lib.check(_lib.lib().dcp_stager_copy_on_write_bytes(
                handle, ctypes.byref(out)))
        with self._counter_lock:
            return out.value + self._process_copied_on_write

    def _count_copied_on_write(self, nbytes: int) -> None:
        with self._counter_lock:
            self._process_copied_on_write += nbytes

    def reserve(self, state_dict, async_checkpointer_type=None):
        """Makes the staging memory a save of ``state_dict`` will use
        (mapped, faulted in), so that the first async_save with this stager
        blocks no longer than later ones. Reads only the tensors' sizes and
        places. Blocks until the memory is ready.

        ``async_checkpointer_type=AsyncCheckpointerType.PROCESS``: prepares
        what the first PROCESS async_save needs instead (its shared-memory
        segment, kept in the pool later PROCESS saves reuse, and the writer
        process, started and waited for); this stager's own memory is not
        made."""
        from .async_save import AsyncCheckpointerType
        if async_checkpointer_type is not None and AsyncCheckpointerType(
                async_checkpointer_type) is AsyncCheckpointerType.PROCESS:
            from . import _process_writer
            _process_writer.reserve(state_dict)
            return
        flat = _state.Flat(load=False, allow_pickle=True)
        flat.add(state_dict)
        sd = flat.build()
        try:
            with self._use() as handle:
                _lib.check(_lib.lib().dcp_stager_reserve(handle, sd))
        finally:
            _lib.lib().dcp_state_dict_free(sd)

    def stage(self, state_dict):
        """The seed's stage(): a copy of ``state_dict`` whose tensors live
        in host memory (torch tensors on the CPU, page-locked where
        ``use_pinned_memory`` and a GPU allows it; numpy arrays copied),
        every other value as it is. A Future of it where
        ``use_async_staging``, else the copy itself. async_save does not
        call this (the engine stages through ``reserve``'s memory); it is
        for code that stages by hand."""
        if self._closed:
            raise ValueError("this DefaultStager is closed")
        pin = self.config.use_pinned_memory
        if not self.config.use_async_staging:
            return _host_copy(state_dict, pin)
        from concurrent.futures import Future
        torch = _state.torch
        # The copies run on another thread, whose current streams are not
        # the caller's: they wait for the work queued on the caller's.
        events = []
        for device in _cuda_devices(state_dict, set()):
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(device))
            events.append((device, event))
        future = Future()

        def run():
            try:
                for device, event in events:
                    torch.cuda.current_stream(device).wait_event(event)
                future.set_result(_host_copy(state_dict, pin))
            except BaseException as e:
                future.set_exception(e)
        with self._lock:
            self._staging = [f for f in self._staging if not f.done()]
            self._staging.append(future)
        threading.Thread(target=run, name="dcp-stage", daemon=True).start()
        return future

    def synchronize_staging(self):
        """The seed's synchronize_staging(): waits for every stage() still
        copying (their copies are blocking, so a finished one is
        complete)."""
        from concurrent.futures import wait
        with self._lock:
            pending = list(self._staging)
        wait(pending)

    def close(self):
        """Releases the stager: later uses raise ValueError. A call using
        it now (a save before the engine took its own reference, a
        reserve) keeps it until that call returns; saves still staging
        through it keep it until their uploads end. Idempotent; any
        thread."""
        with self._lock:
            self._closed = True
            handles = self._take_handles() if self._users == 0 else ()
        self._free(handles)

    def _take_handles(self):
        # Under self._lock.
        handles = (self._handle, self._copying)
        self._handle = self._copying = None
        return handles

    @staticmethod
    def _free(handles):
        for handle in handles:
            if handle is not None and _lib._lib is not None:
                _lib.lib().dcp_stager_free(handle)

    @contextlib.contextmanager
    def _use(self, tensors=()):
        """The C stager for a save of `tensors` (with copy_on_write, one
        that copies instead when a CPU tensor among them is pinned), not
        freed by close() until the block exits. Raises ValueError when
        closed."""
        with self._lock:
            if self._closed:
                raise ValueError("this DefaultStager is closed")
            if not self.config.copy_on_write or not any(
                    _pinned(t) for t in tensors):
                handle = self._handle
            else:
                if self._copying is None:
                    self._copying = self._create(dataclasses.replace(
                        self.config, copy_on_write=False))
                handle = self._copying
            self._users += 1
        try:
            yield handle
        finally:
            with self._lock:
                self._users -= 1
                last = self._closed and self._users == 0
                handles = self._take_handles() if last else ()
            self._free(handles)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


_CHECKPOINTABLE = ("global_shape", "global_offsets", "local_offsets",
                   "local_sizes")


def _host_copy(value, pin: bool):
    """`value` with every tensor copied into host memory (see stage)."""
    if isinstance(value, np.ndarray):
        return value.copy()
    torch = _state.torch
    if torch is not None and isinstance(value, torch.Tensor):
        if _state._is_dtensor(value):
            raise NotImplementedError(
                "stage() does not copy DTensors; async_save with "
                "async_stager=dcp.DefaultStager() (or none) stages them")
        pin = pin and torch.cuda.is_available()
        out = torch.empty(value.shape, dtype=value.dtype, device="cpu",
                          pin_memory=pin)
        out.copy_(value.detach())
        for name in _CHECKPOINTABLE:  # a CheckpointableTensor stays one
            if hasattr(value, name):
                setattr(out, name, getattr(value, name))
        return out
    if isinstance(value, _state.ShardedTensor):
        return _state.ShardedTensor(_host_copy(value.local, pin),
                                    value.global_shape, value.offsets)
    if isinstance(value, dict):
        out = copy.copy(value)  # keeps the mapping's type
        for k, v in value.items():
            out[k] = _host_copy(v, pin)
        return out
    if isinstance(value, list):
        out = copy.copy(value)  # keeps a list subclass
        out[:] = [_host_copy(v, pin) for v in value]
        return out
    if isinstance(value, tuple):
        return _tuple_like(value, [_host_copy(v, pin) for v in value])
    return value


def _tuple_like(value: tuple, items: list) -> tuple:
    """`items` in a tuple of `value`'s type (a namedtuple's fields; a plain
    tuple where the type cannot be built from a list)."""
    if hasattr(type(value), "_fields"):  # a namedtuple
        return type(value)(*items)
    try:
        return type(value)(items)
    except TypeError:
        return tuple(items)


def _cuda_devices(value, out: set) -> set:
    """The CUDA devices of the tensors in `value`."""
    torch = _state.torch
    if torch is not None and isinstance(value, torch.Tensor):
        if value.is_cuda:
            out.add(value.device)
    elif isinstance(value, _state.ShardedTensor):
        _cuda_devices(value.local, out)
    elif isinstance(value, dict):
        for v in value.values():
            _cuda_devices(v, out)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _cuda_devices(v, out)
    return out
