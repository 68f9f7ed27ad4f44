"""The `loraflow check` report for another framework's setup: what was read (each value with its source), what was
not understood, and each rule that holds with its cause and the fix in that framework's own flags."""

from __future__ import annotations

import json
from typing import Any

from loraflow.frontends.base import FrontendResult, frameworks
from loraflow.frontends.verdict import Checked, Verdict
from loraflow.rules.combination import COMBINATION_FIELDS

# Always shown, even when no flag or default set them: they decide most rules.
_CORE = ("stage", "adapter", "engine", "zero_stage", "world_size", "checkpointing", "reentrant", "input_grad_hook",
         "precision")
_SERIOUS = ("crash", "silent")


def _value(value: Any) -> Any:
    return value if isinstance(value, (bool, int, float, str)) or value is None else str(value)


def _could_help(rule, setup, knob: str) -> bool:
    """False for a yes/no knob whose other value leaves the rule's condition standing (e.g. the input-grad hook
    for zero3-frozen-recompute): naming it would send the user to a flag that cannot help."""
    value = getattr(setup, knob)
    if not isinstance(value, bool):
        return True
    return not rule.when(setup.replace(**{knob: not value}))


def fix_here(result: FrontendResult, rule) -> list[str]:
    """The rule's knobs in this framework's flags: `change --zero_stage (zero_stage is now 3)`."""
    out = []
    for knob in (k for k in rule.knobs if _could_help(rule, result.setup, k)):
        now = _value(getattr(result.setup, knob))
        flag = result.flags.get(knob)
        if flag:
            out.append(f"change {flag} ({knob} is now {now})")
        else:
            title = {f.name: f.title for f in frameworks()}.get(result.framework, result.framework)
            out.append(f"{knob} is {now}; {title} has no flag for it (its "
                       "training code decides)")
    return out


def _exit_code(result: FrontendResult, findings: list[Checked]) -> int:
    if any(f.rule.impact in _SERIOUS and f.holds_if is None for f in findings):
        return 2
    return 1 if findings or result.unknown else 0


def _condition_note(f: Checked, verdict: Verdict) -> list[str]:
    if f.holds_if is None:
        return []
    deciding = [v for v in verdict.variables if v.name in f.decided_by]
    asks = [f"{v.name}=X.Y.Z" for v in deciding if v.kind == "version"]
    shows = [f"{v.name} ({v.why})" for v in deciding if v.kind == "choice"]
    tail = "; ".join(filter(None, [f"pass --versions {','.join(asks)} to decide" if asks else "",
                                   f"not shown by the command: {', '.join(shows)}" if shows else ""]))
    return [f"holds only if {f.holds_if}" + (f" ({tail})" if tail else "")]


def render(verdict: Verdict, as_json: bool) -> tuple[str, int]:
    result = verdict.result
    code = _exit_code(result, verdict.findings)
    items = [{"rule": f.rule.id, "title": f.rule.title, "impact": f.rule.impact, "verdict": f.rule.verdict,
              "holds_if": f.holds_if, "decided_by": list(f.decided_by), "affected": dict(f.rule.affected),
              "fixed_in": f.rule.fixed_in,
              "cause": f.rule.cause, "fix_here": fix_here(result, f.rule) + (
                  [f"in general: {f.rule.elsewhere}"] if f.rule.elsewhere else []),
              "fix_loraflow": f.rule.fix, "notes": _condition_note(f, verdict) + f.notes,
              "references": list(f.rule.references)} for f in verdict.findings]
    unknowns = [{"name": v.name, "kind": v.kind, "ranges": [v.describe(x) for x in v.considered()], "why": v.why}
                for v in verdict.variables]
    if as_json:
        doc = {"framework": result.framework,
               "setup": {k: _value(getattr(result.setup, k)) for k in COMBINATION_FIELDS},
               "versions": {k: str(v) for k, v in result.setup.versions.items() if v is not None},
               "sources": result.sources, "flags": result.flags, "unknown": result.unknown, "notes": result.notes,
               "inferred_eras": {k: {"range": spec, "why": why} for k, (spec, why) in result.eras.items()},
               "unknowns": unknowns, "scenarios": verdict.scenarios, "findings": items, "exit_code": code}
        return json.dumps(doc, indent=2), code
    return _text(result, items, unknowns, code), code


def _text(result: FrontendResult, items: list[dict], unknowns: list[dict], code: int) -> str:
    s = result.setup
    world = result.sources.get("world_size", "not visible, assumed")
    title = {f.name: f.title for f in frameworks()}.get(result.framework, result.framework)
    lines = [f"{title} setup, world size {s.world_size} ({world})", ""]
    shown = [k for k in COMBINATION_FIELDS if k in _CORE or k in result.sources]
    width = max(len(k) for k in shown)
    vwidth = max(len(str(_value(getattr(s, k)))) for k in shown)
    lines.append("setup (value, where it came from):")
    for name in shown:
        source = result.sources.get(name, "not set by this framework: loraflow's neutral default")
        lines.append(f"  {name:<{width}}  {str(_value(getattr(s, name))):<{vwidth}}  {source}")
    if result.unknown:
        lines += ["", f"not understood, so not checked ({len(result.unknown)}):"]
        lines += [f"  {u}" for u in result.unknown]
    if result.notes:
        lines += ["", "notes:"] + [f"  - {n}" for n in result.notes]
    versions = [u for u in unknowns if u["kind"] == "version"]
    if versions:
        lines += ["", "versions not given that decide a finding (the setup above reads each at its newest release):"]
        lines += [f"  {u['name']}: {', '.join(u['ranges'])}" for u in versions]
    choices = [u for u in unknowns if u["kind"] == "choice"]
    if choices:
        lines += ["", "choices the command does not show that decide a finding:"]
        lines += [f"  {u['name']}: {' / '.join(u['ranges'])} ({u['why']})" for u in choices]
    lines.append("")
    if not items:
        lines.append("no known conflict between these memory savers and the adapter setup.")
    for item in items:
        lines.append(f"[{item['impact']}] {item['rule']}: {item['title']}")
        lines.append(f"    cause: {item['cause']}")
        for note in item["notes"]:
            lines.append(f"    note: {note}")
        for fix in item["fix_here"]:
            lines.append(f"    {fix}" if fix.startswith("in general:") else f"    fix here: {fix}")
        lines.append(f"    in loraflow: {item['fix_loraflow']}")
        lines.append("")
    meaning = {2: "a finding crashes or silently corrupts training whatever the unknown versions",
               1: "findings that hold only for some versions or choices, slow findings, or unread flags",
               0: "clean"}[code]
    lines.append(f"exit code {code}: {meaning}")
    return "\n".join(lines).rstrip() + "\n"
