"""How `loraflow explain` and `loraflow check` do on the mined sample of issue 31 (tests/fixtures/mined/): public
threads labelled by cause, a fifth of them set aside before any rule was written from the sample.

explain reads each thread's posted output (its `log`, else its final `error` line): a thread whose cause is a rule of
the catalog must get that rule first; any other (a cause outside the family, or one the catalog has no rule for)
must get no claim. check reads each thread's posted launch (a command line, a config file, or Python training code, read
as `loraflow check train.py` reads it) with the versions the
thread states: a thread whose cause is a rule must get that rule among its findings; any other must get no
unconditional crash or silent finding.

    python benchmarks/mined_accuracy.py                    # the set-aside fifth: scores only (never its misses)
    python benchmarks/mined_accuracy.py --part train       # the other four fifths, with every miss
    python benchmarks/mined_accuracy.py --part all --json  # machine-readable

The set-aside fifth is scored, never mined for rules: its misses are not printed (--show-set-aside-misses exists for
the closing review only).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MINED = ROOT / "tests" / "fixtures" / "mined"
COMMANDS = ("python", "python3", "torchrun", "deepspeed", "accelerate", "swift", "llamafactory-cli", "bash", "sh",
            "ray", "trl", "tune", "axolotl", "litgpt", "vllm", "lm_eval", "CUDA_VISIBLE_DEVICES", "NPROC_PER_NODE",
            "export", "nohup", "srun")


def load(part: str) -> list[dict]:
    aside = set(json.loads((MINED / "SET_ASIDE.json").read_text())["set_aside"])
    rows = [json.loads(line) for path in sorted(MINED.glob("*.jsonl")) for line in path.read_text().splitlines()]
    if part == "set-aside":
        return [r for r in rows if r["id"] in aside]
    if part == "train":
        return [r for r in rows if r["id"] not in aside]
    return rows


def rule_ids() -> dict[str, str]:
    """family slug -> the rule that covers it: every rule id itself, and each family of a cluster in CLUSTERS.json
    that became a rule."""
    from loraflow.rules import all_rules

    ids = {r.id: r.id for r in all_rules()}
    clusters = json.loads((MINED / "CLUSTERS.json").read_text())["clusters"]
    for cluster in clusters.values():
        if cluster["rule"] in ids:
            ids.update({family: cluster["rule"] for family in cluster["families"]})
    return ids


def _posted(r: dict) -> tuple[list[str] | None, str | None, str | None]:
    """The thread's posted launch as check takes it: (argv, None, None) for a command line, else (None, framework,
    file) with the text written to a file - Python training code (a snippet of the reporter's script) read as `check
    train.py` reads it, a config read as the framework the thread names (the user knows which one they ran) or, failing
    that, the one `check FILE` reads it as by its keys. ValueError: a command line whose quotes do not balance."""
    import shlex

    from loraflow.frontends import FRAMEWORKS, guess_framework_for_files
    from loraflow.frontends.script_setup import looks_like_script

    text = r["launch"]
    if _is_command(text):
        return shlex.split(" ".join(line.rstrip("\\").strip() for line in text.splitlines()
                                    if line.strip() and not line.lstrip().startswith("#"))), None, None
    script = looks_like_script(text)
    suffix = ".py" if script else ".json" if text.lstrip().startswith("{") else ".yaml"
    with tempfile.NamedTemporaryFile("w", suffix=suffix, delete=False) as f:
        f.write(text)
    name = ("python-script" if script else r["framework"] if r["framework"] in FRAMEWORKS else
            guess_framework_for_files([f.name]))
    return None, name, f.name


def _launch(r: dict):
    """The thread's posted launch as `explain --launch` takes it: (build, label), or None where it posted none."""
    from loraflow.frontends import from_command, from_files

    if not r["launch"]:
        return None
    try:
        argv, name, path = _posted(r)
    except ValueError:
        return None
    if argv is not None:
        return (lambda v: from_command(list(argv), v)), "--launch (the thread's)"
    return ((lambda v: from_files(name, [path], v)), "--launch (the thread's)") if name else None


def score_explain(records: list[dict], rules: dict[str, str], with_launch: bool = False) -> list[dict]:
    from loraflow.explain import diagnose_log

    rows = []
    for r in records:
        # What the thread posted: its excerpt, and its final error line where the excerpt left it out.
        text = "\n".join(t for t in (r["log"], r["error"]) if t and not (t is r["error"] and r["log"] and
                                                                           t.strip() in r["log"]))
        if not text:
            continue
        _, candidates, _ = diagnose_log(text, _launch(r) if with_launch else None)
        top = candidates[0].rule.id if candidates else None
        expected = rules.get(r["family"])
        ok = top == expected if expected else top is None
        rows.append({"id": r["id"], "expected": expected, "family": r["family"], "top": top, "ok": ok,
                     "candidates": [c.rule.id for c in candidates[:3]]})
    return rows


def _is_command(text: str) -> bool:
    """A command line (as a user passes it after `check --`): its first word after any `NAME=value` assignments
    names a launcher, an interpreter or a script."""
    words = text.split()
    first = next((w for w in words if not re.match(r"[A-Za-z_]\w*=", w)), words[0] if words else "")
    return first in COMMANDS or first.startswith(("./", "/")) or first.endswith(".sh") or bool(
        words and words[0].split("=")[0] in COMMANDS)


def _as_of(opened: str | None) -> tuple[str | None, dict]:
    """The day the thread was opened and the releases current on it (`check --as-of`); a month or a year counts
    from its last day."""
    from loraflow.frontends.versions_source import versions_as_of

    if not opened:
        return None, {}
    day = {4: f"{opened}-12-31", 7: f"{opened}-28"}.get(len(opened), opened)
    return day, versions_as_of(day)


def _check(r: dict, as_of: bool) -> dict:
    """`loraflow check --json` on the thread's launch: a command line as argv, anything else as a config file. The
    versions the thread states, and with `as_of` the releases of its day for the rest."""
    from loraflow.environment import ENGINE_PACKAGES, TRACKED_PACKAGES
    from loraflow.errors import LoraflowError
    from loraflow.frontends import parse_versions, run_check
    from loraflow.frontends.base import release_names
    from loraflow.frontends.versions_source import Dated

    # The packages check tracks and the frameworks' own releases (verl 0.5.0, torchtune 0.2.1) a thread states.
    known = set(TRACKED_PACKAGES) | set(ENGINE_PACKAGES) | set(release_names())
    versions = parse_versions(",".join(f"{k}={m.group(0)}" for k, v in (r["versions"] or {}).items()
                                       if k in known and (m := re.search(r"\d+(\.\d+)+", str(v)))))
    dated = None
    if as_of:
        day, current = _as_of(r["opened"])
        dated = Dated(day, set(current) - set(versions)) if day else None
        versions = {**current, **versions}
    try:
        argv, framework, path = _posted(r)
        out, _ = (run_check(argv, None, [], dict(versions), True, None, dated) if argv is not None else
                  run_check(None, framework, [path], dict(versions), True, None, dated))
        return json.loads(out)
    except (LoraflowError, ValueError) as exc:  # ValueError: shlex on an unbalanced quote
        return {"error": str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__, "findings": []}


def score_check(records: list[dict], rules: dict[str, str], as_of: bool = False) -> list[dict]:
    rows = []
    for r in records:
        if not r["launch"]:
            continue
        doc = _check(r, as_of)
        found = {f["rule"] for f in doc.get("findings", [])}
        serious = {f["rule"] for f in doc.get("findings", [])
                   if f.get("impact") in ("crash", "silent") and not f.get("holds_if")}
        expected = rules.get(r["family"])
        ok = expected in found if expected else not serious
        rows.append({"id": r["id"], "expected": expected, "family": r["family"], "found": sorted(found),
                     "serious": sorted(serious), "error": doc.get("error"), "ok": ok,
                     "versions_given": bool(r["versions"])})
    return rows


def summary(rows: list[dict]) -> dict:
    named = [r for r in rows if r["expected"]]
    other = [r for r in rows if not r["expected"]]
    return {"n": len(rows), "rule_cases": len(named), "rule_right": sum(r["ok"] for r in named),
            "other_cases": len(other), "other_clean": sum(r["ok"] for r in other)}


def _pct(a: int, b: int) -> str:
    return f"{a}/{b} ({100 * a / b:.0f}%)" if b else "0/0"


def render(part: str, records: list[dict], explain: list[dict], check: list[dict], show_misses: bool) -> str:
    e, c = summary(explain), summary(check)
    fw = Counter(r["framework"] for r in records)
    frameworks = ", ".join(f"{k} {v}" for k, v in fw.most_common())
    lines = [f"mined sample, part {part}: {len(records)} threads ({frameworks})",
             f"explain ({e['n']} threads with posted output): cause is a rule, named first "
             f"{_pct(e['rule_right'], e['rule_cases'])}; cause is not a rule, no claim "
             f"{_pct(e['other_clean'], e['other_cases'])}",
             f"check ({c['n']} threads with a posted launch): cause is a rule, found "
             f"{_pct(c['rule_right'], c['rule_cases'])}; cause is not a rule, no unconditional crash/silent finding "
             f"{_pct(c['other_clean'], c['other_cases'])}"]
    if show_misses:
        lines += ["", "explain misses:"]
        lines += [f"  {r['id']}: {r['family']} -> {r['top']} (candidates {r['candidates']})"
                  for r in explain if not r["ok"]]
        lines += ["", "check misses:"]
        lines += [f"  {r['id']}: {r['family']} -> found {r['found']}{' error: ' + r['error'] if r['error'] else ''}"
                  for r in check if not r["ok"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=("set-aside", "train", "all"), default="set-aside")
    p.add_argument("--json", action="store_true", help="every row, machine-readable")
    p.add_argument("--as-of", action="store_true", help="check with the releases of each thread's day for what the "
                   "thread does not state (`check --as-of`)")
    p.add_argument("--with-launch", action="store_true", help="explain each log with the launch its thread "
                   "posted (`explain --launch`)")
    p.add_argument("--show-set-aside-misses", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    import logging

    logging.disable(logging.WARNING)
    records = load(args.part)
    rules = rule_ids()
    explain = score_explain(records, rules, args.with_launch)
    check = score_check(records, rules, args.as_of)
    if args.json:
        print(json.dumps({"part": args.part, "explain": {**summary(explain), "rows": explain},
                          "check": {**summary(check), "rows": check}}, indent=1))
    else:
        print(render(args.part, records, explain, check, args.part == "train" or args.show_set_aside_misses))
    return 0


if __name__ == "__main__":
    sys.exit(main())
