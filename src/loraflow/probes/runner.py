"""Run probe cases in subprocesses and print the table: rule, affected with naive settings, safe under loraflow.

Each case runs in a fresh interpreter (torchrun with 2 ranks where the case needs them) with a timeout, so a
crash, a hang or global state left by DeepSpeed cannot leak into the next case.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from loraflow.engines.launch import run_isolated, torchrun_argv
from loraflow.probes import Case, Observation, all_cases


@dataclass
class ProbeResult:
    rule: str
    naive: Observation
    plan: Observation
    predicted: bool
    """The registry's prediction for the naive settings on the installed versions."""
    seconds: float = 0.0
    log: str = ""
    what: str = ""

    @property
    def affected(self) -> str:
        if self.naive.status in ("n/a", "failed"):
            return self.naive.status  # not applicable here, or the probe itself broke: neither yes nor no
        return "yes" if self.naive.broken else "no"

    @property
    def safe(self) -> str:
        if self.plan.status in ("n/a", "failed"):
            return self.plan.status
        return "no" if self.plan.broken else "yes"

    @property
    def matches_registry(self) -> bool | None:
        return None if self.affected not in ("yes", "no") else (self.affected == "yes") == self.predicted

    def to_dict(self) -> dict:
        return {"rule": self.rule, "affected": self.affected, "safe_under_loraflow": self.safe,
                "registry_predicts_affected": self.predicted, "matches_registry": self.matches_registry,
                "naive": vars(self.naive), "plan": vars(self.plan), "seconds": round(self.seconds, 1),
                "what": self.what}


def not_applicable(case: Case) -> str | None:
    missing = [p for p in case.requires if importlib.util.find_spec(p) is None]
    if missing:
        return f"needs {', '.join(missing)}, which is not installed"
    if case.needs_cuda:
        import torch

        if not torch.cuda.is_available():
            return f"needs a CUDA GPU: {case.needs_cuda}"
    return None


def command(case: Case, out: str, python: str, only_naive: bool = False) -> list[str]:
    tail = ["-m", "loraflow.probes.worker", case.rule, "--out", out] + (["--only-naive"] if only_naive else [])
    if case.ranks == 1:
        return [python, *tail]
    return torchrun_argv(case.ranks, tail, python)


def run_case(case: Case, log_dir: Path, python: str = sys.executable, only_naive: bool = False) -> ProbeResult:
    from loraflow.probes.plan import predicted

    expected = predicted(case)
    reason = not_applicable(case)
    if reason:
        na = Observation("n/a", reason)
        return ProbeResult(case.rule, na, na, expected, what=case.what)
    out = str(log_dir / f"{case.rule}.jsonl")
    log = log_dir / f"{case.rule}.log"
    start = time.monotonic()
    code = run_isolated(command(case, out, python, only_naive), log, case.timeout)
    seconds = time.monotonic() - start
    modes = {}
    if os.path.exists(out):
        for line in open(out):
            row = json.loads(line)
            modes[row["mode"]] = Observation(row["status"], row["detail"])
    if "naive" not in modes:
        modes["naive"] = (Observation("timeout", f"no result within {case.timeout:.0f}s (a hang counts as broken)")
                          if code is None else
                          Observation("failed", f"the probe process exited with code {code} before reporting; "
                                                f"see {log}"))
    if "plan" not in modes:
        modes["plan"] = Observation("n/a", "not run" + ("" if only_naive else ": the naive run did not finish"))
    return ProbeResult(case.rule, modes["naive"], modes["plan"], expected, seconds, str(log), case.what)


def run_probes(only: list[str] | None = None, log_dir: str | None = None, progress=None) -> list[ProbeResult]:
    cases = all_cases()
    if only:
        unknown = [r for r in only if r not in cases]
        if unknown:
            from loraflow.errors import LoraflowError

            raise LoraflowError(f"--only: no probe for {', '.join(unknown)}; probes exist for "
                                f"{', '.join(sorted(cases))}.")
        cases = {r: cases[r] for r in only}
    directory = Path(log_dir or tempfile.mkdtemp(prefix="loraflow-probe-"))
    directory.mkdir(parents=True, exist_ok=True)

    def one(rule_id: str) -> ProbeResult:
        if progress:
            progress(rule_id)
        return run_case(cases[rule_id], directory)

    # One-process cases run one thread each (launch_env), two at a time: most of their time is start-up and
    # imports, and two cores take two of them. Two-rank cases use both cores and run alone, after them.
    from concurrent.futures import ThreadPoolExecutor

    single = [r for r, c in cases.items() if c.ranks == 1]
    with ThreadPoolExecutor(max_workers=2) as pool:
        done = dict(zip(single, pool.map(one, single)))
    done.update({r: one(r) for r, c in cases.items() if c.ranks > 1})
    return [done[r] for r in cases]  # in registry order, as the table lists them


def render_table(results: list[ProbeResult], versions: str) -> str:
    header = ("rule", "affected (naive)", "safe under loraflow", "registry", "s")
    rows = []
    for r in results:
        agree = {None: "-", True: "agrees", False: "DIFFERS"}[r.matches_registry]
        rows.append((r.rule, r.affected, r.safe, agree, f"{r.seconds:.0f}"))
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()
    out = [f"loraflow probe on {versions}", line(header), line(["-" * w for w in widths])]
    out += [line(row) for row in rows]
    out.append("")
    for r in results:
        out.append(f"{r.rule}: {r.what}")
        out.append(f"    naive: {r.naive.status}: {r.naive.detail}")
        out.append(f"    plan:  {r.plan.status}: {r.plan.detail}")
    return "\n".join(out)
