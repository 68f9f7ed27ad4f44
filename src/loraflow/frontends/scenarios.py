"""What `check` does not know, evaluated rather than assumed.

A launch line from another framework rarely says which versions it ran with, and some choices are made inside the
user's own script where no flag shows them. Each such unknown becomes a variable: a package version (split into the
intervals at which either a rule or the framework's defaults change) or a choice (the values the script could have
made). The frontend builds the setup once per combination (a scenario), the rules are evaluated on each, and every
finding is reported with the condition under which it holds ("deepspeed<0.19.3", "trl>=0.28 and the script
checkpoints non-reentrant"), or as holding everywhere.

Frontends narrow the variables: a flag spelling reveals the framework's era (`draft.era`), a framework release pins
its dependencies (`Framework.depends`), and version-given packages (`--versions`) are not variables at all.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable

from packaging.specifiers import Specifier, SpecifierSet
from packaging.version import Version

MAX_SCENARIOS = 256
FLOOR = Version("0")


def bump(v: Version) -> Version:
    """The release after `v` in its last component: 0.15.3 -> 0.15.4 (turns `<=0.15.3` into `<0.15.4`)."""
    parts = list(v.release)
    parts[-1] += 1
    return Version(".".join(map(str, parts)))


def spec_points(spec: str) -> set[Version]:
    """The versions at which a specifier set changes its answer."""
    points = set()
    for s in SpecifierSet(spec):
        v = Version(s.version.replace(".*", ""))
        points.add(bump(v) if s.operator in ("<=", ">") else v)
        if s.operator in ("==", "~="):
            points.add(bump(v))
    return points


@dataclass
class Variable:
    name: str
    kind: str
    """`version` (a package whose release is unknown) or `choice` (a Setup field the command line does not show)."""
    points: list[Version] = field(default_factory=list)
    """For versions: the boundaries, sorted; the intervals between them are the variable's values."""
    values: list[Any] = field(default_factory=list)
    labels: dict[Any, str] = field(default_factory=dict)
    """For choices: what each value means, in words."""
    why: str = ""

    def domain(self) -> list[Any]:
        if self.kind == "choice":
            return list(self.values)
        return [FLOOR] + list(self.points)

    def describe(self, value: Any) -> str:
        if self.kind == "choice":
            return self.labels.get(value, f"{self.name}={value}")
        return self.interval([value])

    def interval(self, reps: list[Version]) -> str:
        """A run of consecutive interval representatives in words: `deepspeed<0.19.3`, `0.15.4<=trl<0.28`."""
        dom = self.domain()
        idx = sorted(dom.index(r) for r in reps)
        lo, hi = dom[idx[0]], (dom[idx[-1] + 1] if idx[-1] + 1 < len(dom) else None)
        name = self.name
        if lo == FLOOR and hi is None:
            return f"any {name}"
        if lo == FLOOR:
            return f"{name}<{hi}"
        if hi is None:
            return f"{name}>={lo}"
        return f"{lo}<={name}<{hi}"


def version_variables(queried: dict[str, set[Version]], known: dict[str, Version | None],
                      eras: dict[str, SpecifierSet]) -> list[Variable]:
    out = []
    for package, points in sorted(queried.items()):
        if known.get(package) is not None or not points:
            continue
        out.append(Variable(package, "version", sorted(points)))
    # An era the frontend inferred drops the intervals outside it.
    for var in out:
        era = eras.get(var.name)
        if era is not None:
            kept = [p for p in var.domain() if p in era or (p == FLOOR and _floor_allowed(era, var.points))]
            var.points = [p for p in var.points if p in kept]
            var.floor_allowed = FLOOR in kept  # type: ignore[attr-defined]
    return out


def _floor_allowed(era: SpecifierSet, points: list[Version]) -> bool:
    """Whether some version below the first boundary lies in the era (the floor interval stays)."""
    first = points[0] if points else None
    for s in era:
        if s.operator in ("<", "<="):
            return True
        if s.operator in (">", ">=", "==", "~=") and first is not None and Version(s.version.replace(".*", "")) < first:
            return True
    return not list(era)


def enumerate_scenarios(variables: list[Variable], consistent: Callable[[dict], bool] = lambda s: True
                        ) -> list[dict[str, Any]]:
    domains = []
    for var in variables:
        dom = var.domain()
        if var.kind == "version" and not getattr(var, "floor_allowed", True):
            dom = dom[1:]
        domains.append(dom)
    combos = [dict(zip((v.name for v in variables), values)) for values in itertools.product(*domains)]
    combos = [c for c in combos if consistent(c)] or combos
    return combos[:MAX_SCENARIOS]


def describe(holds: list[bool], scenarios: list[dict[str, Any]], variables: list[Variable]
             ) -> tuple[str | None, tuple[str, ...]]:
    """The condition under which a finding holds, over the fewest variables that decide it, and those variables;
    (None, ()) when it holds in every scenario."""
    if all(holds):
        return None, ()
    by_name = {v.name: v for v in variables}
    names = [v.name for v in variables]
    for size in range(1, len(names) + 1):
        for subset in itertools.combinations(names, size):
            table: dict[tuple, set[bool]] = {}
            for s, h in zip(scenarios, holds):
                table.setdefault(tuple(s[n] for n in subset), set()).add(h)
            if all(len(v) == 1 for v in table.values()):
                true_keys = [k for k, v in table.items() if True in v]
                return _words(subset, true_keys, by_name), subset
    return "in some of the combinations of unknown versions and choices", tuple(names)


def _words(subset: tuple[str, ...], keys: list[tuple], by_name: dict[str, Variable]) -> str:
    if len(subset) == 1:
        var = by_name[subset[0]]
        values = [k[0] for k in keys]
        if var.kind == "version":
            return " or ".join(var.interval(run) for run in _runs(values, var.domain()))
        return " or ".join(var.describe(v) for v in values)
    parts = []
    for key in keys:
        parts.append(" and ".join(by_name[n].describe(v) for n, v in zip(subset, key)))
    return " or ".join(f"({p})" if len(keys) > 1 else p for p in parts)


def _runs(values: list[Any], domain: list[Any]) -> list[list[Any]]:
    idx = sorted(domain.index(v) for v in values)
    runs: list[list[Any]] = []
    for i in idx:
        if runs and domain.index(runs[-1][-1]) == i - 1:
            runs[-1].append(domain[i])
        else:
            runs.append([domain[i]])
    return runs


def spec_of(text: str) -> SpecifierSet:
    return SpecifierSet(text)


__all__ = ["Specifier", "Variable", "bump", "describe", "enumerate_scenarios", "spec_points", "version_variables"]
