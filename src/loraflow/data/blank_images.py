"""The blank image of a multi-rank image-text run (plan.blank_images): a micro-batch whose rows hold no image gets
one blank-image row, so every rank runs the vision encoder (rules zero3-vision-skipped, ddp-unused-vision-tower).
The stages add it where they build their micro-batches (`blank_image_collate` around their collate hook); the row
is marked (`blank_rows`) so that it counts as no data: no tokens, no image for the first-step gradient guard."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from loraflow.data.batching import Row, collate
from loraflow.data.formatting import IGNORE
from loraflow.families import TOKEN_KEYS

Collate = Callable[[list[Any], int], dict[str, torch.Tensor]]


def blank_image_collate(collate_rows: Collate, blank: Row | None, pad_id: int) -> Collate:
    """`collate_rows` (a stage's collate hook: rows, pad id -> micro-batch), adding the blank row to each
    micro-batch that holds no image; `collate_rows` itself when the run has no blank row (data.DataSplit.blank)."""
    if blank is None:
        return collate_rows
    blank_batch = collate([blank], pad_id)  # collated once: every micro-batch without an image gets the same row

    def with_blank_when_imageless(rows: list[Any], pad: int) -> dict[str, torch.Tensor]:
        batch = collate_rows(rows, pad)
        return batch if "pixel_values" in batch else with_blank(batch, blank_batch, pad)

    return with_blank_when_imageless


def with_blank(batch: dict[str, torch.Tensor], blank: dict[str, torch.Tensor], pad_id: int) -> dict[str, torch.Tensor]:
    """`batch` (a collated micro-batch without an image, SFT or pairs) with the collated blank row added as its
    last row, padded to the common width; `blank_rows` tells the trainer not to count its tokens. Stages read
    their rows by count (pairs: the first 2 x num_pairs), so the extra row is never scored."""
    width = max(batch["input_ids"].shape[1], blank["input_ids"].shape[1])
    fill = {"input_ids": pad_id, "labels": IGNORE}
    out = {k: v for k, v in batch.items()}
    for key in ("input_ids", "labels", "attention_mask", *TOKEN_KEYS):
        if key not in batch and key not in blank:
            continue
        rows = []
        for part in (batch, blank):
            t = part.get(key)
            if t is None:  # a per-token key only the blank has (token_type_ids): 0 on the text rows
                t = torch.zeros_like(part["input_ids"])
            pad = t.new_full((t.shape[0], width - t.shape[1]), fill.get(key, 0))
            rows.append(torch.cat([t, pad], dim=1))
        out[key] = torch.cat(rows, dim=0)
    out.update({k: v for k, v in blank.items() if k not in out})
    out["blank_rows"] = torch.tensor(1)
    return out


def images_in_step(towers: Sequence[Any], batches: list[tuple[dict[str, torch.Tensor], bool]],
                   all_sum: Callable[[list[float]], list[float]]) -> int | None:
    """Micro-batches of a step that held a real image, on all ranks (`all_sum` sums over them); None for a text
    model (no towers). The first-step gradient guard excuses the vision side of a step without one."""
    if not towers:
        return None
    local = sum(1 for b, real in batches if real and "blank_rows" not in b and "pixel_values" in b)
    (total,) = all_sum([local])
    return int(total)
