"""dcp: a GPU-aware distributed checkpoint engine, for PyTorch programs.

The seed's API (tensorplay.distributed.checkpoint, after PyTorch's
torch.distributed.checkpoint) over dcp's C ABI (libdcp.so through ctypes;
no extension module):

    import dcp
    dcp.save({"model": model.state_dict()}, checkpoint_id="/ckpt/step100")
    dcp.load(state, checkpoint_id="/ckpt/step100")          # in place
    resp = dcp.async_save(state, checkpoint_id=...)          # THREAD
    resp.staging_completion.result(); resp.upload_completion.result()

libdcp.so is found through $DCP_LIBRARY, next to this package (the wheel)
or in the repository's bazel-bin/capi (a checkout); it is loaded on first
use. Pickled values need allow_pickle=True on save and load: loading a
pickle runs code from the checkpoint.
"""

from . import errors
from ._lib import version as library_version
from ._state import ShardedTensor
from .async_save import AsyncCheckpointerType, AsyncSaveResponse, async_save
from .stager import DefaultStager, StagingOptions
from .checkpoint import load, load_state_dict, save, save_state_dict
from .errors import (CheckpointCorruptError, CheckpointException,
                     CheckpointExistsError, CheckpointFileNotFoundError,
                     CheckpointNotADirectoryError, CheckpointNotFoundError,
                     CheckpointNotImplementedError,
                     CheckpointPermissionError, CheckpointResourceError,
                     CheckpointTimeoutError, CheckpointValueError)
from .metadata import (BytesStorageMetadata, ChunkStorageMetadata, Metadata,
                       MetadataIndex, StorageInfo, StorageMeta,
                       TensorProperties,
                       TensorStorageMetadata, read_metadata)
from .interfaces import (BytesIOWriteData, CheckpointableTensor, FileSystem,
                         FileSystemBase, LoadItemType, LoadPlan, LoadPlanner,
                         ReadItem, SavePlan, SavePlanner, StorageReader,
                         StorageWriter, TensorWriteData, WriteItem,
                         WriteItemType)
from .planner import DefaultLoadPlanner, DefaultSavePlanner
from .process_group import ProcessGroup
from .stateful import Stateful
from .extensions import ExtensionRegistry, StreamTransformExtension, ZStandard
from .storage import (FileSystemReader, FileSystemWriter,
                      HuggingFaceStorageReader, HuggingFaceStorageWriter,
                      MegaStorageReader, MegaStorageWriter,
                      QuantizedHuggingFaceStorageReader, SerializationFormat)

try:
    from .state_dict import (StateDictOptions, get_model_state_dict,
                             get_optimizer_state_dict, get_state_dict,
                             load_sharded_optimizer_state_dict,
                             set_model_state_dict, set_optimizer_state_dict,
                             set_state_dict)
except ModuleNotFoundError as _e:
    # The helpers are for torch models: without torch, the rest of the
    # package (numpy arrays) still works.
    if _e.name != "torch":
        raise
    _NEED_TORCH = frozenset((
        "StateDictOptions", "get_model_state_dict", "get_optimizer_state_dict",
        "get_state_dict", "load_sharded_optimizer_state_dict",
        "set_model_state_dict", "set_optimizer_state_dict", "set_state_dict"))


# The seed's submodules that `import dcp` does not import itself: attributes
# of the package on first use (dcp.state_dict_saver.AsyncCheckpointerType
# works as after `import torch.distributed.checkpoint as dcp`).
_SEED_SUBMODULES = frozenset((
    "api", "default_planner", "filesystem", "hf_storage", "staging",
    "state_dict_loader", "state_dict_saver"))


def __getattr__(name):
    # format_utils is imported on first use, not here: `python -m
    # dcp.format_utils` then runs it without runpy's RuntimeWarning (the
    # module found in sys.modules before it runs as __main__).
    if name == "format_utils" or name in _SEED_SUBMODULES:
        import importlib
        return importlib.import_module("." + name, __name__)
    if name in globals().get("_NEED_TORCH", ()):
        raise AttributeError(
            f"dcp.{name} needs torch (it works on torch modules and "
            "optimizers), which is not installed: pip install torch, or the "
            "wheel's [torch] extra")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__version__ = "0.1.0"
version = __version__

__all__ = [
    "save", "load", "async_save", "save_state_dict", "load_state_dict",
    "AsyncCheckpointerType", "AsyncSaveResponse", "DefaultStager",
    "StagingOptions", "FileSystemWriter",
    "FileSystemReader", "SerializationFormat", "HuggingFaceStorageWriter",
    "HuggingFaceStorageReader", "QuantizedHuggingFaceStorageReader",
    "MegaStorageWriter", "MegaStorageReader", "ZStandard",
    "StreamTransformExtension", "ExtensionRegistry", "DefaultSavePlanner",
    "DefaultLoadPlanner", "Metadata", "TensorStorageMetadata",
    "ChunkStorageMetadata", "BytesStorageMetadata", "TensorProperties",
    "MetadataIndex", "StorageMeta", "StorageInfo", "read_metadata",
    "Stateful",
    "ShardedTensor", "ProcessGroup", "CheckpointException",
    "CheckpointValueError", "CheckpointNotFoundError",
    "CheckpointFileNotFoundError", "CheckpointExistsError",
    "CheckpointPermissionError", "CheckpointTimeoutError",
    "CheckpointNotImplementedError", "CheckpointCorruptError",
    "CheckpointNotADirectoryError", "CheckpointResourceError",
    "library_version", "version", "errors", "format_utils",
    "get_model_state_dict", "get_optimizer_state_dict", "get_state_dict",
    "set_model_state_dict", "set_optimizer_state_dict", "set_state_dict",
    "StateDictOptions", "load_sharded_optimizer_state_dict",
    "BytesIOWriteData", "CheckpointableTensor", "FileSystem",
    "FileSystemBase", "LoadItemType", "LoadPlan", "LoadPlanner", "ReadItem",
    "SavePlan", "SavePlanner", "StorageReader", "StorageWriter",
    "TensorWriteData", "WriteItem", "WriteItemType",
]
