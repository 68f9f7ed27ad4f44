"""The output head alone, as the plain loop computes it and as loraflow does, side by side on one device.

On the lent H200s loraflow's SFT step ran 4-12% slower than a plain PEFT loop without checkpointing
(docs/measurements.md), though it runs the head at the learned positions only (half of them in that workload) and
issues the same aten operations per step as the plain loop on the host. This isolates the head: forward and
backward through a frozen [vocabulary x hidden] head for one step's hidden states,

- `full`: what transformers' causal-LM loss does in the plain loop: bf16 logits at every position, upcast to
  float32, cross-entropy over the learned ones, autograd backward;
- `chunk=N`: loraflow's path (losses/logprobs.py head_logps): the learned positions picked, the head run N rows at a
  time with each chunk's gradient formed in the forward. `default` is the chunk train.logits_chunk_mib's default gives
  (523 rows at 256 MiB for a 128,256-token vocabulary; 130 rows at the earlier 64 MiB).

Each variant's median time over --repeats (after one warm-up), its peak device memory above the inputs, and the
largest relative difference of its gradient from `full`'s (they compute the same loss; bf16 rounds differently).

    python benchmarks/head_chunks.py                       # Llama-3.2-1B's head, 8192 positions, on CUDA if present
    python benchmarks/head_chunks.py --quick --device cpu  # toy sizes (tests/benchmarks/test_head_chunks.py)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from loraflow.config.schema import TrainConfig  # noqa: E402
from loraflow.losses.logprobs import chunk_tokens, head_logps  # noqa: E402

LLAMA_1B_HEAD = {"hidden": 2048, "vocab": 128256, "positions": 8192}
QUICK_HEAD = {"hidden": 64, "vocab": 1000, "positions": 256}


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _full(head: torch.nn.Linear, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """transformers' ForCausalLMLoss on logits the model returned: upcast, then mean cross-entropy."""
    logits = head(hidden).float()
    return torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100)


def _chunked(chunk: int) -> Callable:
    def run(head: torch.nn.Linear, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        mask = labels != -100
        logps = head_logps(head.forward, hidden[mask], labels[mask], 1.0, chunk, False, head)
        return -logps.sum() / mask.sum()
    return run


def measure(name: str, fn: Callable, head: torch.nn.Linear, hidden: torch.Tensor, labels: torch.Tensor,
            repeats: int, device: str) -> dict[str, Any]:
    times, grad = [], None
    for i in range(repeats + 1):
        h = hidden.detach().requires_grad_(True)
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        _sync(device)
        t0 = time.perf_counter()
        loss = fn(head, h, labels)
        loss.backward()
        _sync(device)
        if i:
            times.append(time.perf_counter() - t0)
        grad = h.grad
    out = {"variant": name, "median_ms": 1e3 * statistics.median(times), "min_ms": 1e3 * min(times),
           "loss": float(loss.detach())}
    if device == "cuda":
        out["peak_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20
    return out | {"_grad": grad.float()}


def run(args: argparse.Namespace) -> dict[str, Any]:
    size = QUICK_HEAD if args.quick else LLAMA_1B_HEAD
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16
    gen = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(size["hidden"], size["vocab"], bias=False)
    with torch.no_grad():
        head.weight.normal_(0.0, 0.02, generator=gen)
    head = head.to(device=device, dtype=dtype).requires_grad_(False)
    hidden = torch.randn(size["positions"], size["hidden"], generator=gen).to(device=device, dtype=dtype)
    labels = torch.randint(0, size["vocab"], (size["positions"],), generator=gen)
    labels[: int(size["positions"] * (1 - args.learned))] = -100  # the prompt: not learned
    labels = labels.to(device)
    default = chunk_tokens(size["vocab"], TrainConfig.logits_chunk_mib)
    chunks = [("default", default)] + [(str(c), c) for c in args.chunks if c != default]
    variants = [("full", _full)] + [(f"chunk={label}" + (f" ({c} rows)" if label == "default" else ""),
                                     _chunked(c)) for label, c in chunks]
    # Interleaved rounds, so a machine's drift (clocks, other load) falls on every variant alike.
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in variants}
    for r in range(args.rounds):
        for name, fn in (variants if r % 2 == 0 else variants[::-1]):
            rows[name].append(measure(name, fn, head, hidden, labels, args.repeats, device))
    reference = rows["full"][0]["_grad"]
    results = []
    for name, runs in rows.items():
        grad = runs[0]["_grad"]
        err = float((grad - reference).norm() / reference.norm().clamp_min(1e-30))
        merged = {k: v for k, v in runs[0].items() if not k.startswith("_")}
        merged["median_ms"] = statistics.median(r["median_ms"] for r in runs)
        merged["grad_rel_err"] = err
        results.append(merged)
    full_ms = results[0]["median_ms"]
    for r in results:
        r["x_full"] = full_ms / r["median_ms"]  # > 1: faster than the full head
    return {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "shape": size,
            "learned_fraction": args.learned, "default_chunk_rows": default, "results": results}


def render(report: dict[str, Any]) -> str:
    s = report["shape"]
    lines = [f"head {s['vocab']} x {s['hidden']} (bf16), {s['positions']} positions, "
             f"{report['learned_fraction']:.0%} learned, on {report['device']}",
             f"{'variant':<24}{'median ms':>11}{'x full':>9}{'peak MiB':>10}{'grad err':>10}"]
    for r in report["results"]:
        peak = f"{r['peak_mib']:,.0f}" if "peak_mib" in r else "-"
        lines.append(f"{r['variant']:<24}{r['median_ms']:>11.2f}{r['x_full']:>9.2f}{peak:>10}"
                     f"{r['grad_rel_err']:>10.1e}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda when present")
    p.add_argument("--quick", action="store_true", help="toy sizes (the test)")
    p.add_argument("--chunks", type=lambda v: [int(x) for x in v.split(",")], default=[128, 512, 2048],
                   help="chunk sizes in rows besides the default's (comma-separated)")
    p.add_argument("--learned", type=float, default=0.5, help="fraction of positions learned (peers: half)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", type=Path, help="write the figures here")
    args = p.parse_args(argv)
    report = run(args)
    print(render(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
