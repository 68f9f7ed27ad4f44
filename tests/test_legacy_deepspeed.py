"""The legacy job: DeepSpeed 0.15.3 in a second virtual environment (scripts/setup_legacy_venv.sh builds it, once).

There, ZeRO-3 with non-reentrant checkpointing and frozen base weights reproduces the catalog's CheckpointError with
naive settings (zero3-frozen-recompute, fixed in DeepSpeed 0.19.3), and loraflow's own trainer, whose plan switches
to reentrant checkpointing plus the input-grad hook for that version, gives the single-process gradients and losses.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from loraflow.verify.crosscheck import Cell, compare, worker_argv
from loraflow.engines.launch import launch_env, run_isolated
from loraflow.setup.model import ASSETS

ROOT = Path(__file__).resolve().parent.parent
LEGACY = ROOT / ".venv-ds0153" / "bin" / "python"


@pytest.fixture(scope="module")
def legacy_python() -> str:
    # Builds the venv on first use (torch from the local wheel, deepspeed 0.15.3 from its sdist); a no-op after.
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "setup_legacy_venv.sh")], capture_output=True, text=True,
                          timeout=1500)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    out = subprocess.run([str(LEGACY), "-c", "import deepspeed; print(deepspeed.__version__)"], capture_output=True,
                         text=True, timeout=120, env=launch_env())
    assert out.stdout.strip().endswith("0.15.3"), out.stdout + out.stderr
    return str(LEGACY)


def test_naive_zero3_non_reentrant_frozen_reproduces_the_checkpoint_error(legacy_python, tmp_path):
    proc = subprocess.run([legacy_python, "-m", "loraflow", "probe", "--only", "zero3-frozen-recompute", "--json",
                           "--logs", str(tmp_path)], capture_output=True, text=True, timeout=600, env=launch_env())
    rows = json.loads(proc.stdout)
    row = rows[0] if isinstance(rows, list) else rows["results"][0]
    log = (tmp_path / "zero3-frozen-recompute.log").read_text()
    assert row["affected"] == "yes" and row["naive"]["status"] == "error", row
    assert "CheckpointError" in log and "torch.Size([0])" in log, log[-3000:]
    assert row["safe_under_loraflow"] == "yes", row


def test_loraflow_plan_trains_correctly_on_deepspeed_0_15_3(legacy_python, tmp_path):
    cells = [Cell("lora", "non-reentrant", "fp32", "zero3"), Cell("dora", "non-reentrant", "fp32", "zero3")]
    model, data = str(ASSETS / "tiny-base"), str(ASSETS / "reverse" / "train.jsonl")
    outs = {}
    for tag, ranks in (("ref", 1), ("run", 2)):
        argv, outs[tag] = worker_argv(cells, model, data, tmp_path, tag, ranks, reference=ranks == 1,
                                      python=legacy_python)
        log = tmp_path / f"{tag}.log"
        code = run_isolated(argv, log, 600, launch_env())
        assert code == 0, log.read_text()[-4000:]
    ref = torch.load(outs["ref"], weights_only=False)["results"]
    run = torch.load(outs["run"], weights_only=False)["results"]
    for cell in cells:
        r = compare(run[cell.id], ref[cell.reference().id])
        assert r["status"] == "ok", r
        assert "zero3-frozen-recompute" in r["rules"], r  # the plan switched to reentrant for this version
        assert r["grad_error"] <= 1e-5 and r["loss_error"] <= 1e-5, r
