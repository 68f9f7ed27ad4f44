"""How the image inputs of a micro-batch's rows are batched for each image-text family's forward: one table, and
the collate that follows it (data.batching.collate calls it for rows that carry images)."""

from __future__ import annotations

import torch

# How collate batches each processor output of the rows in a micro-batch, as each family's forward expects.
#   cat:    concatenated along dim 0 (the model consumes images in order of their placeholder tokens)
#   pad1:   padded with zeros along dim 1 to the batch's largest, then concatenated along dim 0
#   images: pad1 for a 5-D per-row layout, else cat
#   token:  one value per input id: padded like input_ids (0 on padding and on rows that lack it)
# A key not listed is concatenated along dim 0.
IMAGE_BATCHING: dict[str, tuple[str, str]] = {
    "pixel_values": ("images", ("LLaVA, Gemma3, PaliGemma [n_images, C, H, W]; Qwen2-VL [n_patches, D]; "
                                "Idefics3 [1, n_images, C, H, W] and LLaVA-NeXT [n_images, n_patches, C, H, W], "
                                "whose padding (all-zero images / patches) the models drop")),
    "pixel_attention_mask": ("pad1", "Idefics3 [1, n_images, H, W], padded with False like its images"),
    "image_grid_thw": ("cat", "Qwen2-VL / Qwen2.5-VL [n_images, 3]"),
    "image_sizes": ("cat", "LLaVA-NeXT [n_images, 2]"),
    "token_type_ids": ("token", "Gemma3 / PaliGemma: 1 on image tokens"),
    "mm_token_type_ids": ("token", "Qwen2-VL: modality of each token"),
}
TOKEN_KEYS = {k for k, (rule, _) in IMAGE_BATCHING.items() if rule == "token"}


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
        rule = IMAGE_BATCHING.get(key, ("cat", ""))[0]
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
