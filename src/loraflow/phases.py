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


@dataclass(frozen=True)
class Phase:
    name: str
    modes: tuple[tuple[str, str], ...]
    """(model, "train" | "eval") for each model the phase runs."""
    autograd: bool

    def describe(self) -> str:
        runs = ", ".join(f"{m} {mode}" for m, mode in self.modes)
        return f"{self.name}: {runs}; {'with' if self.autograd else 'no'} autograd"


def stage_phases(stage: str, reference: str | None, reward_model: bool, updates: int = 1) -> list[Phase]:
    """The phases of one rollout (or step) of `stage`, in order; `updates` optimizer steps per rollout."""
    ref_model = {"adapters-disabled": "policy (adapters disabled)", "copy": "reference copy",
                 "precomputed": None, None: None}[reference]
    phases: list[Phase] = []
    if stage in ("grpo", "ppo"):
        phases.append(Phase("rollout", (("policy", "eval"),), autograd=False))
    if ref_model:
        phases.append(Phase("reference scoring", ((ref_model, "eval"),), autograd=False))
    if reward_model:
        phases.append(Phase("reward scoring", (("reward model", "eval"),), autograd=False))
    if stage == "ppo":
        phases.append(Phase("value estimation", (("policy + value head", "eval"),), autograd=False))
    if stage == "grpo" and updates > 1:
        phases.append(Phase("old policy scoring", (("policy", "eval"),), autograd=False))
    trained = "reward model" if stage == "rm" else "policy + value head" if stage == "ppo" else "policy"
    name = f"update (x{updates})" if stage in ("grpo", "ppo") and updates > 1 else "update"
    phases.append(Phase(name, ((trained, "train"),), autograd=True))
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
