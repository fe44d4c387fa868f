"""async_save(async_checkpointer_type=PROCESS): uploads in one persistent
writer process.

The writer is a fresh interpreter (`python -c`, like multiprocessing's
spawn start method but without re-running the caller's __main__, so
scripts without an `if __name__ == "__main__"` guard work) started by the
first PROCESS call once that call's tensors are staged (so that its
start-up does not slow the copies the caller waits for; reserve() starts
it ahead) and reused by every later one. It talks to this process
over a Unix socket pair with multiprocessing's Connection framing; the
writer reads the socket on a thread of its own while it writes, so a
staged save is handed over at once, never after the save being written.
Each call:

1. walks the state dict on the calling thread (dcp._state.Flat: validates
   and encodes the plain values, collects the tensors) and returns;
2. a staging thread ("dcp-process-stager") copies every tensor into a
   shared-memory segment (a memfd, one per in-flight save, reused between
   saves; its file descriptor goes to the writer once, with
   multiprocessing.reduction.send_handle), then resolves
   staging_completion. CUDA tensors are copied after the work queued on
   the caller's current stream at call time (an event);
3. the writer gets the flattened paths, encoded values and each tensor's
   (offset, dtype, shape) through the pipe - never tensor bytes - maps the
   segment, builds the C state dict over it and runs dcp_save;
4. its answer resolves upload_completion with the checkpoint's Metadata
   (read back from the committed checkpoint) or the save's exception.

If the writer dies, every save it had not finished fails with
CheckpointException naming the process (pid, exit code; for a writer that
could not start, the exception it reported), and the next call starts a
new writer. The writer ignores SIGINT: a Ctrl-C in the terminal reaches
the whole process group, and the parent decides when its writer ends (it
is stopped after the saves still running at exit, see
dcp.async_save._at_exit). `startup_seconds` holds the first writer's
start-up time (spawn to ready, logged on the "dcp" logger at INFO).

Distributed saves: each rank's writer joins a dcp group of its own over
torch's store (reconnected by address: TCPStore host/port or FileStore
path). A restarted writer on one rank cannot rejoin that group, so after
a writer death in a distributed job, restart every rank's writer (call
shutdown_writer() on every rank).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import multiprocessing.connection
import multiprocessing.reduction
import os
import socket
import subprocess
import sys
import threading
import time
import traceback
import weakref

import numpy as np

from . import _lib, _state, errors
from .async_save import (_DcpFuture, _interrupts_deferred, _resolver,
                         _SerialWorker)

log = logging.getLogger("dcp")

# Seconds from spawn to the first writer process's "ready" (None before).
startup_seconds: float | None = None

_ALIGN = 4096


def _round_up(n, a=_ALIGN):
    return (n + a - 1) // a * a


# -- shared-memory segments ---------------------------------------------------


class _Segment:
    """A memfd of `size` bytes mapped here. Raises CheckpointException
    (CheckpointResourceError, RESOURCE_EXHAUSTED, for ENOMEM/ENOSPC) when
    it cannot be made; nothing is left open then."""

    _ids = iter(range(1, 1 << 62))
    _live: "weakref.WeakSet[_Segment]" = weakref.WeakSet()

    def __init__(self, size):
        self.id = next(_Segment._ids)
        self.size = max(size, _ALIGN)
        self.mm = None
        self.fd = -1
        try:
            self.fd = os.memfd_create(f"dcp-stage-{self.id}",
                                      os.MFD_CLOEXEC)
            os.ftruncate(self.fd, self.size)
            self.mm = mmap.mmap(self.fd, self.size)
        except OSError as e:
            self.close()
            code = (_lib.RESOURCE_EXHAUSTED
                    if e.errno in (errno.ENOMEM, errno.ENOSPC)
                    else _lib.UNKNOWN)
            raise errors.exception_class(code)(
                f"could not map a {self.size}-byte shared-memory staging "
                f"segment for a PROCESS async_save: {e}", None, code) from e
        self.populated = False  # every page faulted in for writing
        self.idle = False  # in the pool, free for the next save
        _Segment._live.add(self)

    def close(self):
        """Unmaps and closes it here (again: no effect)."""
        if self.mm is not None:
            try:
                self.mm.close()
            except BufferError:  # a view is still alive; the GC unmaps it
                pass
            self.mm = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self):  # one dropped without close()
        try:
            self.close()
        except Exception:
            pass


class _Pool:
    """Segments by size; a segment serves one in-flight save at a time."""

    max_idle = 2

    def __init__(self):
        self._idle: list[_Segment] = []
        self._lock = threading.Lock()

    def acquire(self, nbytes) -> _Segment:
        with self._lock:
            fits = [s for s in self._idle if s.size >= nbytes]
            if fits:
                seg = min(fits, key=lambda s: s.size)
                self._idle.remove(seg)
                seg.idle = False
                return seg
        return _Segment(_round_up(nbytes))

    def release(self, seg) -> None:
        """Returns `seg` to the pool (again: no effect); a segment dropped
        from a full pool is unmapped here and in the live writer."""
        with self._lock:
            if seg is None or seg.idle:
                return
            seg.idle = True
            self._idle.append(seg)
            drop = []
            while len(self._idle) > self.max_idle:
                drop.append(min(self._idle, key=lambda s: s.size))
                self._idle.remove(drop[-1])
        writer = _writer
        for s in drop:
            if writer is not None:
                writer.forget(s)
            s.close()


_pool = _Pool()


# -- the writer process (child side) -------------------------------------------


# The writer's program (python -c; argv[1]: its end of the socket pair).
# SIGINT is ignored before anything else (see the module docstring); an
# import that fails in the fresh interpreter is reported to the parent
# ("failed", traceback), which names it in the errors of the saves.
_BOOTSTRAP = """\
import signal
signal.signal(signal.SIGINT, signal.SIG_IGN)
try:
    from dcp._process_writer import _child_entry
except BaseException:
    import multiprocessing.connection, sys, traceback
    multiprocessing.connection.Connection(int(sys.argv[1])).send(
        ("failed", traceback.format_exc()))
    raise
_child_entry()
"""


def _child_entry():
    """The writer process's main (argv[1]: its end of the socket pair)."""
    fd = int(sys.argv[1])
    os.set_inheritable(fd, False)  # not for processes a save may start
    conn = multiprocessing.connection.Connection(fd)
    try:
        import torch  # noqa: F401 - imported before "ready", not in a save
    except BaseException:
        conn.send(("failed", traceback.format_exc()))
        raise
    _child_main(conn)


def _receive(conn, inbox, released):
    """The writer's receiving thread: reads the parent's messages as they
    come, whatever the writer is doing, so that the parent's sends never
    wait for a save to end (a staged save is handed over while another is
    written), and queues them in order for the main thread; a segment's
    file descriptor is received and mapped here, right after its message.
    A ("go",) releases a held save (test hook). Ends with None once the
    socket closes (the messages read before it are still served)."""
    try:
        while True:
            msg = conn.recv()
            if msg[0] == "go":
                released.set()
                continue
            if msg[0] == "segment":
                _, seg_id, size = msg
                fd = multiprocessing.reduction.recv_handle(conn)
                try:
                    msg = ("segment", seg_id, mmap.mmap(fd, size))
                finally:
                    os.close(fd)
            inbox.put(msg)
    except (EOFError, OSError):
        pass
    finally:
        inbox.put(None)


def _child_main(conn):
    """Serves saves, in the order they were sent, until the socket closes
    or the parent says exit."""
    import queue

    from . import checkpoint, process_group
    from .checkpoint import prepare_save
    from .metadata import Metadata
    from .storage import HuggingFaceStorageWriter, MegaStorageWriter
    conn.send(("ready", os.getpid()))
    inbox = queue.SimpleQueue()
    released = threading.Event()
    threading.Thread(target=_receive, args=(conn, inbox, released),
                     name="dcp-writer-receive", daemon=True).start()
    segments = {}
    groups = {}
    while True:
        msg = inbox.get()
        if msg is None:
            return
        kind = msg[0]
        if kind == "segment":
            _, seg_id, mm = msg
            segments[seg_id] = mm
        elif kind == "forget":
            mm = segments.pop(msg[1], None)
            if mm is not None:
                try:
                    mm.close()
                except BufferError:
                    pass
        elif kind == "exit":
            return
        elif kind == "save":
            _, job_id, seg_id, manifest, spec, hold = msg
            msg = None
            conn.send(("begin", job_id))
            if hold:
                conn.send(("held", job_id))
                released.wait()  # a test kills the process here
                released.clear()
            try:
                where = _child_group(spec.pop("group"), groups,
                                     spec.pop("no_dist"), process_group)
                # Every rank's writer joins every save of the group, also
                # one whose staging failed on its rank (`failed`): the
                # ranks agree first, so each fails naming that rank
                # instead of waiting for it until the group's timeout.
                failed = spec.pop("failed", None)
                where.agree("async_save", None if failed is None else
                            errors.CheckpointException(*failed),
                            in_engine_turn=False)
                flat = _rebuild_flat(manifest, segments[seg_id])
                p = prepare_save(None, flat=flat, where=where,
                                 coordinator_rank=0, **spec)
                try:
                    md = checkpoint.run_save(p, where.rank)
                    # The metadata this save committed goes to the parent
                    # (the directory may hold another save's by the time
                    # it would read it back): a Hugging Face or MEGA
                    # directory's as plain values, dcp's encoded.
                    if isinstance(spec["storage_writer"],
                                  (HuggingFaceStorageWriter,
                                   MegaStorageWriter)):
                        sent = _plain_metadata(Metadata._from_handle(md))
                    else:
                        try:
                            sent = _encoded_metadata(md)
                        finally:
                            _lib.lib().dcp_metadata_free(md)
                finally:
                    p.free()
                del flat
                conn.send(("done", job_id, None, sent))
            except BaseException as e:  # report, keep serving
                if not isinstance(e, errors.CheckpointException):
                    e = errors.CheckpointException(
                        f"{type(e).__name__}: {e}", None, _lib.UNKNOWN)
                conn.send(("done", job_id, e, None))


def _encoded_metadata(handle) -> bytes:
    """The dcp_metadata_t `handle` as the bytes of a .metadata file."""
    L = _lib.lib()
    size = ctypes.c_size_t()
    _lib.check(L.dcp_metadata_encode(handle, None, 0, ctypes.byref(size)))
    buf = ctypes.create_string_buffer(size.value)
    _lib.check(L.dcp_metadata_encode(handle, buf, size.value,
                                     ctypes.byref(size)))
    return buf.raw[:size.value]


def _decoded_metadata(data: bytes, source: str):
    """The Metadata of bytes _encoded_metadata made."""
    from .metadata import Metadata
    handle = ctypes.c_void_p()
    _lib.check(_lib.lib().dcp_metadata_decode(
        data, len(data), _lib.encode_path(source), ctypes.byref(handle)))
    return Metadata._from_handle(handle)


def _plain_metadata(md):
    """Metadata(**result) rebuilds `md` without its C handle (picklable,
    for the parent)."""
    from .metadata import plain_fields
    return plain_fields(md)


def _rebuild_flat(manifest, mm):
    (keys, t_paths, t_specs, t_shards, v_paths, v_vals, t_grad,
     multi) = manifest
    import torch
    flat = _state.Flat(load=False, allow_pickle=True)
    flat._keys = keys
    flat.t_paths = t_paths
    flat.t_shards = t_shards
    flat.t_grad = t_grad
    flat._multi = multi
    flat.v_paths = v_paths
    flat.v_vals = v_vals
    objs = []
    for offset, nbytes, dtype_name, shape in t_specs:
        raw = torch.frombuffer(mm, dtype=torch.uint8, count=nbytes,
                               offset=offset) if nbytes else \
            torch.empty(0, dtype=torch.uint8)
        objs.append(raw.view(getattr(torch, dtype_name)).view(shape))
    flat.t_objs = objs
    return flat


def _child_group(spec, groups, no_dist, process_group):
    if spec is None:
        return process_group.Resolved(None, no_dist)
    name = spec["name"]
    key = (spec["kind"], spec["where"], spec["rank"], spec["size"], name)
    group = groups.get(key)
    if group is None:
        import datetime

        import torch.distributed as dist
        if spec["kind"] == "tcp":
            host, port = spec["where"]
            store = dist.TCPStore(host, port, is_master=False,
                                  wait_for_workers=False,
                                  timeout=datetime.timedelta(minutes=5))
        else:
            store = dist.FileStore(spec["where"], -1)
        store = dist.PrefixStore(f"dcp-async-writer/{name}", store)
        group = process_group.ProcessGroup.from_store(
            store, spec["rank"], spec["size"],
            group_name=f"dcp-async-writer-{name}", timeout=spec["timeout"])
        groups[key] = group
    return process_group.Resolved(group, False)


# -- the parent side -----------------------------------------------------------


class _Job:
    def __init__(self, path):
        self.path = path
        # Resolved on the stager thread or the writer's reader (failures
        # also on the thread that finds the writer dead).
        self.staging = _DcpFuture()
        self.upload = _DcpFuture()
        self.staging.set_running_or_notify_cancel()
        self.upload.set_running_or_notify_cancel()
        self.segment = None
        # What submit() sent, for a writer that dies before beginning it.
        self.sent = None
        self.begun = False  # the writer said it began writing it
        self.resent = False


class _Writer:
    """One writer process and the thread that reads its answers."""

    def __init__(self):
        global startup_seconds
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        # The child imports this very package, wherever it came from.
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (root, env.get("PYTHONPATH")) if p)
        self._start = time.perf_counter()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _BOOTSTRAP, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.conn = multiprocessing.connection.Connection(ours.detach())
        self.pid = self.proc.pid
        self.dead = False
        # The last line of the exception that kept it from starting, as it
        # reported it (None: it started, or died without saying why).
        self.startup_error: str | None = None
        self.started = False  # it said "ready"
        self.exit_code = None  # once dead
        self.jobs: dict[int, _Job] = {}
        self.known_segments: set[int] = set()
        self.lock = threading.Lock()  # sends, jobs, dead
        self.held = threading.Event()  # test hook
        self.ready = threading.Event()
        # Once dead: the saves it never began, which a new writer takes
        # over (single-process saves, each once), and the event set when
        # they are known.
        self.orphans: list[tuple[int, _Job]] = []
        self.settled = threading.Event()
        self.reader = threading.Thread(target=self._read,
                                       name="dcp-process-writer-reader",
                                       daemon=True)
        self.reader.start()

    def _read(self):
        """Serves the writer's answers until it goes; whatever ends this
        thread (an answer that cannot be read included) ends the writer
        and fails its jobs, so no caller waits forever."""
        _resolver.active = True  # the upload futures' callbacks run here
        try:
            self._serve()
        except BaseException:
            log.exception("dcp: lost the async writer process pid %d",
                          self.pid)
            self.proc.kill()
        finally:
            self._died()

    def _serve(self):
        global startup_seconds
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                return
            if msg[0] == "ready":
                seconds = time.perf_counter() - self._start
                if startup_seconds is None:
                    startup_seconds = seconds
                log.info("dcp: async writer process pid %d ready in %.2f s",
                         self.pid, seconds)
                self.started = True
                self.ready.set()
            elif msg[0] == "failed":  # its exit (EOF) comes next
                lines = msg[1].strip().splitlines()
                self.startup_error = lines[-1] if lines else "unknown"
            elif msg[0] == "begin":
                with self.lock:
                    job = self.jobs.get(msg[1])
                    if job is not None:
                        job.begun = True
                job = None
            elif msg[0] == "held":
                self.held.set()
            elif msg[0] == "done":
                _, job_id, error, metadata = msg
                with self.lock:
                    job = self.jobs.pop(job_id, None)
                if job is not None:
                    try:
                        self._finish(job, error, metadata)
                    except BaseException as e:
                        if not job.upload.done():
                            job.upload.set_exception(e)
                        raise
                msg = job = error = metadata = None  # not kept while idle

    def _finish(self, job, error, metadata=None):
        if job.segment is not None:
            _pool.release(job.segment)
        if job.upload.done():  # failed in staging (submit_failed)
            return
        if error is not None:
            job.upload.set_exception(error)
            return
        try:
            if isinstance(metadata, bytes):
                result = _decoded_metadata(metadata, job.path)
            else:
                from .metadata import Metadata
                result = Metadata(**metadata)
        except BaseException as e:
            job.upload.set_exception(e)
        else:
            job.upload.set_result(result)

    def _died(self):
        with self.lock:
            self.dead = True
            jobs = []
            for job_id, job in sorted(self.jobs.items()):
                # A save it never began is written by the next writer (a
                # distributed one is not: its group lives in this writer).
                if (not job.begun and not job.resent and
                        job.sent[1]["group"] is None):
                    self.orphans.append((job_id, job))
                else:
                    jobs.append(job)
            self.jobs.clear()
        try:
            self.exit_code = self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        self.settled.set()
        self.ready.set()  # wakes reserve(); it checks `dead`
        if self.orphans:
            try:
                # A new writer takes them over, unless a caller's did, or
                # shutdown_writer() came first.
                _live_writer(replacing=self)
            except Exception:
                log.exception("dcp: could not start a new async writer "
                              "process")
            self._fail_orphans("no new writer process took it")
        for job in jobs:
            if job.segment is not None:
                _pool.release(job.segment)
            if job.upload.done():  # failed in staging (submit_failed)
                continue
            lost = (f" before committing the checkpoint {job.path}"
                    if self.started else f"; {job.path} was not saved")
            job.upload.set_exception(errors.CheckpointException(
                f"{self.death()}{lost}; the next async_save starts a new "
                "one", None, _lib.UNAVAILABLE))

    def take_orphans(self) -> list:
        """The saves this dead writer never began, once (see _died)."""
        with self.lock:
            orphans, self.orphans = self.orphans, []
        return orphans

    def _fail_orphans(self, why):
        for _, job in self.take_orphans():
            _pool.release(job.segment)
            job.upload.set_exception(errors.CheckpointException(
                f"{self.death()} before beginning the checkpoint "
                f"{job.path}, and {why}; the next async_save starts a new "
                "one", None, _lib.UNAVAILABLE))

    def death(self) -> str:
        """How the (dead) writer ended, for an error message."""
        code = self.exit_code
        what = f"the dcp async writer process (pid {self.pid})"
        if self.startup_error is not None:
            return (f"{what} failed to start (exit code {code}): "
                    f"{self.startup_error}")
        if not self.started:
            return f"{what} died while starting (exit code {code})"
        return f"{what} died (exit code {code})"

    def forget(self, seg):
        with self.lock:
            if self.dead or seg.id not in self.known_segments:
                return
            self.known_segments.discard(seg.id)
            try:
                self.conn.send(("forget", seg.id))
            except OSError:
                pass

    def submit(self, job_id, job, manifest, spec, hold):
        """Sends a staged save; False when the writer is dead."""
        seg = job.segment

        def send():
            if seg.id not in self.known_segments:
                self.conn.send(("segment", seg.id, seg.size))
                multiprocessing.reduction.send_handle(self.conn, seg.fd,
                                                      self.pid)
                self.known_segments.add(seg.id)
            self.conn.send(("save", job_id, seg.id, manifest, spec, hold))

        return self._send(job_id, job, (manifest, spec, hold), send)

    def submit_failed(self, job_id, job, spec, error):
        """Has the writer join the group's save of `job`, whose staging
        failed here with `error` (its futures already say so), only to
        fail it on every rank (see the writer's "save"); False when the
        writer is dead."""
        message = str(error) if isinstance(error, errors.CheckpointException) \
            else f"{type(error).__name__}: {error}"
        failed = (message, None, getattr(error, "code", _lib.UNKNOWN))
        return self._send(job_id, job, (None, spec, False), lambda: (
            self.conn.send(("save", job_id, None, None,
                            dict(spec, failed=failed), False))))

    def _send(self, job_id, job, sent, send) -> bool:
        """Registers `job` as `job_id` and runs `send` (its messages to the
        writer), under the lock; False when the writer is dead or the
        socket fails (then the job is not registered)."""
        with self.lock:
            if self.dead:
                return False
            self.jobs[job_id] = job
            job.sent = sent
            try:
                send()
            except OSError:
                self.jobs.pop(job_id, None)
                return False
            except BaseException:  # not sent (e.g. cannot be pickled)
                self.jobs.pop(job_id, None)
                raise
        return True

    def stop(self):
        with self.lock:
            if not self.dead:
                try:
                    self.conn.send(("exit",))
                except OSError:
                    pass
        # Its queued saves finish first (the socket is served in order),
        # then their answers are read (their futures resolved, done-callbacks
        # run) before the reader ends.
        self.proc.wait()
        if threading.current_thread() is not self.reader:
            self.reader.join()


_writer: _Writer | None = None
_writer_lock = threading.Lock()
# Stages PROCESS saves and hands them to the writer, one at a time.
_stager = _SerialWorker("dcp-process-stager")
_job_ids = iter(range(1, 1 << 62))
_debug_hold_next = False  # test hook: the next save waits in the writer


def _running(writer) -> bool:
    return (writer is not None and not writer.dead and
            writer.proc.poll() is None)


def _live_writer(replacing=None) -> _Writer | None:
    """The running writer; a new one replaces a dead one, and is first
    given the saves the dead one never began (in their order, before
    any later save). With `replacing` (a dead writer): None unless that
    writer is still the current one."""
    global _writer
    old = _writer
    if (old is not None and not _running(old) and
            threading.current_thread() is not old.reader):
        # Exited: its reader meets the end of the socket now and sorts its
        # saves (waited for without the lock: its done-callbacks may take
        # it).
        old.settled.wait(60)
    with _writer_lock:
        if replacing is not None and _writer is not replacing:
            return None
        if not _running(_writer):
            old = _writer
            if old is not None and not old.started:
                log.warning("dcp: starting a new async writer process; %s",
                            old.death())
            _writer = _Writer()
            if old is not None:
                _resend(old, _writer)
        return _writer


def _resend(old, new) -> None:
    orphans = old.take_orphans()
    if orphans:
        log.warning("dcp: %s before beginning %d save(s); the new writer "
                    "process (pid %d) writes them", old.death(),
                    len(orphans), new.pid)
    for i, (job_id, job) in enumerate(orphans):
        job.resent = True
        manifest, spec, _ = job.sent
        try:
            sent = new.submit(job_id, job, manifest, spec, False)
        except Exception:
            sent = False
        if not sent:
            old.orphans = orphans[i:]
            old._fail_orphans(f"the new one (pid {new.pid}) could not take "
                              "it")
            return


def writer_pid() -> int | None:
    """The current writer process's pid (None before the first call)."""
    w = _writer
    return None if w is None or w.dead else w.pid


def shutdown_writer() -> None:
    """Stops the writer process after the saves handed to it, and those
    still staging, are done (their futures resolved). At exit it runs after
    every save still running (dcp.async_save._at_exit). The next PROCESS
    save starts a new writer."""
    global _writer
    _stager.drain()  # queued stages hand their saves over first
    with _writer_lock:
        w, _writer = _writer, None
    if w is not None:
        w.stop()


def _forget_after_fork() -> None:
    """In a child of fork(2): the writer, its socket, the staging thread
    and the segments belong to the parent; the child closes its copies of
    their file descriptors and mappings (so that neither a writer nor its
    memory outlives the parent because of the child) and starts its own."""
    global _writer, _writer_lock, _pool
    writer, _writer = _writer, None
    if writer is not None:
        try:
            writer.conn.close()
        except OSError:
            pass
    for seg in list(_Segment._live):
        try:
            seg.close()
        except OSError:
            pass
    _writer_lock = threading.Lock()
    _stager._reset()
    _pool = _Pool()


os.register_at_fork(after_in_child=_forget_after_fork)


def _group_spec(where):
    """How the writer reaches the store of `where`'s group (None: single
    process), and the group's name and timeout: each group of the caller
    (torch's default group, a torch subgroup, a group from_store) has
    writers' groups of its own, which take its timeout."""
    group = where.group
    if group is None:
        return None
    store = group.store
    if store is None:
        raise NotImplementedError(
            "async_save(PROCESS): the writer process cannot join a group "
            "made by ProcessGroup.from_env (it meets through the engine); "
            "use THREAD, or a group of torch.distributed or from_store")
    inner = getattr(store, "_underlying_non_prefix_store", store)
    if hasattr(inner, "host") and hasattr(inner, "port"):
        spec = ("tcp", (inner.host, inner.port))
    elif hasattr(inner, "path"):
        spec = ("file", inner.path)
    else:
        raise NotImplementedError(
            f"async_save(PROCESS): the writer cannot reach a "
            f"{type(inner).__name__}; use THREAD")
    return dict(kind=spec[0], where=spec[1], rank=group.rank,
                size=group.size, name=f"{group.name}/{group._instance}",
                timeout=group.timeout)


def _tensor_spec(t):
    if isinstance(t, np.ndarray):
        return t.nbytes, t.dtype.name, tuple(t.shape)
    return (t.numel() * t.element_size(), str(t.dtype).split(".")[-1],
            tuple(t.shape))


def _segment_bytes(tensors) -> tuple[list, int]:
    """Each tensor's (offset, nbytes, dtype name, shape) in a staging
    segment, and the segment's size."""
    specs = []
    offset = 0
    for t in tensors:
        nbytes, dtype_name, shape = _tensor_spec(t)
        specs.append((offset, nbytes, dtype_name, shape))
        offset += _round_up(nbytes, 64)
    return specs, offset


def _populate(seg) -> None:
    """Faults every page of `seg` in for writing, once, on several threads
    (dcp_populate_host): a first copy into a fresh segment would otherwise
    fault each page in on its copying thread, 2-5x slower on 2 cores."""
    if seg.populated:
        return
    base = ctypes.addressof(ctypes.c_char.from_buffer(seg.mm))
    _lib.check(_lib.lib().dcp_populate_host(base, seg.size))
    seg.populated = True


def reserve(state_dict, timeout=None) -> None:
    """What the first PROCESS async_save of `state_dict` (or of any state
    of that size) would otherwise do on its critical path, done now: a
    shared-memory segment of its size is mapped and every page faulted in
    (then kept in the pool that saves reuse), and the writer process is
    started and waited for (up to `timeout` seconds, None: as long as it
    takes). Reads only the tensors' sizes."""
    flat = _state.Flat(load=False, allow_pickle=True)
    flat.add(state_dict)
    _, total = _segment_bytes(flat.t_objs)
    writer = _live_writer()
    seg = _pool.acquire(total)
    try:
        _populate(seg)
    finally:
        _pool.release(seg)
    if writer.ready.wait(timeout) and writer.dead:
        raise errors.CheckpointException(
            f"{writer.death()}; the next async_save starts a new one", None,
            _lib.UNAVAILABLE)


def _copy_into(mm, offset, nbytes, t):
    import torch
    if nbytes == 0:
        return
    raw = torch.frombuffer(mm, dtype=torch.uint8, count=nbytes, offset=offset)
    if isinstance(t, np.ndarray):
        dst = raw.numpy().view(t.dtype).reshape(t.shape)
        np.copyto(dst, t)
    else:
        raw.view(t.dtype).view(t.shape).copy_(t)


# Host copies run in libdcp (dcp_copy_host: the stager's 8 MiB pieces and
# cache-bypassing stores over a pool of threads, no GIL held); this many
# threads (0: the library's default, the number of cores up to 8).
_COPY_THREADS = 0
_HOST_COPY = np.dtype([("dst", np.uint64), ("src", np.uint64),
                       ("bytes", np.uint64)])


def _host_source(t):
    """The address of `t`'s bytes when they are one contiguous run in host
    memory (dcp_copy_host can copy them), else None."""
    if isinstance(t, np.ndarray):
        return t.ctypes.data if t.flags.c_contiguous else None
    if (t.device.type != "cpu" or not t.is_contiguous() or t.is_conj() or
            t.is_neg()):
        return None
    return t.data_ptr()


def _stage_tensors(seg, specs, tensors, copy_on_write=False):
    """Copies `tensors` into `seg` at their specs' offsets: contiguous host
    tensors in one dcp_copy_host call (copy_on_write: one dcp_snapshot_host
    call, pinned tensors excepted, whose snapshot handle it returns; the
    caller waits for it and frees it); CUDA and strided ones through torch
    (a device-to-pageable copy returns once copied)."""
    import torch
    # The mapping's address (the temporary c_char's buffer export ends at
    # once; the job keeps the mapping open while this runs).
    base = ctypes.addressof(ctypes.c_char.from_buffer(seg.mm))
    copies = []
    pinned = []  # Copied even with copy_on_write (a device may DMA there).
    for (off, nbytes, _, _), t in zip(specs, tensors):
        if nbytes == 0:
            continue
        src = _host_source(t)
        if src is None:
            if not isinstance(t, np.ndarray) and t.is_cuda:
                with torch.cuda.device(t.get_device()):
                    _copy_into(seg.mm, off, nbytes, t)
            else:
                _copy_into(seg.mm, off, nbytes, t)
            continue
        if copy_on_write and not (isinstance(t, np.ndarray) or
                                  not t.is_pinned()):
            pinned.append((base + off, src, nbytes))
        else:
            copies.append((base + off, src, nbytes))
    if pinned:
        arr = np.array(pinned, dtype=_HOST_COPY)
        _lib.check(_lib.lib().dcp_copy_host(arr.ctypes.data, len(pinned),
                                            _COPY_THREADS))
    if not copies:
        return None
    arr = np.array(copies, dtype=_HOST_COPY)
    if not copy_on_write:
        _lib.check(_lib.lib().dcp_copy_host(arr.ctypes.data, len(copies),
                                            _COPY_THREADS))
        return None
    snapshot = ctypes.c_void_p()
    _lib.check(_lib.lib().dcp_snapshot_host(arr.ctypes.data, len(copies),
                                            _COPY_THREADS,
                                            ctypes.byref(snapshot)))
    return snapshot


def async_save(state_dict, *, process_group, no_dist, **kwargs):
    from .process_group import resolve, take_turn
    # Submitted in call order with the other operations on the group
    # (process_group.Turn).
    with take_turn(resolve(process_group, no_dist)):
        return _async_save_in_turn(state_dict, process_group=process_group,
                                   no_dist=no_dist, **kwargs)


def _async_save_in_turn(state_dict, *, checkpoint_id, storage_writer, planner,
                        process_group, no_dist, use_collectives, allow_pickle,
                        copy_on_write=False, count_copied=None):
    from .async_save import AsyncSaveResponse
    from .checkpoint import _checkpoint_path, _stateful_to_state_dict
    from ._planner_hooks import set_up_save
    from .planner import as_dcp_planner
    from .process_group import resolve
    from .storage import WRITERS, check_writer
    global _debug_hold_next
    where = resolve(process_group, no_dist)
    error = None
    try:
        check_writer(storage_writer)
        path = _checkpoint_path(checkpoint_id, storage_writer, "save")
        options_of = as_dcp_planner(planner, "save")  # validates
        flat = _state.Flat(load=False, allow_pickle=allow_pickle)
        flat.add(set_up_save(planner, _stateful_to_state_dict(state_dict),
                             checkpoint_id=checkpoint_id,
                             storage_writer=storage_writer,
                             is_coordinator=where.rank == 0))
        planner = options_of
        flat.check_tensors()  # here, not in the writer process
        specs, offset = _segment_bytes(flat.t_objs)
        group = _group_spec(where)
        # Whatever can fail runs before the ranks agree: a rank failing
        # after would leave the others' writers in a save it never joins.
        writer_spec = None
        if storage_writer is not None:
            # dcp's own class of the writer: a subclass's constructor may
            # take other arguments.
            writer_class = next(c for c in type(storage_writer).__mro__
                                if c in WRITERS)
            writer_spec = writer_class(**storage_writer._spec())
        from .planner import DefaultSavePlanner
        spec = dict(checkpoint_id=path, storage_writer=writer_spec,
                    planner=(DefaultSavePlanner(**planner._spec())
                             if planner is not None else None),
                    use_collectives=use_collectives,
                    allow_pickle=allow_pickle, no_dist=where.no_dist,
                    group=group)
        # CUDA tensors: staged after the work queued on the caller's
        # current stream of their device, as of this call.
        events = {}
        for t in flat.t_objs:
            if not isinstance(t, np.ndarray) and t.is_cuda:
                device = t.get_device()
                if device not in events:
                    import torch
                    _state.refuse_graph_capture([device])
                    events[device] = torch.cuda.Event()
                    events[device].record(torch.cuda.current_stream(device))
    except BaseException as e:
        error = e
    where.agree("async_save", error, in_engine_turn=False)
    total = offset
    manifest = (flat._keys, flat.t_paths, specs, flat.t_shards,
                flat.v_paths, flat.v_vals, flat.t_grad, flat._multi)
    tensors = flat.t_objs
    hold = _debug_hold_next
    _debug_hold_next = False
    job = _Job(path)
    with _writer_lock:  # None: started after staging (below)
        writer = _writer if _running(_writer) else None

    # A snapshot reads the tensors' memory until it has filled the segment:
    # keep their storages too, should a tensor be given another meanwhile.
    memory = _state.storages_of(tensors) if copy_on_write else None

    def copy_in():
        """Stages the tensors into a segment; (segment, snapshot or None),
        or None when it failed (the futures say why)."""
        import torch
        try:
            seg = _pool.acquire(total)
            job.segment = seg
            for device, event in events.items():
                torch.cuda.current_stream(device).wait_event(event)
            if not copy_on_write:  # (a snapshot fills it in the background)
                _populate(seg)
            snapshot = _stage_tensors(seg, specs, tensors, copy_on_write)
        except BaseException as e:
            if group is not None and \
                    isinstance(e, errors.CheckpointException) and \
                    not e.failures:
                # This rank's alone: named as such, as the engine's are.
                named = errors.from_status(e.code, str(e), rank=where.rank)
                named.__cause__ = e
                e = named
            job.staging.set_exception(e)
            job.upload.set_exception(e)
            if job.segment is not None:
                _pool.release(job.segment)
                job.segment = None
            return None
        job.staging.set_result(None)
        return seg, snapshot

    def hand_over(seg, snapshot):
        """Gives the staged segment to the writer process (after the
        snapshot, if any, has filled it)."""
        nonlocal writer, memory
        if snapshot is not None:
            # The tensors may change now; the segment fills from the
            # write-protected pages (this closure keeps them referenced).
            L = _lib.lib()
            try:
                copied = ctypes.c_size_t()
                _lib.check(L.dcp_host_snapshot_wait(snapshot,
                                                    ctypes.byref(copied)))
                if count_copied is not None:
                    count_copied(copied.value)
            except BaseException as e:
                _pool.release(seg)
                job.segment = None
                job.upload.set_exception(e)
                fail_in_group()
                return
            finally:
                L.dcp_host_snapshot_free(snapshot)
                memory = None
        job_id = next(_job_ids)
        error = None
        try:
            # A writer not running yet starts now, after the copies: its
            # start-up (an interpreter importing torch) does not compete
            # with them for the CPU while the caller waits for staging.
            if writer is None:
                writer = _live_writer()
            if not writer.submit(job_id, job, manifest, spec, hold):
                writer = _live_writer()
                if not writer.submit(job_id, job, manifest, spec, hold):
                    what = (writer.death() if writer.dead else
                            f"the dcp async writer process (pid "
                            f"{writer.pid}) is not reachable")
                    error = errors.CheckpointException(
                        f"{what}; {job.path} was not saved", None,
                        _lib.UNAVAILABLE)
        except Exception as e:
            if writer is None:  # the writer process cannot be started
                what = "could not start the dcp async writer process"
            else:
                what = (f"could not hand the save to the dcp async writer "
                        f"process (pid {writer.pid})")
            error = errors.CheckpointException(
                f"{what}: {type(e).__name__}: {e}; {job.path} was not saved",
                None, _lib.UNAVAILABLE)
        if error is not None:
            _pool.release(seg)
            job.upload.set_exception(error)

    def fail_in_group():
        """After this rank's staging failed (the futures say why): the
        other ranks' writers are told, in this rank's order of saves (on
        the stager thread, after the hand-overs queued before)."""
        if group is not None and group["size"] > 1:
            _fail_in_group(job, spec, job.upload.exception())

    def stage():
        try:
            staged = copy_in()
            if staged is None:
                fail_in_group()
            else:
                hand_over(*staged)
        except BaseException as e:  # never leave the caller waiting
            for future in (job.staging, job.upload):
                if not future.done():
                    future.set_exception(e)
            raise

    def hand_over_or_fail(seg, snapshot):
        try:
            hand_over(seg, snapshot)
        except BaseException as e:
            if not job.upload.done():
                job.upload.set_exception(e)
            raise

    # Exit waits for the upload (and so for the stages queued before it).
    # Tracked and queued together: a Ctrl-C between would leave a tracked
    # future nobody resolves, and the exit waiting for it.
    with _interrupts_deferred():
        return _queue_stage(job, copy_in, hand_over_or_fail, stage,
                            fail_in_group)


def _fail_in_group(job, spec, error) -> None:
    """A distributed save whose staging failed on this rank: this rank's
    writer joins the group's save to fail it on every rank, naming this
    rank (the other ranks' writers wait in it otherwise until the group's
    timeout). Best effort: a writer that cannot be reached leaves them to
    that timeout."""
    try:
        writer = _live_writer()
        if not writer.submit_failed(next(_job_ids), job, spec, error):
            _live_writer().submit_failed(next(_job_ids), job, spec, error)
    except Exception:
        log.warning("dcp: could not tell the other ranks' async writers "
                    "that staging failed here; they wait until the "
                    "group's timeout", exc_info=True)


def _queue_stage(job, copy_in, hand_over_or_fail, stage, fail_in_group):
    """async_save's hand-off of `job` to the stager thread (see there);
    returns its AsyncSaveResponse."""
    from .async_save import AsyncSaveResponse
    job.upload.track()
    try:
        if _stager.is_current():
            # Called from a done-callback of an earlier save's staging, on
            # the stager's one thread: queued behind itself the copy would
            # never run, so it runs here; the hand-over to the writer is
            # queued, after the earlier save's (uploads keep the call
            # order).
            staged = copy_in()
            if staged is not None:
                _stager.submit(hand_over_or_fail, *staged)
            else:
                _stager.submit(fail_in_group)
        else:
            _stager.submit(stage)
    except BaseException as e:  # the stager thread could not be started
        for future in (job.staging, job.upload):
            if not future.done():
                future.set_exception(e)
        raise
    return AsyncSaveResponse(job.staging, job.upload)
