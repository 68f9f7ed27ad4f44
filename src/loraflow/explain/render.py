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
           "warning-only": "warnings only, no crash", "no-error": "no error line", "full": "a complete log"}


def fix_for(rule: Rule, framework: str | None) -> str:
    """The fix worded for the framework the log came from: its flags for the rule's knobs, where known."""
    if framework:
        from loraflow.frontends import flags_for

        flags = flags_for(framework)
        named = [flags[k] for k in rule.knobs if k in flags]
        if named:
            return f"in {framework}: change {', '.join(named)} ({rule.elsewhere})"
    return rule.elsewhere or rule.fix


def candidate_dict(c: Candidate, framework: str | None) -> dict:
    r = c.rule
    return {"rule": r.id, "confidence": c.confidence, "score": c.score, "title": r.title, "impact": r.impact,
            "evidence_lines": [{"line": n, "text": t} for n, t in c.lines], "evidence": c.reasons,
            "what_happened": [f"line {n}: {t}" for n, t in c.lines], "cause": r.cause,
            "conditions": r.conditions, "tells_apart": r.log.tells_apart, "fix": fix_for(r, framework),
            "fix_loraflow": r.fix, "fixed_in": r.fixed_in, "affected": dict(r.affected),
            "references": list(r.references)}


def as_dict(candidates: list[Candidate], framework: str | None, versions: dict[str, Version], log: LogView,
            source: str) -> dict:
    final = log.final_error
    return {"source": source, "framework": framework, "versions": {k: str(v) for k, v in versions.items()},
            "log_shape": log.shape, "final_error": final[1] if final else None,
            "claimed": bool(candidates), "candidates": [candidate_dict(c, framework) for c in candidates],
            "confidence_levels": MEANING}


def render(candidates: list[Candidate], framework: str | None, versions: dict[str, Version], log: LogView,
           source: str) -> str:
    shown = ", ".join(f"{k} {v}" + (" (from its line numbers)" if k in log.inferred else "")
                      for k, v in versions.items()) or "none shown"
    head = [f"explain {source}: framework {framework or 'not recognised'}; versions in the log: {shown}",
            f"log: {_SHAPES.get(log.shape, log.shape)} ({len(log.lines)} lines)"]
    if not candidates:
        final = log.final_error
        tail = f"\nThe last error line is: {final[1]}" if final else ""
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
        out += [f"   fix: {fix_for(r, framework)}", f"   in loraflow: {r.fix}",
                f"   fixed upstream: {r.fixed_in or 'no'}", f"   references: {', '.join(r.references)}",
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
