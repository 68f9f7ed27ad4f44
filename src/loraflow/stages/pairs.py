"""What the pairwise stages (rm, dpo) share: how pairs become training batches and measuring held-out pairs."""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from loraflow.data import DataSplit
from loraflow.data.blank_images import blank_image_collate
from loraflow.data.preference import collate_pairs


def pair_collate(plan, train: DataSplit, pad_id: int) -> Callable[[list, int], dict[str, torch.Tensor]]:
    """Training micro-batches of pairs: one row per answer, or packed into data.max_length rows (data.packing);
    on a multi-rank image-text run, a micro-batch without an image gets the blank image after its pairs."""
    d = plan.config.data
    pairs = functools.partial(collate_pairs, pack_to=d.max_length if d.packing else 0)
    return blank_image_collate(pairs, train.blank, pad_id)


def eval_pairs(plan, engine, tokenizer, split: DataSplit, margin_fn: Callable[[dict], torch.Tensor],
               prefix: str) -> dict[str, Any]:
    """Accuracy (margin > 0) and mean margin over the held-out pairs, and greedy exact match of their prompts
    against the chosen answers when the split has prompts. Every rank evaluates every pair (sharded engines need
    every rank in every forward)."""
    size = plan.config.eval.batch_size
    margins = []
    for start in range(0, len(split.rows), size):
        index = list(range(start, min(start + size, len(split.rows))))
        batch = collate_pairs([split.rows[i] for i in index], tokenizer.pad_token_id)
        batch["index"] = torch.tensor(index)
        margins.append(margin_fn({k: v.to(plan.device) for k, v in batch.items()}).float().cpu())
    m = torch.cat(margins)
    values: dict[str, Any] = {f"{prefix}_accuracy": float((m > 0).float().mean()),
                              f"{prefix}_margin": float(m.mean())}
    if split.prompts:
        from loraflow.loop.evaluate import exact_match

        e = plan.config.eval
        with engine.gathered_for_generation() as model:
            em = exact_match(model, tokenizer, split.prompts, e.max_new_tokens, e.batch_size, plan.device,
                             plan.autocast_dtype)
        values["exact_match"] = em.accuracy
    return values
