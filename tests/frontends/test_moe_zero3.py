"""A sparse mixture-of-experts block that calls only the experts its tokens reach, under ZeRO-3 on several ranks,
not registered as a ZeRO-3 leaf module: ranks wait for each other's experts until NCCL's watchdog fires
(moe-zero3-expert-hang). The cluster: deepspeedai/DeepSpeed#7461, #5066, #5502, modelscope/ms-swift#5875, #5400,
hiyouga/LlamaFactory#1931, #2315, #9222, OpenGVLab/InternVL#1193; the mechanism deepspeedai/DeepSpeed PR #4966.
Which transformers releases skip experts is read from each minor release's wheel (4.36.0 - 5.23.0); which frameworks
register leaf modules from their wheels and sources (frontends/moe_blocks.py)."""

from __future__ import annotations

import json

import pytest
from script_check import launch_findings

from loraflow.explain import diagnose_log
from loraflow.frontends import parse_versions, run_check
from loraflow.frontends.moe_blocks import MOE_SKIPS

RULE = "moe-zero3-expert-hang"
TRL = "torchrun --nproc_per_node {n} trl/scripts/sft.py --model_name_or_path {model} --use_peft --deepspeed z3.json"
SWIFT = "env NPROC_PER_NODE=2 swift sft --model {model} --train_type lora --deepspeed zero3 --dataset d"


def _findings(tmp_path, monkeypatch, line: str, versions: str) -> dict[str, str | None]:
    return launch_findings(tmp_path, monkeypatch, line, versions,
                           {"z3.json": '{"zero_optimization": {"stage": 3}, "bf16": {"enabled": "auto"}}'})


@pytest.mark.parametrize("line, versions, holds", [
    (TRL.format(n=2, model="Qwen/Qwen3-30B-A3B"), "transformers=4.55.0,deepspeed=0.17.0,trl=0.21.0", True),
    (TRL.format(n=2, model="Qwen/Qwen3-30B-A3B"), "transformers=4.52.4,deepspeed=0.17.0,trl=0.21.0", False),
    (TRL.format(n=2, model="Qwen/Qwen3-30B-A3B"), "transformers=5.0.0,deepspeed=0.17.0,trl=0.21.0", False),
    (TRL.format(n=1, model="Qwen/Qwen3-30B-A3B"), "transformers=4.55.0,deepspeed=0.17.0,trl=0.21.0", False),
    (TRL.format(n=2, model="mistralai/Mixtral-8x7B-v0.1"), "transformers=4.36.2,deepspeed=0.13.0,trl=0.7.10", True),
    (TRL.format(n=2, model="mistralai/Mixtral-8x7B-v0.1"), "transformers=4.45.0,deepspeed=0.15.0,trl=0.11.0", False),
    (TRL.format(n=2, model="meta-llama/Llama-3.1-8B"), "transformers=4.55.0,deepspeed=0.17.0,trl=0.21.0", False),
    (SWIFT.format(model="Qwen/Qwen3-30B-A3B"), "transformers=4.55.0,deepspeed=0.17.0,ms-swift=3.8.0", True),
    (SWIFT.format(model="Qwen/Qwen3-30B-A3B"), "transformers=4.55.0,deepspeed=0.17.0,ms-swift=3.9.0", False),
    (SWIFT.format(model="mistralai/Mixtral-8x7B-v0.1"), "transformers=4.55.0,deepspeed=0.17.0,ms-swift=3.9.0",
     True),  # ms-swift's list has no Mixtral
])
def test_the_releases_and_the_framework_decide(tmp_path, monkeypatch, line, versions, holds):
    found = _findings(tmp_path, monkeypatch, line, versions)
    assert (RULE in found) == holds, found


def test_unknown_transformers_names_the_range(tmp_path, monkeypatch):
    found = _findings(tmp_path, monkeypatch, TRL.format(n=2, model="Qwen/Qwen3-30B-A3B"), "trl=0.21.0")
    assert found.get(RULE) == "4.53.0<=transformers<5.0.0", found


def test_a_script_that_registers_the_block_itself(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "z3.json").write_text('{"zero_optimization": {"stage": 3}}')
    (tmp_path / "train.py").write_text(
        "import deepspeed\nfrom transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
        "from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock\n"
        "args = TrainingArguments(output_dir='o', deepspeed='z3.json')\n"
        "model = AutoModelForCausalLM.from_pretrained('mistralai/Mixtral-8x7B-v0.1')\n"
        "deepspeed.utils.set_z3_leaf_modules(model, [MixtralSparseMoeBlock])\n"
        "Trainer(model=model, args=args).train()\n")
    doc = json.loads(run_check(["torchrun", "--nproc_per_node", "2", "train.py"], None, [],
                               dict(parse_versions("transformers=4.36.2,deepspeed=0.13.0")), as_json=True)[0])
    assert RULE not in {f["rule"] for f in doc["findings"]}
    assert doc["setup"]["moe_leaf_registered"] is True


def test_every_listed_block_has_its_ranges_in_order():
    for kind, ranges in MOE_SKIPS.items():
        assert all(lo is None or lo < hi for lo, hi in ranges), kind


def test_explain_needs_the_moe_model():
    watchdog = ("[rank0]:[E801 01:06:56.381097551 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective "
                "operation timeout: WorkNCCL(SeqNum=75813, OpType=_ALLGATHER_BASE, NumelIn=393216, "
                "NumelOut=1572864, Timeout(ms)=600000) ran for 600024 milliseconds before timing out.")
    _, alone, _ = diagnose_log(watchdog)
    assert not alone or alone[0].rule.id != RULE
    context = ("Loading checkpoint shards: Qwen3-30B-A3B\n  File \"/x/deepspeed/runtime/zero/"
               "partitioned_param_coordinator.py\", line 3, in fetch_sub_module\n")
    _, candidates, _ = diagnose_log(context + watchdog)
    assert candidates and candidates[0].rule.id == RULE
