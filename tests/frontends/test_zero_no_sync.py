"""Gradient accumulation under ZeRO-2/3 through accelerate's no_sync, which DeepSpeed >= 0.16.0 asserts against
(zero-no-sync-accumulation). The cluster: deepspeedai/DeepSpeed#6793, huggingface/transformers#34984 and PR #35157,
huggingface/accelerate#3481, hiyouga/LlamaFactory#6194, modelscope/ms-swift#4230, DB-GPT-Hub#298, E5-V#23, WPO#4,
FaithDiff#24, zero_nlp#204. The Trainer's path is fixed in transformers 4.48.0, accelerate's in 1.9.0."""

from __future__ import annotations

import json
import shlex

import pytest
from script_check import check, rules

from loraflow.explain import diagnose_log
from loraflow.frontends import parse_versions, run_check

RULE = "zero-no-sync-accumulation"
BROKEN = "deepspeed=0.16.0,transformers=4.46.1,accelerate=1.0.1,trl=0.12.0"


def _check(tmp_path, monkeypatch, line: str, versions: str, zero: int = 3) -> dict:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": zero}, "bf16": {"enabled": "auto"},
                                                  "gradient_accumulation_steps": "auto"}))
    doc = json.loads(run_check(shlex.split(line), None, [], dict(parse_versions(versions)), as_json=True)[0])
    return doc


TRL = "deepspeed --num_gpus 4 trl/scripts/sft.py --model_name_or_path m --output_dir o --use_peft --deepspeed ds.json"


@pytest.mark.parametrize("versions, holds", [
    (BROKEN, True),
    ("deepspeed=0.16.0,transformers=4.47.1,accelerate=1.2.1,trl=0.13.0", True),  # 4.47 calls no_sync itself
    ("deepspeed=0.16.0,transformers=4.48.0,accelerate=1.2.1,trl=0.13.0", False),  # the Trainer skips it (PR #35157)
    ("deepspeed=0.16.0,transformers=4.46.1,accelerate=1.9.0,trl=0.12.0", False),  # accelerate skips ZeRO-2/3
    ("deepspeed=0.15.4,transformers=4.46.1,accelerate=1.0.1,trl=0.12.0", False),  # no no_sync on the engine yet
])
def test_the_releases_decide(tmp_path, monkeypatch, versions, holds):
    doc = _check(tmp_path, monkeypatch, TRL + " --gradient_accumulation_steps 8", versions)
    found = {f["rule"]: f for f in doc["findings"]}
    assert (RULE in found) == holds, doc["findings"]
    if holds:
        assert found[RULE]["holds_if"] is None and doc["exit_code"] == 2
        assert any("--gradient_accumulation_steps" in fix for fix in found[RULE]["fix_here"])


def test_one_micro_batch_or_zero_1_never_enters_it(tmp_path, monkeypatch):
    assert RULE not in {f["rule"] for f in _check(tmp_path, monkeypatch, TRL, BROKEN)["findings"]}
    doc = _check(tmp_path, monkeypatch, TRL + " --gradient_accumulation_steps 8", BROKEN, zero=1)
    assert RULE not in {f["rule"] for f in doc["findings"]}


def test_unknown_releases_leave_one_question(tmp_path, monkeypatch):
    doc = _check(tmp_path, monkeypatch, TRL + " --gradient_accumulation_steps 8", "trl=0.12.0", zero=2)
    found = next(f for f in doc["findings"] if f["rule"] == RULE)
    assert "deepspeed>=0.16.0" in found["holds_if"] and "transformers<4.48.0" in found["holds_if"]
    assert doc["exit_code"] == 1, doc["findings"]


def test_ms_swift_fills_the_steps_itself(tmp_path, monkeypatch):
    """ms-swift 3 sets an unset --gradient_accumulation_steps to ceil(16 / per-device batch / processes)."""
    line = "env NPROC_PER_NODE=4 swift sft --model Qwen/Qwen2.5-7B --train_type lora --deepspeed zero2"
    doc = _check(tmp_path, monkeypatch, line, BROKEN + ",ms-swift=3.0.0")
    assert doc["setup"]["grad_accum_steps"] == 4 and RULE in {f["rule"] for f in doc["findings"]}
    doc = _check(tmp_path, monkeypatch, line + " --per_device_train_batch_size 4", BROKEN + ",ms-swift=3.0.0")
    assert doc["setup"]["grad_accum_steps"] == 1 and RULE not in {f["rule"] for f in doc["findings"]}


LOOP = """\
    import torch
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM
    from peft import LoraConfig, get_peft_model

    accelerator = Accelerator(gradient_accumulation_steps=4)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained("m"), LoraConfig(r=8, target_modules=["q_proj"]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for batch in loader:
        {body}
"""
STEP = """loss = model(**batch).loss
        accelerator.backward(loss)
        optimizer.step()"""


def test_a_custom_loop_with_accelerate_accumulate(tmp_path, monkeypatch):
    (tmp_path / "acc.yaml").write_text("distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n"
                                       "  zero_stage: 2\n  gradient_accumulation_steps: 4\n")
    argv = ["accelerate", "launch", "--config_file", "acc.yaml", "train.py"]
    accumulating = LOOP.format(body="with accelerator.accumulate(model):\n            " +
                               STEP.replace("\n        ", "\n            "))
    report = check(tmp_path, monkeypatch, accumulating, argv, deepspeed="0.16.4", accelerate="1.3.0")
    assert RULE in rules(report) and report["setup"]["accumulation_loop"] == "accelerate"
    own = check(tmp_path, monkeypatch, LOOP.format(body=STEP), argv, deepspeed="0.16.4", accelerate="1.3.0")
    assert RULE not in rules(own) and own["setup"]["accumulation_loop"] == "own"


def test_explain_names_the_assertion():
    log = """\
  File "/opt/conda/lib/python3.10/site-packages/transformers/trainer.py", line 2480, in _inner_training_loop
    with context():
  File "/opt/conda/lib/python3.10/site-packages/accelerate/accelerator.py", line 973, in no_sync
    with context():
  File "/opt/conda/lib/python3.10/site-packages/deepspeed/runtime/engine.py", line 1995, in no_sync
    assert not self.zero_optimization_partition_gradients(), \\
AssertionError: no_sync context manager is incompatible with gradient partitioning logic of ZeRO stage 3
"""
    for text in (log, log.splitlines()[-1]):
        _, candidates, _ = diagnose_log(text, None)
        assert candidates and candidates[0].rule.id == RULE and candidates[0].confidence == "confirmed", text
