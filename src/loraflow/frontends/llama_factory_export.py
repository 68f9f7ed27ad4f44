"""LLaMA-Factory's export: `llamafactory-cli export CONFIG.yaml [key=value ...]`, or its YAML alone when it holds
export_dir (examples/merge_lora/*.yaml). Read as a load run (load_runs.py): the base, how it is quantized at load,
and whether adapter_name_or_path is merged into it.

What LLaMA-Factory does (src/llamafactory/train/tuner.py export_model, the same from v0.4.0 to v0.9.4; src/llmtuner/
train/tuner.py before v0.8): it refuses an export without export_dir ("Please specify `export_dir` to save model.")
and adapters with export_quantization_bit ("Please merge adapters before quantizing the model."); it loads the base
with quantization_bit (bitsandbytes) or as the checkpoint is saved (GPTQ / AWQ), and model/adapter.py then leaves
the adapter unmerged on a quantized model, which export_model refuses ("Cannot merge adapters to a quantized
model.", commit 393e4b0, first in v0.4.0). Before v0.4.0 the adapter was merged into a bitsandbytes base
(src/llmtuner/model/adapter.py at v0.3.3: only a GPTQ model was left unmerged).
"""

from __future__ import annotations

from typing import Any

from loraflow.errors import LoraflowError
from loraflow.frontends import keys, load_runs, vision
from loraflow.frontends.common import Draft, accessors, at_least, int_value
from loraflow.frontends.model_types import model_name_facts

TUNER = "src/llamafactory/train/tuner.py export_model"
# Keys of an export beyond the training ones keys.LLAMA_FACTORY lists (src/llamafactory/hparams/model_args.py
# ExportArguments, v0.9.4).
_EXPORT_KEYS = {"export_dir", "export_size", "export_device", "export_quantization_bit", "export_quantization_dataset",
                "export_quantization_nsamples", "export_quantization_maxlen", "export_legacy_format",
                "export_hub_model_id", "adapter_name_or_path", "model_name_or_path", "template", "finetuning_type",
                "quantization_bit", "quantization_method", "trust_remote_code", "infer_dtype", "hf_hub_token"}
FLAGS = {"quantization": "quantization_bit", "merge_into_quantized": "quantization_bit (leave it unset to merge: "
         "examples/merge_lora says DO NOT use quantized model or quantization_bit)",
         "ptq_checkpoint": "model_name_or_path (the unquantized checkpoint)"}


def _refusals(opts: dict[str, tuple[Any, str]], get, src, complete: bool) -> None:
    """What export_model refuses before it loads anything, as LLaMA-Factory words it. `complete`: every config the
    line names is here (a missing one may hold export_dir)."""
    if complete and get("export_dir") in (None, ""):
        raise LoraflowError("llamafactory-cli export needs export_dir: LLaMA-Factory refuses the export without it "
                            f"('Please specify `export_dir` to save model.', {TUNER}). Add export_dir: PATH.")
    if get("adapter_name_or_path") is not None and get("export_quantization_bit") is not None:
        raise LoraflowError(
            f"{src('export_quantization_bit')} with {src('adapter_name_or_path')}: LLaMA-Factory refuses to quantize "
            f"while merging ('Please merge adapters before quantizing the model.', {TUNER}). Export the merged model "
            "first without export_quantization_bit, then quantize it in a second export whose model_name_or_path is "
            "that export_dir and which has no adapter_name_or_path.")
    if get("adapter_name_or_path") is not None and str(get("finetuning_type", "lora")) != "lora":
        raise LoraflowError(f"{src('adapter_name_or_path')} with {src('finetuning_type')}: LLaMA-Factory loads "
                            "adapters only for finetuning_type lora ('Adapter is only valid for the LoRA method.', "
                            "src/llamafactory/hparams/parser.py _verify_model_args). Set finetuning_type: lora.")


def read(draft: Draft, opts: dict[str, tuple[Any, str]], run: str, vlm_template, complete: bool = True) -> None:
    """Fill `draft` from an export's options (the YAML's keys and the line's overrides); `vlm_template`: the
    pattern of LLaMA-Factory's image-text template names (llama_factory_vision.VLM_TEMPLATE, the one list)."""
    get, src, on = accessors(opts)
    _refusals(opts, get, src, complete)
    if not complete:
        draft.note(f"{run}: its config is not on this machine, so only the line's own keys are read")
    model = str(get("model_name_or_path") or "")
    model_src = src("model_name_or_path") if model else ""
    model_name_facts(draft, model, model_src)
    template = str(get("template") or "")
    vision.recognise(draft, model, model_src, src("template") if vlm_template.match(template) else None)
    merge = get("adapter_name_or_path") is not None
    bits = get("quantization_bit")
    if bits not in (None, "null", "None") and str(get("quantization_method", "bnb")) == "bnb":
        bits = int_value(bits, src("quantization_bit"), "a number of bits", (4, 8))
        draft.set("quantization", f"{bits}bit", f"{src('quantization_bit')} (LLaMA-Factory loads the base with "
                  "bitsandbytes, src/llamafactory/model/model_utils/quantization.py)")
    if merge:
        draft.set("adapter", "lora", f"{src('adapter_name_or_path')} (merged into the base: model/adapter.py "
                  "merge_and_unload)")
        if draft.get("ptq_checkpoint"):
            raise LoraflowError(
                f"{model_src}: {model} is a {draft.get('ptq_checkpoint')}-quantized checkpoint (by its name), and "
                f"LLaMA-Factory cannot merge {src('adapter_name_or_path')} into it ('Cannot merge adapters to a "
                f"quantized model.', {TUNER}). Set model_name_or_path to the unquantized checkpoint it was made from.")
        if draft.get("quantization"):
            both = f"{src('quantization_bit')} with {src('adapter_name_or_path')}: "
            draft.set("merge_into_quantized", True, both + (
                f"LLaMA-Factory >= 0.4.0 leaves the adapter unmerged on a quantized base and refuses the export "
                f"('Cannot merge adapters to a quantized model.', {TUNER})" if at_least(draft, "llama-factory", "0.4.0")
                else "LLaMA-Factory < 0.4.0 merges the adapter into the quantized base (src/llmtuner/model/"
                     "adapter.py at v0.3.3)"))
    for name, (_, source) in opts.items():
        if name not in _EXPORT_KEYS and name not in keys.LLAMA_FACTORY and name not in keys.HF_TRAINER:
            draft.unknown.append(source)
    load_runs.finish(draft, run)
    draft.flag(**FLAGS)
