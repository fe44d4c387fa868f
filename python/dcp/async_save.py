"""async_save: the seed's asynchronous save.

THREAD (the default) is the engine's own: dcp_async_save stages the
tensors into host memory on dcp's threads and writes and commits in the
background. Its staging_completion resolves when the caller may change its
tensors again and upload_completion (to the committed Metadata) when the
checkpoint is committed; async_save returns the upload Future once staging
is done, or at once an AsyncSaveResponse of both when a DefaultStager
stages asynchronously (the seed's rule, see async_save). The caller's
tensors are kept referenced until staging is done.

PROCESS runs the upload in one persistent writer process (see
dcp._process_writer). A stager of the caller's (async_stager with a
stage() method) stages in the call or on its own threads; the upload then
runs on one dcp thread ("dcp-upload"), in call order.

Completions: dcp calls one static ctypes callback per completion on its
own thread; the callback only queues (token, status), and a Python daemon
thread ("dcp-completions") resolves the futures, frees the C handles and
runs the futures' done-callbacks, so user callbacks never run on (or
block) a dcp thread and never re-enter the library from its callback.
Every future of a save is resolved, and its done-callbacks run, on one of
dcp's threads (dcp-completions, dcp-upload, dcp-process-stager, the
writer process's reader): a done-callback that waits there for a dcp
future not yet done raises RuntimeError instead of blocking the thread
that may be the one to complete it (_DcpFuture).

Exit: every save still staging or uploading is finished, its futures
resolved and their done-callbacks run (saves those start included, up to
_EXIT_ROUNDS generations),
before the interpreter goes on to shut down thread pools and join threads
(threading's exit hook) and again from atexit; the PROCESS writer is
stopped after that. A save that fails then fails its futures, as it would
before exit; the exit status does not change.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import concurrent.futures.thread  # noqa: F401 - its exit hook before ours
import contextlib
import ctypes
import enum
import itertools
import os
import queue
import signal
import sys
import threading
import traceback
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from . import _lib, _state, errors
from ._planner_hooks import set_up_save
from .checkpoint import (_absolute, _stateful_to_state_dict, prepare_save,
                         _wait_in_flight, register_in_flight, save)
from .metadata import Metadata
from .process_group import free_parked_groups, resolve, take_turn

__all__ = ["async_save", "AsyncCheckpointerType", "AsyncSaveResponse"]


class AsyncCheckpointerType(enum.Enum):
    THREAD = "thread"
    PROCESS = "process"


@dataclass
class AsyncSaveResponse:
    """staging_completion: Future[None], done when the state was copied out
    (the tensors may change again). upload_completion: Future[Metadata],
    done when the checkpoint is committed.

    async_save returns one when staging continues after the call (see
    async_save). It also behaves as the upload Future (result(), done(),
    exception(), add_done_callback(), cancel())."""

    staging_completion: Future
    upload_completion: Future

    def result(self, timeout=None):
        return self.upload_completion.result(timeout)

    def exception(self, timeout=None):
        return self.upload_completion.exception(timeout)

    def done(self) -> bool:
        return self.upload_completion.done()

    def add_done_callback(self, fn) -> None:
        self.upload_completion.add_done_callback(fn)

    def cancel(self) -> bool:
        return self.upload_completion.cancel()

    def cancelled(self) -> bool:
        return self.upload_completion.cancelled()

    def running(self) -> bool:
        return self.upload_completion.running()


# -- dcp's threads and futures ----------------------------------------------

# Set on the threads that resolve dcp's futures and run their done-callbacks
# (dcp-completions, dcp-upload, dcp-process-stager, the writer's reader).
_resolver = threading.local()

# The futures exit waits for (see _DcpFuture.track); replaced in a child of
# fork(2), whose copies of the parent's are never resolved.
_unfinished: set = set()
_unfinished_cond = threading.Condition()


class _DcpFuture(Future):
    """A Future resolved on one of dcp's threads, which also runs its
    done-callbacks: a callback that waits there (result(), exception()) for
    a dcp future not yet done could wait for the very thread it blocks, so
    that raises RuntimeError instead. A tracked future (track()) holds the
    interpreter's exit until it is resolved (or cancelled) and its
    done-callbacks have run."""

    def result(self, timeout=None):
        self._check_wait()
        try:
            return super().result(timeout)
        finally:
            _saw(self)

    def exception(self, timeout=None):
        self._check_wait()
        try:
            return super().exception(timeout)
        finally:
            _saw(self)

    def _check_wait(self):
        if getattr(_resolver, "active", False) and not self.done():
            raise RuntimeError(
                "waiting for a dcp async_save future from a done-callback "
                "of another would block the thread that completes them; "
                "wait from your own thread")

    # The seed's upload Future of a save staged in the call is also its own
    # upload_completion: a property, not an attribute pointing at itself,
    # which would make a cycle that keeps the future and its Metadata (and
    # the C metadata it holds: ~800 bytes an item) until a full garbage
    # collection, which a process with torch loaded seldom runs.
    _is_upload = False

    @property
    def upload_completion(self):
        if self._is_upload:
            return self
        raise AttributeError(
            f"{type(self).__name__!r} object has no attribute "
            "'upload_completion'")

    def track(self):
        """Call before the future is handed to the thread resolving it."""
        with _unfinished_cond:
            if not self.done():
                _unfinished.add(self)
                self._tracked = True

    _tracked = False

    def set_result(self, result):
        try:
            super().set_result(result)
        finally:
            self._untrack()

    def set_exception(self, exception):
        try:
            super().set_exception(exception)
        finally:
            if self._tracked:
                _note_failure(self, exception)
            self._untrack()

    def cancel(self):
        cancelled = super().cancel()
        if cancelled:
            self._untrack()
        return cancelled

    def _untrack(self):
        with _unfinished_cond:
            if self in _unfinished:
                _unfinished.discard(self)
                _unfinished_cond.notify_all()


def _wait_result(future):
    """future.result() on a dcp thread that is allowed to wait for it (it
    does not resolve it)."""
    concurrent.futures.wait([future])
    return Future.result(future)


class _SerialWorker:
    """Runs submitted calls one at a time, in submission order, on one
    daemon thread of dcp's (started on first use). Not a
    ThreadPoolExecutor: the interpreter shuts those down as its exit
    begins (before atexit), and a save queued there would then fail to
    submit its next step. The futures it returns are tracked (exit waits
    for them). Thread-safe."""

    def __init__(self, name):
        self.name = name
        self._reset()

    def _reset(self):
        """Forgets the queue and the thread (a child of fork(2) has copies
        of the parent's calls, not its thread)."""
        self._queue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread = None

    def submit(self, fn, *args) -> Future:
        future = _DcpFuture()
        future.track()
        try:
            with self._lock:
                # (A thread that died, a done-callback's SystemExit say, is
                # replaced: the calls queued behind it still run.)
                if self._thread is None or not self._thread.is_alive():
                    thread = threading.Thread(target=self._run,
                                              name=self.name, daemon=True)
                    # Before start(): a Ctrl-C in start() after the thread
                    # began must not let the next submit start a second.
                    self._thread = thread
                    thread.start()
        except BaseException as e:  # never leave the future unresolved
            future.set_exception(e)
            raise
        self._queue.put((future, fn, args))
        return future

    def is_current(self) -> bool:
        return threading.current_thread() is self._thread

    def drain(self) -> None:
        """Waits until every call submitted so far has run (returns at once
        on the worker's own thread)."""
        if self._thread is not None and not self.is_current():
            concurrent.futures.wait([self.submit(lambda: None)])

    def _run(self):
        _resolver.active = True
        while True:
            future, fn, args = self._queue.get()
            if future.set_running_or_notify_cancel():
                # What the call held is dropped before its future resolves:
                # exit waits for the future, and a torch tensor freed on a
                # daemon thread as the interpreter finalizes aborts it.
                try:
                    result = fn(*args)
                except BaseException as e:
                    fn = args = None
                    outcome = (future.set_exception, e)
                else:
                    fn = args = None
                    outcome = (future.set_result, result)
                    result = None
                try:
                    # Runs the done-callbacks: one raising SystemExit (or
                    # anything concurrent.futures does not catch) must not
                    # end this thread with calls still queued behind it.
                    outcome[0](outcome[1])
                except BaseException:
                    traceback.print_exc()
                outcome = None
            future = fn = args = None  # not kept while idle


# -- completions ------------------------------------------------------------

_queue: "queue.SimpleQueue" = queue.SimpleQueue()
_tokens = itertools.count(1)
_pending: dict[int, tuple] = {}  # token -> (job, which)
_pending_lock = threading.Lock()
_thread: threading.Thread | None = None
_thread_lock = threading.Lock()


def _on_done(user, status):
    # Runs on a dcp thread (or the caller's, when already done). Keep it
    # minimal: no library calls, no user code.
    _queue.put((user, status))


_ON_DONE = _lib.DONE_FN(_on_done)  # lives as long as the module


def _completion_loop():
    _resolver.active = True
    while True:
        token, status = _queue.get()
        if token is None:
            return
        if isinstance(token, threading.Event):  # _quiesce's marker
            token.set()
            continue
        with _pending_lock:
            job, which = _pending.pop(token, (None, None))
        if job is not None:
            try:
                job.complete(which, status)
            except BaseException:  # keep the loop alive
                pass
        job = None  # not kept while idle


def _ensure_thread():
    global _thread
    with _thread_lock:
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_completion_loop,
                                       name="dcp-completions", daemon=True)
            _thread.start()


@contextlib.contextmanager
def _interrupts_deferred():
    """Holds back SIGINT (Ctrl-C) until the block exits, then delivers it to
    the handler there was: for steps that must not be cut in half, such as
    a started save and the registration of its completions, or a turn taken
    and handed to the upload that ends it. Python runs signal handlers on
    the main thread only; elsewhere, or where the SIGINT handler is not a
    Python callable (ignored, the default action, or set outside Python),
    the block runs as it is."""
    if threading.current_thread() is not threading.main_thread() or \
            not callable(signal.getsignal(signal.SIGINT)):
        yield
        return
    received = []
    try:
        previous = signal.signal(signal.SIGINT,
                                 lambda signum, frame: received.append(signum))
    except ValueError:  # not the main interpreter
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            signal.raise_signal(signal.SIGINT)


class _EngineJob:
    """One dcp_async_save: its handles, the borrowed tensors and futures."""

    def __init__(self, prepared, handle, keep_tensors=False, group=None,
                 rank=0):
        self.prepared = prepared
        self.handle = handle
        self.rank = rank  # this process's, in the save's group
        # The dcp.ProcessGroup the save runs in: its store callbacks must
        # outlive the upload, whatever the caller drops or closes.
        self.group = group
        self._lock = threading.Lock()
        self._waiters = 0  # wait_staged calls on the C handle
        # A copy-on-write stager reads the tensors' memory until the upload:
        # their storages too, should a tensor be given another one
        # (`param.data = ...`, `.to()` of a module) meanwhile.
        self.keep_tensors = keep_tensors
        self.storages = (_state.storages_of(prepared.flat.t_objs)
                         if keep_tensors else None)
        self.staging: Future = _DcpFuture()
        self.upload: Future = _DcpFuture()
        self.remaining = 2
        self._staging_token = None  # set by register()
        self.staging.set_running_or_notify_cancel()
        self.upload.set_running_or_notify_cancel()

    def register(self):
        """Has dcp report both completions of the started save to the
        dcp-completions thread, which resolves the futures and, after the
        second, frees the handle and the prepared state dict."""
        L = _lib.lib()
        self.upload.track()
        for which in (_lib.STAGING, _lib.UPLOAD):
            token = next(_tokens)
            if which == _lib.STAGING:
                self._staging_token = token
            with _pending_lock:
                _pending[token] = (self, which)
            code = L.dcp_async_save_on_done(self.handle, which, _ON_DONE,
                                            token)
            if code != _lib.OK:  # cannot happen for a live handle
                with _pending_lock:
                    _pending.pop(token, None)
                self.upload._untrack()  # never resolved: exit must not wait
                _lib.check(code)

    def _error(self, which, status):
        # dcp_async_save_wait records the completion's error as this
        # thread's last error.
        done = ctypes.c_int32()
        code = _lib.lib().dcp_async_save_wait(self.handle, which, 0,
                                              ctypes.byref(done))
        code = code or status
        _, message, failures = _lib.last_error()
        from .errors import CheckpointFileNotFoundError, from_status
        return from_status(code, message, failures, rank=self.rank,
                           not_found=CheckpointFileNotFoundError)

    def complete(self, which, status):
        future = self.staging if which == _lib.STAGING else self.upload
        try:
            if status != _lib.OK:
                future.set_exception(self._error(which, status))
            elif which == _lib.STAGING:
                future.set_result(None)
            else:
                md = ctypes.c_void_p()
                code = _lib.lib().dcp_async_save_metadata(self.handle,
                                                          ctypes.byref(md))
                if code == _lib.OK:
                    future.set_result(Metadata._from_handle(md))
                else:
                    future.set_exception(self._error(which, code))
        except BaseException as e:  # never leave the caller waiting
            if not future.done():
                future.set_exception(e)
        finally:
            # The engine holds its own copies once staged: drop the tensors.
            if which == _lib.STAGING and not self.keep_tensors:
                self.prepared.flat = None
            with self._lock:
                self.remaining -= 1
                last = self.remaining == 0 and self._waiters == 0
            if last:
                self._free()

    def _free(self):
        self.storages = None
        _lib.lib().dcp_async_save_free(self.handle)
        self.prepared.free()
        self.group = None
        free_parked_groups()

    def wait_staged(self):
        """Blocks until the engine has staged and the staging future is
        resolved (on this thread when the dcp-completions thread has not
        taken the completion yet: that thread may be this one, running a
        done-callback that started the save). The staging future has no
        done-callbacks of the caller's yet (async_save has not returned)."""
        with self._lock:
            if self.remaining == 0:
                return  # both completions done, the handle freed
            self._waiters += 1
        try:
            done = ctypes.c_int32()
            # In slices, so that a signal's Python handler (Ctrl-C) runs.
            while not done.value:
                code = _lib.lib().dcp_async_save_wait(
                    self.handle, _lib.STAGING, 100, ctypes.byref(done))
                if code != _lib.OK and not done.value:
                    _lib.check(code)  # the wait itself failed
            # Taken and resolved together: a Ctrl-C between would leave
            # the staging future unresolved and the handle never freed.
            with _interrupts_deferred():
                with _pending_lock:  # done: `code` is the staging's status
                    mine = _pending.pop(self._staging_token, None) is not None
                if mine:
                    self.complete(_lib.STAGING, code)
            if not mine and threading.current_thread() is not _thread:
                concurrent.futures.wait([self.staging])  # being resolved
        finally:
            with self._lock:
                self._waiters -= 1
                last = self.remaining == 0 and self._waiters == 0
            if last:
                self._free()


def _engine_async_save(state_dict, *, process_group, no_dist, **kwargs):
    # Submitted in call order with the other operations on the group
    # (process_group.Turn); the engine orders the upload from there.
    with take_turn(resolve(process_group, no_dist)):
        return _engine_async_save_in_turn(
            state_dict, process_group=process_group, no_dist=no_dist,
            **kwargs)


def _engine_async_save_in_turn(state_dict, *, stager=None, **kwargs):
    # A DefaultStager closed meanwhile frees its C stager only once the
    # engine holds its own reference (dcp_async_save has returned).
    with contextlib.ExitStack() as leases:
        return _engine_async_save_leased(state_dict, stager=stager,
                                         leases=leases, **kwargs)


def _engine_async_save_leased(state_dict, *, checkpoint_id, storage_writer,
                              planner, process_group, no_dist,
                              use_collectives, allow_pickle, stager, leases):
    where = resolve(process_group, no_dist)
    p = None
    error = None
    try:
        sd = set_up_save(planner, _stateful_to_state_dict(state_dict),
                         checkpoint_id=checkpoint_id,
                         storage_writer=storage_writer,
                         is_coordinator=where.rank == 0)
        flat = _state.Flat(load=False, allow_pickle=allow_pickle)
        flat.add(sd)
        if stager is not None and stager.config.copy_on_write:
            flat.copy_pinned()  # Copied now, as the PROCESS writer does.
        p = prepare_save(sd, checkpoint_id=checkpoint_id,
                         storage_writer=storage_writer, planner=planner,
                         where=where, coordinator_rank=0,
                         use_collectives=use_collectives,
                         allow_pickle=allow_pickle, flat=flat)
        if stager is not None:  # Before the ranks agree: a closed one fails.
            p.options.async_stager = leases.enter_context(
                stager._use(p.flat.t_objs))
    except BaseException as e:
        error = e
        if p is not None:
            p.free()
    try:
        where.agree("async_save", error, in_engine_turn=False)
    except BaseException:
        # Another rank failed: nothing of this rank's will run.
        if error is None:
            p.free()
        raise
    L = _lib.lib()
    # Everything the completions need exists before the save starts. Once
    # dcp_async_save has written the handle the save runs on, and owns `p`
    # until its completions: whatever is raised after that (Ctrl-C as the
    # call returns included) still registers them, so the futures resolve
    # and the handle and `p` are freed when the upload ends.
    handle = ctypes.c_void_p()
    try:
        job = _EngineJob(p, handle, keep_tensors=stager is not None and
                         stager.config.copy_on_write, group=where.group,
                         rank=where.rank)
        _ensure_thread()
        with _interrupts_deferred():
            try:
                code = L.dcp_async_save(p.sd, ctypes.byref(p.options),
                                        ctypes.byref(handle))
            finally:
                if handle.value:
                    job.register()
        _lib.check(code)
    except BaseException:
        if not handle.value:
            p.free()
        raise
    response = AsyncSaveResponse(job.staging, job.upload)
    response._wait_staged = job.wait_staged
    return response


# Uploads after a custom async_stager: one at a time, in call order.
_uploader = _SerialWorker("dcp-upload")


_submit_lock = threading.Lock()  # Turns in the order uploads are queued.


def _stager_async_save(state_dict, async_stager, upload_fn, where):
    try:
        staged = async_stager.stage(_stateful_to_state_dict(state_dict))
    except BaseException as error:  # the seed: a failed Future, not a raise
        # Shaped as an in-call save's return: the upload Future carrying
        # both completions, each failed with the stager's exception.
        failure: Future = _DcpFuture()
        failure.set_exception(error)
        staging_failure: Future = _DcpFuture()
        staging_failure.set_exception(error)
        failure.staging_completion = staging_failure
        failure._is_upload = True  # its own upload_completion
        return failure
    staging: Future = _DcpFuture()
    if isinstance(staged, Future):
        # Exit waits for it too: its done-callbacks may run after the
        # upload (which waits for `staged` only) has finished.
        staging.track()

        def complete(f):
            try:
                f.result()
                staging.set_result(None)
            except BaseException as e:
                staging.set_exception(e)
        staged.add_done_callback(complete)
    else:
        staging.set_result(None)

    turn = None  # Taken when the upload is queued (below).

    def upload():
        with turn:
            sd = staged.result() if isinstance(staged, Future) else staged
            return upload_fn(sd)

    # A staged dict (not a Future) may still be filling from non-blocking
    # device copies: synchronize before the upload reads it.
    if not isinstance(staged, Future) and bool(
            getattr(async_stager, "should_synchronize_after_execute", True)):
        sync = getattr(async_stager, "synchronize_staging", None)
        if callable(sync):
            sync()
    # The upload runs on the dcp-upload thread in a turn taken as it is
    # queued: a save or load called after this one waits for it.
    # A turn taken is ended by the upload, or here if it is not queued;
    # Ctrl-C between the two would leave it held (every later operation on
    # the group then waits for it) or end one the upload still waits for.
    with _submit_lock, _interrupts_deferred():
        turn = take_turn(where)
        try:
            result = _uploader.submit(upload)
        except BaseException:
            turn.end()
            raise
        # A cancelled upload never runs: its turn ends with it.
        result.add_done_callback(lambda f: f.cancelled() and turn.end())
    lease = getattr(async_stager, "_lease", None)
    if callable(lease):  # a stager reusing its copy waits for this upload
        lease(result)
    response = AsyncSaveResponse(staging, result)
    # The seed: a stager that staged in the call gives the upload Future.
    return _staged_in_call(response) if not isinstance(staged, Future) \
        else response


def _staged_in_call(response: AsyncSaveResponse) -> Future:
    """The seed's return for a save whose staging ended in the call: the
    upload Future, once staging is done and staging_completion resolved
    (waited for here when it is not yet). It also carries
    `staging_completion` and `upload_completion` (itself), as an
    AsyncSaveResponse would. For the engine's saves the wait is for the
    engine's own staging completion (_EngineJob.wait_staged), which works
    on the dcp-completions thread too (a done-callback starting a save)."""
    wait_staged = getattr(response, "_wait_staged", None)
    if wait_staged is not None:
        wait_staged()
    else:  # PROCESS, a custom stager: resolved on threads of their own
        concurrent.futures.wait([response.staging_completion])
    upload = response.upload_completion
    upload.staging_completion = response.staging_completion
    if isinstance(upload, _DcpFuture):
        upload._is_upload = True  # its own upload_completion
    else:  # (not one of dcp's: an attribute, whatever it costs)
        upload.upload_completion = upload
    return upload


def async_save(state_dict, *, checkpoint_id=None, storage_writer=None,
               planner=None, process_group=None,
               async_checkpointer_type: AsyncCheckpointerType =
               AsyncCheckpointerType.THREAD, async_stager=None,
               no_dist=False, use_collectives=True, allow_pickle=False):
    """Stages `state_dict` and writes the checkpoint in the background.

    What it returns follows the seed. Without async_stager, or with a
    dcp.DefaultStager whose StagingOptions.use_async_staging is False,
    staging ends in the call and the return is the upload Future
    (concurrent.futures.Future of the committed Metadata; it also carries
    staging_completion, done, and upload_completion, itself): the tensors
    may change as soon as it returns. With a dcp.DefaultStager staging
    asynchronously (the default StagingOptions) the call returns at once
    with an AsyncSaveResponse: do not change the tensors before its
    staging_completion is done.

    THREAD: the engine stages and uploads on its threads. PROCESS: staged
    into shared memory, written by a persistent writer process.
    async_stager may also be an object of the caller's with
    stage(state_dict), returning the staged state dict (the return is then
    the upload Future) or a Future of it (an AsyncSaveResponse); the staged
    dict is saved on a background thread (THREAD) or by the writer process
    (PROCESS); an exception from stage() fails the returned Future. Errors
    in the arguments or the state dict raise here; errors of the save
    itself fail the futures with CheckpointException.

    The futures resolve, and run their done-callbacks, on dcp's threads: a
    done-callback may start another async_save, but one that waits for a
    dcp future not yet done raises RuntimeError (it could wait for the
    thread it blocks). Saves still running at exit are finished first.
    """
    if not isinstance(async_checkpointer_type, AsyncCheckpointerType):
        async_checkpointer_type = AsyncCheckpointerType(
            async_checkpointer_type)
    # A relative directory is the one meant now, whatever the working
    # directory is when the upload runs.
    if checkpoint_id is not None:
        checkpoint_id = _absolute(errors.checked_path(checkpoint_id,
                                                      "checkpoint_id"))
    elif isinstance(getattr(storage_writer, "path", None),
                    (str, os.PathLike)) and os.fspath(storage_writer.path):
        checkpoint_id = _absolute(errors.checked_path(
            storage_writer.path, "storage_writer path"))
    kwargs = dict(checkpoint_id=checkpoint_id, storage_writer=storage_writer,
                  planner=planner, process_group=process_group,
                  no_dist=no_dist, use_collectives=use_collectives,
                  allow_pickle=allow_pickle)
    from .stager import DefaultStager
    engine_stager = None
    if isinstance(async_stager, DefaultStager):
        # The engine's stager: THREAD stages through it; PROCESS stages
        # into the writer process's shared memory instead.
        engine_stager, async_stager = async_stager, None
    # Each lane uploads in call order; an upload of another lane into the
    # same directory is waited for here, or it could commit after this one
    # (replacing the newer checkpoint) or hold the lock this one needs.
    lane = ("stager" if async_stager is not None else "process"
            if async_checkpointer_type is AsyncCheckpointerType.PROCESS
            else "engine")
    _wait_in_flight(checkpoint_id, lane)
    if async_stager is not None:  # a stager of the caller's
        if async_checkpointer_type is AsyncCheckpointerType.PROCESS:
            from . import _process_writer
            # On the dcp-upload thread, which does not resolve it.
            upload = (lambda sd: _wait_result(_process_writer.async_save(
                sd, **kwargs).upload_completion))
        else:
            upload = (lambda sd: save(sd, **kwargs))
        returned = _stager_async_save(state_dict, async_stager, upload,
                                      resolve(process_group, no_dist))
        register_in_flight(checkpoint_id, returned.upload_completion,
                           returned.staging_completion, lane)
        return returned
    # The seed stages in the call unless a stager stages asynchronously.
    in_call = engine_stager is None or \
        not engine_stager.config.use_async_staging
    if async_checkpointer_type is AsyncCheckpointerType.PROCESS:
        from . import _process_writer
        cow = engine_stager is not None and engine_stager.config.copy_on_write
        response = _process_writer.async_save(
            state_dict, copy_on_write=cow, count_copied=(
                engine_stager._count_copied_on_write if cow else None),
            **kwargs)
    else:
        response = _engine_async_save(state_dict, stager=engine_stager,
                                      **kwargs)
    register_in_flight(checkpoint_id, response.upload_completion,
                       lane=lane)
    return _staged_in_call(response) if in_call else response


def _finish_saves():
    """Waits for every save of this process still running: the engine's
    uploads (dcp_shutdown), then every tracked future, resolved and its
    done-callbacks run (a save one of them starts is tracked before the
    future that started it is done, so it is waited for too)."""
    L = _lib._lib
    if L is not None:
        L.dcp_shutdown()  # (from a fork child: fails, nothing to wait for)
    # Round by round: the saves running now, then those their done-callbacks
    # started, ... A thread that keeps starting saves would hold the exit
    # forever: after _EXIT_ROUNDS rounds the rest are left, said on stderr.
    with _unfinished_cond:
        try:
            for _ in range(_EXIT_ROUNDS):
                if not _unfinished:
                    return
                running = set(_unfinished)
                _unfinished_cond.wait_for(
                    lambda: not (running & _unfinished))
        finally:
            _report_unseen_failures()
        if _unfinished:
            print(f"dcp: {len(_unfinished)} async save(s) still running at "
                  f"exit after {_EXIT_ROUNDS} rounds of waiting (saves "
                  "started while others finished) were not waited for",
                  file=sys.stderr)


def _note_failure(future, error) -> None:
    """Notes that tracked `future` failed with `error`, for exit to report
    unless a future carrying that error is looked at first (_saw). Keeps
    the message, not the future or the error (whose traceback holds the
    save's staged state); the error carries the note's number."""
    if getattr(error, "_dcp_seen", False):  # seen through another future
        return
    with _failed_lock:
        if len(_failed) >= _FAILED_KEPT:
            return
        token = getattr(error, "_dcp_failure", None)
        if token is None:
            token = next(_failure_numbers)
            try:
                error._dcp_failure = token
            except Exception:  # an exception type refusing attributes
                return
        _failed[token] = f"{type(error).__name__}: {error}"


def _saw(future) -> None:
    """result() or exception() of `future` was called (from a done-callback
    too): its failure, and that of every future sharing its error (a save's
    staging and upload futures, an upload wrapping a writer's), is seen."""
    if not future.done() or future.cancelled():
        return
    error = Future.exception(future, 0)
    if error is None:
        return
    try:
        error._dcp_seen = True  # for futures failing with it later
    except Exception:  # an exception type refusing attributes
        pass
    token = getattr(error, "_dcp_failure", None)
    if token is not None:
        with _failed_lock:
            _failed.pop(token, None)


def _report_unseen_failures() -> None:
    """At exit: says on stderr which failed async_saves no one looked at,
    so a program that ends without waiting for its last save learns that
    it was not written. One line per failure."""
    with _failed_lock:
        messages = list(_failed.values())
        _failed.clear()
    for message in messages:
        print(f"dcp: an async_save failed and nothing waited for it: "
              f"{message}", file=sys.stderr)


# The number of a failure (its error's _dcp_failure) -> its message, the
# first _FAILED_KEPT failures not yet seen (_note_failure).
_failed: dict = {}
_failure_numbers = itertools.count(1)
_failed_lock = threading.Lock()
_FAILED_KEPT = 64


# How many generations of saves exit waits for (see _finish_saves).
_EXIT_ROUNDS = 64


def _quiesce():
    """Returns once the dcp-completions and dcp-upload threads have finished
    what they were given and dropped it (the tensors of a save, its
    handles): they are daemon threads, and a torch tensor or C handle freed
    on one while the interpreter finalizes can abort the process."""
    thread = _thread
    if thread is not None and thread.is_alive():
        reached = threading.Event()
        _queue.put((reached, None))
        reached.wait()
    _uploader.drain()


def _at_exit():
    """atexit: saves started since the first pass (threading's exit hook,
    below) by threads still running then; then the writer process is
    stopped and dcp's threads left idle."""
    _finish_saves()
    writer = sys.modules.get(__package__ + "._process_writer")
    if writer is not None:
        writer.shutdown_writer()  # (its reader thread ends)
    _quiesce()
    free_parked_groups()


def _forget_after_fork():
    """In a child of fork(2): the completions, uploads and their threads
    stayed in the parent; the child's own saves start afresh (and fail in
    the library: it cannot be used in such a child)."""
    global _queue, _pending, _pending_lock, _thread, _thread_lock, \
        _submit_lock, _unfinished, _unfinished_cond, _failed, _failed_lock
    _failed = {}  # the parent's failures are the parent's to report
    _failed_lock = threading.Lock()
    _queue = queue.SimpleQueue()
    _pending = {}
    _pending_lock = threading.Lock()
    _thread = None
    _thread_lock = threading.Lock()
    _submit_lock = threading.Lock()
    _unfinished = set()
    _unfinished_cond = threading.Condition()
    _uploader._reset()


atexit.register(_at_exit)
# The first pass runs as exit begins, before concurrent.futures shuts its
# thread pools down (its hook is registered first, at the import above, and
# these run in reverse) and before threading joins the threads still
# running: a stager's Future may come from such a pool.
def _finish_saves_first():
    """_finish_saves from threading's exit hook: a Ctrl-C there must not
    cut threading's own shutdown short (the join of the program's
    non-daemon threads); atexit waits for the saves again."""
    try:
        _finish_saves()
    except KeyboardInterrupt:
        print("dcp: interrupted while waiting for async saves at exit; "
              "waiting for them once more after the program's threads",
              file=sys.stderr)


try:
    threading._register_atexit(_finish_saves_first)
except (AttributeError, RuntimeError):  # before 3.9; exit already begun
    pass
os.register_at_fork(after_in_child=_forget_after_fork)
