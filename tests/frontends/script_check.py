"""`loraflow check` on a training script written into a test's directory: the helper the script-reading sweeps'
tests share (test_wild_scripts3-6, test_wild11_unsloth)."""

from __future__ import annotations

import json
import textwrap

from loraflow.frontends import parse_versions, run_check

CURRENT = parse_versions("torch=2.13.0,transformers=5.23.0,peft=0.21.2,trl=1.16.0,bitsandbytes=0.50.2,"
                         "accelerate=1.15.0,deepspeed=0.19.8,unsloth=2026.7.1")


def check(tmp_path, monkeypatch, text: str, argv: list[str] | None = None, files: dict[str, str] | None = None,
          **versions: str) -> dict:
    """Write `text` as train.py (and `files` beside it), check it (as `check train.py`, or launched by `argv`) on
    the tested stack with `versions` over it, and return the JSON report (its exit code checked against the
    returned one)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(textwrap.dedent(text))
    for name, body in (files or {}).items():
        (tmp_path / name).write_text(body)
    chosen = dict(CURRENT)
    chosen.update(parse_versions(",".join(f"{k}={v}" for k, v in versions.items())) if versions else {})
    out, code = run_check(argv, None if argv else "python", [] if argv else ["train.py"], chosen, as_json=True)
    report = json.loads(out)
    assert report["exit_code"] == code
    return report


def rules(report: dict) -> set[str]:
    return {f["rule"] for f in report["findings"]}


def launch_findings(tmp_path, monkeypatch, line: str, versions: str, files: dict[str, str] | None = None
                    ) -> dict[str, str | None]:
    """`loraflow check --json -- LINE` run in the test's directory with `files` written there and only `versions`
    known: each finding's rule and its condition (None where it holds whatever is unknown)."""
    import shlex

    monkeypatch.chdir(tmp_path)
    for name, body in (files or {}).items():
        (tmp_path / name).write_text(body)
    doc = json.loads(run_check(shlex.split(line), None, [], dict(parse_versions(versions)), as_json=True)[0])
    return {f["rule"]: f["holds_if"] for f in doc["findings"]}
