"""Direct preference optimisation (DPO, IPO, conservative DPO) on chosen/rejected pairs.

Each micro-batch holds its pairs' chosen rows then their rejected rows, so both go through one forward
(fsdp2-multi-forward-dtensor). The reference log-probs come from plan.reference (rl/reference.py): the policy with
adapters disabled, a frozen copy, or values computed once before training. Metrics: reward accuracy (the implicit
reward beta * log pi/pi_ref ranks chosen above rejected) and margin, on held-out pairs; and, when eval.generate,
greedy exact match of the held-out prompts against their chosen answers.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from loraflow.data import DataSplit
from loraflow.data.preference import collate_pairs, pair_count
from loraflow.losses.logprobs import learned_logps
from loraflow.losses import dpo_loss, summed_logps
from loraflow.phases import phase
from loraflow.rl.reference import Reference
from loraflow.setup.precision import autocast
from loraflow.stages.pairs import eval_pairs, pair_collate
from loraflow.stagespec import EVALUATION

log = logging.getLogger("loraflow")
REFERENCE_FILE = "reference_logps.pt"


def pair_logps(plan, average: bool):
    """(model, pair batch) -> [P, 2] sequence log-probs of (chosen, rejected); IPO uses length-averaged ones."""
    def compute(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        logps = summed_logps(*learned_logps(model, batch, plan.logits), average=average,
                             segments=batch.get("segments"), count=2 * int(batch["num_pairs"]))
        p = int(batch["num_pairs"])  # rows past the pairs' 2P (a blank image's row) are never scored
        return torch.stack([logps[:p], logps[p:2 * p]], dim=1)

    return compute


def loss_fn(plan):
    d = plan.config.dpo
    policy_logps = pair_logps(plan, d.loss == "ipo")

    def compute(model: torch.nn.Module, batch: dict[str, torch.Tensor], num_items: int):
        pol = policy_logps(model, batch)
        ref = batch["reference_logps"]
        out = dpo_loss(pol[:, 0], pol[:, 1], ref[:, 0], ref[:, 1], d.beta, num_items, d.loss, d.label_smoothing)
        margin = out.chosen_rewards - out.rejected_rewards
        return out.loss, {"reward_accuracy": float((margin > 0).sum()), "reward_margin": float(margin.sum())}

    return compute


def build(plan, model, tokenizer, train: DataSplit, eval_split: DataSplit | None, run_dir: Path,
          resume: bool):
    """The stage's trainer, ready to fit (tests drive single steps of it)."""
    from loraflow.loop.trainer import StageHooks, Trainer

    d, e = plan.config.dpo, plan.config.eval
    pad = tokenizer.pad_token_id
    reference = Reference(plan, tokenizer)
    score = pair_logps(plan, d.loss == "ipo")

    def prepare(engine, batches, step):
        # Reference scoring phase: no autograd, reference in eval mode, policy back in train mode after it.
        return [({**b, "reference_logps": reference.score(engine, b, score)}, real) for b, real in batches]

    def start(engine) -> None:
        if reference.kind != "precomputed":
            return
        saved = run_dir / REFERENCE_FILE
        if resume and saved.is_file():  # the policy has trained since: its log-probs are no reference any more
            reference.cache = torch.load(saved)
            return
        for split in (train, eval_split):
            if split is not None:
                reference.precompute(engine, split.name, split.rows, lambda rows: collate_pairs(rows, pad), score,
                                     e.batch_size)
        if engine.rank == 0:
            torch.save(reference.cache, saved)
        log.info("reference log-probs precomputed for %d pairs", len(reference.cache))

    def evaluate(engine) -> dict[str, Any]:
        def margins(batch):
            with phase(EVALUATION, engine.module), autocast(plan.device, plan.autocast_dtype):
                pol = score(engine.module, batch).float()
            ref = reference.score(engine, batch, score, split="eval")
            return d.beta * ((pol[:, 0] - ref[:, 0]) - (pol[:, 1] - ref[:, 1]))

        return eval_pairs(plan, engine, tokenizer, eval_split, margins, prefix="reward")

    hooks = StageHooks(loss_fn(plan), evaluate if eval_split is not None else None,
                       collate=pair_collate(plan, train, pad), count=pair_count, prepare=prepare, start=start)
    return Trainer(plan, model, tokenizer, train, hooks, run_dir, resume=resume)


