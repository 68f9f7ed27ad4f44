"""A number the DeepSpeed file states that differs from the TrainingArguments value of the same meaning: transformers
refuses the run before the first step (integrations/deepspeed.py trainer_config_finalize, since 4.7.0). Threads:
hiyouga/LlamaFactory#201 (accumulation 4 vs 2), #1116 (a quoted "8"), shibing624/MedicalGPT#191,
huggingface/transformers#27830, #29348, CarperAI/trlx#376."""

from __future__ import annotations

import json
import shlex

import pytest

from loraflow.frontends import parse_versions, run_check

LINE = "torchrun --nproc_per_node 2 train.py --deepspeed ds.json --bf16 {flags}"


def _stops(tmp_path, monkeypatch, ds: dict, flags: str) -> list[str]:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 2}, **ds}))
    doc = json.loads(run_check(shlex.split(LINE.format(flags=flags)), None, [],
                               dict(parse_versions("transformers=4.45.0")), as_json=True)[0])
    return doc["stops"]


@pytest.mark.parametrize("ds, flags, stops", [
    ({"gradient_accumulation_steps": 4}, "--gradient_accumulation_steps 2", True),
    ({"gradient_accumulation_steps": 4}, "--gradient_accumulation_steps 4", False),
    ({"gradient_accumulation_steps": "auto"}, "--gradient_accumulation_steps 2", False),
    ({"train_micro_batch_size_per_gpu": "8"}, "--per_device_train_batch_size 8", True),  # a quoted number
    ({"gradient_clipping": 1.0}, "--max_grad_norm 0.3", True),
    ({"optimizer": {"type": "AdamW", "params": {"lr": 2e-5}}}, "--learning_rate 1e-4", True),
    ({"optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}, "--learning_rate 1e-4", False),
    # A script of its own may set it in code: only what the launch states is compared.
    ({"gradient_accumulation_steps": 4}, "", False),
])
def test_the_file_and_the_flags(tmp_path, monkeypatch, ds, flags, stops):
    found = _stops(tmp_path, monkeypatch, ds, flags)
    assert bool(found) == stops, found
    if stops:
        assert "transformers refuses the run" in found[0]


def test_a_cli_launch_is_compared_with_the_trainer_default(tmp_path, monkeypatch):
    # TRL's own CLI: every TrainingArguments value is on the line, so an unset accumulation is the default 1.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 2}, "gradient_accumulation_steps": 4}))
    doc = json.loads(run_check(shlex.split("trl sft --model_name_or_path m --dataset_name d --deepspeed ds.json"),
                               None, [], dict(parse_versions("transformers=4.45.0,trl=0.11.0")), as_json=True)[0])
    assert doc["stops"] and "hf gradient_accumulation_steps=1" in doc["stops"][0]
