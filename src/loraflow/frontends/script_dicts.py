"""Dicts a training script writes out with some values computed (script_code.py keeps a dict literal whose keys are
literal, with an Unread / FromFlag / Call where the code computes a value): `{"train_micro_batch_size_per_gpu":
args.bs, "zero_optimization": {"stage": 3}}`. A value from the script's own argument parser is read from the launch
line, else from the parser's default; the rest is listed as not read, key by key, so the literal keys still count.

A DeepSpeed config is read key by key (the ZeRO stage is evaluated for every stage when it is computed; offload,
precision and the save-time gather both ways); any other dict option (gradient_checkpointing_kwargs, fsdp_config)
whose computed values remain is not read at all, as before: a missing key there would read as its default.
"""

from __future__ import annotations

from typing import Any

from loraflow.frontends.common import Draft
from loraflow.frontends.hf_options import HANDLED, Opt
from loraflow.frontends.script_code import Call, Code, FromFlag, Parsed, Unread

_COMPUTED = (Unread, FromFlag, Parsed, Call)
# DeepSpeed keys whose computed value is evaluated both ways rather than read as absent (absent reads as DeepSpeed's
# default, which would decide for the code): Combination field -> the labels of each value.
_OFFLOAD = ("offload", {True: "the computed offload device is cpu or nvme",
                         False: "the computed offload device is none"})
_GATHER = ("adapter_save_gather", {True: "the computed setting gathers 16-bit weights on save",
                                   False: "the computed setting does not gather on save"})
_SAVE_KEYS = ("stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save",
              "stage3_gather_fp16_weights_on_model_save")


def computed(value: Any) -> bool:
    """The value, or anything inside it, is computed by the code."""
    if isinstance(value, dict):
        return any(computed(v) for v in value.values())
    if isinstance(value, list):
        return any(computed(v) for v in value)
    return isinstance(value, _COMPUTED)


def fixed_device(where: Any) -> bool:
    """A device_map that puts the model on one device whatever the rank: "auto", 0, "cuda:0", {"": 0}. A map whose
    device the code computes (`{"": accelerator.local_process_index}`) is the per-rank placement."""
    if isinstance(where, dict):
        return bool(where) and not computed(where)
    return where == "auto" or isinstance(where, int) or (isinstance(where, str) and ":" in where)


def settle(draft: Draft, opts: dict[str, Opt], flags: dict[str, Opt], code: Code) -> None:
    """Each dict option with computed values: parsed flags resolved, the DeepSpeed config read key by key, any other
    such option dropped and listed (in place). A script flag so read is no longer listed as not understood."""
    used: set[str] = set()
    for name, opt in list(opts.items()):
        if not isinstance(opt.value, dict) or not computed(opt.value):
            continue
        value = _resolve(opt.value, flags, code, used)
        if name == "deepspeed":
            opts[name] = Opt(_deepspeed(draft, value, opt.source), opt.source, opt.derived)
        elif computed(value):
            draft.unknown.append(f"{opt.source} (computed values in it: {', '.join(_paths(value))}; not read)")
            del opts[name]
        else:
            opts[name] = Opt(value, opt.source, opt.derived)
    for flag in used - HANDLED:
        opts.pop(flag, None)


def _resolve(value: Any, flags: dict[str, Opt], code: Code, used: set[str]) -> Any:
    """`args.zero_stage` -> the launch line's `--zero_stage 3`, else the script parser's default for it."""
    if isinstance(value, dict):
        return {k: _resolve(v, flags, code, used) for k, v in value.items()}
    if not isinstance(value, FromFlag):
        return value
    given = [o for o, dest in code.dests.items() if dest == value.name and o in flags]
    flag = given[0] if given else value.name
    opt = flags.get(flag)
    if opt is not None:
        used.add(flag)
        return _scalar(opt.value) if opt.value is not None else True
    default = code.defaults.get(value.name)
    return default if default is not None else value


def _scalar(text: Any) -> Any:
    """A launch line's value as the parser's type would give it: `3` -> 3, `true` -> True."""
    if not isinstance(text, str):
        return text
    if text.isdigit():
        return int(text)
    return {"true": True, "false": False}.get(text.lower(), text)


def _paths(value: Any, prefix: str = "") -> list[str]:
    """`zero_optimization.stage = args.stage`, one per computed leaf."""
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _paths(v, f"{prefix}{k}.")]
    return [f"{prefix.rstrip('.')} = {_text(value)}"] if isinstance(value, _COMPUTED) else []


def _text(value: Any) -> str:
    return value.text if isinstance(value, Unread) else f"args.{value.name}" if isinstance(value, FromFlag) else \
        f"{value.func}(...)" if isinstance(value, Call) else "the parsed arguments"


def _deepspeed(draft: Draft, config: dict, source: str) -> dict:
    """The DeepSpeed config with its computed keys taken out, each listed or evaluated both ways."""
    config = dict(config)
    zero = config.get("zero_optimization")
    if isinstance(zero, dict):
        zero = config["zero_optimization"] = dict(zero)
        if isinstance(zero.get("stage"), _COMPUTED):
            why = f"{source}: zero_optimization.stage = {_text(zero['stage'])} (computed in the script)"
            zero["stage"] = draft.fork("deepspeed_stage", {n: f"the script's computed ZeRO stage is {n}"
                                                           for n in (0, 1, 2, 3)}, why)
        for key in ("offload_optimizer", "offload_param"):
            section = zero.get(key)
            if computed(section):
                draft.maybe(_OFFLOAD[0], _OFFLOAD[1], f"{source}: zero_optimization.{key} is computed in the script")
                del zero[key]
        for key in _SAVE_KEYS:
            if computed(zero.get(key)):
                draft.maybe(_GATHER[0], _GATHER[1], f"{source}: zero_optimization.{key} is computed in the script")
                del zero[key]
    for key in ("bf16", "fp16"):
        section = config.get(key)
        if computed(section):
            draft.maybe("precision", {f"{key}-mixed": f"the computed {key}.enabled is true",
                                      "fp32": f"the computed {key}.enabled is false"},
                        f"{source}: {key}.enabled is computed in the script")
            del config[key]
    left = _paths(config)
    if left:
        draft.unknown.append(f"{source} (computed in the script, not read: {'; '.join(left)})")
    return _literal_only(config)


def _literal_only(value: dict) -> dict:
    return {k: _literal_only(v) if isinstance(v, dict) else v for k, v in value.items() if not computed(v) or
            isinstance(v, dict)}
