"""What the RL stages (grpo, ppo) share: rollouts (sampled by the policy's own generate with the weights gathered
once per rollout, or by a vLLM engine holding the synced policy: rl/engine_rollout.py), the engine/trainer log-prob
check, rewards from functions and a reward model, and evaluation by greedy completions of held-out prompts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from loraflow.data import DataSplit
from loraflow.data.formatting import IGNORE
from loraflow.losses import importance_weights
from loraflow.phases import phase
from loraflow.rl.rewards import RewardInputs
from loraflow.rl.rollout import build_rollout, completion_ids, decode_ids, generate, stop_ids
from loraflow.setup.precision import autocast
from loraflow.stagespec import EVALUATION, ROLLOUT

__all__ = ["RolloutWorker", "with_rollout_stats"]


@dataclass
class Sampled:
    batch: dict[str, torch.Tensor]
    """input_ids, attention_mask, position_ids, labels of prompt + completion."""
    texts: list[str]
    fields: list[dict[str, Any]]
    prompts: list[Any]
    """Each row's prompt as its record holds it (a string or chat messages)."""
    completion_ids: list[list[int]]
    """Each row's completion tokens through its stop token."""

    @property
    def reward_inputs(self) -> RewardInputs:
        return RewardInputs(self.texts, self.fields, self.prompts, self.completion_ids)


def sampled_rows(rollout, rows: list[Any], group: int, tokenizer, stop: list[int], device: str) -> Sampled:
    """The rollout of `rows` (each prompt `group` times in a row) with what the rewards read."""
    ids = completion_ids(rollout.completions, stop)
    repeated = [row for row in rows for _ in range(group)]
    return Sampled(rollout.as_batch(device), decode_ids(tokenizer, ids), [row.fields for row in repeated],
                   [row.prompt for row in repeated], ids)


class RolloutWorker:
    def __init__(self, plan, tokenizer, train: DataSplit, eval_split: DataSplit | None, run_dir=None):
        from loraflow.rl.rewards import load_reward_functions

        self.plan, self.tokenizer, self.train, self.eval_split = plan, tokenizer, train, eval_split
        self.cfg = plan.config.rl
        rows = train.rows + (eval_split.rows if eval_split is not None else [])
        columns = {k for row in rows for k in row.fields}  # what a TRL-style reward function may name
        self.functions = load_reward_functions(self.cfg.rewards, "rl.rewards", columns)
        self.gold = load_reward_functions(self.cfg.eval_rewards, "rl.eval_rewards", columns)
        self.reward_model = None
        if self.cfg.reward_model:
            from loraflow.rl.reward_model import load_reward_model

            self.reward_model = load_reward_model(plan, tokenizer, any(isinstance(row.prompt, list) for row in rows))
        # One left-padded width for every rollout of the run: positions never depend on the process split.
        self.width = max(len(row.prompt_ids) for row in rows)
        self.pad = tokenizer.pad_token_id
        # Sharded weights: ranks step through generate together (HF's synced_gpus), as sharded engines require.
        self.synced = plan.setup.world_size > 1 and plan.setup.sharded_params
        self.engine_rollouts = None
        if plan.rollout is not None and plan.rollout.engine == "vllm":
            from loraflow.rl.engine_rollout import EngineRollouts

            self.engine_rollouts = EngineRollouts(plan, run_dir)
        self.started = False

    def _sample(self, model, rows: list[Any], keys: list[tuple[int, ...]] | None, group: int,
                stop: list[int]) -> Sampled:
        prompts = [row.prompt_ids for row in rows for _ in range(group)]
        completions = generate(model, prompts, self.width, self.cfg.max_new_tokens, stop, self.pad,
                               self.plan.device, keys, self.cfg.temperature, self.synced)
        rollout = build_rollout(prompts, completions, self.width, stop, self.pad)
        return sampled_rows(rollout, rows, group, self.tokenizer, stop, self.plan.device)

    def rollouts(self, engine, batches, step: int) -> list[Sampled]:
        """Sample group_size completions for every prompt of the step's micro-batches: on the vLLM engine after
        syncing the policy to it, or with the weights gathered once for all of them (zero3-generation-gather)."""
        g, seed = self.cfg.group_size, self.plan.config.train.seed
        if self.engine_rollouts is not None:
            return self._engine_rollouts(engine, batches, step)
        out = []
        with engine.gathered_for_generation() as model:
            stop = stop_ids(model, self.tokenizer)
            with phase(ROLLOUT, model), autocast(self.plan.device, self.plan.autocast_dtype):
                for batch, _ in batches:
                    index = batch["index"].tolist()
                    keys = [(seed, step, i, k) for i in index for k in range(g)]
                    out.append(self._sample(model, [self.train.rows[i] for i in index], keys, g, stop))
        return out

    def _engine_rollouts(self, engine, batches, step: int) -> list[Sampled]:
        er = self.engine_rollouts
        if not self.started:
            er.start(engine)
            self.started = True
        er.sync(engine, step)
        stop = stop_ids(engine.module, self.tokenizer)
        out = []
        for batch, _ in batches:
            index = batch["index"].tolist()
            rows = [self.train.rows[i] for i in index]
            completions, logps = er.sample([row.prompt_ids for row in rows], index, step, self.cfg.group_size,
                                           stop, self.pad)
            prompts = [row.prompt_ids for row in rows for _ in range(self.cfg.group_size)]
            rollout = build_rollout(prompts, completions, self.width, stop, self.pad)
            sampled = sampled_rows(rollout, rows, self.cfg.group_size, self.tokenizer, stop, self.plan.device)
            # [N, T-1] like the trainer's log-probs: position j scores token j + 1 (completion token c sits at
            # position width + c of the sequence).
            aligned = torch.zeros(sampled.batch["labels"][:, 1:].shape, dtype=torch.float32)
            aligned[:, self.width - 1:self.width - 1 + completions.shape[1]] = logps
            sampled.batch["engine_logps"] = aligned.to(self.plan.device)
            out.append(sampled)
        return out

    def check(self, engine, batches: list, trainer_logps: list[torch.Tensor], step: int) -> dict[str, float]:
        """The engine/trainer log-prob comparison of this step's sampled tokens (rule vllm-stale-policy), on
        every rank, and the importance weights of those tokens when the plan corrects for the difference
        (batch["is_weights"], which the policy losses apply); empty when the trainer samples itself. `batches` are
        (batch, real) pairs."""
        if self.engine_rollouts is None:
            return {}
        ro = self.plan.rollout
        diffs, weights = [], []
        for (batch, real), mine in zip(batches, trainer_logps):
            mask = batch["labels"][:, 1:] != IGNORE
            if ro.importance != "off":
                batch["is_weights"] = importance_weights(mine, batch["engine_logps"], mask, ro.importance,
                                                         ro.importance_cap)
                if real:
                    weights.append(batch["is_weights"][mask].cpu())
            if real:
                diffs.append((mine.float() - batch["engine_logps"]).abs()[mask].cpu())
        return self.engine_rollouts.check(engine, diffs, step, weights)

    def close(self) -> None:
        if self.engine_rollouts is not None:
            self.engine_rollouts.close()

    def rewards(self, engine, sampled: Sampled) -> torch.Tensor:
        """The sum of the reward functions' rewards and the reward model's score, per completion."""
        total = torch.zeros(len(sampled.texts), dtype=torch.float32)
        for fn in self.functions:  # each checks its own values (one float per completion) and names its entry
            total += torch.tensor(fn(sampled.reward_inputs))
        if self.reward_model is not None:
            total += self.reward_model.score(sampled).cpu()
        return total

    def evaluate(self, engine) -> dict[str, Any]:
        """Greedy completions of the held-out prompts: mean reward per source, the rl.eval_rewards (`gold/NAME`,
        not part of `reward`), and exact match against the prompts' `answer` field when they have one."""
        rows, size = self.eval_split.rows, self.plan.config.eval.batch_size
        sums: dict[str, float] = {}
        gold: dict[str, float] = {}
        exact, with_answer = 0, 0
        with engine.gathered_for_generation() as model:
            stop = stop_ids(model, self.tokenizer)
            with phase(EVALUATION, model), autocast(self.plan.device, self.plan.autocast_dtype):
                samples = [self._sample(model, rows[s:s + size], None, 1, stop) for s in range(0, len(rows), size)]
        for sampled in samples:
            for functions, into in ((self.functions, sums), (self.gold, gold)):
                for fn in functions:
                    into[fn.name] = into.get(fn.name, 0.0) + sum(fn(sampled.reward_inputs))
            if self.reward_model is not None:
                sums["reward_model"] = sums.get("reward_model", 0.0) + float(self.reward_model.score(sampled).sum())
            for text, fields in zip(sampled.texts, sampled.fields):
                if "answer" in fields:
                    with_answer += 1
                    exact += text == str(fields["answer"]).strip()
        n = max(len(rows), 1)
        values: dict[str, Any] = {"reward": sum(sums.values()) / n}
        values.update({f"reward/{name}": v / n for name, v in sums.items()})
        values.update({f"gold/{name}": v / n for name, v in gold.items()})
        if with_answer:
            values["exact_match"] = exact / with_answer
        return values


def with_rollout_stats(out: list, stats: dict[str, float]) -> list:
    """Put the step's rollout statistics (already the same on every rank) on its micro-batches, for the loss to
    report: the first micro-batch carries (value, 1), the others (0, 0), so the trainer's sum over micro-batches
    and ranks divided by the count is the value."""
    for k, (batch, _) in enumerate(out):
        batch["rollout_stats"] = {n: (v, 1.0) if k == 0 else (0.0, 0.0) for n, v in stats.items()}
    return out
