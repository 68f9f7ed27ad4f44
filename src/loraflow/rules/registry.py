"""The rule registry: one declarative rule per known conflict, and the one function that evaluates them.

A rule states its condition on the normalized Setup, its verdict, the cause, the fix, references and the version
that fixed it upstream. Verdict `fix` carries a remedy: the Setup changes the plan applies and announces with the
rule id. No rule is written inline anywhere else: the plan, the runtime guards and (later) `check`, `explain` and
`probe` all read this registry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from loraflow.rules.setup import Setup

Verdict = Literal["error", "fix", "warning"]


@dataclass(frozen=True)
class Rule:
    id: str
    title: str
    verdict: Verdict
    when: Callable[[Setup], bool]
    cause: str
    fix: str
    remedy: Callable[[Setup], dict[str, Any]] | None = None
    """For verdict `fix`: the Setup fields the plan changes."""
    elsewhere: str = ""
    """The flag to change in other frameworks."""
    references: tuple[str, ...] = ()
    fixed_in: str | None = None
    signatures: tuple[str, ...] = ()
    """Text a failed run's log shows when this rule was violated (read by guards and `explain`)."""

    def __post_init__(self) -> None:
        if (self.verdict == "fix") != (self.remedy is not None):
            raise ValueError(f"rule {self.id}: verdict `fix` needs a remedy and only it may have one")


@dataclass(frozen=True)
class Finding:
    rule: Rule
    verdict: Verdict
    changes: dict[str, Any] = field(default_factory=dict)

    def render(self) -> str:
        head = {"error": "ERROR", "fix": "FIXED", "warning": "WARN"}[self.verdict]
        changed = ", ".join(f"{k}={v}" for k, v in self.changes.items())
        applied = f" Applied: {changed}." if changed else ""
        return f"[{head}] {self.rule.id}: {self.rule.title}\n    cause: {self.rule.cause}\n    fix: {self.rule.fix}{applied}"


_REGISTRY: dict[str, Rule] = {}


def register(rule: Rule) -> Rule:
    if rule.id in _REGISTRY:
        raise ValueError(f"rule id {rule.id} registered twice")
    _REGISTRY[rule.id] = rule
    return rule


def all_rules() -> list[Rule]:
    from loraflow.rules import catalog  # noqa: F401  (registers the rules on import)

    return list(_REGISTRY.values())


def get_rule(rule_id: str) -> Rule:
    all_rules()
    return _REGISTRY[rule_id]


def evaluate(setup: Setup, max_rounds: int = 8) -> tuple[Setup, list[Finding]]:
    """Apply every `fix` rule until none fires, then report the errors and warnings that still hold.

    Fixes run to a fixed point because one remedy can create the condition of another (choosing reentrant
    checkpointing makes the input-grad hook necessary). Each rule is reported once, in registry order.
    """
    rules = all_rules()
    findings: dict[str, Finding] = {}
    for _ in range(max_rounds):
        fired = False
        for rule in rules:
            if rule.verdict == "fix" and rule.when(setup):
                changes = rule.remedy(setup)
                setup = setup.replace(**changes)
                previous = findings.get(rule.id)
                merged = {**(previous.changes if previous else {}), **changes}
                findings[rule.id] = Finding(rule, "fix", merged)
                fired = True
        if not fired:
            break
    else:  # pragma: no cover - a remedy that re-triggers its own rule is a registry bug
        raise RuntimeError("rule fixes did not converge; a remedy re-triggers its own condition")
    for rule in rules:
        if rule.verdict != "fix" and rule.when(setup):
            findings[rule.id] = Finding(rule, rule.verdict)
    order = {r.id: i for i, r in enumerate(rules)}
    return setup, sorted(findings.values(), key=lambda f: order[f.rule.id])
