"""The verdict of `check` on another framework's setup: every rule that holds, and under which unknown versions or
choices it holds (frontends/scenarios.py enumerates them).

The frontend is run once per combination of unknown package releases (its defaults change with them); the choices
a run's own code makes (`Draft.maybe`) are collected from every such run and apply only where that run declared
them; the rules are then evaluated on every combination.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from loraflow.frontends.base import FrontendResult
from loraflow.frontends.common import FORK
from loraflow.frontends.scenarios import (
    FLOOR,
    MAX_SCENARIOS,
    Variable,
    describe,
    enumerate_scenarios,
    meets,
    spec_points,
    version_variables,
)
from loraflow.rules import Rule, all_rules, evaluate
from loraflow.rules.combination import COMBINATION_FIELDS

Build = Callable[[dict[str, Version]], FrontendResult]
MAX_ROUNDS = 3


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
    """The unknowns that decide some finding."""
    scenarios: int
    forked: set[str] = field(default_factory=set)
    """Combination fields whose value depends on a fork (Draft.fork): the report quotes no value for them."""


def _consistent(result: FrontendResult, variables: list[Variable], given: dict[str, Version]
                ) -> Callable[[dict[str, Any]], bool]:
    """A framework release pins its dependencies: scenarios that pair a release range with dependency versions it
    cannot run with are dropped."""
    from loraflow.frontends.base import framework

    depends = framework(result.framework).depends
    domains = {v.name: v.domain() for v in variables if v.kind == "version"}

    def bounds(name: str, value: Version) -> tuple[Version, Version | None]:
        dom = domains[name]
        i = dom.index(value)
        return value, (dom[i + 1] if i + 1 < len(dom) else None)

    def ok(scenario: dict[str, Any]) -> bool:
        for package, within, pins in depends:
            if package in given:  # a release the user named: its own pins
                if given[package] not in SpecifierSet(within):
                    continue
            else:
                release = scenario.get(package)
                if not isinstance(release, Version) or not meets(SpecifierSet(within), *bounds(package, release)):
                    continue
                # Only when the whole release interval lies in `within` do its pins bind.
                lo, hi = bounds(package, release)
                whole = SpecifierSet(within)
                if not all(p in whole for p in {lo} | {x for x in spec_points(within) if x > lo and
                                                       (hi is None or x < hi)} if p != FLOOR):
                    continue
            for dep, spec in pins.items():
                value = scenario.get(dep)
                if isinstance(value, Version) and dep in domains and not meets(SpecifierSet(spec),
                                                                                 *bounds(dep, value)):
                    return False
        return True
    return ok


def _relevant(builds: list[FrontendResult]) -> set[str]:
    """The rules whose condition holds on some build of this command, under any of the choices its code may make:
    only their version boundaries can change a finding; the others' would only multiply the scenarios, which are
    capped (MAX_SCENARIOS). The first build has every unknown version unset, which a rule's condition reads as
    affected (rule.older), so versions never hide a rule here."""
    import itertools

    setups = []
    for b in builds:
        names = list(b.unsure)
        for values in itertools.product(*(list(b.unsure[n][0]) for n in names)):
            setups.append(b.setup.replace(**dict(zip(names, values))))
    return {r.id for r in all_rules() if any(r.when(s) for s in setups)}


def _version_space(first: FrontendResult, queried: dict[str, set[Version]], given: dict[str, Version],
                   relevant: set[str]) -> list[Variable]:
    from loraflow.frontends.base import framework

    for package, within, _ in framework(first.framework).depends:
        queried.setdefault(package, set()).update(spec_points(within))
    for rule in all_rules():
        if rule.id not in relevant:
            continue
        for package, spec in rule.affected.items():
            if package not in first.setup.not_used:  # its releases change nothing for this run
                queried.setdefault(package, set()).update(spec_points(spec))
        for package, releases in rule.boundaries.items():
            if package not in first.setup.not_used:
                queried.setdefault(package, set()).update(Version(r) for r in releases)
    eras = {p: SpecifierSet(spec) for p, (spec, _) in first.eras.items()}
    return version_variables(queried, given, eras)


def _in_rule_terms(found: Checked, holds: list[bool], scenarios: list[dict], variables: list[Variable]) -> Checked:
    """A condition on one package that is exactly the rule's own version range (within the releases considered)
    is said in the rule's terms: `deepspeed<0.19.3`, not the interval pins happen to leave."""
    if len(found.decided_by) != 1 or found.decided_by[0] not in found.rule.affected:
        return found
    package = found.decided_by[0]
    spec = found.rule.affected[package]
    var = next(v for v in variables if v.name == package)
    dom = var.domain()
    for scenario, holding in zip(scenarios, holds):
        lo = scenario[package]
        i = dom.index(lo)
        hi = dom[i + 1] if i + 1 < len(dom) else None
        inside = any(meets(SpecifierSet(part), lo, hi) for part in spec.split("||"))
        if inside != holding:
            return found
    return Checked(found.rule, " or ".join(f"{package}{part}" for part in spec.split("||")), found.decided_by)


class _Builds:
    """The frontend's builds, one per combination of unknown versions and forks (Draft.fork: what a file that is not
    here decides, from which the rest is read), each made once."""

    def __init__(self, build: Build, given: dict[str, Version]):
        self.build, self.given, self.fork_key = build, given, FORK
        self.first = build(dict(given))
        self.fork_vars = [Variable(n, "choice", values=list(labels), labels=labels, why=why)
                          for n, (labels, why) in self.first.forks.items()]
        self.combos = enumerate_scenarios(self.fork_vars) if self.fork_vars else [{}]
        self.made: dict[tuple, FrontendResult] = {}

    def get(self, versions: dict[str, Version], combo: dict[str, Any], packages: set[str]) -> FrontendResult:
        key = (tuple(sorted((k, str(v)) for k, v in versions.items() if k in packages)),
               tuple(sorted((k, str(v)) for k, v in combo.items())))
        if key not in self.made:
            self.made[key] = self.build({**versions, **{self.fork_key + n: v for n, v in combo.items()}})
        return self.made[key]

    def all(self) -> list[FrontendResult]:
        return [self.first, *self.made.values()]

    def prune(self) -> None:
        """Forks that change nothing here are read at their first value: each of their values gives the same setup,
        the same version queries and the same open choices (a launcher flag or a script's --deepspeed chose the
        engine an unseen accelerate config would have), so they would only multiply the scenarios."""
        def reading(result: FrontendResult) -> tuple:
            return (repr(result.setup.replace(versions={})), sorted((p, sorted(map(str, v)))
                                                                    for p, v in result.queried.items()),
                    sorted(result.unsure))

        for var in list(self.fork_vars):
            groups: dict[tuple, set] = {}
            for combo in self.combos:
                rest = tuple(sorted((k, str(v)) for k, v in combo.items() if k != var.name))
                groups.setdefault(rest, set()).add(repr(reading(self.get(self.given, combo, set()))))
            if all(len(readings) == 1 for readings in groups.values()):
                self.fork_vars.remove(var)
                first = var.values[0]
                self.combos = [c for c in self.combos if c[var.name] == first]
                for c in self.combos:
                    del c[var.name]


def check_setup(build: Build, given: dict[str, Version | None]) -> Verdict:
    from loraflow.frontends.base import framework

    given = {k: v for k, v in given.items() if v is not None}
    builds = _Builds(build, given)
    first = builds.first
    for combo in builds.combos:
        builds.get(given, combo, set())
    builds.prune()
    queried: dict[str, set[Version]] = {}
    for result in builds.all():
        for package, points in result.queried.items():
            queried.setdefault(package, set()).update(points)
    relevant = _relevant(builds.all())
    for _ in range(MAX_ROUNDS):
        variables = _version_space(first, {p: set(v) for p, v in queried.items()}, given, relevant)
        scenarios = enumerate_scenarios(variables, _consistent(first, variables, given))
        frontend_packages = set(queried)
        grew = False
        for scenario in scenarios:
            for combo in builds.combos:
                for package, points in builds.get({**given, **scenario}, combo, frontend_packages).queried.items():
                    if not points <= queried.setdefault(package, set()):
                        queried[package] |= points
                        grew = True
        now = _relevant(builds.all())
        grew, relevant = grew or not now <= relevant, relevant | now
        if not grew:
            break
    # Choices a run's own code makes, from every build; each applies where its build declared it.
    choices: dict[str, tuple[dict, str]] = {}
    for result in builds.all():
        for name, (labels, why) in result.unsure.items():
            choices.setdefault(name, (dict(labels), why))[0].update(labels)
    choice_vars = [Variable(n, "choice", values=list(labels), labels=labels, why=why)
                   for n, (labels, why) in choices.items()]
    full = [dict(s, **f, **c) for s in scenarios for f in builds.combos for c in enumerate_scenarios(choice_vars)]
    if len(scenarios) >= MAX_SCENARIOS:
        first.notes.append(f"{len(full)} combinations of unknown releases and choices evaluated, the most check "
                           "evaluates: a finding said to hold whatever is unknown may hold only in some; pass "
                           "--versions (or --versions-from / --as-of) to narrow them")
    all_vars = variables + builds.fork_vars + choice_vars
    holds: dict[str, list[bool]] = {}
    for i, scenario in enumerate(full):
        versions = {**given, **{k: v for k, v in scenario.items() if isinstance(v, Version)}}
        result = builds.get(versions, {v.name: scenario[v.name] for v in builds.fork_vars}, set(queried))
        overrides = {k: v for k, v in scenario.items() if k in result.unsure}
        engine = overrides.get("engine", result.setup.engine)
        if "world_size" in overrides and engine in ("single", "ddp"):
            # Without a sharding engine, the process count decides between one process and DDP.
            overrides["engine"] = "ddp" if overrides["world_size"] > 1 else "single"
        setup = result.setup.replace(versions=versions, **overrides)
        for f in evaluate(setup, apply_fixes=False)[1]:
            holds.setdefault(f.rule.id, [False] * len(full))[i] = True
    order = {r.id: n for n, r in enumerate(all_rules())}
    rules = {r.id: r for r in all_rules()}
    findings = [_in_rule_terms(Checked(rules[rid], *describe(h, full, all_vars)), h, full, all_vars)
                for rid, h in sorted(holds.items(), key=lambda kv: order[kv[0]])]
    pinned = {dep for _, _, pins in framework(first.framework).depends for dep in pins}
    for f in findings:
        for package, spec in f.rule.affected.items():
            if f.holds_if is None and package not in given and package in pinned:
                f.notes.append(f"{package} not given: every release this command can be pins {package} where this "
                               f"holds ({package}{spec}); pass --versions {package}=X.Y.Z if yours differs")
    deciding = {name for f in findings for name in f.decided_by}
    setups = [builds.get(given, combo, set()).setup for combo in builds.combos]
    forked = {n for n in COMBINATION_FIELDS if len({repr(getattr(s, n)) for s in setups}) > 1}
    return Verdict(first, findings, [v for v in all_vars if v.name in deciding], len(full), forked)
