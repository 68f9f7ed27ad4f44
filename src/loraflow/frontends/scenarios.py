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

MAX_SCENARIOS = 4096
"""Combinations of unknown releases and choices evaluated at most. Each costs a rule evaluation (about 0.3 ms); one
past the cap would leave a release range unevaluated and a conditional finding read as unconditional, so a verdict
that reaches it says so (verdict.py)."""
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
    names = [v.name for v in variables]
    every = (dict(zip(names, values)) for values in itertools.product(*domains))
    combos = list(itertools.islice((c for c in every if consistent(c)), MAX_SCENARIOS))
    if not combos:  # nothing consistent: every combination, as read
        combos = [dict(zip(names, values)) for values in itertools.islice(itertools.product(*domains), MAX_SCENARIOS)]
    return combos


def describe(holds: list[bool], scenarios: list[dict[str, Any]], variables: list[Variable]
             ) -> tuple[str | None, tuple[str, ...]]:
    """The condition under which a finding holds, over the fewest variables that decide it, and those variables;
    (None, ()) when it holds in every scenario."""
    if all(holds):
        return None, ()
    by_name = {v.name: v for v in variables}
    names = [v.name for v in variables]
    rows = list(dict.fromkeys((tuple(s[n] for n in names), h) for s, h in zip(scenarios, holds)))

    def decides(subset: tuple[str, ...]) -> dict[tuple, set[bool]] | None:
        at = [names.index(n) for n in subset]
        table: dict[tuple, set[bool]] = {}
        for values, h in rows:
            seen = table.setdefault(tuple(values[i] for i in at), set())
            seen.add(h)
            if len(seen) > 1:
                return None
        return table

    # The unknowns that matter: drop each one the finding does not depend on, given the rest (a pass over the
    # scenarios per unknown); the fewest that decide it are then looked for among those left, not among every subset
    # of every unknown, which grows as 2^n over tens of thousands of scenarios.
    kept = list(names)
    for name in reversed(names):  # the later unknowns go first: of two that decide alike, the earlier is said
        if len(kept) > 1 and decides(tuple(n for n in kept if n != name)) is not None:
            kept.remove(name)
    for size in range(1, len(kept) + 1):
        for subset in itertools.combinations(kept, size):
            table = decides(subset)
            if table is not None:
                return _words(subset, table, by_name), subset
    return "in some of the combinations of unknown versions and choices", tuple(names)


def _words(subset: tuple[str, ...], table: dict[tuple, set[bool]], by_name: dict[str, Variable]) -> str:
    """The holding combinations in words, as few alternatives as a greedy cover finds: each alternative is a product
    of value sets (a release range, several choices), grown from a holding combination while every combination
    inside it that was evaluated holds; a variable whose whole evaluated range is in an alternative is left out of
    it, and adjacent release ranges are merged (`transformers<4.39.0 or bitsandbytes<0.43.0`, not one alternative
    per interval)."""
    variables = [by_name[n] for n in subset]

    def order(i: int, x: Any) -> int:
        var = variables[i]
        return var.domain().index(x) if var.kind == "version" else list(var.values).index(x)

    present = [sorted({k[i] for k in table}, key=lambda x, i=i: order(i, x)) for i in range(len(variables))]
    true = {k for k, v in table.items() if True in v}

    def holds_all(cube: list[list[Any]]) -> bool:
        return all(combo in true for combo in itertools.product(*cube) if combo in table)

    cubes: list[list[list[Any]]] = []
    for key in sorted(true, key=lambda k: [order(i, x) for i, x in enumerate(k)]):
        if any(all(x in c for x, c in zip(key, cube)) for cube in cubes):
            continue
        cube = [[x] for x in key]
        for i in range(len(variables)):
            for value in present[i]:
                if value not in cube[i]:
                    trial = [*cube[:i], sorted([*cube[i], value], key=lambda x, i=i: order(i, x)), *cube[i + 1:]]
                    if holds_all(trial):
                        cube = trial
        cubes.append(cube)
    alternatives = []
    for cube in cubes:
        parts = []
        for i, (var, values) in enumerate(zip(variables, cube)):
            if len(values) == len(present[i]) and len(variables) > 1:
                continue  # every evaluated value: this alternative does not depend on it
            said = ([var.interval(run) for run in _runs(values, var.domain())] if var.kind == "version"
                    else [var.describe(x) for x in values])
            parts.append(said[0] if len(said) == 1 else "(" + " or ".join(said) + ")")
        alternatives.append(parts)
    # What every alternative says is said once: `ZeRO-3 and (transformers<4.39.0 or bitsandbytes<0.43.0)`.
    common = [p for p in alternatives[0] if all(p in a for a in alternatives[1:])] if len(alternatives) > 1 else []
    rest = [" and ".join(p for p in a if p not in common) for a in alternatives]
    if common and all(rest):
        inner = " or ".join(f"({t})" if " and " in t else t for t in rest)
        return " and ".join([*common, f"({inner})"])
    terms = [" and ".join(a) or "always" for a in alternatives]
    if len(terms) == 1:
        return terms[0][1:-1] if terms[0].startswith("(") and terms[0].endswith(")") and " and " not in terms[0] \
            else terms[0]
    return " or ".join(f"({t})" if " and " in t else t for t in terms)


def _runs(values: list[Any], domain: list[Any]) -> list[list[Any]]:
    idx = sorted(domain.index(v) for v in values)
    runs: list[list[Any]] = []
    for i in idx:
        if runs and domain.index(runs[-1][-1]) == i - 1:
            runs[-1].append(domain[i])
        else:
            runs.append([domain[i]])
    return runs

