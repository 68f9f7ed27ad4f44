"""The config sections of the preference and RL stages: `dpo` (DPO and IPO) and `rl` (GRPO and PPO: rewards,
sampling, the objective's coefficients, the rollout engine). Fields documented as in schema.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from loraflow.config.rollout import RolloutConfig

ReferenceKind = Literal["auto", "adapters-disabled", "copy", "precomputed"]


@dataclass(kw_only=True)
class DPOConfig:
    loss: Literal["sigmoid", "ipo"] = "sigmoid"
    """`sigmoid` is DPO (Rafailov et al. 2023); `ipo` is IPO (Azar et al. 2023) on length-averaged log-probs."""

    beta: float = 0.1
    """Strength of the KL constraint to the reference: larger keeps the policy closer to it."""

    label_smoothing: float = 0.0
    """Conservative DPO: the assumed probability that a preference label is flipped (0 = plain DPO; sigmoid
    only)."""

    reference: ReferenceKind = "auto"
    """The reference policy. `adapters-disabled`: the same model with its adapters switched off (no second copy
    of the weights); `copy`: a separately loaded frozen model; `precomputed`: reference log-probs computed once
    before training, so no reference runs during it. `auto` is adapters-disabled with adapters and precomputed
    for full fine-tuning."""


@dataclass(kw_only=True)
class RLConfig:
    rewards: list[str] = field(default_factory=list)
    """Reward functions, summed: `path/to/file.py:function` (a relative path is read from the working directory),
    `module:function` (a module in the working directory or installed) or `builtin:NAME`. A function with a
    `fields` parameter is called as fn(completions, fields); any other as TRL's GRPOTrainer calls it:
    fn(prompts=, completions=, completion_ids=, **columns). Each returns one float per completion. Used by grpo
    and ppo (with or instead of rl.reward_model); docs/rl-rewards.md."""

    eval_rewards: list[str] = field(default_factory=list)
    """Reward functions (same forms as rl.rewards) reported at evaluation as `gold/NAME` but never optimised. With
    a reward model as the trained reward, a verifiable one here measures over-optimisation: the reward model's
    score can rise while the gold reward falls (Gao et al. 2022)."""

    reward_model: str | None = None
    """A reward model: the `adapter` (or `model`) directory of a `loraflow train rm` run, `builtin:NAME`, or a
    Hugging Face sequence-classification model with one label (a directory or a hub id), which scores the
    completions' text re-encoded by its own tokenizer. Its score is added to the reward functions' rewards;
    docs/rl-rewards.md."""

    group_size: int = 8
    """Completions sampled per prompt in each rollout (GRPO normalises rewards within the group)."""

    max_new_tokens: int = 32
    """Generation budget per completion."""

    temperature: float = 1.0
    """Sampling temperature of rollouts; log-probs are taken at the same temperature."""

    clip_eps: float = 0.2
    """Clipping range of the policy ratio in the PPO/GRPO objective."""

    kl_coef: float = 0.04
    """Weight of the KL divergence to the reference: GRPO's beta, PPO's per-token KL penalty."""

    gamma: float = 1.0
    """PPO: discount of future rewards in GAE."""

    lam: float = 0.95
    """PPO: GAE lambda (bias-variance trade-off of the advantage)."""

    value_coef: float = 0.1
    """PPO: weight of the value (critic) loss beside the policy loss."""

    value_clip: float = 0.2
    """PPO: clipping range of the value prediction around its rollout value; 0 disables it."""

    updates_per_rollout: int = 1
    """Optimizer steps on each rollout (TRL's num_iterations, OpenRLHF's max_epochs). With 1 the policy ratio is 1
    at the update and the clip never acts; with more, later updates see the ratio to the rollout's policy and the
    clip bounds how far each rollout moves it. train.max_steps counts the updates."""

    whiten_advantages: bool = True
    """PPO: normalise the GAE advantages to zero mean and unit variance over the whole rollout (all
    micro-batches and ranks), as OpenAI baselines, TRL and OpenRLHF do; the value targets keep the raw scale."""

    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """The rollout engine (hf or vllm) and how it is kept in step with the trainer."""
