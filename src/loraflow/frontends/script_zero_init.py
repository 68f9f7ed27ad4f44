"""ZeRO-3's zero.Init in a training script: transformers' from_pretrained builds the model partitioned (every weight
a [0] placeholder, in the DeepSpeed config's dtype) only while an HfDeepSpeedConfig of a stage-3 config is alive
(transformers integrations/deepspeed.py keeps a weakref to it: is_deepspeed_zero3_enabled). The HF Trainer makes one
when its TrainingArguments are built with `deepspeed=` (TrainingArguments.__post_init__), and a script of its own
makes one with `dschf = HfDeepSpeedConfig(ds_config)` before the load (transformers' "non-Trainer DeepSpeed
integration"). A model loaded before either, or a loop that calls deepspeed.initialize without one, is built whole
in the dtype it is loaded in; the engine partitions it afterwards.

hf.py reads a ZeRO-3 run as the HF Trainer's, with zero.Init at the load; this module corrects that where the code
shows the load before any marker, and reads HfDeepSpeedConfig's config as the run's DeepSpeed config.
"""

from __future__ import annotations

import re

from loraflow.frontends.common import Draft, trainer_dtypes
from loraflow.frontends.hf_options import Opt
from loraflow.frontends.script_code import Call, Code, Unread
from loraflow.frontends.script_facts import Facts, kind

_HALF_INIT = "ZeRO-3 zero.Init in the DeepSpeed dtype"


def deepspeed_opt(draft: Draft, facts: Facts) -> Opt | None:
    """HfDeepSpeedConfig(ds_config): the script runs DeepSpeed with this config (read where nothing else names one:
    deepspeed.initialize, DeepSpeedPlugin or TrainingArguments name theirs)."""
    for call in facts.zero_inits:
        config = call.arg(0, "config_file_or_dict")
        if isinstance(config, (str, dict)):
            return Opt(config, call.at(), True)
        draft.unknown.append(f"{call.at()} (its DeepSpeed config is built where the code does not show)")
    return None


def computed_config(code: Code) -> Opt | None:
    """TrainingArguments(deepspeed=<computed>) (a path from an environment variable or a helper, p513817/deepspeed-
    tutorial's `deepspeed=common.get_env("DS_CONFIG")`): the run is a DeepSpeed run whose config is not visible, read
    from what its expression names (`os.path.join(d, "ds_z3.json")` names stage 3) and else evaluated per stage."""
    for call in code.calls:
        value = call.kwargs.get("deepspeed")
        if kind(call, code) == "args" and isinstance(value, (Unread, Call)):
            text = value.text if isinstance(value, Unread) else f"{value.func}(...)"
            strings = [a for a in value.args if isinstance(a, str)] if isinstance(value, Call) else \
                re.findall(r"['\"]([^'\"]+)['\"]", text)
            named = [s for s in strings if s.endswith(".json")]  # the file name it joins
            return Opt(named[-1] if named else text, f"{call.at('deepspeed')} (computed in the script)", True)
    return None


def alive(call: Call, code: Code) -> bool:
    """The HfDeepSpeedConfig is kept (`dschf = ...`, `self.dschf = ...`): transformers holds only a weakref, so one
    made in a bare expression statement is collected at once and zero.Init never runs."""
    return bool(call.target) or any(value is call for _, _, value, _ in code.attributes)


def zero3_markers(code: Code) -> list[Call]:
    """The calls that turn zero.Init on for later loads: a kept HfDeepSpeedConfig, TrainingArguments / a TRL config
    built with deepspeed=."""
    return [c for c in code.calls if (kind(c, code) == "zero_init" and alive(c, code)) or
            (kind(c, code) == "args" and "deepspeed" in c.kwargs)]


def _marker(code: Code, load: Call) -> bool | None:
    """Whether something turns zero.Init on for `load`: a kept HfDeepSpeedConfig, or TrainingArguments / a TRL config
    built with deepspeed=, before it in the same function or at module level (run before the functions are called).
    None where one sits in another function, whose order against the load the code does not show."""
    markers = zero3_markers(code)
    if any((m.scope == load.scope and m.line < load.line) or (not m.scope and load.scope) for m in markers):
        return True
    return None if any(m.scope and m.scope != load.scope for m in markers) else False


def apply_zero_init(draft: Draft, facts: Facts, code: Code) -> None:
    """After hf.py: a model the code loads before anything turns zero.Init on is built whole; the DeepSpeed engine
    then casts the whole module, adapters included, to its fp16/bf16 dtype before partitioning it
    (runtime/engine.py _configure_distributed_model: `self.module.bfloat16()`), so no float32 adapter sits beside
    half-precision weights. With the engine in fp32 the load dtype alone decides."""
    for call in facts.zero_inits:
        if not alive(call, code):
            draft.note(f"{call.at()} is not kept in a variable: transformers holds only a weakref to it, so it is "
                       "collected at once and from_pretrained does not build the model under zero.Init (assign it: "
                       "`dschf = HfDeepSpeedConfig(ds_config)`, kept alive while the model loads)")
    leaves = [c for c in code.calls if c.name == "set_z3_leaf_modules"]
    if leaves:  # the script gathers its MoE blocks whole itself (deepspeed.utils.set_z3_leaf_modules)
        draft.set("moe_leaf_registered", True, f"{leaves[0].at()}: the script registers ZeRO-3 leaf modules")
    source = draft.sources.get("mixed_param_dtypes", "")
    if not (draft.get("engine") == "deepspeed" and draft.get("zero_stage") == 3) or draft.get("quantization") or \
            not (source.startswith(_HALF_INIT) or "autocast_adapter_dtype" in source):
        return
    if not draft.sources.get("engine", "").startswith(code.file + ":"):
        return  # the config comes from the launch line or a file: its TrainingArguments are parsed, when not visible
    loads = [c for c in facts.loads if kind(c, code) == "load" and code.always_runs(c)
             and (not facts.trained_at or c.line < facts.trained_at)]
    if not loads or _marker(code, loads[0]) is not False:
        return
    load = loads[0]
    built = (f"{load.at()} runs before any HfDeepSpeedConfig or TrainingArguments(deepspeed=...) exists: no zero.Init, "
             "the model is built whole")
    if draft.get("precision") in ("bf16-mixed", "fp16-mixed"):
        draft.set("mixed_param_dtypes", False, f"{built}, and the DeepSpeed engine casts the whole module, adapters "
                  "included, to its half dtype before partitioning it (runtime/engine.py _configure_distributed_model)")
        return
    dtype = str(load.kwargs.get("torch_dtype", load.kwargs.get("dtype")))
    draft.set("mixed_param_dtypes", False, f"{built} in the dtype it is loaded in")
    trainer_dtypes(draft, dtype in ("bfloat16", "float16"), load.at("torch_dtype" if "torch_dtype" in load.kwargs
                                                                    else "dtype"))
