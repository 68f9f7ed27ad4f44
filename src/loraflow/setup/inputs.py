"""The run's inputs before its model: the tokenizer (checked against the model's embedding) and the data, read as
the stage declares (stagespec.py). `train` loads them before the weights so a malformed line fails in seconds, and
`check` runs the same code to find the same errors without training."""

from __future__ import annotations

import logging
from pathlib import Path

from loraflow.config.schema import Config
from loraflow.data import load_stage_data
from loraflow.errors import ConfigError
from loraflow.setup.model import (
    ModelInfo,
    inspect_model,
    load_tokenizer,
)
from loraflow.setup.processor import load_processor
from loraflow.locations import location_of
from loraflow.setup.paths import quiet
from loraflow.setup.preflight import check_vocab


def inspect_for_check(config: Config):
    """ModelInfo for `check`, or (a placeholder, note) when the model cannot be looked at here (a hub id that is
    neither cached nor reachable): the plan goes on without the model-dependent checks."""
    try:
        return inspect_model(config), None
    except ConfigError as exc:
        path = config.model.path
        if path.startswith("builtin:") or Path(location_of(path, "model.path")).exists() or \
                "cannot read a model config" not in str(exc):
            raise
        note = (f"note: could not look at model.path={path} (not a local directory, and not in the Hugging Face "
                "cache or not reachable from here), so the model-dependent checks were skipped: model class, "
                "attention, adapter targets, merge adapters, tokenizer, data. `train` will run them once it can "
                "download the model.")
        return ModelInfo(path=path, model_type="not inspected", num_layers=0, tied_embeddings=False,
                         use_cache_default=True, embedding_name="embed_tokens", lm_head_name="lm_head",
                         inspected=False), note


def tokenizer_and_data(plan):
    """The tokenizer (checked against the model's embedding) and the (train, eval) splits, read with the stage's
    data kind (data.load_stage_data): what `train` needs before building the model, and what `check` runs to find
    the same errors. Returns (tokenizer, train_split, eval_split)."""
    config = plan.config
    if not plan.model.image_text:
        tokenizer = load_tokenizer(config, plan.model.path)
        check_vocab(config, tokenizer, plan.model.vocab_size)  # before the data: it fails in a second
        train_split, eval_split = load_stage_data(config, tokenizer)
        return tokenizer, train_split, eval_split
    processor = load_processor(config, plan.model.path)
    tokenizer = processor.tokenizer
    check_vocab(config, tokenizer, plan.model.vocab_size)
    train_split, eval_split = load_stage_data(config, tokenizer, processor)
    _check_vision_learns(plan, train_split)
    train_split.processor = processor
    if plan.blank_images:
        from loraflow.data.multimodal import blank_row

        train_split.blank = blank_row(processor)
    return tokenizer, train_split, eval_split


def _check_vision_learns(plan, split) -> None:
    """A vision encoder or projector set to train on data without a single image would never learn: refuse it
    before the model loads, naming the tower's key."""
    training = [t.name for t in plan.towers if t.name != "language" and t.train != "frozen"]
    if not training or any(getattr(r, "images", None) or getattr(getattr(r, "chosen", None), "images", None)
                           for r in split.rows):
        return
    from loraflow.errors import DataError

    raise DataError(f"data.train holds no image, so the {' and '.join(training)} (towers.{training[0]}.train="
                    f"{plan.config.towers.train_of(training[0], plan.config.adapter.method)}) would never get a "
                    f"gradient. Add image samples, or set towers.{training[0]}.train=frozen.")


def check_tokenizer_and_data(plan) -> str:
    """`tokenizer_and_data` for `check`. Returns the data summary `train` would log."""
    config = plan.config
    # What the data readers log (e.g. the format detected) goes into the summary, not onto stdout, so that
    # `check --json` stays one document.
    log, said = logging.getLogger("loraflow"), []
    collector = logging.Handler(logging.INFO)
    collector.emit = lambda record: said.append(record.getMessage())
    handlers, propagate, level = log.handlers[:], log.propagate, log.level
    log.handlers, log.propagate = [collector], False
    log.setLevel(logging.INFO)
    try:
        with quiet():
            _, train_split, eval_split = tokenizer_and_data(plan)
    finally:
        log.handlers, log.propagate = handlers, propagate
        log.setLevel(level)
    lines = said + [train_split.stats.describe("train data", config.data.max_length)]
    if eval_split is not None:
        lines.append(eval_split.stats.describe("eval data", config.data.max_length))
    return "\n".join(lines)
