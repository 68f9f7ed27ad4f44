"""`loraflow probe` on the installed stack: the whole set, in a subprocess, within its 5-minute budget.

The table is asserted: loraflow's plan is safe everywhere, and the naive settings break exactly where the registry
predicts for these versions, except the differences from the catalog documented below (each found by this probe).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from loraflow.probes import all_cases
from loraflow.rules import all_rules

# rule id -> why the naive settings behave differently from the registry's prediction on the pinned stack.
KNOWN_DIFFERENCES = {
    "tied-embedding-adapter": "peft 0.21.2 + transformers 5.23 keep the trained lm_head on both reload paths "
                              "(adapter reload; merge_and_unload unties the config) even without ensure_weight_tying",
}


ROLLOUT_RULES = ("vllm-stale-policy", "vllm-max-lora-rank", "vllm-raw-logprobs", "vllm-adapter-unservable")


@pytest.fixture(scope="module")
def probe_run(tmp_path_factory, vllm_url, demo_base):
    """The whole table, once. The runner starts both vLLM servers of the rollout cases on the session's RL demo
    base, beside the other cases: vLLM's defaults, and loraflow's with --max-lora-rank 32 for the rank-32 adapter of
    vllm-max-lora-rank (the session's own server keeps vLLM's 16: a larger rank slows every LoRA request on a CPU,
    the GRPO demo on it took 130 s instead of 74)."""
    from loraflow.probes.vllm_servers import ENV, Served
    from loraflow.rl.vllm_server import Client

    logs = tmp_path_factory.mktemp("probe-logs")
    served = Served(str(demo_base), {}).to_env()
    start = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "loraflow", "probe", "--json", "--logs", str(logs)],
                              capture_output=True, text=True, timeout=420,
                              env={**os.environ, "PYTHONWARNINGS": "ignore", ENV: served})
    finally:
        # A rollout case killed in the middle of its merged sync would leave its weights in the session's server.
        Client(vllm_url).reload_weights(demo_base)
    elapsed = time.monotonic() - start
    assert proc.stdout, proc.stderr[-3000:]
    return json.loads(proc.stdout), elapsed, proc.returncode, logs


def test_probe_covers_every_reproducible_rule():
    ids = {r.id for r in all_rules()}
    assert set(all_cases()) <= ids
    assert len(all_cases()) >= 12


def test_probe_table_on_the_installed_stack(probe_run):
    data, elapsed, code, _ = probe_run
    table = {r["rule"]: r for r in data["results"]}
    assert set(table) == set(all_cases())
    print("\n".join(f"{r['rule']}: affected={r['affected']} safe={r['safe_under_loraflow']} ({r['seconds']}s)"
                    for r in data["results"]))
    for rule, row in table.items():
        if row["affected"] in ("n/a", "unavailable"):
            assert row["naive"]["detail"] and row["verdict"] == "not-run", rule  # says why, and that nothing is known
            continue
        assert row["safe_under_loraflow"] == "yes", (rule, row["plan"])
        predicted = "yes" if row["registry_predicts_affected"] else "no"
        expected = ("no" if predicted == "yes" else "yes") if rule in KNOWN_DIFFERENCES else predicted
        assert row["affected"] == expected, (rule, row["naive"])
        # What the row tells the user: a known difference is a release that fixed the failure (the rule's bound is
        # stale), never a new conflict; everything else is as the registry predicts.
        assert row["verdict"] == ("fixed-here" if rule in KNOWN_DIFFERENCES else
                                  "fails-as-predicted" if expected == "yes" else "runs-as-predicted"), (rule, row)
    assert code == 0
    print(f"the probe set took {elapsed:.0f}s (its budget: 5 minutes on 2 cores, alone)")


# The rollout probes measure what their rules say, in numbers: a stale sync and raw log-probs at temperature 0.7 put
# the engine's log-probs far beyond the fp32 bound, loraflow's adapter and merged syncs and processed log-probs keep
# them within it; vLLM refuses the rank-32 and the DoRA adapter in its own words, and loads and samples the first
# from the server loraflow starts. Each of the two servers was started once, for all four.
def test_rollout_probes_reproduce_and_the_plan_holds(probe_run):
    data, _, _, logs = probe_run
    table = {r["rule"]: r for r in data["results"]}
    for rule in ROLLOUT_RULES:
        print(f"{rule}: naive {table[rule]['naive']}\n    plan {table[rule]['plan']}")
    for rule in ("vllm-stale-policy", "vllm-raw-logprobs"):
        naive = table[rule]["naive"]["values"]
        assert table[rule]["naive"]["status"] == "wrong" and naive["logprob_diff_max"] > 10 * naive["bound"], rule
    for rule in ROLLOUT_RULES:
        plan = table[rule]["plan"]
        assert plan["status"] == "ok" and plan["values"]["bound"] == 1e-3, rule  # the fp32 bound of plan/rollout.py
        assert plan["values"]["logprob_diff_max"] <= plan["values"]["bound"], rule
    assert table["vllm-stale-policy"]["plan"]["values"]["logprob_diff_max"] <= 1e-4  # measured 3e-5
    assert "LoRA rank 32 is greater than max_lora_rank 16" in table["vllm-max-lora-rank"]["naive"]["detail"]
    assert table["vllm-max-lora-rank"]["plan"]["values"]["max_lora_rank"] == 32
    assert "vLLM does not yet support DoRA" in table["vllm-adapter-unservable"]["naive"]["detail"]
    assert sorted(p.name for p in logs.glob("vllm-*.log") if p.stem not in ROLLOUT_RULES) == ["vllm-default.log",
                                                                                              "vllm-loraflow.log"]


def test_rollout_probes_without_vllm_are_unavailable_and_say_how_to_build_it(monkeypatch, capsys):
    from loraflow.commands.cli import main
    from loraflow.probes.vllm_servers import ENV

    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setenv("LORAFLOW_VLLM_PYTHON", "/nonexistent/bin/python")
    assert main(["probe", "--only", ",".join(ROLLOUT_RULES), "--json"]) == 0  # not a failure of the stack
    rows = json.loads(capsys.readouterr().out)["results"]
    assert [r["rule"] for r in rows] == list(ROLLOUT_RULES)
    for row in rows:
        assert row["affected"] == row["safe_under_loraflow"] == "unavailable", row
        assert row["verdict"] == "not-run", row
        assert "scripts/setup_vllm.sh" in row["naive"]["detail"], row


def test_probe_only_runs_one_and_rejects_unknown_ids(capsys):
    from loraflow.commands.cli import main

    assert main(["probe", "--only", "no-such-rule"]) == 2
    assert "no probe for no-such-rule" in capsys.readouterr().err


def test_probe_only_runs_the_named_rule(capsys):
    from loraflow.commands.cli import main

    assert main(["probe", "--only", "fp16-trainable-unscale", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["results"]
    assert [r["rule"] for r in rows] == ["fp16-trainable-unscale"]
    assert rows[0]["verdict"] == "fails-as-predicted" and "the rule's fix applies" in rows[0]["meaning"]
    assert rows[0]["affected"] == "yes" and rows[0]["safe_under_loraflow"] == "yes"


def test_a_timeout_kills_the_whole_process_group(tmp_path):
    """torchrun's ranks must not outlive a timed-out probe."""
    from loraflow.engines.launch import run_isolated

    log = tmp_path / "hang.log"
    code = ("import subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
            "print(child.pid, flush=True)\ntime.sleep(120)")
    assert run_isolated([sys.executable, "-c", code], log, timeout=5) is None
    child = int(log.read_text().split()[0])
    for _ in range(50):  # the orphan is reaped by init shortly after the kill
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(child, 9)
        pytest.fail("the child of the timed-out probe survived")


def test_a_probe_that_dies_is_reported_as_failed_not_as_a_reproduction(tmp_path):
    from loraflow.probes.runner import run_case

    result = run_case(all_cases()["fp16-trainable-unscale"], tmp_path, python="/bin/false")
    assert (result.affected, result.safe, result.matches_registry) == ("failed", "n/a", None)


def test_a_forked_case_that_hangs_is_killed_at_its_timeout_and_the_next_still_runs(tmp_path, monkeypatch):
    """One-process cases run in children forked from the runner: a hang is killed at the case's timeout, the
    other cases still report, and nothing runs in the runner's own process."""
    import dataclasses

    from loraflow.probes import _CASES, all_cases
    from loraflow.probes.runner import _run_forked

    all_cases()
    real = _CASES["fp16-trainable-unscale"]
    hang = dataclasses.replace(real, execute=lambda setup, ctx: time.sleep(120), timeout=3)
    monkeypatch.setitem(_CASES, real.rule, hang)
    other = _CASES["cache-during-recompute"]
    start = time.monotonic()
    results = _run_forked([hang, other], tmp_path)
    assert time.monotonic() - start < 60
    assert results[real.rule].naive.status == "timeout"
    assert results[other.rule].naive.status not in ("timeout", "failed"), results[other.rule].naive


# The reproductions added with the mined sample's second round of rules, run on their own (a few seconds each): the
# fp16 overflow breaks the naive run (every update skipped) and the plan refuses it; the other three find the
# installed stack past the releases their rules name (peft 0.21 casts a LoRA layer's input, gathers a weight for
# PiSSA under ZeRO-3, and no longer filters a patched state_dict into nothing), as the registry predicts.
SECOND_ROUND = ("fp16-overflow", "lora-dtype-mismatch", "adapter-state-dict-patched", "zero3-init-adapter-read")


def test_the_second_round_probes_match_the_registry_and_the_plan_is_safe(capsys):
    from loraflow.commands.cli import main

    assert main(["probe", "--only", ",".join(SECOND_ROUND), "--json"]) == 0
    rows = {r["rule"]: r for r in json.loads(capsys.readouterr().out)["results"]}
    assert set(rows) == set(SECOND_ROUND)
    for rule, row in rows.items():
        assert row["matches_registry"] is True and row["safe_under_loraflow"] == "yes", (rule, row["naive"])
    overflow = rows["fp16-overflow"]
    assert overflow["naive"]["status"] == "wrong" and overflow["naive"]["values"]["skipped"] == 3
    assert overflow["plan"]["status"] == "refused"
    assert rows["adapter-state-dict-patched"]["naive"]["detail"].startswith("all 28 adapter tensors")


def test_a_two_rank_batch_that_stops_early_leaves_the_rest_to_launches_of_their_own(tmp_path, monkeypatch):
    """The two-rank cases share one torchrun launch; a case that ends the batch (a crash, ranks left apart) must not
    lose the cases after it: what the batch did not report runs again, one launch per case, as before batching."""
    from loraflow.probes import Observation, runner

    cases = [all_cases()[r] for r in ("ddp-reentrant-unused", "zero3-lora-merge", "fsdp1-mixed-dtype")]
    # A stand-in for the launch: it reports the first case, then dies as a batch stopped by a crash does.
    first = json.dumps({"mode": "naive", "status": "error", "detail": "x"})
    script = (f"import sys, pathlib; d = pathlib.Path(sys.argv[sys.argv.index('--batch-dir') + 1]); "
              f"(d / '{cases[0].rule}.jsonl').write_text({first!r} + '\\n'); sys.exit(3)")
    monkeypatch.setattr(runner, "torchrun_argv", lambda n, tail, python=None: [sys.executable, "-c", script, *tail])
    rerun = []
    monkeypatch.setattr(runner, "run_case", lambda case, log_dir: rerun.append(case.rule) or runner.ProbeResult(
        case.rule, Observation("ok", "rerun"), Observation("ok", "rerun"), None))
    results = runner._run_two_rank(cases, tmp_path)
    assert results[cases[0].rule].naive.status == "error" and results[cases[0].rule].safe == "n/a"
    assert rerun == [c.rule for c in cases[1:]]
