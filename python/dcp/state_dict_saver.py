"""torch.distributed.checkpoint.state_dict_saver's names in dcp:
`from dcp.state_dict_saver import AsyncCheckpointerType`."""

from .async_save import AsyncCheckpointerType, AsyncSaveResponse, async_save
from .checkpoint import save, save_state_dict

__all__ = ["save_state_dict", "save", "async_save", "AsyncCheckpointerType",
           "AsyncSaveResponse"]
