"""The DeepSpeed JSON of a run: built from loraflow's config, or a user's JSON checked against it.

loraflow owns the optimizer (AdamW from train.*), the schedule, the batch arithmetic and precision (autocast and
storage dtypes from the plan), so a user JSON may tune ZeRO (buckets, thresholds, offload, overlap) but must not
contradict those: `auto` values are filled in, contradictions are errors naming both keys. The plan reads the
settings once (plan.deepspeed, so `loraflow check` sees the stage and offload); the engine builds its JSON from them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loraflow.errors import ConfigError

OWNED_SECTIONS = {
    "optimizer": "train.learning_rate, train.adam_betas and train.weight_decay (loraflow's AdamW)",
    "scheduler": "train.schedule and train.warmup_steps",
    "fp16": "precision.mode",
    "bf16": "precision.mode",
    "amp": "precision.mode",
    "torch_autocast": "precision.mode",
}


@dataclass
class DeepSpeedSettings:
    stage: int
    offload_optimizer: bool
    offload_params: bool
    source: str
    """Where the stage and offload came from, for the plan's reasons."""
    user: dict[str, Any] = field(default_factory=dict)
    """The user's JSON (empty without one)."""


def _read(path: str) -> dict[str, Any]:
    from loraflow.locations import location_of

    resolved = Path(location_of(path, "parallel.deepspeed_config"))
    try:
        data = json.loads(resolved.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError([f"parallel.deepspeed_config={path}: cannot read it as JSON ({exc})."]) from None
    if not isinstance(data, dict):
        raise ConfigError([f"parallel.deepspeed_config={path} must hold a JSON object."])
    return data


def _offload_device(zero: dict, key: str) -> bool | None:
    """True/False for cpu/none, None when absent or auto."""
    section = zero.get(key)
    if not isinstance(section, dict) or section.get("device") in (None, "auto"):
        return None
    device = section["device"]
    if device not in ("cpu", "none"):
        raise ConfigError([f"parallel.deepspeed_config: zero_optimization.{key}.device={device!r}; loraflow runs "
                           "offload to `cpu` only (NVMe offload is not supported yet)."])
    return device == "cpu"


def deepspeed_settings(parallel) -> DeepSpeedSettings:
    """Stage and offload from parallel.* and the user's JSON; a contradiction is a ConfigError."""
    user = _read(parallel.deepspeed_config) if parallel.deepspeed_config else {}
    zero = user.get("zero_optimization", {}) or {}
    problems = []
    for section, owner in OWNED_SECTIONS.items():
        value = user.get(section)
        switchable = section not in ("optimizer", "scheduler")  # a precision section that is off is harmless
        if value is not None and not (switchable and _disabled(value)):
            problems.append(f"parallel.deepspeed_config sets `{section}`, which loraflow decides from {owner}; "
                            f"remove `{section}` from the JSON and set those keys instead.")
    json_stage = zero.get("stage")
    json_stage = None if json_stage == "auto" else json_stage
    stage = parallel.zero_stage if parallel.zero_stage is not None else (json_stage if json_stage is not None else 2)
    if json_stage is not None and parallel.zero_stage is not None and json_stage != parallel.zero_stage:
        problems.append(f"parallel.zero_stage={parallel.zero_stage} contradicts zero_optimization.stage={json_stage} "
                        "in parallel.deepspeed_config; remove one of them.")
    offload = {}
    for key, json_key in (("offload_optimizer", "offload_optimizer"), ("offload_params", "offload_param")):
        asked, in_json = getattr(parallel, key), _offload_device(zero, json_key)
        if asked != "auto" and in_json is not None and (asked == "true") != in_json:
            problems.append(f"parallel.{key}={asked} contradicts zero_optimization.{json_key} in "
                            "parallel.deepspeed_config; remove one of them.")
        offload[key] = (asked == "true") if asked != "auto" else bool(in_json)
    if offload["offload_params"] and stage != 3:
        problems.append(f"parallel.offload_params needs ZeRO stage 3 (the stage is {stage}): only ZeRO-3 "
                        "partitions the weights. Set parallel.zero_stage=3.")
    if offload["offload_optimizer"] and stage == 0:
        problems.append("parallel.offload_optimizer needs ZeRO stage 1 or more (it moves the partitioned "
                        "optimizer state). Set parallel.zero_stage.")
    if user.get("managed_gradient_accumulation") is False:
        problems.append("parallel.deepspeed_config sets managed_gradient_accumulation=false, which makes every "
                        "micro-batch an optimizer step; loraflow accumulates train.gradient_accumulation_steps "
                        "micro-batches itself. Remove the key.")
    if problems:
        raise ConfigError(problems)
    source = "parallel.deepspeed_config" if user else "parallel.*"
    return DeepSpeedSettings(stage, offload["offload_optimizer"], offload["offload_params"], source, user)


def _disabled(section: Any) -> bool:
    return isinstance(section, dict) and section.get("enabled") in (False, "auto")


def _fill(user: dict, key: str, value: Any, ours: str, problems: list[str]) -> None:
    """Put loraflow's value under `key` unless the JSON has the same value (or `auto`)."""
    have = user.get(key, "auto")
    if have != "auto" and have != value:
        problems.append(f"parallel.deepspeed_config: {key}={have} contradicts {ours} (= {value}); remove {key} "
                        "from the JSON or make them agree.")
    user[key] = value


def build_config(config, settings: DeepSpeedSettings, world_size: int) -> dict[str, Any]:
    """The dict passed to deepspeed.initialize."""
    t = config.train
    ds = json.loads(json.dumps(settings.user))  # a deep copy
    problems: list[str] = []
    for section in ("fp16", "bf16", "amp", "torch_autocast"):
        ds.pop(section, None)  # only disabled or auto ones reach here; precision is the plan's
    _fill(ds, "train_micro_batch_size_per_gpu", t.micro_batch_size, "train.micro_batch_size", problems)
    _fill(ds, "gradient_accumulation_steps", t.gradient_accumulation_steps, "train.gradient_accumulation_steps",
          problems)
    _fill(ds, "train_batch_size", t.micro_batch_size * t.gradient_accumulation_steps * world_size,
          "train.micro_batch_size x train.gradient_accumulation_steps x processes", problems)
    _fill(ds, "gradient_clipping", float(t.max_grad_norm), "train.max_grad_norm", problems)
    if problems:
        raise ConfigError(problems)
    zero = ds.setdefault("zero_optimization", {})
    zero["stage"] = settings.stage
    for key, on in (("offload_optimizer", settings.offload_optimizer), ("offload_param", settings.offload_params)):
        section = zero.setdefault(key, {}) if on else zero.pop(key, None)
        if on:
            section["device"] = "cpu"
    for key, value in list(zero.items()):
        if value == "auto":  # the HF integration's `auto` bucket sizes; DeepSpeed's own defaults apply
            del zero[key]
    # A torch optimizer: no DeepSpeed op to compile, and the same AdamW as the single-process reference.
    ds["zero_allow_untested_optimizer"] = True
    ds["zero_force_ds_cpu_optimizer"] = False
    ds.setdefault("steps_per_print", 10**9)  # loraflow logs its own metrics
    ds.setdefault("wall_clock_breakdown", False)
    return ds
