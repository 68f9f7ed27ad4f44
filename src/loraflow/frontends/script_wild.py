"""Readings of users' own scripts that script_setup.py's table of calls does not give by itself: how TRL's trainer
treats a plain transformers TrainingArguments, a k-bit preparation that comes after the adapters are added, and
a DeepSpeed engine wrapped around a PeftModel (each class was seen in public training scripts; see
tests/frontends/test_wild_scripts3.py).
"""

from __future__ import annotations

import re
import sys
from typing import Any, Callable

from loraflow.frontends.common import Draft
from loraflow.frontends.hf_options import Opt
from loraflow.frontends.script_code import Call, Code, FromFlag, Unread
from loraflow.frontends.table import parameter_targets, weight_reading_init
from loraflow.frontends.script_facts import TRAINING_ARGS, Facts, kind

# TRL's trainers take a transformers TrainingArguments too, and copy it into their own config:
# `elif isinstance(args, TrainingArguments) and not isinstance(args, SFTConfig): dict_args = args.to_dict(); ...
# args = SFTConfig(**dict_args)` (trl/trainer/sft_trainer.py, likewise the DPO / GRPO / reward trainers). to_dict
# carries TrainingArguments' own defaults, so TRL's config defaults (gradient_checkpointing=True since TRL 0.22,
# bf16 unless fp16 since TRL 0.19, trl/trainer/base_config.py) never apply to such a run.
_PLAIN_DEFAULTS = ("gradient_checkpointing", "bf16")


def plain_args_defaults(code: Code, facts: Facts) -> dict[str, Opt]:
    """The TrainingArguments defaults a TRL trainer keeps when the script builds a plain TrainingArguments (and no
    TRL config) for it: the options hf.py would otherwise fill with TRL's config defaults."""
    if not facts.trainer_key:
        return {}
    built = [c for c in code.calls if kind(c, code) == "args"]
    plain = [c for c in built if c.name in TRAINING_ARGS]
    if not plain or len(plain) != len(built) or plain[0].splat:
        return {}
    call = plain[0]
    keys = [k for k in _PLAIN_DEFAULTS if k not in call.kwargs]
    if facts.unsloth:
        # Unsloth's patched trainers pick fp16 or bf16 from the model's dtype when neither is set (unsloth
        # models/rl.py, UNSLOTH_MIXED_PRECISION), so only the checkpointing default is TrainingArguments'.
        keys = [k for k in keys if k != "bf16"]
    return {k: Opt(False, f"{call.at()} (transformers' TrainingArguments: {k} defaults to False, and TRL's trainer "
                          "copies it into its own config with to_dict, trl/trainer/sft_trainer.py)") for k in keys}


def kbit_prep_after_wrap(code: Code, facts: Facts, lineage: Callable[[Any, Code], list[Call]]) -> str:
    """peft's prepare_model_for_kbit_training starts with `for name, param in model.named_parameters():
    param.requires_grad = False` (peft utils/other.py): called on a model that already has its adapters, it
    freezes them too, and nothing trains (`trainable params: 0`). The source of the first such call, or ""."""
    if not facts.trains:
        return ""
    adapters = ("wrap", "unsloth_wrap", "peft_load")
    for call in code.calls:
        if kind(call, code) != "kbit_prep" or not code.always_runs(call):
            continue
        # lineage() walks the model argument back to its load: an adapter call on the way means the
        # preparation sees the PeftModel, not the bare base.
        wrapped = next((c for c in lineage(call.arg(0, "model"), code) if kind(c, code) in adapters), None)
        if wrapped is not None and wrapped.line < call.line:
            return (f"{call.at()} after {wrapped.at()} (prepare_model_for_kbit_training sets requires_grad=False on "
                    "every parameter, the adapter's too: nothing is left to train, peft utils/other.py)")
    return ""


def engine_moves_peft(value: Any, code: Code, lineage: Callable[[Any, Code], list[Call]]) -> bool:
    """Whether the model a DeepSpeed engine wraps is a PeftModel. The engine calls `self.module.to(device)`
    (deepspeed runtime/engine.py _configure_distributed_model); on a PeftModel that is torch's Module.to, which
    walks the children with _apply and lets bitsandbytes' Params4bit / Int8Params move themselves, so transformers'
    refusal (PreTrainedModel.to: 8-bit always, 4-bit before bitsandbytes 0.43.2) is only met by a bare quantized
    model (transformers#29303, OpenRLHF#403: the engine's module is the PreTrainedModel)."""
    return any(kind(c, code) in ("wrap", "unsloth_wrap", "peft_load") for c in lineage(value, code))


def cause_fixes(sources: dict[str, str]) -> dict[str, str]:
    """The fix in the code's words where one field has several causes in code: the table's fix for a frozen adapter
    is for an adapter loaded without is_trainable, not for one frozen by a k-bit preparation that came after it."""
    if "BitsandbytesPrecision" in sources.get("adapter_loaded_frozen", ""):
        return {"adapter_loaded_frozen": "from_pretrained(quantization_config=BitsAndBytesConfig(load_in_4bit=True)) "
                                         "before get_peft_model, instead of Lightning's BitsandbytesPrecision plugin "
                                         "(it quantizes PEFT's lora_A / lora_B too)"}
    if "prepare_model_for_kbit_training" in sources.get("adapter_loaded_frozen", ""):
        return {"adapter_loaded_frozen": "prepare_model_for_kbit_training(model) before get_peft_model(model, ...), "
                                         "not after it"}
    return {}


def adapter_reads(draft: Draft, facts: Facts) -> None:
    """What the adapter's creation reads from the base weights, from the script's own adapter config: an SVD/QR
    initialization (`LoraConfig(init_lora_weights="pissa_niter_32")`, advx-25-cdss/model's train/model.py), LoRA on
    nn.Parameter targets (target_parameters=[...]), prompt tuning initialized from text (rule
    zero3-init-adapter-read), as the framework frontends read the same PEFT options."""
    for call in facts.configs:
        for key, parse in (("init_lora_weights", weight_reading_init), ("target_parameters", parameter_targets)):
            value = call.kwargs.get(key)
            if isinstance(value, (Unread, Call, FromFlag)):
                draft.unknown.append(f"{call.at(key)} (computed: whether the adapter's creation reads the base "
                                     "weights is not visible)")
                continue
            kind = parse(value, call.at(key)) if key in call.kwargs else None
            if kind:
                draft.set("adapter_reads_base", kind, call.at(key))
                return
        if call.name == "PromptTuningConfig" and str(call.kwargs.get("prompt_tuning_init", "")).upper().endswith(
                "TEXT"):
            draft.set("adapter_reads_base", "prompt", call.at("prompt_tuning_init"))
            return


def adalora(draft: Draft, facts: Facts) -> None:
    """AdaLoraConfig with a task type: PeftModelForCausalLM (and the other task models) add AdaLoRA's orthogonal
    regularization to the loss in forward; without one the plain PeftModel skips it (peft AdaLoraModel.forward)."""
    for call in facts.configs:
        if call.name == "AdaLoraConfig" and call.kwargs.get("task_type") not in (None, "None"):
            draft.set("adalora_orth_reg", True, call.at("task_type") + " (AdaLoRA adds its orthogonal "
                      "regularization of every lora_A / lora_B to the loss)")


_CUTS = ("truncation", "max_length", "max_seq_length", "model_max_length", "max_len", "cutoff_len")
_IMAGE_TEXT = re.compile(r"ForConditionalGeneration|ImageTextToText|Vision2Seq|VisionEncoderDecoder|Llava|Idefics|VL")
# Packages whose calls a script makes without cutting samples on its own (data helpers of the project's own modules
# might): the standard library, and the libraries of a fine-tuning script.
_LIBRARIES = frozenset(sys.stdlib_module_names) | {
    "torch", "transformers", "peft", "trl", "datasets", "accelerate", "deepspeed", "bitsandbytes", "unsloth", "numpy",
    "PIL", "qwen_vl_utils", "tqdm", "wandb", "evaluate", "safetensors", "huggingface_hub", "lightning",
    "pytorch_lightning", "torchvision", "pandas", "yaml", "requests", "einops", "av", "decord", "cv2"}


def _project(module: str) -> bool:
    """An import from a module that is neither the standard library nor a known library: the project's own."""
    return bool(module) and module.split(".")[0] not in _LIBRARIES


def nothing_truncates(draft: Draft, facts: Facts, code: Code, opts: dict[str, Opt]) -> None:
    """A script that trains with transformers' own Trainer or its own loop, and passes no truncation or length limit
    to any call (its processor or tokenizer, its collator): nothing cuts a sample, so no image's tokens are cut
    (the data decides that only where something truncates; TRL's trainers do, by their max_length default)."""
    calls = code.calls
    if not any("Processor" in c.func or _IMAGE_TEXT.search(c.func) for c in calls):
        return  # no image-text model or processor in the code: nothing to say
    if any(_project(code.imports.get(c.func.split(".")[0], "")) for c in calls):
        return  # a helper of the project's own (a dataset builder, a collator): what it cuts is not visible
    if facts.trl or any(k in opts for k in _CUTS) or any(
            k in c.kwargs and c.kwargs[k] not in (None, False) for c in calls for k in _CUTS) or any(
            c.splat for c in calls if c.name in ("__call__", "apply_chat_template") or "processor" in c.func or
            "tokenizer" in c.func):
        return
    draft.settle("image_safe_truncation", True, f"{code.file}: no call passes truncation or a length limit "
                 "(processors and tokenizers cut nothing unless told, nor does the loop that trains)")


def spawned(draft: Draft, code: Code) -> None:
    """`mp.spawn(train, nprocs=world_size)` (torch.multiprocessing.spawn; Florence-2's and many DDP tutorials'
    distributed_train.py): the script starts its processes itself, whatever the launch line (`python train.py`)."""
    call = next((c for c in code.calls if c.name in ("spawn", "start_processes") and
                 (c.func.split(".")[0] in ("mp", "torch", "multiprocessing") or code.imports.get(c.name) ==
                  "torch.multiprocessing")), None)
    if call is None:
        return
    count = call.kwargs.get("nprocs", call.args[2] if len(call.args) > 2 else 1)
    if isinstance(count, int):
        draft.set("world_size", count, f"{call.at('nprocs')} (the script starts its processes itself)")
        return
    draft.maybe("world_size", {1: "the script spawns one process (one GPU)", 2: "the script spawns several"},
                f"{call.at('nprocs')}: the script starts as many processes as the expression gives (often one per "
                "GPU)")


def peft_config_on_peft_model(draft: Draft, facts: Facts, code: Code, lineage: Callable[[Any, Code], list[Call]]
                              ) -> None:
    """`model = get_peft_model(model, cfg)` then `SFTTrainer(model=model, peft_config=cfg)` (HenshawMike's gemma3
    script, advx-25-cdss/model's GRPO stage, trl PR #2725's thread): TRL's trainer given a PeftModel and a
    peft_config (rule peft-config-on-peft-model). A merge_and_unload in between leaves a plain model."""
    trainer = facts.trainer
    if trainer is None or not facts.trl or trainer.kwargs.get("peft_config") is None:
        return
    for call in lineage(trainer.arg(0, "model"), code):
        if kind(call, code) == "merge":
            return
        if kind(call, code) in ("wrap", "peft_load") and call.name not in ("add_adapter", "load_adapter"):
            draft.set("peft_config_on_peft_model", True, f"{trainer.at('peft_config')} with a model {call.at()} "
                      "already wrapped with PEFT")
            return

