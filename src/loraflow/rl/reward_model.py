"""Loading a reward model trained by `loraflow train rm` (stages/rm.py) to score rollouts.

The reward model is frozen, kept in eval mode and run without autograd; it is not part of the trained engine
(every rank holds it whole, which is fine for the reward models this is used with; a sharded reward model is not
built). Its tokenizer must be the policy's: it reads the policy's token ids directly.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from loraflow.errors import ConfigError
from loraflow.losses.logprobs import model_inputs
from loraflow.phases import phase
from loraflow.setup.paths import quiet as _quiet
from loraflow.locations import location_of
from loraflow.setup.precision import autocast
from loraflow.stagespec import REWARD_SCORING

MANIFEST = "reward_model.json"


class RewardModel:
    def __init__(self, model: torch.nn.Module, plan):
        self.model, self.plan = model, plan

    def score(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """[N] scores of prompt + completion rows (read at each row's last non-pad token)."""
        inputs = model_inputs(batch)
        with phase(REWARD_SCORING, self.model), autocast(self.plan.device, self.plan.autocast_dtype):
            return self.model(**inputs, use_cache=False).logits.squeeze(-1).float()


def load_reward_model(spec: str, plan, tokenizer) -> RewardModel:
    from transformers import AutoModelForSequenceClassification

    from loraflow.setup.model import hf_attn_implementation, load_merged, merge_adapters

    path = Path(location_of(spec, "rl.reward_model"))
    manifest = path / MANIFEST
    if not manifest.is_file():
        raise ConfigError([f"rl.reward_model={spec}: no {MANIFEST} there. Point it at the `adapter` (or `model`) "
                           "directory of a `loraflow train rm` run."])
    info = json.loads(manifest.read_text())
    kwargs = dict(num_labels=1, dtype=plan.load_dtype, attn_implementation=hf_attn_implementation(plan.config))
    with _quiet():
        if info.get("method") == "full":
            model = AutoModelForSequenceClassification.from_pretrained(path, **kwargs)
        else:
            from peft import PeftModel

            base_path, merges = location_of(info["base"], "rl.reward_model"), info.get("merge_adapters", [])
            if info.get("quantization"):  # trained on a quantized base: merged into those weights, dequantized
                from loraflow.setup.quantize import Quantization, dequantize_model

                base = dequantize_model(load_merged(plan.config, base_path, plan.load_dtype, "score",
                                                    hf_attn_implementation(plan.config),
                                                    Quantization.from_dict(info["quantization"]), plan.device,
                                                    merges), plan.load_dtype)
            else:
                base = merge_adapters(AutoModelForSequenceClassification.from_pretrained(base_path, **kwargs), merges)
            model = PeftModel.from_pretrained(base, path).merge_and_unload()
    if model.config.vocab_size < len(tokenizer):
        raise ConfigError([f"rl.reward_model={spec} has a vocabulary of {model.config.vocab_size} tokens but the "
                           f"policy's tokenizer has {len(tokenizer)}; the reward model must share the policy's "
                           "tokenizer."])
    model.config.pad_token_id = tokenizer.pad_token_id
    model.requires_grad_(False)
    return RewardModel(model.to(plan.device).eval(), plan)
