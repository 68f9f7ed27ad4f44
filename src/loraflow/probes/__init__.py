"""`loraflow probe`: tiny live reproductions of the registry's rules on the installed stack.

Each Case names a rule, the naive Setup that triggers it, and an `execute(setup, ctx)` function that runs one
training step (or save, or generate) of a tiny model exactly as the Setup says, on 1 or 2 ranks. The runner
executes every case in its own subprocess twice: once with the naive Setup (does this stack break?) and once with
the Setup loraflow's plan turns it into (`rules.evaluate`); a plan that refuses the setup counts as safe.
The registry also predicts the naive outcome from the installed versions; the table shows both, so a stack that
behaves differently from the catalog is visible at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

from loraflow.rules.setup import Setup

Status = Literal["ok", "error", "wrong", "refused", "n/a", "timeout", "failed"]
"""`failed`: the probe process died before reporting (a probe bug or a broken install), which says nothing
about the rule."""


@dataclass
class Observation:
    status: Status
    detail: str = ""

    @property
    def broken(self) -> bool:
        return self.status in ("error", "wrong", "timeout")


@dataclass
class Context:
    rank: int = 0
    world_size: int = 1
    workdir: str = "."


@dataclass(frozen=True)
class Case:
    rule: str
    naive: Setup
    """The settings that trigger the rule (versions are filled in from the installed stack)."""
    execute: Callable[[Setup, Context], Observation]
    ranks: int = 1
    requires: tuple[str, ...] = ()
    """Python packages the reproduction needs; missing ones make it not applicable."""
    needs_cuda: str | None = None
    """Why this case only reproduces on a GPU (None: runs on CPU)."""
    timeout: float = 150.0
    what: str = ""
    """One line: what the reproduction runs."""


_CASES: dict[str, Case] = {}


def case(rule: str, naive: Setup, **kwargs) -> Callable:
    """Decorator: register `execute` as the live reproduction of `rule`."""
    def register(execute: Callable[[Setup, Context], Observation]):
        if rule in _CASES:
            raise ValueError(f"probe for {rule} registered twice")
        _CASES[rule] = Case(rule=rule, naive=naive, execute=execute, what=" ".join((execute.__doc__ or "").split()), **kwargs)
        return execute
    return register


def all_cases() -> dict[str, Case]:
    from loraflow.probes import cases  # noqa: F401  (single-process reproductions register on import)
    from loraflow.probes import distributed  # noqa: F401  (DDP, DeepSpeed and FSDP reproductions)

    return dict(_CASES)
