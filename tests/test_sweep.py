"""The composition sweep (scripts/sweep.py, loraflow/verify/sweep_*.py): its covering set covers, every axis value
is a valid config, its judge catches what it must, and the CI slice trains or refuses every one of its setups."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import pytest
from conftest import ROOT

from loraflow.verify import sweep_judge as judge
from loraflow.verify import sweep_space as space


@pytest.mark.parametrize("seed", [0, 1])
def test_the_covering_set_has_every_pair_of_values_that_can_meet(seed):
    setups = space.all_pairs(seed)
    seen = set().union(*(space._pairs_of(s) for s in setups))
    for a, b in itertools.combinations(space.AXIS_NAMES, 2):
        for va, vb in itertools.product(space.AXES[a], space.AXES[b]):
            if space.can_meet(a, va, b, vb):
                assert (a, va, b, vb) in seen, (a, va, b, vb)
    # A covering set, not the product: at least families x stages (20 x 7) setups, far under the product.
    assert len(setups) < 200


def test_a_sweep_has_the_setups_asked_for_and_the_seed_decides_them():
    first, again, other = space.generate(3, 200), space.generate(3, 200), space.generate(4, 200)
    assert len(first) == 200 == len({space.setup_id(s) for s in first})
    assert first == again and first != other


def test_every_axis_value_is_a_config_loraflow_reads(tmp_path):
    from loraflow.run.config import demo_config, load_run_config

    for axis, values in space.AXES.items():
        for value in values:
            setup = space.complete({axis: value, **({"engine": "zero2"} if axis == "deepspeed" else {})})
            stage = space.stage_of(setup)
            config = load_run_config(stage, str(demo_config(stage)),
                                     space.overrides(setup, "builtin:tiny-base", tmp_path / "run", tmp_path))
            assert config.stage == stage


def test_twins_run_first_and_are_the_setups_they_claim():
    setup = space.complete({"precision": "bf16-mixed", "checkpointing": "reentrant"})
    order = [space.setup_id(s) for s in judge.ordered([setup])]
    assert order[-1] == space.setup_id(setup)
    assert set(order[:-1]) == {space.setup_id({**setup, "precision": "fp32"}),
                               space.setup_id({**setup, "precision": "fp32", "checkpointing": "off",
                                               "logits": "full"})}


def test_the_judge_fails_a_bf16_run_that_strays_from_its_fp32_twin():
    setup = space.complete({"precision": "bf16-mixed", "engine": "ddp"})
    twin = space.setup_id({**setup, "precision": "fp32"})
    memory = {"done": {twin: {"losses": [4.0, 3.0, 2.0]}}}
    assert judge._twin_problems(setup, [4.01, 3.02, 2.03], {}, {}, memory) == []
    problems = judge._twin_problems(setup, [4.0, 3.0, 3.0], {}, {}, memory)  # a lost update shows as a flat loss
    assert problems and "against the fp32 twin" in problems[0]
    assert judge._twin_problems(setup, [4.0, 3.0, 2.0], {}, {}, {"done": {}}) == [f"twin {twin} did not run"]


def test_the_ci_slice_trains_or_refuses_every_setup_and_resumes(tmp_path):
    out = tmp_path / "sweep"
    argv = [sys.executable, str(ROOT / "scripts" / "sweep.py"), "--ci", "--out", str(out), "--table",
            str(tmp_path / "table.md")]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=ROOT)
    summary = json.loads((out / "summary.json").read_text())
    assert proc.returncode == 0 and summary["failed"] == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    done = [r for r in records if "start" not in r]
    assert summary["setups"] == len(done) and summary["accepted"] + summary["refused"] == len(done)
    assert summary["refused_by"].get("zero3-eval-trace") == 1  # ZeRO-3 with evaluation on the oldest DeepSpeed
    for axis in ("stage", "family", "adapter", "targets", "engine", "precision", "deepspeed", "towers"):  # the slice spans these axes
        assert {r["setup"][axis] for r in done} == set(space.AXES[axis]), axis
    assert "| value | setups | accepted |" in (tmp_path / "table.md").read_text()
    before = (out / "results.jsonl").read_text()
    again = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert again.returncode == 0 and f"{len(done)} already done" in again.stdout
    assert (out / "results.jsonl").read_text() == before  # resumed: nothing ran again
