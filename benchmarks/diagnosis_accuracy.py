"""How often `loraflow explain` and `loraflow check` are right on the real-world corpus in tests/fixtures/corpus/.

explain: each failure log of a known conflict family must get its rule first; each decoy (an unrelated failure)
must get no claim at all. check: each launch line or config must report the expected conflicts (or no crash/silent
finding where none was hit). Every file comes from a public issue thread or example folder named in its
directory's MANIFEST.json. The probe-captured logs of tests/fixtures/logs/ are scored too, as their own source.

    python benchmarks/diagnosis_accuracy.py            # the summary, per rule, per framework, and every miss
    python benchmarks/diagnosis_accuracy.py --json     # machine-readable (tests/explain/test_corpus.py reads it)
    python benchmarks/diagnosis_accuracy.py --misses   # only the misses, with the top three candidates each
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
from collections import Counter, defaultdict
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "fixtures" / "corpus"
CAPTURED = ROOT / "tests" / "fixtures" / "logs"


def explain_entries() -> list[dict]:
    entries = []
    for manifest in sorted((CORPUS / "explain").glob("*/MANIFEST.json")):
        for name, meta in json.loads(manifest.read_text()).items():
            entries.append({**meta, "file": manifest.parent / name, "batch": manifest.parent.name})
    captured = CAPTURED / "MANIFEST.json"
    if captured.exists():
        for name, meta in json.loads(captured.read_text()).items():
            entries.append({"file": CAPTURED / name, "batch": "probe-captured", "expected": meta["rule"],
                            "decoy": False, "framework": "loraflow-probe", "shape": "full",
                            "source": "scripts/capture_failure_logs.py"})
    return entries


def check_entries() -> list[dict]:
    entries = []
    for manifest in sorted((CORPUS / "check").glob("*/MANIFEST.json")):
        for key, meta in json.loads(manifest.read_text()).items():
            entries.append({**meta, "key": key, "dir": manifest.parent, "batch": manifest.parent.name})
    return entries


def score_explain(entries: list[dict]) -> dict:
    from loraflow.explain import diagnose_log

    rows = []
    for e in entries:
        log, candidates, _ = diagnose_log(e["file"].read_text(encoding="utf-8", errors="replace"))
        top = candidates[0] if candidates else None
        expected = e.get("expected")
        ok = (not candidates) if e.get("decoy") or expected is None else bool(top and top.rule.id == expected)
        if e.get("evidence_in_log") is False:
            # The stored excerpt stops before anything that names its failure: no one could tell the cause from it.
            # Scored apart: a claim there must still be the right one.
            ok = not candidates or (top is not None and top.rule.id == expected)
        rows.append({"file": str(e["file"].relative_to(ROOT)), "batch": e["batch"], "expected": expected,
                     "uninformative": e.get("evidence_in_log") is False,
                     "decoy": bool(e.get("decoy") or expected is None), "framework": e.get("framework") or "?",
                     "shape": log.shape, "ok": ok, "top": top.rule.id if top else None,
                     "confidence": top.confidence if top else None,
                     "candidates": [(c.rule.id, c.confidence) for c in candidates[:3]]})
    return _summarise(rows, "expected")


def _command_argv(path: Path) -> list[str]:
    text = path.read_text()
    joined = " ".join(line.rstrip("\\").strip() for line in text.splitlines()
                      if line.strip() and not line.lstrip().startswith("#"))
    return shlex.split(joined)


@contextmanager
def _cwd(path: Path):
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def _run_check(e: dict) -> dict:
    from loraflow.environment import TRACKED_PACKAGES as TRACKED, parse_versions
    from loraflow.errors import LoraflowError
    from loraflow.frontends import run_check

    # Launch lines name their configs by the paths of their own checkout (`configs/deepspeed_config.yaml`); the
    # manifest's `paths` maps them to the stored files, which are laid out that way in a scratch directory.
    # The launch runs two levels down, so that `../accelerate/x.yaml` stays inside the scratch directory.
    scratch = Path(tempfile.mkdtemp(prefix="corpus-check-"))
    cwd = scratch / "checkout" / "run"
    cwd.mkdir(parents=True)
    for f in e["files"]:
        shutil.copy(e["dir"] / f, cwd / f)
    for original, stored in (e.get("paths") or {}).items():
        target = (cwd / original).resolve()
        if scratch.resolve() in target.parents:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(e["dir"] / stored, target)
    files = [str(cwd / f) for f in e["files"]]
    versions = parse_versions(",".join(f"{k}={m.group(0)}" for k, v in (e.get("versions") or {}).items()
                                       if k in TRACKED and (m := re.search(r"\d+(\.\d+)+", str(v)))))
    invocation = e.get("invocation", "command")
    try:
        with _cwd(cwd):
            if invocation == "files":
                text, _ = run_check(None, e.get("framework"), files, dict(versions), True)
            elif invocation == "script":
                text, _ = run_check(["bash", files[0]], None, [], dict(versions), True)
            else:
                text, _ = run_check(_command_argv(Path(files[0])), None, [], dict(versions), True)
        return json.loads(text)
    except LoraflowError as exc:
        return {"error": str(exc).splitlines()[0][:200], "findings": []}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def score_check(entries: list[dict]) -> dict:
    rows = []
    for e in entries:
        doc = _run_check(e)
        found = {f["rule"] for f in doc.get("findings", [])}
        serious = {f["rule"] for f in doc.get("findings", []) if f.get("impact") in ("crash", "silent")
                   and not f.get("holds_if")}
        expected = set(e.get("expected") or [])
        if e.get("expected_error"):  # a malformed input: the right answer is a clear error naming it
            ok = e["expected_error"] in (doc.get("error") or "")
        else:
            ok = expected <= found if expected else (not serious and "error" not in doc)
        rows.append({"file": f"{e['batch']}/{e['key']}", "batch": e["batch"], "expected": sorted(expected) or None,
                     "framework": e.get("framework") or "?", "ok": ok, "found": sorted(found),
                     "error": doc.get("error"), "decoy": not expected, "detected": doc.get("framework")})
    return _summarise(rows, "expected")


def _summarise(rows: list[dict], key: str) -> dict:
    per_rule: dict[str, Counter] = defaultdict(Counter)
    per_framework: dict[str, Counter] = defaultdict(Counter)
    for r in rows:
        label = "(none)" if r["decoy"] else (", ".join(r[key]) if isinstance(r[key], list) else r[key])
        per_rule[label]["n"] += 1
        per_rule[label]["ok"] += r["ok"]
        per_framework[r["framework"]]["n"] += 1
        per_framework[r["framework"]]["ok"] += r["ok"]
    failures = [r for r in rows if not r["decoy"] and not r.get("uninformative")]
    decoys = [r for r in rows if r["decoy"]]
    blind = [r for r in rows if r.get("uninformative")]
    return {"n": len(rows), "failures": len(failures), "right": sum(r["ok"] for r in failures),
            "decoys": len(decoys), "decoys_clean": sum(r["ok"] for r in decoys),
            "uninformative": len(blind), "uninformative_ok": sum(r["ok"] for r in blind),
            "per_rule": {k: dict(v) for k, v in sorted(per_rule.items())},
            "per_framework": {k: dict(v) for k, v in sorted(per_framework.items())},
            "misses": [r for r in rows if not r["ok"]], "rows": rows}


def _pct(a: int, b: int) -> str:
    return f"{a}/{b} ({100 * a / b:.0f}%)" if b else "0/0"


def _by_shape(rows: list[dict]) -> str:
    shapes = sorted(Counter(r["shape"] for r in rows).items())
    return ", ".join(f"{s} {_pct(sum(r['ok'] for r in rows if r['shape'] == s), n)}" for s, n in shapes)


def render(explain: dict, check: dict, misses_only: bool) -> str:
    out = []
    if not misses_only:
        out += ["explain (first-ranked rule right on failures; no claim on decoys)",
                f"  failures: {_pct(explain['right'], explain['failures'])}    decoys left unclaimed: "
                f"{_pct(explain['decoys_clean'], explain['decoys'])}",
                f"  excerpts cut before any trace of their failure (scored apart; a claim must be right): "
                f"{_pct(explain['uninformative_ok'], explain['uninformative'])}",
                "  by source: " + ", ".join(f"{b} {n}" for b, n in sorted(Counter(
                    r['batch'] for r in explain['rows']).items())),
                "  by log shape: " + _by_shape(explain["rows"]),
                "  by rule:"]
        out += [f"    {k:<32} {_pct(v.get('ok', 0), v['n'])}" for k, v in explain["per_rule"].items()]
        out += ["  by framework:"] + [f"    {k:<32} {_pct(v.get('ok', 0), v['n'])}"
                                      for k, v in explain["per_framework"].items()]
        out += ["", "check (expected findings reported; none serious where none was hit)",
                f"  with a conflict: {_pct(check['right'], check['failures'])}    clean ones called clean: "
                f"{_pct(check['decoys_clean'], check['decoys'])}", "  by framework:"]
        out += [f"    {k:<32} {_pct(v.get('ok', 0), v['n'])}" for k, v in check["per_framework"].items()]
        out += ["  by rule:"] + [f"    {k:<40} {_pct(v.get('ok', 0), v['n'])}" for k, v in check["per_rule"].items()]
    out += ["", f"explain misses ({len(explain['misses'])}):"]
    for r in explain["misses"]:
        out.append(f"  {r['file']}  [{r['shape']}] expected {r['expected']}, got {r['candidates'] or 'no claim'}")
    out += ["", f"check misses ({len(check['misses'])}):"]
    for r in check["misses"]:
        got = r["error"] and f"error: {r['error']}" or r["found"]
        out.append(f"  {r['file']}  expected {r['expected'] or 'none'}, got {got}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true")
    p.add_argument("--misses", action="store_true")
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    explain = score_explain(explain_entries())
    check = score_check(check_entries())
    if args.json:
        for part in (explain, check):
            part.pop("rows")
        print(json.dumps({"explain": explain, "check": check}, indent=1))
    else:
        print(render(explain, check, args.misses))
    return 0


if __name__ == "__main__":
    sys.exit(main())
