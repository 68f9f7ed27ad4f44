"""The legacy job: DeepSpeed 0.15.3 in a second virtual environment (scripts/setup_legacy_venv.sh builds it once,
before pytest, into a cache outside the clone).

There, ZeRO-3 with non-reentrant checkpointing and frozen base weights reproduces the catalog's CheckpointError with
naive settings (zero3-frozen-recompute, fixed in DeepSpeed 0.19.3), and loraflow's own trainer, whose plan switches
to reentrant checkpointing plus the input-grad hook for that version, gives the single-process gradients and losses.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import torch
from conftest import LAUNCH_TIMEOUT

from loraflow.engines.launch import launch_env, run_isolated
from loraflow.locations import ASSETS
from loraflow.verify.crosscheck import Cell, compare, worker_argv
from loraflow.verify.side_envs import side_python

SETUP = "bash scripts/setup_legacy_venv.sh"


@pytest.fixture(scope="module")
def legacy_python() -> str:
    # Built once by a setup step before pytest (it takes minutes; CI caches it between runs), never here.
    legacy = side_python("legacy")
    if not legacy.is_file():
        pytest.fail(f"the DeepSpeed 0.15.3 environment is missing ({legacy} does not exist): build it with "
                    f"`{SETUP}` (scripts/test.sh runs it before pytest), then run the tests again")
    out = subprocess.run([str(legacy), "-c", "import deepspeed; print(deepspeed.__version__)"], capture_output=True,
                         text=True, timeout=120, env=launch_env())
    assert out.stdout.strip().endswith("0.15.3"), f"{legacy} is not DeepSpeed 0.15.3 ({SETUP} rebuilds it):\n" \
        + out.stdout + out.stderr
    return str(legacy)


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
        code = run_isolated(argv, log, LAUNCH_TIMEOUT, launch_env())
        assert code == 0, log.read_text()[-4000:]
    ref = torch.load(outs["ref"], weights_only=False)["results"]
    run = torch.load(outs["run"], weights_only=False)["results"]
    for cell in cells:
        r = compare(run[cell.id], ref[cell.reference().id])
        assert r["status"] == "ok", r
        assert "zero3-frozen-recompute" in r["rules"], r  # the plan switched to reentrant for this version
        assert r["grad_error"] <= 1e-5 and r["loss_error"] <= 1e-5, r
