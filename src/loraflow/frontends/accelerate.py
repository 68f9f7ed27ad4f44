"""accelerate's own config file, given alone: `loraflow check accel.yaml` or `--framework accelerate accel.yaml` (the
YAML `accelerate config` writes and `accelerate launch --config_file` reads; keys from accelerate
src/accelerate/commands/config/config_args.py and utils/dataclasses.py). A DeepSpeed JSON may come beside it.

The file is read by the same code that reads it beside a launch line (accelerate_options.apply_accelerate: engine,
ZeRO stage, offload, FSDP options, mixed precision, processes). It says nothing of the training script, so what only
the script decides - the stage (read as SFT), whether it trains an adapter, on a 4-bit base or not, whether it
checkpoints and how - is evaluated both ways: a finding then says under which of these it holds. The engine facts
decide the rest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loraflow.errors import LoraflowError
from loraflow.frontends import deepspeed, keys
from loraflow.frontends.argv import Arg, Command
from loraflow.frontends.base import Framework, FrontendResult
from loraflow.frontends.accelerate_options import apply_accelerate
from loraflow.frontends.common import Draft, finish_world, load_mapping, mapping_value, precision_from

NAME = "accelerate"
# Keys only accelerate's config file has: how `loraflow check FILE` recognises one (base.Framework.file_markers).
MARKERS = frozenset({"distributed_type", "compute_environment"})
FLAGS = {"engine": "distributed_type", "zero_stage": "deepspeed_config.zero_stage",
         "fsdp_state_dict": "fsdp_config.fsdp_state_dict_type",
         "offload": "deepspeed_config.offload_optimizer_device / fsdp_config.fsdp_offload_params",
         "fsdp_use_orig_params": "fsdp_config.fsdp_use_orig_params", "precision": "mixed_precision",
         "checkpointing": "fsdp_config.fsdp_activation_checkpointing (or the script's gradient checkpointing)",
         "world_size": "num_processes", "sequence_parallel": "parallelism_config.parallelism_config_cp_size",
         "adapter_save_gather": "deepspeed_config.zero3_save_16bit_model"}
# What the training script decides and the config cannot show: each is evaluated both ways (Draft.maybe). The
# k-bit and dtype choices only where they meet the engine (they would otherwise add findings about the script alone).
_ADAPTER = ({"lora": "the script trains a LoRA adapter on a frozen base", "full": "the script trains every weight"},
            "an accelerate config does not say what the script trains")
_CHECKPOINTING = ({"off": "the script does not checkpoint activations", "all": "the script turns on gradient "
                   "checkpointing"}, "gradient checkpointing is the script's (or its TrainingArguments')")
_REENTRANT = ({True: "checkpointing is reentrant (transformers < 5 default)", False: "checkpointing is non-reentrant "
               "(use_reentrant=False)"}, "use_reentrant is the script's")
_QUANTIZATION = ({None: "the base is not quantized", "4bit": "the script loads a 4-bit (bitsandbytes) base"},
                 "whether the script quantizes the base is in its code")
_STORAGE = ({True: "bnb_4bit_quant_storage is the dtype the engine shards", False: "bnb_4bit_quant_storage is left "
             "unset (packed uint8)"}, "the 4-bit storage dtype is the script's BitsAndBytesConfig")
# Only where the config itself checkpoints through torch's checkpoint_wrapper (fsdp_activation_checkpointing): the KV
# cache is then the script's to turn off (TRL passes use_cache=False; a plain script keeps the model config's True).
_USE_CACHE = ({True: "the script leaves use_cache on (the model config's default)", False: "the script trains with "
               "use_cache=False (TRL's trainers pass it)"}, "whether the training forward builds a KV cache is the "
              "script's (model.config.use_cache)")
_ADAPTER_DTYPE = ({False: "adapters are stored in the base's dtype", True: "float32 adapters beside a bf16/fp16 base "
                   "(the script loads the base in half precision; peft >= 0.12 keeps adapters in float32)"},
                  "the dtype the script loads the model in")


def _load_dtype(mp: str) -> tuple[dict, str]:
    """mixed_precision autocasts over weights the script loaded: in float32 (`-mixed`) or already in half precision
    (the trainable weights then stored in fp16/bf16)."""
    return ({f"{mp}-mixed": f"the script loads the model in float32 (accelerate autocasts to {mp})",
             mp: f"the script loads the model in {mp} (torch_dtype), so trainable weights are stored in {mp}"},
            "the dtype the script loads the model in")


def _script_choices(draft: Draft, mp: str | None) -> None:
    sharded = draft.get("engine") in ("fsdp1", "fsdp2") or draft.get("zero_stage") == 3
    flat = draft.get("engine") == "fsdp1" or draft.get("zero_stage") == 3
    choices = {"adapter": _ADAPTER, "checkpointing": _CHECKPOINTING, "reentrant": _REENTRANT}
    if sharded:
        choices.update(quantization=_QUANTIZATION, quant_storage_matches=_STORAGE)
    if draft.get("checkpoint_impl") == "torch-wrapper":
        choices["use_cache"] = _USE_CACHE
    if mp in ("bf16", "fp16"):
        choices["precision"] = _load_dtype(mp)
        if flat:
            choices["mixed_param_dtypes"] = _ADAPTER_DTYPE
    for name, (labels, why) in choices.items():
        if not draft.has(name) or name == "precision":
            draft.maybe(name, labels, why)


def _files(paths: list[str]) -> tuple[Command, list[str], list[Path]]:
    """The accelerate config (as `accelerate launch --config_file` names it) and any DeepSpeed JSON beside it."""
    cmd = Command(argv=[], launcher="accelerate", program="(accelerate config alone)")
    ds_files: list[str] = []
    bases: list[Path] = []
    for path in paths:
        data = load_mapping(path, "accelerate config")
        bases.append(Path(path).parent)
        if "zero_optimization" in data:
            ds_files.append(path)
        elif MARKERS & set(map(str, data)):
            if cmd.launcher_value("config_file"):
                raise LoraflowError(f"{path}: a second accelerate config; accelerate launch reads one "
                                    f"(--config_file {cmd.launcher_value('config_file')}).")
            cmd.launcher_args.append(Arg("config_file", path, f"--config_file {path}"))
        else:
            raise LoraflowError(f"{path} is not an accelerate config: it has no distributed_type or "
                                "compute_environment key (what `accelerate config` writes). Pass the launch command "
                                "after `--`, or name its framework with --framework.")
    if not cmd.launcher_value("config_file"):
        raise LoraflowError("--framework accelerate needs the accelerate config YAML (`accelerate config` writes "
                            "it to ~/.cache/huggingface/accelerate/default_config.yaml).")
    return cmd, ds_files, bases


def _fsdp_keys(draft: Draft, config: dict[str, Any], label: str) -> None:
    """fsdp_config keys accelerate would not know (apply_accelerate checks the top level and deepspeed_config)."""
    for key in mapping_value(config.get("fsdp_config"), f"{label}: fsdp_config"):
        if key not in keys.ACCELERATE_FSDP:
            draft.unknown.append(f"{label}: fsdp_config.{key}")


def _deepspeed(draft: Draft, acc: dict[str, Any], ds_files: list[str], bases: list[Path]) -> None:
    """A DeepSpeed JSON given beside the config, or the one its deepspeed_config_file names, decides the ZeRO
    settings and the save gather."""
    ref = ds_files[-1] if ds_files else acc.get("deepspeed_config_file")
    if ref:
        ds = deepspeed.read(ref, "deepspeed_config_file", tuple(bases))
        info = deepspeed.apply(draft, ds)
        deepspeed.resolve_precision(draft, info, ds.label, acc.get("mixed_precision") == "bf16",
                                    acc.get("mixed_precision") == "fp16", "mixed_precision", trainer=False)
        gather = deepspeed.gather_on_save(draft, info)
        draft.set("adapter_save_gather", gather, f"{ds.label}: {info['gather_key']}")
    elif draft.get("engine") == "deepspeed" and acc.get("zero3_save_16bit_model") is not None:
        draft.set("adapter_save_gather", bool(acc["zero3_save_16bit_model"]), "deepspeed_config.zero3_save_16bit_model")


def from_files(paths: list[str], versions: dict) -> FrontendResult:
    draft = Draft(NAME, versions)
    cmd, ds_files, bases = _files(paths)
    label = cmd.launcher_value("config_file")
    acc = apply_accelerate(draft, cmd, tuple(bases))
    _fsdp_keys(draft, load_mapping(label, "accelerate config"), label)
    _deepspeed(draft, acc, ds_files, bases)
    if not draft.has("precision"):
        mp = acc.get("mixed_precision")
        draft.set("precision", precision_from(mp == "bf16", mp == "fp16"), f"{label}: mixed_precision "
                  f"{mp or 'no'}" + ("" if mp in ("bf16", "fp16", None) else " (not bf16/fp16: read as fp32)"))
    draft.set("stage", "sft", "assumed: an accelerate config does not say what the script trains")
    draft.note("an accelerate config alone: the stage is read as SFT, and what the script decides (adapter, 4-bit "
               "base, checkpointing) is evaluated both ways; pass the launch command after `--` for the full picture")
    _script_choices(draft, acc.get("mixed_precision"))
    draft.flag(**FLAGS)
    finish_world(draft, cmd)
    return draft.result()


def from_command(cmd: Command, versions: dict) -> FrontendResult:
    """`--framework accelerate -- accelerate launch train.py ...`: the script is read as the HF Trainer frontend
    reads it (it reads the accelerate config named on the line too)."""
    from loraflow.frontends import hf

    return hf.from_command(cmd, versions)


FRAMEWORK = Framework(name=NAME, title="accelerate config", module="accelerate", recognise=None, flags=FLAGS,
                      file_markers=MARKERS)
