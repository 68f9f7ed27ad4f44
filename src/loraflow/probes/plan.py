"""The two settings a probe compares: the naive Setup of a case (with the installed versions), and what
loraflow's plan makes of it through the one rule registry (or its refusal)."""

from __future__ import annotations

from loraflow.environment import detect_environment
from loraflow.rules import evaluate
from loraflow.rules.setup import SETUP_FIELDS, Setup


def installed(setup: Setup) -> Setup:
    return setup.replace(versions=dict(detect_environment().versions))


def plan_setup(case) -> tuple[Setup, Setup, str | None]:
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


def describe(setup: Setup) -> str:
    """The fields that differ from Setup's defaults: a short line for logs."""
    default = Setup()
    parts = [f"{k}={getattr(setup, k)}" for k in SETUP_FIELDS if getattr(setup, k) != getattr(default, k)]
    return ", ".join(parts) or "defaults"
