"""Behaviour the seed (torch.distributed.checkpoint) defines and dcp must
match: an ignored process_group without torch.distributed, the missing
checkpoint_id error, storage.reset(checkpoint_id), Metadata equality, the
failures of a local error, torch DCP directories and MEGA metadata."""

import copy
import os
import pathlib
import pickle
import traceback

import pytest
import torch
import torch.distributed as dist

import dcp
from dcp import _lib


@pytest.fixture
def no_torch_dist():
    if dist.is_available() and dist.is_initialized():
        pytest.skip("torch.distributed is initialized in this process")


# -- 1. process_group without torch.distributed ------------------------------

def test_process_group_is_ignored_when_dist_is_not_initialized(
        tmp_path, no_torch_dist):
    """The seed: no_dist = no_dist or not dist.is_initialized(); the group
    is never looked at."""
    group = object()  # what a caller's group is: dcp never uses it here
    a = str(tmp_path / "a")
    md = dcp.save({"w": torch.arange(4.0), "n": 3}, checkpoint_id=a,
                  process_group=group)
    assert set(md.state_dict_metadata) == {"w", "n"}
    dst = {"w": torch.zeros(4), "n": 0}
    dcp.load(dst, checkpoint_id=a, process_group=group)
    assert torch.equal(dst["w"], torch.arange(4.0)) and dst["n"] == 3

    b = str(tmp_path / "b")
    resp = dcp.async_save({"w": torch.ones(2)}, checkpoint_id=b,
                          process_group=group)
    resp.upload_completion.result(timeout=60)
    dst = {"w": torch.zeros(2)}
    dcp.load(dst, checkpoint_id=b)
    assert torch.equal(dst["w"], torch.ones(2))

    c = str(tmp_path / "c")
    dcp.save_state_dict({"x": torch.ones(1)}, dcp.FileSystemWriter(c),
                        process_group=group)
    dst = {"x": torch.zeros(1)}
    dcp.load_state_dict(dst, dcp.FileSystemReader(c), process_group=group)
    assert torch.equal(dst["x"], torch.ones(1))


# -- 2. neither checkpoint_id nor storage -------------------------------------

def test_missing_checkpoint_id_is_value_and_runtime_error():
    with pytest.raises(RuntimeError) as e:
        dcp.save({"a": torch.ones(1)})
    assert isinstance(e.value, ValueError)
    assert type(e.value) is dcp.errors.CheckpointIdMissingError
    assert str(e.value) == "save: pass checkpoint_id or a storage_writer"
    with pytest.raises(dcp.errors.CheckpointIdMissingError,
                       match="load: pass checkpoint_id or a storage_reader"):
        dcp.load({"a": torch.zeros(1)})
    with pytest.raises(RuntimeError, match="checkpoint_id"):
        dcp.async_save({"a": torch.ones(1)})
    # Existing callers catching ValueError keep working.
    with pytest.raises(ValueError, match="checkpoint_id"):
        dcp.load({"a": torch.zeros(1)})


# -- 3. checkpoint_id and a storage object: storage.reset(checkpoint_id) -----

@pytest.mark.parametrize("writer_cls, reader_cls", [
    (dcp.FileSystemWriter, dcp.FileSystemReader),
    (dcp.MegaStorageWriter, dcp.MegaStorageReader),
])
def test_checkpoint_id_resets_the_storage_object(tmp_path, writer_cls,
                                                 reader_cls):
    first, second = str(tmp_path / "first"), str(tmp_path / "second")
    writer = writer_cls(first)
    dcp.save({"w": torch.arange(3.0)}, checkpoint_id=second,
             storage_writer=writer)
    assert os.fspath(writer.path) == second
    assert os.fspath(writer.checkpoint_id) == second
    # The FileSystem classes hold a pathlib.Path, as the seed's do (code
    # writes `writer.path / "extra.json"`); MEGA's a str (a URL).
    path_type = pathlib.Path if writer_cls is dcp.FileSystemWriter else str
    assert isinstance(writer.path, path_type)
    assert isinstance(writer_cls(first).path, path_type)
    if path_type is pathlib.Path:  # Path("") would be the working directory
        for cls in (writer_cls, reader_cls):
            with pytest.raises(dcp.errors.CheckpointIdMissingError,
                               match="path is empty"):
                cls("")
    writer.reset("")  # as the seed's: an empty id leaves the path
    assert os.fspath(writer.path) == second
    assert not os.path.exists(first)
    # The writer now saves there without a checkpoint_id.
    dcp.save({"w": torch.full((3,), 7.0)}, storage_writer=writer)

    reader = reader_cls(first)
    dst = {"w": torch.zeros(3)}
    dcp.load(dst, checkpoint_id=second, storage_reader=reader)
    assert os.fspath(reader.path) == second
    assert isinstance(reader.path, path_type)
    assert isinstance(reader_cls(first).path, path_type)
    assert torch.equal(dst["w"], torch.full((3,), 7.0))


def test_checkpoint_id_resets_the_writer_of_async_save(tmp_path):
    first, second = str(tmp_path / "first"), str(tmp_path / "second")
    writer = dcp.FileSystemWriter(first)
    dcp.async_save({"w": torch.ones(2)}, checkpoint_id=second,
                   storage_writer=writer).upload_completion.result(60)
    assert writer.path == pathlib.Path(second)
    assert os.path.exists(os.path.join(second, ".metadata"))
    assert not os.path.exists(first)


# -- 4. Metadata equality, TensorProperties' default dtype --------------------

def test_metadata_compares_by_value(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    saved = dcp.save({"w": torch.ones(2, 3), "n": 1, "l": [torch.ones(1)]},
                     checkpoint_id=a)
    dcp.save({"w": torch.ones(2, 3), "n": 2}, checkpoint_id=b)
    one, two = dcp.read_metadata(a), dcp.read_metadata(a)
    assert one == two and not one != two
    assert one == saved
    assert copy.copy(one) == one and copy.deepcopy(one) == two
    assert pickle.loads(pickle.dumps(one)) == one
    assert dcp.FileSystemReader(a).read_metadata() == one
    assert one != dcp.read_metadata(b)
    assert dcp.Metadata() == dcp.Metadata()
    assert one != dcp.Metadata() and one != "metadata"
    with pytest.raises(TypeError):
        hash(one)


def test_metadata_equality_sees_every_field():
    sdm = {"x": dcp.BytesStorageMetadata()}
    base = dcp.Metadata(sdm, planner_data={"x": ("x",)}, version="dcp-1")
    assert base == dcp.Metadata(dict(sdm), planner_data={"x": ("x",)},
                                version="dcp-1")
    assert base != dcp.Metadata(sdm, planner_data={"x": ("y",)},
                                version="dcp-1")
    assert base != dcp.Metadata(sdm, planner_data={"x": ("x",)},
                                version="safetensors")
    assert base != dcp.Metadata(sdm, planner_data={"x": ("x",)},
                                version="dcp-1",
                                storage_meta=dcp.StorageMeta("elsewhere"))
    idx = dcp.MetadataIndex("x")
    assert base != dcp.Metadata(
        sdm, planner_data={"x": ("x",)}, version="dcp-1",
        storage_data={idx: dcp.StorageInfo("__0_0.distcp", 0, 8)})


def test_tensor_properties_default_dtype_is_torchs_default():
    assert dcp.TensorProperties().dtype == torch.get_default_dtype()
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert dcp.TensorProperties().dtype == torch.float64
    finally:
        torch.set_default_dtype(old)
    assert dcp.TensorProperties(dtype=torch.int8).dtype == torch.int8


# -- 5. failures of a failure in one process ---------------------------------

def _check_local_failures(exc):
    assert list(exc.failures) == [0], exc.failures
    failure, stack = exc.failures[0]
    assert type(failure) is type(exc)
    assert failure.code == exc.code and failure.msg == exc.msg
    assert failure.failures == {}
    assert isinstance(stack, traceback.StackSummary)


def test_local_engine_failure_lists_this_rank(tmp_path):
    a = str(tmp_path / "a")
    dcp.save({"w": torch.ones(2)}, checkpoint_id=a)
    with pytest.raises(dcp.CheckpointNotFoundError) as e:
        dcp.load({"w": torch.zeros(2), "missing": torch.zeros(1)},
                 checkpoint_id=a)
    _check_local_failures(e.value)
    with pytest.raises(dcp.CheckpointValueError) as e:
        dcp.load({"w": torch.zeros(3)}, checkpoint_id=a)
    _check_local_failures(e.value)
    with pytest.raises(dcp.CheckpointFileNotFoundError) as e:
        dcp.load({"w": torch.zeros(2)}, checkpoint_id=str(tmp_path / "no"))
    _check_local_failures(e.value)
    with pytest.raises(dcp.CheckpointFileNotFoundError) as e:
        dcp.read_metadata(str(tmp_path / "no"))
    _check_local_failures(e.value)
    with pytest.raises(dcp.CheckpointExistsError) as e:
        dcp.save({"w": torch.ones(2)},
                 storage_writer=dcp.FileSystemWriter(a, overwrite=False))
    _check_local_failures(e.value)
    # Still picklable (the PROCESS writer sends exceptions back).
    back = pickle.loads(pickle.dumps(e.value))
    assert type(back) is dcp.CheckpointExistsError
    assert type(back.failures[0][0]) is dcp.CheckpointExistsError


def test_from_status_local_and_shared_failures():
    local = dcp.errors.from_status(_lib.DATA_LOSS, "bad", rank=3)
    assert list(local.failures) == [3]
    assert local.failures[3][0].msg == "bad"
    shared = dcp.errors.from_status(_lib.DATA_LOSS, "bad",
                                    [(1, 15, "rank 1 bad")])
    assert list(shared.failures) == [1]  # as the engine reported them


# -- 6. a checkpoint torch.distributed.checkpoint wrote ----------------------

# torch: "... uninitialized, assuming the intent is to save in a single
# process."
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_torch_dcp_checkpoint_is_named_not_corrupt(tmp_path):
    import torch.distributed.checkpoint as tdcp
    path = str(tmp_path / "torch")
    tdcp.save({"w": torch.ones(3), "n": 5}, checkpoint_id=path, no_dist=True)
    with open(os.path.join(path, ".metadata"), "rb") as f:
        assert f.read(1) == b"\x80"
    for call in (
            lambda: dcp.load({"w": torch.zeros(3)}, checkpoint_id=path),
            lambda: dcp.load({"w": torch.zeros(3), "n": 0},
                             checkpoint_id=path),
            lambda: dcp.load({"w": torch.zeros(3)},
                             storage_reader=dcp.FileSystemReader(path)),
            lambda: dcp.read_metadata(path),
            lambda: dcp.FileSystemReader(path).read_metadata()):
        with pytest.raises(dcp.CheckpointNotImplementedError,
                           match="written by torch.distributed.checkpoint"
                           ) as e:
            call()
        assert isinstance(e.value, NotImplementedError)
        assert e.value.code == _lib.UNIMPLEMENTED
        assert "dcp.save" in str(e.value) and path in str(e.value)
        assert isinstance(e.value.__cause__, dcp.CheckpointCorruptError)
        _check_local_failures(e.value)
        assert "dcp.format_utils.torch_dcp_to_dcp" in str(e.value)
    # What the message says works: the converter, and torch loads it, dcp
    # saves it.
    converted = str(tmp_path / "converted")
    dcp.format_utils.torch_dcp_to_dcp(path, converted)
    got = dcp.format_utils.load_all(converted)
    assert got.keys() == {"w", "n"} and got["n"] == 5
    assert torch.equal(got["w"], torch.ones(3))
    sd = {"w": torch.zeros(3), "n": 0}
    tdcp.load(sd, checkpoint_id=path, no_dist=True)
    out = str(tmp_path / "dcp")
    dcp.save(sd, checkpoint_id=out)
    back = {"w": torch.zeros(3), "n": 0}
    dcp.load(back, checkpoint_id=out)
    assert torch.equal(back["w"], torch.ones(3)) and back["n"] == 5


def test_damaged_dcp_metadata_is_still_corrupt(tmp_path):
    path = str(tmp_path / "a")
    dcp.save({"w": torch.ones(3)}, checkpoint_id=path)
    with open(os.path.join(path, ".metadata"), "r+b") as f:
        f.write(b"\x00\x01\x02\x03")
    with pytest.raises(dcp.CheckpointCorruptError):
        dcp.load({"w": torch.zeros(3)}, checkpoint_id=path)
    with pytest.raises(dcp.CheckpointCorruptError):
        dcp.read_metadata(path)


# -- 7. read_metadata of a MEGA directory ------------------------------------

def test_read_metadata_of_a_mega_directory(tmp_path):
    path = str(tmp_path / "mega")
    saved = dcp.save({"w": torch.arange(6.0).reshape(2, 3), "n": 4},
                     storage_writer=dcp.MegaStorageWriter(path))
    md = dcp.read_metadata(path)
    assert md == dcp.MegaStorageReader(path).read_metadata()
    assert md == dcp.read_metadata("mega://" + os.path.abspath(path))
    assert set(md.state_dict_metadata) == {"w", "n"}
    assert md.state_dict_metadata["w"].size == (2, 3)
    assert set(saved.state_dict_metadata) == set(md.state_dict_metadata)
    # As load: the same directory loads without a storage_reader.
    dst = {"w": torch.zeros(2, 3), "n": 0}
    dcp.load(dst, checkpoint_id=path)
    assert dst["n"] == 4


# torch.distributed.checkpoint's submodules and the names of each that dcp
# has under the same module path (`from torch.distributed.checkpoint.X
# import Y` becomes `from dcp.X import Y`).
_SUBMODULE_NAMES = {
    "staging": ["DefaultStager", "StagingOptions", "AsyncStager",
                "BlockingAsyncStager"],
    "state_dict_saver": ["save_state_dict", "save", "async_save",
                         "AsyncCheckpointerType", "AsyncSaveResponse"],
    "state_dict_loader": ["load_state_dict", "load"],
    "filesystem": ["FileSystemWriter", "FileSystemReader", "FileSystem",
                   "FileSystemBase", "SerializationFormat"],
    "default_planner": ["DefaultSavePlanner", "DefaultLoadPlanner"],
    "api": ["CheckpointException"],
    "hf_storage": ["HuggingFaceStorageWriter", "HuggingFaceStorageReader"],
    "planner": ["WriteItemType", "LoadItemType", "BytesIOWriteData",
                "TensorWriteData", "WriteItem", "ReadItem", "SavePlan",
                "LoadPlan", "SavePlanner", "LoadPlanner"],
    "storage": ["StorageWriter", "StorageReader"],
    "metadata": ["ChunkStorageMetadata", "TensorStorageMetadata",
                 "BytesStorageMetadata", "Metadata", "MetadataIndex",
                 "TensorProperties", "StorageMeta"],
    "stateful": ["Stateful"],
    "format_utils": ["dcp_to_torch_save", "torch_save_to_dcp",
                     "BroadcastingTorchSaveReader", "DynamicMetaLoadPlanner"],
    "state_dict": ["StateDictOptions", "get_model_state_dict",
                   "get_optimizer_state_dict", "get_state_dict",
                   "set_model_state_dict", "set_optimizer_state_dict",
                   "set_state_dict"],
}


@pytest.mark.parametrize("module", sorted(_SUBMODULE_NAMES))
def test_torchs_submodule_paths_import_the_same_objects(module):
    import importlib
    torchs = importlib.import_module(f"torch.distributed.checkpoint.{module}")
    ours = importlib.import_module(f"dcp.{module}")
    for name in _SUBMODULE_NAMES[module]:
        assert name in torchs.__all__, (module, name)
        assert name in ours.__all__, (module, name)
        obj = getattr(ours, name)
        # The same object as dcp's top-level name (or format_utils').
        top = getattr(dcp, name, None) or getattr(dcp.format_utils, name,
                                                  None) or \
            getattr(dcp.stager, name)
        assert obj is top, (module, name)


def test_the_seeds_submodules_are_attributes_of_the_package():
    """After `import dcp`, the submodules torch's package exposes as
    attributes are there too (code written for `import
    torch.distributed.checkpoint as dcp` reaches them so)."""
    import importlib
    for name in ("api", "default_planner", "filesystem", "hf_storage",
                 "staging", "state_dict_loader", "state_dict_saver",
                 "state_dict", "metadata", "planner", "stateful", "storage",
                 "format_utils"):
        assert getattr(dcp, name) is importlib.import_module(f"dcp.{name}")
    assert dcp.state_dict_saver.AsyncCheckpointerType.PROCESS is \
        dcp.AsyncCheckpointerType.PROCESS
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        dcp.nope
