"""The composition sweep's space: the axes users vary, which of their values can meet, an all-pairs covering set
plus a seeded random sample of setups, and each setup as `loraflow train` overrides.

A *setup* is one value per axis (a dict). Values that cannot be expressed together are never generated (packing
outside SFT, adapter targets on a full fine-tune, the old DeepSpeed outside a DeepSpeed engine); everything else is,
including what the plan must refuse: the judge (sweep_judge.py) accepts a refusal before the model loads, never a
failure after it.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
from pathlib import Path
from typing import Any

from loraflow.enginespec import VARIANTS
from loraflow.verify.sweep_models import EXPERT_FAMILIES, FAMILIES, image_text

AXES: dict[str, tuple[str, ...]] = {
    "stage": ("sft", "rm", "dpo-adapters-disabled", "dpo-copy", "dpo-precomputed", "grpo", "ppo"),
    "family": FAMILIES,
    "adapter": ("lora", "dora", "full", "nf4", "int8"),
    "targets": ("attention", "all-linear", "lm_head", "embeddings", "experts"),
    "checkpointing": ("off", "reentrant", "non-reentrant", "mlp", "every-2", "offload"),
    "precision": ("fp32", "bf16-mixed", "bf16"),
    "engine": ("single", "ddp", "zero2", "zero3", "zero3-offload", "fsdp2"),
    "packing": ("off", "on"),
    "logits": ("auto", "learned", "full"),
    "deepspeed": ("current", "oldest"),
    "towers": ("auto", "vision-full", "vision-adapter"),
}
"""Axis -> its values. nf4 and int8 are LoRA on a base loaded in 4 or 8 bits (bitsandbytes). targets `lm_head` and
`embeddings` are every attention and MLP linear layer (by name: sweep_models.linear_names) plus the output head or
the input embeddings as adapter targets; `experts` (mixtures of experts only) is the attention layers plus the fused
expert weights (adapter.target_modules' `experts`). checkpointing `mlp` is non-reentrant with granularity mlp,
`every-2` checkpoints every other layer, `offload` moves saved activations to the CPU (with non-reentrant checkpointing). deepspeed `oldest` runs in the legacy environment (the oldest DeepSpeed
release loraflow accepts). towers (image-text families only) is what trains beside the language model's adapters:
`auto` (the vision encoder and projector frozen), `vision-full` (both trained in full, MiniCPM-V's setup),
`vision-adapter` (the encoder adapted, the projector trained in full)."""

AXIS_NAMES = tuple(AXES)
DEFAULT = {"stage": "sft", "family": "llama", "adapter": "lora", "targets": "all-linear", "checkpointing": "off",
           "precision": "fp32", "engine": "single", "packing": "off", "logits": "auto", "deepspeed": "current",
           "towers": "auto"}
"""A setup's values on the axes a caller leaves out."""

PACKING_STAGES = ("sft",)
ZERO = tuple(v for v in AXES["engine"] if VARIANTS[v].zero_stage is not None)
"""The engine values that run DeepSpeed (its release is an axis of its own)."""
STEPS = 3


DECIDED_BY = {"packing": "stage", "targets": "adapter", "deepspeed": "engine", "towers": "family"}
"""An axis that means something only next to some values of another axis -> that axis."""


def applies(axis: str, setup: dict[str, str]) -> bool:
    """Whether `axis` means anything next to the setup's other values (when not, it holds DEFAULT's value). A
    setup that leaves the deciding axis unset could still choose a value that makes it apply."""
    decider = DECIDED_BY.get(axis)
    if decider is None or decider not in setup:
        return True
    value = setup[decider]
    if axis == "packing":
        return value in PACKING_STAGES
    if axis == "targets":
        return value != "full"
    if axis == "deepspeed":
        return value in ZERO
    return image_text(value)  # towers


VALUE_NEEDS = {("targets", "experts"): ("family", EXPERT_FAMILIES)}
"""An axis value that exists only next to some values of another axis (the experts of a mixture of experts)."""


def voided(partial: dict[str, str]) -> bool:
    """Whether a value the partial setup sets away from DEFAULT means nothing next to its other values."""
    return any(v != DEFAULT[a] and not applies(a, partial) for a, v in partial.items()) or any(
        partial.get(a) == v and other in partial and partial[other] not in allowed
        for (a, v), (other, allowed) in VALUE_NEEDS.items())


def satisfiable(partial: dict[str, str]) -> bool:
    """Whether some values of the deciding axes the partial setup leaves unset make none of its values void."""
    free = sorted({d for d in (*DECIDED_BY.values(), *(o for o, _ in VALUE_NEEDS.values())) if d not in partial})
    return any(not voided({**partial, **dict(zip(free, values))})
               for values in itertools.product(*(AXES[d] for d in free)))


def can_meet(a: str, va: str, b: str, vb: str) -> bool:
    """Whether axis values a=va and b=vb can appear in one setup."""
    return satisfiable({a: va, b: vb})


def complete(partial: dict[str, str]) -> dict[str, str]:
    """The partial setup with every axis filled: DEFAULT where unset, and DEFAULT where an axis does not apply."""
    setup = {axis: partial.get(axis, DEFAULT[axis]) for axis in AXIS_NAMES}
    for axis in AXIS_NAMES:
        if not applies(axis, setup):
            setup[axis] = DEFAULT[axis]
    for (axis, value), (other, allowed) in VALUE_NEEDS.items():
        if setup[axis] == value and setup[other] not in allowed:
            setup[axis] = DEFAULT[axis]
    return setup


def setup_id(setup: dict[str, str]) -> str:
    """A short stable name: the values that differ from DEFAULT, in axis order (`default` when none do)."""
    parts = [f"{a}={setup[a]}" for a in AXIS_NAMES if setup[a] != DEFAULT[a]]
    return ",".join(parts) or "default"


def _pairs_of(setup: dict[str, str]) -> set[tuple[str, str, str, str]]:
    return {(a, setup[a], b, setup[b]) for a, b in itertools.combinations(AXIS_NAMES, 2)}


def all_pairs(seed: int) -> list[dict[str, str]]:
    """A covering set: every pair of values of two axes that can meet appears in at least one setup. Greedy: each
    new setup starts from an uncovered pair and fills the other axes with the value that covers the most uncovered
    pairs (ties broken by the seeded generator), until every pair is covered."""
    rng = random.Random(seed)
    uncovered = {(a, va, b, vb) for a, b in itertools.combinations(AXIS_NAMES, 2)
                 for va in AXES[a] for vb in AXES[b] if can_meet(a, va, b, vb)}
    out: list[dict[str, str]] = []
    while uncovered:
        a, va, b, vb = min(uncovered)  # deterministic start, then seeded choices
        partial = {a: va, b: vb}
        others = [x for x in AXIS_NAMES if x not in partial]
        rng.shuffle(others)
        for axis in others:
            best, score = [], -1
            for value in AXES[axis]:
                trial = {**partial, axis: value}
                if not satisfiable(trial):
                    continue  # this value would void one already chosen (packing outside SFT), or not apply
                gain = sum((x, trial[x], y, trial[y]) in uncovered or (y, trial[y], x, trial[x]) in uncovered
                           for x, y in itertools.combinations(trial, 2) if axis in (x, y))
                if gain > score:
                    best, score = [value], gain
                elif gain == score:
                    best.append(value)
            partial[axis] = rng.choice(best) if best else DEFAULT[axis]
        setup = complete(partial)
        covered = _pairs_of(setup) & uncovered
        if not covered:  # cannot happen for pairs that can meet; guard against an endless loop all the same
            uncovered.discard((a, va, b, vb))
            continue
        uncovered -= covered
        out.append(setup)
    return out


def random_setups(seed: int, count: int) -> list[dict[str, str]]:
    rng = random.Random(f"sample-{seed}")
    return [complete({axis: rng.choice(values) for axis, values in AXES.items()}) for _ in range(count)]


def generate(seed: int, count: int) -> list[dict[str, str]]:
    """At least `count` distinct setups: the covering set for this seed, then random ones up to `count`."""
    out = {setup_id(s): s for s in all_pairs(seed)}
    extra = 0
    while len(out) < count:
        batch = random_setups(seed + 7919 * extra, count)
        extra += 1
        for s in batch:
            out.setdefault(setup_id(s), s)
            if len(out) >= count:
                break
    return list(out.values())


def ranks(setup: dict[str, str]) -> int:
    return 1 if setup["engine"] == "single" else 2


def launch_key(setup: dict[str, str]) -> tuple[int, str]:
    """Setups with the same key run in one launch: the number of processes and the DeepSpeed environment."""
    return ranks(setup), setup["deepspeed"]


STAGE_CONFIG = {"dpo-adapters-disabled": ("dpo", ["dpo.reference=adapters-disabled"]),
                "dpo-copy": ("dpo", ["dpo.reference=copy"]),
                "dpo-precomputed": ("dpo", ["dpo.reference=precomputed"])}
"""A stage axis value -> (loraflow stage, the overrides that pick its variant)."""

def targets(setup: dict[str, str]) -> str:
    """adapter.target_modules of the setup's targets value, with the family's own layer names."""
    from loraflow.verify.sweep_models import linear_names

    if setup["targets"] == "all-linear":
        return "[all-linear]"
    attention, mlp = linear_names(setup["family"])
    names = {"attention": attention, "lm_head": (*attention, *mlp, "lm_head"),
             "embeddings": (*attention, *mlp, "embed_tokens"), "experts": (*attention, "experts")}[setup["targets"]]
    return f"[{','.join(names)}]"


def stage_of(setup: dict[str, str]) -> str:
    return STAGE_CONFIG.get(setup["stage"], (setup["stage"], []))[0]


def samples(setup: dict[str, str]) -> bool:
    """Whether the setup's stage trains on completions sampled from the policy (rollouts)."""
    from loraflow.stagespec import stage_spec

    return stage_spec(stage_of(setup)).generates


def overrides(setup: dict[str, str], model_dir: str, out_dir: Path, workdir: Path) -> list[str]:
    """The `loraflow train STAGE` overrides of a setup, on top of the stage's embedded default config: a tiny
    run (3 optimizer steps of 4 samples, an evaluation after step 2 and at the end, short generations)."""
    stage, extra = STAGE_CONFIG.get(setup["stage"], (setup["stage"], []))
    world = ranks(setup)
    if image_text(setup["family"]):  # image records of the stage's kind, written by the judge (image_data)
        train, held_out = image_data(workdir, stage)
        extra = [*extra, f"data.train={train}", f"data.eval={held_out}"]
    elif setup["stage"] == "dpo-precomputed":  # reference log-probs of 40 pairs, not of the 2000 the demo trains on
        extra = [*extra, "data.train=builtin:reverse/prefs-train.jsonl*0.02"]
    o = [f"model.path={model_dir}", "model.merge_adapters=[]", *extra,
         f"train.max_steps={STEPS}", f"train.micro_batch_size={max(1, 4 // world)}",
         "train.gradient_accumulation_steps=1", "train.warmup_steps=0", "train.schedule=constant",
         "train.learning_rate=1e-3", "train.seed=1", "eval.every_steps=2", "eval.max_samples=4",
         "eval.max_new_tokens=4", "eval.batch_size=4", "output.progress_bar=false", "output.tensorboard=false",
         "output.log_every_steps=1", f"output.dir={out_dir}", f"precision.mode={setup['precision']}",
         f"train.logits={setup['logits']}", "adapter.rank=4", "adapter.alpha=8", "adapter.dropout=0"]
    if samples(setup):
        o += ["rl.group_size=2", "rl.max_new_tokens=4", f"rl.rewards=[{__name__}:completion_length]"]
    adapter = setup["adapter"]
    o.append(f"adapter.method={'lora' if adapter in ('nf4', 'int8') else adapter}")
    if adapter in ("nf4", "int8"):
        o.append(f"model.quantization.method={adapter}")
    if adapter != "full":
        o.append(f"adapter.target_modules={targets(setup)}")
    ckpt = setup["checkpointing"]
    if ckpt != "off":
        o += ["checkpointing.enabled=true",
              f"checkpointing.reentrant={'true' if ckpt == 'reentrant' else 'false'}"]
        if ckpt == "mlp":
            o.append("checkpointing.granularity=mlp")
        if ckpt == "every-2":
            o.append("checkpointing.every_n_layers=2")
        if ckpt == "offload":
            o.append("checkpointing.offload_activations=true")
    o += TOWERS[setup["towers"]]
    if setup["packing"] == "on":
        o.append("data.packing=true")
    from loraflow.verify.crosscheck import engine_overrides

    return o + engine_overrides(setup["engine"], workdir)


TOWERS = {"auto": [], "vision-full": ["towers.vision.train=full", "towers.projector.train=full"],
          "vision-adapter": ["towers.vision.train=adapter", "towers.projector.train=full"]}
"""A towers axis value -> its overrides."""


def image_data(workdir: Path, stage: str, write: bool = False) -> tuple[Path, Path]:
    """(train, eval) image records of the stage's data kind for the image-text families, under workdir (written
    when `write`: once per launch, by rank 0, before any setup reads them)."""
    from loraflow.stagespec import stage_spec
    from loraflow.verify.sweep_vision import write_stage_data

    kind = stage_spec(stage).data
    root = workdir / "image-data"
    if write:
        return write_stage_data(root, kind)
    return root / f"{kind}-train.jsonl", root / f"{kind}-eval.jsonl"


def completion_length(completions: list[str], fields: list[dict]) -> list[float]:
    """The sweep's RL reward: a random model rarely earns the demo's reward, and equal rewards in a group give
    zero advantages and zero gradients (a full fine-tune's reference equals the policy at the start, so its KL
    term adds none either): a judge could not tell such a run from one that never learns. Lengths of sampled
    completions differ within a group."""
    return [float(len(c)) for c in completions]


def command(setup: dict[str, str]) -> str:
    """The one command that reruns a setup alone (scripts/sweep.py --only)."""
    return f"python scripts/sweep.py --only '{json.dumps(setup, sort_keys=True)}' --out /tmp/sweep-repro"


def digest(setups: list[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(setups, sort_keys=True).encode()).hexdigest()[:12]
