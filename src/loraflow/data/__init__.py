"""Data: read records (readers), detect and convert their format (formats), mix sources and hold out an eval set
(sources), tokenize with learned-token labels (formatting), truncate, pack and batch (batching). `load_stage_data`
is the entry point: it reads the kind of data the stage declares (stagespec.py)."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field

from loraflow.config.schema import Config
from loraflow.data.batching import (
    BatchOrder,
    DataStats,
    Row,
    as_rows,
    collate,
    learned_tokens,
    pack,
    truncate,
)
from loraflow.data.formatting import (
    EvalPrompt,
    Sample,
    eval_prompt,
    has_template,
    tokenize,
)
from loraflow.data.readers import Record, read_records
from loraflow.data.sources import read_splits
from loraflow.stagespec import stage_spec

log = logging.getLogger("loraflow")

__all__ = ["BatchOrder", "DataSplit", "DataStats", "EvalPrompt", "Record", "Row", "Sample", "collate",
           "learned_tokens", "load_sft", "load_splits", "load_stage_data", "read_records", "read_splits"]


@dataclass
class DataSplit:
    name: str
    rows: list[Row]
    stats: DataStats
    prompts: list[EvalPrompt] = field(default_factory=list)
    processor: object | None = None
    """An image-text model's processor, saved beside the trained weights (so images are prepared as in training
    when the adapter is loaded)."""
    blank: Row | None = None
    """An image-text run on several ranks: the blank-image row a micro-batch without an image gets
    (plan.blank_images; data.multimodal.blank_row)."""


def load_stage_data(config: Config, tokenizer, processor=None) -> tuple[DataSplit, DataSplit | None]:
    """The (train, eval) splits of the kind of data config.stage reads: conversations or text, chosen/rejected
    pairs, or prompts. With a `processor` (an image-text model's AutoProcessor) chat messages may hold images
    (data.multimodal): every image is opened here, before the model loads."""
    spec = stage_spec(config.stage)
    if spec.data == "sft":
        return load_sft(config, tokenizer, processor)
    if spec.data == "pairs":
        return _load_pair_data(config, tokenizer, spec.eval_generates, processor)
    if processor is not None:
        from loraflow.errors import DataError

        raise DataError(f"stage {config.stage}: prompts with images (rl stages) are not supported yet; image-text "
                        "models train with the sft, rm and dpo stages.")
    from loraflow.data.preference import load_prompts

    return load_splits(config, tokenizer, "prompts",
                       lambda records, key: load_prompts(records, key, tokenizer, config.data.max_length))


def _load_pair_data(config: Config, tokenizer, eval_generates: bool,
                    processor=None) -> tuple[DataSplit, DataSplit | None]:
    from loraflow.data.preference import answer_prompt, load_pairs

    train, held_out = load_splits(config, tokenizer, "pairs",
                                  lambda records, key: load_pairs(records, key, tokenizer, config.data.max_length,
                                                                  processor),
                                  processor)
    if held_out is not None and eval_generates and config.eval.generate:
        if processor is not None:
            from loraflow.data.multimodal import pair_answer_prompt

            held_out.prompts = [pair_answer_prompt(r, processor) for r in held_out.rows]
        else:
            held_out.prompts = [answer_prompt(r, tokenizer) for r in held_out.rows]
    return train, held_out


def load_sft(config: Config, tokenizer, processor=None) -> tuple[DataSplit, DataSplit | None]:
    """SFT train and eval splits. Eval data is never packed (its loss is per sample) and also yields the prompts
    and references for exact-match generation, except for plain-text records, which have no reference answer.
    With a `processor`, rows and prompts carry their image inputs and nothing is packed (data.multimodal)."""
    train_records, eval_records = read_splits(config, "sft", has_template(processor or tokenizer))
    train = _sft_split(config, tokenizer, "train", train_records, processor)
    if eval_records is None:
        return train, None
    if config.eval.max_samples:
        eval_records = eval_records[: config.eval.max_samples]
    held_out = _sft_split(config, tokenizer, "eval", eval_records, processor)
    if config.eval.generate:
        if processor is not None:
            from loraflow.data.multimodal import eval_prompt as multimodal_prompt

            prompts = [multimodal_prompt(r, "auto", processor) for r in eval_records]
        else:
            prompts = [eval_prompt(r, "auto", tokenizer) for r in eval_records]
        held_out.prompts = [p for p in prompts if p is not None]
        if len(held_out.prompts) < len(prompts):
            # Exact match needs a reference answer; continued-pretraining text has none, so loss is the measure.
            log.info("data.eval: %d of %d records are plain text with no reference answer: they count in eval "
                     "loss only, not in exact match%s", len(prompts) - len(held_out.prompts), len(prompts),
                     " (eval measures loss only)" if not held_out.prompts else "")
    return train, held_out


def _sft_split(config: Config, tokenizer, which: str, records: list[Record], processor=None) -> DataSplit:
    d = config.data
    if processor is not None:
        from loraflow.data.multimodal import load_rows, warn_packing

        if which == "train":
            warn_packing(d.packing, f"data.{which}")
        return DataSplit(which, *load_rows(records, processor, d.max_length, f"data.{which}"))
    samples, stats = truncate([tokenize(r, "auto", tokenizer) for r in records], d.max_length)
    if not samples:
        raise_empty(f"data.{which}", d.max_length)
    if which == "train" and d.packing:
        # Shuffle once before packing so each packed row mixes samples from across the file.
        random.Random(config.train.seed).shuffle(samples)
        rows = pack(samples, d.max_length)
    else:
        rows = as_rows(samples)
    return DataSplit(which, rows, stats)


def load_splits(config: Config, tokenizer, kind: str, build, processor=None) -> tuple[DataSplit, DataSplit | None]:
    """Train and eval splits of the pair ("pairs") and prompt ("prompts") stages: the records read_splits gives,
    made into rows by `build(records, config key) -> (rows, stats)`; eval is cut to eval.max_samples."""
    train_records, eval_records = read_splits(config, kind, has_template(processor or tokenizer))
    train = DataSplit("train", *build(train_records, "data.train"))
    if eval_records is None:
        return train, None
    if config.eval.max_samples:
        eval_records = eval_records[: config.eval.max_samples]
    return train, DataSplit("eval", *build(eval_records, "data.eval"))


def raise_empty(key: str, max_length: int) -> None:
    from loraflow.errors import DataError

    raise DataError(f"{key}: every sample was dropped because truncation to data.max_length="
                    f"{max_length} left no learned token. Raise data.max_length.")
