"""What `loraflow explain` prints: the ranked causes with their confidence and evidence, as text or JSON."""

from __future__ import annotations

from packaging.version import Version

from loraflow.explain.diagnose import Candidate
from loraflow.explain.logread import LogView
from loraflow.rules import Rule, all_rules

MEANING = {"confirmed": "the log shows this failure's own message, or a fact only it produces",
           "likely": "the log's message or raise path fits, and its facts point here",
           "possible": "the log's message has a few known causes and nothing in it tells them apart"}
_SHAPES = {"truncated": "the log stops inside a traceback, before its error line",
           "one-liner": "a one-line paste", "metadata-only": "only the checkpoint's metadata dump, no error header",
           "warning-only": "warnings only, no crash", "no-error": "no error line", "full": "a complete log",
           "loraflow-error": "a loraflow run that loraflow stopped with its own error"}


def fix_for(rule: Rule, framework: str | None, log: LogView | None = None) -> str:
    """The fix worded for the framework the log came from: its flags for the rule's knobs, where known; for a
    loraflow run, its config keys, and whether loraflow's plan should have prevented the failure (own.py)."""
    if framework == "loraflow":
        from loraflow.explain.own import loraflow_fix

        return loraflow_fix(rule, log.own if log is not None else None)
    if framework:
        from loraflow.frontends import flags_for

        flags = flags_for(framework)
        named = [flags[k] for k in rule.knobs if k in flags]
        if named:
            return f"in {framework}: change {', '.join(named)} ({rule.elsewhere})"
    return rule.elsewhere or rule.fix


def candidate_dict(c: Candidate, framework: str | None, log: LogView | None = None) -> dict:
    r = c.rule
    return {"rule": r.id, "confidence": c.confidence, "score": c.score, "title": r.title, "impact": r.impact,
            "evidence_lines": [{"line": n, "text": t} for n, t in c.lines], "evidence": c.reasons,
            "what_happened": [f"line {n}: {t}" for n, t in c.lines], "cause": r.cause,
            "conditions": r.conditions, "tells_apart": r.log.tells_apart, "fix": fix_for(r, framework, log),
            "fix_loraflow": r.fix, "fixed_in": r.fixed_in, "affected": dict(r.affected),
            "references": list(r.references)}


def as_dict(candidates: list[Candidate], framework: str | None, versions: dict[str, Version], log: LogView,
            source: str) -> dict:
    final = log.final_error
    fatal = _own_fatal(log)
    return {"source": source, "framework": framework, "versions": {k: str(v) for k, v in versions.items()},
            "log_shape": log.shape, "final_error": final[1] if final else None,
            "loraflow_error": {"line": fatal.line_no, "type": fatal.kind, "what_broke": fatal.headline,
                               "fix": fatal.message} if fatal else None,
            "claimed": bool(candidates), "candidates": [candidate_dict(c, framework, log) for c in candidates],
            "confidence_levels": MEANING}


def _own_fatal(log: LogView):
    """The error loraflow itself raised to end the run (a data, config, checkpoint or plan error, a guard), whose
    message already says what to change; None for a crash inside a library, or another framework's log."""
    fatal = log.own.fatal if log.own is not None else None
    return fatal if fatal is not None and fatal.own else None


def _fatal_lines(log: LogView) -> list[str]:
    fatal = _own_fatal(log)
    if fatal is None:
        return []
    head = f"\nwhat broke (line {fatal.line_no}): {fatal.headline}"
    if log.own.refused or log.own.guarded:  # loraflow named the rules: ranked below, each with its cause and fix
        return [head, "   fix: as each rule below says (loraflow named them itself)"]
    return [head, "   fix (loraflow's own message): " + fatal.message.replace("\n", "\n   ")]


def render(candidates: list[Candidate], framework: str | None, versions: dict[str, Version], log: LogView,
           source: str) -> str:
    shown = ", ".join(f"{k} {v}" + (" (from its line numbers)" if k in log.inferred else "")
                      for k, v in versions.items()) or "none shown"
    head = [f"explain {source}: framework {framework or 'not recognised'}; versions in the log: {shown}",
            f"log: {_SHAPES.get(log.shape, log.shape)} ({len(log.lines)} lines)"]
    head += _fatal_lines(log)
    if not candidates:
        if _own_fatal(log):
            return "\n".join(head) + "\nNo rule of the registry is involved: loraflow stopped the run with its own " \
                                      "error."
        final = log.final_error
        tail = f"\nThe last error line is: {final[1]}" if final else ""
        if framework == "loraflow" and final:
            tail += ("\nIf the traceback runs through loraflow's own code, that is a bug in loraflow: report it with "
                     "plan.json from the run directory.")
        return "\n".join(head) + (f"\nNo known failure signature in this log, so no cause is claimed.{tail}\n"
                                  "`loraflow explain --list` shows the signatures loraflow knows.")
    out = head
    if all(c.confidence == "possible" for c in candidates):
        out.append(f"\nThe log does not say enough to tell these {len(candidates)} known causes of its message apart; "
                   "they are ranked by how common they are. Check first what each `tells apart` line names.")
    for rank, c in enumerate(candidates, 1):
        r = c.rule
        out += [f"\n{rank}. [{c.confidence}] {r.id}: {r.title}",
                *[f"   what happened (line {n}): {t}" for n, t in c.lines[:3]],
                f"   cause: {r.cause}", f"   when: {r.conditions}"]
        if r.log.tells_apart and c.confidence != "confirmed":
            out.append(f"   tells it apart: {r.log.tells_apart}")
        out.append(f"   fix: {fix_for(r, framework, log)}")
        if framework != "loraflow":  # there the fix above is already loraflow's
            out.append(f"   in loraflow: {r.fix}")
        out += [f"   fixed upstream: {r.fixed_in or 'no'}", f"   references: {', '.join(r.references)}",
                "   evidence: " + "; ".join(c.reasons)]
    out.append("\nconfidence: " + "; ".join(f"{k}: {v}" for k, v in MEANING.items()))
    return "\n".join(out)


def list_signatures() -> str:
    out = []
    for r in all_rules():
        if not r.log.messages and not r.log.frames:
            out.append(f"{r.id}:\n    (no log signature: a silent failure; `loraflow check` or `probe` finds it)")
            continue
        lines = [f"    [{m.kind}] {m.pattern}" + (f"  ({m.releases})" if m.releases else "") for m in r.log.messages]
        lines += [f"    [frame, {m.kind}] {m.pattern}" for m in r.log.frames]
        out.append(f"{r.id}:\n" + "\n".join(lines))
    return "\n".join(out)
