"""Whether `loraflow explain` reads a log the way people paste it: each failure log of the real-world corpus
(benchmarks/diagnosis_accuracy.py's, the ones explain names right as stored) is pasted again with what launchers,
loggers, terminals and issue trackers put around lines, and must keep its rule first; each decoy that gets no claim
as stored must still get none. `loraflow check` gets the same treatment: each corpus launch, read as a script, is
pasted in a markdown fence, with Windows line ends and behind a shell prompt, and must give the same findings.

    python benchmarks/paste_robustness.py          # one line per paste form: failures kept, decoys newly claimed
    python benchmarks/paste_robustness.py --json

The forms are ones seen in public threads: torchrun's `[rankN]:` prefix, ANSI colours, a logger's timestamp, Windows
line ends, a progress bar redrawn with carriage returns, an indented, markdown-quoted or fenced paste, a shell prompt before
the echoed launch line, HTML entities where a page was copied as source.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _lines(text: str, each: Callable[[int, str], str]) -> str:
    return "\n".join(each(i, line) for i, line in enumerate(text.splitlines()))


# What torchrun prints after a rank fails (torch/distributed/elastic/multiprocessing/errors/__init__.py): the
# launcher's own traceback and its summary table, below the rank's real error.
TORCHRUN_TAIL = """[2024-05-01 12:00:01,000] torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: 1) \
local_rank: 0 (pid: 4242) of binary: /usr/bin/python
Traceback (most recent call last):
  File "/usr/local/bin/torchrun", line 8, in <module>
    sys.exit(main())
  File "/usr/local/lib/python3.10/dist-packages/torch/distributed/run.py", line 812, in main
    run(args)
  File "/usr/local/lib/python3.10/dist-packages/torch/distributed/launcher/api.py", line 263, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2024-05-01_12:00:01
  host      : node-1
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 4242)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================"""

# accelerate launch's own traceback when its child exits non-zero (accelerate/commands/launch.py simple_launcher).
ACCELERATE_TAIL = """Traceback (most recent call last):
  File "/opt/conda/bin/accelerate", line 8, in <module>
    sys.exit(main())
  File "/opt/conda/lib/python3.10/site-packages/accelerate/commands/accelerate_cli.py", line 48, in main
    args.func(args)
  File "/opt/conda/lib/python3.10/site-packages/accelerate/commands/launch.py", line 1097, in launch_command
    simple_launcher(args)
  File "/opt/conda/lib/python3.10/site-packages/accelerate/commands/launch.py", line 703, in simple_launcher
    raise subprocess.CalledProcessError(returncode=process.returncode, cmd=cmd)
subprocess.CalledProcessError: Command '['/opt/conda/bin/python', 'train.py']' returned non-zero exit status 1."""
# The deepspeed runner's lines when a rank exits non-zero (deepspeed/launcher/launch.py sigkill_handler).
DEEPSPEED_TAIL = """[2024-05-01 12:00:02,000] [INFO] [launch.py:319:sigkill_handler] Killing subprocess 4242
[2024-05-01 12:00:02,000] [ERROR] [launch.py:325:sigkill_handler] ['/usr/bin/python', '-u', 'train.py', \
'--local_rank=0'] exits with return code = 1"""

FORMS: dict[str, Callable[[str], str]] = {
    "rank prefix": lambda t: _lines(t, lambda i, line: f"[rank{i % 2}]: {line}"),
    "ansi colour": lambda t: _lines(t, lambda i, line: f"\x1b[31m{line}\x1b[0m" if "Error" in line else line),
    "timestamp": lambda t: _lines(t, lambda i, line: f"2024-05-01 12:00:{i % 60:02d},123 - {line}"),
    "crlf": lambda t: t.replace("\n", "\r\n"),
    "progress bar": lambda t: ("  3%|▎         | 10/300 [00:10<04:50,  1.00s/it]\r  4%|▍         | 12/300 "
                               "[00:12<04:48,  1.00s/it]\n" + t),
    "indented": lambda t: _lines(t, lambda i, line: f"    {line}"),
    "quoted": lambda t: _lines(t, lambda i, line: f"> {line}"),
    "shell prompt": lambda t: _lines(t, lambda i, line: f"(venv) user@host:~/run$ {line}" if i == 0 else line),
    "fenced": lambda t: f"```python\n{t}\n```",
    "windows paths": lambda t: re.sub(r'File "(/[^"]+)"', lambda m: 'File "C:\\Users\\me\\miniconda3' +
                                      m.group(1).replace("/", "\\") + '"', t),
    "literal \\n": lambda t: t.replace("\n", "\\n"),
    "torchrun tail": lambda t: t + "\n" + TORCHRUN_TAIL,
    "accelerate tail": lambda t: t + "\n" + ACCELERATE_TAIL,
    "deepspeed tail": lambda t: t + "\n" + DEEPSPEED_TAIL,
    "html escaped": lambda t: t.replace("'", "&#39;").replace('"', "&quot;").replace(">", "&gt;").replace("<", "&lt;"),
}


def measure(forms: tuple[str, ...] = tuple(FORMS)) -> dict:
    from diagnosis_accuracy import explain_entries

    from loraflow.explain import diagnose_log

    def top(text: str) -> str | None:
        _, candidates, _ = diagnose_log(text)
        return candidates[0].rule.id if candidates else None

    failures, decoys = [], []
    for e in explain_entries():
        text = e["file"].read_text(encoding="utf-8", errors="replace")
        if e.get("decoy") or e.get("expected") is None:
            if top(text) is None:
                decoys.append((e["file"].name, text))
        elif e.get("evidence_in_log") is not False and top(text) == e["expected"]:
            failures.append((e["file"].name, text, e["expected"]))
    out = {}
    for name in forms:
        form = FORMS[name]
        lost = [(f, top(form(t))) for f, t, want in failures if top(form(t)) != want]
        claimed = [(f, got) for f, t in decoys if (got := top(form(t))) is not None]
        out[name] = {"kept": len(failures) - len(lost), "of": len(failures), "lost": lost,
                     "decoys_claimed": claimed, "decoys": len(decoys)}
    return out


LAUNCH_FORMS: dict[str, Callable[[str], str]] = {
    "fenced": lambda t: f"```bash\n{t.rstrip()}\n```\n",
    "crlf": lambda t: t.replace("\n", "\r\n"),
    "shell prompt": lambda t: _lines(t, lambda i, line: f"(venv) user@host:~/run$ {line}" if i == 0 else line),
}


def measure_check(forms: tuple[str, ...] = tuple(LAUNCH_FORMS)) -> dict:
    """check on each corpus launch (a command line or a launch script) read as a script, then re-pasted: the same
    findings must come back."""
    import shutil
    import tempfile

    from diagnosis_accuracy import _run_check, check_entries

    def findings(e: dict, text: str) -> tuple:
        folder = Path(tempfile.mkdtemp(prefix="paste-"))
        try:
            for f in e["files"] + list((e.get("paths") or {}).values()):
                (folder / f).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(e["dir"] / f, folder / f)
            (folder / e["files"][0]).write_bytes(text.encode())
            doc = _run_check({**e, "dir": folder, "invocation": "script"})
            return tuple(sorted((f["rule"], f.get("holds_if") or "") for f in doc.get("findings", []))), doc.get("error")
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    launches = [e for e in check_entries() if e.get("invocation", "command") in ("command", "script")
                and not e.get("expected_error")]
    base = {}
    for e in launches:
        text = (e["dir"] / e["files"][0]).read_text()
        got = findings(e, text)
        if got[1] is None:
            base[e["key"]] = (e, text, got)
    out = {}
    for name in forms:
        changed = [(key, got[0], findings(e, LAUNCH_FORMS[name](text))[0]) for key, (e, text, got) in base.items()
                   if findings(e, LAUNCH_FORMS[name](text)) != got]
        out[name] = {"same": len(base) - len(changed), "of": len(base), "changed": changed}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    out, launches = measure(), measure_check()
    if args.json:
        print(json.dumps({"explain": out, "check": launches}, indent=2))
        return 0
    for name, r in launches.items():
        print(f"check, {name:<15} same findings {r['same']}/{r['of']}" + (f"   changed: {r['changed'][:2]}"
                                                                           if r["changed"] else ""))
    for name, r in out.items():
        print(f"{name:<15} failures kept {r['kept']}/{r['of']}   decoys newly claimed {len(r['decoys_claimed'])}/"
              f"{r['decoys']}" + (f"   lost: {r['lost'][:3]}" if r["lost"] else "")
              + (f"   claimed: {r['decoys_claimed'][:3]}" if r["decoys_claimed"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
