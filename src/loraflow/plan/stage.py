"""The stage area: the loss, the reference policy, the phases of one step and, for RL stages, the rollout and the
rewards (plan/rewards.py), read from the stage's declaration (stagespec.py)."""

from __future__ import annotations

from dataclasses import dataclass

from loraflow.phases import stage_phases
from loraflow.plan.context import Context
from loraflow.plan.rewards import RewardModelPlan, decide_rewards
from loraflow.plan.rollout import RolloutPlan, decide_rollout
from loraflow.plan.types import Decision
from loraflow.stagespec import reference_kind

_REFERENCE_REASONS = {
    "adapters-disabled": "the base with the adapters switched off is the starting policy: no second copy of the "
                         "weights",
    "copy": "full fine-tuning changes every weight, so the reference is a separately loaded frozen copy",
    "precomputed": "reference log-probs of every pair are computed once before training; no reference model runs "
                   "during it"}


@dataclass(frozen=True)
class Stage:
    reference: str | None
    phases: list
    decisions: list[Decision]
    rollout: RolloutPlan | None = None
    reward_model: RewardModelPlan | None = None


def decide_stage(ctx: Context) -> Stage:
    config, spec = ctx.config, ctx.spec
    reference = reference_kind(spec, config)
    phases = stage_phases(spec, reference, bool(config.rl.reward_model) and spec.generates,
                          config.rl.updates_per_rollout)
    rollout, rollout_choices = decide_rollout(ctx) if spec.generates else (None, [])
    reward_model, reward_choices = decide_rewards(ctx) if spec.generates else (None, [])
    return Stage(reference, phases, [*_decisions(ctx, reference, phases, rollout_choices + reward_choices),
                                     schedule_decision(config)], rollout, reward_model)


def schedule_decision(config) -> Decision:
    """The learning-rate schedule (engines/base.py lr_lambda), and what resuming does with it (run/directory.py)."""
    t = config.train
    end = f"step {t.max_steps} (train.max_steps)" if t.max_steps else f"the last step of train.epochs={t.epochs:g}"
    shape = "constant" if t.schedule == "constant" else f"{t.schedule} decay to 0 at {end}"
    warmup = f"linear warmup over {t.warmup_steps} steps, then " if t.warmup_steps else ""
    return Decision("lr schedule", f"peak {t.learning_rate:g}; {warmup}{shape}",
                    "train.learning_rate, train.warmup_steps, train.schedule; a resumed run keeps it: changing one "
                    "is refused, except a longer train.max_steps with --extend, which rebuilds the schedule for the "
                    "new length as if it had been asked from the start")


def _decisions(ctx: Context, reference: str | None, phases: list, rollout: list[Decision]) -> list[Decision]:
    cfg, spec, s = ctx.config, ctx.spec, ctx.setup
    r = cfg.rl
    # The loss and why its normalisation keeps gradient accumulation exact, from the stage's declaration.
    value, why = spec.loss
    values = {**vars(cfg.dpo), **vars(r)}
    out = [Decision("loss", value.format(**values), why.format(**values))]
    if spec.packing:
        out.append(Decision("packing", cfg.data.packing, "data.packing; position ids restart per sample so packed "
                            "samples never attend to each other" if cfg.data.packing else "data.packing=false: one "
                            "sample per row, right-padded"))
        return out
    if spec.head == "score":
        out.append(Decision("head", "scalar score head (trained in full, saved with the adapter)",
                            "a reward model scores a whole answer; the body carries the adapters"))
    if spec.data == "pairs":
        out.append(Decision("pairs", "chosen and rejected concatenated into one forward",
                            "one forward per micro-batch: under FSDP2 with checkpointing, two forwards before one "
                            "backward fail", "fsdp2-multi-forward-dtensor" if s.dtensor_params else None))
    if reference:
        key = spec.reference_key or "the adapter method"
        out.append(Decision("reference", reference, f"{_REFERENCE_REASONS[reference]} ({key})"))
    if spec.generates:
        out += _rollout(ctx) + rollout
    out.append(Decision("phases", "; ".join(p.describe() for p in phases),
                        "the policy is in train mode before every backward (asserted), and reference, reward and "
                        "rollout forwards run without autograd", ctx.rule("train_mode_at_backward")))
    return out


def _rollout(ctx: Context) -> list[Decision]:
    r, s = ctx.config.rl, ctx.setup
    k = r.updates_per_rollout
    out = [Decision("updates", f"{k} optimizer step{'s' if k > 1 else ''} per rollout",
                    "rl.updates_per_rollout: later updates take the ratio to the rollout's policy and are clipped"
                    if k > 1 else "rl.updates_per_rollout=1: the ratio is 1 at the update, so the clip never acts "
                    "(TRL's num_iterations=1)")]
    gather = s.generation_gather or not s.sharded_params
    out.append(Decision("rollout", f"{r.group_size} completions per prompt, up to {r.max_new_tokens} tokens at "
                        f"temperature {r.temperature:g}; " + ("weights gathered once per rollout" if
                                                             s.sharded_params else "local weights"),
                        "sampling noise is keyed by (seed, step, prompt, completion, position), so the tokens "
                        "do not depend on how prompts are split over processes"
                        + ("" if gather else "; weights gathered at every token"), ctx.rule("generation_gather")))
    return out
