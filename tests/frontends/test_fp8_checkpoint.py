"""Adapters trained on a checkpoint published in FP8 (fp8-checkpoint-not-trainable): transformers loads it through
its fine-grained FP8 quantizer whatever torch_dtype asks, and the Trainer refused that quantizer as not trainable
until 5.22. huggingface/transformers#37927, #41516, #46295, #46736, MiniMax-AI/MiniMax-M2#48; the older refusal at
load in hiyouga/LlamaFactory#6777."""

from __future__ import annotations

import pytest
from script_check import launch_findings

from loraflow.explain import diagnose_log

RULE = "fp8-checkpoint-not-trainable"
TRL = "trl sft --model_name_or_path {model} --dataset_name d --use_peft --lora_target_modules all-linear --output_dir o"


@pytest.mark.parametrize("model, transformers, holds", [
    ("deepseek-ai/DeepSeek-V3.1", "4.57.1", True),
    ("Qwen/Qwen3-8B-FP8", "5.21.1", True),
    ("moonshotai/Kimi-K2-Instruct", "5.9.0", True),
    ("Qwen/Qwen3-8B-FP8", "5.22.0", False),  # the quantizer is trainable from 5.22
    ("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", "4.57.1", False),  # a bf16 Qwen model
    ("deepseek-ai/DeepSeek-R1-0528-Qwen3-8B", "4.57.1", False),  # R1 distilled onto Qwen3: bf16
    ("unsloth/DeepSeek-R1-GGUF", "4.57.1", False),
    ("RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8", "4.57.1", False),  # compressed-tensors, not quant_method fp8
    ("Qwen/Qwen3-8B-FP8-dynamic", "4.57.1", False),
    ("moonshotai/Kimi-K2-Thinking", "4.57.1", False),  # INT4
    ("Qwen/Qwen3-8B", "4.57.1", False),
])
def test_the_checkpoint_and_the_release_decide(tmp_path, monkeypatch, model, transformers, holds):
    found = launch_findings(tmp_path, monkeypatch, TRL.format(model=model), f"transformers={transformers},trl=0.24.0")
    assert (RULE in found) == holds, found


@pytest.mark.parametrize("line", [
    "ValueError: The model you are trying to fine-tune is quantized with QuantizationMethod.FP8 but that quantization "
    "method do not support training. Please open an issue on GitHub",
    "ValueError: Unknown quantization type, got fp8 - supported types are: ['awq', 'bitsandbytes_4bit']",
])
def test_explain_names_it(line):
    _, candidates, _ = diagnose_log(line)
    assert candidates and (candidates[0].rule.id, candidates[0].confidence) == (RULE, "confirmed")


def test_the_installed_transformers_trains_adapters_on_fp8():
    """The bound's upper side, read from the installed release (5.23): the FP8 quantizer says it is trainable."""
    from transformers import FineGrainedFP8Config
    from transformers.quantizers.quantizer_finegrained_fp8 import FineGrainedFP8HfQuantizer

    assert FineGrainedFP8HfQuantizer(FineGrainedFP8Config()).is_trainable
