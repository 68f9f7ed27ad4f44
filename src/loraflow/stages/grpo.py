"""GRPO (DeepSeekMath, Shao et al. 2024): sample a group of completions per prompt with the policy's own
generate, reward them (functions named in rl.rewards and/or rl.reward_model), normalise rewards within each group
into advantages, and maximise the clipped objective minus beta * KL to the reference.

One optimizer step is one rollout: the weights are gathered once for it (ZeRO-3, FSDP2), every prompt of the
step is sampled, then the update runs over the step's micro-batches. With one update per rollout the ratio is 1
at the update (old log-probs are the current ones, as in TRL with num_iterations=1), so the objective's gradient
is the group-normalised policy gradient plus the KL term; the clipped form is kept so the loss is the paper's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from loraflow.data import DataSplit
from loraflow.losses import grpo_loss, group_advantages, token_logps
from loraflow.reference import Reference
from loraflow.stages.rl import RolloutWorker, load_prompt_data, model_inputs



def loss_fn(plan):
    r = plan.config.rl

    def compute(model: torch.nn.Module, batch: dict[str, torch.Tensor], num_items: int):
        logits = model(**model_inputs(batch), use_cache=False).logits
        logps, mask = token_logps(logits, batch["labels"], r.temperature)
        loss, stats = grpo_loss(logps, logps.detach(), batch.get("reference_logps"), batch["advantages"], mask,
                                r.clip_eps, r.kl_coef, num_items)
        tokens = float(mask.sum())
        # reward and completion length: sums over completions (means per completion); KL: mean per token.
        return loss, {"reward": float(batch["rewards"].sum()), "kl": (stats["kl"] * tokens, tokens),
                      "completion_tokens": tokens}

    return compute


def build(plan, model, tokenizer, train: DataSplit, eval_split: DataSplit | None, run_dir: Path,
          resume: bool):
    """The stage's trainer, ready to fit (tests drive single steps of it)."""
    from loraflow.trainer import StageHooks, Trainer

    r = plan.config.rl
    reference = Reference(plan, tokenizer) if plan.reference else None
    worker = RolloutWorker(plan, tokenizer, train, eval_split)

    def reference_logps(model, batch):
        return token_logps(model(**model_inputs(batch), use_cache=False).logits, batch["labels"], r.temperature)[0]

    def prepare(engine, batches, step):
        out = []
        for (batch, real), rollout in zip(batches, worker.rollouts(engine, batches, step)):
            rewards = worker.rewards(engine, rollout)
            batch = {**rollout.batch, "rewards": rewards.to(plan.device),
                     "advantages": group_advantages(rewards, r.group_size).to(plan.device)}
            if reference is not None:
                batch["reference_logps"] = reference.score(engine, batch, reference_logps)
            out.append((batch, real))
        return out

    hooks = StageHooks(loss_fn(plan), worker.evaluate if eval_split is not None else None,
                       collate=lambda rows, pad: {}, count=lambda batch: int(batch["input_ids"].shape[0]),
                       prepare=prepare, unit=f"prompts x {r.group_size} completions")
    return Trainer(plan, model, tokenizer, train, hooks, run_dir, resume=resume)


def run(plan, model, tokenizer, train: DataSplit, eval_split: DataSplit | None, run_dir: Path,
        resume: bool) -> dict[str, Any]:
    return build(plan, model, tokenizer, train, eval_split, run_dir, resume).fit()


load_data = load_prompt_data
