"""docs/compatibility-matrix.md is what scripts/compatibility_matrix.py writes: the script covers the 216 cells
(both quantizations), its judging and rendering work on results measured for real (four single-process cells, one of
them nf4, through the script's own launcher and loraflow.verify.crosscheck), and the committed document is
generated, complete and consistent with itself and with the script's criteria. The full matrix itself is not re-run
here (it takes minutes)."""

from __future__ import annotations

import importlib.util
import itertools
import re
import sys

import pytest
from conftest import ROOT

from loraflow.rules import all_rules
from loraflow.setup.model import ASSETS
from loraflow.verify.crosscheck import Cell, compare

DOC = ROOT / "docs" / "compatibility-matrix.md"
SCRIPT = ROOT / "scripts" / "compatibility_matrix.py"
ADAPTERS = ("lora", "dora", "full")
CHECKPOINTING = ("off", "reentrant", "non-reentrant")
ENGINES = ("single", "ddp", "zero2", "zero3", "zero3-offload", "fsdp2")
PRECISIONS = ("fp32", "bf16-mixed")
QUANTIZATIONS = ("none", "nf4")
FP32_TABLE = "fp32: gradient error against the fp32 reference"
BF16_TABLE = "bf16-mixed: gradient error against the fp32 reference"
NF4_FP32_TABLE = "nf4 fp32: gradient error against the fp32 reference on the dequantized base"
NF4_BF16_TABLE = "nf4 bf16-mixed: gradient error against the fp32 reference on the dequantized base"
NUMBER = r"(0|inf|\d\.\de[+-]\d\d)"
ENTRY = re.compile(rf"^(\*\*FAIL {NUMBER}\*\*|{NUMBER})( \(yardstick\))?( \[[a-z](,[a-z])*\])?$"
                   r"|^refused: `[\w-]+`$|^(error|timeout)(: [^()]+)? \(E\d+\)$|^not run$")


def load_script():
    spec = importlib.util.spec_from_file_location("compatibility_matrix", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


cm = load_script()


def tables(md: str) -> dict[str, dict[str, str]]:
    """Section title -> cell id -> table entry, for every table in the markdown."""
    out: dict[str, dict[str, str]] = {}
    for section in re.split(r"^## ", md, flags=re.M)[1:]:
        title, _, body = section.partition("\n")
        rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in body.splitlines()
                if line.startswith("|")]
        if not rows:
            continue
        head = rows[0]
        assert head[:2] == ["adapter", "checkpointing"], head
        quant, _, rest = title.partition(" ") if title.startswith("nf4 ") else ("none", "", title)
        precision = "fp32" if rest.startswith("fp32") else "bf16-mixed"
        out[title] = {Cell(row[0], row[1], precision, engine, quantization=quant).id: entry
                      for row in rows[2:] for engine, entry in zip(head[2:], row[2:], strict=True)}
    return out


def verdict(entry: str) -> str:
    if entry.startswith("**FAIL"):
        return "fail"
    for v in ("refused", "error", "timeout", "not run"):
        if entry.startswith(v):
            return v
    return "pass"


def number(entry: str) -> float:
    return float(re.search(NUMBER, entry).group(1))


def summary_counts(md: str, label: str) -> dict[str, int]:
    line = next(line for line in md.splitlines() if re.match(rf"- \*\*{re.escape(label)}:?\*\*", line))
    return {v: int(n) for n, v in re.findall(r"(\d+) (pass|fail|refused|error|timeout|not run)", line)}


def test_the_script_lists_the_216_cells_and_groups_them_per_launch():
    cells = cm.all_cells()
    assert len(cells) == 216 == len(set(cells))
    assert {(c.adapter, c.checkpointing, c.precision, c.engine, c.quantization) for c in cells} == set(
        itertools.product(ADAPTERS, CHECKPOINTING, PRECISIONS, ENGINES, QUANTIZATIONS))
    assert all(c.quantization == "none" for c in cells[:108])  # the unquantized cells keep their order
    assert all(Cell.from_id(c.id) == c for c in cells)
    assert cm.yardstick(Cell("dora", "reentrant", "bf16-mixed", "zero3", quantization="nf4")) == Cell(
        "dora", "off", "bf16-mixed", "single", quantization="nf4")
    groups = cm.groups(list(ENGINES))
    assert list(groups) == ["reference", *ENGINES]
    assert groups["reference"] == [Cell(a, "off", "fp32", "single", quantization=q)
                                   for q in QUANTIZATIONS for a in ADAPTERS]
    assert all(len(groups[e]) == 36 and {c.engine for c in groups[e]} == {e} for e in ENGINES)
    assert all({c.quantization for c in groups[e]} == set(QUANTIZATIONS) for e in ENGINES)
    assert list(cm.groups(["zero3"])) == ["reference", "single", "zero3"]  # single always: bf16 yardsticks


def test_cell_ids_parse_back_and_a_malformed_id_is_refused():
    cell = Cell("dora", "non-reentrant", "bf16-mixed", "zero3-offload", 2, "mlp", "lora", "nf4")
    assert cell.id == "dora/non-reentrant-mlp/bf16-mixed/zero3-offload/gas2/head-lora/nf4"
    assert Cell.from_id(cell.id) == cell
    assert Cell.from_id("full/reentrant/fp32/fsdp2") == Cell("full", "reentrant", "fp32", "fsdp2")
    for bad in ("lora/off/fp32", "lora/off/fp32/ddp/nf4/gas2", "lora/off/fp32/ddp/none", "lora/off/fp32/ddp/gas1"):
        with pytest.raises(ValueError, match="cell id"):
            Cell.from_id(bad)


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict:
    """Four single-process cells measured for real through the script's launcher (one plain process). The nf4 one
    is its own reference: a 4-bit base, dequantized to float32 layers before training."""
    cells = [Cell("lora", "off", "fp32", "single"), Cell("lora", "reentrant", "fp32", "single"),
             Cell("lora", "off", "bf16-mixed", "single"), Cell("lora", "off", "fp32", "single", quantization="nf4")]
    return cm.run_group("single", cells, str(ASSETS / "tiny-base"), str(ASSETS / "reverse" / "train.jsonl"),
                        tmp_path_factory.mktemp("cells"), timeout=300)


def test_rendering_real_results(measured):
    ref = Cell("lora", "off", "fp32", "single")  # the reference cell's config: it serves as the reference
    nf4 = Cell("lora", "off", "fp32", "single", quantization="nf4")
    records = cm.evaluate(measured, {ref.id: measured[ref.id], nf4.id: measured[nf4.id]})
    assert {cid for cid, r in records.items() if r["verdict"] != "not run"} == set(measured)
    assert all(records[cid]["verdict"] == "pass" for cid in measured), records
    bf16 = records["lora/off/bf16-mixed/single"]
    assert 1e-4 < bf16["grad_error"] < 0.5  # bf16 rounding, measured: not zero, not garbage
    assert bf16["limit"] == pytest.approx(2 * bf16["grad_error"]) and bf16["same_precision_error"] == 0
    md = cm.render_markdown(records, {"date": "2000-01-01 00:00 UTC", "torch": "T", "wall_s": 1.0})
    assert "Generated by `python scripts/compatibility_matrix.py`" in md
    t = tables(md)
    assert t[FP32_TABLE]["lora/off/fp32/single"] == "0"
    # The reference computes full logits, the other cells the head at learned positions only: float rounding apart.
    assert records["lora/reentrant/fp32/single"]["grad_error"] <= 1e-5
    key = cm.rule_keys(records)["reentrant-frozen-inputs"]  # the nf4 cell's rules take letters too
    assert re.fullmatch(rf"(0|\d\.\de-\d\d) \[{key}\]", t[FP32_TABLE]["lora/reentrant/fp32/single"])
    assert f"- [{key}] `reentrant-frozen-inputs`" in md
    assert t[BF16_TABLE]["lora/off/bf16-mixed/single"] == f"{bf16['grad_error']:.1e} (yardstick)"
    assert t[FP32_TABLE]["lora/off/fp32/ddp"] == "not run"
    nf4_marks = ",".join(cm.rule_keys(records)[r] for r in records[nf4.id]["rules"])
    assert t[NF4_FP32_TABLE]["lora/off/fp32/single/nf4"] == ("0" + (f" [{nf4_marks}]" if nf4_marks else ""))
    assert t[NF4_FP32_TABLE]["lora/off/fp32/ddp/nf4"] == "not run"
    # the nf4 reference trains on the 4-bit weights (dequantized), not on the float base: its gradient differs
    assert compare(measured[nf4.id], measured[ref.id])["grad_error"] > 1e-4
    assert summary_counts(md, "All 216 cells") == {"pass": 4, "fail": 0, "refused": 0, "not run": 212}
    assert summary_counts(md, "nf4 fp32") == {"pass": 1, "fail": 0, "refused": 0, "not run": 53}
    assert cm.failed_fp32(records) == []


def test_a_gradient_off_by_1e_3_fails_and_a_crash_is_reported(measured):
    ref = Cell("lora", "off", "fp32", "single")
    raw = {cid: r for cid, r in measured.items() if Cell.from_id(cid).quantization == "none"}
    bad = raw["lora/reentrant/fp32/single"]
    raw["lora/reentrant/fp32/single"] = {**bad, "grads": {k: v * (1 + 1e-3) for k, v in bad["grads"].items()}}
    raw["lora/off/fp32/ddp"] = {"status": "error", "message": "RuntimeError: the message of a crash"}
    # a cell the plan refuses is refused, also where its reference is refused too (full fine-tuning of a 4-bit base)
    refusal = {"status": "refused", "rule": "kbit-full-finetune", "message": "a 4-bit base trained without adapters"}
    raw["full/reentrant/fp32/ddp/nf4"] = refusal
    records = cm.evaluate(raw, {ref.id: raw[ref.id], "full/off/fp32/single/nf4": refusal})
    assert records["full/reentrant/fp32/ddp/nf4"]["verdict"] == "refused"
    assert records["lora/reentrant/fp32/single"]["verdict"] == "fail"
    assert cm.failed_fp32(records) == ["lora/off/fp32/ddp", "lora/reentrant/fp32/single"]  # table order
    md = cm.render_markdown(records, {})
    t = tables(md)
    assert t[FP32_TABLE]["lora/reentrant/fp32/single"] == "**FAIL 1.0e-03** [a]"
    assert t[FP32_TABLE]["lora/off/fp32/ddp"] == "error: RuntimeError (E1)"
    assert "- E1: lora/off/fp32/ddp: RuntimeError: the message of a crash" in md
    assert "**Failing their criterion:** lora/reentrant/fp32/single." in md
    assert t[NF4_FP32_TABLE]["full/reentrant/fp32/ddp/nf4"] == "refused: `kbit-full-finetune`"


def test_the_committed_document_is_generated_complete_and_consistent():
    md = DOC.read_text()
    assert md.startswith("# Compatibility matrix")
    assert "Generated by `python scripts/compatibility_matrix.py`" in md and "never edit by hand" in md
    assert re.search(r"\*\*Run:\*\* \d{4}-\d\d-\d\d \d\d:\d\d UTC", md)
    stack = next(line for line in md.splitlines() if line.startswith("- **Stack:**"))
    for word in ("torch 2", "transformers ", "peft ", "deepspeed ", "bitsandbytes 0", "2 processes", "gloo"):
        assert word in stack, word
    t = tables(md)
    entries = {**t[FP32_TABLE], **t[BF16_TABLE], **t[NF4_FP32_TABLE], **t[NF4_BF16_TABLE]}
    assert set(entries) == {c.id for c in cm.all_cells()}  # every cell, once
    for q, info in zip(QUANTIZATIONS, (list(t)[2], list(t)[5]), strict=True):
        assert "(information)" in info
        assert set(t[info]) == {c.id for c in cm.all_cells() if (c.precision, c.quantization) == ("bf16-mixed", q)}
    for cid, entry in entries.items():
        assert ENTRY.match(entry), f"{cid}: {entry!r}"
        assert entry != "not run", f"{cid} was not run: the committed document is a full run"
    # the summary counts what the tables show
    def shown(ids: list[str]) -> dict[str, int]:  # zero counts are shown for pass, fail and refused only
        counts = {v: sum(verdict(entries[cid]) == v for cid in ids) for v in cm.VERDICTS}
        return {v: n for v, n in counts.items() if n or v in ("pass", "fail", "refused")}

    assert summary_counts(md, "All 216 cells") == shown(list(entries))
    for q, p in itertools.product(QUANTIZATIONS, PRECISIONS):
        label = p if q == "none" else f"{q} {p}"
        assert summary_counts(md, label) == shown([cid for cid in entries if
                                                   (Cell.from_id(cid).quantization, Cell.from_id(cid).precision)
                                                   == (q, p)])
    # QLoRA in fp32 matches LoRA on the dequantized base under every engine; only full fine-tuning of a 4-bit base
    # is refused, by its rule
    for cid, entry in t[NF4_FP32_TABLE].items():
        if Cell.from_id(cid).adapter == "full":
            assert entry == "refused: `kbit-full-finetune`", f"{cid}: {entry}"
        else:
            assert verdict(entry) == "pass", f"{cid}: {entry}"
    # the criteria hold for what the tables print (2 significant digits: 5% slack for the printed rounding)
    for cid, entry in entries.items():
        cell = Cell.from_id(cid)
        if verdict(entry) != "pass":
            continue
        if cell.precision == "fp32":
            assert number(entry) <= cm.FP32_TOLERANCE * 1.05, f"{cid}: {entry}"
        else:
            stick = number(entries[cm.yardstick(cell).id])
            assert number(entry) <= cm.BF16_FACTOR * stick * 1.05, f"{cid}: {entry} (yardstick {stick})"
    failing = re.search(r"\*\*Failing their criterion:\*\* (.*)\.$", md, flags=re.M).group(1)
    assert failing == (", ".join(cid for cid in entries if verdict(entries[cid]) == "fail") or "none")
    # refusals and rule marks name real rules, each defined in the legend
    known = {r.id for r in all_rules()}
    legend = dict(re.findall(r"^- \[([a-z])\] `([\w-]+)`$", md, flags=re.M))
    assert set(legend.values()) <= known
    for cid, entry in entries.items():
        if verdict(entry) == "refused":
            assert re.search(r"`([\w-]+)`", entry).group(1) in known | {"config"}, entry
        for keys in re.findall(r"\[([a-z,]+)\]$", entry):
            assert set(keys.split(",")) <= set(legend), f"{cid}: {entry}"
    notes = re.findall(r"\(E(\d+)\)", md)
    assert sorted(map(int, notes)) == list(range(1, len(notes) + 1))
    assert all(f"- E{n}: " in md for n in notes)
