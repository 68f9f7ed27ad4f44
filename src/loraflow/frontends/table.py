"""Frontends as data: each framework declares a table from Combination fields to the flags or keys that set them,
how a value is parsed, and the framework's default when none is given (per release, with the upstream source that
sets it); `apply_table` applies a table to the options a frontend read. A frontend module keeps in code only what
a table row cannot say (the framework's real quirks).

The stage names of the frameworks are declared here too: every frontend maps its own names through STAGE_ALIASES,
so that kto or orpo reads as dpo in one place, not once per framework.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Union

from loraflow.errors import LoraflowError
from loraflow.frontends.common import Draft, as_bool, as_list, at_least, int_value

# verl names its RL stages by the advantage estimator (algorithm.adv_estimator, verl/trainer/ppo/core_algos.py
# AdvantageEstimator): GAE trains a critic beside the policy (PPO); every other one is a critic-free baseline over a
# group of samples, as GRPO's.
_VERL = {"gae": "ppo", **dict.fromkeys((
    "grpo_passk", "grpo_vectorized", "rloo_vectorized", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax",
    "opo", "gpg", "optimal_token_baseline", "tir_optimal_token_baseline"), "grpo")}
# Other frameworks' stage and trainer names that are not loraflow's: the loraflow stage each is read as.
# Preference objectives all train on chosen/rejected pairs in one concatenated forward (loraflow's dpo stage);
# RLOO is a group-baseline policy gradient like GRPO; a (process) reward model is a reward model; continued
# pre-training, distillation (gkd, kd) and Axolotl's ebft train on text like SFT; OpenRLHF's ppo_ray is its PPO on Ray.
STAGE_ALIASES = {"kto": "dpo", "orpo": "dpo", "simpo": "dpo", "ipo": "dpo", "cpo": "dpo", "gdpo": "dpo",
                 "online_dpo": "dpo", "rloo": "grpo", "reward": "rm", "prm": "rm", "pt": "sft", "gkd": "sft",
                 "kd": "sft", "ebft": "sft", "ppo_ray": "ppo", **_VERL}


def stage_of(name: str) -> str:
    """The loraflow stage a framework's stage or trainer name is read as."""
    return STAGE_ALIASES.get(name, name)


def stages(*names: str, prefix: str = "") -> dict[str, str]:
    """A framework's stage names (in the order its messages list them) -> loraflow stages, through STAGE_ALIASES."""
    return {prefix + n: stage_of(n) for n in names}


Options = dict[str, tuple[Any, str]]
"""What a frontend read: flag or key -> (value, where it came from: `--zero_stage 3`, `x.yaml: deepspeed`)."""
Resolver = Callable[[Draft], "tuple[Any, str] | None"]


@dataclass(frozen=True)
class Default:
    """The framework's value when no flag or key gives one, and the source that says so. `since` holds the releases
    that changed it, newest first: (package, first release, value, source); the first release the evaluated version
    reaches wins, else `value`. Versions are compared only when the default is needed (each comparison makes `check`
    evaluate both sides of it)."""
    value: Any
    source: str
    since: tuple[tuple[str, str, Any, str], ...] = ()

    def __call__(self, draft: Draft) -> tuple[Any, str]:
        for package, first, value, source in self.since:
            if at_least(draft, package, first):
                return value, source
        return self.value, self.source


@dataclass(frozen=True)
class Field:
    """One row: the Combination field `name`, set from the first of `keys` the options hold (parsed by `parse`, which
    returns None to leave the field alone, e.g. a switch that is off), else from `default` (a Default, or a function of
    the draft for a default that depends on more than releases; None from it leaves the field alone). `when` limits
    the row to setups it holds for (checkpointing on, a stage); `suffix` is added to the flag's source."""
    name: str
    keys: tuple[str, ...] = ()
    parse: Callable[[Any, str], Any] = as_bool
    default: Union[Default, Resolver, None] = None
    when: Callable[[Draft], bool] | None = None
    suffix: str = ""


def steps(value: Any, where: str) -> int | None:
    """A count such as gradient_accumulation_steps: a whole number, else (a value the script computes, "auto") the
    field is left at its default."""
    try:
        return int_value(value, where)
    except LoraflowError:
        return None


def apply_table(draft: Draft, options: Options, table: Iterable[Field]) -> None:
    """Set each row's field, in the table's order (later rows may read what earlier ones set)."""
    for row in table:
        if row.when is not None and not row.when(draft):
            continue
        key = next((k for k in row.keys if k in options), None)
        if key is not None:
            value, where = options[key]
            parsed = row.parse(value, where)
            if parsed is not None:
                draft.set(row.name, parsed, where + row.suffix)
            continue
        chosen = row.default(draft) if row.default is not None else None
        if chosen is not None:
            draft.set(row.name, *chosen)


def fact(name: str, value: Any, source: str, when: Callable[[Draft], bool] | None = None) -> Field:
    """A row no flag changes: what the framework's code always does (its source says where)."""
    return Field(name, default=Default(value, source), when=when)


# Parsers: (value, where it came from) -> the field's value, or None to leave it unset.
def switch(value: Any, where: str) -> bool | None:
    """On sets True; off leaves the field at what the framework does anyway."""
    return True if as_bool(value, where) else None


def all_if_on(value: Any, where: str) -> str | None:
    """A checkpointing switch: on checkpoints every layer."""
    return "all" if as_bool(value, where) else None


def zero_stage(value: Any, where: str) -> int:
    return int_value(value, where, "a ZeRO stage", (0, 1, 2, 3))


def weight_reading_init(value: Any, where: str) -> str | None:
    """A LoRA initialization that decomposes the base weight (PEFT init_lora_weights pissa*, olora, corda, loftq):
    `svd` (rule zero3-init-adapter-read); the default random one, or one reading activations (eva), leaves it."""
    name = str(value).lower()
    return "svd" if name.startswith(("pissa", "olora", "corda", "loftq")) else None


def parameter_targets(value: Any, where: str) -> str | None:
    """LoRA on nn.Parameter targets (PEFT target_parameters): `parameters`, when any is named."""
    return "parameters" if as_list(value) else None


def empty_targets(value: Any, where: str) -> int | None:
    """An adapter target list given empty matches no module (PEFT then finds nothing to adapt)."""
    return 0 if not as_list(value) else None


def empty_list(value: Any, where: str) -> int | None:
    """As empty_targets, for flags parsed as lists (`--target_modules` with nothing after it)."""
    return 0 if isinstance(value, list) and not value else None


def at_stage(*names: str) -> Callable[[Draft], bool]:
    return lambda draft: draft.get("stage") in names


def checkpointing_on(draft: Draft) -> bool:
    return draft.get("checkpointing") != "off"


def fraction(value: Any, where: str) -> float:
    """A share of a GPU's memory (`--vllm_gpu_memory_utilization 0.6`), between 0 and 1."""
    item = value[0] if isinstance(value, (list, tuple)) and len(value) == 1 else value
    try:
        share = float(item)
    except (TypeError, ValueError):
        share = -1.0
    if not 0 < share <= 1:
        raise LoraflowError(f"{where}: `{item}` is not a share of GPU memory; write a number above 0 and at most 1, "
                            "such as 0.5.")
    return share


def rank(value: Any, where: str) -> int:
    """A LoRA rank (`--lora_r 64`)."""
    return int_value(value, where, "a LoRA rank")
