"""The rule registry: every rule the catalogs declare (rule.py says what a rule is), and the one function that
evaluates them on a normalized setup.
"""

from __future__ import annotations

from loraflow.rules.combination import Combination
from loraflow.rules.rule import (
    _REGISTRY,
    SYMPTOMS,
    Finding,
    Rule,
    affected_by,
    register,
)

__all__ = ["SYMPTOMS", "Finding", "Rule", "affected_by", "all_rules", "evaluate", "get_rule", "register",
           "rules_for_symptom"]


def all_rules() -> list[Rule]:
    # Importing the catalogs registers their rules.
    from loraflow.rules import (catalog, catalog_fsdp, catalog_patchers, catalog_placement,  # noqa: F401
                                catalog_precision, catalog_quant, catalog_reducers, catalog_rollout,
                                catalog_saving, catalog_sharded, catalog_vision, catalog_zero_config)

    return list(_REGISTRY.values())


def get_rule(rule_id: str) -> Rule:
    all_rules()
    if rule_id not in _REGISTRY:
        from difflib import get_close_matches

        near = get_close_matches(rule_id, _REGISTRY, n=3)
        hint = f" Did you mean {', '.join(near)}?" if near else " `loraflow explain --list` shows every id."
        raise KeyError(f"no rule with id {rule_id!r}.{hint}")
    return _REGISTRY[rule_id]


def rules_for_symptom(symptom: str) -> list[Rule]:
    """The rules whose failure shows as `symptom` at run time, in registry order: the guards' likely causes."""
    if symptom not in SYMPTOMS:
        raise KeyError(f"unknown symptom {symptom!r}; the guards observe {', '.join(SYMPTOMS)}")
    return [r for r in all_rules() if symptom in r.symptoms]


def evaluate(setup: Combination, max_rounds: int = 8, apply_fixes: bool = True) -> tuple[Combination, list[Finding]]:
    """Apply every `fix` rule until none fires, then report the errors and warnings that still hold.

    Fixes run to a fixed point because one remedy can create the condition of another (choosing reentrant
    checkpointing makes the input-grad hook necessary). Each rule is reported once, in registry order.
    With apply_fixes=False (another framework's setup, which loraflow does not run) every rule that holds is
    reported as it stands and nothing changes.
    """
    rules = all_rules()
    findings: dict[str, Finding] = {}
    for _ in range(max_rounds if apply_fixes else 0):
        fired = False
        for rule in rules:
            if rule.verdict == "fix" and rule.applies(setup):
                changes = rule.remedy(setup)
                setup = setup.replace(**changes)
                previous = findings.get(rule.id)
                merged = {**(previous.changes if previous else {}), **changes}
                findings[rule.id] = Finding(rule, "fix", merged, tuple(rule.version_notes(setup)[1]))
                fired = True
        if not fired:
            break
    else:  # pragma: no cover - a remedy that re-triggers its own rule is a registry bug
        if apply_fixes:
            raise RuntimeError("rule fixes did not converge; a remedy re-triggers its own condition")
    for rule in rules:
        if (rule.verdict != "fix" or not apply_fixes) and rule.applies(setup):
            findings[rule.id] = Finding(rule, rule.verdict, notes=tuple(rule.version_notes(setup)[1]))
    order = {r.id: i for i, r in enumerate(rules)}
    return setup, sorted(findings.values(), key=lambda f: order[f.rule.id])
