"""`loraflow explain` on logs loraflow itself wrote: recognised as loraflow's (not as the DeepSpeed-Chat its plan
quotes, nor the DeepSpeed whose engine it runs), fixes worded in loraflow's config keys, a plan refusal read as
loraflow's own verdict, and an error loraflow raised on purpose (data, config, checkpoint) as the headline.

The logs in tests/fixtures/corpus/explain/loraflow/ were captured by running loraflow (CAPTURED.json names the
command of each). They are kept out of the corpus benchmark's MANIFEST.json files, whose sources must be public
threads: our own logs prove the mechanism, not that it generalizes.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import fields, is_dataclass

import pytest
from conftest import ROOT

from loraflow.commands.cli import main
from loraflow.explain import as_dict, detect_framework, diagnose_log, fix_for, render
from loraflow.explain.own import KEYS, OwnLog, loraflow_fix
from loraflow.frontends import flags_for
from loraflow.rules import all_rules, get_rule

CAPTURED = ROOT / "tests" / "fixtures" / "corpus" / "explain" / "loraflow"
MANIFEST = json.loads((CAPTURED / "CAPTURED.json").read_text())
# DeepSpeed-Chat's flags, as its frontend words fixes: none may appear in a fix for a loraflow run.
DSCHAT_FLAGS = set(re.findall(r"--\w+", " ".join(flags_for("deepspeed-chat").values())))


def _config_keys() -> set[str]:
    from loraflow.config.schema import Config

    def walk(cls, prefix: str) -> set[str]:
        out = set()
        for f in fields(cls):
            default = f.default_factory() if callable(f.default_factory) else f.default
            out |= walk(type(default), f"{prefix}{f.name}.") if is_dataclass(default) else {prefix + f.name}
        return out

    return walk(Config, "")


def _fix_lines(rendered: str) -> list[str]:
    return [line for line in rendered.splitlines() if line.strip().startswith("fix")]


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_a_captured_loraflow_log_is_recognised_and_explained(name):
    meta = MANIFEST[name]
    log, candidates, framework = diagnose_log((CAPTURED / name).read_text(encoding="utf-8"))
    assert framework == "loraflow", name
    assert [c.rule.id for c in candidates][:1] == ([meta["expected"]] if meta["expected"] else []), \
        [(c.rule.id, c.confidence, c.lines) for c in candidates]
    fatal = log.own.fatal
    if meta["fatal"]:
        assert fatal is not None and fatal.own and fatal.kind == meta["fatal"], fatal
    else:
        assert fatal is None
    rendered = render(candidates, framework, log.versions, log, name)
    assert "framework loraflow" in rendered and "deepspeed-chat" not in rendered.split("\n")[0]
    for line in _fix_lines(rendered):
        assert not DSCHAT_FLAGS & set(re.findall(r"--\w+", line)), line


def test_the_captured_logs_cover_clean_runs_engines_refusals_and_loraflows_own_errors():
    kinds = {m["fatal"] for m in MANIFEST.values()}
    assert {None, "DataError", "ConfigError", "CheckpointError", "PlanError", "error"} <= kinds
    commands = " ".join(m["command"] for m in MANIFEST.values())
    assert "parallel.engine=deepspeed" in commands and "parallel.engine=fsdp2" in commands
    # Both of loraflow's outputs: the console and RUN_DIR/train.log.
    assert {n.rsplit(".", 2)[-2] for n in MANIFEST} == {"console", "train"}


def test_a_long_train_log_cut_before_its_plan_is_still_loraflows():
    lines = (CAPTURED / "clean.train.log").read_text(encoding="utf-8").splitlines()
    tail = "\n".join(lines[next(i for i, line in enumerate(lines) if " INFO step " in line):])
    assert "loraflow plan" not in tail and "run directory" not in tail
    assert detect_framework(tail) == "loraflow"


def test_a_clean_run_whose_plan_applied_a_fix_is_not_claimed():
    """The plan's findings quote the failures they prevent (FSDP2's generate, reentrant checkpointing): they are
    loraflow's own words, not the failure."""
    for name, meta in MANIFEST.items():
        text = (CAPTURED / name).read_text(encoding="utf-8")
        if "[FIXED]" in text and meta["fatal"] is None:
            _, candidates, _ = diagnose_log(text)
            assert candidates == [], (name, [c.rule.id for c in candidates])


def test_a_plan_refusal_is_loraflows_verdict_and_its_fix_is_in_loraflow_keys():
    name = next(n for n, m in MANIFEST.items() if m["fatal"] == "PlanError")
    log, candidates, framework = diagnose_log((CAPTURED / name).read_text(encoding="utf-8"))
    top = candidates[0]
    assert top.rule.id == "no-adapter-matched" and top.confidence == "confirmed"
    fix = fix_for(top.rule, framework, log)
    assert fix.startswith("loraflow refused this setup before training") and "adapter.target_modules" in fix
    assert "--lora_module_name" not in fix and "should have" not in fix


@pytest.mark.parametrize("kind", ["DataError", "ConfigError", "CheckpointError"])
def test_loraflows_own_error_is_the_headline_with_its_message_as_the_fix(kind, capsys):
    name = next(n for n, m in MANIFEST.items() if m["fatal"] == kind and n.endswith(".train.log"))
    path = CAPTURED / name
    text = path.read_text(encoding="utf-8")
    main(["explain", str(path)])
    out = capsys.readouterr().out
    assert "what broke (line " in out and f"): {kind}: " in out
    assert "No known failure signature" not in out
    message = re.search(rf"ERROR run failed: {kind}: (.*)", text).group(1)
    assert message in out.split("fix (loraflow's own message): ", 1)[1]
    log, candidates, framework = diagnose_log(text)
    doc = as_dict(candidates, framework, log.versions, log, name)
    assert doc["framework"] == "loraflow" and doc["loraflow_error"]["type"] == kind
    assert doc["loraflow_error"]["fix"].startswith(message)


def test_the_console_error_line_is_the_headline_too():
    name = next(n for n, m in MANIFEST.items() if m["fatal"] == "error" and "bad.jsonl" in m["command"])
    log, candidates, framework = diagnose_log((CAPTURED / name).read_text(encoding="utf-8"))
    rendered = render(candidates, framework, log.versions, log, name)
    assert "what broke" in rendered and "line 2: not valid JSON" in rendered


def test_every_rule_is_worded_in_loraflow_keys_for_a_loraflow_run():
    keys = _config_keys()
    for rule in all_rules():
        fix = loraflow_fix(rule, OwnLog())
        assert not DSCHAT_FLAGS & set(re.findall(r"--\w+", fix)), (rule.id, fix)
        assert not rule.elsewhere or rule.elsewhere not in fix, rule.id
        assert "a bug in loraflow" in fix and "plan.json" in fix, rule.id
        said = {"error": "should have refused", "fix": "should have fixed", "warning": "should have warned"}
        assert said[rule.verdict] in fix, rule.id
        for knob in rule.knobs:
            if knob in KEYS:
                assert KEYS[knob] in fix, (rule.id, knob)
                assert set(KEYS[knob].split(" / ")) <= keys, KEYS[knob]
    assert "checkpointing.reentrant" in fix_for(get_rule("zero3-frozen-recompute"), "loraflow")
    assert "parallel.zero_stage" in fix_for(get_rule("zero3-frozen-recompute"), "loraflow")


def _as_run_log(exc: Exception) -> str:
    """A guard's real error, in train.log as run/failures.py writes a LoraflowError that ends a run (no traceback)."""
    return ("2026-11-24 04:00:00,000 INFO run directory: /tmp/run\n"
            "2026-11-24 04:00:01,000 INFO training: 4 optimizer steps of 1 x 8 samples x 1 processes\n"
            f"2026-11-24 04:00:09,000 ERROR run failed: {type(exc).__name__}: {exc}\n")


def test_the_train_mode_guard_names_its_rules_in_loraflows_words():
    import torch

    from loraflow.errors import GuardError
    from loraflow.loop.guards import assert_train_mode

    with pytest.raises(GuardError) as info:
        assert_train_mode(torch.nn.Linear(2, 2).eval())
    log, candidates, framework = diagnose_log(_as_run_log(info.value))
    assert framework == "loraflow" and set(log.own.guarded) == {"checkpointing-off-in-eval", "zero3-eval-backward"}
    assert {c.rule.id for c in candidates} >= {"checkpointing-off-in-eval", "zero3-eval-backward"}
    fix = fix_for(get_rule("zero3-eval-backward"), framework, log)
    assert fix.startswith("loraflow's first-step guard stopped the run") and "plan.json" in fix


def test_the_gradient_guard_is_explained_by_the_rules_it_names(tiny_model):
    from types import SimpleNamespace

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from loraflow.errors import GuardError
    from loraflow.loop.guards import check_first_gradients

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model), LoraConfig(target_modules=["q_proj"]))
    from loraflow.rules import Combination

    # Every second layer checkpointed, reentrant, no input-grad hook: the plan's setup, whose rules the guard names.
    setup = Combination(checkpointing="partial", checkpoint_every_n=2, reentrant=True, input_grad_hook=False)
    plan = SimpleNamespace(checkpoint_layers=[0], reentrant=True, input_grad_hook=False, setup=setup)
    with pytest.raises(GuardError) as info:  # no backward ran: no adapter got a gradient
        check_first_gradients(model, plan)
    log, candidates, framework = diagnose_log(_as_run_log(info.value))
    assert [c.rule.id for c in candidates][:1] == ["reentrant-partial-silent"]
    # Only rules whose conditions hold are named: every layer checkpointed (reentrant-frozen-inputs) is not this.
    assert "[reentrant-frozen-inputs]" not in info.value.args[0]
    fix = fix_for(candidates[0].rule, framework, log)
    assert "should have fixed" in fix and "checkpointing.reentrant" in fix
    assert "enable_input_require_grads()" not in fix  # the other frameworks' wording (rule.elsewhere)


def test_other_frameworks_logs_are_not_taken_for_loraflows():
    """The real-world corpus and the probes' captured logs (naive setups reproduced without loraflow's plan) keep
    the framework they had."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import diagnosis_accuracy as scorer

    for e in scorer.explain_entries():
        text = e["file"].read_text(encoding="utf-8", errors="replace")
        assert detect_framework(text) != "loraflow", e["file"]


def test_a_failed_run_explains_its_own_train_log(tiny_model, tmp_path, capsys):
    """End to end: the run writes its failure to train.log, and explain reads it back from that file alone."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "completion": "b"}\n{"prompt": "a" "completion": "b"}\n')
    run = tmp_path / "run"
    assert main(["train", "sft", f"model.path={tiny_model}", f"data.train={bad}", "data.eval=",
                 f"output.dir={run}", "output.progress_bar=false"]) == 2
    capsys.readouterr()
    main(["explain", str(run / "train.log"), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["framework"] == "loraflow" and doc["loraflow_error"]["type"] == "DataError"
    assert f"{bad} line 2: not valid JSON" in doc["loraflow_error"]["what_broke"]
