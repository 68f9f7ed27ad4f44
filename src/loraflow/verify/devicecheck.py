"""The device check: one command that proves loraflow on the machine at hand and writes what it found.

    bash scripts/gpu_check.sh [--out DIR] [--device cuda|cpu] [--quick]       (installs, then runs this)
    python -m loraflow.verify.devicecheck --out DIR --device cpu --quick      (this alone, on an installed stack)

Steps (verify/device_steps.py), in order: env (versions, device, bf16/fp32 matmul rates), grads (gradient
equivalence against the fp32 reference on the device), demo and qlora (the shipped configs end to end), vision (one
image-text step), rollout (GRPO on vLLM where it is installed), head (the output head alone: full logits against
loraflow's chunks), peers (loraflow, a plain PyTorch loop and TRL side by side on Llama-3.2-1B's shape in bf16). Each
step runs in its own process group, killed at its timeout; the steps share a time budget, and a step the budget
cannot fit any more is recorded as skipped. Each writes DIR/STEP.json and DIR/STEP.log; the summary comes last, as
DIR/summary.md (printed) and DIR/summary.json. Exit 0 when every step passed, 1 otherwise, 2 for bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

TIMEOUTS = {"env": (90, 120), "grads": (180, 300), "demo": (150, 240), "qlora": (150, 240), "vision": (120, 240),
            "rollout": (240, 240), "head": (60, 120), "peers": (300, 300)}
"""Seconds per step: (on a GPU at full size, --quick). A GPU run must leave room for a rerun within a 15-minute
lease (the default budget is 8 minutes); the CPU rehearsal runs the same steps at toy sizes."""
BUDGET = {False: 480, True: 900}
"""The whole check's default time budget in seconds (full, quick)."""
MIN_STEP = 20
"""A step is skipped rather than started with less than this left of the budget."""
PEERS_WORKER_TIMEOUT = {False: 90, True: 120}


def step_env(device: str) -> dict[str, str]:
    """The environment of every step: nothing fetched from the hub, and the CPU really used when asked for."""
    env = dict(os.environ)
    env.update(PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1")
    if device == "cpu":
        env.update(CUDA_VISIBLE_DEVICES="", DS_ACCELERATOR="cpu")
    return env


def run_all(out: Path, device: str, quick: bool, budget: float, only: list[str] | None, root: Path) -> int:
    from loraflow.engines.launch import run_isolated
    from loraflow.verify.device_steps import STEPS

    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    records: dict[str, dict[str, Any]] = {}
    for name in STEPS:
        if only and name not in only and name != "env":  # env always: the summary's device and versions
            continue
        left = budget - (time.monotonic() - start)
        timeout = min(TIMEOUTS[name][quick], left)
        if timeout < MIN_STEP:
            records[name] = {"status": "skipped", "headline": f"the time budget ({budget:.0f} s) was spent",
                             "seconds": 0}
            continue
        print(f"[{time.monotonic() - start:5.0f} s] {name} (at most {timeout:.0f} s) ...", flush=True)
        result_path, log = out / f"{name}.json", out / f"{name}.log"
        result_path.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "loraflow.verify.devicecheck", "--step", name, "--out", str(out),
                "--device", device, "--root", str(root), "--deadline", f"{time.time() + timeout:.0f}"]
        argv += ["--quick"] if quick else []
        t0 = time.monotonic()
        code = run_isolated(argv, log, timeout, env=step_env(device), cwd=str(root))
        seconds = round(time.monotonic() - t0, 1)
        if result_path.exists():
            record = json.loads(result_path.read_text())
        elif code is None:
            record = {"status": "timeout", "headline": f"killed after {timeout:.0f} s; the end of {log.name}: "
                                                       + _last_line(log)}
        else:
            record = {"status": "error", "headline": f"exit {code}; the end of {log.name}: " + _last_line(log)}
        record["seconds"] = seconds
        result_path.write_text(json.dumps(record, indent=2, default=str))
        records[name] = record
        print(f"[{time.monotonic() - start:5.0f} s] {name}: {record['status']} - {record['headline']}", flush=True)
    summary = render(records, device, quick, time.monotonic() - start, budget)
    (out / "summary.md").write_text(summary)
    (out / "summary.json").write_text(json.dumps({"device": device, "quick": quick, "steps": records}, indent=2,
                                                 default=str))
    print("\n" + summary)
    # `unavailable`: the machine lacks what the step needs (vLLM), and the step said so; it fails nothing.
    return 0 if records and all(r["status"] in ("pass", "unavailable") for r in records.values()) else 1


def _last_line(log: Path) -> str:
    try:
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "(no log)"
    return lines[-1][-300:] if lines else "(empty log)"


def render(records: dict[str, dict[str, Any]], device: str, quick: bool, seconds: float, budget: float) -> str:
    """The summary: one row per step, then the gradient cells and the peers' table."""
    env = records.get("env", {}).get("figures", {})
    passed = sum(r["status"] == "pass" for r in records.values())
    lines = [f"# loraflow device check: {passed}/{len(records)} steps pass",
             "", f"- device: {env.get('device_name', device)} ({device}{', quick' if quick else ''})",
             f"- versions: {' / '.join((env.get('loraflow_version') or 'unknown').splitlines())}",
             f"- time: {seconds:.0f} s of a {budget:.0f} s budget", "",
             "| step | result | seconds | figures |", "| --- | --- | ---: | --- |"]
    for name, r in records.items():
        headline = str(r.get("headline", "")).replace("|", "/").replace("\n", " ")
        lines.append(f"| {name} | {r['status']} | {r.get('seconds', 0):.0f} | {headline} |")
    rows = records.get("grads", {}).get("rows") or []
    if rows:
        lines += ["", "## Gradient equivalence (relative error against the one-process fp32 reference)", "",
                  "| cell | result | gradient | loss | limit (grad / loss) |", "| --- | --- | ---: | ---: | --- |"]
        for row in rows:
            if "grad_error" in row:
                lines.append(f"| {row['cell']} | {row['verdict']} | {row['grad_error']:.1e} | {row['loss_error']:.1e}"
                             f" | {row['limits']['grad']:.2g} / {row['limits']['loss']:.2g} |")
            else:
                why = str(row.get("rule") or row.get("message", "")).replace("|", "/").replace("\n", " ")[:160]
                lines.append(f"| {row['cell']} | {row['verdict']} | - | - | {why} |")
    peers = records.get("peers", {}).get("figures") or {}
    if peers:
        lines += ["", "## Peers (median step; MFU against the datasheet peak where known, else the measured rate)",
                  "", "| cell | variant | tokens/s | MFU % | peak GPU MiB | peak RSS MB | first loss |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
        for cell, variants in peers.items():
            for variant, f in variants.items():
                if f.get("error"):
                    lines.append(f"| {cell} | {variant} | failed: {f['error']} | | | | |")
                    continue
                mfu = f.get("mfu_nominal") or f.get("mfu")
                lines.append(f"| {cell} | {variant} | {_num(f.get('tokens_per_s'), ',.0f')} | "
                             f"{_num(mfu and 100 * mfu, '.1f')} | {_num(f.get('cuda_max_memory_mb'), ',.0f')} | "
                             f"{_num(f.get('peak_rss_mb'), ',.0f')} | {_num(f.get('first_loss'), '.5f')} |")
    return "\n".join(lines) + "\n"


def _num(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def run_step(name: str, out: Path, device: str, quick: bool, root: Path, deadline: float) -> int:
    """One step in this process (the runner starts it): its record to out/NAME.json."""
    import warnings

    from loraflow.run.log import setup_logging
    from loraflow.verify.device_steps import STEPS

    warnings.filterwarnings("ignore")
    setup_logging(None, main=False)
    work = out / "work"
    # A check run again into the same --out starts each step from nothing: the step's scratch from the last run
    # would otherwise be refused as a run to resume (output.dir already holds a run).
    shutil.rmtree(work / name, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    ctx = {"dir": out, "work": work, "log": out / f"{name}.steps.log", "device": device, "quick": quick,
           "root": root, "peers_worker_timeout": PEERS_WORKER_TIMEOUT[quick], "deadline": deadline}
    record = STEPS[name](ctx)
    (out / f"{name}.json").write_text(json.dumps(record, indent=2, default=str))
    return 0


def main(argv: list[str] | None = None) -> int:
    from loraflow.verify.device_steps import STEPS

    p = argparse.ArgumentParser(prog="python -m loraflow.verify.devicecheck", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="directory for the results (created)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--quick", action="store_true", help="the same steps at tiny sizes (the CPU rehearsal)")
    p.add_argument("--budget", type=float, help=f"seconds for the whole check (default {BUDGET[False]}, "
                                                f"{BUDGET[True]} with --quick)")
    p.add_argument("--only", help=f"comma-separated steps to run (of {', '.join(STEPS)}); env runs always")
    p.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[3],
                   help="the loraflow checkout (benchmarks/ and examples/ are read from it)")
    p.add_argument("--step", choices=list(STEPS), help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, help=argparse.SUPPRESS)  # a step's end (time.time()) in the runner
    args = p.parse_args(argv)
    if not (args.root / "benchmarks" / "peers.py").exists():
        p.error(f"--root {args.root}: not a loraflow checkout (no benchmarks/peers.py); run from the repository")
    if args.step:
        return run_step(args.step, args.out, args.device, args.quick, args.root,
                        args.deadline or time.time() + TIMEOUTS[args.step][args.quick])
    only = [s.strip() for s in args.only.split(",")] if args.only else None
    unknown = [s for s in only or [] if s not in STEPS]
    if unknown:
        p.error(f"--only: unknown step(s) {', '.join(unknown)}; the steps are {', '.join(STEPS)}")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("error: --device cuda, but torch sees no CUDA device (torch.cuda.is_available() is False; torch "
                  f"{torch.__version__}). Run on a GPU machine, or give --device cpu for the CPU rehearsal.",
                  file=sys.stderr)
            return 2
    budget = args.budget or BUDGET[args.quick]
    return run_all(args.out, args.device, args.quick, budget, only, args.root.resolve())


if __name__ == "__main__":
    sys.exit(main())
