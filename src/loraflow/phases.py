"""Mode discipline: which model runs in train and which in eval mode, with or without autograd, in each phase of
a stage's step.

RLHF loops switch the policy to eval mode to generate or to score with adapters disabled, and the known failures
come from not switching back (zero3-eval-backward: DeepSpeed ZeRO-3 <= 0.15.3 refuses the backward;
checkpointing-off-in-eval: transformers skips checkpointing in eval mode). So the plan states the phases, each
stage enters them with `phase()`, which sets the modes and autograd and restores train mode on the way out, and
the trainer asserts train mode before every backward (guards.assert_train_mode).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import torch

from loraflow.stagespec import StageSpec


@dataclass(frozen=True)
class Phase:
    name: str
    modes: tuple[tuple[str, str], ...]
    """(model, "train" | "eval") for each model the phase runs."""
    autograd: bool

    def describe(self) -> str:
        runs = ", ".join(f"{m} {mode}" for m, mode in self.modes)
        return f"{self.name}: {runs}; {'with' if self.autograd else 'no'} autograd"


def stage_phases(spec: StageSpec, reference: str | None, reward_model: bool, updates: int = 1) -> list[Phase]:
    """The phases of one rollout (or step) of the stage, in order, from its declaration (stagespec.py);
    `updates` optimizer steps per rollout."""
    ref_model = {"adapters-disabled": "policy (adapters disabled)", "copy": "reference copy",
                 "precomputed": None, None: None}[reference]
    present = {"always": True, "reference": ref_model is not None, "reward model": reward_model,
               "several updates": updates > 1}
    phases: list[Phase] = []
    for p in spec.phases:
        if not present[p.when]:
            continue
        model = ref_model if p.model == "reference" else spec.trained if p.model == "trained" else p.model
        name = f"{p.name} (x{updates})" if p.train and spec.generates and updates > 1 else p.name
        phases.append(Phase(name, ((model, "train" if p.train else "eval"),), autograd=p.train))
    return phases


@contextlib.contextmanager
def phase(name: str, *models: torch.nn.Module, train: bool = False) -> Iterator[None]:
    """Run `models` in train or eval mode, with autograd only when training; every model goes back to the mode
    it had (the policy: train) afterwards, whatever happens inside."""
    before = [m.training for m in models]
    for m in models:
        m.train(train)
    try:
        with torch.set_grad_enabled(train):
            yield
    finally:
        for m, was in zip(models, before):
            m.train(was)
