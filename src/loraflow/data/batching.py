"""Truncation (counted), padding, packing, and a deterministic micro-batch order that resume can restart at any
position."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from loraflow.data.formatting import IGNORE, Sample
from loraflow.data.image_batching import collate_images


@dataclass
class DataStats:
    samples: int = 0
    truncated: int = 0
    dropped: int = 0
    tokens: int = 0
    label_tokens: int = 0
    dropped_origins: list[str] = field(default_factory=list)
    image_cut: int = 0
    """Image-text samples dropped because data.max_length would cut through their image tokens."""
    image_cut_origins: list[str] = field(default_factory=list)

    def describe(self, name: str, max_length: int) -> str:
        text = (f"{name}: {self.samples} samples, {self.tokens} tokens ({self.label_tokens} learned); "
                f"{self.truncated} truncated to data.max_length={max_length}")
        if self.dropped:
            text += (f"; {self.dropped} dropped because truncation left no learned token (first: "
                     f"{self.dropped_origins[0]}); raise data.max_length to keep them")
        if self.image_cut:
            text += (f"; {self.image_cut} dropped because data.max_length={max_length} would cut through their image "
                     f"tokens (first: {self.image_cut_origins[0]}); raise data.max_length to keep them")
        return text


def truncate(samples: list[Sample], max_length: int) -> tuple[list[Sample], DataStats]:
    stats = DataStats()
    kept = []
    for s in samples:
        if len(s.input_ids) > max_length:
            stats.truncated += 1
            s = Sample(s.input_ids[:max_length], s.labels[:max_length], s.origin)
        if tally(stats, s.input_ids, s.labels, s.origin):
            kept.append(s)
    return kept, stats


def tally(stats: DataStats, ids: list[int], labels: list[int], origin: str) -> bool:
    """Count a (truncated) sample into `stats`: kept, or dropped when it has no learned token left. Position 0 is
    never predicted, so a learned token there does not count."""
    learned = sum(1 for t in labels[1:] if t != IGNORE)
    if learned == 0:
        stats.dropped += 1
        stats.dropped_origins.append(origin)
        return False
    stats.samples += 1
    stats.tokens += len(ids)
    stats.label_tokens += learned
    return True


@dataclass
class Row:
    """One row of a micro-batch: a single sample, or several packed with restarting position ids."""
    input_ids: list[int]
    labels: list[int]
    position_ids: list[int] | None = None
    images: dict[str, torch.Tensor] | None = None
    """Image-text rows: the processor's image tensors for this row's images (pixel_values, image_grid_thw, ...),
    batched by families.IMAGE_BATCHING; None for a text-only row."""
    token_types: dict[str, list[int]] | None = None
    """Per-token processor outputs (token_type_ids of Gemma3/PaliGemma, mm_token_type_ids), one per input id."""
    images_end: int = 0
    """One past the last image token: truncation shorter than this would cut an image, so the row is dropped."""


def cut(row: Row, max_length: int) -> Row:
    """The row's first max_length tokens, per-token fields with them; its images stay (callers drop a row whose
    images_end is beyond max_length, so no image loses tokens)."""
    types = {k: v[:max_length] for k, v in row.token_types.items()} if row.token_types else row.token_types
    return Row(row.input_ids[:max_length], row.labels[:max_length],
               row.position_ids[:max_length] if row.position_ids is not None else None,
               row.images, types, row.images_end)


def as_rows(samples: list[Sample]) -> list[Row]:
    return [Row(s.input_ids, s.labels) for s in samples]


def pack(samples: list[Sample], max_length: int) -> list[Row]:
    """Greedy packing in the given order. Each sample's first label is masked (it would be predicted from the
    previous sample's last token), and position ids restart at 0 so transformers keeps samples apart."""
    rows: list[Row] = []
    current = Row([], [], [])
    for s in samples:
        if current.input_ids and len(current.input_ids) + len(s.input_ids) > max_length:
            rows.append(current)
            current = Row([], [], [])
        current.input_ids += s.input_ids
        current.labels += [IGNORE] + s.labels[1:]
        current.position_ids += list(range(len(s.input_ids)))
    if current.input_ids:
        rows.append(current)
    return rows


def collate(rows: list[Row], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded tensors. Padded rows get an attention mask; packed rows get position ids and no mask
    (transformers derives the per-sample causal mask from the restarting positions)."""
    width = max(len(r.input_ids) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    packed = rows[0].position_ids is not None
    extra = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(r.input_ids)
        ids[i, :n] = torch.tensor(r.input_ids)
        labels[i, :n] = torch.tensor(r.labels)
        if packed:
            # Padding continues as its own "sample" so it never joins the last real one.
            extra[i, :n] = torch.tensor(r.position_ids)
            extra[i, n:] = torch.arange(width - n)
        else:
            extra[i, :n] = 1
    batch = {"input_ids": ids, "labels": labels}
    batch["position_ids" if packed else "attention_mask"] = extra
    if any(r.images or r.token_types for r in rows):
        batch.update(collate_images(rows, width))
    return batch


def real_tokens(batch: dict[str, torch.Tensor]) -> int:
    """The tokens of a micro-batch that are data (the run's token count and tokens/s): those of the attention mask
    (pad may equal eos), the positions packed pairs' segments cover, or every position of a packed SFT row. A blank
    image's row (data.blank_images.with_blank, counted in `blank_rows`) is no data."""
    mask = batch.get("attention_mask", batch["segments"] >= 0 if "segments" in batch else None)
    if "blank_rows" in batch:
        mask = mask[: -int(batch["blank_rows"])]
    return int(mask.sum()) if mask is not None else batch["input_ids"].numel()


def learned_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Tokens the loss predicts in this batch (labels shifted by one)."""
    return int((batch["labels"][:, 1:] != IGNORE).sum())


class BatchOrder:
    """Micro-batch i of the whole run -> row indices. Epoch e shuffles with a generator seeded by (seed, e), so
    the order depends only on the seed and position: resume restarts at a position and sees the same batches."""

    def __init__(self, num_rows: int, micro_batch_size: int, seed: int):
        self.num_rows, self.micro_batch_size, self.seed = num_rows, micro_batch_size, seed
        self.per_epoch = math.ceil(num_rows / micro_batch_size)
        self._cached: tuple[int, list[int]] | None = None

    def _permutation(self, epoch: int) -> list[int]:
        if self._cached is None or self._cached[0] != epoch:
            gen = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
            self._cached = (epoch, torch.randperm(self.num_rows, generator=gen).tolist())
        return self._cached[1]

    def indices(self, position: int) -> list[int]:
        epoch, k = divmod(position, self.per_epoch)
        perm = self._permutation(epoch)
        return perm[k * self.micro_batch_size: (k + 1) * self.micro_batch_size]
