"""`loraflow probe`'s table in words a user can act on: each outcome (naive settings, loraflow's plan, the registry's
prediction) becomes one verdict whose row says what it means for the installed stack, with a legend for the verdicts
present and a summary line. Built from results by hand: no probe runs here (tests/probes/test_probe.py runs them)."""

from __future__ import annotations

import pytest

from loraflow.probes.base import Observation
from loraflow.probes.report import (FAILS_AS_PREDICTED, FIXED_HERE, NEW_CONFLICT, NOT_RUN, PLAN_FAILS, PROBE_BROKE,
                                    RUNS_AS_PREDICTED, WIDTH, render_table, verdict)
from loraflow.probes.runner import ProbeResult

OK, ERROR, WRONG = Observation("ok", "trains"), Observation("error", "element 0 ..."), Observation("wrong", "differs")
NA, GONE = Observation("n/a", "needs a CUDA GPU"), Observation("unavailable", "bash scripts/setup_vllm.sh builds it")
DIED = Observation("failed", "the probe process exited with code 1 before reporting")


def _result(rule, naive, plan, predicted):
    return ProbeResult(rule, naive, plan, predicted, 2.0, f"/logs/{rule}.log", f"what {rule} runs")


CASES = [
    (_result("a-known-failure", ERROR, OK, True), FAILS_AS_PREDICTED),
    (_result("a-silent-one", WRONG, OK, True), FAILS_AS_PREDICTED),
    (_result("nothing-here", OK, OK, False), RUNS_AS_PREDICTED),
    (_result("fixed-upstream", OK, OK, True), FIXED_HERE),
    (_result("unknown-to-registry", ERROR, OK, False), NEW_CONFLICT),
    (_result("needs-a-gpu", NA, NA, True), NOT_RUN),
    (_result("needs-vllm", GONE, GONE, True), NOT_RUN),
    (_result("probe-died", DIED, Observation("n/a", "not run"), True), PROBE_BROKE),
    (_result("plan-unsafe", ERROR, ERROR, True), PLAN_FAILS),
]


@pytest.mark.parametrize("result, expected", CASES, ids=[r.rule for r, _ in CASES])
def test_each_outcome_gets_the_verdict_that_says_what_to_do(result, expected):
    assert verdict(result) is expected
    assert result.to_dict()["verdict"] == expected.key and result.to_dict()["meaning"] == expected.meaning


def test_each_row_says_what_its_outcome_means_and_the_legend_explains_the_verdicts_present():
    results = [r for r, _ in CASES]
    table = render_table(results, "torch 2.13.0 (cpu)")
    lines = table.splitlines()
    assert "agrees" not in table and "DIFFERS" not in table
    for result, expected in CASES:
        row = next(line for line in lines if line.startswith(result.rule + " "))
        assert row.endswith(expected.short), row
    # The legend: each verdict's sentence once; the actions a user needs are in it.
    flat = " ".join(table.split())
    assert "the rule's fix applies" in flat
    assert "the rule's version bound may be stale" in flat
    assert "`loraflow explain` on the probe's log and report it" in flat
    assert "a loraflow bug" in flat
    assert "summary: 9 rules probed" in table and "; 2 fail as the registry predicts" in flat
    assert "loraflow's plan FAILED in 1 of the 6 that ran" in " ".join(table.split())
    # The log is named where the user has to read it (a new conflict, a broken probe, an unsafe plan) only.
    assert "log:   /logs/unknown-to-registry.log" in table and "/logs/a-known-failure.log" not in table
    assert all(len(line) <= WIDTH for line in lines if not line.startswith(tuple(r.rule for r in results)))


def test_a_clean_run_says_the_plan_was_safe_and_gives_only_its_own_legend():
    results = [CASES[0][0], CASES[2][0]]
    table = render_table(results, "torch 2.13.0 (cpu)")
    assert "1 fail as the registry predicts (its fixes apply); 1 run as it predicts; loraflow's plan was safe in all " \
           "2 that ran." in " ".join(table.split())
    assert FIXED_HERE.meaning[:40] not in " ".join(table.split()) and NOT_RUN.meaning[:40] not in table
