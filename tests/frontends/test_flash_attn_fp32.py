"""FlashAttention given float32 inputs (flash-attn-fp32-inputs): unslothai/unsloth#827, #933, QwenLM/Qwen3#406,
microsoft/PhiCookBook#127, yangjianxin1/Firefly#259, artidoro/qlora#221, huggingface/transformers#26066. What
transformers casts to, and its load-time check before 4.37, are read from its wheels (4.36.0 - 5.0.0)."""

from __future__ import annotations

import pytest
from script_check import check, rules

from loraflow.explain import diagnose_log

RULE = "flash-attn-fp32-inputs"
SCRIPT = """
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments
    from peft import LoraConfig, get_peft_model
    model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2-7B", attn_implementation="flash_attention_2"{load})
    model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    Trainer(model=model, args=TrainingArguments(output_dir="o"{args})).train()
"""


@pytest.mark.parametrize("load, args, transformers, holds", [
    ("", "", "4.45.0", True),  # Qwen3#406: no dtype, no mixed precision
    ("", ", bf16=True", "4.45.0", False),  # autocast's bfloat16 is what the queries are cast to
    (", torch_dtype=torch.bfloat16", "", "4.45.0", False),
    (", torch_dtype=torch.float32", "", "4.45.0", True),
    ("", "", "5.0.0", False),  # transformers 5 loads the checkpoint's dtype by default
])
def test_the_load_dtype_and_mixed_precision_decide(tmp_path, monkeypatch, load, args, transformers, holds):
    report = check(tmp_path, monkeypatch, "import torch\n" + SCRIPT.format(load=load, args=args),
                   transformers=transformers)
    assert (RULE in rules(report)) == holds, report["findings"]


@pytest.mark.parametrize("text", [
    "RuntimeError: FlashAttention only support fp16 and bf16 data type",
    "ValueError: Flash Attention 2.0 only supports torch.float16 and torch.bfloat16 dtypes. You passed "
    "torch.float32, this might lead to unexpected behaviour.",
])
def test_explain_names_it(text):
    _, candidates, _ = diagnose_log(text)
    assert candidates and candidates[0].rule.id == RULE
