"""ms-swift's runs that load a trained adapter and train nothing: `swift export [--merge_lora true]`, `swift
merge-lora`, `swift infer` and `swift deploy` (`--merge_lora true` merges first). Read as load runs (load_runs.py):
the base, how it is quantized at load, whether the adapter is merged into it, and the class it is loaded with.

Where ms-swift merges (swift/llm/export/merge_lora.py from 3.0, swift/pipelines/export/merge_lora.py from 4.0;
swift/llm/infer.py merge_lora in 1.x - 2.x, which `swift export`, `swift merge-lora` and `swift infer` all call):
- a bitsandbytes base (`--quant_method bnb --quant_bits 4` in 3.x, `--quantization_bit 4` in 2.x, or the same keys in
  the checkpoint's args.json, which ms-swift reads for every key the line leaves unset, BaseArguments
  load_args_from_ckpt): before 3.0 merged into the quantized weights after a warning ("It is not recommended to merge
  quantized models"); 3.0 - 3.6 refused it (`assert ... 'quantized model and does not support merge-lora.'`); from
  3.7 the merge loads the base unquantized (`args.quant_method = None`, PR #5190);
- a GPTQ / AWQ checkpoint: refused in every release (1.x - 2.x is_quant_model, 3.1 - 3.6 model_info.quant_method);
  from 3.7 it loads quantized all the same and PEFT's GPTQ / AWQ LoRA layers have no merge.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from loraflow.errors import LoraflowError
from loraflow.frontends import keys, load_runs, vision
from loraflow.frontends.argv import Command, parse_flags
from loraflow.frontends.common import Draft, accessors, at_least, int_value, mitigated
from loraflow.frontends.model_types import model_name_facts
from loraflow.frontends.ms_swift_vision import text_model_type

SUBCOMMANDS = ("export", "merge-lora", "merge_lora", "infer", "deploy")
# Arguments of these runs beyond the training ones keys.MS_SWIFT lists (swift/llm/argument/export_args.py,
# merge_args.py, infer_args.py, deploy_args.py at v3.12.6; swift/llm/utils/argument.py InferArguments,
# ExportArguments, DeployArguments at v2.6.1): read or known to change nothing about the load.
_RUN_ARGS = {"merge_lora", "merge_device_map", "safe_serialization", "max_shard_size", "output_dir", "quant_method",
             "quant_n_samples", "quant_batch_size", "quant_seqlen", "group_size", "to_peft_format", "to_ollama",
             "to_cached_dataset", "to_mcore", "to_hf", "push_to_hub", "hub_model_id", "hub_private_repo",
             "commit_message", "exist_ok", "infer_backend", "result_path", "result_dir", "write_batch_size", "metric",
             "max_batch_size", "val_dataset_sample", "host", "port", "api_key", "served_model_name", "verbose",
             "log_interval", "ckpt_dir", "load_args_from_ckpt_dir", "load_dataset_config", "quantization_bit",
             "model_id_or_path", "sft_type", "train_type", "tuner_type", "template_type", "merge_lora_and_save",
             "eval_human", "save_result", "gpu_memory_utilization", "tensor_parallel_size", "max_model_len",
             "replace_if_exists", "quant_output_dir", "quant_device_map"}
# Combination field -> the flag that changes it in these runs (words the fixes).
FLAGS = {"quantization": "--quant_bits / --quant_method bnb (--quantization_bit before ms-swift 3.0)",
         "merge_into_quantized": "--quant_method / --quant_bits (leave them unset, and out of the checkpoint's "
                                 "args.json, to merge into the unquantized base; ms-swift >= 3.7 does so itself)",
         "causal_lm_class": "--model_type (the checkpoint's own image-text type, e.g. qwen2_5_vl)",
         "ptq_checkpoint": "--model (the unquantized checkpoint)"}
MERGE_SRC = "swift/llm/export/merge_lora.py"


def _saved_args(adapter: str | None) -> tuple[dict[str, Any], str]:
    """The training run's arguments saved beside the adapter (args.json from 3.0, sft_args.json before), when the
    checkpoint is on this machine: ms-swift fills every key the line leaves unset from them."""
    for name in ("args.json", "sft_args.json"):
        path = Path(adapter or "") / name
        if adapter and path.is_file():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise LoraflowError(f"{path}: not readable as ms-swift's saved arguments ({exc}).") from None
            return (data if isinstance(data, dict) else {}), str(path)
    return {}, ""


def _options(args_in: list[str]) -> dict[str, tuple[Any, str]]:
    args, positionals, _ = parse_flags(args_in, lists={"adapters", "lora_modules"})
    opts: dict[str, tuple[Any, str]] = {}
    for a in args:
        value = a.value[0] if isinstance(a.value, list) and len(a.value) == 1 and a.name != "adapters" else a.value
        opts[a.name] = (True if value in (None, []) else value, a.raw)
    for pos in positionals:
        opts[f"positional {pos}"] = (pos, f"{pos} (positional argument)")
    return opts


def _load_quantization(draft: Draft, get, src) -> bool:
    """bitsandbytes at load: `--quant_method bnb --quant_bits N` (3.x; 2.x's --quant_bits quantizes the export
    with AWQ / GPTQ after the merge, not the load), `--quantization_bit N` (2.x). Returns whether it is known."""
    if get("quant_method") is not None and get("quant_bits") is not None:
        if str(get("quant_method")) == "bnb":
            bits = int_value(get("quant_bits"), src("quant_bits"), "a number of bits", (4, 8))
            draft.set("quantization", f"{bits}bit", f"{src('quant_method')} {src('quant_bits')} (ms-swift loads the "
                      "base with BitsAndBytesConfig, swift/llm/argument/base_args/quant_args.py)")
        return True
    if get("quantization_bit") is not None:
        bits = int_value(get("quantization_bit"), src("quantization_bit"), "a number of bits", (0, 4, 8))
        if bits:
            draft.set("quantization", f"{bits}bit", f"{src('quantization_bit')} (ms-swift < 3.0 loads the base "
                      "with bitsandbytes, swift/llm/utils/model.py)")
        return True
    return False


def _merge(draft: Draft, run: str, known: bool) -> None:
    """Where the merge puts the adapter's delta, per release (module docstring)."""
    if mitigated(draft, "kbit-merge"):
        if draft.get("quantization"):
            why = (f"{run}: ms-swift >= 3.7 loads the base unquantized to merge ({MERGE_SRC}: "
                   "args.quant_method = None, PR #5190)")
            draft.set("quantization", None, f"{why}, whatever {draft.sources['quantization']} says")
            draft.set("merge_into_quantized", False, why)
        return
    old = not at_least(draft, "ms-swift", "3.0.0")
    draft.set("merge_into_quantized", True, f"{run}: " + (
        "ms-swift < 3.0 merges into the base as loaded, warning 'It is not recommended to merge quantized models' "
        "(swift/llm/infer.py merge_lora)" if old else "ms-swift 3.0 - 3.6 loads the base as quantized and refuses "
        f"the merge ({MERGE_SRC}: assert ... 'quantized model and does not support merge-lora.')"))
    if not known:
        draft.maybe("quantization", {None: "the adapter was trained on an unquantized base",
                                     "4bit": "the adapter was trained as QLoRA: its saved arguments (args.json; "
                                             "sft_args.json before 3.0) quantize the base ms-swift loads"},
                    "the checkpoint's saved arguments are not on this machine: how they quantize the base is not read")


def _ptq_refused(draft: Draft, run: str, model: str, model_src: str) -> None:
    """ms-swift refuses a merge into a GPTQ / AWQ checkpoint in every release (module docstring)."""
    method = draft.get("ptq_checkpoint")
    raise LoraflowError(
        f"{model_src}: {model} is a {method}-quantized checkpoint (by its name), and {run} cannot merge an adapter "
        f"into it: ms-swift refuses ('is a quantized model and does not support merge-lora', {MERGE_SRC}; "
        "swift/llm/infer.py before 3.0), and from 3.7, which loads it quantized all the same, PEFT's "
        f"{method} LoRA layers have no merge. Pass --model the unquantized checkpoint it was made from (as ms-swift's "
        "examples/train/qlora/awq/merge_lora.sh does), or drop --merge_lora and serve the adapter unmerged.")


def read(cmd: Command, draft: Draft, sub: str, args_in: list[str]) -> None:
    """Fill `draft` from a `swift export|merge-lora|infer|deploy` line (args_in: its arguments)."""
    opts = _options(args_in)
    get, src, on = accessors(opts)
    sub = sub.replace("_", "-")
    merge = sub == "merge-lora" or on("merge_lora")
    run = f"swift {sub}" + (" --merge_lora true" if sub != "merge-lora" and merge else "")
    adapters = get("adapters") or ([get("ckpt_dir")] if get("ckpt_dir") else [])
    adapter_src = src("adapters") if "adapters" in opts else src("ckpt_dir") if "ckpt_dir" in opts else ""
    if merge and not adapters:
        raise LoraflowError(f"`{cmd.describe()}`: {run} merges a trained adapter, and none is given: add --adapters "
                            "CKPT (--ckpt_dir CKPT before ms-swift 3.0).")
    if "adapters" in opts:
        draft.era("ms-swift", ">=3.0.0", "--adapters replaced --ckpt_dir in ms-swift 3.0")
    if "quantization_bit" in opts or "model_id_or_path" in opts:
        draft.era("ms-swift", "<3.0.0", "--quantization_bit / --model_id_or_path are ms-swift < 3.0 spellings")
    saved, saved_path = _saved_args(adapters[0] if adapters else None)
    for key in ("model", "model_id_or_path", "model_type", "quant_method", "quant_bits", "quantization_bit"):
        if key not in opts and saved.get(key) is not None:
            opts[key] = (saved[key], f"{saved_path}: {key}")
    if adapters:
        draft.set("adapter", "lora", f"{adapter_src} (ms-swift merges LoRA-family adapters: lora, longlora, "
                  "adalora, llamapro; swift/llm/argument/base_args/base_args.py adapters_can_be_merged)")
    key = next((k for k in ("model", "model_id_or_path") if k in opts), None)
    model, model_src = (str(get(key)), src(key)) if key else ("", "")
    model_name_facts(draft, model, model_src)
    if vision.recognise(draft, model, model_src) and "model_type" in opts and key is not None:
        text_model_type(draft, str(get("model_type")), src("model_type"), key)
    known = _load_quantization(draft, get, src) or bool(saved_path) or not adapters
    if merge:
        if draft.get("ptq_checkpoint"):
            _ptq_refused(draft, run, model, model_src)
        _merge(draft, run, known)
    for name, (_, source) in opts.items():
        if name.startswith("positional ") or name not in _RUN_ARGS | keys.MS_SWIFT | keys.MS_SWIFT_V2:
            draft.unknown.append(source)
    load_runs.finish(draft, run)
    draft.flag(**FLAGS)
