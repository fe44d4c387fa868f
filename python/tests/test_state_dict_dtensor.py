"""dcp.state_dict's helpers on DTensor parameters across two processes
(torch.distributed with gloo): full and sharded gets, resharding sets,
broadcast from rank 0, load_sharded_optimizer_state_dict into DTensors.
The models and checks are test_state_dict.py's."""

from __future__ import annotations

import copy
import datetime
import importlib
import os
import sys
import traceback
import types

import pytest
import torch
import torch.nn as nn

from test_state_dict import StateDictOptions, _assert_same_tree, _mlp, sd

_WORLD = 2
_SCENARIOS = [
    "get_full_gathers",
    "get_sharded_keeps_dtensors",
    "get_full_cpu_offload_rank0_only",
    "set_full_reshards",
    "set_broadcast_from_rank0",
    "set_broadcast_from_rank0_flat",
    "broadcast_refuses_dtensor_on_rank0",
    "load_sharded_optimizer_state_dict_into_dtensors",
    "load_bumps_dtensor_versions",
]


def _dtensor_unavailable() -> str | None:
    dist = torch.distributed
    if not dist.is_available() or not dist.is_gloo_available():
        return "torch.distributed with gloo is not available"
    try:
        importlib.import_module("torch.distributed.tensor")
        importlib.import_module("torch.distributed.device_mesh")
    except ImportError as error:
        return f"torch.distributed.tensor is not available: {error}"
    return None


def _shard_model(model: nn.Module, mesh) -> nn.Module:
    from torch.distributed.tensor import Shard, distribute_tensor

    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            sharded = distribute_tensor(param.detach(), mesh, [Shard(0)])
            setattr(module, name, nn.Parameter(sharded, param.requires_grad))
    return model


def _seeded_grads(model: nn.Module, seed: int) -> None:
    """Identical full gradients on every rank, sharded like each parameter."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    gen = torch.Generator().manual_seed(seed)
    for param in model.parameters():
        full = torch.randn(param.shape, generator=gen)
        if isinstance(param, DTensor):
            full = distribute_tensor(full, param.device_mesh, param.placements)
        param.grad = full


def _dtensor_pair(mesh, seed: int, steps: int):
    """A plain reference model and a Shard(0) DTensor copy, trained alike."""
    torch.manual_seed(seed)
    ref = _mlp()
    sharded = _shard_model(copy.deepcopy(ref), mesh)
    ref_optim = torch.optim.AdamW(ref.parameters(), lr=0.01, foreach=False)
    dt_optim = torch.optim.AdamW(sharded.parameters(), lr=0.01, foreach=False)
    for step in range(steps):
        for model, optim in ((ref, ref_optim), (sharded, dt_optim)):
            _seeded_grads(model, 100 + step)
            optim.step()
    return ref, ref_optim, sharded, dt_optim


def _full_tree(value):
    from torch.distributed.tensor import DTensor

    if isinstance(value, DTensor):
        return value.full_tensor()
    if isinstance(value, dict):
        return {k: _full_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_full_tree(v) for v in value]
    return value


def _check_loaded(ref, ref_optim, sharded, dt_optim) -> None:
    _assert_same_tree(_full_tree(dict(sharded.state_dict())), dict(ref.state_dict()))
    _assert_same_tree(_full_tree(dt_optim.state_dict()), ref_optim.state_dict())
    for model, optim in ((ref, ref_optim), (sharded, dt_optim)):
        _seeded_grads(model, 500)
        optim.step()
    _assert_same_tree(_full_tree(dict(sharded.state_dict())), dict(ref.state_dict()))


def _run_scenario(name: str, rank: int, mesh, out_dir: str) -> None:
    from torch.distributed.tensor import DTensor, Shard

    full = StateDictOptions(full_state_dict=True)
    if name == "get_full_gathers":
        ref, ref_optim, sharded, dt_optim = _dtensor_pair(mesh, 0, 1)
        msd, osd = sd.get_state_dict(sharded, dt_optim, options=full)
        assert not any(isinstance(v, DTensor) for v in msd.values())
        _assert_same_tree(msd, dict(ref.state_dict()))
        _assert_same_tree(osd, sd.get_optimizer_state_dict(ref, ref_optim))
    elif name == "get_sharded_keeps_dtensors":
        _, _, sharded, dt_optim = _dtensor_pair(mesh, 0, 1)
        msd, osd = sd.get_state_dict(sharded, dt_optim)
        weight = msd["0.weight"]
        assert isinstance(weight, DTensor) and weight.placements == (Shard(0),)
        assert weight.shape == (8, 4) and weight.to_local().shape == (4, 4)
        assert isinstance(osd["state"]["0.weight"]["exp_avg"], DTensor)
        assert not isinstance(osd["state"]["0.weight"]["step"], DTensor)
    elif name == "get_full_cpu_offload_rank0_only":
        ref, ref_optim, sharded, dt_optim = _dtensor_pair(mesh, 0, 1)
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        msd, osd = sd.get_state_dict(sharded, dt_optim, options=options)
        if rank == 0:
            _assert_same_tree(msd, dict(ref.state_dict()))
            _assert_same_tree(osd, sd.get_optimizer_state_dict(ref, ref_optim))
            assert all(v.device.type == "cpu" for v in msd.values())
        else:
            assert msd == {} and osd == {}
    elif name == "set_full_reshards":
        ref, ref_optim, _, _ = _dtensor_pair(mesh, 0, 2)
        msd, osd = sd.get_state_dict(ref, ref_optim)
        _, _, sharded, dt_optim = _dtensor_pair(mesh, 9, 0)  # never stepped
        sd.set_state_dict(
            sharded, dt_optim, model_state_dict=msd, optim_state_dict=osd,
            options=full,
        )
        assert isinstance(sharded[0].weight, DTensor)
        _check_loaded(ref, ref_optim, sharded, dt_optim)
    elif name in ("set_broadcast_from_rank0", "set_broadcast_from_rank0_flat"):
        flat = name.endswith("_flat")
        ref, ref_optim, _, _ = _dtensor_pair(mesh, 0, 2)
        options = StateDictOptions(
            full_state_dict=True,
            broadcast_from_rank0=True,
            flatten_optimizer_state_dict=flat,
        )
        msd, osd = sd.get_state_dict(
            ref, ref_optim, options=StateDictOptions(flatten_optimizer_state_dict=flat)
        )
        if rank != 0:
            msd, osd = {}, {}
        _, _, sharded, dt_optim = _dtensor_pair(mesh, 9, 1)
        result = sd.set_state_dict(
            sharded, dt_optim, model_state_dict=msd, optim_state_dict=osd,
            options=options,
        )
        assert result.missing_keys == [] and result.unexpected_keys == []
        _check_loaded(ref, ref_optim, sharded, dt_optim)
    elif name == "broadcast_refuses_dtensor_on_rank0":
        _, _, sharded, _ = _dtensor_pair(mesh, 0, 0)
        msd = sd.get_model_state_dict(sharded)  # DTensors: not a full state dict
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        try:
            sd.set_model_state_dict(sharded, msd, options=options)
        except ValueError as error:
            assert "rank 0: broadcast_from_rank0 needs full tensors" in str(error)
        else:
            raise AssertionError("no ValueError")
    elif name == "load_sharded_optimizer_state_dict_into_dtensors":
        import torch.distributed.checkpoint as torch_dcp

        ref, ref_optim, sharded, dt_optim = _dtensor_pair(mesh, 0, 1)
        msd, osd = sd.get_state_dict(sharded, dt_optim)
        path = os.path.join(out_dir, "checkpoint")
        torch_dcp.save({"model": msd, "optim": osd}, checkpoint_id=path)
        saved_dcp = sys.modules.get("dcp")
        sys.modules["dcp"] = types.SimpleNamespace(load=torch_dcp.load)
        try:
            result = sd.load_sharded_optimizer_state_dict(
                msd, "optim", torch_dcp.FileSystemReader(path)
            )
        finally:
            if saved_dcp is None:
                del sys.modules["dcp"]
            else:
                sys.modules["dcp"] = saved_dcp
        exp_avg = result["optim"]["state"]["0.weight"]["exp_avg"]
        assert isinstance(exp_avg, DTensor) and exp_avg.placements == (Shard(0),)
        assert exp_avg.to_local().shape == (4, 4)
        _assert_same_tree(
            _full_tree(result["optim"]), sd.get_optimizer_state_dict(ref, ref_optim)
        )
    elif name == "load_bumps_dtensor_versions":
        # Autograd saves the DTensor wrapper, whose version counter is its
        # own: a load must bump it, as copy_ would.
        import dcp
        from torch.distributed.tensor import distribute_tensor

        full = torch.arange(8.0).reshape(4, 2)
        p = nn.Parameter(distribute_tensor(full, mesh, [Shard(0)]))
        path = os.path.join(out_dir, "versions")
        dcp.save({"p": p}, checkpoint_id=path)
        loss = (p * p).sum()  # keeps p for its gradient
        before = p._version
        dcp.load({"p": p}, checkpoint_id=path)
        assert p._version > before
        try:
            loss.backward()
        except RuntimeError as error:
            assert "modified by an inplace" in str(error), error
        else:
            raise AssertionError("backward used the loaded values")
    else:
        raise AssertionError(f"unknown scenario {name}")


def _dtensor_worker(rank: int, store_path: str, out_dir: str) -> None:
    dist = torch.distributed
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    store = dist.FileStore(store_path, _WORLD)
    # The timeout only bounds a hang if a peer dies; nothing waits on it.
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=_WORLD,
        timeout=datetime.timedelta(seconds=120),
    )
    try:
        mesh = init_device_mesh("cpu", (_WORLD,))
        for name in _SCENARIOS:
            try:
                _run_scenario(name, rank, mesh, out_dir)
            except BaseException:
                with open(os.path.join(out_dir, f"error{rank}.txt"), "w") as f:
                    f.write(f"{name}:\n{traceback.format_exc()}")
                raise
            with open(os.path.join(out_dir, f"done{rank}.txt"), "a") as f:
                f.write(name + "\n")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def dtensor_results(tmp_path_factory):
    reason = _dtensor_unavailable()
    if reason:
        pytest.skip(reason)
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("dtensor")
    failure = None
    try:
        mp.spawn(
            _dtensor_worker,
            args=(str(out / "store"), str(out)),
            nprocs=_WORLD,
            join=True,
        )
    except Exception as error:  # reported per scenario below
        failure = str(error)
    done, errors = [], []
    for rank in range(_WORLD):
        path = out / f"done{rank}.txt"
        done.append(set(path.read_text().split()) if path.exists() else set())
        error_path = out / f"error{rank}.txt"
        if error_path.exists():
            errors.append(f"rank {rank}: {error_path.read_text()}")
    return done, "\n".join(errors) or failure


@pytest.mark.parametrize("scenario", _SCENARIOS)
def test_dtensor_two_ranks(dtensor_results, scenario):
    done, failure = dtensor_results
    if not all(scenario in ranks for ranks in done):
        pytest.fail(f"scenario {scenario} did not pass on every rank:\n{failure}")
