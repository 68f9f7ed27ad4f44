"""Engines: one interface over how a model is wrapped, stepped, gathered and saved.

    single     one process, the reference path
    ddp        torch DistributedDataParallel: replicated weights, all-reduced gradients
    deepspeed  DeepSpeed ZeRO stage 0-3, optional optimizer / parameter CPU offload
    fsdp2      torch `fully_shard` (per-parameter sharding) with a MixedPrecisionPolicy

The trainer only talks to `Engine`. Every engine computes the same thing: each rank's loss is its share of the
global sum over learned tokens divided by the global learned-token count, multiplied by the world size because
every engine averages gradients over ranks; the averaged gradient is then exactly the single-process gradient of
the whole global batch. Collective methods (marked so) must be called by every rank in the same order.
"""

from __future__ import annotations

import torch

from loraflow.engines.base import Engine
from loraflow.engines.launch import distributed_env, init_distributed, is_main
from loraflow.enginespec import engine_class

__all__ = ["Engine", "build_engine", "distributed_env", "init_distributed", "is_main"]


def build_engine(plan, model: torch.nn.Module, total_steps: int) -> Engine:
    """Wrap the ready model (loaded, adapted, frozen, checkpointed) for the plan's engine and build its optimizer:
    the last two steps of the documented order (engine wrap -> optimizer). The engine table is enginespec.py."""
    return engine_class(plan.setup.engine)(plan, model, total_steps)
