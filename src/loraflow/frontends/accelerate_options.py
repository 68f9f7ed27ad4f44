"""What `accelerate launch` brings to a run, read once for every frontend whose launches go through it: its config
file (given, or a framework's shipped one inferred from its name), its command-line options, and the FSDP options
both carry (accelerate/commands/config/config_args.py, accelerate/commands/launch.py)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from loraflow.frontends import keys
from loraflow.frontends.argv import Command, resolve_path
from loraflow.frontends.trainer_checkpoints import state_dict_type
from loraflow.frontends.common import (
    OFFLOAD_IN_NAME,
    STAGE_IN_NAME,
    Draft,
    as_bool,
    at_least,
    int_value,
    load_mapping,
    mapping_value,
)

# Accelerate configs shipped by the frameworks, inferred when the named file is not on this machine:
# trl trl/accelerate_configs/*.yaml (also examples/accelerate_configs/), LLaMA-Factory examples/accelerate/*.yaml.
_ACCELERATE_KNOWN = {
    "zero1": {"distributed_type": "DEEPSPEED", "deepspeed_config": {"zero_stage": 1}},
    "zero2": {"distributed_type": "DEEPSPEED", "deepspeed_config": {"zero_stage": 2}},
    "zero3": {"distributed_type": "DEEPSPEED", "deepspeed_config": {"zero_stage": 3, "zero3_save_16bit_model": True}},
    "fsdp1": {"distributed_type": "FSDP", "fsdp_config": {"fsdp_version": 1, "fsdp_use_orig_params": True}},
    "fsdp2": {"distributed_type": "FSDP", "fsdp_config": {"fsdp_version": 2}},
    "multi_gpu": {"distributed_type": "MULTI_GPU"},
    "single_gpu": {"distributed_type": "NO"},
    "fsdp_config": {"distributed_type": "FSDP", "num_processes": 2, "fsdp_config": {"fsdp_use_orig_params": True}},
    "fsdp2_config": {"distributed_type": "FSDP", "num_processes": 2, "fsdp_config": {"fsdp_version": 2}},
    "fsdp_config_offload": {"distributed_type": "FSDP", "num_processes": 2,
                            "fsdp_config": {"fsdp_use_orig_params": True, "fsdp_offload_params": True}},
}
for _name in ("zero1", "zero2", "zero3"):
    _ACCELERATE_KNOWN[f"deepspeed_{_name}"] = _ACCELERATE_KNOWN[_name]
for _cfg in _ACCELERATE_KNOWN.values():
    _cfg.setdefault("mixed_precision", "bf16")
    _cfg.setdefault("num_processes", 8)


UNSEEN = "UNSEEN"
"""loraflow's distributed_type for a config file that is not here and whose name says nothing of the engine."""
# What such a file may select, each read as the named file would be (check builds the setup once per entry).
ENGINE_CHOICES = {
    "ddp": ({"distributed_type": "MULTI_GPU"}, "selects DDP (MULTI_GPU)"),
    "zero2": ({"distributed_type": "DEEPSPEED", "deepspeed_config": {"zero_stage": 2}}, "selects DeepSpeed ZeRO-2"),
    "zero3": ({"distributed_type": "DEEPSPEED", "deepspeed_config": {"zero_stage": 3}}, "selects DeepSpeed ZeRO-3"),
    "fsdp1": ({"distributed_type": "FSDP", "fsdp_config": {}}, "selects FSDP (fsdp_version 1)"),
    "fsdp2": ({"distributed_type": "FSDP", "fsdp_config": {"fsdp_version": 2}}, "selects FSDP2 (fsdp_version 2)"),
}


_ENGINE_FLAGS = ("use_deepspeed", "use_fsdp", "multi_gpu", "cpu", "use_megatron_lm", "use_xpu")
"""`accelerate launch` flags that choose the engine themselves, whatever a config file says."""


def default_config_path() -> Path:
    """Where `accelerate config` writes the machine's default config and `accelerate launch` reads it without
    --config_file (accelerate/commands/config/config_args.py: $HF_HOME, else $XDG_CACHE_HOME/huggingface, else
    ~/.cache/huggingface; then accelerate/default_config.yaml)."""
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "accelerate" / "default_config.yaml"


def _default_config(draft: Draft, cmd: Command) -> tuple[dict[str, Any], str]:
    """`accelerate launch` without --config_file or an engine flag: the machine's default config, read here when this
    machine has one (check runs where the run does, as it reads the installed packages); with none, accelerate runs
    one process per GPU under DDP (commands/launch.py _validate_launch_command), and how many GPUs is the question."""
    path = default_config_path()
    if path.is_file():
        draft.note(f"accelerate launch without --config_file reads {path}, this machine's default config: read here "
                   "(pass --config_file to check another)")
        return load_mapping(path, "accelerate default config"), f"{path} (this machine's default accelerate config)"
    draft.note(f"accelerate launch without --config_file and no default config on this machine ({path}): "
               "accelerate runs one process per GPU, under DDP when there are several")
    if cmd.world_size is None and not cmd.launcher_value("num_processes"):
        cmd.hidden_launcher_options.append("accelerate's --num_processes, one per GPU of the machine")
    return {}, ""


def read_accelerate_config(name: str, flag: str, bases: tuple = ()) -> tuple[dict[str, Any], str]:
    path = resolve_path(name, *bases)
    if path is not None:
        return load_mapping(path, f"accelerate config ({flag})"), str(path)
    stem = Path(name).name.removesuffix(".yaml").removesuffix(".yml")
    if stem in _ACCELERATE_KNOWN:
        origin = (f"LLaMA-Factory examples/accelerate/{stem}.yaml" if stem.startswith("fsdp_config") or stem ==
                  "fsdp2_config" else f"trl examples/accelerate_configs/{stem}.yaml" if stem.startswith("deepspeed_")
                  else f"trl trl/accelerate_configs/{stem}.yaml")
        return dict(_ACCELERATE_KNOWN[stem]), f"{name} (inferred: {origin} as shipped)"
    config, said = _accelerate_from_name(stem)
    if config is None:
        # The launch is still checked: the engine the file selects becomes the open question (apply_accelerate).
        return {"distributed_type": UNSEEN}, f"{name} (not here; its name does not say the engine)"
    return config, f"{name} (inferred from its name: {said})"


def _accelerate_from_name(stem: str) -> tuple[dict[str, Any] | None, str]:
    """An accelerate config read from a missing file's name (`deepspeed_config_z3_qlora`, `fsdp_config`,
    `multi_gpu`): the distributed type and what else the name says; nothing else is assumed."""
    low = stem.lower()
    config: dict[str, Any] = {}
    if "deepspeed" in low or re.search(r"(?<![a-z])(ds|zero)", low):
        config["distributed_type"] = "DEEPSPEED"
        m = STAGE_IN_NAME.search(low)
        if m:
            config["deepspeed_config"] = {"zero_stage": int(next(g for g in m.groups() if g is not None))}
        if OFFLOAD_IN_NAME.search(low):
            config.setdefault("deepspeed_config", {})["offload_optimizer_device"] = "cpu"
    elif "fsdp" in low:
        config["distributed_type"] = "FSDP"
        config["fsdp_config"] = {"fsdp_version": 2} if "fsdp2" in low else {}
    elif re.search(r"multi[_-]?gpu|ddp", low):
        config["distributed_type"] = "MULTI_GPU"
    elif re.search(r"single|one[_-]?gpu", low):
        config["distributed_type"] = "NO"
    else:
        return None, ""
    said = config["distributed_type"].lower()
    if "deepspeed_config" in config and "zero_stage" in config["deepspeed_config"]:
        said += f" ZeRO-{config['deepspeed_config']['zero_stage']}"
    return config, said


def apply_accelerate(draft: Draft, cmd: Command, bases: tuple = ()) -> dict[str, Any]:
    """`accelerate launch` config file and flags -> engine, world size, mixed precision. Returns what the caller
    still needs: the DeepSpeed JSON named inside (`deepspeed_config_file`) and zero3_save_16bit_model."""
    out: dict[str, Any] = {}
    config: dict[str, Any] = {}
    label = ""
    name = cmd.launcher_value("config_file")
    if name:
        config, label = read_accelerate_config(name, "--config_file", bases)
        config = _process_config(draft, config, label)
    elif cmd.launcher == "accelerate" and not any(cmd.launcher_value(f) for f in _ENGINE_FLAGS):
        config, label = _default_config(draft, cmd)
    flag = cmd.launcher_value
    if config.get("distributed_type") == UNSEEN:
        why = f"--config_file {name}: the file is not here, and its name does not say which engine it selects"
        chosen = draft.fork("accelerate_config", {e: f"{name} {said}" for e, (_, said) in ENGINE_CHOICES.items()},
                            why)
        config = {k: (dict(v) if isinstance(v, dict) else v) for k, v in ENGINE_CHOICES[chosen][0].items()}
        draft.note(f"{why}: each engine is evaluated. Run from the directory the path is relative to, or give the "
                   "file, to check the engine it selects")
        if cmd.world_size is None and not flag("num_processes"):  # its num_processes is unseen too (finish_world)
            cmd.hidden_launcher_options.append(f"--config_file {name}")
    dtype = str(config.get("distributed_type", "")).upper()
    if flag("use_deepspeed") or dtype == "DEEPSPEED":
        ds = mapping_value(config.get("deepspeed_config"), f"{label}: deepspeed_config")
        for key in ds:
            if key not in keys.ACCELERATE_DEEPSPEED:
                draft.unknown.append(f"{label}: deepspeed_config.{key}")
        src = "--use_deepspeed" if flag("use_deepspeed") else f"{label}: distributed_type"
        draft.set("engine", "deepspeed", src)
        stage = flag("zero_stage") or ds.get("zero_stage")
        if stage is not None:
            where = f"--zero_stage {stage}" if flag("zero_stage") else f"{label}: deepspeed_config.zero_stage"
            draft.set("zero_stage", int_value(stage, where, "a ZeRO stage", (0, 1, 2, 3)), where)
        elif "(inferred" in label and not (flag("deepspeed_config_file") or ds.get("deepspeed_config_file")):
            draft.maybe("zero_stage", {n: f"the accelerate config sets ZeRO stage {n}" for n in (0, 1, 2, 3)},
                        f"{label}: the file is not here and its name gives no stage")
        devices = [flag("offload_optimizer_device") or ds.get("offload_optimizer_device"),
                   flag("offload_param_device") or ds.get("offload_param_device")]
        if any(d not in (None, "none") for d in devices):
            draft.set("offload", True, f"{label or 'accelerate launch'}: offload_*_device")
        out["deepspeed_config_file"] = flag("deepspeed_config_file") or ds.get("deepspeed_config_file")
        # A script's --deepspeed JSON meets them too; a file guessed from its name alone says nothing of its fields.
        out["ds_fields_from_config"] = [] if "(inferred from its name" in label else _ds_fields(ds, config, flag)
        out["config_label"] = label
        if out["deepspeed_config_file"]:
            refuse_ds_fields(draft, out["ds_fields_from_config"], label, f"deepspeed_config_file "
                             f"{out['deepspeed_config_file']}")
        save16 = flag("zero3_save_16bit_model") or ds.get("zero3_save_16bit_model")
        out["zero3_save_16bit_model"] = None if save16 is None else as_bool(save16, "zero3_save_16bit_model")
    elif flag("use_fsdp") or dtype == "FSDP":
        fsdp = {str(k).removeprefix("fsdp_"): v for k, v in
                mapping_value(config.get("fsdp_config"), f"{label}: fsdp_config").items()}
        version = int_value(flag("fsdp_version") or fsdp.get("version") or 1, "--fsdp_version" if flag("fsdp_version")
                            else f"{label}: fsdp_config.fsdp_version", "an FSDP version", (1, 2))
        draft.set("engine", "fsdp2" if version == 2 else "fsdp1", f"{label or 'accelerate launch'}: fsdp_version")
        apply_fsdp_options(draft, fsdp, label or "accelerate launch", flag)
    elif flag("multi_gpu") or dtype == "MULTI_GPU":
        draft.set("engine", "ddp", "--multi_gpu" if flag("multi_gpu") else f"{label}: distributed_type")
    elif flag("use_megatron_lm") or dtype == "MEGATRON_LM":  # its tensor/pipeline sharding is no engine loraflow has
        draft.unknown.append(f"{label or 'accelerate launch'}: Megatron-LM (distributed_type MEGATRON_LM) is not "
                             "modelled; the setup is read as data-parallel, so findings that depend on sharding "
                             "hold open")
    parallel = mapping_value(config.get("parallelism_config"), f"{label}: parallelism_config")
    cp = parallel.get("parallelism_config_cp_size", parallel.get("cp_size"))
    if cp is not None and int_value(cp, f"{label}: parallelism_config_cp_size", "a context-parallel size") > 1:
        draft.set("sequence_parallel", True, f"{label}: parallelism_config_cp_size {cp} (context parallelism)")
    mp = flag("mixed_precision") or config.get("mixed_precision")
    if mp not in (None, "no"):
        out["mixed_precision"] = _autocast_dtype(draft, str(mp), "--mixed_precision" if flag("mixed_precision")
                                                 else f"{label}: mixed_precision")
    procs = config.get("num_processes")
    if cmd.world_size is None and procs:
        machines = int_value(config.get("num_machines") or 1, f"{label}: num_machines", "a number of machines")
        cmd.world_size = int_value(procs, f"{label}: num_processes", "a number of processes")
        cmd.world_source = f"{label}: num_processes"
        if machines > 1:
            cmd.world_source += f" (over {machines} machines)"
    return out


# What accelerate refuses beside a DeepSpeed JSON: the settings the JSON owns, when the accelerate config file sets them
# (accelerate utils/dataclasses.py DeepSpeedPlugin._deepspeed_config_checks, PR #941, accelerate 0.16.0; launch.py
# passes the config's deepspeed_config keys, and mixed_precision when it comes from the file, not from the flag).
_OWNED_BY_JSON = ("gradient_accumulation_steps", "gradient_clipping", "zero_stage", "offload_optimizer_device",
                  "offload_param_device", "offload_param_nvme_path", "offload_optimizer_nvme_path",
                  "zero3_save_16bit_model", "mixed_precision")


def _ds_fields(ds: dict[str, Any], config: dict[str, Any], flag) -> list[str]:
    """The accelerate config's settings that a DeepSpeed JSON (its deepspeed_config_file, or the HF Trainer's
    --deepspeed) would clash with."""
    fields = [str(k) for k in ds if str(k).lower() in _OWNED_BY_JSON]
    if config.get("mixed_precision") is not None and not flag("mixed_precision"):
        fields.append("mixed_precision")
    return fields


def refuse_beside(draft: Draft, acc: dict[str, Any], json_from: str) -> None:
    """The script's own DeepSpeed JSON (`--deepspeed ds.json`) under `accelerate launch` with an accelerate config
    that sets DeepSpeed fields itself: the HF Trainer hands the JSON to the same plugin, which refuses the pair (said
    once: a config with its own deepspeed_config_file was refused for it already)."""
    if acc.get("deepspeed_config_file"):
        return
    refuse_ds_fields(draft, acc.get("ds_fields_from_config", []), acc.get("config_label", ""), json_from)


def refuse_ds_fields(draft: Draft, fields: list[str], label: str, json_from: str) -> None:
    """A DeepSpeed JSON beside an accelerate config that also sets what the JSON owns: accelerate >= 0.16.0 stops
    when the plugin is built ("When using `deepspeed_config_file`, the following accelerate config variables will be
    ignored"). `json_from`: where the JSON comes from (the config's deepspeed_config_file, or the script's --deepspeed,
    which the HF Trainer hands to the same plugin)."""
    if not fields or not at_least(draft, "accelerate", "0.16.0"):
        return
    draft.stop(f"{label}: {', '.join(fields)} beside {json_from}: accelerate refuses the run (\"When using "
               "`deepspeed_config_file`, the following accelerate config variables will be ignored\", "
               "DeepSpeedPlugin._deepspeed_config_checks); remove them from the accelerate config and set them in "
               "the DeepSpeed JSON")


def _process_config(draft: Draft, config: dict[str, Any], label: str) -> dict[str, Any]:
    """The file as `accelerate launch` loads it (commands/config/config_args.py BaseConfig.process_config, then
    from_yaml_file): the older top-level spellings converted - `fp16: true` is mixed_precision fp16 when that key is
    absent, `dynamo_backend: X` is dynamo_config - and any other key the config dataclass lacks refused."""
    config = dict(config)
    if "fp16" in config:
        legacy = config.pop("fp16")
        if "mixed_precision" not in config and legacy is not None and as_bool(legacy, f"{label}: fp16"):
            config["mixed_precision"] = "fp16"
            draft.note(f"{label}: fp16: true is the older spelling of mixed_precision: fp16 (accelerate converts it)")
    if "dynamo_backend" in config:
        backend = config.pop("dynamo_backend")
        config.setdefault("dynamo_config", {} if str(backend).upper() == "NO" else {"dynamo_backend": backend})
    strange = [str(key) for key in config if key not in keys.ACCELERATE_TOP]
    draft.unknown.extend(f"{label}: {key}" for key in strange)
    if strange:
        draft.note(f"{label}: accelerate launch refuses a config file with top-level keys its config dataclass lacks "
                   f"(\"had unknown keys\"): {', '.join(strange)}; remove them, or upgrade accelerate where one is a "
                   "newer key")
    return config


def _autocast_dtype(draft: Draft, mp: str, where: str) -> str:
    """mixed_precision as the engines see it. fp8 runs its fp8 layers (Transformer Engine, torchao or MS-AMP) inside
    a bf16 autocast, and the DeepSpeed and FSDP plugins read it as bf16 (accelerate utils/modeling.py
    get_mixed_precision_context_manager; utils/dataclasses.py DeepSpeedPlugin.set_mixed_precision, "bf16.enabled":
    mixed_precision in ("bf16", "fp8")): what composes with the memory savers is the bf16 part."""
    if mp.lower() != "fp8":
        return mp
    draft.note(f"{where} fp8: read as bf16 mixed precision (accelerate autocasts to bf16 around the fp8 layers and "
               "gives DeepSpeed/FSDP bf16); the fp8 layer conversion itself is not modelled")
    return "bf16"


def apply_fsdp_options(draft: Draft, options: dict[str, Any], label: str, flag=lambda *a: None) -> None:
    """FSDP options, keys without their `fsdp_` prefix (accelerate and the HF Trainer accept both spellings)."""
    def opt(key: str):
        value = flag(f"fsdp_{key}")
        return value if value is not None else options.get(key)

    if opt("offload_params") is not None and as_bool(opt("offload_params"), f"{label}: offload_params"):
        draft.set("offload", True, f"{label}: offload_params")
    if opt("use_orig_params") is not None:
        draft.set("fsdp_use_orig_params", as_bool(opt("use_orig_params"), "use_orig_params"),
                  f"{label}: use_orig_params")
    else:
        # accelerate launch passes FSDP_USE_ORIG_PARAMS from --fsdp_use_orig_params, default "true" (accelerate
        # src/accelerate/commands/launch.py); the plugin itself reads it with default "False" (utils/dataclasses.py).
        draft.default("fsdp_use_orig_params", True, "accelerate launch --fsdp_use_orig_params default true "
                      "(commands/launch.py)")
    state_dict_type(draft, opt("state_dict_type"), f"{label}: state_dict_type")
    if opt("activation_checkpointing") is not None and as_bool(opt("activation_checkpointing"), label):
        # accelerate wraps each layer in torch's checkpoint_wrapper (CheckpointImpl.NO_REENTRANT), before
        # fully_shard for FSDP2 (accelerate accelerator.py, utils/fsdp_utils.py fsdp2_apply_ac): inside the unit.
        source = f"{label}: activation_checkpointing"
        draft.set("checkpointing", "all", source)
        draft.set("checkpoint_impl", "torch-wrapper", source)
        draft.set("reentrant", False, source + " (checkpoint_wrapper is non-reentrant)")
        draft.set("checkpoint_outside_shard", False, source + " (applied before fully_shard)")
