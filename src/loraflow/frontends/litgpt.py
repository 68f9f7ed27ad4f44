"""LitGPT (Lightning-AI/litgpt, and lit-gpt before it): `litgpt finetune_lora CHECKPOINT_DIR [--flags]`,
`litgpt finetune lora ...` (its older spelling), `python finetune/lora.py --checkpoint_dir ...` (lit-gpt's scripts) and
`python -m litgpt.finetune.lora ...`. Flags follow jsonargparse: `--precision bf16-true`, `--quantize bnb.nf4`,
`--devices 2`, `--train.micro_batch_size 4`, `--config FILE.yaml` with the same keys.

LitGPT's LoRA is its own (litgpt/lora.py), not PEFT; Lightning Fabric runs the loop. What the finetuning scripts do with
those flags, read at litgpt/finetune/lora.py (v0.5.x, unchanged in substance since lit-gpt's 2023 scripts):
- precision: `--precision` or get_default_supported_precision(training=True): bf16-mixed where the GPU has bfloat16,
  16-mixed where it has not; `*-true` stores every weight, adapters included, in that dtype (Fabric's true precision).
- quantize: `bnb.nf4`/`bnb.nf4-dq`/`bnb.fp4`/`bnb.fp4-dq` (4-bit) or `bnb.int8-training` through Fabric's
  BitsandbytesPrecision, whose dtype is the `*-true` precision; a mixed precision beside it raises ValueError
  ("Quantization and mixed precision is not supported."), and so does the default (bf16-mixed).
- devices > 1: FSDPStrategy(auto_wrap_policy={Block}, activation_checkpointing_policy={Block}) - FSDP1 with
  use_orig_params=True (Fabric's default on torch >= 2.0), each transformer Block one unit holding its frozen weights
  and its adapters, and torch's checkpoint_wrapper (non-reentrant) around every Block; `--quantize` beside it raises
  NotImplementedError. One device: no strategy, no activation checkpointing.
"""

from __future__ import annotations

import re
from pathlib import Path

from loraflow.errors import LoraflowError
from loraflow.frontends.argv import Command, parse_flags, resolve_path, script_command
from loraflow.frontends.base import Framework, FrontendResult
from loraflow.frontends.common import Draft, finish_world, load_mapping
from loraflow.frontends.model_types import model_name_facts

NAME = "litgpt"
SOURCE = "litgpt/finetune/{method}.py"
# The finetuning methods (a `litgpt` subcommand, a script under finetune/) -> the adapter setup they train.
METHODS = {"lora": "lora", "lora_legacy": "lora", "full": "full", "adapter": "adapter", "adapter_v2": "adapter"}
# Subcommands that run no finetuning: named in the error, so the user knows check read the line and why it stops.
NOT_TRAINING = ("generate", "chat", "serve", "evaluate", "download", "convert_to_litgpt", "convert_from_litgpt",
                "convert_pretrained_checkpoint", "merge_lora", "merge", "finetune_adapter_v2_merge")
# Packages of the tracked stack a LitGPT run never imports: their releases' bugs cannot reach it.
NOT_USED = ("peft", "transformers", "accelerate", "deepspeed", "trl")
PRECISIONS = {"16-true": "fp16", "bf16-true": "bf16", "32-true": "fp32", "32": "fp32", "16-mixed": "fp16-mixed",
              "16": "fp16-mixed", "bf16-mixed": "bf16-mixed", "bf16": "bf16-mixed"}
FLAGS = {"precision": "--precision (bf16-true, bf16-mixed, 16-true, 16-mixed, 32-true)",
         "quantization": "--quantize (bnb.nf4, bnb.nf4-dq, bnb.fp4, bnb.int8-training)",
         "world_size": "--devices", "engine": "--devices (more than one: FSDP)",
         "checkpointing": "FSDPStrategy(activation_checkpointing_policy={Block}) in the finetuning script",
         "reentrant": "the finetuning script's FSDPStrategy (torch's checkpoint_wrapper)"}
_SCRIPT = re.compile(r"(?:^|/)(?:litgpt/)?finetune/(" + "|".join(METHODS) + r")\.py$")
# A copy of a finetuning script under a longer name (a public lit-gpt launch: `python finetune/lora_13b.py
# --checkpoint_dir ... --quantize bnb.nf4-dq`), recognised with LitGPT's flags.
_COPY = re.compile(r"(?:^|/)finetune/(lora|full|adapter_v2|adapter)_\w+\.py$")
_OWN_FLAGS = frozenset({"checkpoint_dir", "precision", "quantize", "devices", "out_dir", "data_dir", "lora_r"})


def _method(cmd: Command, draft: Draft) -> tuple[str, str]:
    """(method, how the line names it): the subcommand of `litgpt`, the script's name, or the module's."""
    if cmd.program_kind == "cli":
        sub = cmd.subcommand or ""
        if sub in NOT_TRAINING or sub.startswith(("generate", "chat")):
            raise LoraflowError(f"`litgpt {sub}` runs no finetuning; loraflow check reads `litgpt finetune_lora`, "
                                "`litgpt finetune_full`, `litgpt finetune_adapter` and `litgpt pretrain` lines.")
        if sub == "pretrain":
            return "full", "litgpt pretrain"
        if sub == "finetune":  # `litgpt finetune lora ...` (older), else LoRA: `litgpt finetune` is finetune_lora
            head = cmd.args[0] if cmd.args else ""
            if head in METHODS:
                cmd.args = cmd.args[1:]
                return head, f"litgpt finetune {head}"
            return "lora", "litgpt finetune (LoRA)"
        method = sub.removeprefix("finetune_")
        if method not in METHODS:
            raise LoraflowError(f"`litgpt {sub}`: not a finetuning command loraflow check knows; it reads "
                                f"{', '.join('finetune_' + m for m in METHODS)} and pretrain.")
        return method, f"litgpt {sub}"
    path = cmd.program.replace("\\", "/")
    found = _SCRIPT.search(path) or re.search(r"litgpt\.finetune\.(\w+)$", path)
    copy = None if found else _COPY.search(path)
    if copy is not None:  # `finetune/lora_13b.py`: the user's copy of finetune/lora.py; its code is unseen (exit 1)
        draft.unknown.append(f"{path}: the user's copy of LitGPT's finetune/{copy.group(1)}.py, read as that "
                             "script; its code is not read")
        return copy.group(1), path
    if found is None or found.group(1) not in METHODS:
        raise LoraflowError(f"`{cmd.program}`: loraflow check reads LitGPT's finetuning scripts (finetune/lora.py, "
                            "full.py, adapter.py, adapter_v2.py) and `litgpt finetune_*` lines.")
    return found.group(1), cmd.program


def _options(cmd: Command, draft: Draft) -> tuple[dict[str, tuple[str, str]], list[str]]:
    """Flag -> (value, as written), a `--config` YAML's keys first (flags override them, as jsonargparse does)."""
    args, positionals, _ = parse_flags(cmd.args)
    options: dict[str, tuple[str, str]] = {}
    for a in args:
        if a.name == "config" and a.one():
            path = resolve_path(a.one() or "")
            if path is None and _CONFIG_HUB.search(a.one() or ""):
                options.update(_config_hub(a.one() or "", a.raw, draft, any(b.name == "devices" for b in args)))
                continue
            if path is None:
                # Its keys are unseen (a user's `--config $CFG`): listed as not read, so never clean (exit 1).
                draft.unknown.append(f"{a.raw}: the file is not here; only the flags on the line are read")
                continue
            for key, value in load_mapping(path, "LitGPT config").items():
                if not isinstance(value, dict):
                    options[str(key)] = (str(value), f"{path.name}: {key}")
    for a in args:
        if a.name != "config":
            options[a.name] = (str(a.one()), a.raw)
    # jsonargparse reads `null` (a flag's `--quantize null`, a YAML's empty or null value) as None: the argument's
    # default, as if it were not given (litgpt/finetune/lora.py: quantize None, precision None -> the default).
    return {k: v for k, v in options.items() if v[0] not in _NONE}, positionals


_NONE = ("None", "none", "null", "Null", "NULL", "")


# LitGPT's own configs, run from a clone (`--config config_hub/finetune/gemma-2b/qlora.yaml`, Lightning-AI/litgpt
# issues #1604, PR #1139): every one sets `precision: bf16-true`, each qlora*.yaml `quantize: bnb.nf4`, and the lora
# and qlora ones `devices: 1`; the full ones differ in devices (llama-2-7b/full.yaml: 4).
_CONFIG_HUB = re.compile(r"(?:^|/)config_hub/finetune/([^/]+)/([\w.-]+)\.ya?ml$")


def _config_hub(value: str, raw: str, draft: Draft, devices_given: bool) -> dict[str, tuple[str, str]]:
    """A config_hub file that is not here, read from its name as the shipped file sets it."""
    found = _CONFIG_HUB.search(value)
    assert found is not None
    said = f"{raw} (LitGPT's config_hub file, not here: read from its name)"
    options = {"precision": ("bf16-true", f"{said}: every config_hub file sets precision: bf16-true")}
    if found.group(2).startswith("qlora"):
        options["quantize"] = ("bnb.nf4", f"{said}: its qlora files set quantize: bnb.nf4")
    if found.group(2).startswith(("lora", "qlora")):
        options["devices"] = ("1", f"{said}: its lora and qlora files set devices: 1")
    elif not devices_given:  # the process count decides FSDP and checkpointing: unread, so not called clean (exit 1)
        draft.unknown.append(f"{raw}: devices (set per model in LitGPT's full-finetuning config_hub files; give "
                             "--devices N on the line)")
    draft.note(f"{raw}: read from its name as LitGPT's shipped {found.group(1)}/{found.group(2)}.yaml (run from the "
               "clone that holds it to read the file itself)")
    return options


def _precision(draft: Draft, options: dict, quantized: bool) -> None:
    if "precision" in options:
        value, raw = options["precision"]
        if value not in PRECISIONS:
            draft.unknown.append(f"{raw} (LitGPT precisions: {', '.join(PRECISIONS)})")
            return
        draft.set("precision", PRECISIONS[value], raw)
        if PRECISIONS[value] == "fp16":
            draft.set("grad_scaler", False, f"{raw}: Fabric's true half precision scales no loss")
        if quantized and "mixed" in PRECISIONS[value]:
            draft.note(f"{raw} beside --quantize: LitGPT raises `ValueError: Quantization and mixed precision is not "
                       "supported.` before training; give --precision bf16-true (or 16-true)")
        return
    # A `--config` that is not here may set precision itself (LitGPT's own config_hub files do): only a launch whose
    # whole configuration is visible is told its default fails.
    unseen_config = any(u.startswith("--config") for u in draft.unknown)
    if quantized and not unseen_config:
        draft.note("--quantize without --precision: the default is bf16-mixed, and LitGPT raises `ValueError: "
                   "Quantization and mixed precision is not supported.`; give --precision bf16-true")
    draft.maybe("precision", {"bf16-mixed": "a GPU with bfloat16 (Ampere or later)",
                              "fp16-mixed": "a GPU without bfloat16 (V100, T4)"},
                "no --precision: get_default_supported_precision(training=True) picks by the GPU's bfloat16 support")


def _engine(draft: Draft, options: dict, cmd: Command, quantized: bool) -> None:
    devices = options.get("devices", ("1", "default (devices=1)"))
    value, raw = devices
    nodes = options.get("num_nodes", ("1", ""))[0]
    if cmd.world_size:
        count = cmd.world_size
    elif value.isdigit():
        count = int(value) * (int(nodes) if nodes.isdigit() else 1)
        draft.set("world_size", count, raw)
    else:  # `auto` / -1: every visible GPU
        draft.maybe("world_size", {1: "one GPU visible", 2: "several GPUs visible"},
                    f"{raw}: Fabric takes every visible GPU")
        count = 2
    if count > 1:
        fsdp = f"{raw}: FSDPStrategy(auto_wrap_policy={{Block}}, activation_checkpointing_policy={{Block}})"
        draft.set("engine", "fsdp1", fsdp)
        draft.set("fsdp_use_orig_params", True, "Lightning Fabric's FSDPStrategy sets use_orig_params=True")
        draft.set("fsdp_frozen_units_separate", False, f"{fsdp}: each Block holds its frozen weights and adapters")
        draft.set("checkpointing", "all", fsdp)
        draft.set("checkpoint_impl", "torch-wrapper", f"{fsdp}: torch's apply_activation_checkpointing")
        draft.set("reentrant", False, "torch's checkpoint_wrapper default (CheckpointImpl.NO_REENTRANT)")
        if quantized:
            draft.note(f"--quantize with {raw}: LitGPT raises `NotImplementedError: Quantization is currently not "
                       "supported for multi-GPU training` before training")


def from_command(cmd: Command, versions: dict) -> FrontendResult:
    draft = Draft(NAME, versions)
    method, named = _method(cmd, draft)
    options, positionals = _options(cmd, draft)
    source = SOURCE.format(method=method)
    adapter = METHODS[method]
    draft.set("stage", "sft", named)
    draft.set("not_used", NOT_USED, f"{source}: LitGPT's own GPT, LoRA (litgpt/lora.py) and Fabric loop")
    draft.set("adapter", "full" if adapter == "full" else "lora", f"{named} ({source})")
    if adapter == "adapter":
        draft.note(f"{named} trains LLaMA-Adapter weights on a frozen base: read as an adapter run (LoRA's rules "
                   "on a frozen base apply alike)")
    model = options.get("checkpoint_dir", (positionals[0] if positionals else "", ""))[0]
    if model:
        model_name_facts(draft, Path(model.rstrip("/")).name, options.get("checkpoint_dir", ("", model))[1])
    quantize = options.get("quantize")
    quantized = quantize is not None
    if quantized and quantize:
        value, raw = quantize
        bits = "8bit" if "int8" in value else "4bit" if value.startswith("bnb.") else None
        if bits:
            draft.set("quantization", bits, f"{raw} (Fabric's BitsandbytesPrecision)")
        else:
            draft.unknown.append(f"{raw} (not a bitsandbytes quantization: read unquantized)")
    _precision(draft, options, quantized)
    _engine(draft, options, cmd, quantized)
    draft.set("use_cache", False, "LitGPT's GPT keeps no KV cache in training (set_kv_cache only for generation)")
    draft.flag(**FLAGS)
    finish_world(draft, cmd)
    return draft.result()


def from_files(paths: list[str], versions: dict) -> FrontendResult:
    """A launch script holding the `litgpt finetune_*` or `python finetune/*.py` line."""
    return from_command(script_command(paths, NAME, "litgpt finetune_lora ..."), versions)


def _recognise(view) -> bool:
    if view.cli == "litgpt":
        return True
    if view.dotted.startswith("litgpt.") or "/litgpt/" in f"/{view.program}":
        return True
    return bool(_SCRIPT.search(view.program) or _COPY.search(view.program) or
                re.search(r"(?:^|/)generate/(lora|adapter|adapter_v2|base)\.py$", view.program)) and \
        bool(view.flags & _OWN_FLAGS)


FRAMEWORK = Framework(name=NAME, title="LitGPT", module="litgpt", recognise=_recognise, flags=FLAGS,
                      log_paths=r"litgpt[/\\]|lit[-_]gpt[/\\]", aliases=("lit-gpt",))
