"""Data: read records (readers), tokenize with learned-token labels (formatting), truncate, pack and batch
(batching). `load_split` is the entry point the stages use."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from loraflow.config.schema import Config
from loraflow.data.batching import BatchOrder, DataStats, Row, as_rows, collate, learned_tokens, pack, truncate
from loraflow.data.formatting import EvalPrompt, Sample, eval_prompt, tokenize
from loraflow.data.readers import Record, read_records

__all__ = ["BatchOrder", "DataSplit", "DataStats", "EvalPrompt", "Record", "Row", "Sample", "collate",
           "learned_tokens", "load_split", "load_splits", "read_records"]


@dataclass
class DataSplit:
    name: str
    rows: list[Row]
    stats: DataStats
    prompts: list[EvalPrompt] = field(default_factory=list)


def load_split(config: Config, tokenizer, which: str) -> DataSplit | None:
    """`which` is "train" or "eval". Eval data is never packed (its loss is per sample) and also yields the
    prompts and references for exact-match generation."""
    d = config.data
    spec = d.train if which == "train" else d.eval
    if not spec:
        return None
    records = read_records(spec, f"data.{which}", d.train_split if which == "train" else d.eval_split)
    if which == "eval" and config.eval.max_samples:
        records = records[: config.eval.max_samples]
    samples, stats = truncate([tokenize(r, d.format, tokenizer) for r in records], d.max_length)
    if not samples:
        raise_empty(spec, which, d.max_length)
    prompts = [eval_prompt(r, d.format, tokenizer) for r in records] if which == "eval" and config.eval.generate \
        else []
    if which == "train" and d.packing:
        # Shuffle once before packing so each packed row mixes samples from across the file.
        random.Random(config.train.seed).shuffle(samples)
        rows = pack(samples, d.max_length)
    else:
        rows = as_rows(samples)
    return DataSplit(which, rows, stats, prompts)


def load_splits(config: Config, read) -> tuple[DataSplit, DataSplit | None]:
    """data.train and data.eval read by `read(spec, config key, hub split) -> (rows, stats)`, as the pair and
    prompt stages read them; eval is cut to eval.max_samples."""
    d = config.data
    out: list[DataSplit | None] = []
    for which, spec, split in (("train", d.train, d.train_split), ("eval", d.eval, d.eval_split)):
        if not spec:
            out.append(None)
            continue
        rows, stats = read(spec, f"data.{which}", split)
        if which == "eval" and config.eval.max_samples:
            rows = rows[: config.eval.max_samples]
        out.append(DataSplit(which, rows, stats))
    return out[0], out[1]


def raise_empty(spec: str, which: str, max_length: int) -> None:
    from loraflow.errors import DataError

    raise DataError(f"data.{which}={spec}: every sample was dropped because truncation to data.max_length="
                    f"{max_length} left no learned token. Raise data.max_length.")
