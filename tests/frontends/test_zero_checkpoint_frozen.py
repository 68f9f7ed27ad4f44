"""What a DeepSpeed engine checkpoint of an adapter run keeps: deepspeedai/DeepSpeed PR #3953
(exclude_frozen_parameters, 0.10.1) and issue #3437, Lightning-AI/pytorch-lightning #20949 / PR #21060; the HF
Trainer excludes a PeftModel's frozen weights from transformers 4.37 (PR #27825) and resumes them non-strictly from
4.38 (PR #28746), read from each release's trainer.py; OpenRLHF's save_ckpt passes no flag
(openrlhf/utils/deepspeed/deepspeed.py). Resuming a PEFT model's checkpoint under 4.37: haotian-liu/LLaVA#1200 and
#1492 (LLaVA pins 4.37.2), hiyouga/LlamaFactory#2466."""

from __future__ import annotations

import json

import pytest
import yaml
from script_check import launch_findings

FROZEN, STRICT = "zero-checkpoint-frozen-base", "zero-peft-resume-strict"
HF = ("deepspeed --num_gpus 2 train.py --model_name_or_path meta-llama/Llama-2-7b-hf --deepspeed z2.json "
      "--output_dir out {more}")
PEFT = "--use_peft --lora_target_modules q_proj v_proj"
STACK = "torch=2.1.2,peft=0.7.1,trl=0.7.10,accelerate=0.26.1,deepspeed=0.13.1"
FILES = {"z2.json": json.dumps({"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": "auto"})}


@pytest.mark.parametrize("more, transformers, frozen, strict", [
    (PEFT, "4.36.2", True, False),  # every checkpoint holds the base
    (PEFT + " --resume_from_checkpoint out/checkpoint-50", "4.37.2", False, True),  # saved without it, loaded strict
    (PEFT + " --resume_from_checkpoint out/checkpoint-50", "4.38.0", False, False),
    (PEFT + " --save_only_model", "4.36.2", False, False),  # no engine checkpoint at all
])
def test_the_trainer_release_decides(tmp_path, monkeypatch, more, transformers, frozen, strict):
    found = launch_findings(tmp_path, monkeypatch, HF.format(more=more), f"transformers={transformers},{STACK}",
                            FILES)
    assert (FROZEN in found, STRICT in found) == (frozen, strict), found
    if strict:
        assert found[STRICT] is None


def test_without_a_resume_the_strict_load_is_the_question(tmp_path, monkeypatch):
    found = launch_findings(tmp_path, monkeypatch, HF.format(more=PEFT), f"transformers=4.37.2,{STACK}", FILES)
    assert "resumed from one of its checkpoints" in found[STRICT]


def test_llama_factory_freeze_tuning_keeps_the_base_in_every_checkpoint(tmp_path, monkeypatch):
    lf = {"model_name_or_path": "meta-llama/Llama-2-7b-hf", "stage": "sft", "do_train": True,
          "finetuning_type": "freeze", "dataset": "alpaca_en_demo", "output_dir": "out", "bf16": True,
          "deepspeed": "z2.json"}
    files = {**FILES, "freeze.yaml": yaml.safe_dump(lf)}
    line = "llamafactory-cli train freeze.yaml"
    versions = f"transformers=4.45.0,llama-factory=0.9.0,{STACK}"
    assert launch_findings(tmp_path, monkeypatch, line, versions, files)[FROZEN] is None
    lf["finetuning_type"] = "lora"
    files["freeze.yaml"] = yaml.safe_dump(lf)
    assert FROZEN not in launch_findings(tmp_path, monkeypatch, line, versions, files)


def test_openrlhf_checkpoints_keep_the_base_when_it_saves_them(tmp_path, monkeypatch):
    line = ("deepspeed --module openrlhf.cli.train_sft --pretrain meta-llama/Llama-2-7b-hf --zero_stage 2 --bf16 "
            "--lora_rank 16 --dataset d {more}")
    versions = f"openrlhf=0.5.0,transformers=4.46.0,{STACK}"
    assert launch_findings(tmp_path, monkeypatch, line.format(more="--save_steps 100 --ckpt_path ck"),
                           versions)[FROZEN] is None
    assert FROZEN not in launch_findings(tmp_path, monkeypatch, line.format(more=""), versions)
