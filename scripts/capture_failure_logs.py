#!/usr/bin/env python
"""Regenerate `loraflow explain`'s fixtures: real failure logs in tests/fixtures/logs/ plus MANIFEST.json.

Each fixture is the complete output (stdout and stderr of every rank) of one probe case run with its NAIVE
settings only, under the interpreter whose stack has the bug:
  - DeepSpeed 0.15.3 (.venv-ds0153, made by scripts/setup_legacy_venv.sh): zero3-frozen-recompute,
    zero3-eval-backward (both fixed in later DeepSpeed releases);
  - the current stack (.venv, or the interpreter running this script): the single-process cases below, and every
    2-rank case whose naive run raises an error here (a `wrong` result has no traceback to explain).
The probe worker's own `=== probe ...` lines (which name the rule) are removed, so explain sees only what the
libraries and frameworks printed. Nothing else is stripped: timestamps of DeepSpeed's log lines and the order in
which two ranks' lines interleave differ from run to run; the tracebacks do not.

    python scripts/capture_failure_logs.py              # everything (needs .venv-ds0153 for the legacy logs)
    python scripts/capture_failure_logs.py --skip-legacy
    python scripts/capture_failure_logs.py --only ddp-reentrant-unused
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "logs"
LEGACY = ROOT / ".venv-ds0153" / "bin" / "python"
CURRENT = ROOT / ".venv" / "bin" / "python"

LEGACY_CASES = ("zero3-frozen-recompute", "zero3-eval-backward")
CURRENT_CASES = ("reentrant-frozen-inputs", "cache-during-recompute", "no-adapter-matched", "fp16-trainable-unscale",
                 "kbit-cpu-repack", "kbit-full-finetune", "vlm-wrong-auto-class", "image-tokens-truncated",
                 "lora-no-default-targets")
"""Must raise on the current stack; every 2-rank case that raises here is captured as well, except:"""
UNDIAGNOSABLE = ("ddp-unused-vision-tower",)
"""Its error is raised in DDP's pre-forward, before any model frame: the log cannot show that the model is an
image-text one, so it holds no trace of its cause (the real-world logs in tests/fixtures/corpus/explain/vision do)."""


def stack(python: str) -> dict[str, str]:
    """{package: version} of the packages loraflow tracks, as the given interpreter has them."""
    code = ("import json, importlib.metadata as m\n"
            "from loraflow.environment import TRACKED_PACKAGES\n"
            "out = {}\n"
            "for p in TRACKED_PACKAGES:\n"
            "    try: out[p] = m.version(p)\n"
            "    except m.PackageNotFoundError: pass\n"
            "print(json.dumps(out))")
    return json.loads(subprocess.run([python, "-c", code], check=True, capture_output=True, text=True).stdout)


def relative(path: str) -> str:
    try:
        return str(Path(path).absolute().relative_to(ROOT))
    except ValueError:
        return path


def describe_command(case, python: str) -> str:
    """The command the runner ran, without its random port and temporary output file."""
    from loraflow.probes.runner import command

    argv = command(case, "OUT.jsonl", python, only_naive=True)
    if "--master_port" in argv:
        i = argv.index("--master_port")
        del argv[i:i + 2]
    argv[0] = relative(argv[0])
    return ("OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu LOCAL_SIZE=2 " + " ".join(argv)
            + "  (scripts/capture_failure_logs.py: naive settings only; `=== probe` lines removed)")


def capture(case, python: str, work: Path):
    """Run the case's naive mode under `python`; (status, detail, log text without the worker's labels)."""
    from loraflow.probes.runner import run_case

    result = run_case(case, work, python=python, only_naive=True)
    text = Path(result.log).read_text() if result.log else ""
    kept = [line for line in text.splitlines(keepends=True) if not line.startswith("=== probe")]
    return result.naive, "".join(kept)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--skip-legacy", action="store_true", help="do not (re)capture the DeepSpeed 0.15.3 logs")
    p.add_argument("--only", nargs="*", help="capture only these rule ids")
    p.add_argument("--python", default=str(CURRENT if CURRENT.exists() else sys.executable),
                   help="interpreter of the current stack (default: .venv/bin/python)")
    args = p.parse_args(argv)

    sys.path.insert(0, str(ROOT / "src"))
    from loraflow.probes import all_cases

    cases = all_cases()
    plan: list[tuple[str, str, bool]] = []  # (rule, python, must raise)
    if not args.skip_legacy:
        if not LEGACY.exists():
            print(f"{relative(str(LEGACY))} is missing: run `bash scripts/setup_legacy_venv.sh` first, "
                  "or pass --skip-legacy", file=sys.stderr)
            return 2
        plan += [(rule, str(LEGACY), True) for rule in LEGACY_CASES]
    plan += [(rule, args.python, True) for rule in CURRENT_CASES]
    plan += [(rule, args.python, False) for rule, c in cases.items()
             if c.ranks > 1 and not c.needs_cuda and rule not in LEGACY_CASES + UNDIAGNOSABLE]
    if args.only:
        plan = [row for row in plan if row[0] in args.only]

    FIXTURES.mkdir(parents=True, exist_ok=True)
    manifest_path = FIXTURES / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    stacks: dict[str, dict] = {}
    failed = []
    with tempfile.TemporaryDirectory(prefix="loraflow-capture-") as tmp:
        for rule, python, must_raise in plan:
            case = cases[rule]
            observation, text = capture(case, python, Path(tmp))
            name = f"{rule}.log"
            label = f"{rule} ({relative(python)})"
            if observation.status != "error":
                if must_raise:
                    failed.append(f"{label}: expected an error, got {observation.status}: {observation.detail}")
                print(f"skip {label}: naive run is {observation.status}, no failure log to keep")
                # Only a clean or silently-wrong run proves the failure is gone from this stack; a timeout or a
                # crashed probe says nothing, so its old fixture stays.
                if observation.status in ("ok", "wrong") and manifest.pop(name, None) is not None:
                    (FIXTURES / name).unlink(missing_ok=True)
                continue
            (FIXTURES / name).write_text(text)
            if python not in stacks:
                stacks[python] = stack(python)
            manifest[name] = {"rule": rule, "stack": stacks[python], "command": describe_command(case, python)}
            print(f"kept {label} -> {relative(str(FIXTURES / name))}: {observation.detail}")
    manifest_path.write_text(json.dumps(dict(sorted(manifest.items())), indent=2) + "\n")
    for line in failed:
        print("FAILED " + line, file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
