"""benchmarks/grpo_step.py at its smoke size, loraflow (generate) and TRL's GRPOTrainer only: vLLM's start alone
would take half a minute of a suite already over its time budget (tests/stages/test_vllm_rollouts.py runs loraflow
on vLLM). The two variants must see the same first-step prompt token ids and generate full-length completions, and
every timed step must have a positive time. Nothing here is about speed."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from conftest import ROOT

SCRIPT = ROOT / "benchmarks" / "grpo_step.py"
VARIANTS = ("loraflow-hf", "trl")


def _grpo_step_module():
    spec = importlib.util.spec_from_file_location("grpo_step_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_loraflow_and_trl_time_the_same_steps(tmp_path):
    out = tmp_path / "grpo_step.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--variants", ",".join(VARIANTS), "--json",
                           str(out), "--workdir", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["comparable"] and report["problems"] == [], report["problems"]
    assert "NOT COMPARABLE" not in proc.stdout
    summary = report["summary"]
    for v in VARIANTS:
        r = summary[v]
        assert "error" not in r, (v, r.get("error"), r.get("tail"))
        assert len(r["step_times"]) == report["steps"] - 1  # the first step is warm-up
        assert all(t > 0 for t in r["step_times"]) and r["median_s"] > 0 and r["min_s"] > 0, (v, r["step_times"])
        assert r["generated"] == [report["expected_tokens_per_step"]]  # every completion full length
    hashes = {h for v in VARIANTS for h in summary[v]["first_prompts"]}
    assert len(hashes) == 1 and None not in hashes
    assert report["ratios"]["loraflow-hf/trl"] == pytest.approx(summary["loraflow-hf"]["median_s"]
                                                                / summary["trl"]["median_s"])


def test_the_comparability_check_catches_other_prompts_or_short_completions():
    bench = _grpo_step_module()
    same = {v: {"first_prompts": ["abc"], "generated": [256], "step_times": [1.0]} for v in VARIANTS}
    assert bench.problems(same, 256) == []
    other_prompts = {**same, "trl": {**same["trl"], "first_prompts": ["abd"]}}
    assert "prompt token ids differ" in bench.problems(other_prompts, 256)[0]
    short = {**same, "loraflow-hf": {**same["loraflow-hf"], "generated": [250, 256]}}
    assert "not 256" in bench.problems(short, 256)[0]


def test_one_reward_function_serves_both_calling_conventions():
    bench = _grpo_step_module()
    texts = ["w2 w3 w4 w5", "w1", ""]
    loraflow_style = bench.reward(texts, [{}, {}, {}])
    trl_style = bench.reward(prompts=["p"] * 3, completions=texts, completion_ids=[[], [], []], trainer_state=None)
    assert loraflow_style == trl_style == [0.5, 0.0, 0.0]
