"""Resuming an FSDP2 adapter run from the Trainer's FULL_STATE_DICT checkpoints restores only rank 0's slice of the
adapter (fsdp2-adapter-resume-lost): huggingface/accelerate PR #4206 (fixed in 1.15.0), PRs #3527 (1.7.0, FSDP2 with
FULL_STATE_DICT) and #3671; transformers >= 5.10 builds `--fsdp` as FSDP2 with FULL_STATE_DICT (training_args.py of
each release's wheel), and its Trainer passes adapter_only=True from 4.38 (trainer.py _get_fsdp_ckpt_kwargs)."""

from __future__ import annotations

import pytest
import yaml
from script_check import launch_findings

from loraflow.errors import LoraflowError

RULE = "fsdp2-adapter-resume-lost"
HF = ("torchrun --nproc_per_node 2 train.py --model_name_or_path Qwen/Qwen2.5-0.5B --use_peft --lora_r 8 "
      "--lora_target_modules q_proj v_proj --fsdp 'full_shard auto_wrap' {more}")
RESUME = "--resume_from_checkpoint out/checkpoint-200"
STACK = "torch=2.7.1,trl=0.20.0,peft=0.17.0"


@pytest.mark.parametrize("more, versions, holds", [
    (RESUME, "transformers=5.12.0,accelerate=1.10.0", True),  # FSDP2 + FULL_STATE_DICT by default
    (RESUME, "transformers=5.12.0,accelerate=1.15.0", False),  # PR #4206 gathers the adapter
    (RESUME, "transformers=5.9.0,accelerate=1.10.0", False),  # `--fsdp` is FSDP1 before 5.10
    ("--load_best_model_at_end", "transformers=5.12.0,accelerate=1.14.0", True),
    (RESUME + " --fsdp_config '{\"state_dict_type\": \"SHARDED_STATE_DICT\"}'",
     "transformers=5.12.0,accelerate=1.10.0", False),
    (RESUME + " --fsdp_config '{\"version\": 2}'", "transformers=5.9.0,accelerate=1.10.0", False),  # accelerate:
    # SHARDED_STATE_DICT for FSDP2 unless asked
    (RESUME + " --fsdp_config '{\"version\": 2, \"state_dict_type\": \"FULL_STATE_DICT\"}'",
     "transformers=5.9.0,accelerate=1.10.0", True),
])
def test_the_state_dict_type_and_the_releases_decide(tmp_path, monkeypatch, more, versions, holds):
    found = launch_findings(tmp_path, monkeypatch, HF.format(more=more), f"{versions},{STACK}")
    assert (RULE in found) == holds, found
    if holds:
        assert found[RULE] is None  # unconditional: the launch resumes


def test_without_a_resume_it_is_the_question_check_asks(tmp_path, monkeypatch):
    found = launch_findings(tmp_path, monkeypatch, HF.format(more=""),
                            f"transformers=5.12.0,accelerate=1.10.0,{STACK}")
    assert "resumed from one of its checkpoints" in found[RULE]


def test_one_process_keeps_the_whole_adapter(tmp_path, monkeypatch):
    line = HF.format(more=RESUME).replace("--nproc_per_node 2", "--nproc_per_node 1")
    assert RULE not in launch_findings(tmp_path, monkeypatch, line, f"transformers=5.12.0,accelerate=1.10.0,{STACK}")


def test_llama_factory_under_an_accelerate_fsdp2_config(tmp_path, monkeypatch):
    acc = {"distributed_type": "FSDP", "num_processes": 2, "fsdp_config": {
        "fsdp_version": 2, "fsdp_state_dict_type": "FULL_STATE_DICT",
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP"}}
    lf = {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "stage": "sft", "do_train": True, "finetuning_type": "lora",
          "lora_target": "all", "dataset": "alpaca_en_demo", "output_dir": "out", "bf16": True,
          "resume_from_checkpoint": "out/checkpoint-100"}
    files = {"fsdp.yaml": yaml.safe_dump(acc), "lora.yaml": yaml.safe_dump(lf)}
    line = "accelerate launch --config_file fsdp.yaml src/train.py lora.yaml"
    versions = f"transformers=4.55.0,accelerate=1.10.0,llama-factory=0.9.3,{STACK}"
    assert launch_findings(tmp_path, monkeypatch, line, versions, files)[RULE] is None
    files["fsdp.yaml"] = yaml.safe_dump({**acc, "fsdp_config": {**acc["fsdp_config"],
                                                                "fsdp_state_dict_type": "SHARDED_STATE_DICT"}})
    assert RULE not in launch_findings(tmp_path, monkeypatch, line, versions, files)


def test_an_unknown_state_dict_type_is_refused_naming_the_key(tmp_path, monkeypatch):
    line = HF.format(more="--fsdp_config '{\"state_dict_type\": \"FULLSTATE\"}'")
    with pytest.raises(LoraflowError, match="state_dict_type 'FULLSTATE'"):
        launch_findings(tmp_path, monkeypatch, line, f"transformers=5.12.0,accelerate=1.10.0,{STACK}")
