"""A model's lineage in a training script: the calls that built it (get_peft_model, k-bit preparation, casts,
merges) back to the from_pretrained that loaded it, and what that load quantizes."""

from __future__ import annotations

from typing import Any

from loraflow.frontends.script_code import Call, Code, Parsed, Unread
from loraflow.frontends.script_facts import kind, prequantized


def lineage(value: Any, code: Code) -> list[Call]:
    """The calls that built the model a value holds, newest first, back to the from_pretrained that loaded it:
    through get_peft_model, k-bit preparation, PeftModel.from_pretrained, casts and merges."""
    chain: list[Call] = []
    while isinstance(value, Call) and len(chain) < 20:
        chain.append(value)
        k = kind(value, code)
        if k in ("load", "unsloth_load") or (k == "peft_load" and value.owner_name.startswith("AutoPeftModel")):
            break
        # get_peft_model(model, ...), prepare_model_for_kbit_training(model), PeftModel.from_pretrained(model, ...)
        # take the model as their first argument; methods (.to, .eval, .merge_and_unload) are called on it.
        takes_model = k in ("wrap", "kbit_prep", "unsloth_wrap", "peft_load") and value.name not in (
            "add_adapter", "load_adapter")
        value = value.arg(0, "model") if takes_model else value.owner
    return chain


def load_of(value: Any, code: Code) -> Call | None:
    """The from_pretrained (or AutoPeftModel load) at the root of a model's lineage, if the code shows it."""
    chain = lineage(value, code)
    return chain[-1] if chain and kind(chain[-1], code) in ("load", "unsloth_load", "peft_load") else None


def bits_of(load: Call | None, code: Code) -> str | None:
    """"4bit" / "8bit" when the load quantizes with bitsandbytes, None when it visibly does not, "?" when the code
    cannot tell (a quantization_config built elsewhere, an AutoPeftModel loading the base its adapter names)."""
    if load is None:
        return "?"
    quant = load.kwargs.get("quantization_config")
    given = quant.kwargs if isinstance(quant, Call) and quant.name == "BitsAndBytesConfig" else \
        quant if isinstance(quant, dict) else {}
    for bits in ("4bit", "8bit"):
        if load.kwargs.get(f"load_in_{bits}") is True or given.get(f"load_in_{bits}") is True:
            return bits
    if kind(load, code) == "unsloth_load" and load.kwargs.get("load_in_4bit", True) is True and not (
            load.kwargs.get("full_finetuning") or load.kwargs.get("load_in_8bit")):
        return "4bit"
    name = load.arg(0, "pretrained_model_name_or_path", load.kwargs.get("model_name"))
    if isinstance(name, str) and prequantized(name):
        return "4bit"
    if isinstance(quant, (Unread, Parsed)) or load.owner_name.startswith("AutoPeftModel") or not isinstance(name, str):
        return "?"
    return None
