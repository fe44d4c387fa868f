"""torch.distributed.checkpoint.state_dict_loader's names in dcp."""

from .checkpoint import load, load_state_dict

__all__ = ["load_state_dict", "load"]
