"""Gradient equivalence on the device at hand (the `grads` step of scripts/gpu_check.sh).

One process, the bundled tiny-base model and the first 64 records of its demo data: LoRA and DoRA under every
checkpoint mode in fp32 and bf16-mixed, QLoRA (NF4) on bitsandbytes' kernels for this device, and ZeRO-3 and FSDP2
at world size 1 (a one-rank process group: their sharding, gathering and hook code runs even on one GPU). Each cell
trains three optimizer steps exactly as `loraflow train` does (crosscheck.run_cell) and is compared with the
unoptimized fp32 reference on the same device: one process, no checkpointing, full logits. A QLoRA cell's reference
is the same config on the dequantized base.

fp32 cells must match the reference to FP32_TOLERANCE. bf16-mixed cells round every frozen matmul to bf16, so they
are judged against the fp32 reference twice: within BF16_TOLERANCE (a bound measured on the CPU, the figures beside
it, with a margin), and, as in the compatibility matrix, within BF16_FACTOR times the error of their yardstick, the
bf16-mixed cell of the same adapter and base in one process without checkpointing: checkpointing or an engine may
not add error of its own beyond rounding. A lost, doubled, unaveraged or stale gradient is off by 0.3 to 1.0.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from loraflow.verify.crosscheck import Cell, compare, run_cell

FP32_TOLERANCE = 1e-5
"""fp32 cells: gradient, loss (every step) within this relative error of the reference, as the engine tests."""
BF16_TOLERANCE = {"grad": 0.15, "loss": 2e-2}
"""bf16-mixed cells against the fp32 reference: the largest per-tensor relative gradient error and the largest
relative loss error over the three steps. Measured on the CPU (2026-11-26, tiny-base, 64 records): gradients 5.0e-2
(LoRA) to 7.6e-2 (QLoRA), losses 7.9e-4 to 5.4e-3."""
BF16_TOLERANCE_NF4 = {"grad": 0.3, "loss": 2e-2}
"""The same for a 4-bit base, whose bf16 rounding is measured larger on the device's kernels: on an H200
(2026-11-26, bitsandbytes 0.50.2, torch 2.11+cu130) the QLoRA bf16-mixed cell's worst tensor was 2.0e-1 against
6.5e-2 for plain LoRA, with a loss error of 2.4e-3 and the checkpointed cell identical to it. A lost, doubled or
unaveraged gradient is an error of order 1, so 0.3 still separates rounding from a fault."""
BF16_FACTOR = 2.0
"""A bf16-mixed cell's gradient error at most this times its yardstick's (the compatibility matrix's criterion)."""
CHECKPOINTING = ("off", "reentrant", "non-reentrant")
RECORDS = 64


def cells() -> list[Cell]:
    """The cells in table order. The fp32 cells without checkpointing are the references themselves."""
    out = [Cell(adapter, ckpt, precision, "single") for adapter in ("lora", "dora")
           for precision in ("fp32", "bf16-mixed") for ckpt in CHECKPOINTING]
    out = [c for c in out if not c.is_reference]
    # QLoRA on the device's 4-bit kernels: as plain fp32 compute, and as users run it (bf16, checkpointed) with
    # its yardstick.
    out += [Cell("lora", "off", "fp32", "single", quantization="nf4"),
            Cell("lora", "off", "bf16-mixed", "single", quantization="nf4"),
            Cell("lora", "non-reentrant", "bf16-mixed", "single", quantization="nf4")]
    # The sharded engines at world size 1, with the checkpoint mode users combine them with.
    out += [Cell(adapter, "non-reentrant", precision, engine) for engine in ("zero3", "fsdp2")
            for adapter, precision in (("lora", "fp32"), ("dora", "fp32"), ("lora", "bf16-mixed"))]
    return out


def yardstick(cell: Cell) -> Cell:
    """The cell a bf16-mixed cell's error is measured against: same adapter and base, one process, no
    checkpointing (itself when it is one)."""
    return Cell(cell.adapter, "off", cell.precision, "single", quantization=cell.quantization)


def judge(cell: Cell, result: dict[str, Any], reference: dict[str, Any],
          stick: dict[str, Any] | None = None) -> dict[str, Any]:
    """A JSON-able verdict of one cell: pass / fail / refused / error, with its figures and criterion. `stick` is
    the judged row of the cell's yardstick (bf16-mixed cells other than the yardsticks themselves)."""
    if result.get("status") == "refused":
        return {"cell": cell.id, "verdict": "refused", "rule": result.get("rule"), "message": result.get("message")}
    if result.get("status") != "ok":
        return {"cell": cell.id, "verdict": "error", "message": result.get("message", ""),
                "traceback": result.get("traceback", "")}
    if reference.get("status") != "ok":
        return {"cell": cell.id, "verdict": "error",
                "message": f"reference {cell.reference().id}: {reference.get('message', reference.get('status'))}"}
    r = compare(result, reference)
    bf16 = BF16_TOLERANCE_NF4 if cell.quantization == "nf4" else BF16_TOLERANCE
    limits = dict(bf16) if cell.precision == "bf16-mixed" else {"grad": FP32_TOLERANCE, "loss": FP32_TOLERANCE}
    row = {"cell": cell.id, "grad_error": r["grad_error"], "worst": r["worst"], "loss_error": r["loss_error"],
           "weight_error": r["weight_error"], "saved_tensors": result.get("saved_tensors", 0), "rules": r["rules"]}
    if stick is not None:
        if "grad_error" not in stick:
            return {**row, "verdict": "error", "message": f"yardstick {yardstick(cell).id} did not run"}
        limits["grad"] = min(limits["grad"], BF16_FACTOR * stick["grad_error"])
        row["yardstick"] = stick["cell"]
    ok = r["grad_error"] <= limits["grad"] and r["loss_error"] <= limits["loss"]
    if cell.adapter != "full" and not row["saved_tensors"]:
        ok = False  # an empty adapter file is a failure whatever the gradients say (zero3-empty-adapter-save)
    return {**row, "verdict": "pass" if ok else "fail", "limits": limits}


def write_data(source: Path, out: Path, records: int = RECORDS) -> Path:
    lines = source.read_text(encoding="utf-8").splitlines()[:records]
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def run(workdir: Path, log=print) -> dict[str, Any]:
    """Every cell and its reference on this process's device. Returns the step record (status, headline, rows)."""
    import torch

    from loraflow.engines import init_distributed
    from loraflow.locations import ASSETS

    workdir.mkdir(parents=True, exist_ok=True)
    data = str(write_data(ASSETS / "reverse" / "train.jsonl", workdir / "grads-data.jsonl"))
    model = "builtin:tiny-base"
    init_distributed("auto")  # a one-rank group for the ZeRO-3 and FSDP2 cells (nccl on CUDA, gloo on the CPU)
    todo = cells()
    references: dict[str, dict[str, Any]] = {}
    rows = []
    for cell in todo:
        ref_cell = cell.reference()
        if ref_cell.id not in references:
            references[ref_cell.id] = _guarded(ref_cell, model, data, workdir)
            log(f"reference {ref_cell.id}: {references[ref_cell.id].get('status')}")
        t0 = time.perf_counter()
        stick = None
        if cell.precision == "bf16-mixed" and yardstick(cell) != cell:
            stick = next((r for r in rows if r["cell"] == yardstick(cell).id), {"cell": yardstick(cell).id})
        row = judge(cell, _guarded(cell, model, data, workdir), references[ref_cell.id], stick)
        row["seconds"] = round(time.perf_counter() - t0, 1)
        rows.append(row)
        log(_row_text(row))
    passed = sum(r["verdict"] == "pass" for r in rows)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return {"status": "pass" if passed == len(rows) else "fail", "device": device,
            "headline": headline(rows), "rows": rows,
            "references": {k: {"status": v.get("status"), "losses": v.get("losses")} for k, v in references.items()},
            "criteria": {"fp32": FP32_TOLERANCE, "bf16-mixed": BF16_TOLERANCE}}


def _guarded(cell: Cell, model: str, data: str, workdir: Path) -> dict[str, Any]:
    """run_cell, with an exception recorded as the cell's error: the next cell still runs."""
    import traceback

    try:
        return run_cell(cell, model, data, 1, workdir)
    except Exception as exc:  # recorded per cell; the step's verdict fails on it
        return {"status": "error", "message": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc()[-3000:]}


def _row_text(row: dict[str, Any]) -> str:
    if "grad_error" not in row:
        return f"{row['cell']:<40} {row['verdict']:<8} {row.get('rule') or row.get('message', '')[:200]}"
    return (f"{row['cell']:<40} {row['verdict']:<8} grad {row['grad_error']:.1e} loss {row['loss_error']:.1e} "
            f"(<= {row['limits']['grad']:.2g} / {row['limits']['loss']:.2g}) {row.get('seconds', '')} s")


def headline(rows: list[dict[str, Any]]) -> str:
    """One line for the summary table: how many passed, and the worst error of each precision."""
    passed = sum(r["verdict"] == "pass" for r in rows)
    parts = [f"{passed}/{len(rows)} cells pass"]
    for precision in ("fp32", "bf16-mixed"):
        measured = [r for r in rows if "grad_error" in r and f"/{precision}/" in r["cell"]]
        if measured:
            # the worst cell's own bound: a 4-bit base has a looser one than the summary's default
            worst = max(measured, key=lambda r: r["grad_error"])
            parts.append(f"{precision} worst grad err {worst['grad_error']:.1e} "
                         f"(<= {worst['limits']['grad']:.2g}, {worst['cell']})")
    bad = [r["cell"] for r in rows if r["verdict"] != "pass"]
    if bad:
        parts.append("not passing: " + ", ".join(bad[:4]) + (" ..." if len(bad) > 4 else ""))
    return "; ".join(parts)


if __name__ == "__main__":  # python -m loraflow.verify.device_grads DIR: the step on its own
    import sys

    record = run(Path(sys.argv[1]))
    print(json.dumps({k: v for k, v in record.items() if k != "rows"}, indent=2))
