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
dcp._process_writer).

Completions: dcp calls one static ctypes callback per completion on its
own thread; the callback only queues (token, status), and a Python daemon
thread ("dcp-completions") resolves the futures, frees the C handles and
runs the futures' done-callbacks, so user callbacks never run on (or
block) a dcp thread and never re-enter the library from its callback.
Uploads still running at interpreter exit are waited for (dcp_shutdown,
from atexit).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import ctypes
import enum
import itertools
import queue
import signal
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from . import _lib, _state
from .checkpoint import _stateful_to_state_dict, prepare_save, save
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
    while True:
        token, status = _queue.get()
        if token is None:
            return
        with _pending_lock:
            job, which = _pending.pop(token, (None, None))
        if job is not None:
            try:
                job.complete(which, status)
            except BaseException:  # keep the loop alive
                pass


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


class _CompletionFuture(Future):
    """A Future resolved on the dcp-completions thread, which also runs its
    done-callbacks: a callback that waits there for a result not yet known
    would wait for itself, so that raises instead."""

    def result(self, timeout=None):
        self._check_wait()
        return super().result(timeout)

    def exception(self, timeout=None):
        self._check_wait()
        return super().exception(timeout)

    def _check_wait(self):
        if threading.current_thread() is _thread and not self.done():
            raise RuntimeError(
                "waiting for a dcp async_save future from a done-callback "
                "of another would block the thread that completes them; "
                "wait from your own thread")


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
        self.staging: Future = _CompletionFuture()
        self.upload: Future = _CompletionFuture()
        self.remaining = 2
        self.staging.set_running_or_notify_cancel()
        self.upload.set_running_or_notify_cancel()

    def register(self):
        """Has dcp report both completions of the started save to the
        dcp-completions thread, which resolves the futures and, after the
        second, frees the handle and the prepared state dict."""
        L = _lib.lib()
        for which in (_lib.STAGING, _lib.UPLOAD):
            token = next(_tokens)
            with _pending_lock:
                _pending[token] = (self, which)
            code = L.dcp_async_save_on_done(self.handle, which, _ON_DONE,
                                            token)
            if code != _lib.OK:  # cannot happen for a live handle
                with _pending_lock:
                    _pending.pop(token, None)
                _lib.check(code)

    def _error(self, which, status):
        # dcp_async_save_wait records the completion's error as this
        # thread's last error.
        done = ctypes.c_int32()
        code = _lib.lib().dcp_async_save_wait(self.handle, which, 0,
                                              ctypes.byref(done))
        code = code or status
        _, message, failures = _lib.last_error()
        from .errors import from_status
        return from_status(code, message, failures, rank=self.rank)

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
        """Blocks until the engine has staged (its own completion, not the
        staging future, which the dcp-completions thread resolves: this
        works on that thread too)."""
        with self._lock:
            if self.remaining == 0:
                return  # both completions done, the handle freed
            self._waiters += 1
        try:
            done = ctypes.c_int32()
            # In slices, so that a signal's Python handler (Ctrl-C) runs.
            while not done.value:
                _lib.lib().dcp_async_save_wait(self.handle, _lib.STAGING,
                                               100, ctypes.byref(done))
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


def _engine_async_save_in_turn(state_dict, *, checkpoint_id, storage_writer,
                               planner, process_group, no_dist,
                               use_collectives, allow_pickle, stager=None):
    where = resolve(process_group, no_dist)
    p = None
    error = None
    try:
        sd = _stateful_to_state_dict(state_dict)
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
            p.options.async_stager = stager._c_handle(p.flat.t_objs)
    except BaseException as e:
        error = e
        if p is not None:
            p.free()
    try:
        where.agree("async_save", error)
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
_upload_executor: concurrent.futures.ThreadPoolExecutor | None = None


_submit_lock = threading.Lock()  # Turns in the order uploads are queued.


def _stager_async_save(state_dict, async_stager, upload_fn, where):
    global _upload_executor
    try:
        staged = async_stager.stage(_stateful_to_state_dict(state_dict))
    except BaseException as error:  # the seed: a failed Future, not a raise
        failure: Future = Future()
        failure.set_exception(error)
        return failure
    staging: Future = Future()
    if isinstance(staged, Future):
        def complete(f):
            try:
                f.result()
                staging.set_result(None)
            except BaseException as e:
                staging.set_exception(e)
        staged.add_done_callback(complete)
    else:
        staging.set_result(None)
    with _thread_lock:
        if _upload_executor is None:
            _upload_executor = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="dcp-upload")

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
            result = _upload_executor.submit(upload)
        except BaseException:
            turn.end()
            raise
        # A cancelled upload never runs: its turn ends with it.
        result.add_done_callback(lambda f: f.cancelled() and turn.end())
    response = AsyncSaveResponse(staging, result)
    # The seed: a stager that staged in the call gives the upload Future.
    return _staged_in_call(response) if not isinstance(staged, Future) \
        else response


def _staged_in_call(response: AsyncSaveResponse) -> Future:
    """The seed's return for a save whose staging ended in the call: the
    upload Future, once staging is done (waited for here when it is not
    yet). It also carries `staging_completion` and `upload_completion`
    (itself), as an AsyncSaveResponse would. For the engine's saves the
    wait is for the engine's own staging completion: their
    staging_completion, which the dcp-completions thread resolves (it may
    be running a callback that waits for the caller), resolves just
    after."""
    wait_staged = getattr(response, "_wait_staged", None)
    if wait_staged is not None:
        wait_staged()
    else:  # PROCESS, a custom stager: resolved on threads of their own
        concurrent.futures.wait([response.staging_completion])
    upload = response.upload_completion
    upload.staging_completion = response.staging_completion
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
    """
    if not isinstance(async_checkpointer_type, AsyncCheckpointerType):
        async_checkpointer_type = AsyncCheckpointerType(
            async_checkpointer_type)
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
    if async_stager is not None:  # a stager of the caller's
        if async_checkpointer_type is AsyncCheckpointerType.PROCESS:
            from . import _process_writer
            upload = (lambda sd: _process_writer.async_save(sd, **kwargs)
                      .upload_completion.result())
        else:
            upload = (lambda sd: save(sd, **kwargs))
        return _stager_async_save(state_dict, async_stager, upload,
                                  resolve(process_group, no_dist))
    # The seed stages in the call unless a stager stages asynchronously.
    in_call = engine_stager is None or \
        not engine_stager.config.use_async_staging
    if async_checkpointer_type is AsyncCheckpointerType.PROCESS:
        from . import _process_writer
        response = _process_writer.async_save(
            state_dict, copy_on_write=engine_stager is not None and
            engine_stager.config.copy_on_write, **kwargs)
    else:
        response = _engine_async_save(state_dict, stager=engine_stager,
                                      **kwargs)
    return _staged_in_call(response) if in_call else response


def _at_exit():
    L = _lib._lib
    if L is not None:
        L.dcp_shutdown()  # waits for every upload; callbacks still run
        free_parked_groups()


atexit.register(_at_exit)
