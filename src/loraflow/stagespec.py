"""The stage registry: every fact about a training stage, declared once.

Each stage states its name, the module that implements its loop, the model head it trains, the kind of data it
reads, whether it samples its own training data (rollouts), how it gets a reference policy, the phases of one step
with each model's mode, its loss and the unit of a micro-batch row. The plan, the phase list, the plan's reasons,
the config checks, the data loading and the CLI read this table; nothing else names a stage to decide anything.
Adding a stage is one entry here plus its module in stages/ and its tests.

This module sits at the bottom of the house (it imports nothing of loraflow), so the config schema can read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

# Phase names, shared by the declarations below and the stage code that enters them (phases.phase).
ROLLOUT = "rollout"
REFERENCE_SCORING = "reference scoring"
REWARD_SCORING = "reward scoring"
VALUE_ESTIMATION = "value estimation"
OLD_POLICY_SCORING = "old policy scoring"
UPDATE = "update"
EVALUATION = "evaluation"
"""Held-out evaluation: outside the step, so in no stage's phase list."""


@dataclass(frozen=True)
class PhaseSpec:
    name: str
    model: str
    """The model the phase runs: a name, or `reference` (the reference policy, named by its kind) or `trained`
    (the stage's trained model)."""
    when: Literal["always", "reference", "reward model", "several updates"] = "always"
    """When the phase exists: always, with a reference policy, with rl.reward_model, or with
    rl.updates_per_rollout > 1."""
    train: bool = False
    """Train mode with autograd (the update) or eval mode without (every scoring and sampling phase)."""


@dataclass(frozen=True)
class StageSpec:
    name: str
    module: str
    """The module with the stage's loop: `build(plan, model, tokenizer, train, eval, run_dir, resume)` returns its
    Trainer, and an optional `finish(trainer, summary)` runs after training."""
    summary: str
    head: Literal["lm", "score", "value"]
    """lm: a causal LM; score: a scalar score head instead of the LM head (a reward model); value: a causal LM
    with PPO's value head on its body."""
    data: Literal["sft", "pairs", "prompts"]
    """What a record holds: a conversation or text to learn, a chosen/rejected pair, or a prompt to sample from."""
    trained: str
    """The model the update trains, in the phase list."""
    phases: tuple[PhaseSpec, ...]
    loss: tuple[str, str]
    """(what the loss is, why), as format strings over the config's dpo.* and rl.* values."""
    unit: str
    """What one row of a micro-batch is, for the log (a format string over rl.*)."""
    reference: Literal["never", "with kl", "always"] = "never"
    """Whether the stage needs a reference policy: never, when rl.kl_coef > 0, or always."""
    reference_key: str | None = None
    """The config key that chooses the reference's kind (`auto` lets the plan choose)."""
    generates: bool = False
    """Samples its own training data every step (rollouts): needs a reward, may take several updates per rollout,
    and cannot precompute a reference."""
    eval_generates: bool = False
    """Held-out data also yields prompts whose greedy completion is compared with the reference answer
    (eval.generate)."""
    packing: bool = False
    """data.packing applies (many samples per row; pairs are packed within their micro-batch, so both answers of
    a pair stay in one forward)."""
    min_group_size: int = 1
    """The smallest rl.group_size the loss makes sense with."""

def _phases(*middle: PhaseSpec) -> tuple[PhaseSpec, ...]:
    return (*middle, PhaseSpec(UPDATE, "trained", train=True))


_REFERENCE = PhaseSpec(REFERENCE_SCORING, "reference", when="reference")
_REWARD = PhaseSpec(REWARD_SCORING, "reward model", when="reward model")
_RL_UNIT = "prompts x {group_size} completions"

STAGES: dict[str, StageSpec] = {s.name: s for s in (
    StageSpec(
        name="sft", module="loraflow.stages.sft", summary="supervised fine-tuning on conversations or text",
        head="lm", data="sft", trained="policy", phases=_phases(), unit="samples", eval_generates=True,
        packing=True,
        loss=("NLL of completion tokens / completion tokens in the optimizer step",
              "only assistant/completion tokens are learned; normalising by the whole step's tokens makes "
              "gradient accumulation exact (micro-batch 1 x 4 = 4 x 1)")),
    StageSpec(
        name="rm", module="loraflow.stages.rm", summary="a reward model on chosen/rejected pairs",
        head="score", data="pairs", trained="reward model", phases=_phases(), unit="pairs", packing=True,
        loss=("pairwise -log sigmoid(r_chosen - r_rejected) / pairs in the step",
              "Bradley-Terry preference loss (InstructGPT eq. 1) on the score head's output at each answer's last "
              "token")),
    StageSpec(
        name="dpo", module="loraflow.stages.dpo", summary="direct preference optimisation on chosen/rejected pairs",
        head="lm", data="pairs", trained="policy", phases=_phases(_REFERENCE), unit="pairs",
        reference="always", reference_key="dpo.reference", eval_generates=True, packing=True,
        loss=("{loss} loss, beta={beta:g}, label smoothing {label_smoothing:g} / pairs in the step",
              "dpo.loss, dpo.beta, dpo.label_smoothing (DPO eq. 7 / IPO eq. 17 / conservative DPO)")),
    StageSpec(
        name="grpo", module="loraflow.stages.grpo", summary="group relative policy optimisation with rewards",
        head="lm", data="prompts", trained="policy", unit=_RL_UNIT, reference="with kl", generates=True,
        min_group_size=2,
        phases=_phases(PhaseSpec(ROLLOUT, "policy"), _REFERENCE, _REWARD,
                       PhaseSpec(OLD_POLICY_SCORING, "policy", when="several updates")),
        loss=("clipped surrogate with group-normalised advantages - beta*KL(k3), beta={kl_coef:g}, clip "
              "{clip_eps:g}",
              "DeepSeekMath eq. 3: per-completion token mean, averaged over the completions of the step")),
    StageSpec(
        name="ppo", module="loraflow.stages.ppo", summary="PPO with a value head and a reward",
        head="value", data="prompts", trained="policy + value head", unit=_RL_UNIT, reference="with kl",
        generates=True,
        phases=_phases(PhaseSpec(ROLLOUT, "policy"), _REFERENCE, _REWARD,
                       PhaseSpec(VALUE_ESTIMATION, "policy + value head")),
        loss=("clipped surrogate on GAE advantages + {value_coef:g} x clipped value loss; KL {kl_coef:g} in the "
              "reward",
              "PPO eq. 7 with GAE (gamma {gamma:g}, lambda {lam:g}) and InstructGPT's per-token KL penalty")),
)}

STAGE_NAMES: tuple[str, ...] = tuple(STAGES)


def stage_spec(name: str) -> StageSpec:
    """The stage's declaration; the config schema admits only these names."""
    return STAGES[name]


def stage_module(name: str) -> Any:
    """The module that implements the stage's loop."""
    import importlib

    return importlib.import_module(STAGES[name].module)


def config_value(config: Any, key: str) -> Any:
    """A dotted config key's value (reference_key)."""
    node = config
    for part in key.split("."):
        node = getattr(node, part)
    return node


def reference_kind(spec: StageSpec, config: Any) -> str | None:
    """How the stage gets reference log-probs: adapters-disabled (the same model with its adapters switched off,
    no second copy), copy (full fine-tuning changes every weight, so a frozen copy), precomputed (fixed data:
    computed once before training), or None. Stages that sample their data cannot precompute."""
    if spec.reference == "never" or (spec.reference == "with kl" and config.rl.kl_coef == 0):
        return None
    asked = config_value(config, spec.reference_key) if spec.reference_key else "auto"
    if asked != "auto":
        return asked
    if config.adapter.method != "full":
        return "adapters-disabled"
    return "copy" if spec.generates else "precomputed"
