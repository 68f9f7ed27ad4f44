"""One LoRA SFT training step, side by side: a hand-written PyTorch loop (`plain`), TRL's SFTTrainer (`trl`) and
loraflow's own trainer (`loraflow`), on the same model, tokenizer, data and initial adapter (issue 17).

    python benchmarks/peers.py                 # seq 512, batch 4, 6 steps, checkpointing off and on, 2 rounds
    python benchmarks/peers.py --seq           # cost and memory over sequence lengths 512..4096 (batch 1)
    python benchmarks/peers.py --smoke --json out.json   # tiny sizes, one round (tests/benchmarks/test_peers.py)
    python benchmarks/peers.py --preset gpu-1b           # Llama-3.2-1B's shape, bf16-mixed, seq 2048 and 4096 (GPU)
    python benchmarks/peers.py --precision bf16-mixed --cells 1024x2:off   # any precision and cells

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
With `--precision bf16-mixed` every variant keeps the frozen weights in bf16 and the adapters and optimizer in fp32
under bf16 autocast (the plain loop by hand, TRL with bf16=True, loraflow with precision.mode=bf16-mixed); the first
losses then need only agree to 2e-3, and the matmul rate is measured in bf16. tokens/s is batch x seq over the
median step time.
On CUDA the step runs on the GPU (fp32 too) and MFU is printed: 4 N FLOPs per token without recompute, 6 N with
full recompute (N the non-embedding parameters with the head; so in the checkpointing cell the recompute counts as
work), plus causal attention, per second, over the datasheet bf16 peak (MFU %, where the device is known) and over
the matmul rate measured in the same run (MFU* %); and torch.cuda.max_memory_allocated per variant (GPU MB). The
formulas are in benchmarks/peers_figures.py.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))  # peers_figures and peers_workload beside this file
from peers_figures import model_flops, useful_flops  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
ORDER = ("plain", "trl", "loraflow")
SEQ_LENGTHS = (512, 1024, 2048, 4096)
FIRST_LOSS_AGREEMENT = {"fp32": 1e-4, "bf16-mixed": 2e-3}
"""Relative difference of the variants' first losses above which they are not comparable. In bf16 the variants'
kernels round differently (loraflow's head runs on the learned positions only, a differently shaped matmul)."""
PRESETS = {
    # A realistic GPU workload (scripts/gpu_check.sh): Llama-3.2-1B's shape in bf16-mixed, 8192 tokens per step:
    # sequence 2048 without checkpointing, 4096 with full recompute. Six workers fit the check's time budget.
    "gpu-1b": {"model": "LLAMA_1B", "precision": "bf16-mixed", "cells": "2048x4:off,4096x2:on",
               "rounds": 1, "steps": 4},
}


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


def check_identical(cell: dict[str, Any], precision: str = "fp32") -> list[str]:
    """Why the variants are not comparable, if they are not: a different first batch or a different start."""
    problems = []
    ok = {v: r for v, r in cell.items() if "error" not in r}
    hashes = {v: r["hashes"] for v, r in ok.items()}
    if len({h for hs in hashes.values() for h in hs}) > 1:
        problems.append(f"first batches differ (input_ids/labels hashes {hashes})")
    losses = {v: r["first_loss"] for v, r in ok.items()}
    limit = FIRST_LOSS_AGREEMENT[precision]
    if losses:
        ref = losses.get("plain", next(iter(losses.values())))
        if any(abs(x - ref) > limit * abs(ref) for x in losses.values()):
            problems.append(f"first losses differ by more than {limit:g} relative: {losses}")
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


def print_cell(name: str, cell: dict[str, Any], floor_s: float, cuda: bool) -> None:
    head = (f"{'variant':<9} {'median s':>9} {'min s':>8} {'tokens/s':>9} {'RSS MB':>8} {'GFLOP':>9} {'saved MB':>9} "
            f"{'1st loss':>9} {'last loss':>9} {'x floor':>8}")
    print(f"\n== {name} ==")
    print(head + (f" {'MFU %':>6} {'MFU* %':>6} {'GPU MB':>8}" if cuda else ""))
    for variant in ORDER:
        r = cell[variant]
        if "error" in r:
            print(f"{variant:<9} FAILED ({r['error']})\n    " + r["stderr_tail"].replace("\n", "\n    "))
            continue
        line = (f"{variant:<9} {_fmt(r['median_s'], '9.3f')} {_fmt(r['min_s'], '8.3f')} "
                f"{_fmt(r.get('tokens_per_s'), '9.0f')} {r['peak_rss_mb']:8.0f} "
                f"{r['flops'] / 1e9:9.1f} {r['saved_bytes'] / 2**20:9.1f} {r['first_loss']:9.5f} "
                f"{_fmt(r['last_loss'], '9.5f')} {_fmt(r['median_s'] and r['median_s'] / floor_s, '8.1f')}")
        if cuda:
            mfu, nominal = r.get("mfu"), r.get("mfu_nominal")
            line += (f" {_fmt(nominal and 100 * nominal, '6.1f')} {_fmt(mfu and 100 * mfu, '6.1f')} "
                     f"{r['cuda_max_memory_mb']:8.0f}")
        print(line)
    for pair, row in cell["ratios"].items():
        print(f"{pair:<16} time {_fmt(row['median_s'], '.2f')}  FLOPs {_fmt(row['flops'], '.2f')}  "
              f"RSS {_fmt(row['peak_rss_mb'], '.2f')}  saved {_fmt(row['saved_bytes'], '.2f')}")
    for problem in cell["problems"]:
        print(f"NOT COMPARABLE: {problem}")


def parse_cells(text: str) -> list[tuple[int, int, bool]]:
    """`2048x4:off,4096x2:on` -> [(seq, batch, checkpointing)]."""
    cells = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        try:
            size, _, ckpt = item.partition(":")
            seq, _, batch = size.partition("x")
            if ckpt not in ("on", "off"):
                raise ValueError
            cells.append((int(seq), int(batch or 1), ckpt == "on"))
        except ValueError:
            sys.exit(f"--cells: `{item}` is not SEQxBATCH:on|off (e.g. --cells 2048x4:off,4096x2:on)")
    return cells


def default_mode(args, paths: dict[str, Any], shape: dict[str, Any], device: str, rates: dict[str, float],
                 workdir: Path, log, done=lambda cells: None) -> dict[str, Any]:
    """Each (sequence, batch, checkpointing) cell of args.cells: the three variants side by side. `done` gets the
    cells measured so far after each one (the partial --json a caller killed at its time limit still has)."""
    one_size = len({(seq, batch) for seq, batch, _ in args.cells}) == 1
    cells, floors = {}, {}
    for seq, batch, checkpointing in args.cells:
        floor = useful_flops(shape, seq, batch)
        floor_s = floor["total"] / rates["measured"]
        if (seq, batch) not in floors:
            print(f"seq {seq} x batch {batch}: useful FLOPs per step {floor['total'] / 1e9:.2f} G ("
                  + ", ".join(f"{k} {v / 1e9:.2f}" for k, v in floor.items() if k != "total")
                  + f"); floor at {rates['measured'] / 1e9:.1f} GFLOP/s: {floor_s:.4f} s")
        floors[(seq, batch)] = {**floor, "seconds": floor_s}
        name = (("" if one_size else f"seq{seq}x{batch}-") + f"checkpointing-{'on' if checkpointing else 'off'}")
        spec = {"model": paths["model"], "data": paths["data"][seq], "adapter": paths["adapter"], "seq": seq,
                "batch": batch, "steps": args.steps, "checkpointing": checkpointing, "device": device,
                "precision": args.precision, "measure": True, "loraflow_overrides": args.loraflow_set}
        cell = run_cell(name, spec, args.rounds, workdir, args.timeout, log)
        work = model_flops(shape, seq, batch, checkpointing)
        for r in cell.values():
            if "error" not in r and r["median_s"]:
                r["x_floor"] = r["median_s"] / floor_s
                r["tokens_per_s"] = seq * batch / r["median_s"]
                if device == "cuda":
                    r["mfu"] = work / r["median_s"] / rates["measured"]
                    r["mfu_nominal"] = work / r["median_s"] / rates["nominal"] if rates.get("nominal") else None
        cell["ratios"], cell["problems"] = ratios(cell), check_identical(cell, args.precision)
        cell["shape"] = {"seq": seq, "batch": batch, "checkpointing": checkpointing}
        print_cell(name, cell, floor_s, device == "cuda")
        cells[name] = cell
        done(cells)
    first = floors[(args.cells[0][0], args.cells[0][1])]
    return {"floor": first, "floors": {f"{s}x{b}": f for (s, b), f in floors.items()}, "cells": cells}


def seq_mode(args, paths: dict[str, Any], device: str, workdir: Path, log) -> dict[str, Any]:
    cells = {}
    for seq in args.seq_lengths:
        spec = {"model": paths["model"], "data": paths["data"][seq], "adapter": paths["adapter"], "seq": seq,
                "batch": 1, "steps": args.steps, "checkpointing": True, "device": device, "measure": False,
                "precision": args.precision, "loraflow_overrides": args.loraflow_set}
        cell = run_cell(f"seq-{seq}", spec, args.rounds, workdir, args.timeout, log)
        cell["ratios"], cell["problems"] = ratios(cell), check_identical(cell, args.precision)
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
    p.add_argument("--preset", choices=sorted(PRESETS), help="a named workload: gpu-1b = Llama-3.2-1B's shape, "
                   "bf16-mixed, seq 2048 x 4 without checkpointing and 4096 x 2 with it (one round)")
    p.add_argument("--precision", choices=sorted(FIRST_LOSS_AGREEMENT), help="fp32 (default) or bf16-mixed: bf16 "
                   "frozen weights, fp32 adapters and optimizer, bf16 autocast, in every variant")
    p.add_argument("--cells", help="SEQxBATCH:on|off,... the cells of the default mode (default: --seq-len x --batch, "
                   "checkpointing off and on)")
    p.add_argument("--shape", help="JSON of model config values that replace the preset's (a toy of the same "
                   "structure: scripts/gpu_check.sh --quick)")
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
    if args.worker:
        from peers_workload import run_worker as worker

        worker(args.worker, args.spec, args.out)
        return 0
    if args.workdir:
        return run(args, args.workdir)
    with tempfile.TemporaryDirectory(prefix="peers-") as tmp:
        return run(args, Path(tmp))


def settle(args) -> dict[str, Any]:
    """Fill in what the flags left open (preset, then --smoke, then the defaults); returns the model shape."""
    import peers_figures

    preset = PRESETS.get(args.preset, {})
    shape = getattr(peers_figures, preset.get("model", "SMOKE_MODEL" if args.smoke else "DEFAULT_MODEL"))
    if args.shape:
        shape = {**shape, **json.loads(args.shape)}
    if args.smoke:
        args.seq_len, args.batch = 64, 2
    args.precision = args.precision or preset.get("precision", "fp32")
    args.rounds = args.rounds or preset.get("rounds") or (1 if args.seq or args.smoke else 2)
    args.steps = args.steps or preset.get("steps") or (2 if args.smoke else 3 if args.seq else 6)
    if args.steps < 2:
        sys.exit("--steps must be at least 2: the first step is warm-up and not timed.")
    args.seq_lengths = [128, 256] if args.seq and args.smoke else list(SEQ_LENGTHS)
    cells = args.cells or preset.get("cells") or f"{args.seq_len}x{args.batch}:off,{args.seq_len}x{args.batch}:on"
    args.cells = parse_cells(cells)
    return shape


def run(args, workdir: Path) -> int:
    import torch
    from peers_figures import matmul_rate, nominal_peak
    from peers_workload import prepare

    shape = settle(args)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sizes = [(seq, 1) for seq in args.seq_lengths] if args.seq else [(s, b) for s, b, _ in args.cells]
    dtype = "bfloat16" if args.precision == "bf16-mixed" else "float32"

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    # DeepSpeed, imported by transformers or peft on the way, prints its accelerator choice to stdout: not the report.
    with contextlib.redirect_stdout(io.StringIO()):
        paths = prepare(workdir, shape, sizes, rows_per_batch=args.steps + 2, dtype=dtype)
    rates = {"measured": matmul_rate(device, dtype)}
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    if device == "cuda" and nominal_peak(name):
        rates["nominal"] = nominal_peak(name)
    load_before = os.getloadavg()[0]  # other work on the machine slows every figure below: say how much there was
    print(f"device {name}, torch threads {torch.get_num_threads()}, {dtype} matmul (median) "
          f"{rates['measured'] / 1e9:.1f} GFLOP/s"
          + (f" (datasheet peak {rates['nominal'] / 1e12:.0f} TFLOP/s)" if "nominal" in rates else "")
          + f", load average {load_before:.2f}; model {shape}")
    print(f"workload: LoRA r16 alpha 32 all-linear, lr 2e-4 constant, clip 1.0, {args.precision}, "
          f"{args.rounds} round(s), {args.steps} steps per worker (first not timed)"
          + (f"; loraflow overrides {' '.join(args.loraflow_set)}" if args.loraflow_set else ""))
    if device == "cuda":
        print("MFU % is against the datasheet bf16 peak, MFU* % against the matmul rate measured above; both count "
              "4N FLOPs per token (6N with recompute) plus causal attention")
    report: dict[str, Any] = {"device": device, "device_name": name, "matmul_flops_per_s": rates["measured"],
                              "rates": rates, "model": shape, "precision": args.precision, "rounds": args.rounds,
                              "steps": args.steps, "batch": args.batch, "loraflow_overrides": args.loraflow_set}
    def partial(cells: dict[str, Any]) -> None:
        if args.json:
            args.json.write_text(json.dumps({**report, "mode": "default", "cells": cells, "partial": True}, indent=2))

    if args.seq:
        report.update(mode="seq", **seq_mode(args, paths, device, workdir, log))
    else:
        report.update(mode="default", seq=args.cells[0][0],
                      **default_mode(args, paths, shape, device, rates, workdir, log, partial))
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
