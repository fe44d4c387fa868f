"""async_save: THREAD (the engine's) and PROCESS (a persistent writer
process), their futures, and a writer process that dies."""

import concurrent.futures
import importlib
import os
import signal
import threading

import pytest
import torch

import dcp
from dcp import _process_writer

WAIT = 120  # seconds; bounds a hang, never paces a test


def _state(seed):
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(256, 256, generator=g),
            "b": torch.randn(256, generator=g).to(torch.bfloat16),
            "step": seed, "name": f"s{seed}", "t": (1, 2)}


class _HeldUploadStager:
    """A stager of the caller's whose staged dict ({"w": a copy of the
    state's "w", "g": a Stateful}) holds the upload in the Stateful's
    state_dict() until `release` is set: an upload held open without a
    pending stager Future."""

    def __init__(self, release):
        self.release = release

    def stage(self, state_dict):
        release = self.release

        class Gate:
            def state_dict(self):  # runs in the upload
                release.wait(WAIT)
                return {"v": torch.ones(1)}

            def load_state_dict(self, sd):
                pass
        done = concurrent.futures.Future()
        done.set_result({"w": state_dict["w"].clone(), "g": Gate()})
        return done


def _check(ckpt, seed):
    want = _state(seed)
    got = {"w": torch.zeros(256, 256),
           "b": torch.zeros(256, dtype=torch.bfloat16),
           "step": 0, "name": "", "t": (0, 0)}
    dcp.load(got, checkpoint_id=ckpt)
    assert torch.equal(got["w"], want["w"]) and torch.equal(got["b"],
                                                            want["b"])
    assert got["step"] == seed and got["name"] == f"s{seed}"
    assert got["t"] == (1, 2)


def test_thread_staging_then_upload(tmp_path):
    state = _state(1)
    w_ptr = state["w"].data_ptr()
    resp = dcp.async_save(state, checkpoint_id=str(tmp_path / "a"))
    # The seed: staged in the call, so the upload Future (which also
    # carries both completions).
    assert isinstance(resp, concurrent.futures.Future)
    assert not isinstance(resp, dcp.AsyncSaveResponse)
    assert resp.upload_completion is resp
    assert resp.staging_completion.result(WAIT) is None
    # Staged: the caller may change its tensors; the checkpoint keeps the
    # values of the call.
    state["w"].zero_()
    md = resp.upload_completion.result(WAIT)
    assert isinstance(md, dcp.Metadata) and "w" in md.state_dict_metadata
    assert resp.result(WAIT) is md  # the response behaves as the Future
    assert state["w"].data_ptr() == w_ptr
    _check(str(tmp_path / "a"), 1)


@pytest.mark.parametrize("kind", ["THREAD", "PROCESS"])
def test_seed_return_types_and_staging_at_return(tmp_path, kind):
    """Without a stager (or with one staging synchronously) the seed
    stages in the call and returns the upload Future: a loop that changes
    its tensors right after the call must not reach the checkpoint. With
    an asynchronous DefaultStager: an AsyncSaveResponse."""
    kind = dcp.AsyncCheckpointerType[kind]
    sync = dcp.DefaultStager(dcp.StagingOptions(False, False, False, False))
    for name, stager in (("none", None), ("sync", sync)):
        x = torch.zeros(1 << 20)
        fut = dcp.async_save({"x": x}, checkpoint_id=str(tmp_path / name),
                             async_checkpointer_type=kind,
                             async_stager=stager)
        assert isinstance(fut, concurrent.futures.Future)
        x.fill_(7.0)
        done, _ = concurrent.futures.wait([fut], timeout=WAIT)
        assert fut in done
        out = {"x": torch.ones(1 << 20)}
        dcp.load(out, checkpoint_id=str(tmp_path / name))
        assert torch.equal(out["x"], torch.zeros(1 << 20)), name
    sync.close()
    stager = dcp.DefaultStager()
    resp = dcp.async_save({"x": torch.zeros(4)},
                          checkpoint_id=str(tmp_path / "async"),
                          async_checkpointer_type=kind, async_stager=stager)
    assert isinstance(resp, dcp.AsyncSaveResponse)
    resp.upload_completion.result(WAIT)
    stager.close()


def test_a_failing_custom_stager_fails_the_returned_future(ckpt):
    class Failing:
        def stage(self, state_dict):
            raise RuntimeError("stage failed")

    fut = dcp.async_save({"x": torch.ones(1)}, checkpoint_id=ckpt,
                         async_stager=Failing())
    with pytest.raises(RuntimeError, match="stage failed"):
        fut.result(WAIT)
    # Shaped as any in-call save's return: both completions, failed.
    assert fut.upload_completion is fut
    with pytest.raises(RuntimeError, match="stage failed"):
        fut.staging_completion.result(WAIT)
    assert not os.path.exists(ckpt)


def test_thread_several_in_flight(tmp_path):
    resps = [dcp.async_save(_state(i), checkpoint_id=str(tmp_path / str(i)))
             for i in range(3)]
    for r in resps:
        r.upload_completion.result(WAIT)
    for i in range(3):
        _check(str(tmp_path / str(i)), i)


def test_thread_failure_fails_the_upload_future(ckpt):
    dcp.save({"x": torch.ones(1)}, checkpoint_id=ckpt)
    resp = dcp.async_save(
        {"x": torch.ones(1)},
        storage_writer=dcp.FileSystemWriter(ckpt, overwrite=False))
    with pytest.raises(dcp.CheckpointExistsError):
        resp.upload_completion.result(WAIT)


def test_bad_state_raises_at_the_call(ckpt):
    with pytest.raises(TypeError, match="'bad'"):
        dcp.async_save({"bad": object()}, checkpoint_id=ckpt)
    with pytest.raises(TypeError, match="'bad'"):
        dcp.async_save({"bad": object()}, checkpoint_id=ckpt,
                       async_checkpointer_type=dcp.AsyncCheckpointerType
                       .PROCESS)


class _CopyStager:
    """A custom async_stager: stages by cloning, synchronously."""

    def __init__(self):
        self.staged = 0
        self.synced = 0

    def stage(self, sd):
        self.staged += 1
        return {k: v.clone() if isinstance(v, torch.Tensor) else v
                for k, v in sd.items()}

    def synchronize_staging(self):
        self.synced += 1


@pytest.mark.parametrize("kind", list(dcp.AsyncCheckpointerType))
def test_custom_async_stager(ckpt, kind):
    stager = _CopyStager()
    state = _state(4)
    resp = dcp.async_save(state, checkpoint_id=ckpt, async_stager=stager,
                          async_checkpointer_type=kind)
    resp.staging_completion.result(WAIT)
    resp.upload_completion.result(WAIT)
    assert stager.staged == 1 and stager.synced == 1
    _check(ckpt, 4)


def test_process_writer_round_trip_and_reuse(tmp_path):
    kind = dcp.AsyncCheckpointerType.PROCESS
    first = dcp.async_save(_state(1), checkpoint_id=str(tmp_path / "1"),
                           async_checkpointer_type=kind)
    first.staging_completion.result(WAIT)
    md = first.upload_completion.result(WAIT)
    assert isinstance(md, dcp.Metadata)
    pid = _process_writer.writer_pid()
    assert pid is not None and pid != os.getpid()
    assert _process_writer.startup_seconds is not None
    second = dcp.async_save(_state(2), checkpoint_id=str(tmp_path / "2"),
                            async_checkpointer_type=kind,
                            storage_writer=dcp.FileSystemWriter(
                                str(tmp_path / "2"), thread_count=2))
    second.upload_completion.result(WAIT)
    assert _process_writer.writer_pid() == pid  # reused
    _check(str(tmp_path / "1"), 1)
    _check(str(tmp_path / "2"), 2)
    # A failing save in the writer fails its future; the writer lives on.
    bad = dcp.async_save(_state(3), async_checkpointer_type=kind,
                         storage_writer=dcp.FileSystemWriter(
                             str(tmp_path / "1"), overwrite=False))
    with pytest.raises(dcp.CheckpointExistsError):
        bad.upload_completion.result(WAIT)
    assert _process_writer.writer_pid() == pid


PROCESS = dcp.AsyncCheckpointerType.PROCESS


def _held_process_save(tmp_path):
    """(writer, response): a PROCESS save of _state(1) into tmp_path/1
    that the (started) writer process holds, waiting in it."""
    warm = dcp.async_save(_state(0), checkpoint_id=str(tmp_path / "0"),
                          async_checkpointer_type=PROCESS)
    warm.upload_completion.result(WAIT)
    writer = _process_writer._writer
    writer.held.clear()
    _process_writer._debug_hold_next = True  # the writer waits in the save
    resp = dcp.async_save(_state(1), checkpoint_id=str(tmp_path / "1"),
                          async_checkpointer_type=PROCESS)
    assert writer.held.wait(WAIT)
    return writer, resp


def test_process_writer_killed_mid_save(tmp_path):
    kind = PROCESS
    writer, resp = _held_process_save(tmp_path)
    pid = writer.pid
    resp.staging_completion.result(WAIT)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(dcp.CheckpointException,
                       match=rf"writer process \(pid {pid}\) died") as e:
        resp.upload_completion.result(WAIT)
    assert "exit code -9" in str(e.value)
    assert not os.path.exists(str(tmp_path / "1" / ".metadata"))
    # The next call starts a new writer.
    again = dcp.async_save(_state(2), checkpoint_id=str(tmp_path / "2"),
                           async_checkpointer_type=kind)
    again.upload_completion.result(WAIT)
    assert _process_writer.writer_pid() not in (None, pid)
    _check(str(tmp_path / "2"), 2)


def test_process_saves_the_dead_writer_never_began_go_to_a_new_one(tmp_path):
    """A writer that dies fails the save it was writing; the saves handed
    to it that it had not begun are written by a new writer, in order."""
    kind = PROCESS
    writer, held = _held_process_save(tmp_path)
    pid = writer.pid
    # Two saves into one directory, queued behind the held one: the later
    # must be the one left there.
    queued = [dcp.async_save(_state(seed), checkpoint_id=str(tmp_path / "q"),
                             async_checkpointer_type=kind)
              for seed in (2, 3)]
    _process_writer._stager.drain()  # both handed to the writer
    assert len(writer.jobs) == 3
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(dcp.CheckpointException,
                       match=rf"writer process \(pid {pid}\) died"):
        held.upload_completion.result(WAIT)
    for response in queued:
        response.upload_completion.result(WAIT)
    assert _process_writer.writer_pid() not in (None, pid)
    assert not os.path.exists(str(tmp_path / "1" / ".metadata"))
    _check(str(tmp_path / "q"), 3)


def test_process_saves_are_handed_over_while_the_writer_is_busy(tmp_path):
    """The writer reads its socket while it writes a save: a staged save
    whose hand-over is larger than the socket's buffer does not wait for
    the save being written, nor do the saves staged after it."""
    kind = PROCESS
    writer, held = _held_process_save(tmp_path)
    # About 2 MB of paths and tensor specs: more than a socket buffer.
    many = {f"layer{i}.a_long_parameter_name": torch.full((2,), float(i))
            for i in range(20000)}
    big = dcp.async_save(many, checkpoint_id=str(tmp_path / "big"),
                         async_checkpointer_type=kind)
    after = dcp.async_save(_state(2), checkpoint_id=str(tmp_path / "2"),
                           async_checkpointer_type=kind)
    # Staged (the stager thread handed `big` over) while `held` still waits.
    after.staging_completion.result(WAIT)
    assert not held.done()
    assert writer.lock.acquire(timeout=WAIT)  # no send in progress
    try:
        writer.conn.send(("go",))  # releases the held save
    finally:
        writer.lock.release()
    for response in (held, big, after):
        response.upload_completion.result(WAIT)
    assert _process_writer.writer_pid() == writer.pid
    _check(str(tmp_path / "1"), 1)
    _check(str(tmp_path / "2"), 2)
    got = {k: torch.zeros(2) for k in many}
    dcp.load(got, checkpoint_id=str(tmp_path / "big"))
    assert all(torch.equal(got[k], many[k]) for k in many)


def test_process_writer_that_cannot_start_fails_the_upload_only(
        tmp_path, monkeypatch):
    """The first PROCESS call starts the writer after staging: when the
    interpreter cannot be started, staging_completion succeeds,
    upload_completion fails naming the cause, nothing is committed, and
    the next call starts a writer."""
    import sys
    kind = dcp.AsyncCheckpointerType.PROCESS
    _process_writer.shutdown_writer()
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python"))
    resp = dcp.async_save(_state(1), checkpoint_id=str(tmp_path / "1"),
                          async_checkpointer_type=kind)
    assert resp.staging_completion.result(WAIT) is None
    with pytest.raises(dcp.CheckpointException,
                       match="could not start the dcp async writer process: "
                             "FileNotFoundError") as e:
        resp.upload_completion.result(WAIT)
    assert "no-python" in str(e.value)
    assert not os.path.exists(str(tmp_path / "1" / ".metadata"))
    monkeypatch.undo()
    again = dcp.async_save(_state(2), checkpoint_id=str(tmp_path / "2"),
                           async_checkpointer_type=kind)
    again.upload_completion.result(WAIT)
    assert _process_writer.writer_pid() is not None
    _check(str(tmp_path / "2"), 2)


@pytest.mark.parametrize("threads", [1, 3])
def test_process_staging_copies_every_layout(tmp_path, monkeypatch, threads):
    """PROCESS stages contiguous host tensors with dcp_copy_host in pieces
    over threads (big: two 8 MiB pieces and a part), the rest through
    torch; the checkpoint holds the values of the call whatever the caller
    changes afterwards."""
    import numpy as np
    monkeypatch.setattr(_process_writer, "_COPY_THREADS", threads)
    g = torch.Generator().manual_seed(7)
    big = torch.randn(4200, 1025, generator=g)  # 17220000 bytes
    z = torch.randn(5, 3, dtype=torch.complex64, generator=g)
    state = {
        "big": big,
        "bf16": torch.randn(1000, generator=g).to(torch.bfloat16),
        "transposed": torch.randn(64, 33, generator=g).t(),
        "conj": z.conj(),  # a lazily conjugated view
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
        "np": np.arange(5000, dtype=np.int32),
        "np_strided": np.arange(60, dtype=np.float64).reshape(6, 10)[:, ::3],
    }
    want = {k: (v.copy() if isinstance(v, np.ndarray) else v.clone())
            for k, v in state.items()}
    want["conj"] = z.conj().resolve_conj()
    resp = dcp.async_save(state, checkpoint_id=str(tmp_path / "p"),
                          async_checkpointer_type=dcp.AsyncCheckpointerType
                          .PROCESS)
    resp.staging_completion.result(WAIT)
    big.zero_()
    state["np"][:] = 0
    resp.upload_completion.result(WAIT)
    got = {k: (np.zeros_like(v) if isinstance(v, np.ndarray)
               else torch.zeros_like(v).contiguous())
           for k, v in want.items()}
    got["conj"] = torch.zeros(5, 3, dtype=torch.complex64)
    got["np_strided"] = np.zeros((6, 4))
    dcp.load(got, checkpoint_id=str(tmp_path / "p"))
    for k, v in want.items():
        if isinstance(v, np.ndarray):
            assert np.array_equal(got[k], v), k
        else:
            assert torch.equal(got[k], v), k


def test_world_of_one_under_torch_distributed(tmp_path):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store",
                            rank=0, world_size=1)
    try:
        state = _state(6)
        dcp.save(state, checkpoint_id=str(tmp_path / "s"))
        dcp.async_save(state, checkpoint_id=str(tmp_path / "a")) \
            .upload_completion.result(WAIT)
        _check(str(tmp_path / "s"), 6)
        _check(str(tmp_path / "a"), 6)
    finally:
        dist.destroy_process_group()


def test_process_refuses_what_the_writer_could_not_save(tmp_path):
    """PROCESS checks the tensors in the call, as THREAD does: a big-endian
    numpy array (whose bytes the writer would read as little-endian) and
    an unsupported dtype raise TypeError naming the key; nothing is
    written."""
    import numpy as np
    kind = dcp.AsyncCheckpointerType.PROCESS
    for bad, what in ((np.arange(4, dtype=">f4"), "numpy dtype >f4"),
                      (np.zeros(3, dtype=np.complex256), "complex256")):
        with pytest.raises(TypeError, match=rf"'x': .*{what}"):
            dcp.async_save({"x": bad, "ok": torch.ones(2)},
                           checkpoint_id=str(tmp_path / "c"),
                           async_checkpointer_type=kind)
    assert not os.path.exists(str(tmp_path / "c" / ".metadata"))


def test_process_writer_whose_answers_cannot_be_read_fails_its_saves(
        tmp_path, monkeypatch):
    """An answer the parent cannot read (here: the reader's receive
    raises) ends that writer: the save in flight fails naming the writer,
    and the next call starts a new one."""
    kind = dcp.AsyncCheckpointerType.PROCESS
    warm = dcp.async_save(_state(0), checkpoint_id=str(tmp_path / "0"),
                          async_checkpointer_type=kind)
    warm.upload_completion.result(WAIT)
    writer = _process_writer._writer
    pid = writer.pid
    recv = writer.conn.recv

    def garbled():
        msg = recv()
        if msg[0] == "done":
            raise ValueError("garbled answer")
        return msg

    # The reader waits in the unpatched receive now; the "held" below comes
    # through it, and the save's answer through this one.
    monkeypatch.setattr(writer.conn, "recv", garbled)
    writer.held.clear()
    _process_writer._debug_hold_next = True  # the writer waits in the save
    resp = dcp.async_save(_state(1), checkpoint_id=str(tmp_path / "1"),
                          async_checkpointer_type=kind)
    assert writer.held.wait(WAIT)
    writer.conn.send(("go",))  # releases the held save
    with pytest.raises(dcp.CheckpointException,
                       match=rf"writer process \(pid {pid}\) died"):
        resp.upload_completion.result(WAIT)
    assert writer.dead and writer.proc.poll() is not None
    again = dcp.async_save(_state(2), checkpoint_id=str(tmp_path / "2"),
                           async_checkpointer_type=kind)
    again.upload_completion.result(WAIT)
    assert _process_writer.writer_pid() not in (None, pid)
    _check(str(tmp_path / "2"), 2)


def test_process_pool_release_is_idempotent_and_forgets_dropped_segments():
    """A segment released twice is in the pool once (two saves never share
    one); one dropped from a full pool is forgotten by the live writer."""
    pool = _process_writer._Pool()
    segs = [_process_writer._Segment(4096 * (i + 1)) for i in range(3)]
    forgotten = []

    class FakeWriter:
        def forget(self, seg):
            forgotten.append(seg.id)

    old = _process_writer._writer
    _process_writer._writer = FakeWriter()
    try:
        pool.release(segs[1])
        pool.release(segs[1])
        assert pool._idle == [segs[1]]
        assert pool.acquire(4096) is segs[1]
        fresh = pool.acquire(4096)
        assert fresh is not segs[1]  # a new one
        fresh.close()
        pool.release(segs[1])
        pool.release(segs[2])
        pool.release(segs[0])  # a third: the smallest is dropped
        assert forgotten == [segs[0].id]
        assert sorted(s.id for s in pool._idle) == sorted(
            [segs[1].id, segs[2].id])
    finally:
        _process_writer._writer = old
        for s in pool._idle:
            s.close()


def test_fork_child_cannot_use_dcp_and_leaves_the_parents_writer(tmp_path):
    """A child of fork(2) of a process that used dcp: its saves fail with
    CheckpointException saying why (libdcp's threads stayed in the parent)
    instead of hanging, and it neither sees nor stops the parent's writer
    process (its exit runs shutdown_writer), which keeps serving."""
    import sys
    kind = dcp.AsyncCheckpointerType.PROCESS
    warm = dcp.async_save(_state(0), checkpoint_id=str(tmp_path / "0"),
                          async_checkpointer_type=kind)
    warm.upload_completion.result(WAIT)
    parent_writer = _process_writer.writer_pid()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            assert _process_writer.writer_pid() is None
            r = dcp.async_save(_state(5), checkpoint_id=str(tmp_path / "5"),
                               async_checkpointer_type=kind)
            with pytest.raises(dcp.CheckpointException,
                               match=r"child of fork\(2\)"):
                r.staging_completion.result(WAIT)
            with pytest.raises(dcp.CheckpointException,
                               match=r"child of fork\(2\)"):
                dcp.save(_state(5), checkpoint_id=str(tmp_path / "5"))
            _process_writer.shutdown_writer()  # as at exit: a no-op here
            code = 0
        except BaseException as e:
            sys.stderr.write(f"child: {type(e).__name__}: {e}\n")
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert not os.path.exists(str(tmp_path / "5" / ".metadata"))
    assert _process_writer.writer_pid() == parent_writer
    again = dcp.async_save(_state(6), checkpoint_id=str(tmp_path / "6"),
                           async_checkpointer_type=kind)
    again.upload_completion.result(WAIT)
    assert _process_writer.writer_pid() == parent_writer
    _check(str(tmp_path / "6"), 6)


class _FillAtSyncStager:
    """A custom async_stager whose staged dict is filled only by
    synchronize_staging (as non-blocking device copies would be)."""

    def __init__(self):
        self.pending = []

    def stage(self, sd):
        out = {k: torch.zeros_like(v) for k, v in sd.items()}
        self.pending = [(out[k], v) for k, v in sd.items()]
        return out

    def synchronize_staging(self):
        for dst, src in self.pending:
            dst.copy_(src)


def test_custom_stager_is_synchronized_before_the_upload_reads(tmp_path):
    g = torch.Generator().manual_seed(9)
    state = {"w": torch.randn(512, 512, generator=g)}
    resp = dcp.async_save(state, checkpoint_id=str(tmp_path / "c"),
                          async_stager=_FillAtSyncStager())
    resp.upload_completion.result(WAIT)
    got = {"w": torch.zeros(512, 512)}
    dcp.load(got, checkpoint_id=str(tmp_path / "c"))
    assert torch.equal(got["w"], state["w"])


def _interrupt(how):
    """Ctrl-C as it arrives: a SIGINT whose handler raises at the next
    bytecode, or the KeyboardInterrupt itself, raised there directly."""
    if how == "signal":
        signal.raise_signal(signal.SIGINT)
    else:
        raise KeyboardInterrupt


def _value(handle):
    return getattr(handle, "value", handle)


def _on_daemon_thread(fn, *args, **kwargs):
    """fn's result, from a daemon thread: a call that never returns fails
    after WAIT seconds instead of hanging the test run."""
    out = []
    thread = threading.Thread(
        target=lambda: out.append(fn(*args, **kwargs)), daemon=True)
    thread.start()
    thread.join(WAIT)
    assert not thread.is_alive(), f"{fn.__name__} did not return"
    return out[0] if out else None


@pytest.mark.parametrize("how", ["signal", "raise"])
def test_interrupt_as_the_engine_save_returns_loses_nothing(tmp_path,
                                                            monkeypatch, how):
    """Ctrl-C just after dcp_async_save returned, before Python registered
    its completions: the call raises KeyboardInterrupt, but the save it
    started commits, its futures resolve, its handle is freed once after
    both completions and its state dict only then (not as the interrupt
    passes), and the group's turn is ended (the next save on it runs)."""
    from torch.distributed import HashStore

    from dcp import _lib
    engine = importlib.import_module("dcp.async_save")
    L = _lib.lib()
    real_save = L.dcp_async_save
    real_free, real_free_sd = L.dcp_async_save_free, L.dcp_state_dict_free
    calls, jobs = [], []
    freed = threading.Event()

    def save_then_interrupt(*args):
        code = real_save(*args)
        _interrupt(how)
        return code

    def free(handle):
        calls.append(("handle", _value(handle)))
        return real_free(handle)

    def free_sd(sd):
        calls.append(("sd", _value(sd)))
        code = real_free_sd(sd)
        if jobs and _value(sd) == jobs[0].sd:
            freed.set()
        return code

    class Job(engine._EngineJob):
        def __init__(self, prepared, *args, **kwargs):
            self.sd = _value(prepared.sd)
            jobs.append(self)
            super().__init__(prepared, *args, **kwargs)

    group = dcp.ProcessGroup.from_store(HashStore(), 0, 1)
    monkeypatch.setattr(L, "dcp_async_save", save_then_interrupt)
    monkeypatch.setattr(L, "dcp_async_save_free", free)
    monkeypatch.setattr(L, "dcp_state_dict_free", free_sd)
    monkeypatch.setattr(engine, "_EngineJob", Job)
    with pytest.raises(KeyboardInterrupt):
        dcp.async_save(_state(3), checkpoint_id=str(tmp_path / "a"),
                       process_group=group)
    assert len(jobs) == 1
    job = jobs[0]
    assert job.staging.result(WAIT) is None
    md = job.upload.result(WAIT)
    assert set(md.state_dict_metadata) == {"w", "b", "step", "name", "t"}
    assert freed.wait(WAIT)
    assert calls == [("handle", job.handle.value), ("sd", job.sd)]
    monkeypatch.undo()
    _check(str(tmp_path / "a"), 3)
    _on_daemon_thread(dcp.save, _state(4), checkpoint_id=str(tmp_path / "b"),
                      process_group=group)
    _check(str(tmp_path / "b"), 4)
    group.close()


def test_interrupt_as_a_custom_stager_upload_is_queued_ends_its_turn(
        tmp_path, monkeypatch):
    """Ctrl-C (a SIGINT) just after a custom async_stager's upload took its
    turn on the group, before it was queued: the call raises
    KeyboardInterrupt once the upload is queued with its turn; the upload
    commits and ends the turn, and the group's next save runs."""
    from torch.distributed import HashStore

    engine = importlib.import_module("dcp.async_save")
    real_take_turn = engine.take_turn

    def take_turn_then_interrupt(where):
        turn = real_take_turn(where)
        signal.raise_signal(signal.SIGINT)
        return turn

    group = dcp.ProcessGroup.from_store(HashStore(), 0, 1)
    monkeypatch.setattr(engine, "take_turn", take_turn_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        dcp.async_save(_state(5), checkpoint_id=str(tmp_path / "a"),
                       process_group=group, async_stager=_CopyStager())
    monkeypatch.undo()
    # Runs after the upload's turn: the upload has committed by then.
    _on_daemon_thread(dcp.save, _state(6), checkpoint_id=str(tmp_path / "b"),
                      process_group=group)
    _check(str(tmp_path / "a"), 5)
    _check(str(tmp_path / "b"), 6)
    group.close()


def _chained_save(tmp_path, kind, where="second"):
    """A Future of the async_save that chain() starts (of {"step": 2.0},
    a tensor chain() changes as soon as the call returns), and chain()."""
    chained = concurrent.futures.Future()

    def chain(_):
        try:
            step = torch.full((1 << 16,), 2.0)
            fut = dcp.async_save({"step": step},
                                 checkpoint_id=str(tmp_path / where),
                                 async_checkpointer_type=kind)
            step.fill_(7.0)  # staged in the call: not in the checkpoint
            chained.set_result(fut)
        except BaseException as e:
            chained.set_exception(e)
    return chained, chain


def _check_step(tmp_path, where="second"):
    out = {"step": torch.zeros(1 << 16)}
    dcp.load(out, checkpoint_id=str(tmp_path / where))
    assert torch.equal(out["step"], torch.full((1 << 16,), 2.0))


@pytest.mark.parametrize("first_kind,kind", [
    ("THREAD", "THREAD"), ("PROCESS", "PROCESS"), ("THREAD", "PROCESS")])
def test_async_save_from_an_upload_done_callback(tmp_path, first_kind, kind):
    """An upload's done-callback runs on the thread that resolves dcp's
    futures: an async_save from it must not wait for that thread (no save
    would complete again), yet stage before it returns."""
    chained, chain = _chained_save(tmp_path, dcp.AsyncCheckpointerType[kind])
    first = dcp.async_save({"x": torch.ones(4)},
                           checkpoint_id=str(tmp_path / "first"),
                           async_checkpointer_type=dcp.AsyncCheckpointerType[
                               first_kind])
    first.add_done_callback(chain)
    chained.result(WAIT).result(WAIT)
    _check_step(tmp_path)


def test_process_async_save_from_a_staging_done_callback(tmp_path):
    """A PROCESS staging's done-callback runs on the one thread that stages
    PROCESS saves: an async_save from it stages there and then."""
    kind = dcp.AsyncCheckpointerType.PROCESS
    dcp.async_save({"w": torch.ones(2)}, checkpoint_id=str(tmp_path / "w"),
                   async_checkpointer_type=kind).result(WAIT)
    gate = threading.Event()
    _process_writer._stager.submit(gate.wait)  # holds the staging thread
    stager = dcp.DefaultStager()
    # Both to one directory: the later call's upload must come last.
    chained, chain = _chained_save(tmp_path, kind, where="same")
    first = dcp.async_save({"step": torch.full((1 << 16,), 1.0)},
                           checkpoint_id=str(tmp_path / "same"),
                           async_checkpointer_type=kind, async_stager=stager)
    assert isinstance(first, dcp.AsyncSaveResponse)
    first.staging_completion.add_done_callback(chain)
    gate.set()
    chained.result(WAIT).result(WAIT)
    first.result(WAIT)
    stager.close()
    _check_step(tmp_path, where="same")


@pytest.mark.filterwarnings(
    "error::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_writer_leaves_a_failed_staging_notice_alone(tmp_path):
    """A writer that dies with a notice of a failed staging queued (a
    distributed save whose staging failed here: its futures are done)
    fails the save it was writing and hands the saves after the notice to
    a new writer: the done future is left as it is (setting it again
    stopped the writer's reader, and later saves never resolved)."""
    writer, held = _held_process_save(tmp_path)
    pid = writer.pid
    failed = _process_writer._Job(str(tmp_path / "f"))
    why = dcp.CheckpointException("staging failed (a test)", None, 13)
    failed.staging.set_exception(why)
    failed.upload.set_exception(why)
    group = dict(kind="file", where=str(tmp_path / "nowhere"), rank=0,
                 size=2, name="a-test/0", timeout=None)
    assert writer.submit_failed(next(_process_writer._job_ids), failed,
                                dict(group=group, no_dist=False), why)
    queued = dcp.async_save(_state(2), checkpoint_id=str(tmp_path / "q"),
                            async_checkpointer_type=PROCESS)
    _process_writer._stager.drain()
    assert len(writer.jobs) == 3
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(dcp.CheckpointException,
                       match=rf"writer process \(pid {pid}\) died"):
        held.upload_completion.result(WAIT)
    queued.upload_completion.result(WAIT)
    _check(str(tmp_path / "q"), 2)
    assert failed.upload.exception() is why


@pytest.mark.parametrize("via", ["checkpoint_id", "storage_writer"])
@pytest.mark.parametrize("kind", ["THREAD", "PROCESS"])
def test_a_relative_checkpoint_id_is_the_directory_meant_at_the_call(
        tmp_path, monkeypatch, kind, via):
    """The working directory changing before the upload runs (THREAD: a
    stager whose staging ends after os.chdir; PROCESS: a writer process
    started in another directory) does not move the save: it lands where
    the relative id (or a FileSystemWriter's relative path, a
    pathlib.Path) pointed at the call, and result() describes it."""
    kind = getattr(dcp.AsyncCheckpointerType, kind)
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    monkeypatch.chdir(one)
    dcp.async_save({"w": torch.full((4,), 1.0)}, checkpoint_id="ck",
                   async_checkpointer_type=kind).result()
    monkeypatch.chdir(two)
    staged = concurrent.futures.Future()

    class Late:
        def stage(self, state_dict):
            return staged

    second = {"w": torch.full((4,), 2.0), "run": "two"}
    where = (dict(checkpoint_id="ck") if via == "checkpoint_id" else
             dict(storage_writer=dcp.FileSystemWriter("ck")))
    r = dcp.async_save(second, async_checkpointer_type=kind,
                       async_stager=Late(), **where)
    monkeypatch.chdir(one)
    staged.set_result(second)
    assert "run" in r.upload_completion.result().state_dict_metadata
    for where, value in ((one, 1.0), (two, 2.0)):
        back = {"w": torch.zeros(4)}
        dcp.load(back, checkpoint_id=str(where / "ck"),
                 planner=dcp.DefaultLoadPlanner(allow_partial_load=True))
        assert torch.equal(back["w"], torch.full((4,), value)), where


def test_a_process_saves_result_is_what_it_committed_not_a_read_back(
        tmp_path, monkeypatch):
    """The writer process sends the metadata it committed: the parent does
    not read the directory back (which by then may hold another save's, or
    none), and the result is the same as a read of the checkpoint."""
    from dcp import metadata as metadata_module
    path = str(tmp_path / "ck")

    def refused(*args, **kwargs):
        raise AssertionError("read the directory back")
    monkeypatch.setattr(metadata_module, "read_metadata", refused)
    got = dcp.async_save({"w": torch.ones(3), "step": 4}, checkpoint_id=path,
                         async_checkpointer_type=dcp.AsyncCheckpointerType
                         .PROCESS).result()
    monkeypatch.undo()
    on_disk = dcp.read_metadata(path)
    assert got == on_disk
    assert got.storage_meta.save_id == on_disk.storage_meta.save_id
    assert sorted(got.state_dict_metadata) == ["step", "w"]


def test_a_save_waits_for_this_processs_async_saves_to_its_directory(
        tmp_path, monkeypatch):
    """dcp.save into a directory an async_save of this process still
    writes waits for it (its lock would refuse the save) and lands after
    it, however the directory is spelled: the checkpoint holds the save's
    values. Held deterministically: the async upload into "ck" blocks in
    a Stateful's state_dict until the save waits."""
    import pathlib
    from dcp import checkpoint as checkpoint_module
    monkeypatch.chdir(tmp_path)
    release = threading.Event()
    r = dcp.async_save({"w": torch.full((4,), 1.0)}, checkpoint_id="ck",
                       async_stager=_HeldUploadStager(release))
    waited = []
    real_wait = concurrent.futures.wait

    def wait(futures, *args, **kwargs):
        waited.append(list(futures))
        release.set()  # the upload may run now
        return real_wait(futures, *args, **kwargs)
    monkeypatch.setattr(checkpoint_module.concurrent.futures, "wait", wait)
    dcp.save({"w": torch.full((4,), 2.0), "g": {"v": torch.zeros(1)}},
             checkpoint_id=pathlib.Path(str(tmp_path)) / "sub" / ".." / "ck")
    monkeypatch.undo()
    assert waited and r.upload_completion in waited[0]
    r.upload_completion.result()
    back = {"w": torch.zeros(4)}
    dcp.load(back, checkpoint_id=str(tmp_path / "ck"),
             planner=dcp.DefaultLoadPlanner(allow_partial_load=True))
    assert torch.equal(back["w"], torch.full((4,), 2.0))
    # Into "other" while its upload still waits for the caller's Future:
    # refused (waiting could never end), and nothing is replaced.
    again = concurrent.futures.Future()

    class Later:
        def stage(self, state_dict):
            return again
    other = str(tmp_path / "other")
    late = dcp.async_save({"w": torch.full((4,), 5.0)},
                          checkpoint_id=other, async_stager=Later())
    with pytest.raises(dcp.CheckpointException,
                       match="is still staging .* wait for its "
                             "staging_completion"):
        dcp.save({"w": torch.full((4,), 6.0)}, checkpoint_id=other + "/")
    again.set_result({"w": torch.full((4,), 5.0)})
    late.upload_completion.result()
    dcp.save({"w": torch.full((4,), 6.0)}, checkpoint_id=other + "/")
    dcp.load(back, checkpoint_id=other)
    assert torch.equal(back["w"], torch.full((4,), 6.0))


def test_a_failed_save_read_and_dropped_keeps_nothing_alive(tmp_path):
    """A failed async_save whose future was read and dropped holds none of
    its state (exit's report of unseen failures keeps messages, not the
    futures or their errors)."""
    import gc
    import weakref
    dcp.save({"w": torch.zeros(2)}, checkpoint_id=str(tmp_path / "taken"))
    kept = []

    class Copy:
        def stage(self, state_dict):
            staged = {k: v.clone() for k, v in state_dict.items()}
            kept.append(weakref.ref(staged["w"]))
            return staged
    for kind in (dcp.AsyncCheckpointerType.THREAD,
                 dcp.AsyncCheckpointerType.PROCESS):
        f = dcp.async_save(
            {"w": torch.ones(1 << 16)}, async_checkpointer_type=kind,
            async_stager=Copy(), storage_writer=dcp.FileSystemWriter(
                str(tmp_path / "taken"), overwrite=False))
        assert isinstance(f.exception(), dcp.CheckpointExistsError)
        del f
    gc.collect()
    assert [ref() is None for ref in kept] == [True, True]


@pytest.mark.parametrize("second_kind", ["THREAD", "PROCESS"])
def test_async_saves_of_different_lanes_into_one_directory_keep_call_order(
        tmp_path, monkeypatch, second_kind):
    """An async_save into a directory that an earlier async_save of this
    process still writes through another queue (here a stager of the
    caller's, whose upload is held open) waits for it: the later call's
    checkpoint is the one left, and neither fails on the other's lock
    (before, the later one could commit first and be replaced, or be
    refused)."""
    async_module = importlib.import_module("dcp.async_save")
    ckpt = str(tmp_path / "ck")
    release = threading.Event()
    blocked = threading.Event()  # the second call waits, or has finished

    real_wait = getattr(async_module, "_wait_in_flight", None)

    def noting_wait(*args, **kwargs):  # the second call, before its wait
        blocked.set()
        return real_wait(*args, **kwargs)
    monkeypatch.setattr(async_module, "_wait_in_flight", noting_wait,
                        raising=False)
    first = dcp.async_save({"w": torch.full((64,), 1.0)}, checkpoint_id=ckpt,
                           async_stager=_HeldUploadStager(release))
    blocked.clear()  # (the first call passed there too)
    outcome = {}

    def second():
        try:
            outcome["r"] = dcp.async_save(
                {"w": torch.full((64,), 2.0), "g": {"v": torch.zeros(1)}},
                checkpoint_id=ckpt,
                async_checkpointer_type=getattr(dcp.AsyncCheckpointerType,
                                                second_kind)).result(WAIT)
        except BaseException as e:  # noqa: BLE001 - asserted below
            outcome["e"] = e
        finally:
            blocked.set()
    t = threading.Thread(target=second)
    t.start()
    assert blocked.wait(WAIT)
    release.set()
    first.upload_completion.result(WAIT)
    t.join(WAIT)
    assert "e" not in outcome, outcome.get("e")
    back = {"w": torch.zeros(64), "g": {"v": torch.ones(1)}}
    dcp.load(back, checkpoint_id=ckpt)
    assert torch.equal(back["w"], torch.full((64,), 2.0))
    assert torch.equal(back["g"]["v"], torch.zeros(1))


@pytest.mark.parametrize("kind", ["THREAD", "PROCESS"])
def test_a_save_that_would_wait_behind_a_callers_pending_stager_raises(
        tmp_path, kind):
    """The uploads of stagers of the caller's run one after another: an
    async_save (of another queue) into D that would wait for such an
    upload into D, itself queued behind one into D0 whose stager Future
    the caller has not completed, raises at once (waiting would wait for
    the caller itself); once that Future is done, saves into D go on."""
    d0, d = str(tmp_path / "d0"), str(tmp_path / "d")
    later = concurrent.futures.Future()

    class Lazy:
        def stage(self, sd):
            return later

    class Eager:
        def stage(self, sd):
            done = concurrent.futures.Future()
            done.set_result({k: v.clone() for k, v in sd.items()})
            return done

    r0 = dcp.async_save({"w": torch.ones(16)}, checkpoint_id=d0,
                        async_stager=Lazy())
    r1 = dcp.async_save({"w": torch.ones(16)}, checkpoint_id=d,
                        async_stager=Eager())
    outcome = {}

    def third():
        try:
            outcome["r"] = dcp.async_save(
                {"w": torch.zeros(16)}, checkpoint_id=d,
                async_checkpointer_type=getattr(dcp.AsyncCheckpointerType,
                                                kind))
        except BaseException as e:  # noqa: BLE001 - asserted below
            outcome["e"] = e
    t = threading.Thread(target=third, daemon=True)
    t.start()
    t.join(WAIT)
    later.set_result({"w": torch.full((16,), 3.0)})  # unblocks a hang too
    assert not t.is_alive()
    assert isinstance(outcome.get("e"), dcp.CheckpointException), outcome
    assert "queued behind another whose stager's Future is not done" in \
        str(outcome["e"])
    r0.upload_completion.result(WAIT)
    r1.upload_completion.result(WAIT)
    dcp.async_save({"w": torch.full((16,), 2.0)}, checkpoint_id=d,
                   async_checkpointer_type=getattr(dcp.AsyncCheckpointerType,
                                                   kind)).result(WAIT)
    back = {"w": torch.zeros(16)}
    dcp.load(back, checkpoint_id=d)
    assert torch.equal(back["w"], torch.full((16,), 2.0))
