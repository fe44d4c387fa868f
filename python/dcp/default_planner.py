"""torch.distributed.checkpoint.default_planner's planners in dcp (they
live in dcp.planner; the planning itself runs in the engine)."""

from .planner import DefaultLoadPlanner, DefaultSavePlanner

__all__ = ["DefaultSavePlanner", "DefaultLoadPlanner"]
