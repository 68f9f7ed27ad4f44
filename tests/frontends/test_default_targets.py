"""A LoRA config with no target modules on a model type PEFT's default-target table does not list
(lora-no-default-targets): PEFT refuses with `Please specify `target_modules` in `peft_config``. The cluster:
mymusise/ChatGLM-Tuning#25, #106, #121, #149, #163 (ChatGLM before PEFT 0.3.0), baichuan-inc/Baichuan-13B#52,
shibing624/MedicalGPT#379, MAGICS-LAB/DNABERT_2#133, ymcui/Chinese-LLaMA-Alpaca-2#299, OptimalScale/LMFlow#207. The
table's model types and the release each came in are read from PEFT's wheels (scripts/peft_default_targets.py)."""

from __future__ import annotations

import json
import shlex

import pytest
from script_check import check, rules

from loraflow.explain import diagnose_log
from loraflow.frontends import parse_versions, run_check
from loraflow.frontends.targets import model_type_of

RULE = "lora-no-default-targets"
SCRIPT = """
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments
    from peft import LoraConfig, get_peft_model

    model = AutoModelForCausalLM.from_pretrained("{model}")
    config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, {targets}task_type="CAUSAL_LM")
    model = get_peft_model(model, config)
    Trainer(model=model, args=TrainingArguments(output_dir="out", bf16=True)).train()
"""


@pytest.mark.parametrize("model, targets, peft, holds", [
    ("microsoft/Phi-3-mini-4k-instruct", "", "0.21.2", True),  # no release lists phi3
    ("THUDM/chatglm2-6b", "", "0.2.0", True),  # chatglm from 0.3.0 (ChatGLM-Tuning#25)
    ("THUDM/chatglm2-6b", "", "0.3.0", False),
    ("Qwen/Qwen2-7B-Instruct", "", "0.11.1", True),  # qwen2 from 0.12.0
    ("Qwen/Qwen2-7B-Instruct", "", "0.12.0", False),
    ("meta-llama/Llama-2-7b-hf", "", "0.21.2", False),  # llama since 0.3.0: q_proj, v_proj
    ("microsoft/Phi-3-mini-4k-instruct", "target_modules=['qkv_proj', 'o_proj'], ", "0.21.2", False),
    ("microsoft/Phi-3-mini-4k-instruct", "target_modules=args.targets, ", "0.21.2", False),  # not visible: no claim
    ("/data/checkpoints/my-model", "", "0.21.2", False),  # a type the name does not show decides nothing
])
def test_a_script_without_target_modules(tmp_path, monkeypatch, model, targets, peft, holds):
    report = check(tmp_path, monkeypatch, SCRIPT.format(model=model, targets=targets), peft=peft)
    assert (RULE in rules(report)) == holds, report["findings"]
    if holds:
        assert report["exit_code"] == 2


def test_the_peft_release_decides_when_not_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT.format(model="Qwen/Qwen2-7B", targets="").replace("\n    ", "\n"))
    doc = json.loads(run_check(None, "python", ["train.py"], {}, as_json=True)[0])
    found = [f for f in doc["findings"] if f["rule"] == RULE]
    assert found and found[0]["holds_if"] == "peft<0.12.0", found


@pytest.mark.parametrize("line, holds", [
    ("trl sft --model_name_or_path Qwen/Qwen2.5-VL-7B-Instruct --dataset_name d --use_peft", True),
    ("trl sft --model_name_or_path Qwen/Qwen2.5-VL-7B-Instruct --dataset_name d --use_peft "
     "--lora_target_modules all-linear", False),
    ("trl sft --model_name_or_path Qwen/Qwen2.5-VL-7B-Instruct --dataset_name d", False),  # full fine-tuning
    ("trl sft --model_name_or_path meta-llama/Llama-3.1-8B --dataset_name d --use_peft", False),
])
def test_trl_use_peft_takes_peft_defaults(line, holds):
    doc = json.loads(run_check(shlex.split(line), None, [], dict(parse_versions("peft=0.17.1,trl=0.21.0")),
                               as_json=True)[0])
    assert (RULE in {f["rule"] for f in doc["findings"]}) == holds, doc["findings"]


@pytest.mark.parametrize("model, kind", [
    ("Qwen/Qwen2.5-VL-7B-Instruct", "qwen2_5_vl"), ("Qwen/Qwen-7B-Chat", "qwen"), ("Qwen/Qwen3-30B-A3B", "qwen3_moe"),
    ("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", "qwen2"), ("google/gemma-3-1b-it", "gemma3_text"),
    ("google/gemma-3-4b-it", "gemma3"), ("meta-llama/Llama-3.2-11B-Vision-Instruct", "mllama"),
    ("/models/bloomz-7b1-mt", "bloom"), ("THUDM/glm-4-9b-chat-hf", None), ("my-org/finetuned", None),
    # Local copies that keep the organization in the folder's name (LlamaFactory#1998's
    # /mnt/data/Top/mistralai_Mixtral-8x7B-Instruct-v0.1; huggingface_hub's cache; ModelScope's `___`).
    ("/mnt/data/Top/mistralai_Mixtral-8x7B-Instruct-v0.1", "mixtral"), ("models--Qwen--Qwen2.5-7B", "qwen2"),
    ("/m/Qwen___Qwen3-30B-A3B", "qwen3_moe"), ("qwen_finetuned", None),
])
def test_model_types_from_ids(model, kind):
    assert model_type_of(model) == kind


@pytest.mark.parametrize("line", [
    "ValueError: Please specify `target_modules` in `peft_config`",  # peft < 0.17, and its other tuners
    "ValueError: Please specify `target_modules` or `target_parameters`in `peft_config`",  # LoRA, peft >= 0.17
    "ValueError: Please specify target_modules in peft_config",  # as issue titles quote it
])
def test_explain_names_the_refusal(line):
    _, candidates, _ = diagnose_log(line)
    assert candidates and candidates[0].rule.id == RULE
