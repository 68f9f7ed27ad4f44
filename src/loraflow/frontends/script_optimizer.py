"""Which parameters a script's own DeepSpeed optimizer is built over (rule zero0-frozen-master-copies): every one,
frozen included, when deepspeed.initialize gets `model.parameters()`, an optimizer built over it, or no
model_parameters beside an optimizer from the config (DeepSpeed then takes module.parameters(), engine.py). A
comprehension or filter that tests requires_grad keeps only the trainable ones, as the HF Trainer, TRL,
DeepSpeed-Chat and the RL frameworks do."""

from __future__ import annotations

from typing import Any

from loraflow.frontends.argv import resolve_path
from loraflow.frontends.common import Draft, load_mapping
from loraflow.frontends.script_code import Call, Unread


def _every_parameter(value: Any) -> bool | None:
    """True: all of a module's parameters; False: filtered on requires_grad; None: check cannot tell."""
    if isinstance(value, Call):
        if value.name == "parameters":
            return True
        if value.name == "filter" or "requires_grad" in " ".join(value.texts.values()):
            return False
        if value.name[:1].isupper():  # an optimizer class: what it was built over
            return _every_parameter(value.arg(0, "params"))
        return None
    if isinstance(value, Unread):
        return False if "requires_grad" in value.text else None
    return None


def _config_has_optimizer(config: Any, bases: tuple) -> bool:
    if isinstance(config, str):
        path = resolve_path(config, *bases)
        try:
            config = load_mapping(path, "the DeepSpeed config") if path is not None else None
        except Exception:  # an unreadable file is reported where the config itself is read
            return False
    return isinstance(config, dict) and "optimizer" in config


def optimizer_params(draft: Draft, calls: list[Call], bases: tuple = ()) -> None:
    """`calls`: the script's deepspeed.initialize calls (Facts.engine_moves)."""
    for call in calls:
        if "optimizer" in call.kwargs:
            every, key = _every_parameter(call.kwargs["optimizer"]), "optimizer"
        elif "model_parameters" in call.kwargs:
            every, key = _every_parameter(call.kwargs["model_parameters"]), "model_parameters"
        elif _config_has_optimizer(call.kwargs.get("config", call.kwargs.get("config_params")), bases):
            every, key = True, None
        else:
            continue
        if every:
            draft.set("optimizer_holds_frozen", True, f"{call.at(key)} (the optimizer is built over every parameter"
                      + (", frozen ones included)" if key else ": no model_parameters, so DeepSpeed takes "
                         "module.parameters() for the config's optimizer)"))
