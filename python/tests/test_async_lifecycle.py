"""async_save around the process's life: exit, Ctrl-C, fork(2), a writer
process that cannot start, and done-callbacks that wait on dcp's threads."""

import concurrent.futures
import errno
import importlib
import os
import signal
import subprocess
import sys
import threading

import pytest
import torch

import dcp
from dcp import _lib, _process_writer

engine = importlib.import_module("dcp.async_save")

WAIT = 120  # seconds; bounds a hang, never paces a test
PROCESS = dcp.AsyncCheckpointerType.PROCESS
THREAD = dcp.AsyncCheckpointerType.THREAD
PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _CopyStager:
    """A custom async_stager: stages by cloning, in the call."""

    def stage(self, sd):
        return {k: v.clone() if isinstance(v, torch.Tensor) else v
                for k, v in sd.items()}


def _check(ckpt, value):
    got = {"w": torch.zeros(1000)}
    dcp.load(got, checkpoint_id=str(ckpt))
    assert torch.equal(got["w"], torch.full((1000,), float(value))), ckpt


EXIT_SCRIPT = r"""
import os, sys
sys.path.insert(0, sys.argv[2])
import torch
import dcp
d = sys.argv[1]
P, T = dcp.AsyncCheckpointerType.PROCESS, dcp.AsyncCheckpointerType.THREAD

class Copy:
    def stage(self, sd):
        return {k: v.clone() for k, v in sd.items()}

def mark(name):
    # A done-callback: records the outcome it saw, in a file.
    def cb(f):
        e = f.exception()
        with open(os.path.join(d, "cb-" + name), "w") as out:
            out.write(type(e).__name__ if e is not None else "ok")
    return cb

def chain(f):  # a save started by a done-callback, at exit
    dcp.async_save({"w": torch.full((1000,), 9.0)},
                   checkpoint_id=os.path.join(d, "chained"),
                   async_checkpointer_type=P).add_done_callback(
                       mark("chained"))

dcp.save({"w": torch.zeros(1000)}, checkpoint_id=os.path.join(d, "taken"))
futs = {}
for i, kind in enumerate((P, P, P, T)):  # queued behind each other
    futs[f"custom{i}"] = dcp.async_save(
        {"w": torch.full((1000,), float(i))},
        checkpoint_id=os.path.join(d, f"custom{i}"), async_stager=Copy(),
        async_checkpointer_type=kind)
futs["thread"] = dcp.async_save({"w": torch.full((1000,), 7.0)},
                                checkpoint_id=os.path.join(d, "thread"))
futs["process"] = dcp.async_save({"w": torch.full((1000,), 8.0)},
                                 checkpoint_id=os.path.join(d, "process"),
                                 async_checkpointer_type=P)
for name, kind in (("fail_thread", T), ("fail_custom", P)):
    futs[name] = dcp.async_save(
        {"w": torch.ones(1000)}, async_checkpointer_type=kind,
        async_stager=Copy() if name == "fail_custom" else None,
        storage_writer=dcp.FileSystemWriter(os.path.join(d, "taken"),
                                            overwrite=False))
for name, f in futs.items():
    f.add_done_callback(mark(name))
futs["thread"].add_done_callback(chain)
# Exits at once: every save above is finished, and its callbacks run.
"""


def test_exit_finishes_every_save_and_runs_its_callbacks(tmp_path):
    """At exit: THREAD and PROCESS uploads still running and custom-stager
    uploads still queued (PROCESS ones included, whose staging thread the
    interpreter's exit must not have shut down) commit, done-callbacks of
    every kind run, a save a callback starts commits too, and a failed
    save fails its future as it would before exit (the exit status stays
    0, for THREAD and PROCESS alike)."""
    out = subprocess.run([sys.executable, "-c", EXIT_SCRIPT, str(tmp_path),
                          PYTHON_DIR], capture_output=True, text=True,
                         timeout=WAIT)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "Traceback" not in out.stderr, out.stderr[-4000:]
    for i in range(4):
        _check(tmp_path / f"custom{i}", i)
    _check(tmp_path / "thread", 7)
    _check(tmp_path / "process", 8)
    _check(tmp_path / "chained", 9)
    _check(tmp_path / "taken", 0)
    seen = {p.name[3:]: p.read_text() for p in tmp_path.glob("cb-*")}
    assert seen == {"custom0": "ok", "custom1": "ok", "custom2": "ok",
                    "custom3": "ok", "thread": "ok", "process": "ok",
                    "chained": "ok",
                    "fail_thread": "CheckpointExistsError",
                    "fail_custom": "CheckpointExistsError"}


SYSTEM_EXIT_SCRIPT = r"""
import os, sys
sys.path.insert(0, sys.argv[2])
import torch
import dcp
d = sys.argv[1]

class Copy:
    def stage(self, sd):
        return {k: v.clone() for k, v in sd.items()}

def leave(f):
    raise SystemExit(3)  # on dcp's upload thread

first = dcp.async_save({"w": torch.full((1000,), 1.0)},
                       checkpoint_id=os.path.join(d, "first"),
                       async_stager=Copy())
first.add_done_callback(leave)
first.result()
second = dcp.async_save({"w": torch.full((1000,), 2.0)},
                        checkpoint_id=os.path.join(d, "second"),
                        async_stager=Copy())
second.result()
print("second done")
"""


def test_a_done_callback_raising_system_exit_does_not_stop_later_saves(
        tmp_path):
    """A done-callback of a custom-stager save that raises SystemExit (on
    dcp's upload thread) is reported, and the saves queued after it still
    run: the thread is replaced, not lost with them."""
    out = subprocess.run([sys.executable, "-c", SYSTEM_EXIT_SCRIPT,
                          str(tmp_path), PYTHON_DIR], capture_output=True,
                         text=True, timeout=WAIT)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "second done" in out.stdout
    assert "SystemExit" in out.stderr
    _check(tmp_path / "first", 1)
    _check(tmp_path / "second", 2)


ENDLESS_SCRIPT = r"""
import os, sys
sys.path.insert(0, sys.argv[2])
import torch
import dcp
d = sys.argv[1]

def again(f):  # every save's done-callback starts the next one, for ever
    dcp.async_save({"w": torch.ones(1000)},
                   checkpoint_id=os.path.join(d, "ckpt")).add_done_callback(
                       again)

dcp.async_save({"w": torch.ones(1000)},
               checkpoint_id=os.path.join(d, "ckpt")).add_done_callback(again)
"""


def test_exit_is_not_held_forever_by_saves_that_start_saves(tmp_path):
    """Done-callbacks that start a save each, for ever, do not hold the
    exit for ever: exit waits a bounded number of rounds (saves those
    callbacks started included), then says what it left."""
    out = subprocess.run([sys.executable, "-c", ENDLESS_SCRIPT,
                          str(tmp_path), PYTHON_DIR], capture_output=True,
                         text=True, timeout=WAIT)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "were not waited for" in out.stderr, out.stderr[-4000:]
    _check_ones = {"w": torch.zeros(1000)}
    dcp.load(_check_ones, checkpoint_id=str(tmp_path / "ckpt"))
    assert torch.equal(_check_ones["w"], torch.ones(1000))


def _warm_writer(tmp_path):
    dcp.async_save({"w": torch.zeros(1000)}, checkpoint_id=str(
        tmp_path / "warm"), async_checkpointer_type=PROCESS).result(WAIT)
    return _process_writer._writer


def test_process_writer_ignores_sigint(tmp_path):
    """Ctrl-C reaches the writer process too (it is in the caller's process
    group): the writer ignores it, idle or in a save, so the save in flight
    commits and the writer keeps serving."""
    writer = _warm_writer(tmp_path)
    os.kill(writer.pid, signal.SIGINT)  # idle, reading its socket
    writer.held.clear()
    _process_writer._debug_hold_next = True  # the writer waits in the save
    resp = dcp.async_save({"w": torch.full((1000,), 1.0)},
                          checkpoint_id=str(tmp_path / "a"),
                          async_checkpointer_type=PROCESS)
    assert writer.held.wait(WAIT)
    os.kill(writer.pid, signal.SIGINT)  # in the save
    writer.conn.send(("go",))  # releases the held save
    assert isinstance(resp.result(WAIT), dcp.Metadata)
    again = dcp.async_save({"w": torch.full((1000,), 2.0)},
                           checkpoint_id=str(tmp_path / "b"),
                           async_checkpointer_type=PROCESS)
    again.result(WAIT)
    assert _process_writer._writer is writer and writer.proc.poll() is None
    _check(tmp_path / "a", 1)
    _check(tmp_path / "b", 2)


@pytest.mark.parametrize("kind,custom", [("PROCESS", False),
                                         ("THREAD", True),
                                         ("PROCESS", True)])
def test_done_callback_waiting_for_another_save_raises(tmp_path, kind,
                                                       custom):
    """As for THREAD: a done-callback runs on the dcp thread that resolves
    the next save's future too (the PROCESS writer's reader, the custom
    stager's upload thread); waiting there for that future raises
    RuntimeError instead of hanging, and both saves still commit."""
    kind = dcp.AsyncCheckpointerType[kind]
    gate = threading.Event()
    if custom:  # holds the upload thread until the callback is added
        engine._uploader.submit(gate.wait)
        stager = _CopyStager()
    else:  # holds the PROCESS staging thread; saves return at once
        _warm_writer(tmp_path)
        _process_writer._stager.submit(gate.wait)
        stager = dcp.DefaultStager()
    try:
        first, second = (
            dcp.async_save({"w": torch.full((1000,), float(i))},
                           checkpoint_id=str(tmp_path / str(i)),
                           async_checkpointer_type=kind, async_stager=stager)
            for i in (1, 2))
        outcome = concurrent.futures.Future()

        def wait_for_second(_):
            try:
                outcome.set_result(second.result(WAIT))
            except BaseException as e:
                outcome.set_exception(e)

        first.add_done_callback(wait_for_second)
    finally:
        gate.set()
    with pytest.raises(RuntimeError, match="from a done-callback"):
        outcome.result(WAIT)
    first.result(WAIT)
    second.result(WAIT)
    _check(tmp_path / "1", 1)
    _check(tmp_path / "2", 2)
    if not custom:
        stager.close()


def _fds():
    """This process's open file descriptors: {fd: what it is}."""
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            out[int(fd)] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    return out


def test_fork_child_custom_stager_fails_and_closes_the_writer_fds(tmp_path):
    """A child of fork(2) of a process that used a custom stager and the
    PROCESS writer: its custom-stager save fails with the library's
    "child of fork(2)" CheckpointException (not a future that never
    completes), and it holds neither the writer's socket nor a staging
    segment (a killed parent's writer must not outlive it because of the
    child)."""
    _warm_writer(tmp_path)
    dcp.async_save({"w": torch.ones(1000)}, checkpoint_id=str(
        tmp_path / "p"), async_stager=_CopyStager()).result(WAIT)
    conn = _process_writer._writer.conn
    sock = os.readlink(f"/proc/self/fd/{conn.fileno()}")
    assert any("memfd:dcp-stage-" in v for v in _fds().values())
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            held = [v for v in _fds().values()
                    if v == sock or "memfd:dcp-stage-" in v]
            assert not held, held
            for kind in (THREAD, PROCESS):
                r = dcp.async_save({"w": torch.ones(4)},
                                   checkpoint_id=str(tmp_path / "c"),
                                   async_stager=_CopyStager(),
                                   async_checkpointer_type=kind)
                with pytest.raises(dcp.CheckpointException,
                                   match=r"child of fork\(2\)"):
                    r.result(WAIT)
            code = 0
        except BaseException as e:
            sys.stderr.write(f"child: {type(e).__name__}: {e}\n")
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert not os.path.exists(str(tmp_path / "c" / ".metadata"))


def test_writer_that_fails_to_start_names_the_cause(tmp_path, monkeypatch):
    """A writer process whose interpreter fails while starting (here its
    `import torch`): every error names what it reported, each time a new
    one is tried; once the cause is gone the next save starts one that
    works."""
    fake = tmp_path / "fake" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "raise ImportError('libfake.so: no such file')\n")
    _process_writer.shutdown_writer()
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "fake"))
    resp = dcp.async_save({"w": torch.ones(1000)},
                          checkpoint_id=str(tmp_path / "a"),
                          async_checkpointer_type=PROCESS)
    with pytest.raises(dcp.CheckpointException,
                       match=r"failed to start \(exit code 1\): ImportError: "
                             r"libfake\.so: no such file; .*/a was not "
                             "saved") as e:
        resp.result(WAIT)
    assert e.value.code == _lib.UNAVAILABLE
    with pytest.raises(dcp.CheckpointException,
                       match="failed to start.*libfake"):
        _process_writer.reserve({"w": torch.ones(1000)})
    monkeypatch.undo()
    again = dcp.async_save({"w": torch.full((1000,), 3.0)},
                           checkpoint_id=str(tmp_path / "b"),
                           async_checkpointer_type=PROCESS)
    again.result(WAIT)
    _check(tmp_path / "b", 3)
    assert not os.path.exists(str(tmp_path / "a" / ".metadata"))


def test_staging_segment_that_cannot_be_mapped(tmp_path, monkeypatch):
    """A shared-memory segment that cannot be mapped closes its memfd and
    raises CheckpointException (RESOURCE_EXHAUSTED, naming the size); a
    PROCESS save staging into it fails both futures with it."""
    import mmap

    def no_memory(*args, **kwargs):
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(mmap, "mmap", no_memory)
    before = _fds()
    for _ in range(3):
        with pytest.raises(dcp.CheckpointException,
                           match="could not map a 8192-byte shared-memory "
                                 "staging segment") as e:
            _process_writer._Segment(8192)
        assert e.value.code == _lib.RESOURCE_EXHAUSTED
        assert isinstance(e.value, dcp.CheckpointResourceError)
        assert e.value.errno == errno.ENOMEM
    assert _fds() == before
    monkeypatch.setattr(_process_writer, "_pool", _process_writer._Pool())
    resp = dcp.async_save({"w": torch.ones(1000)},
                          checkpoint_id=str(tmp_path / "a"),
                          async_checkpointer_type=PROCESS)
    with pytest.raises(dcp.CheckpointException, match="could not map"):
        resp.staging_completion.result(WAIT)
    with pytest.raises(dcp.CheckpointException, match="could not map"):
        resp.result(WAIT)


def test_staging_completion_is_done_when_an_in_call_save_returns(tmp_path):
    """Staged in the call: the returned Future's staging_completion is
    already resolved, for the engine's saves too (whose completions
    another thread resolves), and from a done-callback as well."""
    chained = concurrent.futures.Future()

    def chain(_):
        try:
            f = dcp.async_save({"w": torch.ones(1000)},
                               checkpoint_id=str(tmp_path / "chained"))
            chained.set_result((f, f.staging_completion.done()))
        except BaseException as e:
            chained.set_exception(e)

    for i in range(10):
        f = dcp.async_save({"w": torch.ones(1000)},
                           checkpoint_id=str(tmp_path / str(i)))
        assert f.staging_completion.done(), i
        assert f.staging_completion.result() is None
        if i == 0:
            f.add_done_callback(chain)
    for kind in (PROCESS, THREAD):
        f = dcp.async_save({"w": torch.ones(1000)}, async_stager=_CopyStager(),
                           checkpoint_id=str(tmp_path / f"c-{kind.value}"),
                           async_checkpointer_type=kind)
        assert f.staging_completion.done()
        f.result(WAIT)
    f, done = chained.result(WAIT)
    assert done
    f.result(WAIT)
    _check(tmp_path / "chained", 1)


def test_wait_staged_raises_when_the_wait_itself_fails(tmp_path,
                                                       monkeypatch):
    """dcp_async_save_wait failing without a completion (here: made to)
    raises from async_save instead of spinning."""
    L = _lib.lib()
    real_wait = L.dcp_async_save_wait

    def failing_wait(handle, which, timeout_ms, done):
        if timeout_ms:  # wait_staged's; the completions poll with 0
            return _lib.FAILED_PRECONDITION
        return real_wait(handle, which, timeout_ms, done)

    monkeypatch.setattr(L, "dcp_async_save_wait", failing_wait)
    outcome = concurrent.futures.Future()

    def call():
        try:
            outcome.set_result(dcp.async_save(
                {"w": torch.ones(1000)}, checkpoint_id=str(tmp_path / "a")))
        except BaseException as e:
            outcome.set_exception(e)

    threading.Thread(target=call, daemon=True).start()
    with pytest.raises(dcp.CheckpointException):
        outcome.result(WAIT)
    monkeypatch.undo()
    L.dcp_shutdown()  # the save itself runs on
    _check(tmp_path / "a", 1)


UNSEEN_SCRIPT = r"""
import os, sys
sys.path.insert(0, sys.argv[2])
import torch
import dcp
d = sys.argv[1]
dcp.save({"w": torch.zeros(10)}, checkpoint_id=os.path.join(d, "taken"))

def refused(kind, name):
    return dcp.async_save(
        {name: torch.ones(10)}, async_checkpointer_type=kind,
        storage_writer=dcp.FileSystemWriter(os.path.join(d, "taken"),
                                            overwrite=False))

refused(dcp.AsyncCheckpointerType.THREAD, "thread_unseen")
refused(dcp.AsyncCheckpointerType.PROCESS, "process_unseen")
looked = refused(dcp.AsyncCheckpointerType.THREAD, "looked_at")
assert isinstance(looked.exception(), dcp.CheckpointExistsError)

class Copy:
    def stage(self, sd):
        return dict(sd)

# Looked at through the upload Future of a PROCESS save after a stager of
# the caller's (which waits for the writer's own future).
through = dcp.async_save(
    {"w": torch.ones(10)}, async_checkpointer_type=dcp.AsyncCheckpointerType
    .PROCESS, async_stager=Copy(),
    storage_writer=dcp.FileSystemWriter(os.path.join(d, "taken"),
                                        overwrite=False))
assert isinstance(through.exception(), dcp.CheckpointExistsError)

import concurrent.futures
class Failing:
    def stage(self, sd):
        f = concurrent.futures.Future()
        f.set_exception(RuntimeError("staging blew up"))
        return f

# Looked at through staging_completion: its upload carries the same error.
r = dcp.async_save({"w": torch.ones(10)}, async_stager=Failing(),
                   checkpoint_id=os.path.join(d, "never"))
assert isinstance(r.staging_completion.exception(), RuntimeError)
print("exiting", flush=True)
"""


def test_exit_says_which_failed_saves_nothing_waited_for(tmp_path):
    """A program that exits without looking at its async_saves' results
    learns on stderr that each failed one was not written (once each, THREAD
    and PROCESS, failed before or during exit); one whose exception it
    looked at is not repeated; the exit status is unchanged."""
    out = subprocess.run([sys.executable, "-c", UNSEEN_SCRIPT, str(tmp_path),
                          PYTHON_DIR], capture_output=True, text=True,
                         timeout=WAIT)
    assert out.returncode == 0, out.stderr[-4000:]
    lines = [line for line in out.stderr.splitlines()
             if line.startswith("dcp: an async_save failed")]
    assert len(lines) == 2, out.stderr[-4000:]
    assert all("nothing waited for it: CheckpointExistsError" in line and
               "taken" in line for line in lines), lines


@pytest.mark.parametrize("kind", ["THREAD", "PROCESS"])
def test_a_finished_async_save_leaves_no_reference_cycle(tmp_path, kind):
    """A finished async_save's futures and Metadata are freed when the
    caller drops them, without the cyclic garbage collector (which a
    process with torch loaded seldom runs a full pass of: 20,000-item
    saves grew the heap by 16 MiB each). Whatever a collection finds
    unreachable here was in a cycle."""
    import concurrent.futures
    import gc
    from dcp import async_save as _  # noqa: F401 - the module, loaded
    async_module = sys.modules["dcp.async_save"]
    kind = getattr(dcp.AsyncCheckpointerType, kind)

    class Copy:
        def stage(self, state_dict):
            done = concurrent.futures.Future()
            done.set_result({k: v.clone() for k, v in state_dict.items()})
            return done
    state = {f"w{i}": torch.ones(2) for i in range(50)}
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for round_ in range(2):
            for name, stager in (("plain", None), ("stager", Copy()),
                                 ("dcp", dcp.DefaultStager())):
                r = dcp.async_save(state, async_checkpointer_type=kind,
                                   checkpoint_id=str(tmp_path / name),
                                   async_stager=stager)
                r.upload_completion.result(120)
                r.staging_completion.result(120)
                if stager is not None and hasattr(stager, "close"):
                    stager.close()
                del r
        gc.collect()
        cyclic = [type(o).__name__ for o in gc.garbage
                  if isinstance(o, (async_module._DcpFuture, dcp.Metadata))]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert not cyclic, cyclic
