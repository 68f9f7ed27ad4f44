"""Reward model: a scalar score head on the causal LM's body (adapters on the body, the head trained in full),
trained with the pairwise Bradley-Terry loss on chosen/rejected pairs. Metric: preference accuracy (chosen scored
above rejected) on held-out pairs. The saved adapter (PEFT format, score head included) plus `reward_model.json`
naming its base is what grpo and ppo load as rl.reward_model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from loraflow.data import DataSplit
from loraflow.data.preference import pair_count, sequence_ends
from loraflow.errors import ConfigError
from loraflow.losses.logprobs import model_inputs, unwrapped
from loraflow.losses import pairwise_rm_loss
from loraflow.phases import phase
from loraflow.rl.reward_model import MANIFEST
from loraflow.setup.checkpointing import hf_model
from loraflow.setup.precision import autocast
from loraflow.stages.pairs import eval_pairs, pair_collate
from loraflow.stagespec import EVALUATION


def scores(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """[2P] scores: the head's output at each answer's last token (chosen first). Unpacked, that is what the model
    returns (its last non-pad token); packed rows hold several answers, so the head's per-position output is read
    at each one's end (data.preference.sequence_ends)."""
    if "segments" not in batch:
        return model(**model_inputs(batch), use_cache=False).logits.squeeze(-1).float()
    head = score_head(model)
    seen: list[torch.Tensor] = []
    # The module's own output (after any engine's hooks on it), so ZeRO-3 still gathers the head for backward.
    handle = head.register_forward_hook(lambda module, args, output: seen.append(output))
    try:
        model(**model_inputs(batch), use_cache=False)
    finally:
        handle.remove()
    # The model's own rule for unpacked rows (transformers' sequence classification): the last token that is not
    # the pad token, even where padding is an answer's own trailing eos.
    pad = hf_model(unwrapped(model)).config.get_text_config().pad_token_id
    ends = sequence_ends(batch["segments"], 2 * int(batch["num_pairs"]),
                         None if pad is None else batch["input_ids"] != pad)
    return seen[-1].reshape(-1)[ends].float()


def score_head(model: torch.nn.Module) -> torch.nn.Module:
    inner = hf_model(unwrapped(model))
    head = getattr(inner, "score", None)
    if not isinstance(head, torch.nn.Module):
        raise ConfigError([f"data.packing: this {type(inner).__name__} has no `score` head whose per-token output "
                           "packed pairs can be read from; set data.packing=false."])
    return head


def loss_fn():
    def compute(model: torch.nn.Module, batch: dict[str, torch.Tensor], num_items: int):
        r = scores(model, batch)
        p = r.shape[0] // 2
        margin = (r[:p] - r[p:]).detach()
        return pairwise_rm_loss(r[:p], r[p:], num_items), {"accuracy": float((margin > 0).sum()),
                                                             "margin": float(margin.sum())}

    return compute


def build(plan, model, tokenizer, train: DataSplit, eval_split: DataSplit | None, run_dir: Path,
          resume: bool):
    """The stage's trainer, ready to fit (tests drive single steps of it)."""
    from loraflow.loop.trainer import StageHooks, Trainer

    def evaluate(engine) -> dict[str, Any]:
        def margins(batch):
            with phase(EVALUATION, engine.module), autocast(plan.device, plan.autocast_dtype):
                r = scores(engine.module, batch)
            p = r.shape[0] // 2
            return r[:p] - r[p:]

        return eval_pairs(plan, engine, tokenizer, eval_split, margins, prefix="preference")

    hooks = StageHooks(loss_fn(), evaluate if eval_split is not None else None,
                       collate=pair_collate(plan, train, tokenizer.pad_token_id), count=pair_count)
    return Trainer(plan, model, tokenizer, train, hooks, run_dir, resume=resume)


def finish(trainer, summary: dict[str, Any]) -> None:
    """After training: the reward model's manifest beside its adapter."""
    plan = trainer.plan
    if trainer.main:
        # Later stages load the head on the same base model; the adapter's own base path may be a temporary
        # or another machine's directory, so the config's model spec is recorded beside it.
        manifest = {"base": plan.config.model.path, "merge_adapters": plan.config.model.merge_adapters,
                    "head": "score", "method": plan.config.adapter.method,
                    # The adapter was trained on the quantized base: the reward model is loaded on those weights.
                    "quantization": plan.quantization.to_dict() if plan.quantization else None}
        (Path(summary["weights"]) / MANIFEST).write_text(json.dumps(manifest, indent=2))

