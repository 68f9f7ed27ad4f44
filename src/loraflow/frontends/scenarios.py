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

from packaging.specifiers import SpecifierSet
from packaging.version import Version

MAX_SCENARIOS = 256
FLOOR = Version("0")


def bump(v: Version) -> Version:
    """The release after `v` in its last component: 0.15.3 -> 0.15.4 (turns `<=0.15.3` into `<0.15.4`)."""
    parts = list(v.release)
    parts[-1] += 1
    return Version(".".join(map(str, parts)))


def spec_points(spec: str) -> set[Version]:
    """The versions at which a specifier set (or several joined by `||`) changes its answer."""
    points = set()
    for s in (item for part in spec.split("||") for item in SpecifierSet(part)):
        v = Version(s.version.replace(".*", ""))
        points.add(bump(v) if s.operator in ("<=", ">") else v)
        if s.operator in ("==", "~="):
            points.add(bump(v))
    return points


def intersect(spec: str) -> str | None:
    """A specifier set in its shortest form (`<4.1.0,>=3.0.0,>=3.1.0` -> `>=3.1.0,<4.1.0`), or None when no version
    satisfies it. Bounds are tightened; other operators (==, !=, ~=) are kept as written."""
    lows, highs, rest = [], [], []
    for item in SpecifierSet(spec):
        v = Version(item.version.replace(".*", "")) if item.operator in ("<", "<=", ">", ">=") else None
        if item.operator in (">", ">="):
            lows.append((v, item.operator == ">"))
        elif item.operator in ("<", "<="):
            highs.append((v, item.operator == "<"))
        elif str(item) not in rest:
            rest.append(str(item))
    low = max(lows, default=None)  # at one version, `>` (strict) is the tighter bound
    high = min(highs, key=lambda h: (h[0], not h[1]), default=None)  # and `<` the tighter one
    if low and high and (low[0] > high[0] or (low[0] == high[0] and (low[1] or high[1]))):
        return None
    parts = ([f"{'>' if low[1] else '>='}{low[0]}"] if low else []) + (
        [f"{'<' if high[1] else '<='}{high[0]}"] if high else []) + rest
    if any(not SpecifierSet(",".join(parts)).contains(Version(r.lstrip("=")), prereleases=True)
           for r in rest if r.startswith("==") and "*" not in r):
        return None
    return ",".join(parts)


@dataclass
class Variable:
    name: str
    kind: str
    """`version` (a package whose release is unknown) or `choice` (a Combination field the command line does not
    show)."""
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

    def considered(self) -> list[Any]:
        """The values evaluated: the whole domain, less the release ranges outside an inferred era."""
        allowed = getattr(self, "allowed", None)
        return [d for i, d in enumerate(self.domain()) if allowed is None or allowed[i]] or self.domain()

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


def meets(spec: SpecifierSet, lo: Version, hi: Version | None) -> bool:
    """Whether some release in [lo, hi) satisfies `spec` (lo == FLOOR: any release below hi). The candidates are the
    interval's first release, each boundary of `spec` inside it, and the release just below each of those."""
    start = lo if lo != FLOOR else Version("0.0.1")
    edges = spec_points(str(spec)) | ({hi} if hi is not None else set())
    candidates = {start} | edges | {b for p in edges if (b := _below(p)) is not None}
    return any(c in spec for c in candidates if start <= c and (hi is None or c < hi))


def _below(v: Version) -> Version | None:
    parts = list(v.release)
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] > 0:
            parts[i] -= 1
            return Version(".".join(map(str, parts[:i + 1])) + ".999")
    return None


def version_variables(queried: dict[str, set[Version]], known: dict[str, Version | None],
                      eras: dict[str, SpecifierSet]) -> list[Variable]:
    out = []
    for package, points in sorted(queried.items()):
        if known.get(package) is not None or not points:
            continue
        var = Variable(package, "version", sorted(points))
        era = eras.get(package)
        if era is not None:  # an era the frontend inferred drops the intervals outside it
            dom = var.domain()
            var.allowed = [meets(era, lo, dom[i + 1] if i + 1 < len(dom) else None)  # type: ignore[attr-defined]
                           for i, lo in enumerate(dom)]
        out.append(var)
    return out


def enumerate_scenarios(variables: list[Variable], consistent: Callable[[dict], bool] = lambda s: True
                        ) -> list[dict[str, Any]]:
    domains = []
    for var in variables:
        domains.append(var.considered())
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
    """The holding combinations in words, adjacent release ranges of one variable merged: of all ways to merge,
    the one with the fewest alternatives."""
    variables = [by_name[n] for n in subset]
    sets = [sorted({k[i] for k in keys}, key=lambda x, v=var: v.domain().index(x) if v.kind == "version" else
                   list(v.values).index(x)) for i, var in enumerate(variables)]
    if len(subset) > 1 and len(set(keys)) == len(list(itertools.product(*sets))):
        # Every combination of the values that hold: one conjunction, each variable's values said once.
        parts = []
        for var, values in zip(variables, sets):
            said = ([var.interval(run) for run in _runs(values, var.domain())] if var.kind == "version"
                    else [var.describe(x) for x in values])
            parts.append(said[0] if len(said) == 1 else "(" + " or ".join(said) + ")")
        return " and ".join(parts)
    best: list[str] | None = None
    for i, var in enumerate(variables):
        groups: dict[tuple, list[Any]] = {}
        for key in keys:
            groups.setdefault(key[:i] + key[i + 1:], []).append(key[i])
        terms = []
        for rest, values in groups.items():
            others = [v.describe(x) for v, x in zip(variables[:i] + variables[i + 1:], rest)]
            if var.kind == "version":
                runs = [var.interval(run) for run in _runs(values, var.domain())]
            else:
                runs = [var.describe(x) for x in values]
            terms += [" and ".join([run, *others]) for run in runs]
        if best is None or len(terms) < len(best):
            best = terms
    assert best is not None
    return " or ".join(f"({t})" if len(best) > 1 and " and " in t else t for t in best)


def _runs(values: list[Any], domain: list[Any]) -> list[list[Any]]:
    idx = sorted(domain.index(v) for v in values)
    runs: list[list[Any]] = []
    for i in idx:
        if runs and domain.index(runs[-1][-1]) == i - 1:
            runs[-1].append(domain[i])
        else:
            runs.append([domain[i]])
    return runs

