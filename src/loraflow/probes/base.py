"""What every probe case module shares with the package: the outcome of a reproduction (Observation), the rank it
runs on (Context), the Case record, and the registry the `case` decorator fills. Case modules import these from
here, never from the package `loraflow.probes`, whose __init__ imports the case modules to register them (no import
cycle); the package re-exports the public names for callers outside it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal

from loraflow.rules.combination import Combination

Status = Literal["ok", "error", "wrong", "refused", "n/a", "unavailable", "timeout", "failed"]
"""`failed`: the probe process died before reporting (a probe bug or a broken install), which says nothing
about the rule. `unavailable`: what the reproduction runs against is not installed here and the detail names the
command that builds it (vLLM's environment); `n/a`: the reproduction does not apply to this machine."""


@dataclass
class Observation:
    status: Status
    detail: str = ""
    values: dict[str, float] = field(default_factory=dict)
    """What the reproduction measured, by name (the largest engine/trainer log-prob difference and its bound), for
    tests and --json to compare with numbers rather than read the detail."""

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
    naive: Combination
    """The settings that trigger the rule (versions are filled in from the installed stack)."""
    execute: Callable[[Combination, Context], Observation]
    ranks: int = 1
    requires: tuple[str, ...] = ()
    """Python packages the reproduction needs; missing ones make it not applicable."""
    needs_cuda: str | None = None
    """Why this case only reproduces on a GPU (None: runs on CPU)."""
    timeout: float = 150.0
    what: str = ""
    """One line: what the reproduction runs."""
    servers: tuple[str, ...] = ()
    """Servers the reproduction runs against (probes/vllm_servers.py): the runner starts each once per `loraflow
    probe` for all the cases that name it, and runs those cases one at a time."""


_CASES: dict[str, Case] = {}


def case(rule: str, naive: Combination, **kwargs) -> Callable:
    """Decorator: register `execute` as the live reproduction of `rule`."""
    def register(execute: Callable[[Combination, Context], Observation]):
        if rule in _CASES:
            raise ValueError(f"probe for {rule} registered twice")
        _CASES[rule] = Case(rule=rule, naive=naive, execute=execute, what=" ".join((execute.__doc__ or "").split()),
                            **kwargs)
        return execute
    return register
