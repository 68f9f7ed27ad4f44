"""A ZeRO-3 policy gathered whole on every rank to sync it to vLLM (zero3-sync-full-gather): modelscope/ms-swift#7986,
#7822, #4023 and PR #3692, huggingface/trl PR #3133 and #5766. TRL's PEFT path (0.14 - 1.16) and ms-swift's groups
(--move_model_batches; 3.12.0 - 3.12.5 gather everything whatever it says) are read from their wheels."""

from __future__ import annotations

import json

import pytest
from script_check import launch_findings

from loraflow.explain import diagnose_log

RULE = "zero3-sync-full-gather"
TRL = ("accelerate launch --num_processes 4 trl/scripts/grpo.py --model_name_or_path Qwen/Qwen2.5-72B-Instruct "
       "--use_vllm --deepspeed {ds} --dataset_name d {peft}")
PEFT = "--use_peft --lora_target_modules q_proj v_proj"
SWIFT = ("env NPROC_PER_NODE=4 swift rlhf --rlhf_type grpo --model Qwen/QwQ-32B --train_type lora --use_vllm true "
         "--deepspeed zero3 --dataset d {more}")


def _findings(tmp_path, monkeypatch, line: str, versions: str) -> dict[str, str | None]:
    return launch_findings(tmp_path, monkeypatch, line, versions,
                           {f"z{stage}.json": json.dumps({"zero_optimization": {"stage": stage}}) for stage in (2, 3)})


@pytest.mark.parametrize("line, versions, holds", [
    (TRL.format(ds="z3.json", peft=PEFT), "trl=0.20.0", True),
    (TRL.format(ds="z3.json", peft=""), "trl=0.20.0", False),  # full weights are gathered one at a time
    (TRL.format(ds="z2.json", peft=PEFT), "trl=0.20.0", False),  # nothing is partitioned
    (SWIFT.format(more=""), "ms-swift=3.10.0", True),  # one group: the whole model
    (SWIFT.format(more="--move_model_batches 16"), "ms-swift=3.10.0", False),
    (SWIFT.format(more="--move_model_batches 16"), "ms-swift=3.12.3", True),  # ms-swift#7986
    (SWIFT.format(more="--move_model_batches 16"), "ms-swift=3.12.6", False),
])
def test_the_framework_and_its_release_decide(tmp_path, monkeypatch, line, versions, holds):
    found = _findings(tmp_path, monkeypatch, line, versions + ",transformers=4.55.0")
    assert (RULE in found) == holds, found
    if holds:  # whether the copy fits is the model's size against the GPU, which no launch shows
        assert "does not fit one GPU" in found[RULE]


def test_explain_needs_the_gather_inside_the_sync():
    oom = ("[rank4]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 462.00 MiB. GPU 4 has a total "
           "capacity of 79.11 GiB of which 462.56 MiB is free.")
    _, alone, _ = diagnose_log(oom)
    assert not alone or alone[0].rule.id != RULE
    frames = ('  File "/x/swift/trainers/rlhf_trainer/grpo_trainer.py", line 380, in _move_full_model_to_vllm\n'
              '  File "/x/deepspeed/runtime/zero/partition_parameters.py", line 1810, in _allgather_params_coalesced\n')
    _, candidates, _ = diagnose_log(frames + oom)
    assert candidates and candidates[0].rule.id == RULE
