"""One run, built one way: config -> plan -> tokenizer -> data -> model -> the stage's trainer.

`loraflow train` (train.py), the engine cross-check and the stage step-check (loraflow/verify/) all call
`build_run`, so "the tests run what `train` runs" holds by construction: a harness may only look at the parts
(take gradients, drive single steps), never assemble them its own way.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable

import torch

from loraflow.config import Config, dump_config
from loraflow.data import DataSplit
from loraflow.environment import Environment
from loraflow.stagespec import stage_module

log = logging.getLogger("loraflow")


@dataclass
class Run:
    plan: Any
    tokenizer: Any
    train: DataSplit
    eval: DataSplit | None
    model: torch.nn.Module
    trainer: Any
    """The stage's Trainer (loop/trainer.py), its engine built."""

    def fit(self) -> dict[str, Any]:
        """Train to the end, then the stage's own last step (the reward model's manifest)."""
        summary = self.trainer.fit()
        finish = getattr(stage_module(self.plan.config.stage), "finish", None)
        if finish is not None:
            finish(self.trainer, summary)
        return summary


def seed_everything(seed: int) -> None:
    import random

    random.seed(seed)
    torch.manual_seed(seed)


def build_run(config: Config, env: Environment, run_dir: Path, resume: bool = False, *, record: bool = False,
              adjust_model: Callable[[torch.nn.Module], None] | None = None) -> Run:
    """Build every part of a run in the documented order. `record` (rank 0 of `train`) writes plan.json once the
    plan exists and config.yaml once the model is built: only then is the directory a run, so a failure before
    leaves it free for a corrected retry. `adjust_model` runs on the ready model before the engine wraps it (the
    cross-check gives LoRA's B a seeded random start so every adapter weight gets a gradient)."""
    from loraflow.checkpoints.store import write_atomic_text
    from loraflow.environment import require_floors
    from loraflow.plan import resolve
    from loraflow.setup import build_model
    from loraflow.setup.inputs import tokenizer_and_data

    require_floors()  # the harnesses that call build_run directly (crosscheck, stepcheck, benchmarks) too
    plan = resolve(config, env)
    log.info("%s", plan.render())
    if record:
        (run_dir / "plan.json").write_text(json.dumps(plan.to_dict(), indent=2))
    plan.raise_for_errors()
    seed_everything(config.train.seed)  # adapter initialisation, data order and dropout all follow train.seed
    # Tokenizer and data before the model (what `check` runs too): a malformed line should fail in seconds, not
    # after loading weights.
    tokenizer, train, held_out = tokenizer_and_data(plan)
    log.info("%s", train.stats.describe("train data", config.data.max_length))
    if held_out is not None:
        log.info("%s", held_out.stats.describe("eval data", config.data.max_length))
    model = build_model(plan, tokenizer)
    if adjust_model is not None:
        adjust_model(model)
    if record:
        write_atomic_text(run_dir / "config.yaml", dump_config(config))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    log.info("trainable parameters: %s of %s", f"{trainable:,}", f"{sum(p.numel() for p in model.parameters()):,}")
    trainer = stage_module(config.stage).build(plan, model, tokenizer, train, held_out, run_dir, resume)
    return Run(plan, tokenizer, train, held_out, model, trainer)
