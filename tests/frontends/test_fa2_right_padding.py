"""FlashAttention-2 refuses a right-padded batch while the KV cache is on (fa2-right-padding-cache): the guard of
Mistral-style models' FlashAttention-2 branch in transformers 4.36 - 4.52, read per model from the wheels.
huggingface/trl#1018, #1217, #1477, #3306, #3034, brendanhogan/DeepSeekRL-Extended#4, dhcode-cpp/X-R1#63."""

from __future__ import annotations

import pytest
from script_check import launch_findings

from loraflow.explain import diagnose_log

RULE = "fa2-right-padding-cache"
LINE = ("python finetune.py --model_name_or_path {model} --attn_implementation flash_attention_2 --bf16 --do_train "
        "--output_dir o {more}")


@pytest.mark.parametrize("model, transformers, more, holds", [
    ("Qwen/Qwen2-7B", "4.40.0", "", True),
    ("Qwen/Qwen2-7B", "4.45.0", "", False),  # 4.42 - 4.48 gave Qwen2 Llama's mask: no guard
    ("Qwen/Qwen2.5-7B", "4.51.3", "", True),  # 4.49 brought it back
    ("mistralai/Mistral-7B-v0.1", "4.45.0", "", True),  # Mistral kept it throughout
    ("Qwen/Qwen2.5-7B", "4.53.0", "", False),  # masking_utils dropped it
    ("Qwen/Qwen2.5-7B", "4.51.3", "--gradient_checkpointing", False),  # off in train mode under checkpointing
    ("Qwen/Qwen2.5-7B", "4.51.3", "--use_cache false", False),
    ("meta-llama/Llama-3.1-8B", "4.51.3", "", False),  # Llama never had it
    ("Qwen/Qwen2.5-7B", "4.51.3", "--per_device_train_batch_size 1", False),  # one row: no padded last column
    ("Qwen/Qwen2.5-7B", "4.51.3", "--per_device_train_batch_size 4", True),
])
def test_the_model_the_release_and_the_cache_decide(tmp_path, monkeypatch, model, transformers, more, holds):
    found = launch_findings(tmp_path, monkeypatch, LINE.format(model=model, more=more), f"transformers={transformers}")
    assert (RULE in found) == holds, found


def test_sdpa_has_no_such_guard(tmp_path, monkeypatch):
    line = LINE.format(model="Qwen/Qwen2-7B", more="").replace("flash_attention_2", "sdpa")
    assert RULE not in launch_findings(tmp_path, monkeypatch, line, "transformers=4.40.0")


def test_explain_names_it():
    log = ("ValueError: You are attempting to perform batched generation with padding_side='right' this may lead to "
           "unexpected behaviour for Flash Attention version of Qwen2. Make sure to  call `tokenizer.padding_side  = "
           "'left'` before tokenizing the input.")
    _, candidates, _ = diagnose_log(log)
    assert (candidates[0].rule.id, candidates[0].confidence) == (RULE, "confirmed")
