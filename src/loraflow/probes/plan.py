"""The two settings a probe compares: the naive Combination of a case (with the installed versions), and what
loraflow's plan makes of it through the one rule registry (or its refusal)."""

from __future__ import annotations

from loraflow.environment import detect_environment
from loraflow.rules import evaluate
from loraflow.rules.combination import COMBINATION_FIELDS, Combination


def installed(setup: Combination) -> Combination:
    return setup.replace(versions=dict(detect_environment().versions))


def plan_setup(case) -> tuple[Combination, Combination, str | None]:
    """(naive, planned, refusal): refusal names the error findings when the plan would not run this setup."""
    naive = installed(case.naive)
    final, findings = evaluate(naive)
    errors = [f.rule.id for f in findings if f.verdict == "error"]
    refusal = f"refused before step 1 by {', '.join(errors)}" if errors else None
    return naive, final, refusal


def predicted(case) -> bool:
    """Whether the registry says the naive settings break on the installed versions."""
    from loraflow.rules import get_rule

    return get_rule(case.rule).applies(installed(case.naive))


def describe(setup: Combination) -> str:
    """The fields that differ from Combination's defaults: a short line for logs."""
    default = Combination()
    parts = [f"{k}={getattr(setup, k)}" for k in COMBINATION_FIELDS if getattr(setup, k) != getattr(default, k)]
    return ", ".join(parts) or "defaults"
