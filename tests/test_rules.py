"""Every rule: a setup that triggers it, and a neighbouring setup that must leave it silent."""

from __future__ import annotations

import pytest

from loraflow.rules import Setup, all_rules, evaluate, get_rule
from loraflow.rules.registry import Rule

BASE = Setup(adapter="lora", matched_modules=28)

# rule id -> (setup that triggers it, neighbouring setup that must not)
CASES = {
    "reentrant-frozen-inputs": (
        BASE.replace(checkpointing="all", reentrant=True),
        BASE.replace(checkpointing="all", reentrant=False)),
    "reentrant-partial-silent": (
        BASE.replace(checkpointing="partial", checkpoint_every_n=2, reentrant=True),
        BASE.replace(checkpointing="partial", checkpoint_every_n=2, reentrant=True, embeddings_trainable=True)),
    "cache-during-recompute": (
        BASE.replace(checkpointing="all", reentrant=True, checkpoint_impl="torch-wrapper", use_cache=True,
                     input_grad_hook=True),
        BASE.replace(checkpointing="all", reentrant=True, checkpoint_impl="transformers", use_cache=True,
                     input_grad_hook=True)),
    "packing-cache-cross-attention": (
        BASE.replace(packing=True, use_cache=True),
        BASE.replace(packing=True, use_cache=False)),
    "no-adapter-matched": (
        BASE.replace(matched_modules=0),
        BASE.replace(adapter="full", matched_modules=None)),
    "tied-embedding-adapter": (
        BASE.replace(tied_embeddings=True, lm_head_trainable=True),
        BASE.replace(tied_embeddings=False, lm_head_trainable=True)),
}


def fired(setup: Setup) -> dict[str, str]:
    _, findings = evaluate(setup)
    return {f.rule.id: f.verdict for f in findings}


def test_every_registered_rule_has_cases():
    assert {r.id for r in all_rules()} == set(CASES)


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_triggers(rule_id):
    trigger, _ = CASES[rule_id]
    assert fired(trigger).get(rule_id) == get_rule(rule_id).verdict


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_silent_on_neighbour(rule_id):
    _, neighbour = CASES[rule_id]
    assert rule_id not in fired(neighbour)


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_fix_rules_resolve_their_condition(rule_id):
    """After the plan applies a fix, the rule's own condition no longer holds."""
    rule = get_rule(rule_id)
    final, _ = evaluate(CASES[rule_id][0])
    if rule.verdict == "fix":
        assert not rule.when(final)


def test_fixes_are_reported_with_what_they_changed():
    final, findings = evaluate(BASE.replace(checkpointing="all", reentrant=True, packing=True, use_cache=True))
    by_id = {f.rule.id: f for f in findings}
    assert by_id["reentrant-frozen-inputs"].changes == {"input_grad_hook": True}
    assert by_id["packing-cache-cross-attention"].changes == {"use_cache": False}
    assert final.input_grad_hook and not final.use_cache


def test_rule_metadata_is_complete():
    for rule in all_rules():
        assert rule.id and rule.title and rule.cause and rule.fix and rule.references, rule.id
        assert rule.verdict in ("error", "fix", "warning")


def test_a_fix_rule_needs_a_remedy():
    with pytest.raises(ValueError, match="needs a remedy"):
        Rule(id="x", title="x", verdict="fix", when=lambda s: True, cause="c", fix="f")
