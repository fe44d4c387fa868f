"""HuggingFaceStorageWriter / HuggingFaceStorageReader against the
reference `safetensors` library: what dcp writes the library reads
bit-identically, and what the library writes dcp loads."""

import json
import os
import re

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
from safetensors import safe_open  # noqa: E402

import dcp  # noqa: E402
from dcp import _lib  # noqa: E402


def _state():
    g = torch.Generator().manual_seed(7)
    return {
        "embed.weight": torch.randn(16, 8, generator=g).to(torch.bfloat16),
        "layers.0.proj": torch.randn(8, 8, generator=g).to(
            torch.float8_e4m3fn),
        "layers.0.proj_e5m2": torch.randn(3, 5, generator=g).to(
            torch.float8_e5m2),
        "layers.0.bias": torch.randn(8, generator=g),
        "pos_ids": torch.arange(-6, 6, dtype=torch.int64).reshape(3, 4),
        "small_ints": torch.arange(10, dtype=torch.int8),
        "mask": torch.rand(5, 3, generator=g) > 0.5,
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.zeros(0, 4, dtype=torch.float16),
    }


_MAPPING = {"embed.weight": 1, "layers.0.proj": 1, "layers.0.proj_e5m2": 1,
            "small_ints": 1, "layers.0.bias": 2, "pos_ids": 2, "mask": 2,
            "scalar": 2, "empty": 2}


def _same_bytes(a, b):
    return (a.dtype == b.dtype and a.shape == b.shape and
            a.reshape(-1).view(torch.uint8).equal(
                b.reshape(-1).view(torch.uint8)))


def test_writer_files_read_by_safetensors(ckpt):
    state = _state()
    writer = dcp.HuggingFaceStorageWriter(
        ckpt, fqn_to_index_mapping=_MAPPING, thread_count=2)
    dcp.save(state, storage_writer=writer)

    files = sorted(f for f in os.listdir(ckpt) if not f.startswith("."))
    assert files == ["model-00001-of-00002.safetensors",
                     "model-00002-of-00002.safetensors",
                     "model.safetensors.index.json"]
    with open(os.path.join(ckpt, "model.safetensors.index.json")) as f:
        index = json.load(f)
    assert index["weight_map"] == {
        k: f"model-0000{v}-of-00002.safetensors" for k, v in _MAPPING.items()}
    assert index["metadata"]["total_size"] == sum(
        t.numel() * t.element_size() for t in state.values())

    loaded = {}
    for name in files[:2]:
        path = os.path.join(ckpt, name)
        with safe_open(path, framework="pt") as f:
            assert f.metadata() == {"format": "pt"}
            assert sorted(f.keys()) == sorted(
                k for k, v in _MAPPING.items() if name.startswith(
                    f"model-0000{v}"))
        loaded.update(safetensors_torch.load_file(path))
    assert loaded.keys() == state.keys()
    for key, t in state.items():
        assert _same_bytes(loaded[key], t), key


def test_reader_loads_files_of_safetensors(tmp_path):
    state = _state()
    # Two files with an index, as transformers' save_pretrained writes them.
    shards = {1: {}, 2: {}}
    for key, t in state.items():
        shards[_MAPPING[key]][key] = t
    weight_map = {}
    for i, tensors in shards.items():
        name = f"model-0000{i}-of-00002.safetensors"
        safetensors_torch.save_file(tensors, str(tmp_path / name),
                                    metadata={"format": "pt"})
        weight_map.update({k: name for k in tensors})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 0}, "weight_map": weight_map}))

    dest = {k: torch.empty_like(t) for k, t in state.items()}
    ptrs = {k: t.data_ptr() for k, t in dest.items()}
    dcp.load(dest, storage_reader=dcp.HuggingFaceStorageReader(
        str(tmp_path), thread_count=2))
    for key, t in state.items():
        assert dest[key].data_ptr() == ptrs[key], key  # In place.
        assert _same_bytes(dest[key], t), key


def test_reader_one_file_resharded(tmp_path):
    full = torch.arange(6 * 10, dtype=torch.float32).reshape(6, 10)
    safetensors_torch.save_file({"w": full, "b": full[0].clone()},
                                str(tmp_path / "model.safetensors"))
    # A rank's slice of the tensor (a ShardedTensor chunk) from one file.
    rows = torch.zeros(2, 10)
    dest = {"w": dcp.ShardedTensor(rows, (6, 10), (2, 0)),
            "b": torch.zeros(10)}
    dcp.load(dest, storage_reader=dcp.HuggingFaceStorageReader(
        str(tmp_path)))
    assert rows.equal(full[2:4])
    assert dest["b"].equal(full[0])


def test_roundtrip_through_dcp(ckpt):
    state = _state()
    dcp.save(state, storage_writer=dcp.HuggingFaceStorageWriter(ckpt))
    assert os.path.exists(os.path.join(ckpt, "model-00001-of-00001"
                                             ".safetensors"))
    dest = {k: torch.zeros_like(t) for k, t in state.items()}
    dcp.load(dest, checkpoint_id=ckpt,
             storage_reader=dcp.HuggingFaceStorageReader("unused"))
    for key, t in state.items():
        assert _same_bytes(dest[key], t), key


@pytest.mark.parametrize("kind", list(dcp.AsyncCheckpointerType))
def test_async_save(tmp_path, kind):
    state = _state()
    path = str(tmp_path / "hf")
    resp = dcp.async_save(state, async_checkpointer_type=kind,
                          storage_writer=dcp.HuggingFaceStorageWriter(
                              path, fqn_to_index_mapping=_MAPPING))
    resp.staging_completion.result(120)
    md = resp.upload_completion.result(120)
    assert md.state_dict_metadata["embed.weight"].size == (16, 8)
    loaded = {}
    for i in (1, 2):
        loaded.update(safetensors_torch.load_file(
            os.path.join(path, f"model-0000{i}-of-00002.safetensors")))
    for key, t in state.items():
        assert _same_bytes(loaded[key], t), key


def test_load_without_checkpoint(tmp_path):
    with pytest.raises(dcp.CheckpointFileNotFoundError):
        dcp.load({"w": torch.ones(1)},
                 storage_reader=dcp.HuggingFaceStorageReader(str(tmp_path)))


def test_non_tensor_value_names_its_key(ckpt):
    state = {"w": torch.ones(2), "optim": {"step": 3}}
    with pytest.raises(dcp.CheckpointValueError, match=r"optim\.step"):
        dcp.save(state, storage_writer=dcp.HuggingFaceStorageWriter(ckpt))
    assert not os.path.exists(
        os.path.join(ckpt, "model.safetensors.index.json"))


def test_mapping_missing_a_tensor(ckpt):
    writer = dcp.HuggingFaceStorageWriter(
        ckpt, fqn_to_index_mapping={"a": 1})
    with pytest.raises(dcp.CheckpointValueError, match=r"\bb\b"):
        dcp.save({"a": torch.ones(2), "b": torch.ones(2)},
                 storage_writer=writer)


def test_bad_arguments(ckpt):
    with pytest.raises(ValueError, match="file indices"):
        dcp.HuggingFaceStorageWriter(ckpt, fqn_to_index_mapping={"a": 0})
    with pytest.raises(ValueError, match="thread_count"):
        dcp.HuggingFaceStorageWriter(ckpt, thread_count=0)
    with pytest.raises(ValueError, match="thread_count"):
        dcp.HuggingFaceStorageReader(ckpt, thread_count=0)
    with pytest.raises(TypeError, match="storage_reader"):
        dcp.load({"w": torch.ones(1)}, checkpoint_id=ckpt,
                 storage_reader=dcp.HuggingFaceStorageWriter(ckpt))


def test_seed_signatures():
    import inspect
    w = inspect.signature(dcp.HuggingFaceStorageWriter)
    assert [(p.name, p.default) for p in w.parameters.values()
            if p.kind is p.POSITIONAL_OR_KEYWORD] == [
        ("path", inspect.Parameter.empty), ("fqn_to_index_mapping", None),
        ("thread_count", 1), ("save_distributed", False),
        ("enable_consolidation", False), ("thread_count_consolidation", 1)]
    r = inspect.signature(dcp.HuggingFaceStorageReader)
    assert [(p.name, p.default) for p in r.parameters.values()
            if p.kind is p.POSITIONAL_OR_KEYWORD] == [
        ("path", inspect.Parameter.empty), ("thread_count", 1)]


def test_declared_functions_match_header():
    """Every function of capi/dcp.h is declared in dcp._lib, and no other."""
    header = os.path.join(os.path.dirname(__file__), "..", "..", "capi",
                          "dcp.h")
    with open(header) as f:
        text = f.read()
    declared = set(re.findall(r"DCP_API\s[^;(]*?\b(dcp_\w+)\s*\(", text))
    assert declared == set(_lib._PROTOTYPES)


def test_read_metadata_of_a_safetensors_directory(tmp_path):
    state = {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4),
             "e": torch.zeros(2, 5, dtype=torch.bfloat16),
             "s": torch.tensor(7, dtype=torch.int64)}
    safetensors_torch.save_file(state, str(tmp_path / "model.safetensors"),
                                metadata={"format": "pt"})
    for md in (dcp.HuggingFaceStorageReader(str(tmp_path)).read_metadata(),
               dcp.read_metadata(str(tmp_path))):
        sdm = md.state_dict_metadata
        assert set(sdm) == set(state)
        for key, t in state.items():
            assert sdm[key].properties.dtype == t.dtype, key
            assert sdm[key].size == tuple(t.shape), key
            assert sdm[key].chunks == (dcp.ChunkStorageMetadata(
                (0,) * t.dim(), tuple(t.shape)),), key
        assert md.version == "safetensors"
    with pytest.raises(dcp.CheckpointFileNotFoundError):
        dcp.HuggingFaceStorageReader(str(tmp_path / "none")).read_metadata()


def test_read_metadata_of_a_dcp_hf_save(ckpt):
    state = _state()
    dcp.save(state, storage_writer=dcp.HuggingFaceStorageWriter(
        ckpt, fqn_to_index_mapping=_MAPPING))
    sdm = dcp.read_metadata(ckpt).state_dict_metadata
    assert set(sdm) == set(state)
    for key, t in state.items():
        assert sdm[key].size == tuple(t.shape), key


def test_an_empty_sharded_directory_is_no_checkpoint(tmp_path):
    """What a failed distributed save may leave (an empty sharded/) holds
    no checkpoint: a load says there is none, and a dcp save goes there."""
    where = tmp_path / "ckpt"
    (where / "sharded").mkdir(parents=True)
    with pytest.raises(dcp.CheckpointFileNotFoundError):
        dcp.load({"a": torch.zeros(2)}, checkpoint_id=str(where))
    dcp.save({"a": torch.ones(2)}, checkpoint_id=str(where))
    back = {"a": torch.zeros(2)}
    dcp.load(back, checkpoint_id=str(where))
    assert torch.equal(back["a"], torch.ones(2))


def test_a_hub_cache_snapshot_of_symbolic_links_loads(tmp_path):
    """huggingface_hub's cache: snapshots/<rev>/ holds the index and the
    shards as relative symbolic links into ../../blobs/. dcp's readers
    follow them, as safetensors and torch do; a link to a FIFO is refused
    without blocking."""
    from safetensors.torch import save_file
    blobs, snap = tmp_path / "blobs", tmp_path / "snapshots" / "abc"
    blobs.mkdir()
    snap.mkdir(parents=True)
    tensors = {"a": torch.arange(6.).reshape(2, 3),
               "b": torch.ones(4, dtype=torch.bfloat16)}
    save_file({"a": tensors["a"]}, str(blobs / "h1"))
    save_file({"b": tensors["b"]}, str(blobs / "h2"))
    (blobs / "h3").write_text(json.dumps({"weight_map": {
        "a": "model-00001-of-00002.safetensors",
        "b": "model-00002-of-00002.safetensors"}}))
    for blob, name in (("h1", "model-00001-of-00002.safetensors"),
                       ("h2", "model-00002-of-00002.safetensors"),
                       ("h3", "model.safetensors.index.json")):
        os.symlink(os.path.join("..", "..", "blobs", blob), snap / name)
    dest = {k: torch.zeros_like(v) for k, v in tensors.items()}
    dcp.load(dest, storage_reader=dcp.HuggingFaceStorageReader(str(snap)))
    for k, v in tensors.items():
        assert torch.equal(dest[k], v), k

    os.mkfifo(blobs / "fifo")
    os.remove(snap / "model-00002-of-00002.safetensors")
    os.symlink(os.path.join("..", "..", "blobs", "fifo"),
               snap / "model-00002-of-00002.safetensors")
    with pytest.raises(dcp.CheckpointException, match="not a regular file"):
        dcp.load(dest,
                 storage_reader=dcp.HuggingFaceStorageReader(str(snap)))
