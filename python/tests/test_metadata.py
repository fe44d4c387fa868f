"""Inspecting a checkpoint without loading it."""

import dataclasses

import pytest
import torch

import dcp


def test_metadata_describes_every_item(ckpt):
    state = {
        "model": {"w": torch.zeros(4, 3, dtype=torch.bfloat16),
                  "b": torch.zeros(3, dtype=torch.float8_e4m3fn)},
        "step": 7, "lr": [0.1, 0.2],
        # A 1-rank "sharding": the chunk must cover the tensor.
        "shard": dcp.ShardedTensor(torch.zeros(6, 5), (6, 5), (0, 0)),
    }
    returned = dcp.save(state, checkpoint_id=ckpt,
                        planner=dcp.DefaultSavePlanner())
    md = dcp.read_metadata(ckpt)
    sdm = md.state_dict_metadata
    assert list(sdm) == sorted(sdm)
    assert set(sdm) == {"model.w", "model.b", "step", "lr.0", "lr.1",
                        "shard"}
    w = sdm["model.w"]
    assert isinstance(w, dcp.TensorStorageMetadata)
    assert w.size == (4, 3) and w.properties.dtype == torch.bfloat16
    assert w.chunks == (dcp.ChunkStorageMetadata((0, 0), (4, 3)),)
    assert sdm["model.b"].properties.dtype == torch.float8_e4m3fn
    assert sdm["shard"].size == (6, 5)
    assert sdm["shard"].chunks == (dcp.ChunkStorageMetadata((0, 0), (6, 5)),)
    assert isinstance(sdm["step"], dcp.BytesStorageMetadata)
    assert md.planner_data["lr.1"] == ("lr", 1)
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
