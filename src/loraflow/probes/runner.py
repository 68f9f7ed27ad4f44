"""Run probe cases in subprocesses; report.py words each outcome for the user's stack and prints the table.

The runner never runs a case itself, so a crash or a hang cannot take it down. One-process cases each run in a
process of their own with a timeout, forked from `run_probes`, which imports torch, transformers and peft once
before the first fork (about 6 s of every case's start-up on 2 cores). Two-rank cases share one torchrun launch
(worker --batch-dir: one start-up per rank instead of one per case, 15 cases in about 30 s instead of 150); a case
that ends that launch early, or one it did not reach, runs again in a launch of its own, so global state DeepSpeed
leaves behind after a failure cannot decide another case's result. tests/probes/test_probe.py compares every
result with the registry's prediction.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from loraflow.engines.launch import launch_env, run_isolated, torchrun_argv
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
        if self.naive.status in ("n/a", "unavailable", "failed"):
            return self.naive.status  # not applicable or not installed here, or the probe broke: neither yes nor no
        return "yes" if self.naive.broken else "no"

    @property
    def safe(self) -> str:
        if self.plan.status in ("n/a", "unavailable", "failed"):
            return self.plan.status
        return "no" if self.plan.broken else "yes"

    @property
    def matches_registry(self) -> bool | None:
        return None if self.affected not in ("yes", "no") else (self.affected == "yes") == self.predicted

    def to_dict(self) -> dict:
        from loraflow.probes.report import verdict

        meaning = verdict(self)
        return {"rule": self.rule, "affected": self.affected, "safe_under_loraflow": self.safe,
                "registry_predicts_affected": self.predicted, "matches_registry": self.matches_registry,
                "verdict": meaning.key, "meaning": meaning.meaning,
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
    """One case in a fresh interpreter (`python`: another environment's, for captured logs), with the servers it
    names."""
    from loraflow.probes.plan import predicted
    from loraflow.probes.vllm_servers import servers_for

    reason = not_applicable(case)
    if reason:
        na = Observation("n/a", reason)
        return ProbeResult(case.rule, na, na, predicted(case), what=case.what)
    out, log = _paths(case, log_dir)
    with servers_for([case] if case.servers else [], log_dir) as servers:
        problem = servers.ready() if case.servers else None
        if problem is not None:
            return ProbeResult(case.rule, problem, problem, predicted(case), what=case.what)
        start = time.monotonic()
        code = run_isolated(command(case, out, python, only_naive), log, case.timeout)
    return _collect(case, out, log, code, time.monotonic() - start, only_naive)


def _paths(case: Case, log_dir: Path) -> tuple[str, Path]:
    return str(log_dir / f"{case.rule}.jsonl"), log_dir / f"{case.rule}.log"


def _collect(case: Case, out: str, log: Path, code: int | None, seconds: float, only_naive: bool) -> ProbeResult:
    """The case's result from what its process wrote to `out` (code None: it was killed at its timeout)."""
    from loraflow.probes.plan import predicted

    modes = {}
    if os.path.exists(out):
        for line in open(out):
            row = json.loads(line)
            modes[row["mode"]] = Observation(row["status"], row["detail"], row.get("values", {}))
    if "naive" not in modes:
        modes["naive"] = (Observation("timeout", f"no result within {case.timeout:.0f}s (a hang counts as broken)")
                          if code is None else
                          Observation("failed", f"the probe process exited with code {code} before reporting; "
                                                f"see {log}"))
    if "plan" not in modes:
        modes["plan"] = Observation("n/a", "not run" + ("" if only_naive else ": the naive run did not finish"))
    return ProbeResult(case.rule, modes["naive"], modes["plan"], predicted(case), seconds, str(log), case.what)


def _fork_case(case: Case, out: str, log: Path) -> int:
    """Start one one-process case in a forked child of this (pre-imported) process; returns its pid. The child
    gets its own session (so a timeout kills all it started), the log as stdout and stderr, one thread (as
    launch_env gives a fresh interpreter), and leaves with os._exit: nothing of it returns here."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        os.setsid()
        sink = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(sink, 1)
        os.dup2(sink, 2)
        os.environ.update(launch_env())
        import torch

        torch.set_num_threads(1)
        from loraflow.probes.worker import main

        code = main([case.rule, "--out", out]) or 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _run_forked(cases: list[Case], log_dir: Path, progress=None, jobs: int = 2) -> dict[str, ProbeResult]:
    """One-process cases, `jobs` at a time, each in a forked child (see the module's docstring). Forks happen on
    this thread only: forking while other threads hold locks would leave the child with them held."""
    import signal

    from loraflow.probes.plan import predicted

    _preimport()
    pending, running, done = list(cases), {}, {}
    while pending or running:
        while pending and len(running) < jobs:
            case = pending.pop(0)
            if progress:
                progress(case.rule)
            reason = not_applicable(case)
            if reason:
                na = Observation("n/a", reason)
                done[case.rule] = ProbeResult(case.rule, na, na, predicted(case), what=case.what)
                continue
            out, log = _paths(case, log_dir)
            running[_fork_case(case, out, log)] = (case, out, log, time.monotonic())
        pid, status = _reap(running)
        if pid == 0:
            for child, (case, out, log, start) in list(running.items()):
                if time.monotonic() - start > case.timeout:
                    os.killpg(child, signal.SIGKILL)
                    os.waitpid(child, 0)
                    del running[child]
                    done[case.rule] = _collect(case, out, log, None, time.monotonic() - start, False)
            time.sleep(0.05)
            continue
        case, out, log, start = running.pop(pid)
        done[case.rule] = _collect(case, out, log, os.waitstatus_to_exitcode(status), time.monotonic() - start,
                                   False)
    return done


def _reap(running: dict[int, tuple]) -> tuple[int, int]:
    """(pid, wait status) of one case child that ended, or (0, 0). Only the cases are waited for: the vLLM
    servers of the rollout cases are children of this process too, and their own Popen must see them end."""
    for child in running:
        pid, status = os.waitpid(child, os.WNOHANG)
        if pid:
            return pid, status
    return 0, 0


def _run_served(cases: list[Case], servers, log_dir: Path, progress=None) -> dict[str, ProbeResult]:
    """The cases that run against shared servers, once the servers answer, one at a time (they share the servers'
    state: a merged sync reloads the served weights in place). When the servers cannot run (no vLLM environment
    here, or one did not start), every such case reports why instead."""
    from loraflow.probes.plan import predicted

    if not cases:
        return {}
    problem = servers.ready()
    if problem is None:
        return _run_forked(cases, log_dir, progress, jobs=1)
    return {c.rule: ProbeResult(c.rule, problem, problem, predicted(c), what=c.what) for c in cases}


def _preimport() -> None:
    """What every one-process case imports, loaded once before the first fork. DeepSpeed is left to the children
    that need it: it reads DS_ACCELERATOR when imported."""
    import peft  # noqa: F401
    import transformers  # noqa: F401


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

    # One-process cases run one thread each, two at a time, forked from this process after one import of torch,
    # transformers and peft. The servers the rollout cases share start first and boot while those run; the rollout
    # cases follow, then the servers stop. Two-rank cases use both cores and run alone, last, under torchrun.
    from loraflow.probes.vllm_servers import servers_for

    one = [c for c in cases.values() if c.ranks == 1]
    served = [c for c in one if c.servers]
    if served:
        _preimport()  # before the demo base is written in a forked child, which then imports nothing anew
    with servers_for(served, directory) as servers:
        done = _run_forked([c for c in one if not c.servers], directory, progress)
        done.update(_run_served(served, servers, directory, progress))
    done.update(_run_two_rank([c for c in cases.values() if c.ranks > 1], directory, progress))
    return [done[r] for r in cases]  # in registry order, as the table lists them


def _run_two_rank(cases: list[Case], log_dir: Path, progress=None) -> dict[str, ProbeResult]:
    """Two-rank cases in one torchrun launch (worker --batch-dir); any case the batch did not finish (a crash, ranks
    left apart, the timeout) runs again in a launch of its own, as every case did before batching."""
    out: dict[str, ProbeResult] = {}
    batch = [c for c in cases if not not_applicable(c) and c.ranks == 2]
    if len(batch) > 1:
        if progress:
            progress(", ".join(c.rule for c in batch))
        batch_dir = log_dir / "two-rank-batch"
        batch_dir.mkdir(exist_ok=True)
        log = log_dir / "two-rank-batch.log"
        tail = ["-m", "loraflow.probes.worker", *(c.rule for c in batch), "--batch-dir", str(batch_dir)]
        start = time.monotonic()
        code = run_isolated(torchrun_argv(2, tail), log, sum(c.timeout for c in batch))
        seconds = (time.monotonic() - start) / len(batch)
        for case in batch:
            path = batch_dir / f"{case.rule}.jsonl"
            if path.exists():
                out[case.rule] = _collect(case, str(path), log, code, seconds, False)
    for case in cases:
        if case.rule not in out:
            if progress:
                progress(case.rule)
            out[case.rule] = run_case(case, log_dir)
    return out

