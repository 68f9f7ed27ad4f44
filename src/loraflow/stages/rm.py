"""Reward model: a scalar score head on the causal LM's body (adapters on the body, the head trained in full),
trained with the pairwise Bradley-Terry loss on chosen/rejected pairs. Metric: preference accuracy (chosen scored
above rejected) on held-out pairs. The saved adapter (PEFT format, score head included) plus `reward_model.json`
naming its base is what grpo and ppo load as rl.reward_model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from loraflow.data import DataSplit
from loraflow.data.preference import collate_pairs, pair_count
from loraflow.losses import pairwise_rm_loss
from loraflow.phases import phase
from loraflow.reward_model import MANIFEST
from loraflow.setup.precision import autocast
from loraflow.stages.pairs import eval_pairs, model_inputs
from loraflow.stagespec import EVALUATION


def scores(model: torch.nn.Module, batch: dict[str, torch.Tensor], use_cache: bool) -> torch.Tensor:
    """[2P] scores: the head's output at each row's last non-pad token (chosen rows first)."""
    return model(**model_inputs(batch), use_cache=use_cache).logits.squeeze(-1).float()


def loss_fn(use_cache: bool):
    def compute(model: torch.nn.Module, batch: dict[str, torch.Tensor], num_items: int):
        r = scores(model, batch, use_cache)
        p = r.shape[0] // 2
        margin = (r[:p] - r[p:]).detach()
        return pairwise_rm_loss(r[:p], r[p:], num_items), {"accuracy": float((margin > 0).sum()),
                                                             "margin": float(margin.sum())}

    return compute


def build(plan, model, tokenizer, train: DataSplit, eval_split: DataSplit | None, run_dir: Path,
          resume: bool):
    """The stage's trainer, ready to fit (tests drive single steps of it)."""
    from loraflow.trainer import StageHooks, Trainer

    def evaluate(engine) -> dict[str, Any]:
        def margins(batch):
            with phase(EVALUATION, engine.module), autocast(plan.device, plan.autocast_dtype):
                r = scores(engine.module, batch, plan.use_cache)
            p = r.shape[0] // 2
            return r[:p] - r[p:]

        return eval_pairs(plan, engine, tokenizer, eval_split, margins, prefix="preference")

    hooks = StageHooks(loss_fn(plan.use_cache), evaluate if eval_split is not None else None, collate=collate_pairs,
                       count=pair_count)
    return Trainer(plan, model, tokenizer, train, hooks, run_dir, resume=resume)


def finish(trainer, summary: dict[str, Any]) -> None:
    """After training: the reward model's manifest beside its adapter."""
    plan = trainer.plan
    if trainer.main:
        # Later stages load the head on the same base model; the adapter's own base path may be a temporary
        # or another machine's directory, so the config's model spec is recorded beside it.
        manifest = {"base": plan.config.model.path, "merge_adapters": plan.config.model.merge_adapters,
                    "head": "score", "method": plan.config.adapter.method}
        (Path(summary["weights"]) / MANIFEST).write_text(json.dumps(manifest, indent=2))

