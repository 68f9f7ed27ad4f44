"""Where a training script's loads put the model, once the launch's process count is known: one device for every
rank (a k-bit model accelerate then refuses to train on another rank's device), or spread over every GPU the process
sees (device_map 'auto': naive model parallelism, which no multi-process launch can train)."""

from __future__ import annotations

from typing import Any

from loraflow.frontends.common import Draft
from loraflow.frontends.script_code import Call
from loraflow.frontends.script_dicts import computed, fixed_device
from loraflow.frontends.script_facts import kind
from loraflow.frontends.script_lineage import bits_of
from loraflow.frontends.script_zero_init import _marker, zero3_markers

SPREADS = ("auto", "balanced", "balanced_low_0")
"""The device_map strings that spread a model over every GPU its process sees (transformers passes them to
accelerate's get_balanced_memory / infer_auto_device_map); "sequential" fills the first GPU before the next, so it
spreads only a model that does not fit one."""


def spreads(where: Any) -> bool:
    """A device_map that puts the model's layers on several GPUs when the process sees several: a spreading
    strategy, or a literal map naming more than one device."""
    if isinstance(where, dict):
        return not computed(where) and len({str(v) for v in where.values()}) > 1
    return where in SPREADS


def placement(draft: Draft, script) -> None:
    """Both readings of the script's loads, in a multi-process launch and in one process."""
    _per_rank(draft, script)
    _spread(draft, script)
    _big_model_load(draft, script)


def _per_rank(draft: Draft, script) -> None:
    """A k-bit model loaded on a fixed device in a multi-process launch: accelerate refuses to train it on another
    rank's device (accelerator.py prepare_model). Unsloth places each rank's copy itself (loader.py)."""
    if draft.get("world_size") <= 1:
        return
    for load in script.facts.loads:
        where = load.kwargs.get("device_map")
        if (fixed_device(where) and not spreads(where) and kind(load, script.code) == "load"
                and bits_of(load, script.code) in ("4bit", "8bit")):
            draft.set("quantized_moved", True, f"{load.at('device_map')} in a {draft.get('world_size')}-process "
                      "launch: every rank loads the k-bit model on the same device")


def _spread(draft: Draft, script) -> None:
    """device_map='auto' spreads the model over the GPUs its process sees. torchrun, accelerate and deepspeed show
    every process every GPU of the node, so in a multi-process launch each copy is spread; in one process it is
    spread only where several GPUs are visible, which the script does not show."""
    load = next((c for c in script.facts.loads if isinstance(c, Call) and spreads(c.kwargs.get("device_map"))
                 and kind(c, script.code) in ("load", "unsloth_load")), None)
    if load is None:
        return
    where = load.at("device_map")
    if isinstance(load.kwargs["device_map"], dict):
        draft.set("model_split", True, f"{where}: a device map naming several devices")
    elif draft.get("world_size") > 1 and "world_size" not in draft.unsure:
        draft.set("model_split", True, f"{where} in a {draft.get('world_size')}-process launch: every process sees "
                  "every GPU of the node and spreads its copy over them")
    else:
        draft.maybe("model_split", {True: f"the process sees several GPUs: {where} spreads the model over them",
                                    False: "the process sees one GPU: the whole model goes on it"},
                    f"{where}: how many GPUs the process sees is not in the launch")


def _big_model_load(draft: Draft, script) -> None:
    """A load given a device_map or low_cpu_mem_usage=True (accelerate's big-model placement), which transformers
    refuses while ZeRO-3 is configured: not a load the code runs before its own TrainingArguments(deepspeed=...) or
    HfDeepSpeedConfig exists (script_zero_init._marker). A computed device_map (`None if
    is_deepspeed_zero3_enabled() else ...`, a variable the code sets) is not read: it is how scripts keep the map out
    of ZeRO-3 launches."""
    code = script.code
    own_config = bool(zero3_markers(code))
    for load in script.facts.loads:
        if not isinstance(load, Call) or kind(load, code) != "load":
            continue
        if own_config and _marker(script.code, load) is False:
            # the script configures ZeRO-3 itself, after this load: transformers sees no ZeRO-3 while it loads
            continue
        where = load.kwargs.get("device_map")
        if (where is not None and not computed(where)) or (isinstance(where, dict) and where):
            draft.set("device_map_load", "device_map", f"{load.at('device_map')}: a device_map for accelerate's "
                      "placement")
            return
        if load.kwargs.get("low_cpu_mem_usage") is True and not draft.has("device_map_load"):
            draft.set("device_map_load", "low_cpu_mem_usage", load.at("low_cpu_mem_usage"))
