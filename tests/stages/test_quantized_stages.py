"""Every stage on a 4-bit (NF4) base: one optimizer step's loss, statistics and every adapter gradient equal the same
step on the dequantized base (the same weights as float32 layers), and rollouts sample the same tokens. Each stage
runs its embedded default (GRPO and PPO start from an SFT adapter merged into the base before it is quantized; DPO's
reference is the quantized base with the adapters switched off)."""

from __future__ import annotations

import pytest
import torch

from loraflow.verify.stepcheck import StepCell, run_cell

STAGES = ("sft", "rm", "dpo", "grpo", "ppo")


def cell(tmp_path, stage: str, dequantize: bool) -> StepCell:
    overrides = ["model.quantization.method=nf4", "data.eval=", "output.progress_bar=false",
                 "output.tensorboard=false", "train.seed=3", "train.micro_batch_size=4", "parallel.engine=single",
                 f"output.dir={tmp_path / ('deq' if dequantize else 'q')}"]
    if stage in ("grpo", "ppo"):
        overrides += ["rl.group_size=4", "rl.max_new_tokens=8"]
    return StepCell(stage, tuple(overrides), 1, dequantize)


@pytest.mark.parametrize("stage", STAGES)
def test_a_step_on_the_4bit_base_equals_the_step_on_its_dequantized_weights(tmp_path, stage):
    got, want = run_cell(cell(tmp_path, stage, False)), run_cell(cell(tmp_path, stage, True))
    assert got["status"] == want["status"] == "ok"
    assert not got["missing"] and set(got["grads"]) == set(want["grads"]) and len(want["grads"]) > 10
    worst = max(float((got["grads"][k] - v).norm() / v.norm().clamp_min(1e-12)) for k, v in want["grads"].items())
    assert worst <= 1e-5, f"{stage}: gradient relative error {worst:.2e}"
    scale = max(abs(want["stats"]["loss"]), 1e-2 if stage == "grpo" else 0.0)  # GRPO's loss sits near 0
    assert abs(got["stats"]["loss"] - want["stats"]["loss"]) <= 1e-5 * scale
    if stage in ("grpo", "ppo"):
        assert got["tokens"] == want["tokens"] and got["tokens"]
    assert all(torch.isfinite(g).all() for g in got["grads"].values())
