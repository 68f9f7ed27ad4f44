"""How the image inputs of a micro-batch's rows are batched for each image-text family's forward: the collate
that follows families.IMAGE_BATCHING (data.batching.collate calls it for rows that carry images)."""

from __future__ import annotations

import torch

from loraflow.families import IMAGE_BATCHING


def _pad_dim1(tensors: list[torch.Tensor]) -> torch.Tensor:
    width = max(t.shape[1] for t in tensors)
    out = []
    for t in tensors:
        if t.shape[1] < width:
            pad = t.new_zeros((t.shape[0], width - t.shape[1], *t.shape[2:]))
            t = torch.cat([t, pad], dim=1)
        out.append(t)
    return torch.cat(out, dim=0)


def _per_row(tensors: list[torch.Tensor | None], width: int | None = None, left: bool = False) -> torch.Tensor:
    """Inputs of shape [1, ...] per row (Mllama's), one row of the result each, zero-padded to the largest of every
    other dimension; a row without any (text only) is all zeros, which Mllama reads as no image to attend to.
    `width`: dim 1 counts tokens (cross_attention_mask), padded or cut to the micro-batch's token width (a row
    truncated to data.max_length keeps its first tokens' values); `left`: the rows are left-padded (prompts for
    generation), so each row's tokens end at the last column."""
    present = [t for t in tensors if t is not None]
    tail = [max(t.shape[d] for t in present) for d in range(1, present[0].dim())]
    if width is not None:
        tail[0] = width
    out = present[0].new_zeros((len(tensors), *tail))
    for i, t in enumerate(tensors):
        if t is not None:
            t = t[0, :tail[0]]
            first = slice(tail[0] - t.shape[0], tail[0]) if left and width is not None else slice(0, t.shape[0])
            out[(i, first, *(slice(0, n) for n in t.shape[1:]))] = t
    return out


def collate_images(rows: list, width: int, left: bool = False) -> dict[str, torch.Tensor]:
    """The image inputs of a micro-batch of right-padded rows (`left`: left-padded prompts), by IMAGE_BATCHING; no
    image key when no row has an image. Per-token values of token_types are the caller's to place."""
    batch: dict[str, torch.Tensor] = {}
    keys = [k for r in rows if r.images for k in r.images]
    for key in dict.fromkeys(keys):
        tensors = [r.images[key] for r in rows if r.images and key in r.images]
        rule = IMAGE_BATCHING.get(key, "cat")
        if rule == "images":  # by the layout the processor gave them
            rule = "rows" if tensors[0].dim() >= 6 else "pad1" if tensors[0].dim() == 5 else "cat"
        if rule in ("rows", "token_grid"):
            batch[key] = _per_row([r.images.get(key) if r.images else None for r in rows],
                                  width if rule == "token_grid" else None, left)
        else:
            batch[key] = _pad_dim1(tensors) if rule == "pad1" else torch.cat(tensors, dim=0)
    for key in dict.fromkeys(k for r in rows if r.token_types for k in r.token_types):
        values = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            if r.token_types and key in r.token_types:
                values[i, : len(r.token_types[key])] = torch.tensor(r.token_types[key])
        batch[key] = values
    return batch
