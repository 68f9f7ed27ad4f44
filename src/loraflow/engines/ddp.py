"""DistributedDataParallel: every rank holds the whole model; gradients are all-reduced (averaged) in backward.

Accumulation micro-batches run under `no_sync` (forward and backward both inside, as DDP requires), so gradients
are reduced once per optimizer step. find_unused_parameters comes from the plan: off unless asked, and never with
reentrant checkpointing (rule ddp-reentrant-unused: the reentrant recompute marks parameters ready a second time).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from loraflow.engines.base import Engine, make_optimizer, make_scheduler


class DDPEngine(Engine):
    name = "ddp"

    def __init__(self, plan, model: torch.nn.Module, total_steps: int):
        super().__init__(plan, model, total_steps)
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [torch.cuda.current_device()] if plan.device == "cuda" else None
        self.model = DistributedDataParallel(model, device_ids=device_ids,
                                             find_unused_parameters=plan.setup.find_unused_parameters)
        self.optimizer = make_optimizer([p for _, p in self.trainable], self.train_cfg)
        self.scheduler = make_scheduler(self.optimizer, self.train_cfg, total_steps)

    @contextlib.contextmanager
    def micro_step(self, last: bool) -> Iterator[None]:
        with contextlib.nullcontext() if last else self.model.no_sync():
            yield
