"""What a probe's outcome means for the user's installed stack, in words they can act on, and the table that says it.

A row used to end in `agrees` / `DIFFERS` / `-`, which left the reader to work out what a disagreement implies. Each
outcome is one of a few verdicts, decided once here from the two observations (naive settings, loraflow's plan) and
the registry's prediction, each with a short phrase for the table, a sentence for the legend and the action to take.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

WIDTH = 116


@dataclass(frozen=True)
class Verdict:
    key: str
    """Stable id, for --json and tests."""
    short: str
    """The table's last column: what the outcome means, in a few words."""
    meaning: str
    """The legend's sentence: what it means for the installed stack and what to do."""
    tally: str
    """The summary's phrase after a count ("3 fail as the registry predicts")."""


FAILS_AS_PREDICTED = Verdict(
    "fails-as-predicted", "fails as predicted: the rule's fix applies",
    "your stack fails here as the registry predicts for these versions, so the rule's fix applies: loraflow's plan "
    "applies it, and for another framework `loraflow check` words it in that framework's flags.",
    "fail as the registry predicts (its fixes apply)")
RUNS_AS_PREDICTED = Verdict(
    "runs-as-predicted", "runs as predicted: nothing to do",
    "your stack runs the naive settings, as the registry predicts for these versions: nothing to do.",
    "run as it predicts")
FIXED_HERE = Verdict(
    "fixed-here", "runs though predicted to fail: fixed here?",
    "the registry predicts a failure but your stack runs it: this release has fixed it, so the rule's version bound "
    "may be stale. Your runs need nothing; report it with `loraflow --version` so the bound can move.",
    "run though it predicts a failure (fixed in this release?)")
NEW_CONFLICT = Verdict(
    "new-conflict", "FAILS though predicted to run: new conflict",
    "the registry predicts success but your stack fails: a conflict the registry does not know for these versions. "
    "Keep loraflow's plan where it is safe, run `loraflow explain` on the probe's log and report it.",
    "fail though it predicts success (new conflicts: report them)")
NOT_RUN = Verdict(
    "not-run", "not run here: no verdict",
    "the reproduction does not apply to this machine or what it runs against is not installed (the detail below says "
    "which, and the command that builds it): nothing is known about your stack for this rule.",
    "not run here")
PROBE_BROKE = Verdict(
    "probe-broke", "the probe broke: no verdict",
    "the probe process died before reporting (a probe bug or a broken install), which says nothing about the rule: "
    "read its log, and report it if the install is sound.",
    "probes broke before reporting")
PLAN_FAILS = Verdict(
    "plan-fails", "PLAN FAILS: a loraflow bug, report it",
    "loraflow's plan breaks too on your stack: that is a loraflow bug. Do not rely on this setup; report it with the "
    "probe's log and `loraflow --version`.",
    "with loraflow's plan failing")
ORDER = (PLAN_FAILS, NEW_CONFLICT, FIXED_HERE, PROBE_BROKE, FAILS_AS_PREDICTED, RUNS_AS_PREDICTED, NOT_RUN)
"""Legend order: what needs the user's action first."""


def verdict(result) -> Verdict:
    """The verdict of one ProbeResult (runner.py): the plan's failure outranks everything, then the naive side
    against the registry's prediction."""
    if result.safe == "no":
        return PLAN_FAILS
    if "failed" in (result.affected, result.safe):
        return PROBE_BROKE
    if result.affected not in ("yes", "no"):
        return NOT_RUN  # n/a or unavailable
    if result.affected == "yes":
        return FAILS_AS_PREDICTED if result.predicted else NEW_CONFLICT
    return FIXED_HERE if result.predicted else RUNS_AS_PREDICTED


def _naive(result) -> str:
    return {"yes": "breaks", "no": "runs"}.get(result.affected, result.affected)


def _plan(result) -> str:
    return {"yes": "safe", "no": "FAILS"}.get(result.safe, result.safe)


def summary(results) -> str:
    """One line: how many rules fall under each verdict, and whether the plan was safe wherever it ran."""
    counts = {v.key: 0 for v in ORDER}
    for r in results:
        counts[verdict(r).key] += 1
    ran = sum(1 for r in results if r.safe in ("yes", "no"))
    parts = [f"{counts[v.key]} {v.tally}" for v in ORDER if counts[v.key] and v is not PLAN_FAILS]
    plan = (f"loraflow's plan FAILED in {counts[PLAN_FAILS.key]} of the {ran} that ran: report it"
            if counts[PLAN_FAILS.key] else f"loraflow's plan was safe in all {ran} that ran")
    return f"summary: {len(results)} rules probed on your stack: {'; '.join(parts) or 'none'}; {plan}."


def _wrap(text: str, indent: str) -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ",
                         break_on_hyphens=False, break_long_words=False)


def render_table(results, versions: str) -> str:
    header = ("rule", "naive", "plan", "predicted", "s", "what it means for your stack")
    rows = [(r.rule, _naive(r), _plan(r), "breaks" if r.predicted else "runs", f"{r.seconds:.0f}", verdict(r).short)
            for r in results]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()
    out = [f"loraflow probe on {versions}",
           *_wrap("naive: the rule's triggering settings as a user would write them; plan: the same run as "
                  "loraflow's plan changes it; predicted: what the registry says the naive settings do on these "
                  "versions.", ""),
           line(header), line(["-" * w for w in widths]), *(line(row) for row in rows), "",
           *_wrap(summary(results), "")]
    present = {verdict(r).key for r in results}
    out.append("what each outcome means, and what to do:")
    for v in ORDER:
        if v.key in present:
            out += _wrap(f"{v.short.split(':')[0]}: {v.meaning}", "  ")
    out.append("")
    for r in results:
        out.append(f"{r.rule}: {r.what}")
        out.append(f"    naive: {r.naive.status}: {r.naive.detail}")
        out.append(f"    plan:  {r.plan.status}: {r.plan.detail}")
        if verdict(r) in (NEW_CONFLICT, PROBE_BROKE, PLAN_FAILS) and r.log:
            out.append(f"    log:   {r.log}")
    return "\n".join(out)
