"""Rank the registry's rules as causes of one log, each with a confidence level and the evidence behind it.

Confidence levels:
- confirmed: the rule's own message is in the log, or a message it shares with other failures together with a fact
  that only this failure produces (a recomputed shape [0]; 4-bit storage in a flatten error).
- likely: a shared or generic message with facts that point here; a log that stops inside the rule's raise path
  before its error line (truncated); a warning that means the run silently learns nothing, with no crash after it.
- possible: a message that a small known set of failures print, with nothing in the log to tell them apart (a
  famous one-line paste); ranked by how common each cause is, with what to check first.
A log whose messages no rule knows, or whose facts rule every candidate out, gets no claim; a fact that names another
mechanism behind a rule's raise site (`Evidence.excludes`) rules it out even on its own message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

from loraflow.explain.facts import Facts, read_facts
from loraflow.explain.logread import LogView
from loraflow.explain.prefix import strip_prefix
from loraflow.rules import Rule, all_rules
from loraflow.rules.registry import affected_by
from loraflow.rules.signs import Message

LEVELS = ("confirmed", "likely", "possible")
LIKELY_AT = 3.0  # evidence weight that turns a shared or generic message into a likely cause
VERSION_AFFECTED, VERSION_FIXED = 2.0, -6.0


@dataclass
class Candidate:
    rule: Rule
    confidence: str
    score: float
    lines: list[tuple[int, str]] = field(default_factory=list)
    """(line number, text) of the messages and frames that name this failure."""
    reasons: list[str] = field(default_factory=list)
    message_keys: frozenset[str] = frozenset()
    """The shared messages it was found by (to let a confirmed sibling displace it)."""

    @property
    def rank_key(self) -> tuple[int, float]:
        return (LEVELS.index(self.confidence), -self.score)


@lru_cache(maxsize=None)
def _rx(pattern: str) -> re.Pattern:
    return re.compile(pattern, re.IGNORECASE)


def _hits(messages: tuple[Message, ...], lines: list[str]) -> dict[str, list[tuple[Message, int, str]]]:
    """Per message kind, the last line each message matches (in a traceback the error line comes last)."""
    out: dict[str, list[tuple[Message, int, str]]] = {}
    for m in messages:
        rx = _rx(m.pattern)
        last = next(((i, line) for i, line in zip(range(len(lines), 0, -1), reversed(lines)) if rx.search(line)),
                    None)
        if last is None:
            last = _wrapped(rx, lines) or _cut(m.pattern, lines)
        if last:
            out.setdefault(m.kind, []).append((m, last[0], last[1].strip()[:240]))
    return out


_QUOTE = re.compile(r"^\s*(?:>\s?)+")
# What a launcher prints after its child's failure (torchrun's ChildFailedError summary, accelerate's
# CalledProcessError traceback, the deepspeed runner's sigkill_handler lines): no part of the run's own log.
_LAUNCHER_TAIL = re.compile(
    r"^\s+(?:File \"|sys\.exit|run\(args\)|args\.func|simple_launcher|multi_gpu_launcher|raise |return |elastic_launch|"
    r"(?:time|host|rank|exitcode|error_file|traceback)\s*:)|^\s*```|Traceback \(most recent call last\)|"
    r"torch\.distributed\.elastic|ChildFailedError|CalledProcessError|sigkill_handler|exits with return code|"
    r"^Killing subprocess \d+|"
    r"^\S+ FAILED$|^[=-]{10,}$|^Failures:|^Root Cause|^\[\d+\]:$|<NO_OTHER_FAILURES>")


def _wrapped(rx: re.Pattern, lines: list[str]) -> tuple[int, str] | None:
    """The last place a message matches across two lines: pastes from a terminal, an e-mail or an issue often wrap a
    long error line (`...for the following tensors` / `have different metadata...`). Only a break inside the
    sentence counts: the second line starts in lower case, not as a new error, frame or log record."""
    for i in range(len(lines) - 1, 0, -1):
        # A markdown quote marks every line of the paste (`> `), the continued half of a wrapped line too.
        first, second = _QUOTE.sub("", lines[i - 1]).rstrip(), _QUOTE.sub("", lines[i]).strip()
        if first and second[:1].islower() and not second.startswith(("at ", "in ")) and rx.search(f"{first} {second}"):
            return i, f"{first.strip()} {second}"
    return None


_META = set(".^$*+?{}[]|()")
_CUT_ERROR = re.compile(r"^(?:\[rank\d+\]:\s*)?(?:[\w.]+(?:Error|Exception)|AssertionError):\s*(?P<text>.{20,})$")


def literal_prefix(pattern: str) -> str:
    """The text every match of `pattern` starts with: its characters up to the first regular-expression operator
    (escaped punctuation counts as itself; a character a quantifier makes optional does not count)."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            if i + 1 >= len(pattern) or pattern[i + 1].isalnum():
                break  # \d, \s, \b...: a class, not a character
            c, i = pattern[i + 1], i + 1
        elif c in _META:
            if c in "*?{" and out:
                out.pop()
            break
        out.append(c)
        i += 1
    return "".join(out)


def _cut(pattern: str, lines: list[str]) -> tuple[int, str] | None:
    """A paste whose final error line is cut short (`RuntimeError: Expected to have finished reductio`): the line's
    text is the start of the message. Only the last error line (a launcher's summary after it, torchrun's
    ChildFailedError, is no error line of its own), and only a cut of 20 characters or more of a message whose fixed
    start is longer."""
    bare = [(i, _QUOTE.sub("", strip_prefix(line))) for i, line in enumerate(lines, 1)]
    last = next(((i, line) for i, line in reversed(bare) if line.strip() and not _LAUNCHER_TAIL.search(line)), None)
    if last is None or not _CUT_ERROR.match(last[1].strip()):
        return None
    n, line = last
    found = _CUT_ERROR.match(line.strip())
    prefix = literal_prefix(pattern).lower()
    if found is None or len(prefix) < 24:
        return None
    text = found.group("text").strip().lower()
    return (n, line) if len(text) < len(prefix) and prefix.startswith(text) else None


def _frame_hits(rule: Rule, log: LogView) -> tuple[list[tuple[Message, int, str]], bool]:
    """Raise-path frames of this rule, and whether one lies in the log's unfinished last traceback."""
    if not rule.log.frames or not log.frames:
        return [], False
    last_error = log.errors[-1][0] if log.errors else 0
    hits = []
    tail = False
    for m in rule.log.frames:
        rx = _rx(m.pattern)
        found = [f for f in log.frames if any(rx.search(w) for w in f.wheres)]
        if found:
            f = found[-1]
            hits.append((m, f.line_no, f"in {f.function} ({f.path})"))
            # A frame that raises the failure itself is where a log cut at that raise ends; one followed by deeper
            # calls was passed on the way to another raise.
            passed = m.stops and f is not log.frames[-1]
            tail = tail or (log.truncated and f.line_no > last_error and not passed)
    return hits, tail


def _evidence(rule: Rule, facts: Facts, log: LogView) -> tuple[float, float, bool, bool, list[str]]:
    """(weight, weight of the facts alone, decisive, names the failure alone, reasons) of the rule's facts found in
    the log; printed versions add to the first only (they rank candidates, never establish one)."""
    score, decisive, alone, reasons = 0.0, False, False, []
    for ev in rule.log.evidence:
        if ev.fact in facts:
            score += ev.weight
            decisive = decisive or (ev.decisive and ev.weight > 0)
            alone = alone or (ev.alone and ev.weight > 0)
            shown = facts.lines.get(ev.fact)
            where = f" (line {shown[0]})" if shown else ""
            reasons.append(f"{'+' if ev.weight > 0 else '-'} {ev.reason}{where}")
    # The run's own launch line, when the log echoes it, read as `check` reads it (explain/facts.py).
    for prefix, gain, sure in (("setup:", 4.0, True), ("setup?:", 2.0, False)):
        if prefix + rule.id in facts:
            n, label = facts.lines[prefix + rule.id]
            score += gain
            alone = alone or sure
            where = f"the launch line in the log (line {n})" if n else f"the launch given ({label})"
            reasons.append(f"+ {where} sets up this conflict" + ("" if sure else " for some releases"))
    facts_only = score
    for package, spec in rule.affected.items():
        seen = log.versions.get(package)
        if seen is None:
            continue
        if affected_by(seen, spec):
            score += VERSION_AFFECTED
            reasons.append(f"+ the log shows {package} {seen}, which is affected ({package}{spec})")
        else:
            score += VERSION_FIXED
            reasons.append(f"- the log shows {package} {seen}, which has the fix ({rule.fixed_in})")
    return score, facts_only, decisive, alone, reasons


def score_rule(rule: Rule, log: LogView, facts: Facts) -> Candidate | None:
    if not rule.log.messages and not rule.log.frames:
        return None
    # A fact naming another mechanism behind the same raise site rules the rule out, whatever its messages say.
    if any(ev.excludes and ev.fact in facts for ev in rule.log.evidence):
        return None
    hits = _hits(rule.log.messages, log.lines)
    frames, in_tail = _frame_hits(rule, log)
    weight, facts_weight, decisive, alone, reasons = _evidence(rule, facts, log)
    own, shared, generic, warned = (hits.get(k, []) for k in ("own", "shared", "generic", "warning"))
    # A shared message alone is a possible cause only where nothing shows a run unrelated to training: a short paste,
    # an excerpt without a Python traceback, a traceback through training code, or checkpointing at work.
    context = (log.one_liner or not log.frames or "training" in facts or "meta:any" in facts
               or "checkpointing" in facts)
    found = own + shared + generic
    level = None
    if own:
        level = "confirmed" if weight > VERSION_FIXED / 2 else "likely"
        reasons.insert(0, "its own error message is in the log")
    elif shared or generic:
        if decisive:
            level = "confirmed"
        elif weight >= LIKELY_AT:
            level = "likely"
        elif (shared or f"setup?:{rule.id}" in facts) and weight >= 0 and context:
            # A message many failures print counts when the run's launch (echoed in the log or given with --launch)
            # sets this rule up for some releases.
            level = "possible"
        reasons.insert(0, f"a message {'several failures share' if shared else 'many failures print'} is in the log")
    elif in_tail:
        own_frame = any(m.kind == "own" for m, _, _ in frames)
        generic_only = all(m.kind == "generic" for m, _, _ in frames)
        if own_frame or decisive or facts_weight >= LIKELY_AT + (2 if generic_only else 0):
            level = "likely"
        elif facts_weight > 0 and weight > 0 and any(m.kind == "shared" for m, _, _ in frames):
            level = "possible"
        reasons.insert(0, "the log stops inside this failure's raise path, before the error line (truncated)")
    elif log.truncated and alone and not warned:
        level = "likely"
        reasons.insert(0, "the log stops inside a traceback before its error line, and a fact only this failure "
                          "produces is in it")
    elif log.truncated and f"setup?:{rule.id}" in facts and facts_weight > 0:
        level = "possible"
        reasons.insert(0, "the log stops inside a traceback before its error line; the launch line it echoes sets up "
                          "this failure for some releases")
    elif warned and not log.frames and not log.errors and weight >= 0:
        level = "likely"
        reasons.insert(0, "only its warning is in the log and no crash follows: the failure is silent")
        found = warned
    if level is None:
        return None
    frame_bonus = 1.5 * len(frames) if found else 0.0
    base = {"own": 10.0, "shared": 6.0, "generic": 4.0, "warning": 5.0}
    kind_score = max((base[m.kind] for m, _, _ in found), default=4.0) + 2.0 * max(len(own) - 1, 0)
    score = kind_score + weight + frame_bonus + rule.log.prior
    lines = sorted({(n, t) for _, n, t in found + frames})
    keys = frozenset(m.pattern for m, _, _ in shared + generic)
    return Candidate(rule, level, round(score, 2), lines, reasons, keys)


def _displace(candidates: list[Candidate]) -> list[Candidate]:
    """A rule confirmed by a fact only it produces displaces the siblings found by the same shared message."""
    confirmed = [c for c in candidates if c.confidence == "confirmed" and c.message_keys]
    out = []
    for c in candidates:
        if c.confidence != "confirmed" and any(c.message_keys & k.message_keys for k in confirmed):
            continue
        out.append(c)
    return out


def diagnose(log: LogView) -> list[Candidate]:
    facts = read_facts(log)
    found = [c for rule in all_rules() if (c := score_rule(rule, log, facts))]
    found = _displace(found)
    found.sort(key=lambda c: c.rank_key)
    return found



def with_own_findings(candidates: list[Candidate], own) -> list[Candidate]:
    """Add the rules a loraflow log names itself: a plan that refused the setup (`[ERROR] rule-id`: confirmed, it is
    loraflow's own verdict) and a first-step guard's likely causes (likely: the guard lists every cause that fits)."""
    from loraflow.rules import get_rule

    found = {c.rule.id: c for c in candidates}
    refused = "loraflow's plan refused this setup before training (its finding is in the log)"
    guarded = "loraflow's first-step guard names it as a likely cause"
    for source, level, score, why in ((own.refused, "confirmed", 100.0, refused),
                                      (own.guarded, "likely", 5.0, guarded)):
        for rule_id, line in source.items():
            try:
                rule = get_rule(rule_id)
            except KeyError:
                continue
            have = found.get(rule_id)
            if have is None:
                found[rule_id] = Candidate(rule, level, score, [line], [why])
            elif LEVELS.index(level) < LEVELS.index(have.confidence):
                have.confidence, have.score = level, max(have.score, score)
                have.reasons.insert(0, why)
                have.lines = sorted({*have.lines, line})
    out = list(found.values())
    out.sort(key=lambda c: c.rank_key)
    return out
