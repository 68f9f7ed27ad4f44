"""docs/compatibility-matrix.md is what scripts/compatibility_matrix.py writes: the script covers the 216 text cells
(both quantizations) and the 36 image-text cells (two tower setups), its judging and rendering work on results
measured for real (four single-process text cells, one of them nf4, through the script's own launcher and
loraflow.verify.crosscheck) and on small made-up image-text records (blank images, null gradients, a failure, a
crash), and the committed document is generated, complete and consistent with itself and with the script's
criteria. The full matrix itself is not re-run here (it takes minutes)."""

from __future__ import annotations

import importlib.util
import itertools
import re
import sys

import pytest
import torch
from conftest import ROOT

from loraflow.rules import all_rules
from loraflow.locations import ASSETS
from loraflow.verify.crosscheck import NULL_GRADIENT, Cell, compare

DOC = ROOT / "docs" / "compatibility-matrix.md"
SCRIPT = ROOT / "scripts" / "compatibility_matrix.py"
ADAPTERS = ("lora", "dora", "full")
CHECKPOINTING = ("off", "reentrant", "non-reentrant")
ENGINES = ("single", "ddp", "zero2", "zero3", "zero3-offload", "fsdp2")
PRECISIONS = ("fp32", "bf16-mixed")
QUANTIZATIONS = ("none", "nf4")
TOWERS = ("minicpm", "vision")
IMAGE_TEXT_TABLE = "Image-text models"
FP32_TABLE = "fp32: gradient error against the fp32 reference"
BF16_TABLE = "bf16-mixed: gradient error against the fp32 reference"
NF4_FP32_TABLE = "nf4 fp32: gradient error against the fp32 reference on the dequantized base"
NF4_BF16_TABLE = "nf4 bf16-mixed: gradient error against the fp32 reference on the dequantized base"
NUMBER = r"(0|inf|\d\.\de[+-]\d\d)"
ENTRY = re.compile(rf"^(\*\*FAIL {NUMBER}\*\*|{NUMBER})( \(yardstick\))?( \[[a-z](,[a-z])*\])?( \(\d+ blank\))?$"
                   r"|^refused: `[\w-]+`$|^(error|timeout)(: [^()]+)? \(E\d+\)$|^not run$")


def load_script():
    spec = importlib.util.spec_from_file_location("compatibility_matrix", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


cm = load_script()  # it puts scripts/ on sys.path: the cells and the renderer are modules of their own there
mc, mr = sys.modules["matrix_cells"], sys.modules["matrix_render"]


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
        if title == IMAGE_TEXT_TABLE:  # towers x checkpointing rows, LoRA in fp32
            assert head[:2] == ["towers", "checkpointing"], head
            out[title] = {Cell("lora", row[1], "fp32", engine, towers=row[0]).id: entry
                          for row in rows[2:] for engine, entry in zip(head[2:], row[2:], strict=True)}
            continue
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


def test_the_script_lists_the_216_text_cells_and_groups_them_per_launch():
    cells = mc.all_cells()
    assert len(cells) == 216 == len(set(cells))
    assert {(c.adapter, c.checkpointing, c.precision, c.engine, c.quantization) for c in cells} == set(
        itertools.product(ADAPTERS, CHECKPOINTING, PRECISIONS, ENGINES, QUANTIZATIONS))
    assert all(c.quantization == "none" for c in cells[:108])  # the unquantized cells keep their order
    assert all(Cell.from_id(c.id) == c for c in cells)
    assert mc.yardstick(Cell("dora", "reentrant", "bf16-mixed", "zero3", quantization="nf4")) == Cell(
        "dora", "off", "bf16-mixed", "single", quantization="nf4")
    groups = cm.groups(list(ENGINES), image_text=False)
    assert list(groups) == ["reference", *ENGINES]
    assert groups["reference"] == [Cell(a, "off", "fp32", "single", quantization=q)
                                   for q in QUANTIZATIONS for a in ADAPTERS]
    assert all(len(groups[e]) == 36 and {c.engine for c in groups[e]} == {e} for e in ENGINES)
    assert all({c.quantization for c in groups[e]} == set(QUANTIZATIONS) for e in ENGINES)
    # single always: bf16 yardsticks
    assert list(cm.groups(["zero3"], image_text=False)) == ["reference", "single", "zero3"]


def test_the_36_image_text_cells_run_in_launches_of_their_own():
    cells = mc.image_text_cells()
    assert len(cells) == 36 == len(set(cells))
    assert {(c.towers, c.checkpointing, c.engine) for c in cells} == set(
        itertools.product(TOWERS, CHECKPOINTING, ENGINES))
    assert {(c.adapter, c.precision, c.quantization, c.accumulation) for c in cells} == {("lora", "fp32", "none", 1)}
    assert all(Cell.from_id(c.id) == c and c.id.endswith(f"/towers-{c.towers}") for c in cells)
    assert not set(cells) & set(mc.all_cells()) and len(mc.every_cell()) == 252
    groups = cm.groups(list(ENGINES))
    it = [f"image-text-{e}" for e in ENGINES]
    assert list(groups) == ["reference", *ENGINES, "image-text-reference", *it]  # text first, then image-text
    assert groups["image-text-reference"] == [Cell("lora", "off", "fp32", "single", towers=t) for t in TOWERS]
    assert all(len(groups[g]) == 6 and {c.engine for c in groups[g]} == {g.removeprefix("image-text-")}
               and {c.towers for c in groups[g]} == set(TOWERS) for g in it)
    assert all(c.towers == "none" for e in ENGINES for c in groups[e])
    # --only-engines applies to the image-text cells too (no yardsticks there: single only when asked)
    assert list(cm.groups(["zero3"])) == ["reference", "single", "zero3", "image-text-reference", "image-text-zero3"]
    assert list(cm.groups(["ddp"], text=False)) == ["image-text-reference", "image-text-ddp"]


def test_a_missing_image_text_model_is_refused_before_any_cell_runs(capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        cm.main(["--image-text-model", "builtin:no-such-model", "--out", str(tmp_path / "m.md")])
    assert exc.value.code == 2 and not (tmp_path / "m.md").exists()
    err = capsys.readouterr().err
    assert "--image-text-model=builtin:no-such-model" in err and "--skip-image-text" in err


def test_cell_ids_parse_back_and_a_malformed_id_is_refused():
    cell = Cell("dora", "non-reentrant", "bf16-mixed", "zero3-offload", 2, "mlp", "lora", "nf4")
    assert cell.id == "dora/non-reentrant-mlp/bf16-mixed/zero3-offload/gas2/head-lora/nf4"
    assert Cell.from_id(cell.id) == cell
    assert Cell.from_id("full/reentrant/fp32/fsdp2") == Cell("full", "reentrant", "fp32", "fsdp2")
    vision = Cell("lora", "non-reentrant", "fp32", "zero3-offload", towers="vision")
    assert vision.id == "lora/non-reentrant/fp32/zero3-offload/towers-vision" and Cell.from_id(vision.id) == vision
    for bad in ("lora/off/fp32", "lora/off/fp32/ddp/nf4/gas2", "lora/off/fp32/ddp/none", "lora/off/fp32/ddp/gas1",
                "lora/off/fp32/ddp/towers-vision/nf4"):
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
    key = mr.rule_keys(records)["reentrant-frozen-inputs"]  # the nf4 cell's rules take letters too
    assert re.fullmatch(rf"(0|\d\.\de-\d\d) \[{key}\]", t[FP32_TABLE]["lora/reentrant/fp32/single"])
    assert f"- [{key}] `reentrant-frozen-inputs`" in md
    assert t[BF16_TABLE]["lora/off/bf16-mixed/single"] == f"{bf16['grad_error']:.1e} (yardstick)"
    assert t[FP32_TABLE]["lora/off/fp32/ddp"] == "not run"
    nf4_marks = ",".join(mr.rule_keys(records)[r] for r in records[nf4.id]["rules"])
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


def _record(grads: dict[str, torch.Tensor], blank: int = 0, scale: float = 1.0) -> dict:
    """A worker's record as crosscheck.run_cell writes it, made up: gradients `grads` (times `scale`)."""
    return {"status": "ok", "losses": [2.0, 1.5, 1.25], "grads": {k: v * scale for k, v in grads.items()},
            "missing": [], "final": {k: v + 1 for k, v in grads.items()}, "decisions": [], "blank_batches": blank,
            "saved_tensors": len(grads)}


def test_image_text_cells_render_in_their_own_section_with_blank_images_and_null_gradients():
    torch.manual_seed(0)
    key_bias = "model.vision_tower.vision_model.encoder.layers.{}.self_attn.k_proj.bias"
    grads = {"model.language_model.layers.0.self_attn.q_proj.lora_A.default.weight": torch.randn(4, 8),
             "model.vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight": torch.randn(8, 8),
             key_bias.format(0): torch.zeros(8), key_bias.format(1): torch.zeros(8)}
    refs = {c.id: _record(grads) for c in (Cell("lora", "off", "fp32", "single", towers=t) for t in TOWERS)}
    ok, blank = Cell("lora", "reentrant", "fp32", "ddp", towers="minicpm"), Cell("lora", "off", "fp32", "zero3",
                                                                                  towers="vision")
    off = Cell("lora", "non-reentrant", "fp32", "fsdp2", towers="vision")
    broken_null = Cell("lora", "off", "fp32", "zero2", towers="minicpm")
    crash = Cell("lora", "off", "fp32", "zero3-offload", towers="minicpm")
    raw = {ok.id: _record(grads), blank.id: _record(grads, blank=3), off.id: _record(grads, scale=1 + 1e-3),
           broken_null.id: _record({**grads, key_bias.format(1): torch.full((8,), 1e-3)}),
           crash.id: {"status": "error", "message": "RuntimeError: the towers crashed"}}
    records = cm.evaluate(raw, refs)
    assert [records[c.id]["verdict"] for c in (ok, blank, off, broken_null, crash)] == [
        "pass", "pass", "fail", "fail", "error"]
    assert records[blank.id]["blank_batches"] == 3
    assert records[ok.id]["null_gradients"] == [key_bias.format(0), key_bias.format(1)]
    assert records[broken_null.id]["grad_error"] == float("inf")  # a null gradient that is not null any more
    assert cm.failed_fp32(records) == [broken_null.id, crash.id, off.id]  # table order: towers, ckpt, engine
    md = cm.render_markdown(records, {"image_text_model": "builtin:tiny-vlm", "image_text_data": "D.jsonl",
                                      "group_s": {"ddp": 60.0, "image-text-reference": 5.0, "image-text-ddp": 70.0}})
    t = tables(md)
    assert list(t)[-1] == IMAGE_TEXT_TABLE and set(t[IMAGE_TEXT_TABLE]) == {c.id for c in mc.image_text_cells()}
    assert set(t[FP32_TABLE]) == {c.id for c in mc.all_cells() if c.precision == "fp32" and c.quantization == "none"}
    it = t[IMAGE_TEXT_TABLE]
    assert (it[ok.id], it[blank.id], it[off.id], it[broken_null.id]) == (
        "0", "0 (3 blank)", "**FAIL 1.0e-03**", "**FAIL inf**")
    assert it[crash.id] == "error: RuntimeError (E1)" and "- E1: " + crash.id + ": RuntimeError: the towers" in md
    assert all(ENTRY.match(e) for e in it.values())
    section = md[md.index("## Image-text models"):]
    assert "- **Model and data:** `builtin:tiny-vlm`, `D.jsonl`; 1m15s of the run." in section
    assert "fp32 only" in section and "blank image" in section
    assert summary_counts(md, "All 36 image-text cells") == {"pass": 2, "fail": 2, "refused": 0, "error": 1,
                                                             "not run": 31}
    assert summary_counts(md, "towers-vision") == {"pass": 1, "fail": 1, "refused": 0, "not run": 16}
    assert summary_counts(md, "Image-text models") == summary_counts(md, "All 36 image-text cells")
    assert summary_counts(md, "All 216 cells") == {"pass": 0, "fail": 0, "refused": 0, "not run": 216}
    assert f"**Failing their criterion:** {broken_null.id}, {off.id}." in section
    assert "**Failing their criterion:** none." in md[:md.index("## Image-text models")]  # the text cells' own
    assert "**Blank images exercised:** in 1 of 4 measured cells (3 micro-batches)." in section
    pattern = "`model.vision_tower.vision_model.encoder.layers.*.self_attn.k_proj.bias` (2 tensors)"
    # the inf hides by how much a null gradient moved: 1e-3 of the largest gradient (limit NULL_GRADIENT)
    assert records[broken_null.id]["null_drift"] == pytest.approx(1e-3 * 8 ** 0.5 / max(
        float(g.norm()) for g in grads.values()))
    assert f"**Null gradients, towers-minicpm:** {pattern}; largest drift from the reference " \
           f"{records[broken_null.id]['null_drift']:.1e} of the largest gradient, allowed {NULL_GRADIENT:.0e} " \
           f"({broken_null.id})." \
           in section
    assert "**Null gradients, towers-vision:** `" in section  # the same made-up tensors, no drift: 0
    assert f"**Worst:** gradient inf ({broken_null.id}, `{key_bias.format(1)}`)" in section


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
    assert set(entries) == {c.id for c in mc.all_cells()}  # every cell, once
    for q, info in zip(QUANTIZATIONS, (list(t)[2], list(t)[5]), strict=True):
        assert "(information)" in info
        assert set(t[info]) == {c.id for c in mc.all_cells() if (c.precision, c.quantization) == ("bf16-mixed", q)}
    for cid, entry in entries.items():
        assert ENTRY.match(entry), f"{cid}: {entry!r}"
        assert entry != "not run", f"{cid} was not run: the committed document is a full run"
    # the summary counts what the tables show
    def shown(ids: list[str]) -> dict[str, int]:  # zero counts are shown for pass, fail and refused only
        counts = {v: sum(verdict(entries[cid]) == v for cid in ids) for v in mc.VERDICTS}
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
            assert number(entry) <= mc.FP32_TOLERANCE * 1.05, f"{cid}: {entry}"
        else:
            stick = number(entries[mc.yardstick(cell).id])
            assert number(entry) <= mc.BF16_FACTOR * stick * 1.05, f"{cid}: {entry} (yardstick {stick})"
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
    check_image_text_section(md, t, known, legend)


def check_image_text_section(md: str, t: dict[str, dict[str, str]], known: set[str], legend: dict[str, str]) -> None:
    """The committed document's image-text section: every cell run on the embedded demo, the summary counting what
    the table shows, each passing figure within the fp32 criterion, blank images exercised and shown."""
    assert "\n## Image-text models\n" in md, f"no image-text section: run `{mr.COMMAND}` again"
    section = md[md.index("## Image-text models"):md.index("## Rules the plan applied")]
    assert f"- **Model and data:** `{cm.IMAGE_TEXT_MODEL}`, `{cm.IMAGE_TEXT_DATA}`" in section
    entries = t[IMAGE_TEXT_TABLE]
    assert set(entries) == {c.id for c in mc.image_text_cells()}
    for cid, entry in entries.items():
        assert ENTRY.match(entry) and entry != "not run", f"{cid}: {entry!r}"
        if verdict(entry) == "pass":
            assert number(entry) <= mc.IMAGE_TEXT_FP32_TOLERANCE * 1.05, f"{cid}: {entry}"
        for keys in re.findall(r"\[([a-z,]+)\]", entry):
            assert set(keys.split(",")) <= set(legend), f"{cid}: {entry}"
        if verdict(entry) == "refused":
            assert re.search(r"`([\w-]+)`", entry).group(1) in known | {"config"}, entry
        if Cell.from_id(cid).engine == "single":
            assert "blank" not in entry, f"{cid}: one process needs no blank image: {entry}"

    def shown(ids: list[str]) -> dict[str, int]:
        counts = {v: sum(verdict(entries[cid]) == v for cid in ids) for v in mc.VERDICTS}
        return {v: n for v, n in counts.items() if n or v in ("pass", "fail", "refused")}

    assert summary_counts(section, "All 36 image-text cells") == shown(list(entries))
    assert summary_counts(md, "Image-text models") == shown(list(entries))  # the document's summary
    for towers in TOWERS:
        assert summary_counts(section, f"towers-{towers}") == shown(
            [cid for cid in entries if Cell.from_id(cid).towers == towers])
        assert f"**Null gradients, towers-{towers}:** " in section
    failing = re.search(r"\*\*Failing their criterion:\*\* (.*)\.$", section, flags=re.M).group(1)
    assert failing == (", ".join(cid for cid in entries if verdict(entries[cid]) == "fail") or "none")
    blanks = [int(n) for e in entries.values() for n in re.findall(r"\((\d+) blank\)", e)]
    measured = sum(verdict(e) in ("pass", "fail") for e in entries.values())
    assert f"**Blank images exercised:** in {len(blanks)} of {measured} measured cells" in section
