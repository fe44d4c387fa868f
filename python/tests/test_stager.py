"""dcp.DefaultStager: the engine's stager kept across async saves."""

import concurrent.futures

import numpy as np
import pytest
import torch

import dcp


def _state(value):
    return {"model": {"w": np.full((256, 64), value, dtype=np.float32),
                      "b": np.arange(7, dtype=np.int64) + int(value)},
            "step": int(value)}


@pytest.mark.parametrize("pinned", [True, False])
def test_saves_through_a_reserved_stager_keep_the_values_of_the_call(
        tmp_path, pinned):
    stager = dcp.DefaultStager(dcp.StagingOptions(use_pinned_memory=pinned))
    state = _state(1.0)
    stager.reserve(state)
    dirs = []
    for i in range(3):
        d = tmp_path / f"step-{i}"
        dirs.append(d)
        r = dcp.async_save(state, checkpoint_id=str(d), async_stager=stager)
        r.staging_completion.result()
        # Staged: the loop may change its tensors now.
        state["model"]["w"][:] = -1.0
        state["model"]["b"][:] = -1
        r.upload_completion.result()
        state = _state(float(i + 2))
    stager.close()
    for i, d in enumerate(dirs):
        into = _state(0.0)
        dcp.load(into, checkpoint_id=str(d))
        want = _state(float(i + 1))
        np.testing.assert_array_equal(into["model"]["w"], want["model"]["w"])
        np.testing.assert_array_equal(into["model"]["b"], want["model"]["b"])
        assert into["step"] == i + 1


def test_a_closed_stager_is_refused_and_close_is_idempotent(tmp_path):
    stager = dcp.DefaultStager()
    stager.close()
    stager.close()
    with pytest.raises(ValueError, match="closed"):
        dcp.async_save(_state(1.0), checkpoint_id=str(tmp_path / "x"),
                       async_stager=stager)
    with pytest.raises(ValueError, match="closed"):
        stager.reserve(_state(1.0))


def test_close_during_a_save_frees_the_stager_once_the_engine_holds_it(
        tmp_path, monkeypatch):
    """close() from another thread while a save is between taking the
    stager and handing it to the engine (here: as the ranks agree): the
    save still stages through it and commits, the C stager is freed once,
    after dcp_async_save took its own reference, and later uses raise."""
    from dcp import _lib, process_group
    L = _lib.lib()
    events = []
    real_save, real_free = L.dcp_async_save, L.dcp_stager_free
    real_agree = process_group.Resolved.agree
    stager = dcp.DefaultStager()

    def agree(self, what, error, *args, **kwargs):
        if what == "async_save":
            stager.close()
            events.append("closed")
        return real_agree(self, what, error, *args, **kwargs)

    def save(*args):
        events.append("dcp_async_save")
        return real_save(*args)

    def free(handle):
        events.append("dcp_stager_free")
        return real_free(handle)

    monkeypatch.setattr(process_group.Resolved, "agree", agree)
    monkeypatch.setattr(L, "dcp_async_save", save)
    monkeypatch.setattr(L, "dcp_stager_free", free)
    r = dcp.async_save(_state(3.0), checkpoint_id=str(tmp_path / "a"),
                       async_stager=stager)
    r.upload_completion.result()
    assert events == ["closed", "dcp_async_save", "dcp_stager_free"]
    monkeypatch.undo()
    into = _state(0.0)
    dcp.load(into, checkpoint_id=str(tmp_path / "a"))
    assert into["step"] == 3
    np.testing.assert_array_equal(into["model"]["w"],
                                  _state(3.0)["model"]["w"])
    with pytest.raises(ValueError, match="closed"):
        dcp.async_save(_state(4.0), checkpoint_id=str(tmp_path / "b"),
                       async_stager=stager)
    with pytest.raises(ValueError, match="closed"):
        stager.copy_on_write_bytes


def test_process_saves_ignore_the_engine_stager(tmp_path):
    stager = dcp.DefaultStager()
    r = dcp.async_save(_state(5.0), checkpoint_id=str(tmp_path / "p"),
                       async_stager=stager,
                       async_checkpointer_type=dcp.AsyncCheckpointerType
                       .PROCESS)
    r.upload_completion.result()
    into = _state(0.0)
    dcp.load(into, checkpoint_id=str(tmp_path / "p"))
    assert into["step"] == 5
    stager.close()


def test_config_must_be_staging_options():
    with pytest.raises(TypeError, match="StagingOptions"):
        dcp.DefaultStager({"use_pinned_memory": False})


def test_reserve_for_process_prepares_the_first_process_save(ckpt):
    from dcp import _process_writer
    state = {"w": torch.arange(300_000, dtype=torch.float32), "n": 1}
    stager = dcp.DefaultStager(dcp.StagingOptions(use_pinned_memory=False))
    stager.reserve(state, dcp.AsyncCheckpointerType.PROCESS)
    assert _process_writer.writer_pid() is not None
    reserved = {s.id for s in _process_writer._pool._idle
                if s.size >= state["w"].numel() * 4}
    assert reserved
    r = dcp.async_save(state, checkpoint_id=ckpt, async_stager=stager,
                       async_checkpointer_type=dcp.AsyncCheckpointerType
                       .PROCESS)
    r.upload_completion.result(timeout=120)
    # The save staged into a reserved segment: no new one was made.
    assert {s.id for s in _process_writer._pool._idle} >= reserved
    out = {"w": torch.zeros(300_000), "n": 0}
    dcp.load(out, checkpoint_id=ckpt)
    assert out["w"].equal(state["w"]) and out["n"] == 1
    stager.close()


def _expect_copy_on_write():
    """Whether this process can snapshot copy-on-write: as root on Linux
    6.4 or later (userfaultfd with write-protection of unpopulated pages)."""
    import os
    import platform
    try:
        major, minor = (int(x) for x in platform.release().split(".")[:2])
    except ValueError:
        return False
    return os.geteuid() == 0 and (major, minor) >= (6, 4)


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_copy_on_write_staging_keeps_the_values_of_the_call(tmp_path, kind):
    stager = dcp.DefaultStager(dcp.StagingOptions(copy_on_write=True))
    big = torch.arange(3 << 20, dtype=torch.float32)  # 12 MiB
    small = torch.arange(100, dtype=torch.int64)
    arr = np.arange(1 << 20, dtype=np.float64)  # 8 MiB numpy
    state = {"big": big, "small": small, "arr": arr, "step": 3}
    want = {k: (v.clone() if isinstance(v, torch.Tensor) else
                v.copy() if isinstance(v, np.ndarray) else v)
            for k, v in state.items()}
    r = dcp.async_save(state, checkpoint_id=str(tmp_path / "c"),
                       async_stager=stager,
                       async_checkpointer_type=dcp.AsyncCheckpointerType(kind))
    r.staging_completion.result()
    # The loop's next step, in place, possibly before the copy was made.
    big.mul_(-1)
    small.fill_(-1)
    arr[:] = -1
    r.upload_completion.result()
    into = {"big": torch.zeros_like(big), "small": torch.zeros_like(small),
            "arr": np.zeros_like(arr), "step": 0}
    dcp.load(into, checkpoint_id=str(tmp_path / "c"))
    assert torch.equal(into["big"], want["big"])
    assert torch.equal(into["small"], want["small"])
    np.testing.assert_array_equal(into["arr"], want["arr"])
    assert into["step"] == 3
    # Whole pages of the two large tensors were snapshot, not copied
    # (PROCESS's snapshots are counted by the stager too).
    if _expect_copy_on_write():
        assert stager.copy_on_write_bytes >= (20 << 20) - 2 * 8192
    stager.close()


def test_copy_on_write_keeps_a_replaced_storage_until_the_upload(tmp_path):
    """After staging_completion a tensor may even be given another storage
    (`param.data = ...`, a module's `.to()`): the old memory, which the
    snapshot still reads, stays allocated until the upload, and the
    checkpoint holds the values of the call."""
    import gc
    stager = dcp.DefaultStager(dcp.StagingOptions(copy_on_write=True))
    big = torch.arange(16 << 20, dtype=torch.float32)  # 64 MiB: mmapped
    want = big.clone()
    r = dcp.async_save({"big": big}, checkpoint_id=str(tmp_path / "c"),
                       async_stager=stager)
    r.staging_completion.result()
    big.data = torch.full_like(want, -1.0)  # the old storage's last user
    gc.collect()
    r.upload_completion.result()
    into = {"big": torch.zeros_like(want)}
    dcp.load(into, checkpoint_id=str(tmp_path / "c"))
    assert torch.equal(into["big"], want)
    stager.close()


def test_copy_on_write_copies_pinned_tensors_in_the_call(tmp_path,
                                                         monkeypatch):
    """A device's DMA into page-locked memory (CPU offload's non_blocking
    copies) bypasses a copy-on-write snapshot's page protection: THREAD
    stages pinned CPU tensors from a copy made in the call. (This machine
    cannot pin memory: `is_pinned` is faked for one tensor.)"""
    from dcp import _state
    pinned = torch.arange(1 << 20, dtype=torch.float32)  # 4 MiB
    plain = torch.arange(1 << 20, dtype=torch.float64)
    fake_pinned = pinned.data_ptr()
    real_is_pinned = torch.Tensor.is_pinned
    monkeypatch.setattr(
        torch.Tensor, "is_pinned",
        lambda self, *a: self.data_ptr() == fake_pinned or
        real_is_pinned(self, *a))
    flat = _state.Flat(load=False, allow_pickle=False)
    flat.add({"pinned": pinned, "plain": plain})
    flat.copy_pinned()
    by_ptr = {t.data_ptr() for t in flat.t_objs}
    assert plain.data_ptr() in by_ptr  # Staged in place (snapshot).
    assert fake_pinned not in by_ptr  # Staged from a copy.
    assert any(torch.equal(t, pinned) for t in flat.t_objs)

    stager = dcp.DefaultStager(dcp.StagingOptions(copy_on_write=True))
    want = {"pinned": pinned.clone(), "plain": plain.clone()}
    r = dcp.async_save({"pinned": pinned, "plain": plain},
                       checkpoint_id=str(tmp_path / "c"), async_stager=stager)
    r.staging_completion.result()
    pinned.fill_(-1)
    plain.fill_(-1)
    r.upload_completion.result()
    into = {k: torch.zeros_like(v) for k, v in want.items()}
    dcp.load(into, checkpoint_id=str(tmp_path / "c"))
    assert all(torch.equal(into[k], want[k]) for k in want)
    stager.close()


def test_stage_copies_tensors_to_host_and_keeps_other_values():
    import collections
    src = collections.OrderedDict(
        w=torch.arange(6.0).reshape(2, 3), n=np.arange(3), step=5,
        nested={"l": [torch.ones(2), "s"]})
    for options, is_future in ((dcp.StagingOptions(), True),
                               (dcp.StagingOptions(False, False, False,
                                                   False), False)):
        stager = dcp.DefaultStager(options)
        staged = stager.stage(src)
        assert isinstance(staged, concurrent.futures.Future) == is_future
        if is_future:
            staged = staged.result(30)
        stager.synchronize_staging()
        assert type(staged) is collections.OrderedDict
        assert torch.equal(staged["w"], src["w"])
        assert staged["w"].data_ptr() != src["w"].data_ptr()
        assert staged["n"] is not src["n"] and (staged["n"] == src["n"]).all()
        assert staged["step"] == 5 and staged["nested"]["l"][1] == "s"
        assert torch.equal(staged["nested"]["l"][0], torch.ones(2))
        src["w"].add_(1)  # the copy does not follow
        assert torch.equal(staged["w"], torch.arange(6.0).reshape(2, 3))
        src["w"].sub_(1)
        stager.close()
        with pytest.raises(ValueError, match="closed"):
            stager.stage(src)


def test_stage_copies_inside_namedtuples_sharded_and_list_subclasses():
    import collections
    Pair = collections.namedtuple("Pair", "a b")

    class Items(list):
        pass

    src = {"pair": Pair(torch.ones(3), 2),
           "shard": dcp.ShardedTensor(torch.ones(2, 2), (4, 2), (2, 0)),
           "items": Items([torch.ones(1)])}
    stager = dcp.DefaultStager()
    staged = stager.stage(src)
    stager.synchronize_staging()
    assert staged.done()
    staged = staged.result()
    assert type(staged["pair"]) is Pair and staged["pair"].b == 2
    assert type(staged["items"]) is Items
    assert staged["shard"].global_shape == (4, 2)
    assert staged["shard"].offsets == (2, 0)
    for t in (src["pair"].a, src["shard"].local, src["items"][0]):
        t.fill_(5.0)
    assert torch.equal(staged["pair"].a, torch.ones(3))
    assert torch.equal(staged["shard"].local, torch.ones(2, 2))
    assert torch.equal(staged["items"][0], torch.ones(1))
    stager.close()


def test_torchs_async_stager_protocol_and_blocking_stager(tmp_path):
    """dcp.staging.AsyncStager: subclassed for a stager of one's own, and
    isinstance() of dcp's stagers. BlockingAsyncStager copies in the call;
    with cache_staged_state_dict it copies into the same host copy again,
    plain values (in tuples and namedtuples too) taken anew."""
    import collections
    from dcp.staging import AsyncStager, BlockingAsyncStager
    assert isinstance(dcp.DefaultStager(), AsyncStager)
    assert isinstance(BlockingAsyncStager(), AsyncStager)
    assert not isinstance(object(), AsyncStager)
    Pair = collections.namedtuple("Pair", "n t")
    sd = {"w": torch.arange(4.0), "lr": 0.1, "t": (torch.ones(2), 3),
          "p": Pair(1, torch.zeros(1)), "l": [1, torch.ones(1)]}
    stager = BlockingAsyncStager(cache_staged_state_dict=True)
    first = stager.stage(sd)
    assert first["w"] is not sd["w"] and torch.equal(first["w"], sd["w"])
    sd["w"] += 1
    sd["lr"], sd["t"] = 0.2, (sd["t"][0] * 5, 4)
    sd["p"], sd["l"][0] = Pair(2, sd["p"].t + 1), 9
    second = stager.stage(sd)
    assert second is first
    assert torch.equal(second["w"], torch.arange(1.0, 5.0))
    assert second["lr"] == 0.2 and second["t"][1] == 4 and \
        torch.equal(second["t"][0], torch.full((2,), 5.0))
    assert type(second["p"]) is Pair and second["p"].n == 2 and \
        torch.equal(second["p"].t, torch.ones(1))
    assert second["l"][0] == 9
    sd["w"] = torch.zeros(5)  # another shape: a new copy
    assert stager.stage(sd) is not first
    f = dcp.async_save(sd, checkpoint_id=str(tmp_path / "blocking"),
                       async_stager=BlockingAsyncStager())
    f.result()
    back = {"w": torch.ones(5), "lr": 0.0, "t": (torch.zeros(2), 0),
            "p": Pair(0, torch.zeros(1)), "l": [0, torch.zeros(1)]}
    dcp.load(back, checkpoint_id=str(tmp_path / "blocking"))
    assert torch.equal(back["w"], torch.zeros(5)) and back["lr"] == 0.2

    class Mine(AsyncStager):
        def stage(self, state_dict):
            return {k: v.clone() for k, v in state_dict.items()}
    f = dcp.async_save({"x": torch.ones(2)}, async_stager=Mine(),
                       checkpoint_id=str(tmp_path / "mine"))
    f.result()
    x = {"x": torch.zeros(2)}
    dcp.load(x, checkpoint_id=str(tmp_path / "mine"))
    assert torch.equal(x["x"], torch.ones(2))


def test_a_caching_blocking_stager_waits_for_the_save_reading_its_copy(
        tmp_path, monkeypatch):
    """BlockingAsyncStager(cache_staged_state_dict=True) reused for saves
    issued back to back: each stage() first waits for the upload still
    reading the cached copy, so every checkpoint holds its own step; a
    shard's placement (CheckpointableTensor attributes) is copied anew."""
    import concurrent.futures
    import threading

    from dcp import checkpoint
    from dcp.staging import BlockingAsyncStager
    stager = BlockingAsyncStager(cache_staged_state_dict=True)
    w = torch.zeros(1 << 16)
    sd = {"w": w, "step": 0}
    waited = []
    real_wait = concurrent.futures.wait
    real_run_save = checkpoint.run_save
    # Each upload (they run one after another) writes only once a stage()
    # waits for it, so none is done before the next stage() looks.
    turns = threading.Semaphore(0)

    def run_save(p, rank):
        turns.acquire(timeout=60)  # (a stage() that never waits: fails below)
        return real_run_save(p, rank)

    def wait(futures, *args, **kwargs):
        waited.append(list(futures))
        turns.release()
        return real_wait(futures, *args, **kwargs)
    monkeypatch.setattr(concurrent.futures, "wait", wait)
    monkeypatch.setattr(checkpoint, "run_save", run_save)
    futures = []
    for step in range(1, 4):
        w.fill_(step)
        sd["step"] = step
        futures.append(dcp.async_save(
            sd, checkpoint_id=str(tmp_path / f"s{step}"),
            async_stager=stager))
    turns.release()  # the last upload
    for f in futures:
        f.result()
    monkeypatch.undo()
    # The second and third stage() waited for the upload before them.
    seen = [f for group in waited for f in group]
    assert futures[0].upload_completion in seen
    assert futures[1].upload_completion in seen
    for step in range(1, 4):
        back = {"w": torch.empty(1 << 16), "step": -1}
        dcp.load(back, checkpoint_id=str(tmp_path / f"s{step}"))
        assert back["step"] == step
        assert torch.equal(back["w"], torch.full((1 << 16,), float(step)))

    shard = torch.ones(2)
    shard.global_shape, shard.global_offsets = (4,), [(0,)]
    first = stager.stage({"s": shard})
    moved = torch.ones(2)
    moved.global_shape, moved.global_offsets = (4,), [(2,)]
    again = stager.stage({"s": moved})
    assert again is first and again["s"].global_offsets == [(2,)]
