"""`loraflow check` on another framework's launch: its exit code says what the launch is (issue 31), and what stays
open is one "depends on" question instead of a list of conditional [crash] findings.

2: the launch fails or trains wrongly as given; 1: it depends on something check could not see, named in the
report (a version, a choice in the user's code, the data, a flag it could not read); 0: nothing found that fails or
trains wrongly (a slow-only finding is advice)."""

from __future__ import annotations

import json
import shlex

from loraflow.frontends import run_check
from loraflow.frontends.base import FrontendResult
from loraflow.frontends.report import _exit_code
from loraflow.frontends.verdict import Checked
from loraflow.rules import all_rules
from loraflow.rules.combination import Combination

# OpenRLHF with its dotted flags (releases >= 0.10.2), ZeRO-3, non-reentrant checkpointing, LoRA: crashes on
# DeepSpeed < 0.19.3 only (zero3-frozen-recompute), and its releases pin DeepSpeed on both sides of the fix.
DOTTED = ("deepspeed --module openrlhf.cli.train_sft --model.model_name_or_path m --ds.zero_stage 3 "
          "--model.gradient_checkpointing_enable --ds.lora.rank 16")


def _check(line: str, versions: str = "") -> tuple[dict, str, int]:
    from loraflow.frontends import parse_versions

    given = parse_versions(versions) if versions else {}
    doc = json.loads(run_check(shlex.split(line), None, [], dict(given), as_json=True)[0])
    text, code = run_check(shlex.split(line), None, [], dict(given), as_json=False)
    assert doc["exit_code"] == code
    return doc, text, code


def test_a_finding_the_versions_decide_is_exit_2_and_not_a_question():
    doc, text, code = _check(DOTTED, "deepspeed=0.15.3")
    assert code == 2 and doc["depends_on"] == []
    assert "[crash] zero3-frozen-recompute" in text and "depends on:" not in text
    assert "exit code 2: this launch fails or trains wrongly as given" in text


def test_an_unknown_version_is_one_depends_on_question_and_exit_1():
    doc, text, code = _check(DOTTED)
    assert code == 1
    assert len(doc["depends_on"]) == 1 and doc["depends_on"][0].startswith("which deepspeed release")
    # The conditional crash sits under the question with its condition, not as a [crash] finding of its own.
    assert "\n[crash]" not in text and "no known conflict holds whatever is unknown." in text
    assert "depends on: which deepspeed release" in text
    assert "  if deepspeed<0.19.3: [crash] zero3-frozen-recompute" in text


def test_a_version_outside_the_range_is_clean_exit_0():
    _, text, code = _check(DOTTED, "deepspeed=0.19.8")
    assert code == 0 and "zero3-frozen-recompute" not in text and "depends on:" not in text


def test_an_unread_flag_alone_is_exit_1():
    _, text, code = _check(DOTTED + " --a_flag_no_release_has 3", "deepspeed=0.19.8")
    assert code == 1 and "--a_flag_no_release_has" in text and "flags it could not read" in text


def test_a_slow_only_finding_is_advice_and_exit_0():
    rules = {r.id: r for r in all_rules()}
    result = FrontendResult("hf", Combination())
    slow = Checked(rules["fsdp-frozen-grad-memory"], None)
    assert slow.rule.impact == "slow"
    assert _exit_code(result, [slow]) == 0
    assert _exit_code(result, [slow, Checked(rules["zero3-frozen-recompute"], "deepspeed<0.19.3")]) == 1
    assert _exit_code(result, [slow, Checked(rules["zero3-frozen-recompute"], None)]) == 2
    result.unknown.append("--made_up_flag")
    assert _exit_code(result, [slow]) == 1
