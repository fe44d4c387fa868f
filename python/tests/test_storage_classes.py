"""MegaStorageWriter / MegaStorageReader and
QuantizedHuggingFaceStorageReader passed as storage_writer= /
storage_reader=: MEGA round trips (one file, a mapping into
model-0000I-of-0000N.mega files), read_metadata, and fp8
weights written by the `safetensors` library loaded dequantized, equal bit
for bit to torch's reference dequantization."""

import json
import os

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

import dcp  # noqa: E402


def _state():
    g = torch.Generator().manual_seed(5)
    return {
        "emb": torch.randn(40, 9, generator=g).to(torch.bfloat16),
        "layer.w": torch.randn(17, 6, generator=g),
        "layer.b": torch.arange(6, dtype=torch.int64),
    }


def _zeros_like(state):
    return {k: torch.zeros_like(v) for k, v in state.items()}


def test_mega_round_trip_one_file(ckpt):
    state = _state()
    dcp.save(state, storage_writer=dcp.MegaStorageWriter(ckpt))
    assert sorted(os.listdir(ckpt)) == ["model.mega", "model.mega.index.json"]
    loaded = _zeros_like(state)
    dcp.load(loaded, storage_reader=dcp.MegaStorageReader(ckpt))
    for k, v in state.items():
        assert torch.equal(v, loaded[k]), k


def test_mega_mapping_writes_numbered_files(ckpt):
    state = _state()
    mapping = {"emb": 1, "layer.w": 2, "layer.b": 2}
    dcp.save(state, storage_writer=dcp.MegaStorageWriter(
        ckpt, fqn_to_index_mapping=mapping, thread_count=2, sync_files=False))
    assert sorted(os.listdir(ckpt)) == [
        "model-00001-of-00002.mega", "model-00002-of-00002.mega",
        "model.mega.index.json"]
    with open(os.path.join(ckpt, "model.mega.index.json")) as f:
        index = json.load(f)
    text = json.dumps(index)
    assert "model-00001-of-00002.mega" in text
    assert "model-00002-of-00002.mega" in text
    loaded = _zeros_like(state)
    dcp.load(loaded, storage_reader=dcp.MegaStorageReader(ckpt,
                                                          thread_count=2))
    for k, v in state.items():
        assert torch.equal(v, loaded[k]), k
    md = dcp.MegaStorageReader(ckpt).read_metadata()
    assert set(md.state_dict_metadata) == set(state)
    assert tuple(md.state_dict_metadata["emb"].size) == (40, 9)
    assert md.state_dict_metadata["emb"].properties.dtype == torch.bfloat16
    assert tuple(md.state_dict_metadata["layer.b"].size) == (6,)


def test_mega_mapping_missing_a_value_raises_naming_it(ckpt):
    with pytest.raises(dcp.CheckpointException) as info:
        dcp.save(_state(), storage_writer=dcp.MegaStorageWriter(
            ckpt, fqn_to_index_mapping={"emb": 1}))
    assert "layer.w" in str(info.value) or "layer.b" in str(info.value)
    with pytest.raises(ValueError):
        dcp.MegaStorageWriter(ckpt, fqn_to_index_mapping={"emb": 0})


def test_mega_reader_of_an_empty_directory_raises(tmp_path):
    with pytest.raises(FileNotFoundError):
        dcp.MegaStorageReader(str(tmp_path)).read_metadata()


BLOCK = 128


def _quantize(w, block=BLOCK):
    """(fp8 E4M3, float32 scale_inv) of a 2-D float32 `w`, block x block
    tiles."""
    rows, cols = w.shape
    sr, sc = -(-rows // block), -(-cols // block)
    padded = torch.zeros(sr * block, sc * block)
    padded[:rows, :cols] = w
    amax = padded.reshape(sr, block, sc, block).abs().amax(dim=(1, 3))
    scale = (amax.clamp(min=1e-6) / 448.0).contiguous()
    q = (w / _expand(scale, rows, cols, block)).clamp(-448, 448).to(
        torch.float8_e4m3fn)
    return q, scale


def _expand(scale, rows, cols, block=BLOCK):
    return scale.repeat_interleave(block, 0)[:rows].repeat_interleave(
        block, 1)[:, :cols]


def _dequantize(q, scale, target, block=BLOCK):
    """The reference: fp8 to float32, times its block's scale, to target."""
    return (q.to(torch.float32) *
            _expand(scale, q.shape[0], q.shape[1], block)).to(target)


@pytest.mark.parametrize("target", [None, torch.bfloat16, torch.float32])
def test_quantized_reader_matches_torch_dequantization(tmp_path, target):
    g = torch.Generator().manual_seed(21)
    w = torch.randn(300, 257, generator=g) * 3
    q, scale = _quantize(w)
    norm = torch.randn(257, generator=g).to(torch.bfloat16)
    safetensors_torch.save_file(
        {"model.w": q, "model.w_scale_inv": scale, "model.norm": norm},
        str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    reader = dcp.QuantizedHuggingFaceStorageReader(
        str(tmp_path), thread_count=2, target_dtype=target)
    dtype = torch.float32 if target is None else target
    md = reader.read_metadata()
    # The scales stay in the metadata as stored.
    assert md.state_dict_metadata["model.w_scale_inv"].properties.dtype == \
        torch.float32
    assert md.state_dict_metadata["model.w"].properties.dtype == dtype
    loaded = {"model.w": torch.zeros(300, 257, dtype=dtype),
              "model.norm": torch.zeros(257, dtype=torch.bfloat16)}
    dcp.load(loaded, storage_reader=reader)
    want = _dequantize(q, scale, dtype)
    assert torch.equal(loaded["model.w"].view(torch.int16 if dtype ==
                                              torch.bfloat16 else torch.int32),
                       want.view(torch.int16 if dtype == torch.bfloat16
                                 else torch.int32))
    assert torch.equal(loaded["model.norm"], norm)


def test_quantized_reader_takes_the_block_size_from_config_json(tmp_path):
    g = torch.Generator().manual_seed(22)
    w = torch.randn(100, 70, generator=g)
    q, scale = _quantize(w, block=32)
    safetensors_torch.save_file({"w": q, "w_scale_inv": scale},
                                str(tmp_path / "model.safetensors"),
                                metadata={"format": "pt"})
    (tmp_path / "config.json").write_text(
        '{"quantization_config": {"quant_method": "fp8", '
        '"weight_block_size": [32, 32]}}')
    loaded = {"w": torch.zeros(100, 70)}
    dcp.load(loaded, storage_reader=dcp.QuantizedHuggingFaceStorageReader(
        str(tmp_path)))
    assert torch.equal(loaded["w"], _dequantize(q, scale, torch.float32, 32))
    # Without config.json the default 128 does not fit these scales.
    (tmp_path / "config.json").unlink()
    with pytest.raises(dcp.CheckpointException, match="128x128"):
        dcp.load(loaded, storage_reader=dcp.QuantizedHuggingFaceStorageReader(
            str(tmp_path)))


def test_quantized_reader_refuses_other_targets(tmp_path):
    with pytest.raises(ValueError, match="target_dtype"):
        dcp.QuantizedHuggingFaceStorageReader(str(tmp_path),
                                              target_dtype=torch.int32)
    with pytest.raises(ValueError, match="block_size"):
        dcp.QuantizedHuggingFaceStorageReader(str(tmp_path), block_size=0)


@pytest.mark.parametrize("kind", ["THREAD", "PROCESS"])
def test_mega_async_save(ckpt, kind):
    state = _state()
    future = dcp.async_save(
        state, storage_writer=dcp.MegaStorageWriter(ckpt),
        async_checkpointer_type=dcp.AsyncCheckpointerType[kind])
    future.result()
    loaded = _zeros_like(state)
    dcp.load(loaded, storage_reader=dcp.MegaStorageReader(ckpt))
    for k, v in state.items():
        assert torch.equal(v, loaded[k]), k


def test_validate_checkpoint_id_takes_paths_not_urls(tmp_path):
    # As torch's FileSystemReader/Writer: a URL needs other storage.
    for cls in (dcp.FileSystemWriter, dcp.FileSystemReader,
                dcp.HuggingFaceStorageWriter, dcp.HuggingFaceStorageReader):
        assert cls.validate_checkpoint_id(str(tmp_path / "c"))
        assert cls.validate_checkpoint_id(tmp_path / "c")
        assert not cls.validate_checkpoint_id("s3://bucket/c")
        assert not cls.validate_checkpoint_id("mega://" + str(tmp_path))
        assert not cls.validate_checkpoint_id(3)
    for cls in (dcp.MegaStorageWriter, dcp.MegaStorageReader):
        assert cls.validate_checkpoint_id("mega://" + str(tmp_path))
        assert cls.validate_checkpoint_id(str(tmp_path))
        assert not cls.validate_checkpoint_id("s3://bucket/c")
