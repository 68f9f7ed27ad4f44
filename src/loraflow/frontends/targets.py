"""Adapter target names read against the model's family: a target list that names only another family's linear
layers (GPT-NeoX's `query_key_value` on a Llama, Llama's `q_proj` on a Falcon) matches no module, and PEFT refuses
(`Target modules {...} not found in the base model`; releases before 0.7 trained nothing) - rule no-adapter-matched.

The layer names are families.FAMILIES' (one table, read from transformers' modeling files); which family a model id
names is a short table of unambiguous name patterns below. A target this module does not know (a regex, a name no
family declares, an architecture not listed) decides nothing: the list is then left as it was read.
"""

from __future__ import annotations

import re

from loraflow.families import FAMILIES
from loraflow.frontends.common import Draft

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
