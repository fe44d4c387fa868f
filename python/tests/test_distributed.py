"""Multi-process saves and loads under torch.distributed (gloo):
row-sharded DTensors and dcp.ShardedTensor chunks saved by 3 ranks
(FileStore rendezvous), reloaded with other shardings by the same 3 ranks,
by 2 ranks under torchrun (its TCPStore, no other setup) and by one
process, every value checked; a rank that raises makes every rank raise.
The ranks run _dist_worker.py as subprocesses."""

import os
import subprocess
import sys

import pytest
import torch

import dcp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _dist_worker import full_tensors  # noqa: E402

TIMEOUT = 240  # bounds a hang


def _run(scenario, world, tmp_path, ckpt, torchrun=False):
    """Runs `world` ranks of _dist_worker.py: each its own process over a
    FileStore, or (torchrun) one torchrun job, ranks meeting at its
    TCPStore with no other setup."""
    store = str(tmp_path / f"store-{scenario}-{world}")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    worker = os.path.join(HERE, "_dist_worker.py")
    if torchrun:
        cmds = [[sys.executable, "-m", "torch.distributed.run",
                 "--standalone", f"--nproc-per-node={world}", worker,
                 scenario, "env", "env", "env", ckpt]]
    else:
        cmds = [[sys.executable, worker, scenario, str(rank), str(world),
                 store, ckpt] for rank in range(world)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, env=env)
             for cmd in cmds]
    outputs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out = p.communicate()[0]
        outputs.append(out.decode(errors="replace"))
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, f"{scenario}:\n{out[-6000:]}"
    text = "".join(outputs)
    for rank in range(world):
        assert f"rank {rank}: ok" in text, text[-6000:]


def test_sharded_save_and_reshard(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    _run("save", 3, tmp_path, ckpt)
    _run("load", 2, tmp_path, ckpt, torchrun=True)
    # One process reads the whole tensors back (no torch.distributed).
    full = full_tensors()
    for sub in ("sync", "thr", "proc"):
        state = {"model": {k: torch.zeros_like(full[k])
                           for k in ("w", "b", "e", "r")},
                 "v": torch.zeros(7, 5, dtype=torch.float64), "step": 0,
                 "cfg": {"name": "", "sizes": (0, 0)}}
        dcp.load(state, checkpoint_id=os.path.join(ckpt, sub))
        for k in ("w", "b", "e", "r"):
            assert torch.equal(state["model"][k], full[k]), (sub, k)
        assert torch.equal(state["v"], full["v"])
        assert state["step"] == 11
        assert state["cfg"] == {"name": "run", "sizes": (13, 10)}
    md = dcp.read_metadata(os.path.join(ckpt, "sync"))
    chunks = md.state_dict_metadata["model.w"].chunks
    # DTensor's Shard(0) splits 13 rows as torch.chunk does: 5, 5, 3.
    assert [c.offsets for c in chunks] == [(0, 0), (5, 0), (10, 0)]
    assert [c.sizes for c in chunks] == [(5, 7), (5, 7), (3, 7)]


def test_strided_shard_fsdp_over_tp(tmp_path):
    """FSDP2 over TP's [_StridedShard(0, 2), Shard(0)] on a 2x2 mesh (4
    ranks) round-trips; local shapes other than DTensor's split raise."""
    placement_types = __import__("torch.distributed.tensor.placement_types",
                                 fromlist=["_StridedShard"])
    if not hasattr(placement_types, "_StridedShard"):
        pytest.skip("this torch has no _StridedShard")
    _run("strided", 4, tmp_path, str(tmp_path / "ckpt"))


def test_dtensors_of_a_mesh_some_ranks_are_outside_of(tmp_path):
    _run("submesh", 3, tmp_path, str(tmp_path / "ckpt"))


def test_a_torch_save_file_loads_into_dtensors_by_broadcast(tmp_path):
    """format_utils.BroadcastingTorchSaveReader: 3 ranks load a model
    saved whole with torch.save into DTensors sharded by rows and by
    columns (a bf16 tensor saved as fp32: converted)."""
    full = full_tensors()
    path = str(tmp_path / "model.pt")
    torch.save({"model": {"w": full["w"], "b": full["b"],
                          "e": full["e"].float(), "r": full["r"]},
                "step": 11, "cfg": {"name": "run", "sizes": (13, 10)},
                "extra": {
                    "f8": torch.tensor([1.0, 2.0, 3.0]).to(
                        torch.float8_e4m3fn),
                    "u16": torch.tensor([1, 2, 65535], dtype=torch.uint16),
                    "b": torch.tensor([True, False, True]),
                    "c": torch.tensor([1 + 1j, 2 - 1j],
                                      dtype=torch.complex64)}},
               path)
    full_e = full["e"]
    assert torch.equal(full["e"].float().to(torch.bfloat16), full_e)
    _run("broadcast_torch_save", 3, tmp_path, path)


def test_a_group_dropped_during_an_async_save(tmp_path):
    _run("dropped_group", 2, tmp_path, str(tmp_path / "ckpt"))


_LAUNCHER_VARIABLES = ("DCP_RANK", "DCP_WORLD_SIZE", "RANK", "WORLD_SIZE",
                       "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")


def _alone_warnings(record):
    return [w for w in record if issubclass(w.category, UserWarning)
            and "dcp.ProcessGroup.from_env()" in str(w.message)]


def test_a_rank_of_several_without_a_group_warns_it_runs_alone(
        tmp_path, monkeypatch):
    # torchrun sets RANK/WORLD_SIZE; without init_process_group each rank
    # would save alone into the same directory. As the seed, dcp runs the
    # call in a single process, but says so.
    import warnings
    for name in _LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert not torch.distributed.is_initialized()
    ckpt = str(tmp_path / "ckpt")
    state = {"w": torch.ones(3), "step": 2}
    calls = (
        lambda **kw: dcp.save(state, checkpoint_id=ckpt, **kw),
        lambda **kw: dcp.load(state, checkpoint_id=ckpt, **kw),
        lambda **kw: dcp.async_save(state, checkpoint_id=ckpt,
                                    **kw).result())
    for call in calls:
        with pytest.warns(UserWarning) as record:
            call()
        alone = _alone_warnings(record)
        assert alone, [str(w.message) for w in record]
        message = str(alone[0].message)
        assert message.startswith("dcp: RANK=0, WORLD_SIZE=2 are set, but "
                                  "torch.distributed is disabled")
        assert "torch.distributed.init_process_group(...)" in message
        assert "no_dist=True silences this warning" in message
        # Attributed to the caller's line, not to dcp's own code.
        assert alone[0].filename == __file__
    # no_dist=True says the single process is meant; a world of one rank,
    # or none at all, is a single process.
    for env in ({"WORLD_SIZE": "2"}, {"WORLD_SIZE": "1"}, {}):
        monkeypatch.delenv("WORLD_SIZE", raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        for call in calls:
            with warnings.catch_warnings(record=True) as record:
                warnings.simplefilter("always")
                call(**({"no_dist": True} if env.get("WORLD_SIZE") == "2"
                        else {}))
            assert not _alone_warnings(record), env


def test_dcp_launch_ranks_without_a_group_warn_too(tmp_path, monkeypatch):
    for name in _LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DCP_RANK", "1")
    monkeypatch.setenv("DCP_WORLD_SIZE", "4")
    with pytest.warns(UserWarning, match=r"^dcp: DCP_RANK=1, "
                      r"DCP_WORLD_SIZE=4 are set") as record:
        dcp.save({"w": torch.ones(2)}, checkpoint_id=str(tmp_path / "c"))
    assert _alone_warnings(record)


def test_ranks_given_different_directories_all_fail_and_commit_nothing(
        tmp_path):
    _run("different_directories", 3, tmp_path, str(tmp_path))


def test_a_torch_groups_timeout_bounds_dcps_waits(tmp_path):
    _run("group_timeout", 2, tmp_path, str(tmp_path / "ckpt"))


def test_process_async_saves_keep_each_groups_writers_apart(tmp_path):
    _run("process_groups", 3, tmp_path, str(tmp_path / "ckpt"))


def test_a_process_save_failing_in_a_staging_callback_fails_only_itself(
        tmp_path):
    _run("process_stage_order", 2, tmp_path, str(tmp_path / "ckpt"))
