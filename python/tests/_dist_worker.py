"""One rank of test_distributed.py's multi-process jobs (torch.distributed
over gloo, rendezvous through a FileStore).

    python _dist_worker.py SCENARIO RANK WORLD STORE_FILE CKPT_DIR

Exits 0 when every check of the scenario passed; prints the failure
otherwise.
"""

import faulthandler
import gc
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import (DTensor, Replicate, Shard,  # noqa: E402
                                      distribute_tensor)

import dcp  # noqa: E402

WAIT = 120


def full_tensors():
    """The global tensors every scenario saves or checks (deterministic)."""
    g = torch.Generator().manual_seed(1234)
    return {
        "w": torch.randn(13, 7, generator=g),  # uneven row split
        "b": torch.arange(10, dtype=torch.int64),
        "e": torch.randn(9, 4, generator=g).to(torch.bfloat16),
        "v": torch.arange(35, dtype=torch.float64).view(7, 5),
        "r": torch.randn(6, generator=g),  # replicated everywhere
    }


def rows(n, rank, world):
    """This rank's [start, stop) of n rows split as evenly as possible."""
    base, extra = divmod(n, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def sharded_state(mesh, full, rank, world, placements):
    """The model state as DTensors with `placements` on `mesh`, plus one
    tensor sharded with the dcp.ShardedTensor wrapper."""
    a, b = rows(7, rank, world)
    return {
        "model": {
            "w": distribute_tensor(full["w"], mesh, placements),
            "b": distribute_tensor(full["b"], mesh, [Shard(0)]),  # 1-d
            "e": distribute_tensor(full["e"], mesh, placements),
            "r": distribute_tensor(full["r"], mesh, [Replicate()]),
        },
        "v": dcp.ShardedTensor(full["v"][a:b].clone(), (7, 5), (a, 0)),
        "step": 11,
        "cfg": {"name": "run", "sizes": (13, 10)},
    }


def blank_like(state):
    """Zeroed copies with the same sharding."""
    def blank(v):
        if isinstance(v, DTensor):
            return DTensor.from_local(torch.zeros_like(v.to_local()),
                                      v.device_mesh, v.placements,
                                      shape=v.shape, stride=v.stride())
        if isinstance(v, dcp.ShardedTensor):
            return dcp.ShardedTensor(torch.zeros_like(v.local),
                                     v.global_shape, v.offsets)
        if isinstance(v, dict):
            return {k: blank(x) for k, x in v.items()}
        if isinstance(v, tuple):
            return tuple(0 for _ in v)
        if isinstance(v, str):
            return ""
        if isinstance(v, int):
            return 0
        raise TypeError(type(v))
    return blank(state)


def check(state, full):
    for name in ("w", "b", "e", "r"):
        got = state["model"][name].full_tensor()
        assert torch.equal(got, full[name]), name
    v = state["v"]
    a = v.offsets[0]
    assert torch.equal(v.local, full["v"][a:a + v.local.shape[0]]), "v"
    assert state["step"] == 11
    assert state["cfg"] == {"name": "run", "sizes": (13, 10)}


class Exploding:
    """A Stateful whose state_dict() raises on one rank."""

    def __init__(self, rank, bad_rank):
        self.rank, self.bad_rank = rank, bad_rank

    def state_dict(self):
        if self.rank == self.bad_rank:
            raise RuntimeError(f"rank {self.rank} exploded")
        return {"x": torch.ones(2)}

    def load_state_dict(self, sd):
        pass


def strided_scenario(rank, world, ckpt):
    """4 ranks, a 2x2 ("dp", "tp") mesh: FSDP2 over TP's placements
    [_StridedShard(0, split_factor=2), Shard(0)] save and load back exact
    values; DTensors whose local tensors are not the box their placements
    give this rank raise naming the key, on save and on load; an async_op
    redistribute's result saves its values."""
    from torch.distributed.tensor.placement_types import _StridedShard
    assert world == 4
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp, tp = mesh.get_local_rank("dp"), mesh.get_local_rank("tp")
    fsdp_tp = [_StridedShard(0, split_factor=2), Shard(0)]

    def fsdp_over_tp(full, zero=False):
        # What FSDP2 builds over TP(Shard(0)): the tp chunk's dp chunk.
        local = full.chunk(2, dim=0)[tp].chunk(2, dim=0)[dp].clone()
        if zero:
            local.zero_()
        return DTensor.from_local(local, mesh, fsdp_tp, shape=full.shape,
                                  stride=full.stride(), run_check=False)

    even = torch.arange(24.).reshape(8, 3)
    uneven = torch.arange(14, dtype=torch.float64).reshape(7, 2)
    path = os.path.join(ckpt, "strided")
    dcp.save({"even": fsdp_over_tp(even), "uneven": fsdp_over_tp(uneven)},
             checkpoint_id=path)
    md = dcp.read_metadata(path)
    chunks = md.state_dict_metadata["even"].chunks
    offsets = sorted(c.offsets[0] for c in chunks)
    assert offsets == [0, 2, 4, 6], offsets
    whole = {"even": torch.zeros(8, 3),
             "uneven": torch.zeros(7, 2, dtype=torch.float64)}
    dcp.load(whole, checkpoint_id=path)
    assert torch.equal(whole["even"], even), whole["even"]
    assert torch.equal(whole["uneven"], uneven), whole["uneven"]
    back = {"even": fsdp_over_tp(even, zero=True),
            "uneven": fsdp_over_tp(uneven, zero=True)}
    dcp.load(back, checkpoint_id=path)
    for k, full in (("even", even), ("uneven", uneven)):
        want = full.chunk(2, dim=0)[tp].chunk(2, dim=0)[dp]
        assert torch.equal(back[k].to_local(), want), (k, back[k])

    def raises(fn, *words):
        try:
            fn()
        except dcp.CheckpointException as e:
            for w in words:
                assert w in str(e), str(e)
        else:
            raise AssertionError(f"no error naming {words}")

    # Local shapes that are not DTensor's torch.chunk split of 8 rows
    # (3 + 1 + 3 + 1 instead of 2 each): save and load both refuse.
    n_rows = 3 if rank % 2 == 0 else 1
    odd = DTensor.from_local(torch.zeros(n_rows, 3), mesh,
                             [Shard(0), Shard(0)], shape=(8, 3),
                             stride=(3, 1), run_check=False)
    raises(lambda: dcp.save({"odd": odd, "w": torch.ones(2)},
                            checkpoint_id=os.path.join(ckpt, "odd")),
           "'odd'", "local tensor has shape")
    raises(lambda: dcp.load({"even": odd}, checkpoint_id=path),
           "'even'", "local tensor has shape")
    assert torch.equal(odd.to_local(), torch.zeros(n_rows, 3))
    # [Shard(0), _StridedShard(0, 2)] gives every rank rows {i, i + 2}:
    # not one box.
    gapped = DTensor.from_local(torch.zeros(2, 3), mesh,
                                [Shard(0), _StridedShard(0, split_factor=2)],
                                shape=(8, 3), stride=(3, 1), run_check=False)
    raises(lambda: dcp.save({"gapped": gapped},
                            checkpoint_id=os.path.join(ckpt, "gapped")),
           "'gapped'", "not one contiguous range")
    # An async_op redistribute's local tensor is an AsyncCollectiveTensor
    # (no storage until waited for): saved once its collective is done.
    from torch.distributed._functional_collectives import \
        AsyncCollectiveTensor
    pending = distribute_tensor(even, mesh, [Shard(0), Shard(1)]).redistribute(
        mesh, [Replicate(), Replicate()], async_op=True)
    assert isinstance(pending.to_local(), AsyncCollectiveTensor)
    dcp.save({"r": pending}, checkpoint_id=os.path.join(ckpt, "async"))
    got = {"r": torch.zeros(8, 3)}
    dcp.load(got, checkpoint_id=os.path.join(ckpt, "async"))
    assert torch.equal(got["r"], even), got["r"]


def dropped_group_scenario(rank, world, ckpt):
    """A dcp.ProcessGroup the caller closes or drops while an async_save
    still uploads through it: close() refuses, and dropping it leaves the
    save its store callbacks. Rank 0's upload is still waiting for the
    other ranks (gated through torch's store) when it drops the group."""
    store = dist.distributed_c10d._get_default_store()

    class Gated:
        """Rank 1's store: the engine's collective keys wait for rank 0's
        go, so rank 0's upload is still running when it drops its group."""

        def set(self, key, value):
            if "/gather/" in key:
                store.wait(["dropped-go"])
            store.set(key, value)

        def __getattr__(self, name):  # get, wait, check, add, delete_key
            return getattr(store, name)

    pg = dcp.ProcessGroup.from_store(store if rank == 0 else Gated(), rank,
                                     world, group_name="dropped")
    resp = dcp.async_save({f"x{rank}": torch.full((1 << 16,), float(rank))},
                          checkpoint_id=os.path.join(ckpt, "dropped"),
                          process_group=pg)
    if rank == 0:
        try:
            pg.close()
        except dcp.CheckpointException as e:
            assert e.code_name == "FAILED_PRECONDITION", e
        else:
            raise AssertionError("close() of a group in use returned")
        del pg
        gc.collect()
        store.set("dropped-go", "1")
    resp.result(WAIT)
    back = {f"x{r}": torch.zeros(1 << 16) for r in range(world)}
    dcp.load(back, checkpoint_id=os.path.join(ckpt, "dropped"), no_dist=True)
    for r in range(world):
        assert torch.equal(back[f"x{r}"], torch.full((1 << 16,), float(r)))


def group_timeout_scenario(rank, world, ckpt):
    """A group's `timeout=` (torch's new_group here) bounds dcp's waits on
    it: rank 0's second save, which the other ranks skip, fails naming
    them once that timeout passes (dcp's own default is 5 minutes)."""
    import datetime
    timeout = datetime.timedelta(seconds=8)
    group = dist.new_group(list(range(world)), timeout=timeout)
    state = {f"x{rank}": torch.full((4,), float(rank))}
    dcp.save(state, checkpoint_id=os.path.join(ckpt, "first"),
             process_group=group)
    store = dist.distributed_c10d._get_default_store()
    if rank != 0:
        store.wait(["timeout-done"], datetime.timedelta(seconds=120))
        return
    try:
        dcp.save(state, checkpoint_id=os.path.join(ckpt, "second"),
                 process_group=group)
    except dcp.CheckpointTimeoutError as e:
        absent = list(range(1, world))
        assert sorted(e.failures) == absent, e.failures
        assert f"rank(s) {absent}" in str(e), e
        assert f"({timeout})" in str(e), e
    else:
        raise AssertionError("a save that other ranks skipped returned")
    finally:
        store.set("timeout-done", "1")


def process_groups_scenario(rank, world, ckpt):
    """PROCESS async_saves on torch subgroups, 3 ranks: group [0, 1] saves
    A, then group [0, 2] saves B (rank 0's writer process joins a writers'
    group of each: they were one, and B hung); rank 2 passing [0, 1] is
    refused as torch refuses it; then a save of [0, 1] whose staging fails
    on rank 1 fails on rank 0 too, naming rank 1, at once (rank 0's writer
    waited in the writers' group until its timeout)."""
    import datetime
    from dcp import _process_writer
    timeout = datetime.timedelta(seconds=100)
    g01 = dist.new_group([0, 1], timeout=timeout)
    g02 = dist.new_group([0, 2], timeout=timeout)
    proc = dcp.AsyncCheckpointerType.PROCESS
    mine = {f"x{rank}": torch.full((4,), float(rank + 1))}

    def saved(path, ranks):
        out = {f"x{r}": torch.zeros(4) for r in ranks}
        dcp.load(out, checkpoint_id=path, no_dist=True)
        for r in ranks:
            assert torch.equal(out[f"x{r}"], torch.full((4,), float(r + 1)))

    if rank in (0, 1):
        dcp.async_save(mine, checkpoint_id=os.path.join(ckpt, "a"),
                       process_group=g01,
                       async_checkpointer_type=proc).result(WAIT)
    else:
        try:
            dcp.save(mine, checkpoint_id=os.path.join(ckpt, "x"),
                     process_group=g01)
        except ValueError as e:
            assert "Invalid process group specified" in str(e), e
        else:
            raise AssertionError("a save on a group without this rank")
    if rank in (0, 2):
        dcp.async_save(mine, checkpoint_id=os.path.join(ckpt, "b"),
                       process_group=g02,
                       async_checkpointer_type=proc).result(WAIT)
        saved(os.path.join(ckpt, "b"), (0, 2))
    if rank in (0, 1):
        saved(os.path.join(ckpt, "a"), (0, 1))
        if rank == 1:
            def no_segment(size):
                raise dcp.CheckpointException("no segment (a test)", None,
                                              8)
            _process_writer._pool.acquire = no_segment
        resp = dcp.async_save(mine, checkpoint_id=os.path.join(ckpt, "c"),
                              process_group=g01,
                              async_checkpointer_type=proc)
        try:
            resp.upload_completion.result(WAIT)
        except dcp.CheckpointException as e:
            assert sorted(e.failures) == [1], (rank, e.failures)
            assert "no segment (a test)" in str(e), e
            assert not isinstance(e, dcp.CheckpointTimeoutError), e
        else:
            raise AssertionError("a save that failed on rank 1 returned")
        assert not os.path.exists(os.path.join(ckpt, "c", ".metadata"))


def process_stage_order_scenario(rank, world, ckpt):
    """2 ranks: save N+1 is started from save N's staging done-callback
    (on the stager thread, where N+1 stages at once while N's hand-over
    to the writer is still queued) and fails staging on rank 1 only. N
    succeeds and N+1 fails on both ranks: rank 1's notice of the failure
    reached its writer before N did, which paired different saves across
    the ranks' writers (N+1 committed with N's files)."""
    import threading
    from dcp import _process_writer
    proc = dcp.AsyncCheckpointerType.PROCESS
    mine = {f"x{rank}": torch.full((4,), float(rank + 1))}
    real = _process_writer._pool.acquire
    registered = threading.Event()
    calls = []

    def acquire(size):
        calls.append(size)
        if len(calls) == 1:
            # N stages only once its callback is registered, so the
            # callback runs on the stager thread.
            assert registered.wait(WAIT)
        elif rank == 1:
            raise dcp.CheckpointException("no segment for N+1 (a test)",
                                          None, 8)
        return real(size)

    _process_writer._pool.acquire = acquire
    later = {}
    started = threading.Event()

    def start_next(_):
        later["n1"] = dcp.async_save(
            mine, checkpoint_id=os.path.join(ckpt, "n1"),
            async_checkpointer_type=proc, async_stager=dcp.DefaultStager())
        started.set()

    first = dcp.async_save(mine, checkpoint_id=os.path.join(ckpt, "n"),
                           async_checkpointer_type=proc,
                           async_stager=dcp.DefaultStager())
    first.staging_completion.add_done_callback(start_next)
    registered.set()
    first.upload_completion.result(WAIT)
    assert started.wait(WAIT)
    try:
        later["n1"].upload_completion.result(WAIT)
    except dcp.CheckpointException as e:
        assert "no segment for N+1 (a test)" in str(e), e
        assert sorted(e.failures) == [1], e.failures
    else:
        raise AssertionError("N+1 returned on rank %d" % rank)
    dist.barrier()
    back = {f"x{r}": torch.zeros(4) for r in range(world)}
    dcp.load(back, checkpoint_id=os.path.join(ckpt, "n"), no_dist=True)
    for r in range(world):
        assert torch.equal(back[f"x{r}"], torch.full((4,), float(r + 1)))
    assert not os.path.exists(os.path.join(ckpt, "n1", ".metadata"))


def broadcast_torch_save_scenario(rank, world, mesh, full, path):
    """A torch.save file of the whole tensors (written by the test) loads
    into row- and column-sharded DTensors through the broadcasting reader
    (dcp's and torch's class), read by rank 0 or the last rank; a key the
    file lacks and one rank's wrong shape raise on every rank."""
    from dcp.format_utils import (BroadcastingTorchSaveReader,
                                  DynamicMetaLoadPlanner)
    from torch.distributed.checkpoint import format_utils as torch_formats
    for coordinator, placements in ((0, [Shard(0)]),
                                    (world - 1, [Shard(1)])):
        state = blank_like(sharded_state(mesh, full, rank, world,
                                         placements))
        del state["v"]
        dcp.load(state, checkpoint_id=path,
                 storage_reader=BroadcastingTorchSaveReader(
                     coordinator_rank=coordinator),
                 planner=DynamicMetaLoadPlanner())
        state["v"] = dcp.ShardedTensor(full["v"][:0], (7, 5), (0, 0))
        for name in ("w", "b", "e", "r"):
            got = state["model"][name].full_tensor()
            assert torch.equal(got, full[name]), name
        assert state["step"] == 11 and state["cfg"] == {
            "name": "run", "sizes": (13, 10)}, state
    # torch's reader and planner, as a program written for torch's DCP
    # passes them.
    state = {"model": {"w": distribute_tensor(torch.zeros(13, 7), mesh,
                                              [Shard(0)])}}
    dcp.load(state, checkpoint_id=path,
             storage_reader=torch_formats.BroadcastingTorchSaveReader(),
             planner=torch_formats.DynamicMetaLoadPlanner())
    assert torch.equal(state["model"]["w"].full_tensor(), full["w"])
    missing = {"model": {"w": distribute_tensor(torch.zeros(13, 7), mesh,
                                                [Shard(0)]),
                         "absent": torch.zeros(2)}}
    try:
        dcp.load(missing, checkpoint_id=path,
                 storage_reader=BroadcastingTorchSaveReader())
    except dcp.CheckpointNotFoundError as e:
        assert '"model.absent"' in str(e), str(e)
    else:
        raise AssertionError("the load of a missing key did not fail")
    # Dtypes the gloo backend cannot broadcast travel as bytes.
    extra = {"extra": {"f8": torch.zeros(3, dtype=torch.float8_e4m3fn),
                       "u16": torch.zeros(3, dtype=torch.uint16),
                       "b": torch.zeros(3, dtype=torch.bool),
                       "c": torch.zeros(2, dtype=torch.complex64)}}
    dcp.load(extra, checkpoint_id=path,
             storage_reader=BroadcastingTorchSaveReader())
    got = extra["extra"]
    assert got["f8"].float().tolist() == [1.0, 2.0, 3.0], got
    assert got["u16"].tolist() == [1, 2, 65535], got
    assert got["b"].tolist() == [True, False, True], got
    assert got["c"].tolist() == [1 + 1j, 2 - 1j], got

    class Failing:  # a Stateful whose state_dict() raises on rank 1 only
        def state_dict(self):
            if rank == 1:
                raise RuntimeError("rank 1 cannot say its state")
            return {"w": torch.zeros(13, 7)}

        def load_state_dict(self, sd):
            pass
    try:
        dcp.load({"model": Failing()}, checkpoint_id=path,
                 storage_reader=BroadcastingTorchSaveReader())
    except dcp.CheckpointException as e:
        assert "rank 1 cannot say its state" in str(e), str(e)
    else:
        raise AssertionError("the load with a failing Stateful did not fail")
    # Rank 1 alone asks for another shape: every rank raises, naming it.
    shape = (13, 8) if rank == 1 else (13, 7)
    wrong = {"model": {"w": torch.zeros(shape)}}
    try:
        dcp.load(wrong, checkpoint_id=path,
                 storage_reader=BroadcastingTorchSaveReader())
    except dcp.CheckpointException as e:
        assert "rank 1" in str(e) and "model.w" in str(e), str(e)
        assert list(e.failures) == [1], e.failures
    else:
        raise AssertionError("the load of a wrong shape did not fail")


def submesh_scenario(rank, world, ckpt):
    """DTensors on a mesh of ranks 0 and 1 of a 3-rank world: rank 2,
    outside it, holds none of them (an empty local tensor) and saves and
    loads none; the mesh ranks get every value back."""
    from torch.distributed.device_mesh import DeviceMesh
    mesh = DeviceMesh("cpu", [0, 1])
    full = torch.arange(24.0).view(6, 4)

    def state(fill):
        src = full if fill else torch.zeros(6, 4)
        return {"s": distribute_tensor(src, mesh, [Shard(0)]),
                "c": distribute_tensor(src, mesh, [Shard(1)]),
                "r": distribute_tensor(src, mesh, [Replicate()]),
                "z": distribute_tensor(src[0, 0].clone(), mesh,
                                       [Replicate()])}

    path = os.path.join(ckpt, "submesh")
    md = dcp.save(state(True), checkpoint_id=path)
    assert md.state_dict_metadata["s"].size == (6, 4)
    back = state(False)
    dcp.load(back, checkpoint_id=path)
    for key in ("s", "c", "r", "z"):
        got = back[key].to_local()
        if rank == 2:
            assert got.numel() == 0, (key, got)
        else:
            want = state(True)[key].to_local()
            assert torch.equal(got, want), (key, got, want)
    whole = {"s": torch.zeros(6, 4), "z": torch.zeros(())}
    dcp.load(whole, checkpoint_id=path, no_dist=True)
    assert torch.equal(whole["s"], full) and float(whole["z"]) == 0.0
    # A 0-d one in a list: rank 2 cannot leave its place out; every rank
    # says so.
    listed = {"l": [distribute_tensor(full[0, 1].clone(), mesh,
                                      [Replicate()]), 5]}
    try:
        dcp.save(listed, checkpoint_id=os.path.join(ckpt, "listed"))
    except dcp.CheckpointValueError as e:
        assert list(e.failures) == [2], e.failures
        assert "'l.0': this rank is outside the mesh" in str(e), str(e)
    else:
        raise AssertionError("the save did not fail")


def different_directories_scenario(rank, world, ckpt):
    """Ranks given different checkpoint_ids: every rank raises naming the
    rank whose directory is not the coordinator's, and neither directory
    holds a checkpoint or any file afterwards."""
    ours = os.path.join(ckpt, "shared" if rank != 1 else "other")
    state = {f"x{rank}": torch.full((4,), float(rank))}
    try:
        dcp.save(state, checkpoint_id=ours)
    except dcp.CheckpointException as e:
        assert list(e.failures) == [1], (e.failures, e)
        assert "is not the one the coordinator saves into" in str(e), e
        assert os.path.join(ckpt, "other") in str(e), e
    else:
        raise AssertionError("a save into two directories returned")
    dist.barrier()
    if rank == 0:
        for name in ("shared", "other"):
            assert os.listdir(os.path.join(ckpt, name)) == [], name
    # The same directory for all: saved, and saved over a .metadata that
    # cannot be read (nothing of it is removed, the save replaces it).
    shared = os.path.join(ckpt, "shared")
    dcp.save(state, checkpoint_id=shared)
    dist.barrier()
    if rank == 0:
        with open(os.path.join(shared, ".metadata"), "wb") as f:
            f.write(b"not metadata")
    dist.barrier()
    state[f"x{rank}"].fill_(7.0)
    dcp.save(state, checkpoint_id=shared)
    back = {f"x{rank}": torch.zeros(4)}
    dcp.load(back, checkpoint_id=shared)
    assert torch.equal(back[f"x{rank}"], torch.full((4,), 7.0))
    assert not [n for n in os.listdir(shared) if n.startswith(".dcp-probe")]


def main():
    scenario, rank, world, store, ckpt = sys.argv[1:6]
    if rank == "env":  # under torchrun
        rank, world = os.environ["RANK"], os.environ["WORLD_SIZE"]
    # A hang shows where: every thread's stack, before the harness's kill.
    faulthandler.dump_traceback_later(float(os.environ.get(
        "DCP_TEST_HANG_DUMP_S", "150")), exit=True)
    rank, world = int(rank), int(world)
    if store == "env":  # torchrun's TCPStore
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", init_method=f"file://{store}",
                                rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    full = full_tensors()
    if scenario == "save":
        state = sharded_state(mesh, full, rank, world, [Shard(0)])
        md = dcp.save(state, checkpoint_id=os.path.join(ckpt, "sync"))
        assert md.state_dict_metadata["model.w"].size == (13, 7)
        assert len(md.state_dict_metadata["model.w"].chunks) == world
        assert len(md.state_dict_metadata["model.r"].chunks) == 1
        # Reload in the same job with another sharding (columns).
        other = blank_like(sharded_state(mesh, full, rank, world,
                                         [Shard(1)]))
        dcp.load(other, checkpoint_id=os.path.join(ckpt, "sync"))
        check(other, full)
        # Rank-local checkpoints (no plan exchange), reloaded by the same
        # ranks; and the seed's save_state_dict with rank 1 coordinating.
        local = os.path.join(ckpt, "local")
        dcp.save(state, checkpoint_id=local, use_collectives=False)
        back = blank_like(sharded_state(mesh, full, rank, world, [Shard(0)]))
        dcp.load(back, checkpoint_id=local)
        check(back, full)
        # A list of plain values takes this rank's saved length there too.
        local_lists = os.path.join(ckpt, "local_lists")
        dcp.save({"h": [rank] * (3 + rank)}, checkpoint_id=local_lists,
                 use_collectives=False)
        history = {"h": []}
        dcp.load(history, checkpoint_id=local_lists)
        assert history == {"h": [rank] * (3 + rank)}, history
        writer = dcp.FileSystemWriter(os.path.join(ckpt, "coord1"))
        dcp.save_state_dict(state, writer, coordinator_rank=1)
        back = blank_like(sharded_state(mesh, full, rank, world, [Shard(1)]))
        dcp.load_state_dict(back, dcp.FileSystemReader(
            os.path.join(ckpt, "coord1")), coordinator_rank=1)
        check(back, full)
        # async_save THREAD, then PROCESS, from every rank.
        resp = dcp.async_save(state, checkpoint_id=os.path.join(ckpt, "thr"))
        resp.upload_completion.result(WAIT)
        resp = dcp.async_save(
            state, checkpoint_id=os.path.join(ckpt, "proc"),
            async_checkpointer_type=dcp.AsyncCheckpointerType.PROCESS)
        resp.upload_completion.result(WAIT)
        for sub in ("thr", "proc"):
            back = blank_like(sharded_state(mesh, full, rank, world,
                                            [Shard(0)]))
            dcp.load(back, checkpoint_id=os.path.join(ckpt, sub))
            check(back, full)
        # A rank that raises before its save: every rank raises, and the
        # others free the C state dict they had prepared.
        bad = 1
        freed = []
        real_free = dcp.checkpoint._Prepared.free

        def counting_free(prepared):
            if prepared.sd is not None:
                freed.append(prepared.sd)
            real_free(prepared)

        dcp.checkpoint._Prepared.free = counting_free
        try:
            dcp.save({"x": Exploding(rank, bad), "y": torch.ones(3)},
                     checkpoint_id=os.path.join(ckpt, "bad"))
        except dcp.CheckpointException as e:
            dcp.checkpoint._Prepared.free = real_free
            assert rank == bad or len(freed) == 1, freed
            assert list(e.failures) == [bad], e.failures
            assert f"rank {bad} exploded" in str(e), str(e)
            if rank == bad:
                assert isinstance(e.__cause__, RuntimeError)
        else:
            raise AssertionError("the save did not fail")
        assert not os.path.exists(os.path.join(ckpt, "bad", ".metadata"))
        # The group still works after the failure.
        dcp.save({"ok": torch.full((2,), float(rank))},
                 checkpoint_id=os.path.join(ckpt, f"after-rank{rank}"),
                 no_dist=True)
        dcp.save({"x": torch.ones(3)},
                 checkpoint_id=os.path.join(ckpt, "after_all"))
    elif scenario == "load":
        state = blank_like(sharded_state(mesh, full, rank, world,
                                         [Shard(0)]))
        dcp.load(state, checkpoint_id=os.path.join(ckpt, "sync"))
        check(state, full)
        state = blank_like(sharded_state(mesh, full, rank, world,
                                         [Shard(1)]))
        dcp.load(state, checkpoint_id=os.path.join(ckpt, "proc"))
        check(state, full)
        # Save again from this sharding, through the writer process (its
        # group reaches torchrun's TCPStore by address), and reload.
        resp = dcp.async_save(
            state, checkpoint_id=os.path.join(ckpt, "proc2"),
            async_checkpointer_type=dcp.AsyncCheckpointerType.PROCESS)
        resp.upload_completion.result(WAIT)
        back = blank_like(sharded_state(mesh, full, rank, world,
                                        [Shard(0)]))
        dcp.load(back, checkpoint_id=os.path.join(ckpt, "proc2"))
        check(back, full)
        # A shape mismatch on every rank: every rank raises, naming it.
        wrong = {"model": {"w": distribute_tensor(torch.zeros(13, 8), mesh,
                                                  [Shard(0)])}}
        try:
            dcp.load(wrong, checkpoint_id=os.path.join(ckpt, "sync"))
        except dcp.CheckpointValueError as e:
            assert "model.w" in str(e), str(e)
        else:
            raise AssertionError("the load did not fail")
    elif scenario == "strided":
        strided_scenario(rank, world, ckpt)
    elif scenario == "dropped_group":
        dropped_group_scenario(rank, world, ckpt)
    elif scenario == "group_timeout":
        group_timeout_scenario(rank, world, ckpt)
    elif scenario == "different_directories":
        different_directories_scenario(rank, world, ckpt)
    elif scenario == "broadcast_torch_save":
        broadcast_torch_save_scenario(rank, world, mesh, full, ckpt)
    elif scenario == "submesh":
        submesh_scenario(rank, world, ckpt)
    elif scenario == "process_groups":
        process_groups_scenario(rank, world, ckpt)
    elif scenario == "process_stage_order":
        process_stage_order_scenario(rank, world, ckpt)
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}: ok", flush=True)


if __name__ == "__main__":
    main()
