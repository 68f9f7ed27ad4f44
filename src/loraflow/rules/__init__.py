"""The rule registry: known conflicts as data (catalog.py), the normalized combination of features they read
(combination.py) and the one function that evaluates them (registry.evaluate)."""

from loraflow.rules.combination import Combination
from loraflow.rules.registry import (
    Finding,
    Rule,
    all_rules,
    evaluate,
    get_rule,
    rules_for_symptom,
)

__all__ = ["Finding", "Rule", "Combination", "all_rules", "evaluate", "get_rule", "rules_for_symptom"]
