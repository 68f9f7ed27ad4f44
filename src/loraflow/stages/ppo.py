"""PPO for language models (Schulman et al. 2017; the RLHF recipe of Ziegler et al. 2019 and InstructGPT):
sample completions, score each with the reward model, add a per-token KL penalty to the reference, estimate
advantages with GAE from the critic's values, and minimise the clipped policy loss plus the clipped value loss.

The critic is a value head on the policy's body (setup/value_head.py), so actor and critic are one model in one
engine. rl.updates_per_rollout optimizer steps train on each rollout: with one, the ratio is 1 at the update;
with more, later updates take the ratio to the log-probs scored at rollout time, and both losses are clipped.
Advantages are whitened with the mean and variance of the whole rollout, summed over micro-batches and ranks, so
a step on N ranks equals the same step on one process.
"""

from __future__ import annotations

from pathlib import Path

import torch

from loraflow.data import DataSplit, learned_tokens
from loraflow.losses.logprobs import learned_logps
from loraflow.losses import (
    gae,
    kl_penalized_rewards,
    masked_moments,
    ppo_policy_loss,
    value_loss,
    whiten,
)
from loraflow.phases import phase
from loraflow.rl.reference import Reference
from loraflow.setup.precision import autocast
from loraflow.setup.value_head import find_value_head
from loraflow.stages.rl import RolloutWorker, with_rollout_stats
from loraflow.stagespec import VALUE_ESTIMATION


def logps_and_values(model: torch.nn.Module, head, batch: dict[str, torch.Tensor], plan):
    """Per-token log-probs [S, T-1], their mask, and the critic's values aligned with them: the value of the
    state each token is sampled from (the hidden state one position before it; the value head reads every
    position's hidden state before the output head selects the learned ones)."""
    logps, mask = learned_logps(model, batch, plan.logits, temperature=plan.config.rl.temperature)
    return logps, mask, head.values[:, :-1]


def loss_fn(plan, head):
    r = plan.config.rl

    def compute(model: torch.nn.Module, batch: dict[str, torch.Tensor], num_items: int):
        logps, mask, values = logps_and_values(model, head, batch, plan)
        old = batch.get("old_logps", logps.detach())  # one update per rollout: the policy is the old policy
        policy, stats = ppo_policy_loss(logps, old, batch["advantages"], mask, r.clip_eps, num_items,
                                        batch.get("is_weights"))
        critic = value_loss(values, batch["old_values"], batch["returns"], mask, r.value_clip, num_items)
        n, tokens = len(logps), float(mask.sum())
        # clip_fraction per completion token of the step, however the step is split into micro-batches and ranks
        return policy + r.value_coef * critic, {"score": (float(batch["scores"].sum()), n),
                                                "value_loss": float(critic.detach()) * num_items,
                                                "clip_fraction": (stats["clip_fraction"] * tokens, tokens),
                                                **batch.get("rollout_stats", {})}

    return compute


def build(plan, model, tokenizer, train: DataSplit, eval_split: DataSplit | None, run_dir: Path,
          resume: bool):
    """The stage's trainer, ready to fit (tests drive single steps of it)."""
    from loraflow.loop.trainer import StageHooks, Trainer

    r = plan.config.rl
    head = find_value_head(model)
    reference = Reference(plan, tokenizer) if plan.reference else None
    worker = RolloutWorker(plan, tokenizer, train, eval_split, run_dir)

    def reference_logps(ref_model, batch):
        return learned_logps(ref_model, batch, plan.logits, temperature=r.temperature)[0]

    def prepare(engine, batches, step):
        out, masks, scored = [], [], []
        for (batch, real), sampled in zip(batches, worker.rollouts(engine, batches, step)):
            scores = worker.rewards(engine, sampled).to(plan.device)
            batch = dict(sampled.batch)
            # Value estimation: the policy's log-probs and the critic's values at rollout time.
            with phase(VALUE_ESTIMATION, engine.module), autocast(plan.device, plan.autocast_dtype):
                old_logps, mask, old_values = logps_and_values(engine.module, head, batch, plan)
            ref = reference.score(engine, batch, reference_logps) if reference is not None else old_logps
            rewards = kl_penalized_rewards(scores, old_logps, ref, mask, r.kl_coef if reference else 0.0)
            advantages, returns = gae(rewards, old_values.float(), mask, r.gamma, r.lam)
            batch = {**batch, "scores": scores, "advantages": advantages, "returns": returns,
                     "old_values": old_values.float()}
            if r.updates_per_rollout > 1:
                batch["old_logps"] = old_logps.float()
            scored.append(old_logps)
            out.append((batch, real))
            masks.append(mask if real else torch.zeros_like(mask))  # a stand-in batch adds nothing to the moments
        if r.whiten_advantages:
            moments = engine.all_sum([sum(column) for column in
                                      zip(*(masked_moments(b["advantages"], m) for (b, _), m in zip(out, masks)))])
            for (batch, _), mask in zip(out, masks):
                batch["advantages"] = whiten(batch["advantages"], mask, moments)
        return with_rollout_stats(out, worker.check(engine, out, scored, step))

    hooks = StageHooks(loss_fn(plan, head), worker.evaluate if eval_split is not None else None,
                       collate=lambda rows, pad: {}, count=learned_tokens, prepare=prepare,
                       updates_per_prepare=r.updates_per_rollout, finish=worker.close)
    return Trainer(plan, model, tokenizer, train, hooks, run_dir, resume=resume)


