"""The store meeting before a distributed save/load (dcp.process_group):
a rank that fails in Python makes every rank raise CheckpointException,
and later rounds work. Ranks are threads over one HashStore here; the
multi-process test covers it end to end."""

import ctypes
import threading

import pytest
import torch.distributed as dist

import dcp
from dcp.process_group import ProcessGroup


def _groups(n, store):
    groups = []
    for rank in range(n):
        g = ProcessGroup(ctypes.c_void_p(), rank, n, "test-agree",
                         store=store)
        g._instance = 0  # as if each were the first group of its process
        groups.append(g)
    return groups


def _round(groups, errors):
    results = [None] * len(groups)

    def run(rank):
        try:
            groups[rank].agree("save", errors.get(rank))
            results[rank] = "ok"
        except BaseException as e:  # noqa: B902 - recorded for the test
            results[rank] = e

    threads = [threading.Thread(target=run, args=(r,)) for r in
               range(len(groups))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def test_one_failing_rank_fails_every_rank():
    groups = _groups(3, dist.HashStore())
    assert _round(groups, {}) == ["ok"] * 3
    boom = TypeError("cannot save 'x'")
    results = _round(groups, {1: boom})
    for rank, r in enumerate(results):
        assert isinstance(r, dcp.CheckpointValueError), r  # TypeError -> 3
        assert list(r.failures) == [1]
        assert "rank 1: TypeError: cannot save 'x'" in str(r)
    assert results[1].__cause__ is boom
    assert results[1].failures[1][0] is boom
    assert isinstance(results[0].failures[1][0], dcp.CheckpointException)
    # Two failing ranks, then a clean round again.
    results = _round(groups, {0: RuntimeError("a"), 2: RuntimeError("b")})
    assert all(sorted(r.failures) == [0, 2] for r in results)
    assert _round(groups, {}) == ["ok"] * 3


@pytest.mark.parametrize("kind", ["hash", "file"])
def test_ranks_that_never_come_are_named(kind, tmp_path):
    """A rank that never reaches the meeting (exited, or skipped the call)
    is named, as a CheckpointTimeoutError with an entry in `failures`,
    when the group's timeout ends the wait."""
    import datetime
    store = dist.HashStore() if kind == "hash" else dist.FileStore(
        str(tmp_path / "fs"), 1)
    groups = _groups(3, store)
    for g in groups:
        g.timeout = datetime.timedelta(milliseconds=300)
    results = _round(groups[:2], {1: ValueError("bad value 'x'")})
    for rank, r in enumerate(results):
        assert isinstance(r, dcp.CheckpointTimeoutError), r
        assert isinstance(r, TimeoutError)
        assert sorted(r.failures) == [1, 2], r.failures
        assert isinstance(r.failures[2][0], dcp.CheckpointTimeoutError)
        assert "save: rank(s) [2] of the checkpoint group 'test-agree' " \
            "(size 3) did not come" in str(r)
        assert f"rank {rank} waited" in str(r)
    assert results[1].failures[1][0].args[0] == "bad value 'x'"
    assert "rank 1: ValueError: bad value 'x'" in str(results[1])


def test_the_agreed_exception_keeps_the_first_failures_builtin_class(
        tmp_path):
    """One process raises TypeError for a value it cannot save; in a group
    every rank raises the agreed CheckpointValueError (its code), which is
    then also a TypeError, so `except TypeError` keeps working once the
    job is distributed. The same for the first failing rank's other
    built-in classes; the message, code and failures stay."""
    import pickle
    from dcp import _lib
    groups = _groups(3, dist.HashStore())
    boom = TypeError("cannot save 'x'")
    results = _round(groups, {1: boom})
    for rank, r in enumerate(results):
        assert isinstance(r, dcp.CheckpointValueError), r
        assert isinstance(r, TypeError), type(r).__mro__
        assert type(r).__name__ == "CheckpointValueError"
        assert r.code == _lib.INVALID_ARGUMENT
        assert str(r) == ("save failed on rank(s) [1]: rank 1: TypeError: "
                          "cannot save 'x'")
        assert list(r.failures) == [1]
        assert isinstance(r.failures[1][0], TypeError)
    assert results[1].failures[1][0] is boom
    again = pickle.loads(pickle.dumps(results[0]))
    assert type(again) is type(results[0]) and str(again) == str(results[0])
    assert again.code == _lib.INVALID_ARGUMENT
    assert isinstance(again.failures[1][0], TypeError)
    # The lowest failing rank's class: a KeyError (code UNKNOWN) on rank 0.
    results = _round(groups, {0: KeyError("k"), 2: ValueError("v")})
    for r in results:
        assert isinstance(r, dcp.CheckpointException), r
        assert isinstance(r, KeyError) and not isinstance(r, ValueError)
        assert r.code == _lib.UNKNOWN
        assert str(r) == ("save failed on rank(s) [0, 2]: rank 0: KeyError: "
                          "'k'; rank 2: ValueError: v")
        assert isinstance(r.failures[2][0], ValueError)
    # A load of a file on one rank: every rank's is dcp's
    # CheckpointFileNotFoundError (a FileNotFoundError), as in one process.
    blocker = tmp_path / "model.pt"
    blocker.write_bytes(b"x")
    results = _round(groups, {
        1: dcp.errors.file_in_the_way(str(blocker), "load")})
    for r in results:
        assert type(r) is dcp.CheckpointFileNotFoundError, type(r).__mro__
    # A class of the program's own: its built-in base (ValueError) is
    # already the agreed class's.
    class Mine(ValueError):
        pass
    results = _round(groups, {2: Mine("m")})
    for r in results:
        assert type(r) is dcp.CheckpointValueError, type(r).__mro__
    assert _round(groups, {}) == ["ok"] * 3


def test_single_rank_reraises_the_error_itself():
    (g,) = _groups(1, dist.HashStore())
    with pytest.raises(KeyError):
        g.agree("load", KeyError("k"))
    g.agree("load", None)


@pytest.mark.parametrize("kind", ["hash", "file"])
def test_store_bridge_callbacks(kind, tmp_path):
    """The dcp_store_t handed to the library: set, get (waiting, and
    timing out as DEADLINE_EXCEEDED), remove; errors become codes."""
    from dcp import _lib
    from dcp.process_group import _StoreBridge
    store = dist.HashStore() if kind == "hash" else dist.FileStore(
        str(tmp_path / "fs"), 1)
    bridge = _StoreBridge(store)
    s = bridge.struct
    assert s.struct_size == ctypes.sizeof(_lib.Store)
    assert s.set(None, b"g/key", b"va\0lue", 6) == _lib.OK
    got = []
    sink = _lib.SINK_FN(lambda ctx, data, size:
                        got.append(ctypes.string_at(data, size)))
    assert s.get(None, b"g/key", 1000, sink, None) == _lib.OK
    assert got == [b"va\0lue"] and store.get("g/key") == b"va\0lue"
    assert s.get(None, b"g/missing", 50, sink, None) == \
        _lib.DEADLINE_EXCEEDED
    assert s.get(None, b"g/missing", 0, sink, None) == _lib.DEADLINE_EXCEEDED
    assert s.remove(None, b"g/key") == _lib.OK
    assert not store.check(["g/key"])
    assert s.set(None, b"\xff\xfe", b"x", 1) == _lib.UNAVAILABLE  # bad UTF-8


def test_turns_run_in_call_order_and_nest():
    """Operations on one group run in the order their turns were taken
    (an upload taken first runs first, whichever thread gets there first);
    a turn taken inside a held one never waits; a turn ended unrun does
    not hold later ones back."""
    from dcp.process_group import Turn
    group = object()
    log = []
    first, unrun, second = Turn(group), Turn(group), Turn(group)
    unrun.end()
    entered = threading.Event()

    def later():
        entered.set()
        with second:
            log.append("second")

    thread = threading.Thread(target=later)
    thread.start()
    entered.wait()
    with first:
        with Turn(group):  # nested: the held turn covers it
            log.append("nested")
        log.append("first")
    thread.join()
    assert log == ["nested", "first", "second"]
    # Every turn ended: the group starts afresh.
    with Turn(group):
        log.append("fresh")
    assert log[-1] == "fresh"


def test_an_interrupted_wait_ends_its_turn(monkeypatch):
    """Ctrl-C while a save waits for its turn (behind an upload) ends that
    turn: the next operation on the group does not wait for it forever."""
    from dcp import process_group
    group = object()
    running = process_group.Turn(group)
    interrupted = process_group.Turn(group)
    real_wait = process_group._turns.wait

    def interrupt(g, n):
        raise KeyboardInterrupt

    with running:
        monkeypatch.setattr(process_group._turns, "wait", interrupt)
        with pytest.raises(KeyboardInterrupt):
            with interrupted:
                pass
        monkeypatch.setattr(process_group._turns, "wait", real_wait)
    done = threading.Event()

    def later():
        with process_group.Turn(group):
            done.set()

    thread = threading.Thread(target=later, daemon=True)
    thread.start()
    assert done.wait(60), "the interrupted turn still holds the group"
    thread.join()


_FROM_ENV_RANK = r'''
import datetime, os, sys
import torch
import dcp

class Exploding:
    def __init__(self, rank):
        self.rank = rank
    def state_dict(self):
        if self.rank == 1:
            raise RuntimeError("rank 1 exploded")
        return {"x": torch.ones(2)}
    def load_state_dict(self, sd):
        pass

ckpt = sys.argv[1]
rank = int(os.environ["DCP_RANK"])
group = dcp.ProcessGroup.from_env(timeout=datetime.timedelta(seconds=120))
try:
    dcp.save({"s": Exploding(rank)}, checkpoint_id=ckpt + "/bad",
             process_group=group)
    print("saved")
except dcp.CheckpointException as e:
    # The agreed class is also the failing rank's built-in, RuntimeError.
    print("failed", type(e).__name__, sorted(e.failures),
          "rank 1 exploded" in str(e), isinstance(e, RuntimeError),
          isinstance(e.failures[1][0], RuntimeError), flush=True)
# The group's next operations still pair up.
mine = {f"w{rank}": torch.full((2,), float(rank))}
dcp.save(mine, checkpoint_id=ckpt + "/good", process_group=group)
back = {f"w{rank}": torch.zeros(2)}
dcp.load(back, checkpoint_id=ckpt + "/good", process_group=group)
assert torch.equal(back[f"w{rank}"], mine[f"w{rank}"])
print("ok", flush=True)
'''


def test_from_env_group_agrees_through_the_engine(tmp_path):
    """A group from the environment has no Python store: a rank that fails
    in Python before the save meets the others through the engine
    (dcp_process_group_agree), and every rank raises naming it, instead
    of the others waiting in the save until the group's timeout."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, DCP_WORLD_SIZE="2", DCP_JOB_ID="agree-test",
               DCP_RENDEZVOUS=str(tmp_path / "rendezvous"),
               OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(
                   [os.path.dirname(os.path.dirname(os.path.abspath(
                       __file__)))] + [os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen(
        [sys.executable, "-c", _FROM_ENV_RANK, str(tmp_path / "ckpt")],
        env=dict(env, DCP_RANK=str(rank)), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT) for rank in range(2)]
    outputs = []
    for p in procs:
        try:
            outputs.append(p.communicate(timeout=240)[0].decode())
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            outputs.append(p.communicate()[0].decode())
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out
        assert "failed CheckpointException [1] True True True" in out, out
        assert "ok" in out.splitlines()[-1], out
