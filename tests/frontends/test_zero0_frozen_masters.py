"""DeepSpeed without ZeRO builds its fp16 optimizer wrapper over every parameter of the optimizer's groups, frozen ones
included (zero0-frozen-master-copies): deepspeedai/DeepSpeed PR #8029 (requires_grad filtered in PyPI's 0.19.1), PR #7515
(bf16 without ZeRO routed to FP16_Optimizer from 0.17.6), issue #2615. Read from a script's deepspeed.initialize."""

from __future__ import annotations

import json

import pytest
from script_check import check, rules

RULE = "zero0-frozen-master-copies"
SCRIPT = '''
    import deepspeed, torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    model = get_peft_model(AutoModelForCausalLM.from_pretrained("Qwen/Qwen3-8B"), LoraConfig(target_modules=["q_proj"]))
    {opt}
    engine, *_ = deepspeed.initialize(model=model, {params}config="ds.json")
    for batch in loader:
        engine.backward(engine(**batch).loss)
        engine.step()
'''
BF16 = {"bf16": {"enabled": True}, "zero_optimization": {"stage": 0}, "train_micro_batch_size_per_gpu": 1}


@pytest.mark.parametrize("opt, params, config, deepspeed, holds", [
    ("", "model_parameters=model.parameters(), ", BF16, "0.18.0", True),
    ("", "model_parameters=model.parameters(), ", BF16, "0.19.0", True),
    ("", "model_parameters=model.parameters(), ", BF16, "0.19.1", False),  # PR #8029
    ("", "model_parameters=model.parameters(), ", BF16, "0.17.5", False),  # BF16_Optimizer filtered
    ("", "model_parameters=model.parameters(), ", {**BF16, "bf16": {"enabled": False}, "fp16": {"enabled": True}},
     "0.17.5", True),  # fp16 always took FP16_Optimizer
    ("", "model_parameters=model.parameters(), ", {**BF16, "zero_optimization": {"stage": 2}}, "0.18.0", False),
    ("opt = torch.optim.AdamW(model.parameters(), lr=1e-4)", "optimizer=opt, ", BF16, "0.18.0", True),
    ("opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)", "optimizer=opt, ", BF16,
     "0.18.0", False),
    ("", "model_parameters=filter(lambda p: p.requires_grad, model.parameters()), ", BF16, "0.18.0", False),
    ("", "", {**BF16, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}, "0.18.0", True),
    ("", "", BF16, "0.18.0", False),  # no optimizer at all: an inference engine
])
def test_what_the_optimizer_is_built_over_decides(tmp_path, monkeypatch, opt, params, config, deepspeed, holds):
    report = check(tmp_path, monkeypatch, SCRIPT.format(opt=opt, params=params), files={"ds.json": json.dumps(config)},
                   deepspeed=deepspeed)
    assert (RULE in rules(report)) == holds, rules(report)
