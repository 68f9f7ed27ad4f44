"""Liger's fused linear cross entropy with an adapter on lm_head: the loss reads lm_head's frozen base weight and the
head's adapter never trains (liger-head-adapter-bypassed). huggingface/trl#4612 and PR #5977 (TRL refuses it in GRPO
from 1.7.0); transformers#34016 and PR #35680 (the Trainer patches a PeftModel from 4.49). What each framework turns
on, and where it refuses, read from the trl, transformers and ms-swift wheels and LLaMA-Factory's loader."""

from __future__ import annotations

import json
import shlex

import pytest

from loraflow.frontends import parse_versions, run_check

RULE = "liger-head-adapter-bypassed"
GRPO = "trl grpo --model_name_or_path Qwen/Qwen2.5-1.5B --use_peft --dataset_name d --use_liger_loss"
SFT = "trl sft --model_name_or_path Qwen/Qwen2.5-1.5B --use_peft --dataset_name d --use_liger_kernel"
LF = ("model_name_or_path: meta-llama/Meta-Llama-3-8B-Instruct\nstage: {stage}\ndo_train: true\nfinetuning_type: lora\n"
      "lora_target: {targets}\nenable_liger_kernel: true\ndataset: d\ntemplate: llama3\noutput_dir: out\nbf16: true\n")


def _check(line: str, versions: str) -> dict:
    return json.loads(run_check(shlex.split(line), None, [], dict(parse_versions(versions)), as_json=True)[0])


@pytest.mark.parametrize("line, versions, holds, stops", [
    (GRPO + " --lora_target_modules q_proj v_proj lm_head", "trl=0.20.0,transformers=4.55.0", True, False),
    (GRPO + " --lora_target_modules q_proj v_proj lm_head", "trl=1.7.0,transformers=4.57.0", False, True),
    (GRPO + " --lora_target_modules q_proj v_proj", "trl=0.20.0,transformers=4.55.0", False, False),
    (GRPO.replace("--use_liger_loss", "--use_liger_kernel") + " --lora_target_modules q_proj lm_head",
     "trl=0.20.0,transformers=4.55.0", False, False),  # the Trainer's flag: GRPO's log-probs get no labels
    (GRPO.replace("--use_liger_loss", "--use_liger_kernel") + " --lora_target_modules q_proj lm_head",
     "trl=0.25.0,transformers=4.57.0", True, False),  # GRPO's own fused loss under its later name
    (SFT + " --lora_target_modules q_proj lm_head --liger_kernel_config '{\"fused_linear_cross_entropy\": false}'",
     "trl=0.20.0,transformers=4.55.0", False, False),
    (GRPO + " --lora_target_modules all-linear", "trl=0.20.0,transformers=4.55.0", False, False),
    (SFT + " --lora_target_modules q_proj lm_head", "trl=0.15.0,transformers=4.48.0", False, False),  # not patched
    (SFT + " --lora_target_modules q_proj lm_head", "trl=0.15.0,transformers=4.49.0", True, False),
    (SFT + " --lora_target_modules q_proj lm_head", "trl=1.15.0,transformers=5.0.0", False, True),
])
def test_trl_releases_decide(line, versions, holds, stops):
    doc = _check(line, versions)
    assert (RULE in {f["rule"] for f in doc["findings"]}) == holds, doc["findings"]
    assert bool(doc["stops"]) == stops, doc["stops"]


@pytest.mark.parametrize("stage, targets, holds", [
    ("sft", "q_proj,v_proj,lm_head", True),
    ("sft", "all", False),  # LLaMA-Factory's all leaves the output layer out
    ("dpo", "q_proj,v_proj,lm_head", False),  # the fused loss is on for pt and sft only (model/loader.py)
])
def test_llamafactory(tmp_path, monkeypatch, stage, targets, holds):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lf.yaml").write_text(LF.format(stage=stage, targets=targets))
    doc = _check("llamafactory-cli train lf.yaml", "llama-factory=0.9.3")
    assert (RULE in {f["rule"] for f in doc["findings"]}) == holds, doc["findings"]


def test_ms_swift():
    line = "swift sft --model Qwen/Qwen2.5-7B --train_type lora --target_modules q_proj v_proj lm_head " \
           "--use_liger_kernel true --dataset d"
    assert RULE in {f["rule"] for f in _check(line, "transformers=4.55.0,ms-swift=3.9.0")["findings"]}
    assert RULE not in {f["rule"] for f in _check(line, "transformers=4.46.0,ms-swift=3.0.0")["findings"]}


def test_axolotl(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = ("base_model: meta-llama/Llama-3.1-8B\nadapter: lora\nlora_target_modules:\n  - q_proj\n  - {head}\n"
           "plugins:\n  - axolotl.integrations.liger.LigerPlugin\nliger_fused_linear_cross_entropy: true\n"
           "datasets:\n  - path: d\n    type: alpaca\nsequence_len: 2048\nbf16: true\n")
    for head, holds in (("lm_head", True), ("v_proj", False)):
        (tmp_path / "a.yml").write_text(cfg.format(head=head))
        assert (RULE in {f["rule"] for f in _check("axolotl train a.yml", "axolotl=0.12.0")["findings"]}) == holds
