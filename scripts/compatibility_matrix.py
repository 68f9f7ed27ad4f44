"""Run every adapter x checkpointing x engine x precision x quantization cell of a text model, and every tower setup
x checkpointing x engine cell of an image-text model, on 2 CPU processes and write docs/compatibility-matrix.md
from the results.

    python scripts/compatibility_matrix.py                      # all 252 cells, writes docs/compatibility-matrix.md
    python scripts/compatibility_matrix.py --only-engines ddp,zero3 --out /tmp/m.md --json /tmp/m.json
    python scripts/compatibility_matrix.py --skip-text --image-text-model DIR --image-text-data FILE --out /tmp/m.md

Measuring is loraflow.verify.crosscheck's (the same worker and comparison as tests/distributed/test_engines.py and
test_image_text_engines.py); this script only launches it per group of cells (the cells, their groups and their
judging: scripts/matrix_cells.py; the markdown: scripts/matrix_render.py). Per model (the text model's groups first,
then the image-text model's):

- the references (one process, fp32, no checkpointing, engine single; an nf4 cell's on the dequantized base), one
  plain process;
- the `single` engine cells (checkpointing and bf16-mixed in one process), one plain process;
- each other engine's cells (text: 36, both quantizations; image-text: 6, both tower setups), one
  `torchrun --nproc_per_node 2` launch (gloo, OMP_NUM_THREADS=1, DS_ACCELERATOR=cpu), bounded by --timeout. A
  launch that hangs or dies keeps the cells it finished (the worker saves after every cell); the cell in flight is
  marked timeout / error and the rest are launched again.

Exit code 1 when an fp32 cell fails its criterion, crashes or times out.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import platform
import re
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

if str(Path(__file__).resolve().parent) not in sys.path:  # matrix_*.py, also when loaded by path (the tests)
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from matrix_cells import (
    ENGINES,
    IMAGE_TEXT,
    RANKS,
    VERDICTS,
    evaluate,
    failed_fp32,
    groups,
    judge_fp32,
)
from matrix_render import COMMAND, fmt_time, render_markdown

from loraflow.engines.launch import launch_env, run_isolated
from loraflow.locations import ASSETS
from loraflow.verify.crosscheck import Cell, worker_argv

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "docs" / "compatibility-matrix.md"
IMAGE_TEXT_MODEL = "builtin:tiny-vlm"
IMAGE_TEXT_DATA = "builtin:shapes/train.jsonl"
"""The embedded image-text demo (src/loraflow/assets/tiny-vlm, shapes): a tiny LLaVA and its image chat data."""


# --- running ----------------------------------------------------------------------------------------------------


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_group(name: str, cells: list[Cell], model: str, data: str, workdir: Path, timeout: float,
              max_relaunches: int = 2, started: float | None = None) -> dict[str, dict[str, Any]]:
    """Run one group's cells (reference: one plain process with --reference; single: one plain process; else
    torchrun on RANKS ranks; an image-text group's name has the IMAGE_TEXT prefix) and return the worker's raw
    record per cell id."""
    started = time.monotonic() if started is None else started
    results: dict[str, dict[str, Any]] = {}
    todo, launches = list(cells), 0
    while todo:
        launches += 1
        tag = f"{name}.{launches}"
        logfile = workdir / f"{tag}.log"
        kind = name.removeprefix(IMAGE_TEXT)
        one = kind in ("reference", "single")
        argv, out = worker_argv(todo, model, data, workdir, tag, 1 if one else RANKS, reference=kind == "reference")
        how = "one process" if one else f"torchrun, {RANKS} ranks, port {argv[argv.index('--master_port') + 1]}"
        code = _wait(tag, how, argv, logfile, timeout, [c.id for c in todo], started)
        got = torch.load(out, weights_only=False)["results"] if out.exists() else {}
        results.update(got)
        missing = [c for c in todo if c.id not in got]
        if code == 0 and not missing:
            break
        if not missing:  # every cell recorded, then the launch failed on the way out: the figures stand
            log(f"[{tag}] {'timed out' if code is None else f'exited with {code}'} after its last cell; results kept")
            break
        stuck, todo = missing[0], missing[1:]
        tail_text = _log_tail(logfile)
        if code is None:
            results[stuck.id] = {"status": "timeout", "message": f"no result {timeout:.0f}s into its launch",
                                 "log": tail_text}
        else:
            results[stuck.id] = {"status": "error", "message": f"worker exited with code {code}: "
                                 f"{_last_error(tail_text)}", "log": tail_text}
        log(f"[{tag}] {results[stuck.id]['status']} in {stuck.id}; cells left: {len(todo)}")
        if todo and launches > max_relaunches:
            for c in todo:
                results[c.id] = {"status": "timeout" if code is None else "error",
                                 "message": f"not run: {launches} launches of group {name} failed"}
            break
    return results


def _wait(tag: str, how: str, argv: list[str], logfile: Path, timeout: float, ids: list[str],
          started: float) -> int | None:
    """run_isolated in a thread (it kills the process group on timeout); report progress from the log meanwhile.
    Returns the exit code, None after a timeout."""
    t0 = time.monotonic()
    log(f"[{tag}] {len(ids)} cells, {how}, limit {fmt_time(timeout)}")
    seen: set[str] = set()
    pattern = re.compile(r"^(\S+/\S+/\S+/\S+): (\w+) ?(.*)$")  # \S+ spans the optional /nf4 too
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(run_isolated, argv, logfile, timeout, launch_env())
        last_beat = t0
        while True:
            try:
                code = future.result(timeout=2)
                finished = True
            except concurrent.futures.TimeoutError:
                finished = False
            for line in (logfile.read_text(errors="replace").splitlines() if logfile.exists() else []):
                m = pattern.match(line)
                if m and m.group(1) in ids and m.group(1) not in seen:
                    seen.add(m.group(1))
                    log(f"[{tag}] {len(seen)}/{len(ids)} {m.group(1)}: {m.group(2)} {m.group(3)[:120]}  "
                        f"({fmt_time(time.monotonic() - t0)} in group, {fmt_time(time.monotonic() - started)} total)")
            now = time.monotonic()
            if finished:
                break
            if now - last_beat >= 30:
                last_beat = now
                log(f"[{tag}] running, {len(seen)}/{len(ids)} cells done, {fmt_time(now - t0)} in group "
                    f"(limit {fmt_time(timeout)}), {fmt_time(now - started)} total")
    log(f"[{tag}] {'timed out' if code is None else f'exit {code}'} after {fmt_time(time.monotonic() - t0)}")
    return code


def _log_tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def _last_error(text: str) -> str:
    """The line that says why a worker died: a signal that killed a rank (torchrun's report), else the last error
    line that is not torchrun's own ChildFailedError wrapper."""
    lines = text.splitlines()
    signals = [line for line in lines if re.search(r"Signal \d+|exitcode\s*:\s*-\d+", line)]
    errors = [line for line in lines if re.search(r"(Error|Exception|error:)", line)
              and "torch.distributed.elastic" not in line]
    pick = signals or errors or [line for line in lines if line.strip()][-1:] or [""]
    return pick[-1].strip()[:300]


# --- meta and main ----------------------------------------------------------------------------------------------


def versions() -> dict[str, str]:
    out = {}
    for pkg in ("torch", "transformers", "peft", "deepspeed", "bitsandbytes"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    out["python"] = platform.python_version()
    return out


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def display_path(path: str) -> str:
    if path.startswith("builtin:"):
        return path
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(ASSETS / "tiny-base"))
    p.add_argument("--data", default=str(ASSETS / "reverse" / "train.jsonl"))
    p.add_argument("--image-text-model", default=IMAGE_TEXT_MODEL, help="the image-text cells' model")
    p.add_argument("--image-text-data", default=IMAGE_TEXT_DATA, help="the image-text cells' data")
    p.add_argument("--only-engines", default=",".join(ENGINES),
                   help="comma-separated engines to run (text: single always runs, it holds the bf16 yardsticks)")
    skip = p.add_mutually_exclusive_group()
    skip.add_argument("--skip-image-text", action="store_true", help="run the text model's cells only")
    skip.add_argument("--skip-text", action="store_true", help="run the image-text model's cells only")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="markdown to write")
    p.add_argument("--json", default=None, help="also write the raw figures here")
    p.add_argument("--timeout", type=float, default=900, help="seconds per launch")
    p.add_argument("--from-json", default=None, metavar="JSON",
                   help="judge and render a run's --json again (after a change of criterion) instead of running")
    args = p.parse_args(argv)
    if args.from_json:
        return rerender(Path(args.from_json), Path(args.out))
    engines = [e.strip() for e in args.only_engines.split(",") if e.strip()]
    unknown = set(engines) - set(ENGINES)
    if unknown:
        p.error(f"unknown engines {sorted(unknown)}; choose from {', '.join(ENGINES)}")
    if not args.skip_image_text:  # before minutes of text cells, not after them
        from loraflow.errors import ConfigError
        from loraflow.locations import location_of

        for flag, spec in (("--image-text-model", args.image_text_model), ("--image-text-data", args.image_text_data)):
            try:
                location_of(spec, flag)
            except ConfigError as exc:
                p.error(f"{exc} Name an image-text model and data with --image-text-model / --image-text-data, or "
                        "pass --skip-image-text.")

    started = time.monotonic()
    raw: dict[str, dict[str, Any]] = {}
    references: dict[str, dict[str, Any]] = {}
    group_s: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="compat-matrix-") as tmp:
        for name, cells in groups(engines, text=not args.skip_text, image_text=not args.skip_image_text).items():
            image = name.startswith(IMAGE_TEXT)
            model, data = (args.image_text_model, args.image_text_data) if image else (args.model, args.data)
            t0 = time.monotonic()
            got = run_group(name, cells, model, data, Path(tmp), args.timeout, started=started)
            group_s[name] = time.monotonic() - t0
            (references if name.removeprefix(IMAGE_TEXT) == "reference" else raw).update(got)
    records = evaluate(raw, references)
    meta = {**versions(), "cpu": cpu_name(), "date": datetime.datetime.now(datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M UTC"), "wall_s": time.monotonic() - started, "group_s": group_s,
            "model": display_path(args.model), "data": display_path(args.data),
            "image_text_model": display_path(args.image_text_model),
            "image_text_data": display_path(args.image_text_data), "engines": engines}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(render_markdown(records, meta))
    log(f"wrote {args.out} in {fmt_time(meta['wall_s'])}")
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "cells": records}, indent=1))
        log(f"wrote {args.json}")
    counts = {v: sum(r["verdict"] == v for r in records.values()) for v in VERDICTS}
    log("cells: " + ", ".join(f"{n} {v}" for v, n in counts.items() if n))
    bad = failed_fp32(records)
    for cid in bad:
        log(f"fp32 cell {cid}: {records[cid]['verdict']} {records[cid].get('message', '')[:300]}")
    return 1 if bad else 0


def rerender(saved: Path, out: Path) -> int:
    """The document of a saved run (its --json), each fp32 cell judged again by today's criterion."""
    run = json.loads(saved.read_text())
    records = run["cells"]
    for cid, rec in records.items():
        cell = Cell.from_id(cid)
        if cell.precision == "fp32" and rec.get("verdict") in ("pass", "fail"):
            rec["criterion"], ok = judge_fp32(cell, rec)
            rec["verdict"] = "pass" if ok else "fail"
    out.write_text(render_markdown(records, run["meta"]))
    log(f"wrote {out} from {saved}")
    bad = failed_fp32(records)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
