"""The compatibility matrix's cells, how they are grouped into launches, and how each is judged
(scripts/compatibility_matrix.py runs them, scripts/matrix_render.py renders the tables)."""

from __future__ import annotations

import itertools
from typing import Any

from loraflow.verify.crosscheck import Cell, compare

ADAPTERS = ("lora", "dora", "full")
CHECKPOINTING = ("off", "reentrant", "non-reentrant")
ENGINES = ("single", "ddp", "zero2", "zero3", "zero3-offload", "fsdp2")
PRECISIONS = ("fp32", "bf16-mixed")
QUANTIZATIONS = ("none", "nf4")
"""model.quantization.method; nf4 = QLoRA (bitsandbytes NF4, double quantization). Full fine-tuning of a 4-bit base
is refused by the plan (rule kbit-full-finetune)."""
TOWERS = ("minicpm", "vision")
"""The image-text cells' tower setups (crosscheck.TOWER_SETUPS): minicpm = LoRA on the language model, the vision
encoder and projector trained in full (MiniCPM-V's); vision = adapters in the vision encoder too, projector full."""
IMAGE_TEXT = "image-text-"
"""Prefix of the image-text launch groups' names (they run on the image-text model and data)."""
RANKS = 2

FP32_TOLERANCE = 1e-5
"""fp32 cells: gradient and every step's loss within this relative error of the reference (as
tests/distributed/test_engines.py)."""
IMAGE_TEXT_FP32_TOLERANCE = 1e-4
"""fp32 image-text cells: gradient and loss within this relative error. The tiny-vlm's pretrained vision encoder
sums many cancelling terms into its LayerNorm and attention gradients, so the order of a sum alone moves them by
about 1e-5: one process summing the same global batch as two micro-batches of half (mathematically the same step,
as two ranks sum it) differs from one micro-batch by 5.9e-6 (MiniCPM-V's towers, a vision layer_norm1.weight) and
8.4e-6 (vision adapters, a q_proj lora_A) (measured 2026-11-24). A lost, doubled or unaveraged gradient shows at
1e-3 or more."""
BF16_FACTOR = 2.0
"""bf16-mixed cells: gradient error against the fp32 reference at most this times the error that bf16-mixed
costs in one process (the yardstick: the single-process bf16-mixed cell of the same adapter and quantization without
checkpointing)."""

VERDICTS = ("pass", "fail", "refused", "error", "timeout", "not run")


def all_cells() -> list[Cell]:
    """The 216 text-model cells, in table order: quantization, precision, adapter, checkpointing, engine."""
    return [Cell(adapter, ckpt, precision, engine, quantization=quant) for quant, precision, adapter, ckpt, engine
            in itertools.product(QUANTIZATIONS, PRECISIONS, ADAPTERS, CHECKPOINTING, ENGINES)]


def image_text_cells() -> list[Cell]:
    """The 36 image-text cells, in table order: towers, checkpointing, engine. LoRA in fp32 only: bf16-mixed
    costs the same rounding on these layers as on the text model's, judged the same way (the text bf16 rows)."""
    return [Cell("lora", ckpt, "fp32", engine, towers=towers)
            for towers, ckpt, engine in itertools.product(TOWERS, CHECKPOINTING, ENGINES)]


def every_cell() -> list[Cell]:
    return all_cells() + image_text_cells()


def yardstick(cell: Cell) -> Cell:
    """The same-precision, same-quantization single-process cell a cell's precision is judged by (itself for fp32
    references)."""
    return Cell(cell.adapter, "off", cell.precision, "single", quantization=cell.quantization, towers=cell.towers)


def groups(engines: list[str], text: bool = True, image_text: bool = True) -> dict[str, list[Cell]]:
    """Launch groups in run order: the text model's, one launch per engine for both quantizations (a launch's
    start-up, torchrun and imports, costs more than most cells; `single` always runs: its bf16-mixed cells are the
    yardsticks), then the image-text model's (names prefixed IMAGE_TEXT), one launch per engine for both tower
    setups (fp32 only, so no yardsticks: only the engines asked for)."""
    out: dict[str, list[Cell]] = {}
    parts = []
    if text:
        parts.append(("", [c for c in all_cells() if c.engine in engines or c.engine == "single"]))
    if image_text:
        parts.append((IMAGE_TEXT, [c for c in image_text_cells() if c.engine in engines]))
    for prefix, cells in parts:
        if not cells:
            continue
        out[prefix + "reference"] = list(dict.fromkeys(c.reference() for c in cells))
        for engine in ENGINES:
            if any(c.engine == engine for c in cells):
                out[prefix + engine] = [c for c in cells if c.engine == engine]
    return out


def evaluate(raw: dict[str, dict[str, Any]], references: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Judge every cell of the matrix from the workers' raw records. `references`: reference cell id -> record.
    Returns cell id -> a JSON-able record with `verdict` (one of VERDICTS), the figures and why."""
    out: dict[str, dict[str, Any]] = {}
    for cell in every_cell():  # fp32 before bf16-mixed: yardsticks are judged before the cells that use them
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
            rec.update(verdict="timeout" if r["status"] == "timeout" else "error", message=r.get("message", ""),
                       **{k: mine[k] for k in ("log", "traceback") if mine.get(k)})  # for --json readers
        else:
            rec.update({k: r[k] for k in ("grad_error", "worst", "loss_error", "weight_error", "rules", "losses")})
            if cell.towers != "none":  # what only an image-text cell has to show
                rec.update(null_gradients=r["null_gradients"], blank_batches=mine.get("blank_batches", 0),
                           null_drift=null_drift(mine, ref, r["null_gradients"]))
            if cell.precision == "fp32":
                rec["criterion"], ok = judge_fp32(cell, rec)
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


def judge_fp32(cell: Cell, rec: dict[str, Any]) -> tuple[str, bool]:
    """(criterion, passed) of an fp32 cell from its figures (also used to judge a saved run again)."""
    limit = IMAGE_TEXT_FP32_TOLERANCE if cell.towers != "none" else FP32_TOLERANCE
    return (f"gradient and loss error <= {limit:.0e}",
            rec["grad_error"] <= limit and rec["loss_error"] <= limit)


def null_drift(result: dict[str, Any], reference: dict[str, Any], names: list[str]) -> float:
    """How far the cell's null gradients (`names`) moved from the reference's, as a fraction of the reference's
    largest gradient: compare() turns more than NULL_GRADIENT into an inf figure, which hides by how much."""
    scale = max((float(g.norm()) for g in reference["grads"].values()), default=0.0)
    got = [float((result["grads"][n] - reference["grads"][n]).norm()) for n in names if n in result["grads"]]
    return max(got, default=0.0) / scale if scale else 0.0


def failed_fp32(records: dict[str, dict[str, Any]]) -> list[str]:
    return [cid for cid, r in records.items() if Cell.from_id(cid).precision == "fp32"
            and r["verdict"] in ("fail", "error", "timeout")]
