"""dcp checkpoint groups for Python jobs.

Once torch.distributed is initialized (init_process_group, under torchrun
or not) the checkpoint group needs no setup: the first distributed save or
load builds a dcp group over torch's own store (`_get_default_store()`,
torchrun's TCPStore or the FileStore of init_method=file://) through
dcp_process_group_create_from_store, with the ranks and world size of
torch's group, and caches it for the process. The group is dcp's own
(its own connections): it never runs a collective on the training group.
Until then, a save or load without a dcp.ProcessGroup runs in a single
process (the seed's rule), and warns when the environment names this
process one rank of several (RANK/WORLD_SIZE and the like).

A torch ProcessGroup passed as process_group gets its own dcp group over
the same store (keys prefixed with the torch group's name), ranks being the
ranks inside that group. A dcp.ProcessGroup (from_env / from_store) is used
as is.

Agreement before the engine: a rank whose Python work fails before the
engine call (a Stateful.state_dict() raising, an unsupported value) would
leave the others waiting in the engine's collectives until its timeout.
So a distributed save or load first meets at the store: each rank posts
whether it is ready, and if any rank failed every rank raises
CheckpointException listing the failed ranks. This costs a few store round
trips per save/load. A from_env group (no Python store) meets through the
engine (dcp_process_group_agree, one all-gather) for saves and loads; an
async_save there does not agree first: it would wait for the upload
before it.
"""

from __future__ import annotations

import ctypes
import datetime
import os
import sys
import threading
import traceback
import warnings
import weakref

from . import _lib, errors

__all__ = ["ProcessGroup"]

_DEFAULT_TIMEOUT = datetime.timedelta(minutes=5)


class _StoreBridge:
    """A torch.distributed.Store as a dcp_store_t. The callbacks run on dcp
    threads (with the GIL), never raise, and answer status codes."""

    def __init__(self, store):
        # A clone has its own connection: a dcp thread waiting in get()
        # never holds up the training loop's use of the same store.
        try:
            self.store = store.clone()
        except (AttributeError, RuntimeError):
            self.store = store
        self._set = _lib.STORE_SET_FN(self._on_set)
        self._get = _lib.STORE_GET_FN(self._on_get)
        self._remove = _lib.STORE_REMOVE_FN(self._on_remove)
        self.struct = _lib.sized(_lib.Store, user=None, set=self._set,
                                 get=self._get, remove=self._remove)

    def _on_set(self, user, key, value, size):
        try:
            self.store.set(key.decode(), ctypes.string_at(value, size)
                           if size else b"")
            return _lib.OK
        except BaseException:  # never let an exception into C
            return _lib.UNAVAILABLE

    def _on_get(self, user, key, timeout_ms, sink, sink_ctx):
        try:
            k = key.decode()
            if timeout_ms <= 0:
                if not self.store.check([k]):
                    return _lib.DEADLINE_EXCEEDED
            else:
                try:
                    self.store.wait(
                        [k], datetime.timedelta(milliseconds=timeout_ms))
                except RuntimeError as e:
                    if _timed_out(e):
                        return _lib.DEADLINE_EXCEEDED
                    raise
            value = self.store.get(k)
            sink(sink_ctx, value, len(value))
            return _lib.OK
        except BaseException:
            return _lib.UNAVAILABLE

    def _on_remove(self, user, key):
        try:
            self.store.delete_key(key.decode())
            return _lib.OK
        except BaseException:
            return _lib.UNAVAILABLE


def _check_timeout(where: str, timeout):
    """A group's `timeout` (None: dcp's default): TypeError unless a
    datetime.timedelta, ValueError unless positive; both name `where`'s
    argument as Python passes it."""
    if timeout is None:
        return None
    if not isinstance(timeout, datetime.timedelta):
        raise TypeError(
            f"{where}: timeout must be a datetime.timedelta or None, not "
            f"{type(timeout).__name__} ({timeout!r})")
    if timeout <= datetime.timedelta(0):
        raise ValueError(f"{where}(timeout={timeout!r}): timeout must be "
                         "positive")
    return timeout


def _check_name(where: str, argument: str, value):
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{where}: {argument} must be a str or None, not "
                        f"{type(value).__name__} ({value!r})")
    return value


def _group_options(backend, group_name, timeout, where="ProcessGroup"):
    timeout = _check_timeout(where, timeout)
    _check_name(where, "backend", backend)
    _check_name(where, "group_name", group_name)
    # Whole milliseconds, at least 1 (0 would mean the engine's default).
    ms = 0 if timeout is None else max(
        1, timeout // datetime.timedelta(milliseconds=1))
    return _lib.sized(
        _lib.ProcessGroupOptions,
        backend=backend.encode() if backend else None,
        group_name=group_name.encode() if group_name else None,
        timeout_ms=ms, connect_timeout_ms=ms)


_instances: dict[str, int] = {}
_instances_lock = threading.Lock()


def _timed_out(error: BaseException) -> bool:
    """Whether a torch store's wait() ended by its timeout."""
    import torch.distributed as dist
    if isinstance(error, dist.DistStoreError):
        return True
    # FileStore: RuntimeError("Wait timeout")
    return isinstance(error, RuntimeError) and "timeout" in str(error).lower()


class ProcessGroup:
    """A dcp checkpoint group (dcp_process_group_t): ranks that save and
    load together. Build one with from_store or from_env, or let save/load
    build one from torch.distributed."""

    def __init__(self, handle, rank, size, name, store=None, bridge=None,
                 keep=None, timeout=None):
        self._handle = handle
        self.rank = rank
        self.size = size
        self.name = name
        self.store = store
        self.timeout = timeout or _DEFAULT_TIMEOUT
        self._bridge = bridge  # the callbacks must outlive the group
        self._keep = keep
        self._seq = 0
        self._prev_failed = False
        with _instances_lock:
            self._instance = _instances.get(name, 0)
            _instances[name] = self._instance + 1
        self._finalizer = weakref.finalize(
            self, _free_group, handle.value, bridge)

    @classmethod
    def from_store(cls, store, rank: int, size: int, *, backend=None,
                   group_name: str | None = None, timeout=None):
        """A group of `size` ranks meeting through `store` (a
        torch.distributed.Store every rank shares). Blocks until all joined.
        """
        options = _group_options(backend, group_name, timeout,
                                 "ProcessGroup.from_store")
        bridge = _StoreBridge(store)
        handle = ctypes.c_void_p()
        _lib.check(_lib.lib().dcp_process_group_create_from_store(
            ctypes.byref(bridge.struct), rank, size, ctypes.byref(options),
            ctypes.byref(handle)), "creating the dcp checkpoint group")
        return cls(handle, rank, size, group_name or "dcp-checkpoint",
                   store=store, bridge=bridge, timeout=timeout)

    @classmethod
    def from_env(cls, *, backend=None, group_name: str | None = None,
                 timeout=None):
        """A group from the launcher's environment (RANK/WORLD_SIZE and
        DCP_RENDEZVOUS; see comm/rendezvous.h). Blocks until all joined."""
        options = _group_options(backend, group_name, timeout,
                                 "ProcessGroup.from_env")
        handle = ctypes.c_void_p()
        L = _lib.lib()
        _lib.check(L.dcp_process_group_create_from_env(
            ctypes.byref(options), ctypes.byref(handle)),
            "creating the dcp checkpoint group")
        rank, size = ctypes.c_int32(), ctypes.c_int32()
        _lib.check(L.dcp_process_group_rank(handle, ctypes.byref(rank)))
        _lib.check(L.dcp_process_group_size(handle, ctypes.byref(size)))
        return cls(handle, rank.value, size.value,
                   group_name or "dcp-checkpoint", timeout=timeout)

    def close(self) -> None:
        """Frees the group. Raises CheckpointException (FAILED_PRECONDITION)
        while a save still uses it (an async_save until its upload ends);
        the group then stays usable and is freed when collected."""
        if not self._finalizer.alive:
            return
        code = _lib.lib().dcp_process_group_free(self._handle)
        _lib.check(code, "closing the dcp checkpoint group")
        self._finalizer.detach()

    def __repr__(self):
        return (f"dcp.ProcessGroup(rank={self.rank}, size={self.size}, "
                f"name={self.name!r})")

    # -- agreement before the engine (see the module comment) ------------

    def agree(self, what: str, error: BaseException | None,
              in_engine_turn: bool = True) -> None:
        """Meets every rank; raises CheckpointException on every rank when
        any rank passed an error (the local error chained), else returns.
        A group without a Python store (from_env) meets through the engine
        (dcp_process_group_agree), in its turn after the operations
        submitted before: not with `in_engine_turn` False (an async_save,
        which must not wait for the upload before it), where a local error
        is raised on this rank alone."""
        if self.size == 1:
            if error is not None:
                raise error
            return
        if self.store is None:
            if in_engine_turn:
                self._agree_in_engine(what, error)
            elif error is not None:
                raise error
            return
        store, rank, size = self.store, self.rank, self.size
        seq = self._seq
        self._seq += 1
        prefix = f"dcp-py/{self.name}/{self._instance}/{seq}"
        if error is not None:
            store.set(f"{prefix}/err/{rank}",
                      f"{type(error).__name__}: {error}")
            store.set(f"{prefix}/code/{rank}", str(_code_of(error)))
            # Its built-in classes, which the class raised keeps.
            store.set(f"{prefix}/builtin/{rank}",
                      errors.builtin_names(error))
            store.add(f"{prefix}/nerr", 1)
        try:  # who came, to name who did not if they never do
            store.append(f"{prefix}/who", f"{rank},")
        except (RuntimeError, NotImplementedError, AttributeError):
            pass  # a store without append
        if store.add(f"{prefix}/arrive", 1) == size:
            store.set(f"{prefix}/go", b"1")
        try:
            store.wait([f"{prefix}/go"], self.timeout)
        except RuntimeError as e:
            if not _timed_out(e):
                raise
            self._raise_absent(what, prefix, error, e)
        failed = store.add(f"{prefix}/nerr", 0)
        if rank == 0 and seq > 0:
            # Every rank has passed the previous round's keys by now.
            self._delete_round(seq - 1, self._prev_failed)
        self._prev_failed = failed > 0
        if not failed:
            return
        failures = {}
        extra = {}  # rank -> its error's built-in classes
        for r in range(size):
            if r == rank and error is not None:
                failures[r] = (error, traceback.extract_tb(
                    error.__traceback__))
                extra[r] = errors.builtin_bases(error)
            elif store.check([f"{prefix}/err/{r}"]):
                msg = store.get(f"{prefix}/err/{r}").decode()
                code = int(store.get(f"{prefix}/code/{r}"))
                key = f"{prefix}/builtin/{r}"
                extra[r] = errors.builtins_named(
                    store.get(key)) if store.check([key]) else ()
                failures[r] = (errors.also_builtin(
                    errors.exception_class(code), extra[r])(msg, None, code),
                    traceback.StackSummary())
        first = min(failures)
        code = getattr(failures[first][0], "code", None)
        if not isinstance(code, int):
            code = _code_of(failures[first][0])
        msg = f"{what} failed on rank(s) {sorted(failures)}: " + "; ".join(
            f"rank {r}: {failures[r][0] if r != rank else _describe(error)}"
            for r in sorted(failures))
        exc = errors.also_builtin(errors.exception_class(code),
                                  extra[first])(msg, failures, code)
        if error is not None:
            raise exc from error
        raise exc

    def _raise_absent(self, what, prefix, error, cause) -> None:
        """Raises CheckpointTimeoutError naming the ranks that did not
        reach round `prefix` within the group's timeout."""
        try:
            key = f"{prefix}/who"
            # (check first: a store without append never set it, and its
            # get would wait out the timeout again)
            who = self.store.get(key).decode() if self.store.check(
                [key]) else ""
            came = {int(r) for r in who.split(",") if r}
            absent = [r for r in range(self.size) if r not in came] if \
                came else []
        except Exception:
            absent = []
        ranks = f"rank(s) {absent}" if absent else "some rank"
        msg = (f"{what}: {ranks} of the checkpoint group {self.name!r} "
               f"(size {self.size}) did not come within its timeout "
               f"({self.timeout}); rank {self.rank} waited for them (a "
               "rank that exited, hangs, or skipped this call)")
        failures = {r: (errors.CheckpointTimeoutError(
            f"rank {r} did not come", None, _lib.DEADLINE_EXCEEDED),
            traceback.StackSummary()) for r in absent}
        for r in range(self.size):  # and the errors of those who came
            try:
                if r == self.rank or r in failures or not self.store.check(
                        [f"{prefix}/err/{r}"]):
                    continue
                text = self.store.get(f"{prefix}/err/{r}").decode()
                code = int(self.store.get(f"{prefix}/code/{r}"))
            except Exception:
                continue
            failures[r] = (errors.exception_class(code)(text, None, code),
                           traceback.StackSummary())
        if error is not None:
            failures[self.rank] = (error, traceback.extract_tb(
                error.__traceback__))
        msg += "".join(
            f"; rank {r}: " + (_describe(error) if r == self.rank else
                               str(failures[r][0]))
            for r in sorted(failures) if r not in absent)
        exc = errors.CheckpointTimeoutError(msg, failures or None,
                                            _lib.DEADLINE_EXCEEDED)
        raise exc from (error if error is not None else cause)

    def _agree_in_engine(self, what, error) -> None:
        code, msg = _lib.OK, b""
        if error is not None:
            code = _code_of(error)
            msg = f"{type(error).__name__}: {error}".encode("utf-8",
                                                             "replace")
        rc = _lib.lib().dcp_process_group_agree(self._handle, what.encode(),
                                                code, msg)
        if rc == _lib.OK:
            return
        _, message, failures = _lib.last_error()
        # The class keeps the first failing rank's built-in classes (its
        # message starts with its Python class's name: TypeError: ...).
        first = min(failures, default=None)
        extra = () if first is None else \
            errors.builtin_bases(error) if first[0] == self.rank and \
            error is not None else errors.builtins_of_message(first[2])
        exc = errors.from_status(rc, message, failures, rank=self.rank,
                                 cls=errors.also_builtin(
                                     errors.exception_class(rc), extra))
        for r, (failure, stack) in list(exc.failures.items()):
            if r != self.rank and type(failure) is errors.exception_class(
                    failure.code):  # another rank's: keep its built-ins
                exc.failures[r] = (errors.also_builtin(
                    type(failure), errors.builtins_of_message(
                        failure.msg))(failure.msg, None, failure.code), stack)
        if error is None:
            raise exc
        # This rank's entry: its own exception, with its traceback.
        if exc.failures is not None:
            exc.failures[self.rank] = (error, traceback.extract_tb(
                error.__traceback__))
        raise exc from error

    def _delete_round(self, seq, failed) -> None:
        prefix = f"dcp-py/{self.name}/{self._instance}/{seq}"
        keys = [f"{prefix}/arrive", f"{prefix}/who", f"{prefix}/go",
                f"{prefix}/nerr"]
        if failed:
            for r in range(self.size):
                keys += [f"{prefix}/err/{r}", f"{prefix}/code/{r}",
                         f"{prefix}/builtin/{r}"]
        for k in keys:
            try:
                self.store.delete_key(k)
            except Exception:
                pass


def _describe(error):
    return f"{type(error).__name__}: {error}"


def _code_of(error) -> int:
    if isinstance(error, errors.CheckpointException):
        return error.code
    if isinstance(error, (TypeError, ValueError)):
        return _lib.INVALID_ARGUMENT
    return _lib.UNKNOWN


# Groups collected while the library still used them (it refuses to free
# them): freed by free_parked_groups, with their store callbacks kept alive
# until then.
_parked: list = []
_parked_lock = threading.Lock()


def _free_group(handle_value, bridge):
    L = _lib._lib
    if L is not None and handle_value and \
            L.dcp_process_group_free(handle_value) != _lib.OK:
        with _parked_lock:
            _parked.append((handle_value, bridge))


def free_parked_groups() -> None:
    """Frees the parked groups the library no longer uses (after an
    upload ends, and at exit)."""
    L = _lib._lib
    if L is None:
        return
    with _parked_lock:
        _parked[:] = [(h, b) for h, b in _parked
                      if L.dcp_process_group_free(h) != _lib.OK]


# One group per torch group, for the life of that group.
_cache: dict = {}
_cache_lock = threading.Lock()


def _torch_timeout(pg):
    """The timeout torch's group `pg` runs under (init_process_group's or
    new_group's `timeout=`, else torch's default for its backend), or None
    (dcp's default) when its backends do not say."""
    import torch
    for device in getattr(pg, "_device_types", None) or \
            [torch.device("cpu")]:
        try:
            timeout = pg._get_backend(device).options._timeout
        except Exception:  # a backend without options: ask the next
            continue
        if isinstance(timeout, datetime.timedelta) and \
                timeout > datetime.timedelta(0):
            return timeout
    return None


def _torch_group(pg):
    """The cached dcp group of torch ProcessGroup `pg` (None: the default
    group), or None when its world has one rank."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d
    default = c10d._get_default_group()
    pg = pg if pg is not None else default
    if pg is c10d.GroupMember.NON_GROUP_MEMBER:
        # What new_group returns to a rank it leaves out; torch's save and
        # load raise so for it.
        raise ValueError("Invalid process group specified: this rank is "
                         "not a member of the process_group passed")
    size = dist.get_world_size(pg)
    if size == 1:
        return None
    key = id(pg)
    with _cache_lock:
        entry = _cache.get(key)
        if entry is not None and entry[0] is pg:
            return entry[1]
        store = c10d._get_default_store()
        name = "dcp-checkpoint"
        if pg is not default:
            name = f"dcp-checkpoint-{pg.group_name}"
            store = dist.PrefixStore(f"dcp/{pg.group_name}", store)
        group = ProcessGroup.from_store(store, dist.get_rank(pg), size,
                                        group_name=name,
                                        timeout=_torch_timeout(pg))
        group._keep = pg
        _cache[key] = (pg, group)
        return group


class Resolved:
    """The group a save/load runs in: handle (None: single-process),
    group (dcp.ProcessGroup or None) and the no_dist flag."""

    __slots__ = ("group", "no_dist")

    def __init__(self, group, no_dist):
        self.group = group
        self.no_dist = no_dist

    @property
    def handle(self):
        return self.group._handle if self.group is not None else None

    @property
    def rank(self):
        return self.group.rank if self.group is not None else 0

    def agree(self, what, error, in_engine_turn=True):
        if self.group is None:
            if error is not None:
                raise error
            return
        self.group.agree(what, error, in_engine_turn)


class _Turns:
    """Turns on a group, Python's side of the engine's
    (engine/internal/group_turns.h): the saves, loads and async_saves that
    use one group run their agreement and their engine call one at a time,
    in the order they were called. Every rank calls in the same program
    order, so an upload still running on the dcp-upload thread (a custom
    async_stager's) and the caller's next save or load never meet each
    other's collectives on another rank."""

    def __init__(self):
        self._cond = threading.Condition()
        self._next = {}     # group -> the next turn's number
        self._serving = {}  # group -> the number that may run
        self._ended = {}    # group -> numbers ended before their turn

    def take(self, group):
        with self._cond:
            n = self._next.get(group, 0)
            self._next[group] = n + 1
            self._serving.setdefault(group, 0)
            return n

    def wait(self, group, n):
        with self._cond:
            self._cond.wait_for(lambda: self._serving[group] == n)

    def end(self, group, n):
        with self._cond:
            if self._serving[group] != n:
                self._ended.setdefault(group, set()).add(n)
                return
            serving = n + 1
            ended = self._ended.get(group, set())
            while serving in ended:
                ended.discard(serving)
                serving += 1
            if serving == self._next[group]:
                # No turn outstanding: forget the group.
                del self._next[group], self._serving[group]
                self._ended.pop(group, None)
            else:
                self._serving[group] = serving
            self._cond.notify_all()


_turns = _Turns()
_held = threading.local()  # .groups: the groups whose turn this thread has


class Turn:
    """One operation's turn on its group: taken when the operation is
    called (take_turn), waited for and held while it runs (`with turn:`),
    ended when the block exits (or by end(), for one that never runs).
    Without a group, or on a thread already holding a turn on the group
    (a save run inside an upload's turn), it never waits."""

    __slots__ = ("_group", "_n", "_done")

    def __init__(self, group):
        held = getattr(_held, "groups", ())
        self._group = group if group is not None and \
            group not in held else None
        self._n = _turns.take(self._group) if self._group is not None \
            else None
        self._done = False

    def __enter__(self):
        if self._group is not None:
            try:
                _turns.wait(self._group, self._n)
            except BaseException:  # KeyboardInterrupt: __exit__ won't run
                self.end()
                raise
            if not hasattr(_held, "groups"):
                _held.groups = set()
            _held.groups.add(self._group)
        return self

    def __exit__(self, *exc):
        if self._group is not None:
            _held.groups.discard(self._group)
        self.end()
        return False

    def end(self):
        if self._group is not None and not self._done:
            self._done = True
            _turns.end(self._group, self._n)


def take_turn(where: Resolved) -> Turn:
    """The next turn on `where`'s group (see Turn)."""
    return Turn(where.group)


# The launchers' rank and world size variables (comm/rendezvous.h), but
# SLURM's: an sbatch script's own single process sees SLURM_NTASKS > 1.
_LAUNCHER_VARIABLES = (("DCP_RANK", "DCP_WORLD_SIZE"), ("RANK", "WORLD_SIZE"),
                       ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"))


def _launched_ranks() -> list[str]:
    """`NAME=VALUE` of the launcher variables that say this process is one
    of several ranks (a world size over 1); [] when none does."""
    seen = []
    for rank, size in _LAUNCHER_VARIABLES:
        value = os.environ.get(size, "")
        if value.strip().isdigit() and int(value) > 1:
            seen += [f"{rank}={os.environ.get(rank, '')}", f"{size}={value}"]
    return seen


def _warn_single_process(seen) -> None:
    """Warns (once per calling line, Python's default filter) that a
    process the environment calls a rank of several saves or loads alone,
    as the seed warns when torch.distributed is not initialized."""
    # Attributed to the first frame outside this package: the caller's.
    here = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frame, level = sys._getframe(), 1
    while frame is not None and frame.f_code.co_filename.startswith(here):
        frame, level = frame.f_back, level + 1
    warnings.warn(
        f"dcp: {', '.join(seen)} are set, but torch.distributed is "
        "disabled, unavailable or uninitialized and no dcp.ProcessGroup "
        "was passed: assuming the intent is to save or load in a single "
        "process, so each rank writes or reads the checkpoint alone. To "
        "checkpoint together, call torch.distributed.init_process_group"
        "(...) first, or pass process_group=dcp.ProcessGroup.from_env(); "
        "no_dist=True silences this warning", UserWarning, stacklevel=level)


def resolve(process_group, no_dist: bool) -> Resolved:
    """The seed's rule: no_dist, or torch.distributed not initialized,
    means a single-process save/load. A torch `process_group` is then
    ignored (the seed's `no_dist = no_dist or not dist.is_initialized()`);
    a dcp.ProcessGroup needs no torch.distributed and is used unless
    no_dist. Without no_dist, a single process that the environment calls
    one rank of several (torchrun, dcp launch, mpirun) warns
    (_warn_single_process)."""
    if isinstance(process_group, ProcessGroup):
        return Resolved(None if no_dist else process_group, no_dist)
    if no_dist:
        return Resolved(None, True)
    try:
        import torch.distributed as dist
        initialized = dist.is_available() and dist.is_initialized()
    except ImportError:
        initialized = False
    if not initialized:
        seen = _launched_ranks()
        if seen:
            _warn_single_process(seen)
        return Resolved(None, True)
    return Resolved(_torch_group(process_group), False)


def close_all() -> None:
    """Frees the cached groups (at exit, after dcp_shutdown)."""
    with _cache_lock:
        entries = list(_cache.values())
        _cache.clear()
    for _, group in entries:
        group.close()
