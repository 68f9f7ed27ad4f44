"""The rule registry: known conflicts as data (catalog.py), the normalized setup they read (setup.py) and the one
function that evaluates them (registry.evaluate)."""

from loraflow.rules.registry import (
    Finding,
    Rule,
    all_rules,
    evaluate,
    get_rule,
    rules_for_symptom,
)
from loraflow.rules.setup import Setup

__all__ = ["Finding", "Rule", "Setup", "all_rules", "evaluate", "get_rule", "rules_for_symptom"]
