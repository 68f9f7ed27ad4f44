"""`loraflow explain LOGFILE`: map a failed run's output back to the registry's rules.

logread turns the text into lines, traceback frames, error lines, printed versions and a shape (whole, truncated,
one line, warnings only, metadata only); facts reads what the log says about the run (rules/signs.py names the
facts, and the metadata dump is read pair by pair); diagnose ranks each rule by its messages, raise-path frames
and facts, with a confidence level; render prints the result. Unrelated failures get no claim.
"""

from __future__ import annotations

from packaging.version import Version

from loraflow.explain.diagnose import LEVELS, Candidate, diagnose
from loraflow.explain.logread import LogView, log_versions, read_log, view
from loraflow.explain.render import as_dict, fix_for, list_signatures, render

__all__ = ["LEVELS", "Candidate", "LogView", "as_dict", "detect_framework", "diagnose_log", "explain_text", "fix_for",
           "list_signatures", "log_versions", "read_log", "render", "view"]


def detect_framework(text: str) -> str | None:
    """The framework whose code the log's traceback runs through (each frontend declares its log pattern)."""
    from loraflow.frontends import framework_of_log

    return framework_of_log(text)


def diagnose_log(text: str) -> tuple[LogView, list[Candidate], str | None]:
    """The log as read, its ranked candidate causes (best first), and the framework it came from."""
    log = view(text)
    return log, diagnose(log), detect_framework(log.text)


def explain_text(text: str) -> tuple[list[Candidate], str | None, dict[str, Version]]:
    log, candidates, framework = diagnose_log(text)
    return candidates, framework, log.versions
