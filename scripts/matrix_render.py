"""docs/compatibility-matrix.md from the judged records of scripts/compatibility_matrix.py: the text model's tables
(adapter x checkpointing rows per quantization and precision) and the image-text section (towers x checkpointing)."""

from __future__ import annotations

import itertools
import math
import re
from typing import Any

from matrix_cells import (
    ADAPTERS,
    BF16_FACTOR,
    CHECKPOINTING,
    ENGINES,
    FP32_TOLERANCE,
    IMAGE_TEXT,
    IMAGE_TEXT_FP32_TOLERANCE,
    PRECISIONS,
    QUANTIZATIONS,
    RANKS,
    TOWERS,
    VERDICTS,
    all_cells,
    image_text_cells,
    yardstick,
)

from loraflow.verify.crosscheck import GLOBAL_BATCH, NULL_GRADIENT, STEPS, Cell

COMMAND = "python scripts/compatibility_matrix.py"


def fmt_time(seconds: float) -> str:
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


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


def count_line(d: dict[str, int]) -> str:
    return ", ".join(f"{n} {v}" for v, n in d.items() if n or v in ("pass", "fail", "refused"))


def null_pattern(name: str) -> str:
    """A tensor name with its layer numbers as `*`, so one line covers every layer's key bias."""
    return re.sub(r"\.\d+\.", ".*.", name)


def render_markdown(records: dict[str, dict[str, Any]], meta: dict[str, Any]) -> str:
    """docs/compatibility-matrix.md from evaluate()'s records and the run's meta (versions, date, times)."""
    keys = rule_keys(records)
    notes: list[str] = []  # E1, E2 ...: errors and timeouts, in full below the tables
    cells = all_cells()

    def record(cell: Cell) -> dict[str, Any]:
        return records.get(cell.id, {"verdict": "not run"})

    def entry(cell: Cell, figure: str = "grad_error") -> str:
        r = record(cell)
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
            if r.get("blank_batches"):
                text += f" ({r['blank_batches']} blank)"
        return text

    def table(quant: str, precision: str, figure: str = "grad_error") -> list[str]:
        lines = ["| adapter | checkpointing | " + " | ".join(ENGINES) + " |",
                 "|---|---|" + "---|" * len(ENGINES)]
        for adapter, ckpt in itertools.product(ADAPTERS, CHECKPOINTING):
            row = [entry(Cell(adapter, ckpt, precision, e, quantization=quant), figure) for e in ENGINES]
            lines.append(f"| {adapter} | {ckpt} | " + " | ".join(row) + " |")
        return lines

    def counts_of(group: list[Cell]) -> dict[str, int]:
        return {v: sum(record(c)["verdict"] == v for c in group) for v in VERDICTS}

    by_part = {(q, p): counts_of([c for c in cells if (c.quantization, c.precision) == (q, p)])
               for q, p in itertools.product(QUANTIZATIONS, PRECISIONS)}
    refused: dict[str, list[str]] = {}
    for c in cells:
        if record(c)["verdict"] == "refused":
            refused.setdefault(record(c)["rule"], []).append(c.id)

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
        f"- **Model and data:** `{m.get('model')}`, `{m.get('data')}`; image-text models (their own section): "
        f"`{m.get('image_text_model')}`, `{m.get('image_text_data')}`.",
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
        f"- **All {len(cells)} cells:** {count_line(counts_of(cells))}.",
    ]
    for (q, p), d in by_part.items():
        out.append(f"- **{part_label(q, p)}** ({sum(d.values())} cells): {count_line(d)}.")
    if refused:
        out.append("- **Refused, by rule:** " + "; ".join(
            f"`{rule}` {len(ids)} ({', '.join(ids)})" for rule, ids in sorted(refused.items())) + ".")
    else:
        out.append("- **Refused:** none.")
    fails = [c.id for c in cells if record(c)["verdict"] == "fail"]
    out.append(f"- **Failing their criterion:** {', '.join(fails) if fails else 'none'}.")
    it = image_text_cells()
    out.append(f"- **Image-text models** ({len(it)} cells, below): {count_line(counts_of(it))}.")
    out += ["", "Marks: [a], [b] ... = rules whose remedy the plan applied in that cell (legend below the tables); "
            "**FAIL** = outside the criterion; (E*n*) = error or timeout, in full below; (*n* blank) = *n* "
            "micro-batches without an image got the blank one (image-text cells)."]
    for q in QUANTIZATIONS:
        base = "" if q == "none" else " on the dequantized base"
        for title, precision, figure in (
                (f"fp32: gradient error against the fp32 reference{base}", "fp32", "grad_error"),
                (f"bf16-mixed: gradient error against the fp32 reference{base}", "bf16-mixed", "grad_error"),
                (f"bf16-mixed: gradient error against the single-process {part_label(q, 'bf16-mixed')} cell"
                 + " (information)", "bf16-mixed", "same_precision_error")):
            out += ["", f"## {'' if q == 'none' else q + ' '}{title}", "", *table(q, precision, figure)]
    out += image_text_section(records, meta, entry, counts_of)
    out += ["", "## Rules the plan applied", ""]
    out += [f"- [{k}] `{rule}`" for rule, k in keys.items()] or ["None."]
    out += ["", "## Errors and timeouts", ""]
    out += [f"- E{i}: {note}" for i, note in enumerate(notes, 1)] or ["None."]
    return "\n".join(out) + "\n"


def image_text_section(records: dict[str, dict[str, Any]], meta: dict[str, Any], entry, counts_of) -> list[str]:
    """## Image-text models: what differs from the text cells, its own summary, the towers x checkpointing table.
    `entry` and `counts_of` are render_markdown's (one numbering of errors, one legend of rules)."""
    cells = image_text_cells()
    ok = [c for c in cells if records.get(c.id, {}).get("verdict") in ("pass", "fail")]
    seconds = sum(s for g, s in meta.get("group_s", {}).items() if g.startswith(IMAGE_TEXT))
    out = [
        "", "## Image-text models", "",
        f"- **Model and data:** `{meta.get('image_text_model')}`, `{meta.get('image_text_data')}`"
        + (f"; {fmt_time(seconds)} of the run" if seconds else "") + ".",
        "- **Cells:** LoRA in fp32, trained and compared as the text cells (same steps, batch and optimizer), in "
        "two tower setups: **minicpm** = LoRA on "
        "the language model, the vision encoder and projector trained in full (MiniCPM-V's setup); **vision** = "
        "adapters in the vision encoder too (rank 2), the projector in full. Checkpointing recomputes the vision "
        "encoder's layers as well as the language model's. The reference is the same tower setup in one fp32 "
        "process without checkpointing.",
        f"- **Criterion:** gradient and loss error <= {IMAGE_TEXT_FP32_TOLERANCE:.0e}, ten times the text cells'. "
        "The pretrained vision encoder sums many cancelling terms into its LayerNorm and attention gradients, so "
        "the order of a sum alone moves them by about 1e-5: one process summing the same global batch as two "
        "micro-batches of half (the same step, summed as two ranks sum it) differs from one micro-batch by 5.9e-6 "
        "(minicpm, a vision layer_norm1.weight) and 8.4e-6 (vision, a q_proj lora_A). A lost, doubled or unaveraged "
        "gradient shows at 1e-3 or more.",
        "- **fp32 only:** bf16-mixed on this CPU is the same story as the text rows: it differs from the reference "
        "by bf16 rounding whatever the engine, and the towers are the same kinds of layers (linear, attention, "
        "norms) under the same engines' mixed precision, so the text bf16-mixed tables already judge it.",
        "- **Blank images:** on more than one rank, a micro-batch whose samples hold no image (text-only samples) "
        "gets a blank image, so that every rank runs the vision encoder and the engines' collectives match; "
        "(*n* blank) marks the cells where *n* micro-batches (all ranks, all steps) took that path. The `single` "
        "column never does (one process needs no blank image).",
        f"- **Null gradients:** a reference gradient at most {NULL_GRADIENT:.0e} of the largest is zero by "
        "construction (an attention key bias: softmax ignores a shift common to every key's score); it is left "
        "out of the figure, checked to stay zero, and its final weight is not compared "
        "(`crosscheck.NULL_GRADIENT`).",
        "",
        f"- **All {len(cells)} image-text cells:** {count_line(counts_of(cells))}.",
    ]
    for towers in TOWERS:
        part = [c for c in cells if c.towers == towers]
        out.append(f"- **towers-{towers}** ({len(part)} cells): {count_line(counts_of(part))}.")
    fails = [c.id for c in cells if records.get(c.id, {}).get("verdict") == "fail"]
    out.append(f"- **Failing their criterion:** {', '.join(fails) if fails else 'none'}.")
    if ok:
        def worst(key: str) -> str:
            c = max(ok, key=lambda c: records[c.id][key])
            where = f", `{records[c.id]['worst']}`" if key == "grad_error" and records[c.id].get("worst") else ""
            return f"{fmt_error(records[c.id][key])} ({c.id}{where})"

        out.append(f"- **Worst:** gradient {worst('grad_error')}; loss {worst('loss_error')}; final weights "
                   f"{worst('weight_error')} (information).")
    blank = [c for c in ok if records[c.id].get("blank_batches")]
    out.append(f"- **Blank images exercised:** in {len(blank)} of {len(ok)} measured cells"
               + (f" ({sum(records[c.id]['blank_batches'] for c in blank)} micro-batches)." if blank else
                  "; no rank's micro-batch was without an image in this data."))
    for towers in TOWERS:
        part = [c for c in ok if c.towers == towers]
        names: dict[str, int] = {}
        for name in {n for c in part for n in records[c.id].get("null_gradients", [])}:
            names[null_pattern(name)] = names.get(null_pattern(name), 0) + 1
        if part:
            drift = max(part, key=lambda c: records[c.id].get("null_drift", 0.0))
            moved = (f"; largest drift from the reference {fmt_error(records[drift.id]['null_drift'])} of the "
                     f"largest gradient, allowed {NULL_GRADIENT:.0e} ({drift.id})" if names else "")
            out.append(f"- **Null gradients, towers-{towers}:** " + (", ".join(
                f"`{p}` ({n} tensor{'s' if n > 1 else ''})" for p, n in sorted(names.items())) or "none")
                + moved + ".")
    out += ["", "| towers | checkpointing | " + " | ".join(ENGINES) + " |", "|---|---|" + "---|" * len(ENGINES)]
    for towers, ckpt in itertools.product(TOWERS, CHECKPOINTING):
        row = [entry(Cell("lora", ckpt, "fp32", e, towers=towers)) for e in ENGINES]
        out.append(f"| {towers} | {ckpt} | " + " | ".join(row) + " |")
    return out
