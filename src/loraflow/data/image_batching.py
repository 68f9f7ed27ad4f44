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


def collate_images(rows: list, width: int) -> dict[str, torch.Tensor]:
    """The image inputs of a micro-batch of right-padded rows, by IMAGE_BATCHING; no image key when no row has an
    image."""
    batch: dict[str, torch.Tensor] = {}
    keys = [k for r in rows if r.images for k in r.images]
    for key in dict.fromkeys(keys):
        tensors = [r.images[key] for r in rows if r.images and key in r.images]
        rule = IMAGE_BATCHING.get(key, "cat")
        if rule == "images":
            rule = "pad1" if tensors[0].dim() == 5 else "cat"
        batch[key] = _pad_dim1(tensors) if rule == "pad1" else torch.cat(tensors, dim=0)
    for key in dict.fromkeys(k for r in rows if r.token_types for k in r.token_types):
        values = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            if r.token_types and key in r.token_types:
                values[i, : len(r.token_types[key])] = torch.tensor(r.token_types[key])
        batch[key] = values
    return batch
