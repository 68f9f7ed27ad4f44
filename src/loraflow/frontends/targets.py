"""Adapter target names read against the model's family: a target list that names only another family's linear
layers (GPT-NeoX's `query_key_value` on a Llama, Llama's `q_proj` on a Falcon) matches no module, and PEFT refuses
(`Target modules {...} not found in the base model`; releases before 0.7 trained nothing) - rule no-adapter-matched.
A LoRA config with no target list takes PEFT's default for the model's config.model_type, which PEFT lists for a
few dozen types only (peft_default_targets.json, read from its wheels) - rule lora-no-default-targets.

The layer names are families.FAMILIES' (one table, read from transformers' modeling files); which family a model id
names is a short table of unambiguous name patterns below. A target this module does not know (a regex, a name no
family declares, an architecture not listed) decides nothing: the list is then left as it was read.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

from loraflow.families import FAMILIES
from loraflow.frontends.common import Draft, at_least
from loraflow.frontends.model_types import model_type_of

DEFAULT_TARGETS = Path(__file__).with_name("peft_default_targets.json")
"""model type -> the first PEFT release whose LoRA default-target table lists it (scripts/peft_default_targets.py)."""

# Model ids whose family is certain from the name (checkpoints of that architecture under their usual names).
# Qwen's first release (Qwen/Qwen-7B, c_attn/w1/w2) and InternLM2 (wqkv) name their layers otherwise: not listed.
_NAMED = (
    ("llama", re.compile(r"llama|vicuna|mistral|qwen[-_.]?(1[._]5|2|2[._]5|3)\b|qwen(2|3)[-_.]|gemma|(^|/)yi[-_]",
                         re.I)),
    ("gpt_neox", re.compile(r"pythia|gpt[-_]?neox|dolly[-_]v2|stablelm[-_](base|tuned)[-_]alpha", re.I)),
    ("falcon", re.compile(r"falcon", re.I)),
    ("gpt2", re.compile(r"(^|/)(distil)?gpt2(\b|[-_])", re.I)),
    ("phi3", re.compile(r"phi[-_]?3|phi[-_]?4(?![-_]?multimodal)", re.I)),
)
_SPECIAL = {"all", "all-linear", "all_linear"}


def _own(model_type: str) -> set[str]:
    fam = FAMILIES[model_type]
    return {*fam.linears[0], *fam.linears[1], *fam.embedding, *fam.head}


_KNOWN = set().union(*(_own(t) for t in FAMILIES))


def family_of(model: str) -> str | None:
    """The FAMILIES model_type a model id or path names unambiguously, or None."""
    if model.startswith("builtin:"):
        return None
    return next((t for t, rx in _NAMED if rx.search(model)), None)


def foreign(model: str, targets: list[str]) -> str | None:
    """Why `targets` match no module of `model` (their family's names), or None when they may match."""
    kind = family_of(model)
    names = [str(t).strip().split(".")[-1] for t in targets if str(t).strip()]
    if kind is None or not names or any(n.lower() in _SPECIAL or not re.fullmatch(r"\w+", n) for n in names):
        return None
    own = _own(kind)
    if set(names) & own or not set(names) <= _KNOWN:
        return None
    return (f"{', '.join(names)} name no layer of {model} ({kind} layers: "
            f"{', '.join(sorted(FAMILIES[kind].linears[0] + FAMILIES[kind].linears[1]))})")


def check_targets(draft: Draft, model: str, targets: list[str], source: str) -> None:
    """Record an adapter target list that matches no module of the model (matched_modules 0)."""
    why = foreign(model, targets)
    if why is not None and not draft.has("matched_modules"):
        draft.set("matched_modules", 0, f"{source}: {why}")


@cache
def _default_targets() -> dict:
    return json.loads(DEFAULT_TARGETS.read_text())


def unset_targets(func: str, kwargs: dict, splat: str | None) -> bool:
    """A LoraConfig (or AdaLoraConfig, which shares its table) call that names no target list: PEFT's table of
    defaults by model type decides its targets. A `**kwargs` splat may hold one: not read as unset."""
    return func.endswith("LoraConfig") and not splat and not {"target_modules", "target_parameters"} & set(kwargs)


def default_targets(draft: Draft, model: str, source: str) -> None:
    """A LoRA config with no target list (`source` says where): PEFT takes the targets from its table by the model's
    type, and refuses a type the running release does not list (tuners_utils.py _prepare_adapter_config)."""
    kind = model_type_of(model)
    if kind is None:
        return
    table = _default_targets()
    since, dropped = table["since"].get(kind), table["dropped"].get(kind)
    if dropped is not None and at_least(draft, "peft", dropped):
        draft.set("no_default_targets", True, f"{source}: PEFT dropped model type {kind} ({model}) from its "
                  f"default LoRA targets in {dropped}")
    elif since is None:
        draft.set("no_default_targets", True, f"{source}: no PEFT release ({table['releases'][-1]} the newest read) "
                  f"has default LoRA targets for model type {kind} ({model})")
    elif not at_least(draft, "peft", since):
        draft.set("no_default_targets", True, f"{source}: PEFT lists default LoRA targets for model type {kind} "
                  f"({model}) from {since} on")
    else:
        draft.set("no_default_targets", False, f"{source}: PEFT's default LoRA targets for model type {kind}")
