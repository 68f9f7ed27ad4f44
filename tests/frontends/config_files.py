"""Helpers the framework-config sweeps' tests share (test_wild4_configs, test_wild10_configs, test_wild12_configs)."""

from __future__ import annotations

from loraflow.rules import evaluate


def write(tmp_path, name: str, text: str) -> str:
    """A config file in the test's directory; its path."""
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def rule_ids(result) -> set[str]:
    """The rules a frontend's reading sets off, before loraflow's own fixes."""
    return {f.rule.id for f in evaluate(result.setup, apply_fixes=False)[1]}
