"""dcp.format_utils: load_all builds a checkpoint's whole state dict from
its metadata; dcp_to_torch_save / torch_save_to_dcp convert both ways."""

import os
import pickle

import pytest

torch = pytest.importorskip("torch")

import dcp  # noqa: E402
from dcp import format_utils  # noqa: E402


def _state():
    return {
        "model": {
            "w": torch.randn(4, 6),
            "b": torch.randn(6).bfloat16(),
            "layers": [{"k": torch.arange(5)}, {"k": torch.arange(5, 10)}],
        },
        "optim": {"step": torch.tensor(7.0), "lr": 0.5, "betas": [0.9, 0.99],
                  "note": "adam", "blob": b"\x00\x01", "none": None,
                  "empty": []},
        "epoch": 3,
    }


def _assert_same(a, b, where="state"):
    assert type(a) is type(b), f"{where}: {type(a)} vs {type(b)}"
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), where
    else:
        assert a == b, where


def test_load_all_rebuilds_the_nested_state(ckpt):
    state = _state()
    dcp.save(state, checkpoint_id=ckpt)
    _assert_same(format_utils.load_all(ckpt), state)


def test_load_all_selects_keys(ckpt):
    state = _state()
    dcp.save(state, checkpoint_id=ckpt)
    got = format_utils.load_all(ckpt, keys={"epoch", "model.w"})
    _assert_same(got, {"epoch": 3, "model": {"w": state["model"]["w"]}})
    assert format_utils.load_all(ckpt, keys="epoch") == {"epoch": 3}
    # Prefixes ending at a dot, and single list items (the others None).
    _assert_same(format_utils.load_all(ckpt, keys="model.layers"),
                 {"model": {"layers": state["model"]["layers"]}})
    _assert_same(format_utils.load_all(ckpt, keys="model.layers.1.k"),
                 {"model": {"layers": [None, state["model"]["layers"][1]]}})
    assert format_utils.load_all(ckpt, keys=["optim.betas"]) == \
        {"optim": {"betas": [0.9, 0.99]}}
    with pytest.raises(KeyError, match="'nope'"):
        format_utils.load_all(ckpt, keys={"epoch", "nope"})
    with pytest.raises(KeyError, match="'mod'"):
        format_utils.load_all(ckpt, keys="mod")  # Not a prefix at a dot.
    with pytest.raises(TypeError, match="strings"):
        format_utils.load_all(ckpt, keys=b"epoch")


def test_load_all_joins_the_chunks_of_a_sharded_tensor(ckpt):
    full = torch.arange(24.0).reshape(8, 3)
    t = full.clone()
    t.global_shape = (8, 3)
    t.global_offsets = ((0, 0), (4, 0))
    t.local_offsets = ((0, 0), (4, 0))
    t.local_sizes = ((4, 3), (4, 3))
    dcp.save({"t": t}, checkpoint_id=ckpt)
    assert len(dcp.read_metadata(ckpt).state_dict_metadata["t"].chunks) == 2
    got = format_utils.load_all(ckpt)
    assert torch.equal(got["t"], full)


def test_load_all_of_a_hugging_face_directory(tmp_path):
    sd = {"model.embed.weight": torch.randn(3, 4),
          "lm_head.weight": torch.randn(2, 4).half()}
    dcp.save(sd, storage_writer=dcp.HuggingFaceStorageWriter(
        str(tmp_path / "hf")))
    _assert_same(format_utils.load_all(str(tmp_path / "hf")), sd)
    reader = dcp.HuggingFaceStorageReader(str(tmp_path / "hf"))
    _assert_same(format_utils.load_all(storage_reader=reader), sd)


def test_load_all_needs_allow_pickle_for_pickled_values(ckpt):
    dcp.save({"obj": {1, 2}}, checkpoint_id=ckpt, allow_pickle=True)
    with pytest.raises(ValueError, match="allow_pickle"):
        format_utils.load_all(ckpt)
    assert format_utils.load_all(ckpt, allow_pickle=True) == {"obj": {1, 2}}


def test_load_all_errors(ckpt, tmp_path):
    with pytest.raises(ValueError, match="checkpoint_id or storage_reader"):
        format_utils.load_all()
    with pytest.raises(dcp.CheckpointFileNotFoundError):
        format_utils.load_all(str(tmp_path / "none"))
    # A directory of rank-local checkpoints (rank-R/) holds no whole
    # tensors: refused as dcp.load refuses it without a process group.
    dcp.save({"w": torch.ones(2)}, checkpoint_id=str(tmp_path / "rl" /
                                                       "rank-0"))
    with pytest.raises(dcp.CheckpointException, match="rank-local"):
        format_utils.load_all(str(tmp_path / "rl"))


def test_load_all_refuses_a_list_index_far_past_the_end(ckpt, monkeypatch,
                                                        per_item_lists):
    # A damaged or crafted checkpoint's nesting path with list index 2^40:
    # refused as the engine refuses it, before any list is padded to it.
    dcp.save({"h": [1, 2]}, checkpoint_id=ckpt)
    import types
    md = dcp.read_metadata(ckpt)
    crafted = types.SimpleNamespace(
        state_dict_metadata=md.state_dict_metadata,
        planner_data={**md.planner_data, "h.1": ("h", 1 << 40)})
    monkeypatch.setattr(format_utils, "read_metadata", lambda _: crafted)
    with pytest.raises(dcp.CheckpointCorruptError) as e:
        format_utils.load_all(ckpt)
    assert str(e.value) == (
        f"{ckpt}: the metadata's nesting paths are damaged: "
        f'state dict path "h.{1 << 40}" has list index {1 << 40} at element '
        "1, more than 1048576 past the end of its list (1 entries)")


def test_load_all_without_torch_says_it_needs_torch(ckpt, monkeypatch):
    import sys
    dcp.save({"w": torch.ones(2)}, checkpoint_id=ckpt)
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch fails
    with pytest.raises(ModuleNotFoundError) as e:
        format_utils.load_all(ckpt)
    assert e.value.name == "torch"
    assert str(e.value).startswith(
        "dcp.format_utils.load_all needs torch (its results are torch "
        "tensors): pip install torch")


def test_dcp_to_torch_save_and_back(ckpt, tmp_path):
    state = _state()
    dcp.save(state, checkpoint_id=ckpt)
    pt = tmp_path / "state.pt"
    format_utils.dcp_to_torch_save(ckpt, pt)
    _assert_same(torch.load(pt, weights_only=True), state)
    format_utils.dcp_to_torch_save(ckpt, tmp_path / "epoch.pt", keys="epoch")
    assert torch.load(tmp_path / "epoch.pt", weights_only=True) == \
        {"epoch": 3}
    back = str(tmp_path / "back")
    format_utils.torch_save_to_dcp(pt, back)
    _assert_same(format_utils.load_all(back), state)


class _Custom:
    pass


def test_torch_save_to_dcp_refuses_code_unless_asked(tmp_path):
    pt = tmp_path / "obj.pt"
    torch.save({"w": torch.ones(2), "obj": _Custom()}, pt)
    with pytest.raises(pickle.UnpicklingError):
        format_utils.torch_save_to_dcp(pt, str(tmp_path / "a"))
    format_utils.torch_save_to_dcp(pt, str(tmp_path / "b"),
                                   weights_only=False, allow_pickle=True)
    got = format_utils.load_all(str(tmp_path / "b"), allow_pickle=True)
    assert torch.equal(got["w"], torch.ones(2))
    assert isinstance(got["obj"], _Custom)
    torch.save([torch.ones(1)], tmp_path / "list.pt")
    with pytest.raises(TypeError, match="not a state dict"):
        format_utils.torch_save_to_dcp(tmp_path / "list.pt",
                                       str(tmp_path / "c"))


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_torch_dcp_to_dcp(ckpt, tmp_path):
    import torch.distributed.checkpoint as torch_dcp
    state = _state()
    del state["optim"]["empty"]  # torch's DCP drops empty lists.
    src = str(tmp_path / "torch")
    torch_dcp.save(state, checkpoint_id=src, no_dist=True)
    format_utils.torch_dcp_to_dcp(src, ckpt)
    _assert_same(format_utils.load_all(ckpt), state)
    with pytest.raises(ValueError, match="no checkpoint written by torch"):
        format_utils.torch_dcp_to_dcp(ckpt, str(tmp_path / "again"))


def test_command_line(ckpt, tmp_path):
    import subprocess
    import sys
    state = {"w": torch.arange(6.0).reshape(2, 3), "epoch": 4}
    dcp.save(state, checkpoint_id=ckpt)
    pt = str(tmp_path / "w.pt")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    run = subprocess.run(
        [sys.executable, "-m", "dcp.format_utils", "dcp_to_torch", ckpt, pt],
        capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    assert f"{ckpt} -> {pt}" in run.stdout
    # dcp does not import format_utils itself, so runpy does not warn that
    # it found the module already imported.
    assert "RuntimeWarning" not in run.stderr, run.stderr
    _assert_same(torch.load(pt, weights_only=True), state)
    back = str(tmp_path / "back")
    assert format_utils.main(["torch_to_dcp", pt, back]) == 0
    _assert_same(format_utils.load_all(back), state)
    # Errors: the message on stderr, exit status 1.
    run = subprocess.run(
        [sys.executable, "-m", "dcp.format_utils", "torch_dcp_to_dcp", ckpt,
         str(tmp_path / "x")], capture_output=True, text=True, env=env)
    assert run.returncode == 1
    assert "ValueError" in run.stderr and "no checkpoint written by torch" \
        in run.stderr


def _crafted(monkeypatch, ckpt, planner_data=None, items=None):
    """load_all reads metadata whose planner_data (or items) are replaced
    by a damaged checkpoint's."""
    import types
    md = dcp.read_metadata(ckpt)
    crafted = types.SimpleNamespace(
        state_dict_metadata=dict(md.state_dict_metadata, **(items or {})),
        planner_data={**md.planner_data, **(planner_data or {})})
    monkeypatch.setattr(format_utils, "read_metadata", lambda _: crafted)


@pytest.mark.parametrize("path,why", [
    ((0,), "path (0,) does not start with a key"),
    (("h",) + (0,) * 1001, "a path nests 1002 deep (at most 1000)"),
    (("h", 0, "x"), "passes through a value"),
    (("h",), "ends where other paths pass through"),
    (("h", -1), "a negative list index -1"),
], ids=["index_first", "too_deep", "through_a_value", "at_a_container",
        "negative"])
def test_load_all_refuses_damaged_paths_before_building(ckpt, monkeypatch,
                                                        path, why):
    dcp.save({"h": [torch.ones(1)], "w": torch.zeros(2)}, checkpoint_id=ckpt)
    _crafted(monkeypatch, ckpt, {"w": path})
    with pytest.raises(dcp.CheckpointCorruptError) as e:
        format_utils.load_all(ckpt)
    assert str(e.value).startswith(
        f"{ckpt}: the metadata's nesting paths are damaged: ")
    assert why in str(e.value)


def test_load_all_checks_a_shape_against_its_chunks_first(ckpt, monkeypatch):
    # A damaged shape of 2^42 elements, whose chunks hold 2: refused
    # before a tensor of that shape is allocated.
    dcp.save({"w": torch.ones(2)}, checkpoint_id=ckpt)
    w = dcp.read_metadata(ckpt).state_dict_metadata["w"]
    import dataclasses
    _crafted(monkeypatch, ckpt, items={
        "w": dataclasses.replace(w, size=torch.Size([1 << 42]))})
    with pytest.raises(dcp.CheckpointCorruptError) as e:
        format_utils.load_all(ckpt)
    assert str(e.value) == (f'{ckpt}: "w": the metadata\'s chunks hold 2 of '
                            f"the tensor's {1 << 42} elements")


def test_dcp_to_torch_save_leaves_no_partial_file(ckpt, tmp_path,
                                                  monkeypatch):
    dcp.save({"w": torch.ones(2)}, checkpoint_id=ckpt)
    out = tmp_path / "out.pt"
    out.write_bytes(b"the old file")

    def failing_save(obj, f):
        f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(OSError, match="disk full"):
        format_utils.dcp_to_torch_save(ckpt, out)
    assert sorted(os.listdir(tmp_path)) == ["ckpt", "out.pt"]
    assert out.read_bytes() == b"the old file"
    monkeypatch.undo()
    format_utils.dcp_to_torch_save(ckpt, out)
    assert torch.equal(torch.load(out)["w"], torch.ones(2))


def test_dcp_to_torch_save_writes_through_a_link_with_the_usual_mode(
        ckpt, tmp_path):
    dcp.save({"w": torch.ones(2)}, checkpoint_id=ckpt)
    target = tmp_path / "real.pt"
    target.write_bytes(b"old")
    os.chmod(target, 0o640)
    link = tmp_path / "link.pt"
    link.symlink_to(target)
    format_utils.dcp_to_torch_save(ckpt, link)
    assert link.is_symlink() and torch.equal(torch.load(link)["w"],
                                             torch.ones(2))
    assert oct(os.stat(target).st_mode & 0o777) == oct(0o640)
    fresh = tmp_path / "fresh.pt"
    old = os.umask(0o027)
    try:
        format_utils.dcp_to_torch_save(ckpt, fresh)
    finally:
        os.umask(old)
    assert oct(os.stat(fresh).st_mode & 0o777) == oct(0o640)


class _Opaque:
    """An object torch.load's weights_only unpickler refuses."""


def test_broadcasting_reader_loads_a_torch_save_file_in_place(tmp_path):
    """In one process (no group) the reader loads a torch.save file into
    the caller's tensors (converted to their dtype), plain values and a
    Stateful; torch's reader and planner classes work as dcp's."""
    path = str(tmp_path / "model.pt")
    src = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    torch.save({"model": src.state_dict(), "step": 7, "names": ["a", "b"]},
               path)
    dst = torch.nn.Sequential(torch.nn.Linear(4, 3),
                              torch.nn.Linear(3, 2)).bfloat16()
    weights = dst.state_dict()
    state = {"model": weights, "step": 0, "names": []}
    dcp.load(state, checkpoint_id=path,
             storage_reader=format_utils.BroadcastingTorchSaveReader(),
             planner=format_utils.DynamicMetaLoadPlanner())
    assert state["step"] == 7 and state["names"] == ["a", "b"]
    for name, value in src.state_dict().items():
        assert torch.equal(dst.state_dict()[name], value.bfloat16()), name
        assert state["model"][name] is weights[name]  # in place
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    tfu = pytest.importorskip("torch.distributed.checkpoint.format_utils")
    dcp.load({"model": fresh}, checkpoint_id=path,  # a Stateful
             storage_reader=tfu.BroadcastingTorchSaveReader(),
             planner=tfu.DynamicMetaLoadPlanner())
    for name, value in src.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], value), name


def test_broadcasting_reader_errors(tmp_path):
    path = str(tmp_path / "model.pt")
    torch.save({"model": {"w": torch.ones(3, 4)}, "step": 7}, path)
    reader = format_utils.BroadcastingTorchSaveReader
    with pytest.raises(dcp.CheckpointNotFoundError,
                       match=r'has no "model\.x"; or, to skip the keys it '
                             r'lacks, load with planner=dcp\.DefaultLoad'):
        dcp.load({"model": {"x": torch.zeros(1)}}, checkpoint_id=path,
                 storage_reader=reader())
    # The same names one key shallower or deeper in the file are named,
    # and the planner class passed is the one the message suggests.
    with pytest.raises(dcp.CheckpointNotFoundError,
                       match=r'has no "w" \(the file holds "model\.w": saved '
                             r'under the key "model", which the state dict '
                             r'lacks\? load \{"model": \.\.\.\}\); or, to '
                             r'skip the keys it lacks, load with planner='
                             r'dcp\.format_utils\.DynamicMetaLoadPlanner\('):
        dcp.load({"w": torch.zeros(3, 4)}, checkpoint_id=path,
                 storage_reader=reader(),
                 planner=format_utils.DynamicMetaLoadPlanner())
    with pytest.raises(dcp.CheckpointNotFoundError,
                       match=r'has no "outer\.step" \(the file holds "step": '
                             r'saved without the key "outer"'):
        dcp.load({"outer": {"step": 0}}, checkpoint_id=path,
                 storage_reader=reader())
    kept = torch.full((2,), 5.0)
    state = {"model": {"w": torch.zeros(3, 4), "x": kept}}
    dcp.load(state, checkpoint_id=path, storage_reader=reader(),
             planner=dcp.DefaultLoadPlanner(allow_partial_load=True))
    assert torch.equal(state["model"]["w"], torch.ones(3, 4))
    assert torch.equal(kept, torch.full((2,), 5.0))
    with pytest.raises(dcp.CheckpointValueError,
                       match=r'"model\.w" has shape \[4, 3\] in the state '
                             r'dict but \[3, 4\] in'):
        dcp.load({"model": {"w": torch.zeros(4, 3)}}, checkpoint_id=path,
                 storage_reader=reader())
    with pytest.raises(dcp.CheckpointValueError,
                       match=r'"step" is a tensor in the state dict but a '
                             r'value of type int'):
        dcp.load({"step": torch.zeros(1)}, checkpoint_id=path,
                 storage_reader=reader())
    with pytest.raises(dcp.CheckpointFileNotFoundError,
                       match="no torch.save file at"):
        dcp.load({"step": 0}, checkpoint_id=str(tmp_path / "absent.pt"),
                 storage_reader=reader())
    with pytest.raises(dcp.CheckpointValueError, match="is a directory"):
        dcp.load({"step": 0}, checkpoint_id=str(tmp_path),
                 storage_reader=reader())
    opaque = str(tmp_path / "opaque.pt")
    torch.save({"o": _Opaque()}, opaque)
    with pytest.raises(dcp.CheckpointValueError, match="allow_pickle=True"):
        dcp.load({"o": None}, checkpoint_id=opaque, storage_reader=reader())
    state = {"o": None}
    dcp.load(state, checkpoint_id=opaque, storage_reader=reader(),
             allow_pickle=True)
    assert isinstance(state["o"], _Opaque)
    damaged = str(tmp_path / "damaged.pt")
    with open(path, "rb") as f:
        data = f.read()
    with open(damaged, "wb") as f:
        f.write(data[:len(data) // 2])
    with pytest.raises(dcp.CheckpointCorruptError, match="damaged.pt"):
        dcp.load({"step": 0}, checkpoint_id=damaged, storage_reader=reader())


def test_state_dict_helpers_without_torch_say_they_need_it():
    """Without torch, dcp imports (numpy arrays work) and a helper made for
    torch models says it needs torch; hasattr() stays False."""
    import subprocess
    import sys
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = (
        "import sys\n"
        f"sys.path.insert(0, {here!r})\n"
        "sys.modules['torch'] = None\n"
        "import dcp\n"
        "assert not hasattr(dcp, 'get_state_dict')\n"
        "try:\n"
        "    dcp.get_state_dict\n"
        "except AttributeError as e:\n"
        "    print(e)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith(
        "dcp.get_state_dict needs torch (it works on torch modules and "
        "optimizers), which is not installed: pip install torch"), out.stdout
