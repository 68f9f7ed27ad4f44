"""One LoRA SFT training step, side by side: a hand-written PyTorch loop (`plain`), TRL's SFTTrainer (`trl`) and
loraflow's own trainer (`loraflow`), on the same model, tokenizer, data and initial adapter (issue 17).

    python benchmarks/peers.py                 # seq 512, batch 4, 6 steps, checkpointing off and on, 2 rounds
    python benchmarks/peers.py --seq           # cost and memory over sequence lengths 512..4096 (batch 1)
    python benchmarks/peers.py --smoke --json out.json   # tiny sizes, one round (tests/benchmarks/test_peers.py)

Each variant runs in its own fresh interpreter (`--worker`), one at a time, rounds interleaved (plain, trl, loraflow;
then loraflow, trl, plain) so a slow spell of a shared machine does not land on one variant. The workload is built
once (benchmarks/peers_workload.py): a seeded Llama (hidden 512, 4 layers, 8 heads, MLP 1376, vocab 32000, untied
head), a WordLevel tokenizer of that vocabulary, prompt/completion rows of seq/2 prompt and seq/2 completion tokens
(the last is the EOS), LoRA r16 alpha 32 dropout 0 on every linear layer but the head, AdamW lr 2e-4 constant,
weight decay 0, clipping at 1.0, fp32, completion-only loss. All three start from one saved initial adapter whose B
is small and random rather than zero, so the first loss depends on every adapter weight (with B = 0 any A gives the
base model's loss). The parent refuses to compare (exit code 1, `NOT COMPARABLE`) unless every variant's first batch
(input_ids and labels) hashes the same and their first losses agree to 1e-4 relative. loraflow runs with its
defaults for everything the workload does not fix; `--loraflow-set KEY=VALUE` changes one (e.g. train.logits=full).

Reported per variant and cell: median and min step time over all timed steps of all rounds, peak RSS of the worker
over its training steps (taken before the one measured step: counting changes what that step allocates), FLOPs of
one step (torch's FlopCounterMode: matmuls and attention, attention counted full, not causal), bytes autograd saves
for backward in one step (parameters excluded), first and last loss; loraflow's ratios to the others.

The useful-work floor is what a step must compute at least, divided by this machine's fp32 matmul rate (the median
of 2048^3 matmuls timed in this run). Per step, with T tokens (batch x seq), L learned tokens (completion positions
that predict a token), H hidden, V vocabulary, P the frozen decoder linear weights, R the LoRA weights:

    useful = 4 P T            frozen linears: forward and input gradient (no weight gradient: frozen)
           + 6 R T            LoRA: forward, input gradient and weight gradient
           + 3 (2 * 2 T_s^2 H / 2) layers batch   causal attention scores and values (T_s = seq), forward + backward
           + 4 H V L          the head at learned positions only: forward and input gradient

Recomputation (checkpointing) is not useful work, so the floor is the same for both cells; `x floor` is a
variant's median step time over it. Step times on a shared machine move with its load: compare variants within one
run (the rounds interleave them), not across runs.
On CUDA the step runs on the GPU (fp32 too) and MFU is printed: 4 N FLOPs per token without recompute, 6 N with
full recompute (N the non-embedding parameters; so in the checkpointing cell the recompute counts as work), per
second, over a peak measured with fp32 matmuls the same way, and torch.cuda.max_memory_allocated per variant.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ORDER = ("plain", "trl", "loraflow")
DEFAULT_MODEL = {"hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8, "intermediate_size": 1376,
                 "vocab_size": 32000}
SMOKE_MODEL = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 172,
               "vocab_size": 1000}
SEQ_LENGTHS = (512, 1024, 2048, 4096)


# -- analytic figures ----------------------------------------------------------------------------------------------
def useful_flops(shape: dict[str, int], seq: int, batch: int, rank: int = 16) -> dict[str, float]:
    """The formula of the module docstring, term by term."""
    h, layers, v, m = shape["hidden_size"], shape["num_hidden_layers"], shape["vocab_size"], shape["intermediate_size"]
    tokens = seq * batch
    learned = (seq - seq // 2) * batch  # completion tokens predicted from the position before each
    frozen = layers * (4 * h * h + 3 * h * m)
    lora = layers * rank * (4 * (h + h) + 2 * (h + m) + (m + h))  # r (in + out) per adapted linear
    terms = {"frozen_linears": 4 * frozen * tokens, "lora": 6 * lora * tokens,
             "attention": 3 * (2 * 2 * seq * seq * h / 2) * layers * batch, "head": 4 * h * v * learned}
    terms["total"] = sum(terms.values())
    return terms


def model_flops(shape: dict[str, int], seq: int, batch: int, recompute: bool) -> float:
    """MFU's numerator per step: 4N per token (forward + input gradient) or 6N with full recompute."""
    h, layers, v, m = shape["hidden_size"], shape["num_hidden_layers"], shape["vocab_size"], shape["intermediate_size"]
    n = layers * (4 * h * h + 3 * h * m) + h * v  # non-embedding parameters (norms are negligible)
    return (6 if recompute else 4) * n * seq * batch


def matmul_rate(device: str, size: int = 2048, repeats: int = 7) -> float:
    """FLOP/s of fp32 size^3 matmuls: the median of `repeats` after one warm-up."""
    import torch

    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    times = []
    for i in range(repeats + 1):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        a @ b
        if device == "cuda":
            torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - t0)
    return 2 * size**3 / statistics.median(times)


# -- running the workers -------------------------------------------------------------------------------------------
def worker_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # every worker: torch's default threads
    env.update(TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH", "")]))
    return env


def run_worker(variant: str, spec: dict[str, Any], workdir: Path, tag: str, timeout: float) -> dict[str, Any]:
    """One worker in a fresh interpreter. A failure comes back as {"error": ...} with the tail of its stderr."""
    spec = {**spec, "run_dir": str(workdir / "runs" / f"{tag}-{variant}")}
    Path(spec["run_dir"]).mkdir(parents=True, exist_ok=True)
    spec_path, out_path = workdir / f"spec-{tag}-{variant}.json", workdir / f"result-{tag}-{variant}.json"
    spec_path.write_text(json.dumps(spec))
    out_path.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", variant, "--spec", str(spec_path),
           "--out", str(out_path)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=worker_env(), cwd=workdir,
                              check=False)
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or b"")[-2000:]
        tail = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
        return {"variant": variant, "error": f"timed out after {timeout:.0f} s", "stderr_tail": tail}
    if proc.returncode != 0 or not out_path.exists():
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        return {"variant": variant, "error": f"exit code {proc.returncode}", "stderr_tail": tail}
    return json.loads(out_path.read_text())


def run_cell(name: str, variants_spec: dict[str, Any], rounds: int, workdir: Path, timeout: float,
             log) -> dict[str, Any]:
    """Every round of one cell; the variants' runs merged: times pooled, the rest from the first round."""
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in ORDER}
    for r in range(rounds):
        order = ORDER if r % 2 == 0 else tuple(reversed(ORDER))
        for variant in order:
            t0 = time.perf_counter()
            result = run_worker(variant, variants_spec, workdir, f"{name}-r{r + 1}", timeout)
            status = "failed: " + result["error"] if "error" in result else "ok"
            log(f"  [{name}] round {r + 1} {variant}: {status} ({time.perf_counter() - t0:.0f} s)")
            runs[variant].append(result)
    return {v: merge(rs) for v, rs in runs.items()}


def merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    failed = [r for r in results if "error" in r]
    if failed:
        return failed[0]
    first = results[0]
    times = [t for r in results for t in r["step_times"]]
    out = {k: v for k, v in first.items() if k not in ("step_times",)}
    out.update(step_times=times, median_s=statistics.median(times) if times else None,
               min_s=min(times) if times else None, peak_rss_mb=max(r["peak_rss_mb"] for r in results),
               hashes=sorted({r["first_batch_hash"] for r in results}))
    if "cuda_max_memory_mb" in first:
        out["cuda_max_memory_mb"] = max(r["cuda_max_memory_mb"] for r in results)
    return out


def check_identical(cell: dict[str, Any]) -> list[str]:
    """Why the variants are not comparable, if they are not: a different first batch or a different start."""
    problems = []
    ok = {v: r for v, r in cell.items() if "error" not in r}
    hashes = {v: r["hashes"] for v, r in ok.items()}
    if len({h for hs in hashes.values() for h in hs}) > 1:
        problems.append(f"first batches differ (input_ids/labels hashes {hashes})")
    losses = {v: r["first_loss"] for v, r in ok.items()}
    if losses:
        ref = losses.get("plain", next(iter(losses.values())))
        if any(abs(x - ref) > 1e-4 * abs(ref) for x in losses.values()):
            problems.append(f"first losses differ by more than 1e-4 relative: {losses}")
    return problems


def ratios(cell: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    out = {}
    lf = cell.get("loraflow", {})
    for other in ("plain", "trl"):
        o = cell.get(other, {})
        row = {}
        for key in ("median_s", "flops", "peak_rss_mb", "saved_bytes"):
            a, b = lf.get(key), o.get(key)
            row[key] = a / b if a and b else None
        out[f"loraflow/{other}"] = row
    return out


# -- reports -------------------------------------------------------------------------------------------------------
def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_cell(name: str, cell: dict[str, Any], floor_s: float, extra: dict[str, Any]) -> None:
    cuda = extra.get("cuda")
    head = (f"{'variant':<9} {'median s':>9} {'min s':>8} {'RSS MB':>8} {'GFLOP':>8} {'saved MB':>9} "
            f"{'1st loss':>9} {'last loss':>9} {'x floor':>8}")
    print(f"\n== {name} ==")
    print(head + (f" {'MFU %':>6} {'GPU MB':>8}" if cuda else ""))
    for variant in ORDER:
        r = cell[variant]
        if "error" in r:
            print(f"{variant:<9} FAILED ({r['error']})\n    " + r["stderr_tail"].replace("\n", "\n    "))
            continue
        line = (f"{variant:<9} {_fmt(r['median_s'], '9.3f')} {_fmt(r['min_s'], '8.3f')} {r['peak_rss_mb']:8.0f} "
                f"{r['flops'] / 1e9:8.1f} {r['saved_bytes'] / 2**20:9.1f} {r['first_loss']:9.5f} "
                f"{_fmt(r['last_loss'], '9.5f')} {_fmt(r['median_s'] and r['median_s'] / floor_s, '8.1f')}")
        if cuda:
            mfu = r.get("mfu")
            line += f" {_fmt(mfu and 100 * mfu, '6.1f')} {r['cuda_max_memory_mb']:8.0f}"
        print(line)
    for pair, row in cell["ratios"].items():
        print(f"{pair:<16} time {_fmt(row['median_s'], '.2f')}  FLOPs {_fmt(row['flops'], '.2f')}  "
              f"RSS {_fmt(row['peak_rss_mb'], '.2f')}  saved {_fmt(row['saved_bytes'], '.2f')}")
    for problem in cell["problems"]:
        print(f"NOT COMPARABLE: {problem}")


def default_mode(args, paths: dict[str, Any], shape: dict[str, int], device: str, rate: float, workdir: Path,
                 log) -> dict[str, Any]:
    floor = useful_flops(shape, args.seq_len, args.batch)
    floor_s = floor["total"] / rate
    print(f"useful FLOPs per step: {floor['total'] / 1e9:.2f} G ("
          + ", ".join(f"{k} {v / 1e9:.2f}" for k, v in floor.items() if k != "total")
          + f"); floor at {rate / 1e9:.1f} GFLOP/s: {floor_s:.3f} s")
    cells = {}
    for checkpointing in (False, True):
        name = f"checkpointing-{'on' if checkpointing else 'off'}"
        spec = {"model": paths["model"], "data": paths["data"][args.seq_len], "adapter": paths["adapter"],
                "seq": args.seq_len, "batch": args.batch, "steps": args.steps, "checkpointing": checkpointing,
                "device": device, "measure": True, "loraflow_overrides": args.loraflow_set}
        cell = run_cell(name, spec, args.rounds, workdir, args.timeout, log)
        for r in cell.values():
            if "error" not in r:
                r["x_floor"] = r["median_s"] / floor_s if r["median_s"] else None
                if device == "cuda" and r["median_s"]:
                    r["mfu"] = model_flops(shape, args.seq_len, args.batch, checkpointing) / r["median_s"] / rate
        cell["ratios"], cell["problems"] = ratios(cell), check_identical(cell)
        print_cell(name, cell, floor_s, {"cuda": device == "cuda"})
        cells[name] = cell
    return {"floor": {**floor, "seconds": floor_s}, "cells": cells}


def seq_mode(args, paths: dict[str, Any], device: str, workdir: Path, log) -> dict[str, Any]:
    cells = {}
    for seq in args.seq_lengths:
        spec = {"model": paths["model"], "data": paths["data"][seq], "adapter": paths["adapter"], "seq": seq,
                "batch": 1, "steps": args.steps, "checkpointing": True, "device": device, "measure": False,
                "loraflow_overrides": args.loraflow_set}
        cell = run_cell(f"seq-{seq}", spec, args.rounds, workdir, args.timeout, log)
        cell["ratios"], cell["problems"] = ratios(cell), check_identical(cell)
        cells[str(seq)] = cell
    print("\nbatch 1, checkpointing on: median step time s / peak RSS MB" +
          (" / GPU MB" if device == "cuda" else ""))
    print(f"{'seq':>6} " + " ".join(f"{v:>22}" for v in ORDER))
    for seq, cell in cells.items():
        shown = []
        for v in ORDER:
            r = cell[v]
            if "error" in r:
                shown.append(f"{'FAILED':>22}")
                continue
            text = f"{_fmt(r['median_s'], '.3f')} / {r['peak_rss_mb']:.0f}"
            if device == "cuda":
                text += f" / {r['cuda_max_memory_mb']:.0f}"
            shown.append(f"{text:>22}")
        print(f"{seq:>6} " + " ".join(shown))
        for problem in cell["problems"]:
            print(f"       NOT COMPARABLE: {problem}")
        for v in ORDER:
            if "error" in cell[v]:
                print(f"       {v} failed ({cell[v]['error']}):\n         "
                      + cell[v]["stderr_tail"].replace("\n", "\n         "))
    return {"cells": cells}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq", action="store_true", help="sweep sequence lengths 512..4096 (batch 1, checkpointing on)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes and one round (the test)")
    p.add_argument("--rounds", type=int, help="rounds of all three variants (default 2; 1 with --seq or --smoke)")
    p.add_argument("--steps", type=int, help="steps per worker, the first not timed (default 6; 3 with --seq)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=512, help="sequence length of the default mode")
    p.add_argument("--json", type=Path, help="write every figure to this file")
    p.add_argument("--workdir", type=Path, help="keep the model, data and worker files here (default: a temp dir)")
    p.add_argument("--timeout", type=float, default=1200, help="seconds each worker may take")
    p.add_argument("--loraflow-set", action="append", default=[], metavar="KEY=VALUE",
                   help="a loraflow config override for the loraflow variant (repeatable), e.g. train.logits=full")
    p.add_argument("--worker", choices=ORDER, help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if args.worker:
        from peers_workload import run_worker as worker

        worker(args.worker, args.spec, args.out)
        return 0
    if args.workdir:
        return run(args, args.workdir)
    with tempfile.TemporaryDirectory(prefix="peers-") as tmp:
        return run(args, Path(tmp))


def run(args, workdir: Path) -> int:
    import torch
    from peers_workload import prepare

    shape = SMOKE_MODEL if args.smoke else DEFAULT_MODEL
    if args.smoke:
        args.seq_len, args.batch = 64, 2
    args.rounds = args.rounds or (1 if args.seq or args.smoke else 2)
    args.steps = args.steps or (2 if args.smoke else 3 if args.seq else 6)
    if args.steps < 2:
        sys.exit("--steps must be at least 2: the first step is warm-up and not timed.")
    args.seq_lengths = [128, 256] if args.seq and args.smoke else list(SEQ_LENGTHS)
    seqs = args.seq_lengths if args.seq else [args.seq_len]
    device = "cuda" if torch.cuda.is_available() else "cpu"

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    # DeepSpeed, imported by transformers or peft on the way, prints its accelerator choice to stdout: not the report.
    with contextlib.redirect_stdout(io.StringIO()):
        paths = prepare(workdir, shape, seqs, args.batch, rows=args.batch * (args.steps + 2))
    rate = matmul_rate(device)
    load_before = os.getloadavg()[0]  # other work on the machine slows every figure below: say how much there was
    print(f"device {device}, torch threads {torch.get_num_threads()}, fp32 matmul (2048^3, median) "
          f"{rate / 1e9:.1f} GFLOP/s, load average {load_before:.2f}; model {shape}")
    print(f"workload: LoRA r16 alpha 32 all-linear, lr 2e-4 constant, clip 1.0, fp32, {args.rounds} round(s), "
          f"{args.steps} steps per worker (first not timed)" + ("" if args.seq else
                                                                  f", seq {args.seq_len}, batch {args.batch}")
          + (f"; loraflow overrides {' '.join(args.loraflow_set)}" if args.loraflow_set else ""))
    report: dict[str, Any] = {"device": device, "matmul_flops_per_s": rate, "model": shape, "rounds": args.rounds,
                              "steps": args.steps, "batch": args.batch, "loraflow_overrides": args.loraflow_set}
    if args.seq:
        report.update(mode="seq", **seq_mode(args, paths, device, workdir, log))
    else:
        report.update(mode="default", seq=args.seq_len, **default_mode(args, paths, shape, device, rate, workdir, log))
    report["load_average"] = {"start": load_before, "end": os.getloadavg()[0]}
    print(f"\nload average (1 min) at start {load_before:.2f}, at end {report['load_average']['end']:.2f} "
          f"on {os.cpu_count()} CPUs")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    cells = report["cells"].values()
    failed = any("error" in c[v] for c in cells for v in ORDER)
    return 1 if failed or any(c["problems"] for c in cells) else 0


if __name__ == "__main__":
    sys.exit(main())
