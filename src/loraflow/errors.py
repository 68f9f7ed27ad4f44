"""Exceptions that reach the user. The CLI prints them without a traceback; each message says what is wrong, why,
and which key or flag fixes it."""

from __future__ import annotations


class LoraflowError(Exception):
    """Base class: an error whose message is meant for the person running loraflow."""


class ConfigError(LoraflowError):
    """One or more problems in the configuration, collected and raised together."""

    def __init__(self, problems: list[str], source: str | None = None):
        self.problems = list(problems)
        self.source = source
        where = f" in {source}" if source else ""
        lines = [f"{len(self.problems)} configuration problem(s){where}:"]
        lines += [f"  - {p}" for p in self.problems]
        super().__init__("\n".join(lines))


class DataError(LoraflowError):
    """A malformed training or eval record; the message names the file, line (or record) and field."""


class PlanError(LoraflowError):
    """The plan holds error findings: the setup cannot work. The message lists each rule with cause and fix."""

    def __init__(self, message: str, findings: list | None = None):
        super().__init__(message)
        self.findings = list(findings or [])
        """The error findings (rules.Finding), for callers that record which rules refused."""


class GuardError(LoraflowError):
    """A runtime guard tripped (no gradient, non-finite gradient, frozen weight changed, eval mode)."""


class CheckpointError(LoraflowError):
    """A checkpoint to resume from is missing or incomplete."""


class OutputError(LoraflowError):
    """The run directory cannot be written (permissions, a read-only file system, no space left)."""


class DiskFullError(OutputError):
    """Not enough space for a checkpoint or the final weights; nothing half-written was left behind."""


class NonFiniteError(LoraflowError):
    """Weights about to be saved hold NaN or Inf; nothing was written."""


class DivergenceError(LoraflowError):
    """The loss or the gradients became non-finite; nothing from that step was applied or saved (loop/divergence.py)."""


class Stopped(LoraflowError):
    """The run stopped on a signal after writing a checkpoint (loop/preemption.py); the process exits with 128 + the
    signal number, the convention shells and schedulers read as "ended by that signal"."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum
