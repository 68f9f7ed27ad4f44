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
    if knob == "world_size":  # no rule is fixed by more processes: only fewer can help
        return value > 1
    if not isinstance(value, bool):
        return True
    return not rule.when(setup.replace(**{knob: not value}))


def fix_here(result: FrontendResult, rule, forked: set[str] = frozenset()) -> list[str]:
    """The rule's knobs in this framework's flags: `change --zero_stage (zero_stage is now 3)`. Knobs the framework
    has no flag for are not fixes here (see unflagged)."""
    out = []
    for knob in (k for k in rule.knobs if k in result.unsure or k in forked or _could_help(rule, result.setup, k)):
        flag = result.flags.get(knob)
        if flag and (knob in result.unsure or knob in forked):  # the value is the open question: nothing to quote
            out.append(f"change {flag} ({knob}: depends on what is not visible here)")
        elif flag:
            out.append(f"change {flag} ({knob} is now {_value(getattr(result.setup, knob))})")
    return out


def unflagged(result: FrontendResult, rule) -> list[str]:
    """The knobs of a rule that this framework sets in its own code, with no flag: `reentrant (now True)`."""
    return [f"{knob} (now {_value(getattr(result.setup, knob))})" for knob in rule.knobs
            if _could_help(rule, result.setup, knob) and not result.flags.get(knob)]


def _exit_code(result: FrontendResult, findings: list[Checked]) -> int:
    """2: the launch fails or trains wrongly as given (the framework refuses it at start-up, or a crash/silent finding
    holds whatever is unknown); 1: it depends on something check could not see (a version,
    a choice in the user's code, the data, or a flag it could not read), named in the report; 0: nothing found
    that fails or trains wrongly (a slow-only finding is advice, not a verdict)."""
    serious = [f for f in findings if f.rule.impact in _SERIOUS]
    if result.stops or any(f.holds_if is None for f in serious):
        return 2
    return 1 if serious or result.unknown else 0


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
              "cause": f.rule.cause, "fix_here": fix_here(result, f.rule, verdict.forked) + (
                  [f"in general: {f.rule.elsewhere}"] if f.rule.elsewhere else []),
              "no_flag_for": unflagged(result, f.rule),
              "fix_loraflow": f.rule.fix, "notes": _condition_note(f, verdict) + f.notes,
              "references": list(f.rule.references)} for f in verdict.findings]
    unknowns = [{"name": v.name, "kind": v.kind, "ranges": [v.describe(x) for x in v.considered()], "why": v.why}
                for v in verdict.variables]
    if as_json:
        doc = {"framework": result.framework,
               "setup": {k: _value(getattr(result.setup, k)) for k in COMBINATION_FIELDS},
               "versions": {k: str(v) for k, v in result.setup.versions.items() if v is not None},
               "sources": result.sources, "flags": result.flags, "stops": result.stops, "unknown": result.unknown,
               "notes": result.notes,
               "inferred_eras": {k: {"range": spec, "why": why} for k, (spec, why) in result.eras.items()},
               "unknowns": unknowns, "scenarios": verdict.scenarios, "findings": items, "exit_code": code,
               # Fields a file that is not here decides (Draft.fork): `setup` shows the first value evaluated.
               "setup_depends_on_unseen": sorted(verdict.forked),
               "depends_on": _questions([i for i in items if i["holds_if"] is not None], unknowns)}
        return json.dumps(doc, indent=2), code
    return _text(result, items, unknowns, code, verdict.forked), code


def _text(result: FrontendResult, items: list[dict], unknowns: list[dict], code: int,
          forked: set[str] = frozenset()) -> str:
    s = result.setup
    world = result.sources.get("world_size", "not visible, assumed")
    title = {f.name: f.title for f in frameworks()}.get(result.framework, result.framework)
    size = f"world size {s.world_size} ({world})"
    if "world_size" in result.unsure:
        size = f"world size not visible ({result.unsure['world_size'][1]}): one process and several evaluated"
    lines = [f"{title} setup, {size}", ""]
    # A server (stage serve) trains nothing: the training fields it leaves at loraflow's defaults say nothing of it.
    core = ("stage", "adapter", "world_size") if result.setup.stage == "serve" else _CORE
    shown = [k for k in COMBINATION_FIELDS if k in core or k in result.sources]
    width = max(len(k) for k in shown)
    vwidth = max(len(str(_value(getattr(s, k)))) for k in shown)
    lines.append("setup (value, where it came from):")
    for name in shown:
        source = result.sources.get(name, "not set by this framework: loraflow's neutral default")
        value = str(_value(getattr(s, name)))
        if name in forked:  # decided by a file that is not here: every value it may take is evaluated
            value, source = "?", next(why for _, why in result.forks.values()) + ": each value evaluated"
        lines.append(f"  {name:<{width}}  {value:<{vwidth}}  {source}")
    if result.stops:
        lines += ["", f"stops at start-up: the framework refuses this launch before its first step "
                      f"({len(result.stops)}):"]
        lines += [f"  {s}" for s in result.stops]
    if result.unknown:
        lines += ["", f"not understood, so not checked ({len(result.unknown)}):"]
        lines += [f"  {u}" for u in result.unknown]
    if result.notes:
        lines += ["", "notes:"] + [f"  - {n}" for n in result.notes]
    lines.append("")
    decided = [i for i in items if i["holds_if"] is None]
    open_ = [i for i in items if i["holds_if"] is not None]
    if not decided:
        lines.append("no known conflict holds whatever is unknown." if open_ else
                     "no known conflict between these memory savers and the adapter setup" +
                     (" (the launch stops at start-up first: see above)." if result.stops else "."))
        lines.append("")
    for item in decided:
        lines += _finding_lines(item, title)
    if open_:
        lines += _depends_on(open_, unknowns, title)
    meaning = {2: "this launch fails or trains wrongly as given" + (" (it stops at start-up)" if result.stops and
                                                                    not decided else ""),
               1: "it depends on what check could not see (" + ("the question above" if open_ else
                                                                  "what it could not read, listed above") + ")",
               0: "nothing found that fails or trains wrongly" + (" (advice only above)" if decided else "")}[code]
    lines.append(f"exit code {code}: {meaning}")
    return "\n".join(lines).rstrip() + "\n"


def _finding_lines(item: dict, title: str) -> list[str]:
    lines = [f"[{item['impact']}] {item['rule']}: {item['title']}", f"    cause: {item['cause']}"]
    lines += [f"    note: {note}" for note in item["notes"]]
    lines += _fix_lines(item, title, "    ")
    return lines + [f"    in loraflow: {item['fix_loraflow']}", ""]


def _fix_lines(item: dict, title: str, indent: str) -> list[str]:
    lines = [f"{indent}{fix}" if fix.startswith("in general:") else f"{indent}fix here: {fix}"
             for fix in item["fix_here"]]
    if item["no_flag_for"]:  # not a fix: what the framework's own code decides, which only a code change moves
        lines.append(f"{indent}no {title} flag sets {', '.join(item['no_flag_for'])}: its training code decides")
    return lines


def _depends_on(items: list[dict], unknowns: list[dict], title: str) -> list[str]:
    """The findings that hold only in some cases, under the one question that decides most of them (then any
    other), instead of a list of conditional [crash] findings."""
    first, *others = _questions(items, unknowns)
    lines = ["depends on: " + first] + [f"  also: {q}" for q in others]
    lines.append("")
    for item in items:
        lines.append(f"  if {item['holds_if']}: [{item['impact']}] {item['rule']}: {item['title']}")
        lines.append(f"      cause: {item['cause']}")
        lines += _fix_lines(item, title, "      ")
    return lines + [""]


def _questions(items: list[dict], unknowns: list[dict]) -> list[str]:
    """One question per unknown that decides a finding, the one deciding most crash/silent findings first."""
    by_name = {u["name"]: u for u in unknowns}
    askers: dict[str, list[dict]] = {}
    for item in items:
        for name in item["decided_by"] or ["?"]:
            askers.setdefault(name, []).append(item)
    order = sorted(askers, key=lambda n: (-sum(i["impact"] in _SERIOUS for i in askers[n]), n))
    return [_question(name, by_name.get(name)) for name in order]


def _question(name: str, unknown: dict | None) -> str:
    if unknown is None:
        return f"{name} (not shown by the launch)"
    if unknown["kind"] == "version":
        return (f"which {name} release the run uses (the findings below say for which): pass --versions "
                f"{name}=X.Y.Z, --versions-from FILE (pip freeze, an env dump) or --as-of DATE")
    return f"which holds: {'; or '.join(unknown['ranges'])}? ({unknown['why']})"
