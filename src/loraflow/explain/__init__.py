"""`loraflow explain LOGFILE`: map a failed run's output back to the registry's rules.

logread turns the text into lines, traceback frames, error lines, printed versions and a shape (whole, truncated,
one line, warnings only, metadata only); facts reads what the log says about the run (rules/signs.py names the
facts, and the metadata dump is read pair by pair); diagnose ranks each rule by its messages, raise-path frames
and facts, with a confidence level; render prints the result. Unrelated failures get no claim.
"""

from __future__ import annotations

from packaging.version import Version

from loraflow.explain.diagnose import LEVELS, Candidate, diagnose, with_own_findings
from loraflow.explain.logread import LogView, log_versions, read_log, view
from loraflow.explain.own import is_loraflow_log, masked_text, read_own
from loraflow.explain.render import as_dict, fix_for, list_signatures, render

__all__ = ["LEVELS", "Candidate", "LogView", "as_dict", "detect_framework", "diagnose_log", "explain_text", "explained",
           "fix_for", "is_loraflow_log", "list_signatures", "log_versions", "read_log", "render", "view"]


def detect_framework(text: str) -> str | None:
    """`loraflow` for a log a loraflow run wrote (first: it quotes other frameworks), else the framework whose code
    the log's traceback runs through (each frontend declares its log pattern)."""
    from loraflow.frontends import framework_of_log

    return "loraflow" if is_loraflow_log(text) else framework_of_log(text)


def diagnose_log(text: str, launch: tuple | None = None) -> tuple[LogView, list[Candidate], str | None]:
    """The log as read, its ranked candidate causes (best first), and the framework it came from. In a loraflow
    log, the rules' messages are matched with loraflow's own plan and findings blanked (they quote other failures),
    and the rules loraflow itself named (a plan refusal, a guard) join the candidates. `launch`: (build, label), the
    run's launch given beside the log (logread.LogView.launch)."""
    log = view(text)
    log.launch = launch
    framework = detect_framework(log.text)
    if framework != "loraflow":
        return log, diagnose(log), framework
    own = read_own(log.lines)
    masked = view(masked_text(log.lines, own))
    # The versions printed in the plan's header still describe the run.
    masked.versions, masked.inferred, masked.own, masked.launch = log.versions, log.inferred, own, launch
    return masked, with_own_findings(diagnose(masked), own), framework


def explained(log: LogView, candidates: list[Candidate]) -> bool:
    """Whether explain has an answer: a ranked cause, or the error loraflow itself ended its run with (its message
    says what to change). `loraflow explain` exits 0 then, 1 when nothing matched."""
    return bool(candidates) or (log.own is not None and log.own.fatal is not None and log.own.fatal.own)


def explain_text(text: str) -> tuple[list[Candidate], str | None, dict[str, Version]]:
    log, candidates, framework = diagnose_log(text)
    return candidates, framework, log.versions
