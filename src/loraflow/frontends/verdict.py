"""The verdict of `check` on another framework's setup: every rule that holds, and under which unknown versions or
choices it holds (frontends/scenarios.py enumerates them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from loraflow.frontends import FrontendResult
from loraflow.frontends.scenarios import (FLOOR, Variable, describe, enumerate_scenarios, spec_points,
                                          version_variables)
from loraflow.rules import Rule, all_rules, evaluate

Build = Callable[[dict[str, Version]], FrontendResult]


@dataclass
class Checked:
    rule: Rule
    holds_if: str | None
    """None: holds in every scenario; else the condition in words (`deepspeed<0.19.3`)."""
    decided_by: tuple[str, ...] = ()
    """The unknown versions or choices the condition names."""
    notes: list[str] = field(default_factory=list)


@dataclass
class Verdict:
    result: FrontendResult
    """The setup as read with every unknown version at its newest release and every unsure choice as the frontend
    set it (what the report shows)."""
    findings: list[Checked]
    variables: list[Variable]
    scenarios: int


def _consistent(result: FrontendResult) -> Callable[[dict[str, Any]], bool]:
    """A framework release pins its dependencies: scenarios that pair a release with other versions are dropped."""
    from loraflow.frontends import framework

    depends = framework(result.framework).depends

    def ok(scenario: dict[str, Any]) -> bool:
        for package, within, pins in depends:
            release = scenario.get(package)
            if not isinstance(release, Version) or release not in SpecifierSet(within) and release != FLOOR:
                continue
            for dep, spec in pins.items():
                value = scenario.get(dep)
                if isinstance(value, Version) and value != FLOOR and value not in SpecifierSet(spec):
                    return False
        return True
    return ok


def check_setup(build: Build, given: dict[str, Version | None]) -> Verdict:
    given = {k: v for k, v in given.items() if v is not None}
    first = build(dict(given))
    queried: dict[str, set[Version]] = {p: set(v) for p, v in first.queried.items()}
    for rule in all_rules():
        for package, spec in rule.affected.items():
            queried.setdefault(package, set()).update(spec_points(spec))
    eras = {p: SpecifierSet(spec) for p, (spec, _) in first.eras.items()}
    variables = version_variables(queried, given, eras)
    for name, (labels, why) in first.unsure.items():
        variables.append(Variable(name, "choice", values=list(labels), labels=labels, why=why))
    scenarios = enumerate_scenarios(variables, _consistent(first))
    frontend_versions = set(first.queried)
    rebuilt: dict[tuple, FrontendResult] = {}
    holds: dict[str, list[bool]] = {}
    notes: dict[str, list[str]] = {}
    for i, scenario in enumerate(scenarios):
        versions = {**given, **{k: v for k, v in scenario.items() if isinstance(v, Version)}}
        key = tuple(sorted((k, str(v)) for k, v in versions.items() if k in frontend_versions))
        if key not in rebuilt:
            rebuilt[key] = build(versions)
        choices = {k: v for k, v in scenario.items() if not isinstance(v, Version)}
        setup = rebuilt[key].setup.replace(versions=versions, **choices)
        for f in evaluate(setup, apply_fixes=False)[1]:
            holds.setdefault(f.rule.id, [False] * len(scenarios))[i] = True
            notes.setdefault(f.rule.id, [])
    order = {r.id: n for n, r in enumerate(all_rules())}
    rules = {r.id: r for r in all_rules()}
    findings = [Checked(rules[rid], *describe(h, scenarios, variables)) for rid, h in
                sorted(holds.items(), key=lambda kv: order[kv[0]])]
    deciding = {name for f in findings for name in f.decided_by}
    return Verdict(first, findings, [v for v in variables if v.name in deciding], len(scenarios))
