"""The seed's classes: every one is exported; the plan data classes have
the seed's fields; planners and storage objects whose overrides dcp would
not call are refused; CheckpointableTensor shards round-trip."""

import dataclasses
import os

import pytest
import torch

import dcp

# The seed's 36 classes and 12 functions (tensorplay.distributed.checkpoint).
SEED_NAMES = [
    "AsyncCheckpointerType", "AsyncSaveResponse", "BytesIOWriteData",
    "BytesStorageMetadata", "CheckpointableTensor", "ChunkStorageMetadata",
    "DefaultLoadPlanner", "DefaultSavePlanner", "FileSystem",
    "FileSystemBase", "FileSystemReader", "FileSystemWriter",
    "HuggingFaceStorageReader", "HuggingFaceStorageWriter", "LoadItemType",
    "LoadPlan", "LoadPlanner", "MegaStorageReader", "MegaStorageWriter",
    "Metadata", "MetadataIndex", "QuantizedHuggingFaceStorageReader",
    "ReadItem", "SavePlan", "SavePlanner", "SerializationFormat",
    "StateDictOptions", "Stateful", "StorageMeta", "StorageReader",
    "StorageWriter", "TensorProperties", "TensorStorageMetadata",
    "TensorWriteData", "WriteItem", "WriteItemType", "async_save",
    "get_model_state_dict", "get_optimizer_state_dict", "get_state_dict",
    "load_sharded_optimizer_state_dict", "load_state_dict", "load",
    "save_state_dict", "save", "set_model_state_dict",
    "set_optimizer_state_dict", "set_state_dict", "CheckpointException",
]


def test_every_seed_name_is_exported():
    assert len(SEED_NAMES) == 49
    missing = [n for n in SEED_NAMES if not hasattr(dcp, n)]
    assert missing == []
    assert set(SEED_NAMES) <= set(dcp.__all__)


def test_plan_data_classes_have_the_seed_fields():
    fields = {
        dcp.BytesIOWriteData: ["nbytes"],
        dcp.TensorWriteData: ["chunk", "properties", "size"],
        dcp.WriteItem: ["index", "type", "bytes_io_data", "tensor_data"],
        dcp.ReadItem: ["type", "dest_index", "dest_offsets",
                       "storage_index", "storage_offsets", "lengths"],
        dcp.SavePlan: ["items", "storage_data", "planner_data", "usable"],
        dcp.LoadPlan: ["items", "storage_data", "planner_data"],
    }
    for cls, names in fields.items():
        assert [f.name for f in dataclasses.fields(cls)] == names, cls
    assert [m.name for m in dcp.WriteItemType] == ["TENSOR", "SHARD",
                                                   "BYTE_IO"]
    assert [m.name for m in dcp.LoadItemType] == ["TENSOR", "BYTE_IO"]
    item = dcp.WriteItem(
        index=dcp.MetadataIndex("w", (0, 0)), type=dcp.WriteItemType.SHARD,
        tensor_data=dcp.TensorWriteData(
            chunk=dcp.ChunkStorageMetadata((0, 0), (2, 3)),
            properties=dcp.TensorProperties(dtype=torch.bfloat16),
            size=(4, 3)))
    assert item.tensor_storage_size() == 2 * 3 * 2
    assert dcp.WriteItem(index=dcp.MetadataIndex("v"),
                         type=dcp.WriteItemType.BYTE_IO,
                         bytes_io_data=dcp.BytesIOWriteData(5)
                         ).tensor_storage_size() is None
    assert dcp.SavePlan([item]).usable is True


def test_dcp_classes_are_instances_of_the_seed_protocols(tmp_path):
    assert isinstance(dcp.DefaultSavePlanner(), dcp.SavePlanner)
    assert isinstance(dcp.DefaultLoadPlanner(), dcp.LoadPlanner)
    for cls in (dcp.FileSystemWriter, dcp.HuggingFaceStorageWriter,
                dcp.MegaStorageWriter):
        assert issubclass(cls, dcp.StorageWriter), cls
    for cls in (dcp.FileSystemReader, dcp.HuggingFaceStorageReader,
                dcp.QuantizedHuggingFaceStorageReader,
                dcp.MegaStorageReader):
        assert issubclass(cls, dcp.StorageReader), cls
    with pytest.raises(TypeError):
        dcp.SavePlanner()  # abstract


class RaisingPlanner(dcp.DefaultSavePlanner):
    def create_local_plan(self):
        raise AssertionError("dcp cannot call this")


class OptionsOnlyPlanner(dcp.DefaultSavePlanner):
    def __init__(self):
        super().__init__(dedup_save_to_lowest_rank=True)


class RaisingLoadPlanner(dcp.DefaultLoadPlanner):
    def transform_tensor(self, read_item, tensor):
        raise AssertionError("dcp cannot call this")


class RaisingWriter(dcp.FileSystemWriter):
    def write_data(self, plan, planner):
        raise AssertionError("dcp cannot call this")


class RaisingReader(dcp.FileSystemReader):
    def read_data(self, plan, planner):
        raise AssertionError("dcp cannot call this")


class NotAPlanner:
    pass


def test_overriding_planners_are_refused_before_anything_is_written(ckpt):
    sd = {"w": torch.arange(4.0)}
    with pytest.raises(TypeError,
                       match=r"RaisingPlanner overrides "
                       r"RaisingPlanner\.create_local_plan"):
        dcp.save(sd, checkpoint_id=ckpt, planner=RaisingPlanner())
    with pytest.raises(TypeError, match=r"NotAPlanner is not supported"):
        dcp.save(sd, checkpoint_id=ckpt, planner=NotAPlanner())
    assert not os.path.exists(os.path.join(ckpt, ".metadata"))
    # Options only: honoured.
    dcp.save(sd, checkpoint_id=ckpt, planner=OptionsOnlyPlanner())
    out = {"w": torch.zeros(4)}
    with pytest.raises(TypeError, match=r"RaisingLoadPlanner\."
                       r"transform_tensor"):
        dcp.load(out, checkpoint_id=ckpt, planner=RaisingLoadPlanner())
    assert torch.equal(out["w"], torch.zeros(4))
    dcp.load(out, checkpoint_id=ckpt)
    assert torch.equal(out["w"], torch.arange(4.0))


@pytest.mark.parametrize("kind", ["THREAD", "PROCESS"])
def test_async_save_refuses_overriding_planners_and_writers(ckpt, kind):
    sd = {"w": torch.arange(4.0)}
    kind = dcp.AsyncCheckpointerType[kind]
    with pytest.raises(TypeError, match=r"create_local_plan"):
        dcp.async_save(sd, checkpoint_id=ckpt, planner=RaisingPlanner(),
                       async_checkpointer_type=kind)
    with pytest.raises(TypeError, match=r"RaisingWriter\.write_data"):
        dcp.async_save(sd, storage_writer=RaisingWriter(ckpt),
                       async_checkpointer_type=kind)
    assert not os.path.exists(os.path.join(ckpt, ".metadata"))


def test_overriding_storage_is_refused(ckpt):
    sd = {"w": torch.arange(4.0)}
    with pytest.raises(TypeError, match=r"RaisingWriter overrides "
                       r"RaisingWriter\.write_data"):
        dcp.save(sd, storage_writer=RaisingWriter(ckpt))
    assert not os.path.exists(os.path.join(ckpt, ".metadata"))
    dcp.save(sd, checkpoint_id=ckpt)
    out = {"w": torch.zeros(4)}
    with pytest.raises(TypeError, match=r"RaisingReader\.read_data"):
        dcp.load(out, storage_reader=RaisingReader(ckpt))
    assert torch.equal(out["w"], torch.zeros(4))


def checkpointable(t, global_shape, global_offset, local_offset, size):
    t.global_shape = global_shape
    t.global_offsets = (global_offset,)
    t.local_offsets = (local_offset,)
    t.local_sizes = (size,)
    return t


def test_checkpointable_tensor_saves_its_shard_of_the_global_tensor(ckpt):
    # A padded local buffer: rows 1-2 hold the whole 2x3 global tensor.
    local = torch.full((4, 3), -1.0)
    local[1:3] = torch.arange(6.0).reshape(2, 3)
    t = checkpointable(local, (2, 3), (0, 0), (1, 0), (2, 3))
    assert isinstance(t, dcp.CheckpointableTensor)
    assert not isinstance(torch.zeros(1), dcp.CheckpointableTensor)
    dcp.save({"w": t}, checkpoint_id=ckpt)
    md = dcp.read_metadata(ckpt)
    assert md.state_dict_metadata["w"].size == (2, 3)
    plain = {"w": torch.zeros(2, 3)}
    dcp.load(plain, checkpoint_id=ckpt)
    assert torch.equal(plain["w"], torch.arange(6.0).reshape(2, 3))
    # Global row 1 into row 2 of another padded buffer.
    dest = torch.full((3, 3), 7.0)
    checkpointable(dest, (2, 3), (1, 0), (2, 0), (1, 3))
    dcp.load({"w": dest}, checkpoint_id=ckpt)
    assert torch.equal(dest[2], torch.arange(3.0, 6.0))
    assert torch.equal(dest[:2], torch.full((2, 3), 7.0))  # untouched


def several(t, global_shape, shards):
    """`t` as a CheckpointableTensor of `shards`: (global offset, local
    offset, size) each."""
    t.global_shape = global_shape
    t.global_offsets = tuple(g for g, _, _ in shards)
    t.local_offsets = tuple(lo for _, lo, _ in shards)
    t.local_sizes = tuple(n for _, _, n in shards)
    return t


@pytest.mark.parametrize("kind", ["sync", "THREAD", "PROCESS"])
def test_checkpointable_tensor_with_several_shards(ckpt, kind):
    # Global rows 0-3 and 4-7 of an 8x3 tensor in one local buffer with a
    # padding row between them; a second tensor split by columns into two
    # shards of one buffer.
    full = torch.arange(24.0).reshape(8, 3)
    a = torch.full((9, 3), -1.0)
    a[0:4], a[5:9] = full[0:4], full[4:8]
    a = several(a, (8, 3), [((0, 0), (0, 0), (4, 3)),
                            ((4, 0), (5, 0), (4, 3))])
    b = several(full.clone(), (8, 3), [((0, 0), (0, 0), (8, 2)),
                                       ((0, 2), (0, 2), (8, 1))])
    sd = {"a": a, "b": b, "step": 3}
    if kind == "sync":
        dcp.save(sd, checkpoint_id=ckpt)
    else:
        kinds = dcp.AsyncCheckpointerType
        dcp.async_save(sd, checkpoint_id=ckpt,
                       async_checkpointer_type=getattr(kinds, kind)
                       ).upload_completion.result()
    md = dcp.read_metadata(ckpt)
    assert md.state_dict_metadata["a"].size == (8, 3)
    assert sorted(c.offsets for c in md.state_dict_metadata["a"].chunks) \
        == [(0, 0), (4, 0)]
    assert sorted(c.offsets for c in md.state_dict_metadata["b"].chunks) \
        == [(0, 0), (0, 2)]
    plain = {"a": torch.zeros(8, 3), "b": torch.zeros(8, 3), "step": 0}
    dcp.load(plain, checkpoint_id=ckpt)
    assert torch.equal(plain["a"], full) and torch.equal(plain["b"], full)
    # Several shards load in place, resharded across the saved chunks:
    # row 7 and rows 3-4 (one from each saved chunk) into a fresh padded
    # buffer (its padding untouched), as bf16.
    dest = torch.full((4, 3), 9.0, dtype=torch.bfloat16)
    several(dest, (8, 3), [((7, 0), (0, 0), (1, 3)),
                           ((3, 0), (2, 0), (2, 3))])
    both = {"a": dest, "b": torch.zeros(8, 3), "step": 0}
    ptr = dest.data_ptr()
    dcp.load(both, checkpoint_id=ckpt)
    assert both["a"] is dest and dest.data_ptr() == ptr
    assert torch.equal(dest[0], full[7].bfloat16())
    assert torch.equal(dest[1], torch.full((3,), 9.0, dtype=torch.bfloat16))
    assert torch.equal(dest[2:4], full[3:5].bfloat16())
    assert torch.equal(both["b"], full)
    assert both["step"] == 3


def test_checkpointable_tensor_with_several_shards_converts(ckpt):
    # Integer conversions go through Python temporaries, one per chunk; a
    # later key needing one too must still get it.
    full = torch.arange(-12, 12, dtype=torch.int32).reshape(8, 3)
    dcp.save({"a": full, "z": torch.arange(5, dtype=torch.int32)},
             checkpoint_id=ckpt)
    dest = torch.full((5, 3), 9, dtype=torch.int64)
    several(dest, (8, 3), [((0, 0), (0, 0), (2, 3)),
                           ((6, 0), (3, 0), (2, 3))])
    sd = {"a": dest, "z": torch.zeros(5, dtype=torch.int64)}
    dcp.load(sd, checkpoint_id=ckpt)
    assert sd["a"] is dest
    assert torch.equal(dest[0:2], full[0:2].long())
    assert torch.equal(dest[2], torch.full((3,), 9, dtype=torch.int64))
    assert torch.equal(dest[3:5], full[6:8].long())
    assert torch.equal(sd["z"], torch.arange(5, dtype=torch.int64))
    # The sharded tensor as the last key that converts: its later chunks
    # still get their temporaries.
    dest = torch.full((5, 3), 9, dtype=torch.int64)
    several(dest, (8, 3), [((0, 0), (0, 0), (2, 3)),
                           ((6, 0), (3, 0), (2, 3))])
    sd = {"a": dest, "z": torch.zeros(5, dtype=torch.int32)}
    dcp.load(sd, checkpoint_id=ckpt)
    assert torch.equal(dest[0:2], full[0:2].long())
    assert torch.equal(dest[3:5], full[6:8].long())


def test_checkpointable_tensor_errors_name_the_key(ckpt):
    bad = checkpointable(torch.zeros(2, 3), (4, 3), (3, 0), (0, 0), (2, 3))
    with pytest.raises(ValueError, match=r"'w': shard .* does not fit"):
        dcp.save({"w": bad}, checkpoint_id=ckpt)
    two = several(torch.zeros(4, 3), (8, 3), [((0, 0), (0, 0), (2, 3)),
                                              ((4, 0), (2, 0), (3, 3))])
    with pytest.raises(ValueError, match=r"'w': shard 1 .* does not fit"):
        dcp.save({"w": two}, checkpoint_id=ckpt)
    # Two shards of one local buffer covering the same global rows.
    overlap = several(torch.zeros(4, 3), (8, 3), [((0, 0), (0, 0), (2, 3)),
                                                  ((1, 0), (2, 0), (2, 3))])
    with pytest.raises(Exception, match=r"w.*overlap"):
        dcp.save({"w": overlap}, checkpoint_id=ckpt)
    assert not os.path.exists(os.path.join(ckpt, ".metadata"))
    # Two shards in the same local rows: a load would write both there.
    dcp.save({"w": torch.zeros(8, 3)}, checkpoint_id=ckpt)
    aliased = several(torch.zeros(4, 3), (8, 3), [((0, 0), (0, 0), (2, 3)),
                                                  ((4, 0), (1, 0), (2, 3))])
    with pytest.raises(ValueError, match=r"'w': shards 0 and 1 share local"):
        dcp.load({"w": aliased}, checkpoint_id=ckpt)
    partial = torch.zeros(2)
    partial.global_shape = (4,)
    with pytest.raises(ValueError, match=r"'w': .*global_offsets"):
        dcp.save({"w": partial}, checkpoint_id=ckpt)


def test_file_system_streams_paths_and_renames(tmp_path):
    fs = dcp.FileSystem()
    assert isinstance(fs, dcp.FileSystemBase)
    root = fs.init_path(str(tmp_path))
    sub = fs.concat_path(root, "a/b")
    fs.mkdir(sub)
    path = fs.concat_path(sub, "f.bin")
    with fs.create_stream(path, "wb") as stream:
        stream.write(b"bytes")
    fs.rename(path, fs.concat_path(sub, "g.bin"))
    assert not fs.exists(path)
    with fs.create_stream(fs.concat_path(sub, "g.bin"), "rb") as stream:
        assert stream.read() == b"bytes"
    fs.rm_file(fs.concat_path(sub, "g.bin"))
    assert not fs.exists(fs.concat_path(sub, "g.bin"))
    with pytest.raises(ValueError, match="not binary"):
        with fs.create_stream(fs.concat_path(sub, "h"), "w"):
            pass
    assert dcp.FileSystem.validate_checkpoint_id(str(tmp_path / "new"))
    assert not dcp.FileSystem.validate_checkpoint_id("s3://bucket/x")
