"""The shape of the frontends package: flag tables applied by one function, stage aliases declared once, every
framework fact read from its module's declaration, and no frontend function over 80 lines (the house rule, which
issue 29 found broken seven times there)."""

from __future__ import annotations

import ast
import re

from conftest import ROOT
from packaging.version import Version

from loraflow.frontends import frameworks
from loraflow.frontends.base import aliases, framework, release_names
from loraflow.frontends.common import Draft
from loraflow.frontends.table import STAGE_ALIASES, Default, Field, apply_table, fact, stage_of, switch

PACKAGE = ROOT / "src" / "loraflow" / "frontends"


def test_no_frontend_function_is_over_80_lines():
    long = []
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > 80:
                    long.append(f"{path.name}:{node.name} ({length} lines)")
    assert not long, long


def test_stage_aliases_are_declared_once():
    # Another framework's name for a loraflow stage (`"kto": "dpo"`) is written only in table.STAGE_ALIASES; the
    # frontends list their own names and read the map through table.stages().
    pair = re.compile(r"""["'](%s)["']\s*:\s*["'](sft|rm|dpo|grpo|ppo)["']""" % "|".join(STAGE_ALIASES))
    found = [f"{p.name}: {m.group(0)}" for p in PACKAGE.glob("*.py") if p.name != "table.py"
             for m in pair.finditer(p.read_text())]
    assert not found, found
    from loraflow.frontends import axolotl, llama_factory, ms_swift, openrlhf, trl

    for table in (axolotl._RL, llama_factory.STAGES, ms_swift.RLHF, trl.TRAINERS, trl.TRL_COMMANDS):
        assert all(stage == stage_of(name) for name, stage in table.items()), table
    assert openrlhf.STAGES["train_kto"] == "dpo" and openrlhf.STAGES["train_ppo_ray"] == "ppo"
    assert set(STAGE_ALIASES.values()) <= {"sft", "rm", "dpo", "grpo", "ppo"}


def test_framework_names_releases_and_aliases_come_from_the_declarations():
    from loraflow import environment
    from loraflow.commands.cli import build_parser
    from loraflow.frontends import parse_versions

    names = [f.name for f in frameworks()]
    assert set(release_names()) <= set(names)
    # environment.py knows packages only; the frameworks' releases and spellings are the declarations'.
    known = set(environment.TRACKED_PACKAGES) | set(vars(environment)["_ALIASES"].values())
    assert not known & set(release_names())
    assert parse_versions("swift=3.4.1,dschat=2023-08-03,pytorch=2.5.1") == {
        "ms-swift": Version("3.4.1"), "deepspeed-chat": Version("2023.8.3"), "torch": Version("2.5.1")}
    for alias, name in aliases().items():
        assert framework(alias).name == name
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    option = next(a for a in sub.choices["check"]._actions if "--framework" in a.option_strings)
    assert all(name in option.help for name in names)


def test_apply_table_flag_default_and_release_defaults():
    rows = (
        fact("engine", "deepspeed", "always DeepSpeed (x/deepspeed.py)"),
        Field("zero_stage", ("zero_stage", "ds.zero_stage"), lambda v, w: int(v), Default(2, "default (x/cli.py)")),
        Field("packing", ("packing",), switch),
        Field("checkpointing", ("gradient_checkpointing",), lambda v, w: "all" if v else None),
        Field("reentrant", when=lambda d: d.get("checkpointing") != "off", default=Default(
            True, "old releases: reentrant", since=(("x", "0.2.0", False, "default (x >= 0.2: non-reentrant)"),))),
    )
    draft = Draft("x", {})
    apply_table(draft, {"ds.zero_stage": ("3", "--ds.zero_stage 3"), "packing": (False, "--packing false")}, rows)
    # The first flag given wins over the default; a switch that is off leaves the field alone; a row whose condition
    # does not hold never compares versions (so `check` does not split scenarios on it).
    assert draft.values == {"engine": "deepspeed", "zero_stage": 3}
    assert draft.sources == {"engine": "always DeepSpeed (x/deepspeed.py)", "zero_stage": "--ds.zero_stage 3"}
    assert draft.queried == {}

    old = Draft("x", {"x": Version("0.1.0")})
    apply_table(old, {"gradient_checkpointing": (True, "--gradient_checkpointing")}, rows)
    assert old.values["zero_stage"] == 2 and old.sources["zero_stage"] == "default (x/cli.py)"
    assert (old.values["reentrant"], old.sources["reentrant"]) == (True, "old releases: reentrant")
    assert old.queried == {"x": {Version("0.2.0")}}
    new = Draft("x", {})  # an unknown release reads as the newest
    apply_table(new, {"gradient_checkpointing": (True, "--gradient_checkpointing")}, rows)
    assert (new.values["reentrant"], new.sources["reentrant"]) == (False, "default (x >= 0.2: non-reentrant)")
