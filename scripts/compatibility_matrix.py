"""Run every adapter x checkpointing x engine x precision x quantization cell on 2 CPU processes and write
docs/compatibility-matrix.md from the results.

    python scripts/compatibility_matrix.py                      # all 216 cells, writes docs/compatibility-matrix.md
    python scripts/compatibility_matrix.py --only-engines ddp,zero3 --out /tmp/m.md --json /tmp/m.json

Measuring is loraflow.verify.crosscheck's (the same worker and comparison as tests/distributed/test_engines.py);
this script only launches it per group of cells, judges each cell and renders the tables:

- the references (one process, fp32, no checkpointing, engine single; an nf4 cell's on the dequantized base), one
  plain process;
- the `single` engine cells (checkpointing and bf16-mixed in one process), one plain process;
- each other engine's 36 cells (both quantizations), one `torchrun --nproc_per_node 2` launch (gloo,
  OMP_NUM_THREADS=1, DS_ACCELERATOR=cpu), bounded by --timeout. A launch that hangs or dies keeps the cells it
  finished (the worker saves after every cell); the cell in flight is marked timeout / error and the rest are
  launched again.

Exit code 1 when an fp32 cell fails its criterion, crashes or times out.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import itertools
import json
import math
import platform
import re
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from loraflow.engines.launch import launch_env, run_isolated
from loraflow.setup.model import ASSETS
from loraflow.verify.crosscheck import GLOBAL_BATCH, STEPS, Cell, compare, worker_argv

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "docs" / "compatibility-matrix.md"
COMMAND = "python scripts/compatibility_matrix.py"

ADAPTERS = ("lora", "dora", "full")
CHECKPOINTING = ("off", "reentrant", "non-reentrant")
ENGINES = ("single", "ddp", "zero2", "zero3", "zero3-offload", "fsdp2")
PRECISIONS = ("fp32", "bf16-mixed")
QUANTIZATIONS = ("none", "nf4")
"""model.quantization.method; nf4 = QLoRA (bitsandbytes NF4, double quantization). Full fine-tuning of a 4-bit base
is refused by the plan (rule kbit-full-finetune)."""
RANKS = 2

FP32_TOLERANCE = 1e-5
"""fp32 cells: gradient and every step's loss within this relative error of the reference (as
tests/distributed/test_engines.py)."""
BF16_FACTOR = 2.0
"""bf16-mixed cells: gradient error against the fp32 reference at most this times the error that bf16-mixed
costs in one process (the yardstick: the single-process bf16-mixed cell of the same adapter and quantization without
checkpointing)."""

VERDICTS = ("pass", "fail", "refused", "error", "timeout", "not run")


# --- the cells --------------------------------------------------------------------------------------------------


def all_cells() -> list[Cell]:
    """The 216 cells, in table order: quantization, precision, adapter, checkpointing, engine."""
    return [Cell(adapter, ckpt, precision, engine, quantization=quant) for quant, precision, adapter, ckpt, engine
            in itertools.product(QUANTIZATIONS, PRECISIONS, ADAPTERS, CHECKPOINTING, ENGINES)]


def yardstick(cell: Cell) -> Cell:
    """The same-precision, same-quantization single-process cell a cell's precision is judged by (itself for fp32
    references)."""
    return Cell(cell.adapter, "off", cell.precision, "single", quantization=cell.quantization)


def groups(engines: list[str]) -> dict[str, list[Cell]]:
    """Launch groups in run order, one launch per engine for both quantizations (a launch's start-up, torchrun and
    imports, costs more than most cells). `single` always runs: its bf16-mixed cells are the yardsticks."""
    cells = [c for c in all_cells() if c.engine in engines or c.engine == "single"]
    out: dict[str, list[Cell]] = {"reference": list(dict.fromkeys(c.reference() for c in cells))}
    for engine in ENGINES:
        if any(c.engine == engine for c in cells):
            out[engine] = [c for c in cells if c.engine == engine]
    return out


# --- running ----------------------------------------------------------------------------------------------------


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def fmt_time(seconds: float) -> str:
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def run_group(name: str, cells: list[Cell], model: str, data: str, workdir: Path, timeout: float,
              max_relaunches: int = 2, started: float | None = None) -> dict[str, dict[str, Any]]:
    """Run one group's cells (reference: one plain process with --reference; single: one plain process; else
    torchrun on RANKS ranks) and return the worker's raw record per cell id."""
    started = time.monotonic() if started is None else started
    results: dict[str, dict[str, Any]] = {}
    todo, launches = list(cells), 0
    while todo:
        launches += 1
        tag = f"{name}.{launches}"
        logfile = workdir / f"{tag}.log"
        one = name in ("reference", "single")
        argv, out = worker_argv(todo, model, data, workdir, tag, 1 if one else RANKS, reference=name == "reference")
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
    lines = [line for line in text.splitlines() if re.search(r"(Error|Exception|error:)", line)]
    return (lines[-1] if lines else (text.strip().splitlines() or [""])[-1]).strip()[:300]


# --- judging ----------------------------------------------------------------------------------------------------


def evaluate(raw: dict[str, dict[str, Any]], references: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Judge every cell of the matrix from the workers' raw records. `references`: reference cell id -> record.
    Returns cell id -> a JSON-able record with `verdict` (one of VERDICTS), the figures and why."""
    out: dict[str, dict[str, Any]] = {}
    for cell in all_cells():  # fp32 before bf16-mixed: yardsticks are judged before the cells that use them
        if cell.id not in raw:
            out[cell.id] = {"verdict": "not run"}
            continue
        mine = raw[cell.id]
        if mine.get("status") == "refused":  # refused whatever its reference did (full/nf4 refuses both alike)
            out[cell.id] = {"status": "refused", "verdict": "refused", "rule": mine.get("rule") or "config",
                            "message": mine.get("message", "")}
            continue
        ref = references.get(cell.reference().id)
        if not ref or ref.get("status") != "ok":
            out[cell.id] = {"verdict": "error", "message": f"reference {cell.reference().id} did not run: "
                            f"{(ref or {}).get('message', 'missing')}"}
            continue
        r = compare(raw[cell.id], ref)
        rec: dict[str, Any] = {"status": r["status"]}
        if r["status"] == "refused":
            rec.update(verdict="refused", rule=r.get("rule") or "config", message=r.get("message", ""))
        elif r["status"] != "ok":
            rec.update(verdict="timeout" if r["status"] == "timeout" else "error", message=r.get("message", ""))
        else:
            rec.update({k: r[k] for k in ("grad_error", "worst", "loss_error", "weight_error", "rules", "losses")})
            if cell.precision == "fp32":
                rec["criterion"] = f"gradient and loss error <= {FP32_TOLERANCE:.0e}"
                ok = rec["grad_error"] <= FP32_TOLERANCE and rec["loss_error"] <= FP32_TOLERANCE
            else:
                stick = raw.get(yardstick(cell).id, {})
                if stick.get("status") != "ok":
                    rec.update(verdict="error", message=f"yardstick {yardstick(cell).id} did not run")
                    out[cell.id] = rec
                    continue
                limit = BF16_FACTOR * compare(stick, ref)["grad_error"]
                same = compare(raw[cell.id], stick)
                rec.update(same_precision_error=same["grad_error"], same_precision_loss_error=same["loss_error"],
                           limit=limit, criterion=f"gradient error <= {BF16_FACTOR:g} x {yardstick(cell).id}'s")
                ok = rec["grad_error"] <= limit
            rec["verdict"] = "pass" if ok else "fail"
        out[cell.id] = rec
    return out


def failed_fp32(records: dict[str, dict[str, Any]]) -> list[str]:
    return [cid for cid, r in records.items() if Cell.from_id(cid).precision == "fp32"
            and r["verdict"] in ("fail", "error", "timeout")]


# --- rendering --------------------------------------------------------------------------------------------------


def fmt_error(x: float) -> str:
    if x == 0:
        return "0"
    if math.isinf(x):
        return "inf"
    return f"{x:.1e}"


def rule_keys(records: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Rule id -> short key (a, b, ...) for every rule the plan applied in some cell."""
    rules = sorted({rule for r in records.values() for rule in r.get("rules", [])})
    return {rule: chr(ord("a") + i) for i, rule in enumerate(rules)}


def part_label(quant: str, precision: str) -> str:
    """"fp32", "bf16-mixed", "nf4 fp32", ...: how the summary and the table titles name a quantization and
    precision (unquantized cells keep the names they had before the quantization axis)."""
    return precision if quant == "none" else f"{quant} {precision}"


def render_markdown(records: dict[str, dict[str, Any]], meta: dict[str, Any]) -> str:
    """docs/compatibility-matrix.md from evaluate()'s records and the run's meta (versions, date, times)."""
    keys = rule_keys(records)
    notes: list[str] = []  # E1, E2 ...: errors and timeouts, in full below the tables
    cells = all_cells()

    def entry(cell: Cell, figure: str = "grad_error") -> str:
        r = records.get(cell.id, {"verdict": "not run"})
        v = r["verdict"]
        if v == "not run":
            return "not run"
        if v == "refused":
            return f"refused: `{r['rule']}`"
        if v in ("error", "timeout"):
            if figure != "grad_error":
                return v
            notes.append(f"{cell.id}: {r.get('message', '')}")
            kind = re.match(r"([A-Za-z_][\w.]*): ", r.get("message", ""))  # "RuntimeError: ..." -> RuntimeError
            short = kind.group(1)[-40:] if kind and v == "error" else ""
            return f"{v}: {short} (E{len(notes)})" if short else f"{v} (E{len(notes)})"
        text = fmt_error(r[figure])
        if figure == "grad_error":
            if v == "fail":
                text = f"**FAIL {text}**"
            if cell.precision != "fp32" and cell == yardstick(cell):
                text += " (yardstick)"
            if r.get("rules"):
                text += f" [{','.join(keys[k] for k in r['rules'])}]"
        return text

    def table(quant: str, precision: str, figure: str = "grad_error") -> list[str]:
        lines = ["| adapter | checkpointing | " + " | ".join(ENGINES) + " |",
                 "|---|---|" + "---|" * len(ENGINES)]
        for adapter, ckpt in itertools.product(ADAPTERS, CHECKPOINTING):
            row = [entry(Cell(adapter, ckpt, precision, e, quantization=quant), figure) for e in ENGINES]
            lines.append(f"| {adapter} | {ckpt} | " + " | ".join(row) + " |")
        return lines

    def verdict_of(c: Cell) -> str:
        return records.get(c.id, {"verdict": "not run"})["verdict"]

    counts = {v: sum(verdict_of(c) == v for c in cells) for v in VERDICTS}
    by_part = {(q, p): {v: sum(verdict_of(c) == v for c in cells if (c.quantization, c.precision) == (q, p))
                        for v in VERDICTS} for q, p in itertools.product(QUANTIZATIONS, PRECISIONS)}
    refused: dict[str, list[str]] = {}
    for c in cells:
        r = records.get(c.id, {})
        if r.get("verdict") == "refused":
            refused.setdefault(r["rule"], []).append(c.id)

    def count_line(d: dict[str, int]) -> str:
        return ", ".join(f"{n} {v}" for v, n in d.items() if n or v in ("pass", "fail", "refused"))

    def sticks(quant: str) -> str:
        got = [(a, records.get(Cell(a, "off", "bf16-mixed", "single", quantization=quant).id, {})) for a in ADAPTERS]
        return ", ".join(f"{a} {fmt_error(r['grad_error'])}" for a, r in got if r.get("verdict") == "pass")

    bf16_sticks = "; ".join(f"{'' if q == 'none' else q + ': '}{sticks(q)}" for q in QUANTIZATIONS if sticks(q))
    m = meta
    out = [
        "# Compatibility matrix: adapter x checkpointing x engine x precision x quantization",
        "",
        f"Generated by `{COMMAND}` from a run of every cell; never edit by hand (run the script again).",
        "",
        f"- **Run:** {m.get('date', '?')}, {fmt_time(m.get('wall_s', 0))} wall time"
        + (f" ({', '.join(f'{g} {fmt_time(s)}' for g, s in m.get('group_s', {}).items())})"
           if m.get("group_s") else "") + ".",
        f"- **Stack:** torch {m.get('torch')}, transformers {m.get('transformers')}, peft {m.get('peft')}, "
        f"deepspeed {m.get('deepspeed')}, bitsandbytes {m.get('bitsandbytes')}, Python {m.get('python')}; "
        f"CPU only ({m.get('cpu')}); "
        f"{RANKS} processes per distributed engine under torchrun, gloo backend, OMP_NUM_THREADS=1, "
        "DS_ACCELERATOR=cpu.",
        f"- **Model and data:** `{m.get('model')}`, `{m.get('data')}`.",
        "",
        "## What is measured",
        "",
        "Each cell trains as `loraflow train` does (config -> plan -> model -> trainer -> engine, "
        "`src/loraflow/verify/crosscheck.py`) for "
        f"{STEPS} optimizer steps on a global batch of {GLOBAL_BATCH} samples (split over the ranks), "
        "AdamW lr 1e-3, LoRA/DoRA rank 4 (full: every linear layer trainable), ZeRO-3 partitioning every weight.",
        "",
        "- **Figure in the tables:** the gradient after the first optimizer step (gathered and rank-averaged), "
        "as max over trainable tensors of ||g - g_ref|| / ||g_ref||. The reference is one process in fp32 "
        "without checkpointing (engine `single`) on the same global batch. Also compared: the losses of the "
        f"{STEPS} steps (relative error; in `--json` with the final weights).",
        ("- **nf4 cells** load the base in 4 bits (bitsandbytes NF4, double quantization); their reference is the "
         "same config in one fp32 process on the dequantized base (the quantized layers replaced by float32 layers "
         "holding the same weights), so the figure isolates what 4-bit compute, checkpointing and the engine "
         "change."),
        f"- **fp32 cells pass** when the gradient error and every step's loss error are <= {FP32_TOLERANCE:.0e}.",
        "- **bf16-mixed cells** differ from the fp32 reference by bf16 rounding whatever the engine, so they are "
        f"judged against what bf16-mixed costs in one process: a cell passes when its gradient error is at most "
        f"{BF16_FACTOR:g}x that of the single-process bf16-mixed cell of the same adapter and quantization without "
        "checkpointing "
        f"(the *yardstick*{': ' + bf16_sticks if bf16_sticks else ''}). "
        "An engine that adds no more than rounding of the same order passes; a lost, doubled or unaveraged "
        "gradient (error of order 1) or a missing tensor (inf) does not. The tables marked (information) show the "
        "same cells against the yardstick itself (a same-precision reference).",
        "- **refused:** the plan refuses the combination before step 1; the rule that refuses it is named "
        "(`loraflow explain <rule>`, docs/compatibility.md). **error / timeout:** the cell crashed or hung "
        "(details below the tables).",
        "",
        "## Summary",
        "",
        f"- **All {len(cells)} cells:** {count_line(counts)}.",
    ]
    for (q, p), d in by_part.items():
        out.append(f"- **{part_label(q, p)}** ({sum(d.values())} cells): {count_line(d)}.")
    if refused:
        out.append("- **Refused, by rule:** " + "; ".join(
            f"`{rule}` {len(ids)} ({', '.join(ids)})" for rule, ids in sorted(refused.items())) + ".")
    else:
        out.append("- **Refused:** none.")
    fails = [c.id for c in cells if records.get(c.id, {}).get("verdict") == "fail"]
    out.append(f"- **Failing their criterion:** {', '.join(fails) if fails else 'none'}.")
    out += ["", "Marks: [a], [b] ... = rules whose remedy the plan applied in that cell (legend below the tables); "
            "**FAIL** = outside the criterion; (E*n*) = error or timeout, in full below."]
    for q in QUANTIZATIONS:
        base = "" if q == "none" else " on the dequantized base"
        for title, precision, figure in (
                (f"fp32: gradient error against the fp32 reference{base}", "fp32", "grad_error"),
                (f"bf16-mixed: gradient error against the fp32 reference{base}", "bf16-mixed", "grad_error"),
                (f"bf16-mixed: gradient error against the single-process {part_label(q, 'bf16-mixed')} cell"
                 + " (information)", "bf16-mixed", "same_precision_error")):
            out += ["", f"## {'' if q == 'none' else q + ' '}{title}", "", *table(q, precision, figure)]
    out += ["", "## Rules the plan applied", ""]
    out += [f"- [{k}] `{rule}`" for rule, k in keys.items()] or ["None."]
    out += ["", "## Errors and timeouts", ""]
    out += [f"- E{i}: {note}" for i, note in enumerate(notes, 1)] or ["None."]
    return "\n".join(out) + "\n"


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
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(ASSETS / "tiny-base"))
    p.add_argument("--data", default=str(ASSETS / "reverse" / "train.jsonl"))
    p.add_argument("--only-engines", default=",".join(ENGINES),
                   help="comma-separated engines to run (single always runs: it holds the bf16 yardsticks)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="markdown to write")
    p.add_argument("--json", default=None, help="also write the raw figures here")
    p.add_argument("--timeout", type=float, default=900, help="seconds per launch")
    args = p.parse_args(argv)
    engines = [e.strip() for e in args.only_engines.split(",") if e.strip()]
    unknown = set(engines) - set(ENGINES)
    if unknown:
        p.error(f"unknown engines {sorted(unknown)}; choose from {', '.join(ENGINES)}")

    started = time.monotonic()
    raw: dict[str, dict[str, Any]] = {}
    references: dict[str, dict[str, Any]] = {}
    group_s: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="compat-matrix-") as tmp:
        for name, cells in groups(engines).items():
            t0 = time.monotonic()
            got = run_group(name, cells, args.model, args.data, Path(tmp), args.timeout, started=started)
            group_s[name] = time.monotonic() - t0
            (references if name == "reference" else raw).update(got)
    records = evaluate(raw, references)
    meta = {**versions(), "cpu": cpu_name(), "date": datetime.datetime.now(datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M UTC"), "wall_s": time.monotonic() - started, "group_s": group_s,
            "model": display_path(args.model), "data": display_path(args.data), "engines": engines}
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


if __name__ == "__main__":
    raise SystemExit(main())
