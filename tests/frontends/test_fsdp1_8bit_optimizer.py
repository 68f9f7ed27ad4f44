"""An FSDP1 checkpoint of a bitsandbytes 8-bit optimizer's state (fsdp1-8bit-optimizer-save): FSDP1 reshapes every
tensor of a parameter's optimizer state as the flat shard, and bitsandbytes' uint8 codes beside float32 block
statistics fail the gather until bitsandbytes 0.49.2 (PR #1840). Threads: bitsandbytes#89, #323, #1403,
huggingface/accelerate#1362, oumi-ai/oumi PR #835. Measured here on two gloo ranks with the installed torch and
bitsandbytes (scripts/fsdp1_8bit_optimizer_save.py), as released on both sides of the fix."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from script_check import launch_findings

from loraflow.explain import diagnose_log

RULE = "fsdp1-8bit-optimizer-save"
ROOT = Path(__file__).resolve().parents[2]
HF = ("accelerate launch --num_processes 2 train.py --model_name_or_path meta-llama/Llama-3.1-8B --use_peft "
      "--fsdp 'full_shard auto_wrap' --output_dir out {more}")


@pytest.mark.parametrize("more, versions, holds", [
    ("--optim paged_adamw_8bit", "bitsandbytes=0.48.2,transformers=4.57.1", True),
    ("--optim adamw_bnb_8bit --save_steps 100", "bitsandbytes=0.49.1,transformers=4.57.1", True),
    ("--optim paged_adamw_8bit", "bitsandbytes=0.49.2,transformers=4.57.1", False),  # PR #1840
    ("--optim paged_adamw_8bit --save_only_model", "bitsandbytes=0.48.2,transformers=4.57.1", False),
    ("--optim paged_adamw_8bit --save_strategy no", "bitsandbytes=0.48.2,transformers=4.57.1", False),
    ("--optim paged_adamw_32bit", "bitsandbytes=0.48.2,transformers=4.57.1", False),
    ("--optim adamw_torch_8bit", "bitsandbytes=0.48.2,transformers=4.57.1", False),  # torchao's, not bitsandbytes'
    ("--optim paged_adamw_8bit", "bitsandbytes=0.48.2,transformers=5.10.0", False),  # `--fsdp` is FSDP2 from 5.10
])
def test_the_optimizer_the_saves_and_the_release_decide(tmp_path, monkeypatch, more, versions, holds):
    found = launch_findings(tmp_path, monkeypatch, HF.format(more=more), versions)
    assert (RULE in found) == holds, found


def test_an_axolotl_config(tmp_path, monkeypatch):
    config = ("base_model: meta-llama/Llama-3.1-8B\nadapter: lora\nlora_target_linear: true\n"
              "optimizer: adamw_bnb_8bit\nfsdp:\n  - full_shard\n  - auto_wrap\nfsdp_config:\n  fsdp_version: 1\n")
    found = launch_findings(tmp_path, monkeypatch, "accelerate launch --num_processes 2 -m axolotl.cli.train qlora.yml",
                            "bitsandbytes=0.48.2,transformers=4.57.1", {"qlora.yml": config})
    assert found.get(RULE, "absent") is None, found


@pytest.mark.parametrize("log", [
    "AssertionError: Expected dtype == info.dtype, got torch.uint8 != torch.float32",
    "AssertionError: Expected dtype == info.dtype, got torch.float32 != torch.uint8",
    '  File "/env/site-packages/accelerate/utils/fsdp_utils.py", line 186, in save_fsdp_optimizer\n'
    "    optim_state = FSDP.optim_state_dict(model, optimizer)\n"
    '  File "/env/site-packages/torch/distributed/fsdp/_optim_utils.py", line 228, in _communicate_optim_state\n'
    "RuntimeError: output tensor must have the same type as input tensor",
])
def test_explain_names_it(log):
    _, candidates, _ = diagnose_log(log)
    assert candidates and candidates[0].rule.id == RULE, [c.rule.id for c in candidates]


def test_without_the_optimizer_state_gather_a_type_mismatch_is_not_claimed_for_it():
    _, candidates, _ = diagnose_log("RuntimeError: output tensor must have the same type as input tensor")
    assert RULE not in [c.rule.id for c in candidates]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_gather_fails_as_released_before_0_49_2_and_saves_after():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                           str(_port()), str(ROOT / "scripts/fsdp1_8bit_optimizer_save.py")], env=env,
                          capture_output=True, text=True, timeout=300)
    lines = {line.split(": ", 1)[0]: line.split(": ", 1)[1] for line in done.stdout.splitlines() if ": " in line}
    assert len(lines) == 4, done.stdout + done.stderr[-2000:]
    for orig in (False, True):
        before, after = lines[f"use_orig_params={orig} bitsandbytes<0.49.2"], lines[f"use_orig_params={orig} "
                                                                                    "bitsandbytes>=0.49.2"]
        assert after.startswith("saved") and not after.startswith("saved 0"), after
        assert before.startswith("failed"), before
    # what use_orig_params prints is this rule's own message; gloo words the other failure as its own size check
    _, candidates, _ = diagnose_log(lines["use_orig_params=True bitsandbytes<0.49.2"].removeprefix("failed: "))
    assert candidates[0].rule.id == RULE
