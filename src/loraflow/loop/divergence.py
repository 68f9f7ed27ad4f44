"""Divergence watch: a run whose loss or gradients stop being finite is stopped before the update applies them,
and a run whose gradients vanish (the loss sits still) is warned about.

A non-finite step is never written anywhere: the trainer raises before its next save, so the newest checkpoint
(and `latest`) stays the last good one. Each message names the step and the likely causes, read from the config
and from the plan's own findings, so the user knows which key to change.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

from loraflow.errors import DivergenceError

log = logging.getLogger("loraflow")

# A LoRA/DoRA adapter learns with 1e-5..1e-3; full fine-tuning with less. Far above it, Adam's first steps move
# every weight by about the learning rate, which saturates activations (zero gradients) or overflows them.
HIGH_LR = {"lora": 1e-2, "dora": 1e-2, "full": 1e-3}
ZERO_GRAD_STEPS = 3
"""Consecutive optimizer steps with a gradient norm of exactly 0 before the run is warned about."""


def likely_causes(plan) -> list[str]:
    """The config's settings that make a run diverge, strongest first, each naming the key to change."""
    c = plan.config
    t, out = c.train, []
    high = HIGH_LR.get(c.adapter.method, 1e-2)
    if t.learning_rate > high:
        out.append(f"train.learning_rate={t.learning_rate:g} is far above what {c.adapter.method} trains with "
                   f"(about 1e-4; above {high:g} Adam's steps saturate or overflow the model): lower it.")
    if not t.max_grad_norm:
        out.append("train.max_grad_norm=0 turns gradient clipping off, so one large gradient moves the weights "
                   "arbitrarily far: set it (1.0 is the usual value).")
    if c.precision.mode == "bf16":
        out.append("precision.mode=bf16 keeps the trained weights and optimizer state in bf16 (8 bits of "
                   "mantissa): use precision.mode=bf16-mixed, which keeps them in fp32.")
    if t.warmup_steps == 0 and t.learning_rate > high / 10:
        out.append("train.warmup_steps=0 applies the full learning rate from the first step: add a warmup.")
    for finding in plan.warnings:  # a rule the plan warned about may be the cause
        out.append(f"[{finding.rule.id}] (the plan warned about it) {finding.rule.cause} Fix: {finding.rule.fix}")
    if not out:
        out.append("the data: a record whose learned tokens are all masked or truncated, or extreme token ids; "
                   "and the base model's own weights (load it and check its logits are finite).")
    return out


class DivergenceWatch:
    """Checks every optimizer step's loss and gradient norm (the same numbers on every rank: both are reduced
    over ranks before they get here, so every rank reaches the same verdict without another collective)."""

    def __init__(self, plan):
        self.plan = plan
        self.zero_run: list[int] = []
        self.warned = False

    def check_loss(self, step: int, loss: float) -> None:
        """Before the update: a non-finite loss means non-finite gradients; the step is not applied."""
        if not math.isfinite(loss):
            self._stop(step, f"the training loss is {loss}")

    def check_gradients(self, step: int, grad_norm: float, applied: bool) -> None:
        """After the engine's step: `applied` says whether the engine had already applied the update (DeepSpeed
        ZeRO >= 1 measures the norm only while stepping); either way nothing of it is saved."""
        if not math.isfinite(grad_norm):
            what = f"the gradient norm is {grad_norm}"
            if applied:
                what += " (the engine had already applied the update; it is discarded: nothing is saved)"
            else:
                what += " (the update was not applied)"
            self._stop(step, what)
        self.zero_run = self.zero_run + [step] if grad_norm == 0.0 else []
        if len(self.zero_run) >= ZERO_GRAD_STEPS and not self.warned:
            self.warned = True
            causes = "\n".join(f"  - {c}" for c in likely_causes(self.plan))
            log.warning("the gradient norm has been exactly 0 for %d steps (steps %d-%d): the loss cannot move and "
                        "the adapters learn nothing. Likely causes:\n%s", len(self.zero_run), self.zero_run[0],
                        self.zero_run[-1], causes)

    def _stop(self, step: int, what: str) -> None:
        from loraflow.checkpoints.store import complete_checkpoints

        causes = "\n".join(f"  - {c}" for c in likely_causes(self.plan))
        run_dir, stage = self.plan.config.output.dir, self.plan.config.stage
        done = complete_checkpoints(Path(run_dir)) if run_dir else []
        if done:
            where = (f"Its last good checkpoint, {done[-1]}, is what `latest` names. The keys below cannot change "
                     "on --resume (the optimizer state depends on them): start a new run (another output.dir) with "
                     "the cause fixed; this run's checkpoints stay as they are.")
        else:
            where = (f"No checkpoint was written before it: after fixing the cause, start again with `loraflow "
                     f"train {stage} --restart {run_dir} KEY=VALUE`.")
        raise DivergenceError(f"training diverged at step {step}: {what}. Nothing of this step was saved. {where}\n"
                              f"Likely causes:\n{causes}")
