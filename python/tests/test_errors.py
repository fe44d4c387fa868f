"""Error paths: the exception type, code and message of each."""

import os
import sys

import numpy as np
import pytest
import torch

import dcp
from dcp import _lib


def test_wrong_shape_names_the_tensor(ckpt):
    dcp.save({"layer": {"weight": torch.ones(4, 4)}}, checkpoint_id=ckpt)
    with pytest.raises(dcp.CheckpointValueError,
                       match=r"layer\.weight") as e:
        dcp.load({"layer": {"weight": torch.zeros(4, 5)}},
                 checkpoint_id=ckpt)
    assert isinstance(e.value, ValueError)
    assert isinstance(e.value, dcp.CheckpointException)
    assert e.value.code == _lib.INVALID_ARGUMENT
    assert e.value.code_name == "INVALID_ARGUMENT"


def test_wrong_dtype_names_the_tensor(ckpt):
    # Floating destinations convert (test_load_convert.py); a numpy array of
    # a dtype numpy cannot load through (float8) is refused.
    dcp.save({"w": torch.ones(3, dtype=torch.float8_e5m2)},
             checkpoint_id=ckpt)
    with pytest.raises(dcp.CheckpointValueError, match=r"\bw\b"):
        dcp.load({"w": np.zeros(3)}, checkpoint_id=ckpt)


def test_tensor_where_a_value_was_saved(ckpt):
    dcp.save({"x": 3}, checkpoint_id=ckpt)
    with pytest.raises(dcp.CheckpointValueError, match=r"\bx\b"):
        dcp.load({"x": torch.zeros(1)}, checkpoint_id=ckpt)


def test_missing_key_strict_and_partial(ckpt):
    dcp.save({"a": torch.ones(2), "n": 1}, checkpoint_id=ckpt)
    dst = {"a": torch.zeros(2), "b": torch.zeros(2), "m": 5, "n": 0}
    with pytest.raises(dcp.CheckpointNotFoundError, match=r"\bb\b") as e:
        dcp.load(dst, checkpoint_id=ckpt)
    assert isinstance(e.value, LookupError)
    assert e.value.code == _lib.NOT_FOUND
    # The hint names the option as Python passes it (load has no
    # allow_partial_load keyword), in .failures too.
    hint = ('; load with planner=dcp.DefaultLoadPlanner('
            'allow_partial_load=True) to skip missing keys')
    assert str(e.value) == f'the checkpoint has no "b", "m"{hint}'
    assert str(e.value.failures[0][0]) == str(e.value)
    # Non-strict: what the checkpoint has is loaded, the rest untouched.
    dcp.load(dst, checkpoint_id=ckpt,
             planner=dcp.DefaultLoadPlanner(allow_partial_load=True))
    assert torch.equal(dst["a"], torch.ones(2))
    assert torch.equal(dst["b"], torch.zeros(2))
    assert dst["m"] == 5 and dst["n"] == 1


def test_a_missing_key_names_the_outer_key_one_side_lacks(ckpt):
    """A bare model state dict loaded from a checkpoint saved as
    {"model": ...} (and the other way round): the message names the key."""
    dcp.save({"model": {"bias": torch.ones(2)}}, checkpoint_id=ckpt)
    with pytest.raises(dcp.CheckpointNotFoundError) as e:
        dcp.load({"bias": torch.zeros(2)}, checkpoint_id=ckpt)
    assert str(e.value) == (
        'the checkpoint has no "bias" (the checkpoint holds "model.bias": '
        'saved under the key "model", which the state dict lacks?)')


class _Gone:
    """Pickled by reference to this module; unpickling fails once the
    attribute is removed."""


def test_failed_value_decoding_writes_nothing(ckpt, monkeypatch):
    """A value that cannot be decoded (pickled, loaded without
    allow_pickle; an unpickling error) raises naming its key before any
    tensor or value of the caller is written."""
    dcp.save({"w": torch.ones(3), "n": 7, "obj": {1, 2}}, checkpoint_id=ckpt,
             allow_pickle=True)
    dst = {"w": torch.zeros(3), "n": 0, "obj": None}
    with pytest.raises(ValueError, match="'obj'.*allow_pickle=True"):
        dcp.load(dst, checkpoint_id=ckpt)
    assert torch.equal(dst["w"], torch.zeros(3))
    assert dst["n"] == 0 and dst["obj"] is None
    # In a list beside tensors, and an unpickling error.
    dcp.save({"l": [torch.ones(2), 5, _Gone()]}, checkpoint_id=ckpt,
             allow_pickle=True)
    dst = {"l": [torch.zeros(2), 0, None]}
    with monkeypatch.context() as m:
        m.delattr(sys.modules[_Gone.__module__], "_Gone")
        with pytest.raises(ValueError, match=r"'l\.2': unpickling the saved "
                                             "value failed"):
            dcp.load(dst, checkpoint_id=ckpt, allow_pickle=True)
    assert torch.equal(dst["l"][0], torch.zeros(2))
    assert dst["l"][1:] == [0, None]
    dcp.load(dst, checkpoint_id=ckpt, allow_pickle=True)
    assert torch.equal(dst["l"][0], torch.ones(2))
    assert dst["l"][1] == 5 and isinstance(dst["l"][2], _Gone)


def test_no_checkpoint_is_file_not_found(tmp_path):
    missing = str(tmp_path / "nothing-here")
    with pytest.raises(dcp.CheckpointFileNotFoundError) as e:
        dcp.load({"a": torch.zeros(1)}, checkpoint_id=missing)
    assert isinstance(e.value, FileNotFoundError)
    assert "nothing-here" in str(e.value)
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        dcp.read_metadata(missing)
    # With a plain value too (a second load names it): raised once, not
    # chained to the same error of the first load.
    with pytest.raises(dcp.CheckpointFileNotFoundError,
                       match="the directory does not exist") as e:
        dcp.load({"a": torch.zeros(1), "step": 0}, checkpoint_id=missing)
    assert e.value.__context__ is None


def test_a_file_as_the_checkpoint_is_named_as_one(tmp_path, ckpt):
    """A torch.save file, or the .metadata file itself, passed where a
    checkpoint directory goes: CheckpointFileNotFoundError saying so."""
    pt = str(tmp_path / "model.pt")
    torch.save({"a": torch.ones(2)}, pt)
    dcp.save({"a": torch.ones(2)}, checkpoint_id=ckpt)
    meta = os.path.join(ckpt, ".metadata")
    torch_hint = (f"{pt} is a file, not a checkpoint directory; read a "
                  "torch.save file with torch.load, or convert it once with "
                  f"dcp.format_utils.torch_save_to_dcp({pt!r}, NEW_DIR)")
    meta_hint = (f"{meta} is a file, not a checkpoint directory; pass the "
                 f"directory that holds it: {ckpt!r}")
    for path, message in ((pt, torch_hint), (meta, meta_hint)):
        for read in (
                lambda: dcp.load({"a": torch.zeros(2)}, checkpoint_id=path),
                lambda: dcp.load({"a": torch.zeros(2)},
                                 storage_reader=dcp.FileSystemReader(path)),
                lambda: dcp.read_metadata(path),
                lambda: dcp.FileSystemReader(path).read_metadata()):
            with pytest.raises(dcp.CheckpointFileNotFoundError) as e:
                read()
            assert str(e.value) == message
            assert e.value.code == _lib.NOT_FOUND


def test_a_save_where_no_directory_can_be_made(tmp_path):
    """A directory that cannot be made is FileNotFoundError (a save looks
    up no key); a file in the way is NotADirectoryError."""
    if not os.path.isdir("/proc/self"):
        pytest.skip("needs procfs at /proc, where no directory can be made")
    with pytest.raises(dcp.CheckpointFileNotFoundError,
                       match=r"cannot create checkpoint directory "
                             r"/proc/dcp-nope/x") as e:
        dcp.save({"a": torch.ones(2)}, checkpoint_id="/proc/dcp-nope/x")
    assert type(e.value) is dcp.CheckpointFileNotFoundError
    assert type(e.value.failures[0][0]) is dcp.CheckpointFileNotFoundError
    blocker = tmp_path / "file"
    blocker.write_bytes(b"x")
    for path, what in ((blocker, "is a file"),
                       (blocker / "sub" / "ckpt",
                        f"is under {blocker}, a file")):
        with pytest.raises(dcp.CheckpointNotADirectoryError) as e:
            dcp.save({"a": torch.ones(2)}, checkpoint_id=str(path))
        assert isinstance(e.value, NotADirectoryError)
        assert e.value.code == _lib.FAILED_PRECONDITION
        assert str(e.value) == (
            f"cannot save to {path}: it {what}, not a directory; choose a "
            "directory path for the checkpoint")
    assert blocker.read_bytes() == b"x"


def test_a_mega_or_rank_local_checkpoint_missing_a_key_names_the_key(
        tmp_path):
    """NOT_FOUND from a load of a checkpoint that is there is a key's."""
    mega = str(tmp_path / "mega")
    dcp.save({"a": torch.ones(2)}, checkpoint_id=f"mega://{mega}")
    local = str(tmp_path / "local")
    dcp.save({"a": torch.ones(2)}, checkpoint_id=local, use_collectives=False)
    for path in (f"mega://{mega}", mega, local):
        with pytest.raises(dcp.CheckpointNotFoundError,
                           match=r'^the checkpoint has no "b"') as e:
            dcp.load({"b": torch.zeros(2)}, checkpoint_id=path)
        assert type(e.value) is dcp.CheckpointNotFoundError, path
    with pytest.raises(dcp.CheckpointFileNotFoundError):
        dcp.load({"b": torch.zeros(2)},
                 checkpoint_id=f"mega://{tmp_path / 'none'}")


def test_engine_messages_spell_options_as_python_passes_them(ckpt):
    dcp.save({"a": torch.ones(2)}, checkpoint_id=ckpt)
    with pytest.raises(dcp.CheckpointExistsError,
                       match=r"pass overwrite=True to replace it") as e:
        dcp.save({"a": torch.ones(2)}, storage_writer=dcp.FileSystemWriter(
            ckpt, overwrite=False))
    assert "overwrite=True" in str(e.value.failures[0][0])
    with pytest.raises(dcp.CheckpointValueError,
                       match=r'^"n" is a dict; nested state dicts need '
                             r"flatten_state_dict=True$"):
        dcp.save({"n": {"a": torch.ones(1)}}, checkpoint_id=ckpt + "-2",
                 planner=dcp.DefaultSavePlanner(flatten_state_dict=False))
    assert dcp.errors.python_spelling(
        "SaveOptions::use_collectives=false; no_dist=true, x=true") == \
        "SaveOptions::use_collectives=false; no_dist=True, x=true"


def test_corrupted_data_names_the_file(ckpt):
    big = torch.randn(1 << 18)  # 1 MiB: one item filling its data file
    dcp.save({"big": big}, checkpoint_id=ckpt)
    (data,) = [f for f in os.listdir(ckpt) if f.endswith(".distcp")]
    path = os.path.join(ckpt, data)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(size // 2)
        b = f.read(1)
        f.seek(size // 2)
        f.write(bytes([b[0] ^ 0x40]))
    with pytest.raises(dcp.CheckpointCorruptError, match=data) as e:
        dcp.load({"big": torch.zeros(1 << 18)}, checkpoint_id=ckpt)
    assert e.value.code == _lib.DATA_LOSS


def test_corrupted_metadata(ckpt):
    dcp.save({"a": torch.ones(2)}, checkpoint_id=ckpt)
    path = os.path.join(ckpt, ".metadata")
    with open(path, "r+b") as f:
        f.seek(40)
        b = f.read(1)
        f.seek(40)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(dcp.CheckpointCorruptError, match=r"\.metadata"):
        dcp.read_metadata(ckpt)


def test_unsupported_values_and_keys_raise_before_the_engine(ckpt):
    with pytest.raises(TypeError, match=r"'a\.b'"):
        dcp.save({"a": {"b": object()}}, checkpoint_id=ckpt)
    with pytest.raises(TypeError, match="key"):
        dcp.save({"a": {(1, 2): 3}}, checkpoint_id=ckpt)
    with pytest.raises(ValueError, match="collide"):
        dcp.save({"a": {1: 3, "1": 4}}, checkpoint_id=ckpt)
    with pytest.raises(TypeError, match="dict"):
        dcp.save([torch.ones(1)], checkpoint_id=ckpt)
    with pytest.raises(TypeError, match=r"'c'.*bits8"):
        dcp.save({"c": torch.empty(2, dtype=torch.bits8)},
                 checkpoint_id=ckpt)
    with pytest.raises(ValueError, match="checkpoint_id"):
        dcp.save({"a": 1})
    assert not os.path.exists(ckpt)


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_sparse_nested_and_surrogate_keys_raise_naming_the_key(ckpt):
    """Sparse and nested tensors (save and load) and keys with a lone
    surrogate (no UTF-8 form) raise a ValueError naming the key."""
    sparse = {"sp": torch.eye(2).to_sparse(),
              "csr": torch.eye(2).to_sparse_csr(),
              "nt": torch.nested.nested_tensor([torch.ones(2),
                                                torch.ones(3)]),
              "jagged": torch.nested.nested_tensor(
                  [torch.ones(2), torch.ones(3)], layout=torch.jagged)}
    for key, t in sparse.items():
        with pytest.raises(ValueError, match=rf"'{key}': .*not supported"):
            dcp.save({"ok": torch.ones(1), key: t}, checkpoint_id=ckpt)
    assert not os.path.exists(ckpt)
    dcp.save({"sp": torch.eye(2)}, checkpoint_id=ckpt)
    with pytest.raises(ValueError, match=r"'sp': torch\.sparse_coo"):
        dcp.load({"sp": torch.zeros(2, 2).to_sparse()}, checkpoint_id=ckpt)
    with pytest.raises(ValueError, match=r"key 'bad\\udcff' at 'a'"):
        dcp.save({"a": {"bad\udcff": 1}}, checkpoint_id=ckpt)
    with pytest.raises(ValueError, match=r"key 'x\\ud800'"):
        dcp.load({"x\ud800": torch.zeros(2)}, checkpoint_id=ckpt)


def test_a_list_saved_where_the_state_dict_has_a_value_replaces_it(ckpt):
    # A list of plain values is one value, as in torch's DCP.
    dcp.save({"a": [1, (2, "x")], "s": 5}, checkpoint_id=ckpt)
    dst = {"a": 0}
    dcp.load(dst, checkpoint_id=ckpt)
    assert dst == {"a": [1, (2, "x")]}


def test_a_key_saved_in_another_shape_suggests_no_partial_load(
        ckpt, per_item_lists):
    # Skipping the key would drop the saved list silently.
    dcp.save({"a": [1, 2], "s": 5}, checkpoint_id=ckpt)
    with pytest.raises(dcp.CheckpointNotFoundError) as e:
        dcp.load({"a": 0}, checkpoint_id=ckpt)
    assert str(e.value) == (
        'the checkpoint has no "a" (the checkpoint holds "a.0": a list or '
        'dict was saved at "a" where the state dict has a value)')
    with pytest.raises(dcp.CheckpointNotFoundError) as e:
        dcp.load({"s": {"k": 1}}, checkpoint_id=ckpt)
    assert "allow_partial_load" not in str(e.value)
    assert "a single value at \"s\"" in str(e.value)


def test_planner_and_storage_types_are_checked(ckpt):
    with pytest.raises(TypeError, match="DefaultSavePlanner"):
        dcp.save({"a": 1}, checkpoint_id=ckpt, planner=object())
    with pytest.raises(TypeError, match="FileSystemWriter"):
        dcp.save({"a": 1}, storage_writer=object())
    with pytest.raises(TypeError, match="SerializationFormat"):
        dcp.FileSystemWriter(ckpt, serialization_format="safetensors")
    # torch's own classes of other protocols: qualified, so the message
    # does not seem to refuse the class it asks for.
    import torch.distributed.checkpoint as torch_dcp
    with pytest.raises(TypeError) as e:
        dcp.save({"a": 1}, checkpoint_id=ckpt,
                 planner=torch_dcp.default_planner.DefaultLoadPlanner())
    assert str(e.value).startswith(
        "planner torch.distributed.checkpoint.default_planner."
        "DefaultLoadPlanner is not supported: dcp plans in the engine; "
        "pass dcp.DefaultSavePlanner(...) or torch's")
    with pytest.raises(TypeError) as e:
        dcp.save({"a": 1}, storage_writer=torch_dcp.FileSystemWriter(ckpt))
    assert str(e.value) == (
        "storage_writer torch.distributed.checkpoint.filesystem."
        "FileSystemWriter is not supported: dcp does its I/O in the engine; "
        "pass one of dcp.FileSystemWriter, dcp.HuggingFaceStorageWriter, "
        "dcp.MegaStorageWriter")


def test_load_into_read_only_numpy_raises(ckpt):
    import numpy as np
    dcp.save({"a": np.ones(3)}, checkpoint_id=ckpt)
    ro = np.zeros(3)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        dcp.load({"a": ro}, checkpoint_id=ckpt)


def test_failed_save_keeps_the_previous_checkpoint(ckpt):
    dcp.save({"a": torch.ones(2), "v": 1}, checkpoint_id=ckpt)
    with pytest.raises(TypeError):
        dcp.save({"a": torch.zeros(2), "v": object()}, checkpoint_id=ckpt)
    dst = {"a": torch.zeros(2), "v": 0}
    dcp.load(dst, checkpoint_id=ckpt)
    assert torch.equal(dst["a"], torch.ones(2)) and dst["v"] == 1


def test_exception_is_picklable_with_failures():
    import pickle
    e = dcp.errors.from_status(_lib.DATA_LOSS, "bad", [(1, 15, "rank 1 bad")])
    f = pickle.loads(pickle.dumps(e))
    assert type(f) is dcp.CheckpointCorruptError and f.code == 15
    assert f.failures[1][0].msg == "rank 1 bad"


def test_a_full_disk_is_an_oserror_with_its_errno():
    """RESOURCE_EXHAUSTED is CheckpointResourceError, an OSError whose
    errno is the cause the engine's message names (None when it names
    none); it pickles as itself."""
    import errno
    import pickle
    for cause, number in ((errno.ENOSPC, errno.ENOSPC),
                          (errno.EDQUOT, errno.EDQUOT), (None, None)):
        text = "writing /c/__0_0.distcp at offset 0"
        if cause is not None:
            text += f": {os.strerror(cause)}"
        e = dcp.errors.from_status(_lib.RESOURCE_EXHAUSTED, text)
        assert type(e) is dcp.CheckpointResourceError
        assert isinstance(e, OSError) and isinstance(e, dcp.CheckpointException)
        assert e.errno == number and str(e) == text
        f = pickle.loads(pickle.dumps(e))
        assert type(f) is dcp.CheckpointResourceError and f.errno == number
        assert str(f) == text and f.code == _lib.RESOURCE_EXHAUSTED


def test_a_plain_destination_for_a_tensor_is_named_by_its_type(ckpt):
    dcp.save({"m": {"w": torch.ones(4)}}, checkpoint_id=ckpt)
    for value, what in ((3, "a value of type int"), (None, "None"),
                        ("x", "a value of type str")):
        with pytest.raises(dcp.CheckpointValueError) as e:
            dcp.load({"m": {"w": value}}, checkpoint_id=ckpt)
        assert str(e.value).startswith(
            f'"m.w" is {what} in the state dict but a tensor in the '
            'checkpoint'), str(e.value)


def test_integer_options_out_of_their_c_range_are_refused(ckpt):
    sd = {"a": torch.ones(2)}
    with pytest.raises(ValueError, match=r"coordinator_rank=4294967296 is "
                       r"outside \[-2147483648, 2147483647\]"):
        dcp.save_state_dict(sd, dcp.FileSystemWriter(ckpt),
                            coordinator_rank=1 << 32, no_dist=True)
    with pytest.raises(ValueError, match=r"thread_count=4294967298"):
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(
            ckpt, thread_count=(1 << 32) + 2))
    assert not os.path.exists(os.path.join(ckpt, ".metadata"))


def test_torchs_default_planners_are_taken_for_their_options(ckpt, tmp_path):
    """Programs pass torch's DefaultSavePlanner / DefaultLoadPlanner for
    their options (allow_partial_load above all): dcp honours them; a
    subclass of torch's that overrides a protocol method is refused as
    one of dcp's is."""
    import torch.distributed.checkpoint as torch_dcp
    dcp.save({"a": torch.arange(4.0)}, checkpoint_id=ckpt,
             planner=torch_dcp.DefaultSavePlanner())
    state = {"a": torch.zeros(4), "extra": torch.ones(2)}
    dcp.load(state, checkpoint_id=ckpt,
             planner=torch_dcp.DefaultLoadPlanner(allow_partial_load=True))
    assert torch.equal(state["a"], torch.arange(4.0))
    assert torch.equal(state["extra"], torch.ones(2))
    with pytest.raises(dcp.CheckpointNotFoundError, match="extra"):
        dcp.load(state, checkpoint_id=ckpt,
                 planner=torch_dcp.DefaultLoadPlanner())
    with pytest.raises(dcp.CheckpointValueError):
        dcp.save({"m": {"w": torch.ones(2)}}, checkpoint_id=ckpt,
                 planner=torch_dcp.DefaultSavePlanner(
                     flatten_state_dict=False))
    for kind in (dcp.AsyncCheckpointerType.THREAD,
                 dcp.AsyncCheckpointerType.PROCESS):
        where = str(tmp_path / kind.name)
        dcp.async_save({"b": torch.full((3,), 2.0)}, checkpoint_id=where,
                       async_checkpointer_type=kind,
                       planner=torch_dcp.DefaultSavePlanner(
                           dedup_save_to_lowest_rank=True)).result()
        back = {"b": torch.zeros(3)}
        dcp.load(back, checkpoint_id=where)
        assert torch.equal(back["b"], torch.full((3,), 2.0)), kind

    class Renaming(torch_dcp.DefaultLoadPlanner):
        def create_local_plan(self):
            return super().create_local_plan()

    with pytest.raises(TypeError) as e:
        dcp.load({"a": torch.zeros(4)}, checkpoint_id=ckpt,
                 planner=Renaming())
    assert "Renaming.create_local_plan, which dcp would not call" in \
        str(e.value), e.value
    assert "DefaultLoadPlanner (torch's or dcp's)" in str(e.value)


def test_a_nul_byte_in_a_path_is_refused_before_the_engine(tmp_path, ckpt):
    """C would cut a path at its NUL byte: a save to "DIR\\0-new" would
    replace the checkpoint in DIR. Every path is refused first, with a
    ValueError as os functions raise (CheckpointValueError) naming the
    argument; nothing is written."""
    dcp.save({"w": torch.ones(3)}, checkpoint_id=ckpt)
    bad = ckpt + "\0-new"
    message = f"{bad!r}"[1:] + " contains an embedded null byte"
    sd = {"w": torch.zeros(3)}
    for call in (
            lambda: dcp.save(sd, checkpoint_id=bad),
            lambda: dcp.save(sd, checkpoint_id=f"mega://{bad}"),
            lambda: dcp.save(sd, checkpoint_id=bad,
                             storage_writer=dcp.FileSystemWriter(ckpt)),
            lambda: dcp.async_save(sd, checkpoint_id=bad).result(),
            lambda: dcp.async_save(
                sd, checkpoint_id=bad, async_checkpointer_type=(
                    dcp.AsyncCheckpointerType.PROCESS)).result(),
            lambda: dcp.load(sd, checkpoint_id=bad),
            lambda: dcp.read_metadata(bad),
            lambda: dcp.FileSystemWriter(ckpt).reset(bad)):
        with pytest.raises(dcp.CheckpointValueError) as e:
            call()
        assert isinstance(e.value, ValueError)
        assert str(e.value).startswith("checkpoint_id '"), str(e.value)
        assert str(e.value).endswith(message), str(e.value)
        assert e.value.code == _lib.INVALID_ARGUMENT
    for cls in (dcp.FileSystemWriter, dcp.HuggingFaceStorageWriter,
                dcp.MegaStorageWriter, dcp.FileSystemReader,
                dcp.HuggingFaceStorageReader,
                dcp.QuantizedHuggingFaceStorageReader,
                dcp.MegaStorageReader):
        with pytest.raises(dcp.CheckpointValueError) as e:
            cls(bad)
        assert str(e.value) == (f"{cls.__name__}: path {bad!r} contains an "
                                "embedded null byte")
    # A writer's path changed after it was made is checked too.
    writer = dcp.HuggingFaceStorageWriter(ckpt)
    writer.path = bad
    with pytest.raises(dcp.CheckpointValueError,
                       match="^storage_writer path '.*' contains an "
                             "embedded null byte$"):
        dcp.save(sd, storage_writer=writer)
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]
    back = {"w": torch.zeros(3)}
    dcp.load(back, checkpoint_id=ckpt)
    assert torch.equal(back["w"], torch.ones(3))


def test_option_limits_are_checked_when_the_storage_is_made(ckpt):
    """The engine's limits on the storage classes' options are checked by
    their constructors, naming the option as Python passes it; an engine
    message that still names a C options field is spelled the same way."""
    cases = [
        (lambda: dcp.FileSystemWriter(ckpt, thread_count=5000),
         "FileSystemWriter(thread_count=5000): thread_count must be at "
         "most 1024"),
        (lambda: dcp.FileSystemWriter(ckpt, thread_count=0),
         "FileSystemWriter(thread_count=0): thread_count must be >= 1"),
        (lambda: dcp.FileSystemWriter(ckpt, per_thread_copy_ahead=-5),
         "FileSystemWriter(per_thread_copy_ahead=-5): per_thread_copy_ahead "
         "must be >= 0"),
        (lambda: dcp.FileSystemReader(ckpt, thread_count=1025),
         "FileSystemReader(thread_count=1025): thread_count must be at "
         "most 1024"),
        (lambda: dcp.HuggingFaceStorageWriter(
            ckpt, thread_count_consolidation=2000),
         "HuggingFaceStorageWriter(thread_count_consolidation=2000): "
         "thread_count_consolidation must be at most 1024"),
        (lambda: dcp.HuggingFaceStorageReader(ckpt, thread_count=2000),
         "HuggingFaceStorageReader(thread_count=2000): thread_count must be "
         "at most 1024"),
        (lambda: dcp.HuggingFaceStorageReader(ckpt,
                                              read_window_bytes=2 ** 70),
         f"HuggingFaceStorageReader(read_window_bytes={2 ** 70}): "
         f"read_window_bytes must be at most {2 ** 63 - 1}"),
        (lambda: dcp.MegaStorageWriter(ckpt, checksum_block_size=3),
         "MegaStorageWriter(checksum_block_size=3): checksum_block_size "
         "must be a multiple of 4096"),
        (lambda: dcp.MegaStorageWriter(ckpt, thread_count=5000),
         "MegaStorageWriter(thread_count=5000): thread_count must be at "
         "most 1024"),
        (lambda: dcp.MegaStorageReader(ckpt, thread_count=5000),
         "MegaStorageReader(thread_count=5000): thread_count must be at "
         "most 1024"),
    ]
    for make, message in cases:
        with pytest.raises(ValueError) as e:
            make()
        assert str(e.value) == message
    # What only the engine checks (a compression it does not know).
    with pytest.raises(dcp.CheckpointValueError) as e:
        dcp.save({"w": torch.ones(3)}, storage_writer=dcp.FileSystemWriter(
            ckpt, compression="lz4"))
    assert str(e.value) == ('FileSystemWriter(compression=...): compression '
                            '"lz4" is not none, zstd or zstd:LEVEL')
    spelled = dcp.errors.python_spelling
    assert spelled("dcp_fs_writer_options_t.thread_count is 5000; it must "
                   "be at most 1024") == \
        "FileSystemWriter(thread_count=5000): it must be at most 1024"
    assert spelled("a save needs dcp_save_options_t.checkpoint_id (a "
                   "directory) or storage_writer") == \
        "a save needs checkpoint_id (a directory) or storage_writer"
    assert "dcp_" not in spelled(
        "x: dcp_process_group_options_t.timeout_ms is -1000; it must be >= 0")


def test_an_empty_checkpoint_id_is_a_missing_one(ckpt):
    sd = {"w": torch.ones(3)}
    for call, kind in ((lambda: dcp.save(sd, checkpoint_id=""), "save"),
                       (lambda: dcp.load(sd, checkpoint_id=""), "load"),
                       (lambda: dcp.async_save(sd, checkpoint_id="")
                        .result(), "save")):
        with pytest.raises(dcp.errors.CheckpointIdMissingError) as e:
            call()
        assert isinstance(e.value, ValueError)
        storage = "writer" if kind == "save" else "reader"
        assert str(e.value) == (
            f"{kind}: checkpoint_id is empty; pass the checkpoint's "
            f"directory or a storage_{storage}")


def test_a_group_timeout_must_be_a_positive_timedelta():
    import datetime
    import torch.distributed as dist
    store = dist.HashStore()
    for make, where in (
            (lambda t: dcp.ProcessGroup.from_env(timeout=t),
             "ProcessGroup.from_env"),
            (lambda t: dcp.ProcessGroup.from_store(store, 0, 2, timeout=t),
             "ProcessGroup.from_store")):
        with pytest.raises(ValueError) as e:
            make(datetime.timedelta(seconds=-1))
        assert str(e.value) == (
            f"{where}(timeout=datetime.timedelta(days=-1, seconds=86399)): "
            "timeout must be positive")
        with pytest.raises(TypeError) as e:
            make(5)
        assert str(e.value) == (f"{where}: timeout must be a "
                                "datetime.timedelta or None, not int (5)")


def test_wrong_argument_types_name_the_argument(tmp_path, ckpt):
    """A path may be bytes (decoded as os functions decode it); another type
    of path or option raises TypeError naming the argument and the type it
    takes, not a Python internal; a float is not truncated."""
    sd = {"w": torch.arange(3.0)}
    dcp.save(sd, checkpoint_id=os.fsencode(ckpt))
    back = {"w": torch.zeros(3)}
    dcp.load(back, checkpoint_id=os.fsencode(ckpt))
    assert torch.equal(back["w"], sd["w"])
    assert os.fspath(dcp.FileSystemWriter(os.fsencode(ckpt)).path) == ckpt
    assert list(dcp.read_metadata(os.fsencode(ckpt)).state_dict_metadata) \
        == ["w"]
    # Bytes that are not UTF-8: refused before anything is written.
    bad = os.fsencode(ckpt) + b"-\xff"
    with pytest.raises(dcp.CheckpointValueError, match="not valid UTF-8"):
        dcp.save(sd, checkpoint_id=bad)
    assert not os.path.exists(bad)
    with pytest.raises(TypeError) as e:
        dcp.save(sd, checkpoint_id=5)
    assert str(e.value) == ("checkpoint_id must be a str, bytes or "
                            "os.PathLike path, not int")
    with pytest.raises(TypeError) as e:
        dcp.FileSystemReader(None)
    assert str(e.value) == ("FileSystemReader: path must be a str, bytes or "
                            "os.PathLike path, not NoneType")
    for value, shown in (("2", "str ('2')"), (1.5, "float (1.5)"),
                         (True, "bool (True)")):
        with pytest.raises(TypeError) as e:
            dcp.FileSystemWriter(ckpt, thread_count=value)
        assert str(e.value) == ("FileSystemWriter: thread_count must be an "
                                f"int, not {shown}")
    with pytest.raises(TypeError) as e:
        dcp.MegaStorageWriter(ckpt, checksum_block_size=4096.0)
    assert str(e.value) == ("MegaStorageWriter: checksum_block_size must be "
                            "an int or None, not float (4096.0)")
    import numpy as np
    assert dcp.FileSystemWriter(ckpt, thread_count=np.int64(3)).thread_count \
        == 3


def test_a_mega_uri_onto_a_file_is_not_a_directory(tmp_path):
    """mega://FILE fails as MegaStorageWriter(FILE) does."""
    blocker = tmp_path / "file"
    blocker.write_bytes(b"x")
    for kwargs, shown in (
            (dict(checkpoint_id=f"mega://{blocker}"), f"mega://{blocker}"),
            (dict(checkpoint_id=f"mega://{blocker}/sub"),
             f"mega://{blocker}/sub"),
            (dict(storage_writer=dcp.MegaStorageWriter(str(blocker))),
             str(blocker))):
        with pytest.raises(dcp.CheckpointNotADirectoryError) as e:
            dcp.save({"w": torch.ones(2)}, **kwargs)
        assert isinstance(e.value, NotADirectoryError)
        assert e.value.code == _lib.FAILED_PRECONDITION
        what = "is a file" if shown.endswith("file") else \
            f"is under {blocker}, a file"
        assert str(e.value) == (
            f"cannot save to {shown}: it {what}, not a directory; choose a "
            "directory path for the checkpoint")
    assert blocker.read_bytes() == b"x"


def test_torchs_checkpoint_exception_catches_dcps_failures(tmp_path, ckpt):
    import pickle
    import torch.distributed.checkpoint as tdcp
    dcp.save({"w": torch.ones(2)}, checkpoint_id=ckpt)
    for call, cls in (
            (lambda: dcp.load({"w": torch.ones(3)}, checkpoint_id=ckpt),
             dcp.CheckpointValueError),
            (lambda: dcp.load({"w": torch.ones(2)},
                              checkpoint_id=str(tmp_path / "none")),
             dcp.CheckpointFileNotFoundError)):
        with pytest.raises(tdcp.CheckpointException) as e:
            call()
        assert type(e.value) is cls and isinstance(e.value, Exception)
        assert list(e.value.failures) == [0]
        assert e.value.failures is e.value._failures  # torch's attribute
        again = pickle.loads(pickle.dumps(e.value))
        assert type(again) is cls and str(again) == str(e.value)
    if_file = dcp.CheckpointFileNotFoundError("m", None, _lib.NOT_FOUND)
    assert if_file.errno is None and if_file.args == ("m",)


def test_torchs_checkpoint_package_is_never_imported_by_a_failure(tmp_path):
    import subprocess
    code = (
        "import sys, dcp\n"
        "try:\n"
        f"    dcp.load({{}}, checkpoint_id={str(tmp_path / 'none')!r})\n"
        "except dcp.CheckpointFileNotFoundError as e:\n"
        "    names = [c.__module__ for c in type(e).__mro__]\n"
        "    first = e\n"
        "assert 'torch.distributed.checkpoint' not in sys.modules\n"
        "print(','.join(sorted(set(names))))\n"
        # Imported later: the next failure makes every dcp exception, the
        # first one too, an instance of torch's class.
        "import torch.distributed.checkpoint as tdcp\n"
        "try:\n"
        f"    dcp.load({{}}, checkpoint_id={str(tmp_path / 'none')!r})\n"
        "except tdcp.CheckpointException as e:\n"
        "    assert type(e) is dcp.CheckpointFileNotFoundError\n"
        "assert isinstance(first, tdcp.CheckpointException)\n"
        "print('ok')\n")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(
        os.path.abspath(dcp.__file__))))
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                         capture_output=True, text=True).stdout
    assert out.split() == ["builtins,dcp.errors", "ok"]


def test_an_agreed_kind_mismatch_names_this_ranks_destination():
    # A plain destination reaches the engine as a bytes placeholder; in an
    # agreed message this rank names its own destination's type, and says
    # "a plain value" for another rank's, whose type it does not know.
    from dcp import checkpoint

    class Flat:
        v_paths = [("t",), ("u",)]
        v_slots = [(None, None, []), (None, None, None)]

        def name(self, path):
            return ".".join(path)

    message = ('checkpoint load plan failed on 2 ranks; rank 0: '
               'INVALID_ARGUMENT: "t" is a bytes in the state dict but a '
               'tensor in the checkpoint; rank 1: INVALID_ARGUMENT: "u" is '
               'a bytes in the state dict but a tensor in the checkpoint')
    e = dcp.CheckpointValueError(message, None, _lib.INVALID_ARGUMENT)
    checkpoint._name_plain_destination(e, Flat(), rank=0)
    assert str(e) == e.args[0] == (
        'checkpoint load plan failed on 2 ranks; rank 0: INVALID_ARGUMENT: '
        '"t" is a value of type list in the state dict but a tensor in the '
        'checkpoint; rank 1: INVALID_ARGUMENT: "u" is a plain value in the '
        'state dict but a tensor in the checkpoint')
    alone = dcp.CheckpointValueError(
        '"u" is a bytes in the state dict but a tensor in the checkpoint',
        None, _lib.INVALID_ARGUMENT)
    checkpoint._name_plain_destination(alone, Flat(), rank=3)
    assert str(alone).startswith('"u" is None in the state dict')


def test_a_file_size_limit_is_resource_exhausted_and_leaves_nothing(tmp_path):
    # EFBIG (RLIMIT_FSIZE here): the disk's kind of failure, as ENOSPC,
    # not a bad argument (it was CheckpointValueError, OUT_OF_RANGE).
    import subprocess
    import sys
    code = r"""
import os, resource, signal, sys, torch, dcp
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
try:
    dcp.save({"w": torch.ones(1 << 20)}, checkpoint_id=sys.argv[1])
except dcp.CheckpointException as e:
    print(type(e).__name__, e.code_name, isinstance(e, ValueError),
          isinstance(e, OSError), e.errno)
    print(sorted(os.listdir(sys.argv[1])) if os.path.exists(sys.argv[1])
          else None)
"""
    env = dict(os.environ, PYTHONPATH=os.path.dirname(
        os.path.dirname(dcp.__file__)))
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "c")],
                         capture_output=True, text=True, timeout=120,
                         env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    first, second = out.stdout.splitlines()[:2]
    import errno
    assert first == ("CheckpointResourceError RESOURCE_EXHAUSTED False True "
                     f"{errno.EFBIG}"), first
    assert second in ("None", "[]"), second


def test_a_save_into_a_torch_dcp_checkpoint_is_refused(tmp_path):
    """dcp.save (and async_save) into a directory torch.distributed.checkpoint
    wrote refuses, naming it, and leaves torch's checkpoint loadable (it
    replaced torch's .metadata and left its data files behind)."""
    import torch.distributed.checkpoint as tdcp
    path = str(tmp_path / "torchs")
    tdcp.save({"w": torch.ones(3)}, checkpoint_id=path, no_dist=True)
    before = sorted(os.listdir(path))
    for save in (dcp.save, lambda *a, **k: dcp.async_save(*a, **k).result()):
        with pytest.raises(dcp.CheckpointException,
                           match="written by torch.distributed.checkpoint"
                                 ".*torch_dcp_to_dcp") as e:
            save({"w": torch.zeros(3)}, checkpoint_id=path)
        assert e.value.code == _lib.FAILED_PRECONDITION
        assert sorted(os.listdir(path)) == before
    back = {"w": torch.zeros(3)}
    tdcp.load(back, checkpoint_id=path, no_dist=True)
    assert torch.equal(back["w"], torch.ones(3))


def test_a_load_leaves_the_garbage_collectors_state_as_it_was(ckpt):
    """A load pauses Python's cyclic GC while it walks (not while the engine
    reads) and leaves it as it found it, enabled or not, failed or not."""
    import gc
    dcp.save({"a": torch.ones(2), "l": [1, 2]}, checkpoint_id=ckpt)
    seen = []
    real = _lib.lib().dcp_load

    class Spy:  # records the GC's state during the engine's read
        def __call__(self, *args):
            seen.append(gc.isenabled())
            return real(*args)
    monkey = pytest.MonkeyPatch()
    monkey.setattr(_lib.lib(), "dcp_load", Spy())
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            try:
                dcp.load({"a": torch.zeros(2), "l": []}, checkpoint_id=ckpt)
                assert gc.isenabled() is enabled
                with pytest.raises(dcp.CheckpointNotFoundError):
                    dcp.load({"b": torch.zeros(2)}, checkpoint_id=ckpt)
                assert gc.isenabled() is enabled
            finally:
                gc.enable()
    finally:
        monkey.undo()
    assert seen and seen[0] is True and False in seen
