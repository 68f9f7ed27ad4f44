"""vLLM 0.11.0 with LoRA enabled cannot start a Qwen3-VL engine (vllm-qwen3vl-lora-start): volcengine/verl#4418 and
#3922 (verl pinned vllm 0.11.0), fixed by vllm-project/vllm PR #27027 in 0.11.1; read from the vllm wheels (the
Qwen3-VL model file's tower prefix, lora_shrink_op.py's assertion)."""

from __future__ import annotations

import pytest
from script_check import launch_findings

from loraflow.explain import diagnose_log

RULE = "vllm-qwen3vl-lora-start"
VERL = ("python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo actor_rollout_ref.model.path={model} "
        "actor_rollout_ref.model.lora_rank={rank} actor_rollout_ref.model.exclude_modules='.*visual.*' "
        "actor_rollout_ref.rollout.name=vllm trainer.n_gpus_per_node=8")


@pytest.mark.parametrize("model, rank, vllm, holds", [
    ("Qwen/Qwen3-VL-8B-Instruct", 64, "0.11.0", True),  # exclude_modules does not reach the engine
    ("/models/Qwen3-VL-30B-A3B-Instruct", 64, "0.11.0", True),
    ("Qwen/Qwen3-VL-8B-Instruct", 64, "0.11.1", False),  # PR #27027
    ("Qwen/Qwen2.5-VL-7B-Instruct", 64, "0.11.0", False),
    ("Qwen/Qwen3-VL-8B-Instruct", 0, "0.11.0", False),  # no LoRA: merged weights, LoRA off in the engine
])
def test_the_model_and_the_vllm_release_decide(tmp_path, monkeypatch, model, rank, vllm, holds):
    found = launch_findings(tmp_path, monkeypatch, VERL.format(model=model, rank=rank), f"vllm={vllm},verl=0.6.1")
    assert (RULE in found) == holds, found


def test_explain_reads_the_assertion_in_lora_shrink():
    log = ('  File "/env/lib/python3.12/site-packages/vllm/lora/ops/triton_ops/lora_shrink_op.py", line 149, in '
           '_lora_shrink\n    assert token_lora_mapping.size(0) == M\n    AssertionError\n')
    _, candidates, _ = diagnose_log(log)
    assert candidates and candidates[0].rule.id == RULE
