"""Supervised fine-tuning: NLL on assistant/completion tokens; evaluation by held-out loss and greedy exact match."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from loraflow.data import DataSplit, collate
from loraflow.data.blank_images import blank_image_collate
from loraflow.loop.evaluate import eval_loss, exact_match
from loraflow.losses.logprobs import learned_logps
from loraflow.losses import sft_loss_from_logps

log = logging.getLogger("loraflow")


def loss_fn(plan):
    def compute(model: torch.nn.Module, batch: dict[str, torch.Tensor], num_items: int) -> torch.Tensor:
        logps, _ = learned_logps(model, batch, plan.logits)
        return sft_loss_from_logps(logps, num_items)

    return compute


def evaluator(plan, tokenizer, split: DataSplit | None):
    if split is None:
        return None
    e = plan.config.eval

    def evaluate(engine) -> dict[str, Any]:
        # Every rank evaluates the whole split: sharded engines need every rank in every forward.
        values: dict[str, Any] = {"loss": eval_loss(engine.module, split.rows, e.batch_size, tokenizer.pad_token_id,
                                                    plan.device, plan.autocast_dtype, plan.logits)}
        if split.prompts:
            with engine.gathered_for_generation() as model:
                em = exact_match(model, tokenizer, split.prompts, e.max_new_tokens, e.batch_size, plan.device,
                                 plan.autocast_dtype)
            values["exact_match"] = em.accuracy
            for origin, ref, got in em.examples[:3]:
                log.debug("  %s: reference %r, generated %r", origin, ref, got)
        return values

    return evaluate


def build(plan, model, tokenizer, train: DataSplit, eval_split: DataSplit | None, run_dir: Path,
          resume: bool):
    """The stage's trainer, ready to fit (tests drive single steps of it)."""
    from loraflow.loop.trainer import StageHooks, Trainer

    hooks = StageHooks(loss_fn(plan), evaluator(plan, tokenizer, eval_split),
                       collate=blank_image_collate(collate, train.blank, tokenizer.pad_token_id))
    return Trainer(plan, model, tokenizer, train, hooks, run_dir, resume=resume)
