"""GRPO (DeepSeekMath, Shao et al. 2024): sample a group of completions per prompt with the policy's own
generate, reward them (functions named in rl.rewards and/or rl.reward_model), normalise rewards within each group
into advantages, and maximise the clipped objective minus beta * KL to the reference.

A rollout samples every prompt of an optimizer step (the weights gathered once for it under ZeRO-3 and FSDP2),
then rl.updates_per_rollout optimizer steps train on it. With one update the ratio is 1 (the old log-probs are
the current ones, as in TRL with num_iterations=1), so the gradient is the group-normalised policy gradient plus
the KL term. With more, the old log-probs are scored once at rollout time and later updates are clipped.
"""

from __future__ import annotations

from pathlib import Path

import torch

from loraflow.data import DataSplit
from loraflow.losses.logprobs import learned_logps
from loraflow.losses import group_advantages, grpo_loss
from loraflow.phases import phase
from loraflow.rl.reference import Reference
from loraflow.setup.precision import autocast
from loraflow.stages.rl import RolloutWorker, with_rollout_stats
from loraflow.stagespec import OLD_POLICY_SCORING


def loss_fn(plan):
    r = plan.config.rl

    def compute(model: torch.nn.Module, batch: dict[str, torch.Tensor], num_items: int):
        logps, mask = learned_logps(model, batch, plan.logits, temperature=r.temperature)
        old = batch.get("old_logps", logps.detach())  # one update per rollout: the policy is the old policy
        loss, stats = grpo_loss(logps, old, batch.get("reference_logps"), batch["advantages"], mask,
                                r.clip_eps, r.kl_coef, num_items, batch.get("is_weights"))
        tokens = float(mask.sum())
        # reward and completion length: sums over completions (means per completion); KL, clipping: per token.
        return loss, {"reward": float(batch["rewards"].sum()), "kl": (stats["kl"] * tokens, tokens),
                      "clip_fraction": (stats["clip_fraction"] * tokens, tokens), "completion_tokens": tokens,
                      **batch.get("rollout_stats", {})}

    return compute


def build(plan, model, tokenizer, train: DataSplit, eval_split: DataSplit | None, run_dir: Path,
          resume: bool):
    """The stage's trainer, ready to fit (tests drive single steps of it)."""
    from loraflow.loop.trainer import StageHooks, Trainer

    r = plan.config.rl
    reference = Reference(plan, tokenizer) if plan.reference else None
    worker = RolloutWorker(plan, tokenizer, train, eval_split, run_dir)

    def completion_logps(model, batch):  # the reference's, or the rollout policy's
        return learned_logps(model, batch, plan.logits, temperature=r.temperature)[0]

    def prepare(engine, batches, step):
        out, scored = [], []
        for (batch, real), rollout in zip(batches, worker.rollouts(engine, batches, step)):
            rewards = worker.rewards(engine, rollout)
            batch = {**rollout.batch, "rewards": rewards.to(plan.device),
                     "advantages": group_advantages(rewards, r.group_size).to(plan.device)}
            if reference is not None:
                batch["reference_logps"] = reference.score(engine, batch, completion_logps)
            # The rollout's policy: fixed for the ratio of every later update, and what an engine's sampled
            # tokens are checked against.
            if r.updates_per_rollout > 1 or worker.engine_rollouts is not None:
                with phase(OLD_POLICY_SCORING, engine.module), autocast(plan.device, plan.autocast_dtype):
                    scored.append(completion_logps(engine.module, batch).float())
                if r.updates_per_rollout > 1:
                    batch["old_logps"] = scored[-1]
            out.append((batch, real))
        return with_rollout_stats(out, worker.check(engine, out, scored, step))

    hooks = StageHooks(loss_fn(plan), worker.evaluate if eval_split is not None else None,
                       collate=lambda rows, pad: {}, count=lambda batch: int(batch["input_ids"].shape[0]),
                       prepare=prepare,
                       updates_per_prepare=r.updates_per_rollout, finish=worker.close)
    return Trainer(plan, model, tokenizer, train, hooks, run_dir, resume=resume)


