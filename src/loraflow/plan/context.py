"""What every decision area reads once the rules have run: the inputs, the setup as asked and as fixed, and which
rule changed which field. Built once by `resolve`; the areas (precision.py, engine.py, ...) never re-decide what
another area decided, they take its value as an argument."""

from __future__ import annotations

from dataclasses import dataclass

from loraflow.config.schema import Config
from loraflow.environment import Environment
from loraflow.rules import Combination
from loraflow.setup.model import ModelInfo
from loraflow.stagespec import StageSpec


@dataclass(frozen=True)
class Context:
    config: Config
    env: Environment
    model: ModelInfo
    spec: StageSpec
    asked: Combination
    """The setup as asked, before any rule's fix (plan/asked.py)."""
    setup: Combination
    """The setup after the rules' fixes: what runs."""
    changed_by: dict[str, str]
    """Combination field -> the id of the rule that changed it."""

    def rule(self, key: str) -> str | None:
        return self.changed_by.get(key)


def dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")
