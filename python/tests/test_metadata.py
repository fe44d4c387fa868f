"""Inspecting a checkpoint without loading it."""

import copy
import ctypes
import dataclasses
import gc
import io
import pickle

import pytest
import torch

import dcp


def test_metadata_describes_every_item(ckpt):
    state = {
        "model": {"w": torch.zeros(4, 3, dtype=torch.bfloat16),
                  "b": torch.zeros(3, dtype=torch.float8_e4m3fn)},
        "step": 7, "lr": [0.1, 0.2], "bufs": [torch.zeros(2)],
        # A 1-rank "sharding": the chunk must cover the tensor.
        "shard": dcp.ShardedTensor(torch.zeros(6, 5), (6, 5), (0, 0)),
    }
    returned = dcp.save(state, checkpoint_id=ckpt,
                        planner=dcp.DefaultSavePlanner())
    md = dcp.read_metadata(ckpt)
    sdm = md.state_dict_metadata
    assert list(sdm) == sorted(sdm)
    assert set(sdm) == {"model.w", "model.b", "step", "lr", "bufs.0",
                        "shard"}
    w = sdm["model.w"]
    assert isinstance(w, dcp.TensorStorageMetadata)
    assert w.size == (4, 3) and w.properties.dtype == torch.bfloat16
    assert w.chunks == (dcp.ChunkStorageMetadata((0, 0), (4, 3)),)
    assert sdm["model.b"].properties.dtype == torch.float8_e4m3fn
    assert sdm["shard"].size == (6, 5)
    assert sdm["shard"].chunks == (dcp.ChunkStorageMetadata((0, 0), (6, 5)),)
    assert isinstance(sdm["step"], dcp.BytesStorageMetadata)
    # torch.Size, as in torch's metadata.
    assert type(w.size) is torch.Size and w.size.numel() == 12
    assert type(w.chunks[0].offsets) is torch.Size
    assert type(w.chunks[0].sizes) is torch.Size
    assert isinstance(sdm["lr"], dcp.BytesStorageMetadata)  # one value
    assert md.planner_data["lr"] == ("lr",)
    assert md.planner_data["bufs.0"] == ("bufs", 0)
    assert md.planner_data["model.w"] == ("model", "w")
    assert md.version == "dcp-1"
    assert md.storage_meta.checkpoint_id == ckpt
    assert md.storage_meta.save_id == returned.storage_meta.save_id
    assert len(md.storage_meta.save_id) == 16
    assert set(returned.state_dict_metadata) == set(sdm)
    # Read-only.
    with pytest.raises(TypeError):
        sdm["x"] = None
    with pytest.raises(dataclasses.FrozenInstanceError):
        w.size = (1,)
    with pytest.raises(AttributeError):
        md.version = "x"
    assert dcp.FileSystemReader(ckpt).read_metadata().storage_meta.save_id \
        == md.storage_meta.save_id


def test_metadata_index():
    i = dcp.MetadataIndex("a.b", [1, 2])
    assert i.offset == (1, 2) and i == dcp.MetadataIndex("a.b", (1, 2), 5)


def test_library_version():
    assert dcp.library_version().count(".") == 2


def test_requires_grad_round_trips_through_the_metadata(ckpt):
    model = torch.nn.Linear(3, 2)
    model.bias.requires_grad_(False)  # a frozen parameter
    state = {"model": dict(model.named_parameters()),
             "buf": torch.ones(2), "np": __import__("numpy").zeros(3),
             "shard": dcp.ShardedTensor(
                 torch.zeros(4, requires_grad=True), (4,), (0,))}
    returned = dcp.save(state, checkpoint_id=ckpt)
    for md in (returned, dcp.read_metadata(ckpt)):
        sdm = md.state_dict_metadata
        assert sdm["model.weight"].properties.requires_grad is True
        assert sdm["model.bias"].properties.requires_grad is False
        assert sdm["buf"].properties.requires_grad is False
        assert sdm["np"].properties.requires_grad is False
        assert sdm["shard"].properties.requires_grad is True


@pytest.mark.parametrize("kind", ["THREAD", "PROCESS"])
def test_requires_grad_through_async_save(ckpt, kind):
    state = {"w": torch.nn.Parameter(torch.ones(3)), "b": torch.ones(2)}
    md = dcp.async_save(
        state, checkpoint_id=ckpt,
        async_checkpointer_type=getattr(dcp.AsyncCheckpointerType, kind),
    ).upload_completion.result(timeout=120)
    for m in (md, dcp.read_metadata(ckpt)):
        assert m.state_dict_metadata["w"].properties.requires_grad is True
        assert m.state_dict_metadata["b"].properties.requires_grad is False


def test_version_and_storage_data(ckpt):
    state = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3),
             "step": 3}
    returned = dcp.save(state, checkpoint_id=ckpt)
    md = dcp.read_metadata(ckpt)
    assert md.version == returned.version == "dcp-1"
    for m in (returned, md):
        data = m.storage_data
        assert set(data) == {dcp.MetadataIndex("w", (0, 0)),
                             dcp.MetadataIndex("step")}
        w = data[dcp.MetadataIndex("w", (0, 0))]
        assert isinstance(w, dcp.StorageInfo)
        assert w.length == 24 and w.offset >= 0
        # The bytes are where the storage data says.
        with open(f"{ckpt}/{w.relative_path}", "rb") as f:
            f.seek(w.offset)
            assert f.read(w.length) == state["w"].numpy().tobytes()
        assert data[dcp.MetadataIndex("step")].length > 0
    with pytest.raises(TypeError):
        md.storage_data[dcp.MetadataIndex("x")] = None
    # The seed's constructor: Metadata(state_dict_metadata, planner_data,
    # storage_data, storage_meta, version).
    made = dcp.Metadata(md.state_dict_metadata, md.planner_data,
                        dict(md.storage_data), md.storage_meta, md.version)
    assert made.version == "dcp-1"
    assert made.storage_data == dict(md.storage_data)


def _fields(md):
    return (dict(md.state_dict_metadata), dict(md.planner_data),
            dict(md.storage_data), md.storage_meta, md.version)


def test_copies_and_pickles_are_plain_metadata(tmp_path):
    """copy, deepcopy and pickle give a Metadata without the C handle:
    equal to the original, and still readable after the original (and its
    handle) is gone and another checkpoint's metadata took its memory."""
    first, second = str(tmp_path / "first"), str(tmp_path / "second")
    dcp.save({"first": torch.ones(2), "n": 1}, checkpoint_id=first)
    dcp.save({"second": torch.ones(3), "other": 1}, checkpoint_id=second)
    md = dcp.read_metadata(first)
    want = _fields(md)
    copies = [copy.copy(md), copy.deepcopy(md),
              pickle.loads(pickle.dumps(md))]
    del md
    gc.collect()
    others = [dcp.read_metadata(second) for _ in range(4)]
    for c in copies:
        assert c._handle is None
        assert _fields(c) == want
        assert list(c.state_dict_metadata) == ["first", "n"]
    assert list(others[0].state_dict_metadata) == ["other", "second"]
    # A copy of the attributes shares the handle, and keeps it alive.
    md = dcp.read_metadata(first)
    twin = dcp.Metadata.__new__(dcp.Metadata)
    twin.__dict__.update(md.__dict__)
    del md
    gc.collect()
    others = [dcp.read_metadata(second) for _ in range(4)]
    assert list(twin.state_dict_metadata) == ["first", "n"]
    assert copy.copy(dcp.Metadata()).planner_data is None


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_metadata_pickles_with_every_protocol_and_torch_save(tmp_path,
                                                             protocol):
    """A torch.memory_format cannot be pickled with protocols 0-3 (torch.save
    uses 2): TensorProperties stores its name, and the copy has the same
    torch.memory_format back."""
    ckpt = str(tmp_path / "ckpt")
    dcp.save({"w": torch.arange(6.0).reshape(2, 3), "n": 1},
             checkpoint_id=ckpt)
    md = dcp.read_metadata(ckpt)
    want = _fields(md)
    buffer = io.BytesIO()
    torch.save(md, buffer, pickle_protocol=protocol)
    buffer.seek(0)
    copies = [pickle.loads(pickle.dumps(md, protocol=protocol)),
              torch.load(buffer, weights_only=False)]
    for c in copies:
        assert _fields(c) == want
        props = c.state_dict_metadata["w"].properties
        assert props.memory_format is torch.contiguous_format
        assert props.layout is torch.strided
        assert props.dtype is torch.float32
    # Every memory format torch has, not only the default.
    for memory_format in (torch.channels_last, torch.channels_last_3d,
                          torch.preserve_format, torch.contiguous_format):
        props = dcp.TensorProperties(dtype=torch.int8, requires_grad=True,
                                     memory_format=memory_format,
                                     pin_memory=True)
        back = pickle.loads(pickle.dumps(props, protocol=protocol))
        assert back == props
        assert back.memory_format is memory_format


def test_tensor_properties_pickled_by_field_names_load_back():
    """A TensorProperties pickled before it had __getstate__ carries its
    fields by name (a dict state): it loads with those values, not with the
    names."""
    props = dcp.TensorProperties.__new__(dcp.TensorProperties)
    props.__setstate__({"dtype": torch.int8, "layout": torch.strided,
                        "requires_grad": True,
                        "memory_format": torch.channels_last,
                        "pin_memory": True})
    assert props == dcp.TensorProperties(dtype=torch.int8, requires_grad=True,
                                         memory_format=torch.channels_last,
                                         pin_memory=True)


class _NamesNotUtf8:
    """The library, but the first item's name read from metadata is
    b"w\\xff" (a checkpoint the engine let through with such a name)."""

    def __init__(self, real):
        self._real = real
        self._kept = []  # the replaced records and text, alive while read

    def __getattr__(self, name):
        return getattr(self._real, name)

    def dcp_metadata_items_packed(self, handle, records, num_records, text,
                                  text_size):
        code = self._real.dcp_metadata_items_packed(
            handle, records, num_records, text, text_size)
        n, size = num_records._obj.value, text_size._obj.value
        new_records = (ctypes.c_int64 * n)(*records._obj[:n])
        new_records[0], new_records[1] = size, 2  # the name: b"w\xff"
        new_text = ctypes.create_string_buffer(
            ctypes.string_at(text._obj, size) + b"w\xff")
        self._kept += [new_records, new_text]
        records._obj.contents = ctypes.c_int64.from_buffer(new_records)
        text._obj.contents = ctypes.c_char.from_buffer(new_text)
        text_size._obj.value = size + 2
        return code


def test_a_name_that_is_not_utf8_is_corrupt_data(ckpt, monkeypatch):
    from dcp import _lib, format_utils
    dcp.save({"w": torch.ones(2)}, checkpoint_id=ckpt)
    real = _lib.lib()
    monkeypatch.setattr(_lib, "lib", lambda: _NamesNotUtf8(real))
    message = (f"the checkpoint in {ckpt} is corrupt: its metadata holds a "
               "name that is not UTF-8 (b'w\\xff': invalid start byte at "
               "byte 1)")
    for read in (lambda: dcp.read_metadata(ckpt).state_dict_metadata,
                 lambda: dcp.FileSystemReader(ckpt).read_metadata()
                 .planner_data,
                 lambda: format_utils.load_all(ckpt)):
        with pytest.raises(dcp.CheckpointCorruptError) as e:
            read()
        assert str(e.value) == message
        assert e.value.code == _lib.DATA_LOSS
