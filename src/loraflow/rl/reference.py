"""The reference policy of dpo, grpo and ppo, as the plan chose it (plan.reference):

- `adapters-disabled`: the policy itself with its adapters switched off (PEFT's disable_adapter), in eval mode
  and without autograd. No second copy of the weights; under ZeRO-3 and FSDP2 it is the same sharded model.
- `copy`: a separately loaded frozen model (full fine-tuning changes every weight, so the start must be kept).
- `precomputed`: (dpo) log-probs of every pair computed once before training, by the starting model itself; no
  reference model exists during training.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch

from loraflow.phases import phase
from loraflow.setup.precision import autocast
from loraflow.stagespec import REFERENCE_SCORING

ScoreFn = Callable[[torch.nn.Module, dict[str, torch.Tensor]], torch.Tensor]


@contextlib.contextmanager
def adapters_off(model: torch.nn.Module) -> Iterator[None]:
    """PEFT's disable_adapter() without its requires_grad toggling: each adapter layer (and modules_to_save
    wrapper) is switched off by its own flag, and nothing else changes. PEFT turns requires_grad off on entry and
    back on at exit on whatever parameter objects the modules hold at that moment; under FSDP2 the root unit (the
    output head) is still unsharded after the reference forward, so the flag comes back on its temporary
    unsharded parameters and the registered shards stay frozen: LoRA on lm_head stopped training after the first
    GRPO step (found by the composition sweep). The reference forward runs without autograd, so requires_grad has
    nothing to do there."""
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils.other import AuxiliaryTrainingWrapper

    layers = [m for m in model.modules() if isinstance(m, (BaseTunerLayer, AuxiliaryTrainingWrapper))]
    before = [m._disable_adapters for m in layers]
    for m in layers:
        m._disable_adapters = True
    try:
        yield
    finally:
        for m, flag in zip(layers, before):
            m._disable_adapters = flag


class Reference:
    def __init__(self, plan, tokenizer):
        self.plan, self.kind = plan, plan.reference
        self.copy = None
        if self.kind == "copy":
            from loraflow.setup import frozen_copy

            self.copy = frozen_copy(plan, tokenizer)
        self.cache: dict[tuple[str, int], torch.Tensor] = {}

    @contextlib.contextmanager
    def model(self, engine) -> Iterator[torch.nn.Module]:
        """The reference model, ready for a no-autograd forward; the policy is back in train mode afterwards."""
        if self.kind == "copy":
            with phase(REFERENCE_SCORING, self.copy):
                yield self.copy
        elif self.kind == "adapters-disabled":
            module = engine.module
            with phase(REFERENCE_SCORING, module), adapters_off(module):
                yield module
        else:
            # The starting model is the policy before its first update: before training, it is the reference.
            with phase(REFERENCE_SCORING, engine.module):
                yield engine.module

    def score(self, engine, batch: dict[str, torch.Tensor], fn: ScoreFn, split: str = "train") -> torch.Tensor:
        """fn(reference model, batch) for this batch; precomputed values are looked up by the rows' indices."""
        if self.kind == "precomputed":
            rows = batch["index"].tolist()
            missing = [i for i in rows if (split, i) not in self.cache]
            if missing:
                raise RuntimeError(f"no precomputed reference log-probs for {split} rows {missing[:5]}; "
                                   "precompute() must run before training")
            return torch.stack([self.cache[(split, i)] for i in rows]).to(self.plan.device)
        with self.model(engine) as model, autocast(self.plan.device, self.plan.autocast_dtype):
            return fn(model, batch).float()

    def precompute(self, engine, split: str, rows: list[Any], collate: Callable[[list[Any]], dict[str, Any]],
                   fn: ScoreFn, batch_size: int) -> None:
        """Score every row once with the starting model. Every rank scores all rows (the same forwards on every
        rank, which sharded engines need; it runs once, before the first step)."""
        if self.kind != "precomputed":
            return
        with self.model(engine) as model, autocast(self.plan.device, self.plan.autocast_dtype):
            for start in range(0, len(rows), batch_size):
                index = list(range(start, min(start + batch_size, len(rows))))
                batch = {k: v.to(self.plan.device) for k, v in collate([rows[i] for i in index]).items()}
                values = fn(model, batch).float().cpu()
                for i, v in zip(index, values):
                    self.cache[(split, i)] = v
