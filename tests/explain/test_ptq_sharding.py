"""Rule ptq-model-under-sharding (the mined cluster of three train threads: a GPTQ / AWQ / compressed-tensors
checkpoint trained under ZeRO-3 or FSDP): explain reads LLaMA-Factory's own refusal and FSDP's dtype refusal naming
the integer codes, and check reads the checkpoint's kind from its published name."""

from __future__ import annotations

import json

import pytest

from loraflow.explain import diagnose_log
from loraflow.frontends import parse_versions, run_check
from loraflow.frontends.model_types import ptq_method


def top(text: str) -> list[tuple[str, str]]:
    _, candidates, _ = diagnose_log(text)
    return [(c.rule.id, c.confidence) for c in candidates]


def test_llama_factorys_refusal_is_the_rules_own_message():
    # LLaMA-Factory model_utils/quantization.py configure_quantization, as DeepSpeed issue 7096 pasted it.
    text = "[rank1]: ValueError: DeepSpeed ZeRO-3 or FSDP is incompatible with PTQ-quantized models."
    assert top(text)[:1] == [("ptq-model-under-sharding", "confirmed")]


def test_fsdps_refusal_names_the_codes():
    """int32 is only GPTQ / AWQ packing: confirmed; int8 is LLM.int8 codes or a w8a8 checkpoint: both likely, and
    the log's own words tell them apart (llama-cookbook issue 945 printed the w8a8 model's name before the refusal;
    an 8-bit run shows load_in_8bit or bitsandbytes' int8 classes)."""
    flat = "ValueError: Must flatten tensors with uniform dtype but got torch.bfloat16 and torch.{}"
    assert top(flat.format("int32"))[:1] == [("ptq-model-under-sharding", "confirmed")]
    assert {r for r, level in top(flat.format("int8"))[:2] if level == "likely"} == {
        "ptq-model-under-sharding", "kbit-int8-fsdp1"}
    named = "--> Model RedHatAI/Llama-3.3-70B-Instruct-quantized.w8a8\n" + flat.format("int8")
    assert top(named)[0][0] == "ptq-model-under-sharding"
    eight = "  quantization_config: {'load_in_8bit': True}\n" + flat.format("int8")
    assert top(eight)[0][0] == "kbit-int8-fsdp1"
    # uint8 storage is bitsandbytes' 4-bit, and two float dtypes are mixed parameters: not this rule.
    assert "ptq-model-under-sharding" not in dict(top(flat.format("uint8")))
    assert "ptq-model-under-sharding" not in dict(top(flat.format("float32")))


@pytest.mark.parametrize("name,method", [
    ("Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4", "gptq"), ("TheBloke/Llama-2-7B-AWQ", "awq"),
    ("Qwen/Qwen-7B-Chat-Int4", "gptq"), ("RedHatAI/Llama-3.3-70B-Instruct-quantized.w8a8", "compressed-tensors"),
    ("ISTA-DASLab/Llama-2-7b-AQLM-2Bit-1x16-hf", "aqlm"), ("meta-llama/Llama-3.1-8B-Instruct", None),
    ("unsloth/llama-3-8b-bnb-4bit", None), ("Qwen/Qwen3-8B-FP8", None), ("intfloat/e5-mistral-7b-instruct", None),
])
def test_a_checkpoints_name_says_whether_it_was_quantized_after_training(name, method):
    assert ptq_method(name) == method


def test_check_finds_a_gptq_checkpoint_under_zero3_and_not_under_zero2(tmp_path):
    versions = dict(parse_versions("transformers=4.46.0,peft=0.13.0,deepspeed=0.15.3,accelerate=1.0.0"))

    def findings(stage: int) -> tuple[dict, int]:
        ds = tmp_path / f"z{stage}.json"
        ds.write_text(json.dumps({"zero_optimization": {"stage": stage}, "bf16": {"enabled": "auto"}}))
        argv = ["torchrun", "--nproc_per_node", "2", "train.py", "--model_name_or_path", "TheBloke/Llama-2-7B-GPTQ",
                "--use_peft", "--bf16", "--deepspeed", str(ds)]
        text, code = run_check(argv, None, [], versions, as_json=True)
        return {f["rule"]: f["holds_if"] for f in json.loads(text)["findings"]}, code

    sharded, code = findings(3)
    assert "ptq-model-under-sharding" in sharded and sharded["ptq-model-under-sharding"] is None and code == 2
    assert "ptq-model-under-sharding" not in findings(2)[0]


def test_llama_recipes_refusal_of_8bit_under_fsdp():
    # llama-recipes >= 0.0.3 finetuning.py, before it loads the model.
    text = "ValueError: 8bit quantization is not supported with FSDP, please use 4bit quantization"
    assert top(text)[:1] == [("kbit-int8-fsdp1", "confirmed")]
