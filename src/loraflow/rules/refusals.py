"""Training frameworks' own refusals of a setup in a rule's family: the error a framework raises when it checks the
setup before the failure can happen (LLaMA-Factory's argument parser, Axolotl's config validation, PEFT's merge,
Unsloth's save, torchtune's model builders, transformers' device moves). A log that ends in one names the rule whose
setup was refused: the user needs that rule's cause and fix.

Each message is the framework's printed text, escaped into a regular expression (explain matches case-insensitively),
with the file that raises it and the releases that print that wording. `own`: only that rule's setup is refused by
it; `shared`: the refusal also covers setups of other rules (or of no rule), so it names a possible cause that the
log's facts must confirm.
"""

from __future__ import annotations

from loraflow.rules.signs import Message

# --- kbit-full-finetune: a quantized base trained without adapters ---------------------------------------------------
KBIT_FULL_FINETUNE = (
    # LLaMA-Factory hparams/parser.py (_verify_model_args; src/llmtuner/ before 0.8, src/llamafactory/ from 0.8):
    # quantization_bit with finetuning_type full or freeze. Releases that added OFT say `the LoRA or OFT method`.
    Message(r"Quantization is only compatible with the LoRA( or OFT)? method", "own",
            "LLaMA-Factory hparams/parser.py: _verify_model_args (llmtuner and llamafactory)"),
    # LLaMA-Factory model/adapter.py: init_adapter, a quantized model set up for full or freeze tuning.
    Message(r"Quantized models can only be used for the LoRA tuning", "own",
            "LLaMA-Factory model/adapter.py: init_adapter (llamafactory 0.8+)"),
    # Axolotl: load_in_8bit/load_in_4bit without `adapter`; utils/config validate_config (2023), then the pydantic
    # validate_adapter (utils/config/models/input/v0_4_1, utils/schemas/config.py), which adds `for training`.
    Message(r"load_in_8bit and load_in_4bit are not supported without setting an adapter", "own",
            "Axolotl config validation: validate_config / validate_adapter (every release since 2023)"),
)

# --- kbit-merge: an adapter merged into 4-bit or 8-bit weights ------------------------------------------------------
KBIT_MERGE = (
    # PEFT tuners/lora.py (LoraModel.merge_and_unload / _unload_and_optionally_merge) refused any bitsandbytes model,
    # 4-bit included, with this 8-bit wording until 4-bit and 8-bit merging came with the tuners/lora/ package.
    Message(r"Cannot merge LORA layers when the model is loaded in 8-bit mode", "own",
            "peft tuners/lora.py: LoraModel._unload_and_optionally_merge", "peft<0.6"),
    # Axolotl validate_qlora (utils/config.py validate_config in 2023; utils/schemas/peft.py later): merge_lora with
    # adapter qlora while the base is still loaded in 8 or 4 bits.
    Message(r"Can't merge qlora if loaded in (4|8)bit", "own",
            "Axolotl config validation: validate_config / LoraConfig.validate_qlora (every release since 2023)"),
    # Unsloth save.py: unsloth_save_model with save_method="merged_4bit" (merged_4bit_forced goes on).
    Message(r"Unsloth: Merging into 4bit will cause your model to lose accuracy", "own",
            "unsloth/save.py: unsloth_save_model (2024.x on)"),
    # LLaMA-Factory train/tuner.py: export_model with adapters on a quantized model (a bitsandbytes
    # quantization_bit, or a GPTQ/AWQ checkpoint, which no rule covers: shared).
    Message(r"Cannot merge adapters to a quantized model", "shared",
            "LLaMA-Factory train/tuner.py: export_model (llmtuner 0.5+, llamafactory)"),
    # LLaMA-Factory: several adapters to merge on a quantized model (hparams/parser.py _verify_model_args, `... Merge
    # them first.`; model/adapter.py assert); llmtuner's checkpoint_dir era said `a single checkpoint`.
    Message(r"Quantized model only accepts a single (adapter|checkpoint)", "shared",
            "LLaMA-Factory hparams/parser.py: _verify_model_args; model/adapter.py: _setup_lora_tuning"),
)

# --- kbit-model-moved: a 4-bit or 8-bit model moved after loading (own: it names a move, never a merge) ---
# transformers modeling_utils.py PreTrainedModel.cuda / .to after the quantizer refactor: 4-bit with
# bitsandbytes<0.43.2, 8-bit `cuda()` always and later with bitsandbytes<0.48 (`... with the installed version`).
BNB_CALLED = Message(r"Calling `(cuda|to)\(\)` is not supported for `(4|8)-bit` quantized models", "own",
                     "transformers/modeling_utils.py: PreTrainedModel.cuda / to (bitsandbytes model moved)",
                     "transformers>=4.44")

# --- kbit-int8-zero3 / -fsdp1 / -fsdp2: an 8-bit base sharded ---------------------------------------------------------
# LLaMA-Factory refuses quantization_bit 8 under ZeRO-3 (and FSDP, and device_map auto): model/patcher.py
# _configure_quantization in llmtuner 0.6 (`... can use auto device map.`), model/model_utils/quantization.py from
# 0.7 (`... can use fsdp+qlora or auto device map.`).
INT8_SHARDED = Message(r"Only 4-bit quantized model can use (fsdp\+qlora or )?auto device map", "shared",
                       "LLaMA-Factory model_utils/quantization.py (patcher.py in llmtuner 0.6): configure_quantization")

# --- zero3-init-quantized-load: a bitsandbytes model loaded under ZeRO-3 ----------------------------------------------
# LLaMA-Factory (llmtuner model/loader.py, then patcher.py) refused quantization_bit under ZeRO-3 until 0.6 required
# transformers>=4.39 for it; scripts derived from it (MedicalGPT and others) raise the same sentence.
ZERO3_QUANTIZED_LOAD = Message(r"DeepSpeed ZeRO-3 is incompatible with quantization\.", "own",
                               "LLaMA-Factory llmtuner model/loader.py / patcher.py (before 0.6)")

# --- ptq-model-under-sharding: a GPTQ/AWQ checkpoint under ZeRO-3 ---------------------------------------------------
# LLaMA-Factory's wordings before it added FSDP to the check (`DeepSpeed ZeRO-3 or FSDP is incompatible ...`).
PTQ_ZERO3 = Message(r"DeepSpeed ZeRO-3 is incompatible with (PTQ-)?quantized models", "own",
                    "LLaMA-Factory llmtuner model/patcher.py / model/utils/quantization.py: the PTQ branch",
                    "llmtuner 0.6-0.7")

# --- zero3-init-adapter-read: PiSSA initialized from ZeRO-3-partitioned weights ---------------------------------------
PISSA_ZERO3 = Message(r"Please use scripts/pissa_init\.py to initialize PiSSA in DeepSpeed ZeRO-3", "own",
                      "LLaMA-Factory hparams/parser.py: get_train_args (llamafactory, since PiSSA support)")

# --- zero3-lora-merge: adapters merged into ZeRO-3-partitioned weights ------------------------------------------------
# LLaMA-Factory merges every adapter but the last into the base; under ZeRO-3 it asserts there is only one.
ZERO3_MULTI_ADAPTER = Message(r"Cannot use multiple adapters in DeepSpeed ZeRO-3", "own",
                              "LLaMA-Factory model/adapter.py: _setup_lora_tuning (assert; llmtuner 0.6+)")

# --- unsloth-multi-gpu: Unsloth in a multi-process launch ------------------------------------------------------------
# A ZeRO-3 launch is a multi-process one; the refusal also guards Unsloth's kernels from partitioned weights, which
# newer Unsloth (with data-parallel support) still cannot read: shared.
# Unsloth 2024.6's check of the GPUs holding memory (nvidia-smi from its patched training loop), raised on a
# multi-GPU launch before its data-parallel support (unsloth issue 660; LLaMA-Factory issue 4288 with use_unsloth).
UNSLOTH_VRAM = Message(r"More than 1 GPUs have a lot of VRAM usage\. Please obtain a commercial license", "own",
                       "unsloth/models/llama.py: the patched training loop's GPU check", "unsloth 2024.6 (seen)")
# transformers modeling_utils.py from_pretrained: a device_map or low_cpu_mem_usage under ZeRO-3 (every release
# that has zero.Init loading). A bitsandbytes load passes a device_map (a quantized model built under zero.Init),
# and so does Unsloth's loader; many other loads do too: generic, the log's facts must say which.
# transformers 4.51 dropped the low_cpu_mem_usage half of the sentence (`... is not compatible with passing a
# `device_map`.`, modeling_utils.py, then integrations/accelerate.py check_and_set_device_map in 5.x).
ZERO3_DEVICE_MAP = Message(r"DeepSpeed Zero-3 is not compatible with (`?low_cpu_mem_usage=True`? or with )?passing a "
                           r"`?device_map`?", "generic",
                           "transformers modeling_utils.py: from_pretrained (device_map / low_cpu_mem_usage under "
                           "ZeRO-3)")
UNSLOTH_ZERO3 = Message(r"Unsloth is incompatible with DeepSpeed ZeRO-3", "shared",
                        "LLaMA-Factory hparams/parser.py: get_train_args (use_unsloth under ZeRO-3)")

# --- tied-embedding-adapter: LoRA on the output head of a model whose embeddings are tied -----------------------------
TIED_OUTPUT_LORA = Message(r"apply_lora_to_output is incompatible with tie_word_embeddings", "own",
                           "torchtune models/qwen2/_component_builders.py: lora_qwen2 (TiedLinear output)")

# --- reentrant checkpointing of a partly frozen model ----------------------------------------------------------------
# Axolotl TrainingValidationMixin.check_use_reentrant_mismatch (utils/schemas/validation.py): unfrozen_parameters
# with use_reentrant true, citing transformers issue 21381 (frozen inputs give reentrant checkpointing no graph).
REENTRANT_PARTLY_FROZEN = Message(r"`use_reentrant` must be false when used with partially frozen model", "shared",
                                  "Axolotl utils/schemas/validation.py: check_use_reentrant_mismatch")

# --- reentrant checkpointing under several forwards in distributed RL -------------------------------------------------
# Axolotl RLValidationMixin.check_rl_config_gradient_checkpointing (utils/schemas/validation.py, after axolotl PR
# 2420): QLoRA, an RL trainer (KTO, DPO: forwards run apart) on several GPUs with use_reentrant true.
REENTRANT_DISTRIBUTED_RL = Message(
    r"The `use_reentrant: True` implementation of gradient checkpointing is not supported for distributed RL "
    r"training with QLoRA", "shared",
    "Axolotl utils/schemas/validation.py: check_rl_config_gradient_checkpointing")
