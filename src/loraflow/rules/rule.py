"""A rule: one declarative known conflict, and the table the catalogs register their rules in.

A rule states its condition on the normalized Combination and on installed versions, its verdict, the cause, the fix,
references and the version that fixed it upstream. Verdict `fix` carries a remedy: the Combination changes the plan
applies and announces with the rule id. No rule is written inline anywhere else: the plan, the runtime guards,
`check`, `explain` and `probe` all read the registry (registry.py), which loads the catalogs that register here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal
from collections.abc import Callable

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from loraflow.rules.combination import COMBINATION_FIELDS, Combination
from loraflow.rules.signs import FACT_NAMES, LogSigns

Verdict = Literal["error", "fix", "warning"]
Impact = Literal["crash", "silent", "slow"]

SYMPTOMS: dict[str, str] = {
    "no-gradient-reentrant": "trainable parameters got no gradient in the first backward, with reentrant "
                             "checkpointing on",
    "no-gradient": "trainable parameters got no gradient in the first backward, without reentrant checkpointing",
    "zero-adapter-gradient": "an adapter module got an all-zero gradient in the first backward",
    "eval-mode-at-backward": "the trained model, or a submodule with parameters, is in eval mode at backward",
}
"""What the runtime guards (loop/guards.py) can observe on the first step. A rule lists the symptoms its failure shows
as (`Rule.symptoms`); a guard that sees one names those rules as the likely causes (`rules_for_symptom`)."""


def affected_by(version, spec: str) -> bool:
    """Whether `version` lies in `spec`, a specifier set or several joined by `||` (a pre-release or development
    build as the release just before it, environment.as_release: PEP 440 ranges hold none)."""
    from loraflow.environment import as_release

    return any(as_release(version) in SpecifierSet(part) for part in spec.split("||"))


def older(setup: Combination, package: str, release: str) -> bool:
    """For a version condition on one branch of a rule (declared in Rule.boundaries): whether the setup's `package`
    is older than `release`. An unknown version counts as older, as `affected` counts it as affected (the finding
    says so)."""
    installed = setup.version(package)
    return installed is None or installed < Version(release)


@dataclass(frozen=True)
class Rule:
    id: str
    title: str
    verdict: Verdict
    """What loraflow does when the condition holds: refuse (error), change the setup (fix), or warn."""
    impact: Impact
    """What happens without the fix: a crash, silently wrong or lost results, or a large slowdown/memory cost."""
    when: Callable[[Combination], bool]
    conditions: str
    """The condition of `when`, in words (for docs, `check` and `explain`)."""
    cause: str
    fix: str
    remedy: Callable[[Combination], dict[str, Any]] | None = None
    """For verdict `fix`: the Combination fields the plan changes."""
    knobs: tuple[str, ...] = ()
    """Combination fields a user changes to avoid the conflict; frontends map them to their framework's flags."""
    elsewhere: str = ""
    """The fix in other frameworks, in general terms (frontends add their exact flag names)."""
    affected: dict[str, str] = field(default_factory=dict)
    """Installed versions that have the bug, as specifiers ({"deepspeed": "<0.19.3"}; `||` separates ranges: a bug
    fixed and later reintroduced); empty: every version."""
    boundaries: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Releases inside `affected` at which `when` itself changes its answer (a branch of the condition fixed in
    another release, read with `older`): `check` evaluates both sides of each, as it does `affected`'s own."""
    references: tuple[str, ...] = ()
    fixed_in: str | None = None
    log: LogSigns = field(default_factory=LogSigns)
    """How the failure shows in a log: its messages (every wording), raise-path frames and telling facts."""
    symptoms: tuple[str, ...] = ()
    """What the runtime guards see when this failure slips through (keys of SYMPTOMS)."""

    def __post_init__(self) -> None:
        if (self.verdict == "fix") != (self.remedy is not None):
            raise ValueError(f"rule {self.id}: verdict `fix` needs a remedy and only it may have one")
        unknown = [k for k in self.knobs if k not in COMBINATION_FIELDS]
        if unknown:
            raise ValueError(f"rule {self.id}: knobs {unknown} are not Combination fields")
        unknown = [k for k in self.symptoms if k not in SYMPTOMS]
        if unknown:
            raise ValueError(f"rule {self.id}: symptoms {unknown} are not in registry.SYMPTOMS")
        for package, spec in self.affected.items():
            for part in spec.split("||"):
                SpecifierSet(part)  # raises on a typo
        for package, releases in self.boundaries.items():
            for release in releases:
                Version(release)  # raises on a typo
        unknown_facts = [e.fact for e in self.log.evidence if e.fact not in FACT_NAMES]
        if unknown_facts:
            raise ValueError(f"rule {self.id}: evidence facts {unknown_facts} are not in rules/signs.py")
        for m in (*self.log.messages, *self.log.frames):
            re.compile(m.pattern)  # raises on a typo

    def version_notes(self, setup: Combination) -> tuple[bool, list[str]]:
        """(affected, notes): whether the setup's versions have the bug; unknown versions count as affected."""
        notes: list[str] = []
        for package, spec in self.affected.items():
            installed = setup.version(package)
            if package in setup.not_used:
                return False, [f"{package} is not used by this run"]
            if installed is None:
                notes.append(f"{package} version unknown, assumed affected ({package}{spec}); "
                             f"pass --versions {package}=X.Y.Z")
            elif not affected_by(installed, spec):
                return False, [f"{package} {installed} is not affected ({package}{spec})"]
        return True, notes

    def applies(self, setup: Combination) -> bool:
        return self.when(setup) and self.version_notes(setup)[0]


@dataclass(frozen=True)
class Finding:
    rule: Rule
    verdict: Verdict
    changes: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def render(self) -> str:
        head = {"error": "ERROR", "fix": "FIXED", "warning": "WARN"}[self.verdict]
        changed = ", ".join(f"{k}={v}" for k, v in self.changes.items())
        applied = f" Applied: {changed}." if changed else ""
        extra = "".join(f"\n    note: {n}" for n in self.notes)
        return (f"[{head}] {self.rule.id}: {self.rule.title}\n    cause: {self.rule.cause}\n"
                f"    fix: {self.rule.fix}{applied}{extra}")


_REGISTRY: dict[str, Rule] = {}


def register(rule: Rule) -> Rule:
    if rule.id in _REGISTRY:
        raise ValueError(f"rule id {rule.id} registered twice")
    _REGISTRY[rule.id] = rule
    return rule
