"""The reward model named by rl.reward_model, scoring rollouts (docs/rl-rewards.md). Two kinds:

- a `loraflow train rm` output (its directory holds reward_model.json): trained on the policy's tokenizer, so it
  reads the rollout's token ids as they are;
- a Hugging Face sequence-classification model (a local directory with config.json, or a hub id), with its own
  tokenizer: each completion is decoded to text by the policy's tokenizer and re-encoded by the reward model's.

Either is frozen, kept in eval mode and run without autograd; it is not part of the trained engine (every rank
holds it whole, which is fine for the reward models this is used with; a sharded reward model is not built).
The plan (plan/rewards.py) decides which kind rl.reward_model is and words how its score is read; the loaders
below do what it says.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch

from loraflow.errors import ConfigError
from loraflow.locations import REWARD_MODEL_MANIFEST, location_of
from loraflow.losses.logprobs import model_inputs
from loraflow.phases import phase
from loraflow.setup.paths import quiet as _quiet
from loraflow.setup.precision import autocast
from loraflow.stagespec import REWARD_SCORING

MANIFEST = REWARD_MODEL_MANIFEST
KEY = "rl.reward_model"
log = logging.getLogger("loraflow")


class RewardModel:
    """A `loraflow train rm` model: scores the policy's token ids."""

    def __init__(self, model: torch.nn.Module, plan):
        self.model, self.plan = model, plan

    def score(self, sampled) -> torch.Tensor:
        """[N] scores of prompt + completion rows (read at each row's last non-pad token)."""
        inputs = model_inputs(sampled.batch)
        with phase(REWARD_SCORING, self.model), autocast(self.plan.device, self.plan.autocast_dtype):
            return self.model(**inputs, use_cache=False).logits.squeeze(-1).float()


class TextRewardModel:
    """A Hugging Face sequence-classification model with its own tokenizer: scores the rollout's text."""

    def __init__(self, model: torch.nn.Module, tokenizer, policy_tokenizer, plan):
        self.model, self.tokenizer, self.policy_tokenizer, self.plan = model, tokenizer, policy_tokenizer, plan
        self.chat_template = getattr(tokenizer, "chat_template", None)
        self.limit = max_length(model, tokenizer)
        self.cut = 0
        """Rows cut to `limit` so far (said once in the log, then counted)."""

    def encode(self, prompt: Any, completion_ids: list[int], text: str) -> list[int]:
        """The reward model's token ids of one prompt + completion (as plan/rewards.py words it)."""
        if isinstance(prompt, list):  # a chat prompt: load_reward_model refused a tokenizer without a template
            messages = [*prompt, {"role": "assistant", "content": text}]
            rendered = self.tokenizer.apply_chat_template(messages, tokenize=False)
            return self.tokenizer(rendered, add_special_tokens=False)["input_ids"]
        # Not the stripped text: the completion's own leading space or newline belongs between prompt and answer.
        completion = self.policy_tokenizer.decode(completion_ids, skip_special_tokens=True)
        return self.tokenizer(prompt + completion)["input_ids"]

    def batch(self, sampled) -> dict[str, torch.Tensor]:
        ids = [self.encode(p, c, t) for p, c, t in zip(sampled.prompts, sampled.completion_ids, sampled.texts)]
        ids = [self.fit(row) for row in ids]
        width = max(len(row) for row in ids)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.tensor([row + [pad] * (width - len(row)) for row in ids])
        mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in ids])
        return {"input_ids": input_ids.to(self.plan.device), "attention_mask": mask.to(self.plan.device)}

    def fit(self, row: list[int]) -> list[int]:
        """A row longer than the reward model reads (a model with learned positions fails on it with an index
        error deep in its embeddings) keeps its last `limit` tokens: the head scores the last token, so the
        completion is kept whole and the prompt's start goes."""
        if self.limit is None or len(row) <= self.limit:
            return row
        if not self.cut:
            log.warning("%s: a prompt + completion of %d tokens is longer than the %d the reward model reads; such "
                        "rows keep their last %d tokens (the prompt's start is cut). Shorten data.max_length or "
                        "rl.max_new_tokens to score whole texts.", KEY, len(row), self.limit, self.limit)
        self.cut += 1
        return row[-self.limit:]

    def score(self, sampled) -> torch.Tensor:
        batch = self.batch(sampled)
        with phase(REWARD_SCORING, self.model), autocast(self.plan.device, self.plan.autocast_dtype):
            return self.model(**batch).logits[:, 0].float()


def max_length(model: torch.nn.Module, tokenizer) -> int | None:
    """The longest input the reward model reads: its tokenizer's model_max_length where the checkpoint sets one
    (transformers leaves a huge placeholder otherwise), else the learned position table's size (GPT-2's n_positions,
    BERT-style max_position_embeddings with absolute positions); None for rotary models without a stated limit."""
    stated = getattr(tokenizer, "model_max_length", None)
    if isinstance(stated, int) and 0 < stated < 1_000_000:
        return stated
    config = model.config.get_text_config()
    learned = getattr(config, "n_positions", None)
    if learned is None and getattr(config, "position_embedding_type", None) == "absolute":
        learned = getattr(config, "max_position_embeddings", None)
    return learned if isinstance(learned, int) and learned > 0 else None


def load_reward_model(plan, tokenizer, chat_prompts: bool = False) -> RewardModel | TextRewardModel:
    """The reward model of the plan's rl.reward_model (plan.reward_model: its kind and location). `chat_prompts`:
    some prompt records are chat messages, which a reward model with its own tokenizer renders with its template."""
    spec, source = plan.config.rl.reward_model, plan.reward_model
    if source.kind == "huggingface":
        scorer = _load_huggingface(spec, source.location, plan, tokenizer)
        if chat_prompts and not scorer.chat_template:
            raise ConfigError([f"{KEY}={spec}: the prompts are chat messages but the reward model's tokenizer has "
                               "no chat template, so there is no telling how it expects a conversation. Give its "
                               "tokenizer one (chat_template.jinja beside it), or use plain-text prompts."])
        return scorer
    return _load_loraflow(spec, Path(source.location), plan, tokenizer)


def _load_huggingface(spec: str, location: str, plan, policy_tokenizer) -> TextRewardModel:
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    try:
        with _quiet():
            config = AutoConfig.from_pretrained(location)
    except OSError as exc:  # a hub id that the hub (or its cache, offline) cannot provide
        raise ConfigError([f"{KEY}={spec} is not a local directory, and as a hub id it could not be read ({exc}). "
                           "Give the path of a reward model directory, or a hub id that exists (logged in, for a "
                           "gated model)."]) from None
    architectures = getattr(config, "architectures", None) or []
    if not any(a.endswith("ForSequenceClassification") for a in architectures):
        raise ConfigError([f"{KEY}={spec} is a {', '.join(architectures) or 'model without a saved architecture'}, "
                           "not a sequence-classification model: it has no score head to read a reward from. Point "
                           f"{KEY} at a reward model (AutoModelForSequenceClassification, one label), or at the "
                           "output of `loraflow train rm`."])
    if config.num_labels != 1:
        labels = ", ".join(f"{i}={n}" for i, n in sorted(getattr(config, "id2label", {}).items()))
        raise ConfigError([f"{KEY}={spec} is a classifier with {config.num_labels} labels ({labels}); a reward model "
                           "gives one score per completion (num_labels=1, as TRL's RewardTrainer and `loraflow train "
                           "rm` save them), and picking one label's logit silently would reward the wrong thing. To "
                           "reward one class, call the classifier from a reward function (rl.rewards: "
                           "[path/to/file.py:function]; docs/rl-rewards.md shows one)."])
    with _quiet():
        model, info = AutoModelForSequenceClassification.from_pretrained(location, dtype=plan.load_dtype,
                                                                         output_loading_info=True)
        tokenizer = AutoTokenizer.from_pretrained(location)
    if info.get("missing_keys"):  # from_pretrained initialised them at random: its scores would mean nothing
        raise ConfigError([f"{KEY}={spec}: the checkpoint lacks {', '.join(sorted(info['missing_keys'])[:4])}, so "
                           "from_pretrained initialised them at random (a base model, not a trained reward model). "
                           "Point it at a trained reward model."])
    if tokenizer.pad_token_id is None:  # HF's head reads the last token that is not pad_token_id; TRL does the same
        tokenizer.pad_token = tokenizer.eos_token
    # Where the head reads the pad id: the text config (a multimodal model keeps it there, as TRL sets it).
    model.config.get_text_config().pad_token_id = tokenizer.pad_token_id
    model.config.use_cache = False
    model.requires_grad_(False)
    return TextRewardModel(model.to(plan.device).eval(), tokenizer, policy_tokenizer, plan)


def _load_loraflow(spec: str, path: Path, plan, tokenizer) -> RewardModel:
    from transformers import AutoModelForSequenceClassification

    from loraflow.setup.model import hf_attn_implementation, load_merged, merge_adapters

    info = json.loads((path / MANIFEST).read_text())
    kwargs = dict(num_labels=1, dtype=plan.load_dtype, attn_implementation=hf_attn_implementation(plan.config))
    with _quiet():
        if info.get("method") == "full":
            model = AutoModelForSequenceClassification.from_pretrained(path, **kwargs)
        else:
            from peft import PeftModel

            base_path, merges = location_of(info["base"], KEY), info.get("merge_adapters", [])
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
        raise ConfigError([f"{KEY}={spec} has a vocabulary of {model.config.vocab_size} tokens but the policy's "
                           f"tokenizer has {len(tokenizer)}; a `loraflow train rm` model reads the policy's token "
                           "ids, so it must share the policy's tokenizer."])
    model.config.pad_token_id = tokenizer.pad_token_id
    model.requires_grad_(False)
    return RewardModel(model.to(plan.device).eval(), plan)
