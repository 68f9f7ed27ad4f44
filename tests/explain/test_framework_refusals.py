"""Training frameworks refuse a setup of a rule's family with their own error (src/loraflow/rules/refusals.py): a log
that ends in one names that rule first, at a confidence that says how far the refusal pins it down. Each line is the
message as the framework raises it (its source file is named in refusals.py)."""

from __future__ import annotations

import pytest

from loraflow.explain import diagnose_log


def top(text: str) -> list[tuple[str, str]]:
    _, candidates, _ = diagnose_log(text)
    return [(c.rule.id, c.confidence) for c in candidates]


# Refusals that only the rule's setup meets: the rule is confirmed.
OWN = [
    # LLaMA-Factory hparams/parser.py, older and OFT-era wordings; model/adapter.py.
    ("ValueError: Quantization is only compatible with the LoRA method.", "kbit-full-finetune"),
    ("ValueError: Quantization is only compatible with the LoRA or OFT method.", "kbit-full-finetune"),
    ("ValueError: Quantized models can only be used for the LoRA tuning.", "kbit-full-finetune"),
    # Axolotl's validate_adapter (pydantic era, its two sentences joined without a space as it prints them).
    ("ValueError: load_in_8bit and load_in_4bit are not supported without setting an adapter for training.If you "
     "want to full finetune, please turn off load_in_8bit and load_in_4bit.", "kbit-full-finetune"),
    ("ValueError: load_in_8bit and load_in_4bit are not supported without setting an adapter.If you want to full "
     "finetune, please turn off load_in_8bit and load_in_4bit.", "kbit-full-finetune"),
    # PEFT < 0.6 refused a 4-bit merge with its 8-bit sentence.
    ("ValueError: Cannot merge LORA layers when the model is loaded in 8-bit mode", "kbit-merge"),
    # Axolotl validate_qlora.
    ("ValueError: Can't merge qlora if loaded in 8bit", "kbit-merge"),
    ("ValueError: Can't merge qlora if loaded in 4bit", "kbit-merge"),
    # Unsloth save.py, save_method="merged_4bit" (its message spans lines; the first is the error line).
    ("RuntimeError: Unsloth: Merging into 4bit will cause your model to lose accuracy if you plan\nto merge to GGUF "
     "or others later on. I suggest you to do this as a final step\nif you're planning to do multiple saves.\nIf you "
     "are certain, change `save_method` to `merged_4bit_forced`.", "kbit-merge"),
    # transformers PreTrainedModel.cuda / .to on a bitsandbytes model.
    ("ValueError: Calling `cuda()` is not supported for `4-bit` quantized models with the installed version of "
     "bitsandbytes. The current device is `cuda:0`. If you intended to move the model, please install bitsandbytes "
     ">= 0.43.2.", "kbit-model-moved"),
    ("ValueError: Calling `to()` is not supported for `8-bit` quantized models with the installed version of "
     "bitsandbytes. The current device is `cuda:1`. If you intended to move the model, please install bitsandbytes "
     ">= 0.48.0.", "kbit-model-moved"),
    ("ValueError: Calling `cuda()` is not supported for `8-bit` quantized models.  Please use the model as it is, "
     "since the model has already been set to the correct devices.", "kbit-model-moved"),
    # LLaMA-Factory (llmtuner) before it required transformers>=4.39 for QLoRA under ZeRO-3.
    ("ValueError: DeepSpeed ZeRO-3 is incompatible with quantization.", "zero3-init-quantized-load"),
    # LLaMA-Factory's PTQ refusals before FSDP joined the check.
    ("ValueError: DeepSpeed ZeRO-3 is incompatible with quantized models.", "ptq-model-under-sharding"),
    ("ValueError: DeepSpeed ZeRO-3 is incompatible with PTQ-quantized models.", "ptq-model-under-sharding"),
    # LLaMA-Factory hparams/parser.py: PiSSA's SVD would read ZeRO-3's [0] placeholders.
    ("ValueError: Please use scripts/pissa_init.py to initialize PiSSA in DeepSpeed ZeRO-3.",
     "zero3-init-adapter-read"),
    # LLaMA-Factory model/adapter.py: every adapter but the last would be merged into partitioned weights.
    ("AssertionError: Cannot use multiple adapters in DeepSpeed ZeRO-3.", "zero3-lora-merge"),
    # torchtune lora_qwen2: a tied model's output is the embedding itself.
    ("ValueError: apply_lora_to_output is incompatible with tie_word_embeddings, as there would be no output to "
     "apply lora to!", "tied-embedding-adapter"),
]


@pytest.mark.parametrize("line, rule", OWN, ids=[r + ":" + line[:40] for line, r in OWN])
def test_a_refusal_only_the_rules_setup_meets_confirms_it(line, rule):
    assert top(line)[:1] == [(rule, "confirmed")]


# LLaMA-Factory's export refuses any quantized model; a bitsandbytes one names kbit-merge (the sentence says merge).
@pytest.mark.parametrize("line", ["ValueError: Cannot merge adapters to a quantized model.",
                                  "ValueError: Quantized model only accepts a single adapter. Merge them first.",
                                  "AssertionError: Quantized model only accepts a single adapter.",
                                  "AssertionError: Quantized model only accepts a single checkpoint."])
def test_llamafactory_refusals_to_merge_into_a_quantized_model(line):
    assert top(line)[0][0] == "kbit-merge"
    with_bnb = "quantization_bit: 4\n" + line
    assert top(with_bnb)[0][0] == "kbit-merge"


def test_llamafactory_export_refusal_on_a_gptq_or_awq_checkpoint_is_not_kbit_merge():
    # The same sentence for an AWQ checkpoint: merging into it is no rounding of bitsandbytes' codes.
    text = ("model_name_or_path: Qwen/Qwen2.5-7B-Instruct-AWQ\n"
            "ValueError: Cannot merge adapters to a quantized model.")
    assert "kbit-merge" not in dict(top(text))


# LLaMA-Factory refuses an 8-bit base under ZeRO-3 or FSDP (and auto device map): the engine in the log decides.
@pytest.mark.parametrize("context, rule", [
    ("", "kbit-int8-zero3"),
    ("quantization_bit: 8\ndeepspeed: examples/deepspeed/ds_z3_config.json\n", "kbit-int8-zero3"),
    ("quantization_bit: 8\nfsdp_version: 1\n", "kbit-int8-fsdp1"),
    ("quantization_bit: 8\nfsdp_version: 2\n", "kbit-int8-fsdp2"),
])
def test_llamafactory_refusal_of_an_8bit_base_when_sharded(context, rule):
    old = "ValueError: Only 4-bit quantized model can use auto device map."
    new = "ValueError: Only 4-bit quantized model can use fsdp+qlora or auto device map."
    assert top(context + old)[0][0] == rule
    if context:
        assert top(context + new)[0][0] == rule


def test_unsloth_mid_2024_refusal_of_several_gpus():
    line = "RuntimeError: Error: More than 1 GPUs have a lot of VRAM usage. Please obtain a commercial license."
    assert top(line)[:1] == [("unsloth-multi-gpu", "confirmed")]


def test_llamafactory_refusal_of_unsloth_under_zero3():
    # The refusal names Unsloth itself: the fact that it loads the model makes the cause likely.
    assert top("ValueError: Unsloth is incompatible with DeepSpeed ZeRO-3.")[:1] == [("unsloth-multi-gpu", "likely")]


ZERO3_DEVICE_MAP = ("ValueError: DeepSpeed Zero-3 is not compatible with `low_cpu_mem_usage=True` or with passing a "
                    "`device_map`.")


def test_transformers_refusal_of_a_device_map_under_zero3_names_the_loader_the_log_shows():
    """transformers refuses any device_map under ZeRO-3: a bitsandbytes load passes one (peft#306), Unsloth's loader
    too (LlamaFactory#3949); the line alone names the load's device_map itself (zero3-device-map-load), whatever
    made the script pass it."""
    assert top(ZERO3_DEVICE_MAP) == [("zero3-device-map-load", "possible")]
    assert top('model = AutoModelForCausalLM.from_pretrained(m, load_in_8bit=True, device_map={"": 0})\n' +
               ZERO3_DEVICE_MAP)[:1] == [("zero3-init-quantized-load", "likely")]
    assert top("  --use_unsloth true \\\n  --deepspeed ds_z3_offload_config.json\n" + ZERO3_DEVICE_MAP)[:1] == \
        [("unsloth-multi-gpu", "likely")]


def test_axolotl_refusal_of_reentrant_checkpointing_on_a_partly_frozen_model():
    found = top("ValueError: `use_reentrant` must be false when used with partially frozen model.")
    assert found[0] == ("reentrant-frozen-inputs", "possible")
    assert "reentrant-partial-silent" in dict(found)


def test_axolotl_refusal_of_reentrant_checkpointing_in_distributed_rl():
    line = ("ValueError: The `use_reentrant: True` implementation of gradient checkpointing is not supported for "
            "distributed RL training with QLoRA. Please set `use_reentrant: False` in `gradient_checkpointing_kwargs`.")
    assert top(line)[0][0] == "ddp-reentrant-unused"
    assert top("deepspeed: deepspeed_configs/zero2.json\n" + line)[0][0] == "zero-grad-reduced-twice"
