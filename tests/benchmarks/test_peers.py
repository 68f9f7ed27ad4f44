"""benchmarks/peers.py --smoke: the three variants (plain PyTorch, TRL, loraflow) run the same first batch from the
same adapter, and the figures it prints are the ones it writes. Nothing here is about speed."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys

import pytest
from conftest import ROOT

SCRIPT = ROOT / "benchmarks" / "peers.py"
VARIANTS = ("plain", "trl", "loraflow")
CELLS = ("checkpointing-off", "checkpointing-on")


def _peers_module():
    spec = importlib.util.spec_from_file_location("peers_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("peers") / "peers.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--json", str(out)], capture_output=True,
                          text=True, timeout=300, cwd=ROOT, check=False)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    return json.loads(out.read_text()), proc.stdout


def test_every_variant_runs_the_same_first_batch_from_the_same_adapter(smoke):
    report, _ = smoke
    assert set(report["cells"]) == set(CELLS)
    for name, cell in report["cells"].items():
        for v in VARIANTS:
            assert "error" not in cell[v], f"{name} {v}: {cell[v].get('error')}\n{cell[v].get('stderr_tail')}"
        hashes = {v: cell[v]["first_batch_hash"] for v in VARIANTS}
        assert len(set(hashes.values())) == 1 and None not in hashes.values(), (name, hashes)
        losses = [cell[v]["first_loss"] for v in VARIANTS]
        assert max(losses) - min(losses) <= 1e-4 * abs(losses[0]), (name, losses)
        assert cell["problems"] == []


def test_figures_are_positive_and_the_printed_ratios_are_the_json_ones(smoke):
    report, stdout = smoke
    assert report["matmul_flops_per_s"] > 0 and report["floor"]["total"] > 0
    sections = re.split(r"^== (\S+) ==$", stdout, flags=re.MULTILINE)
    printed = dict(zip(sections[1::2], sections[2::2]))
    assert set(printed) == set(CELLS)
    for name, cell in report["cells"].items():
        for v in VARIANTS:
            r = cell[v]
            for key in ("flops", "saved_bytes", "peak_rss_mb", "median_s"):
                assert isinstance(r[key], (int, float)) and r[key] > 0, (name, v, key, r[key])
            assert len(r["step_times"]) == report["steps"] - 1  # the first step is warm-up
        for other in ("plain", "trl"):
            ratio = cell["ratios"][f"loraflow/{other}"]
            for key in ("median_s", "flops", "peak_rss_mb", "saved_bytes"):
                assert ratio[key] == pytest.approx(cell["loraflow"][key] / cell[other][key])
            line = re.search(rf"^loraflow/{other}\s+time (\S+)\s+FLOPs (\S+)\s+RSS (\S+)\s+saved (\S+)$",
                             printed[name], flags=re.MULTILINE)
            assert line, printed[name]
            shown = [float(x) for x in line.groups()]
            assert shown == [round(ratio[k], 2) for k in ("median_s", "flops", "peak_rss_mb", "saved_bytes")]


def test_the_comparability_check_catches_a_different_batch_or_start():
    peers = _peers_module()
    same = {v: {"hashes": ["abc"], "first_loss": 6.9} for v in VARIANTS}
    assert peers.check_identical(same) == []
    other_batch = {**same, "trl": {"hashes": ["abd"], "first_loss": 6.9}}
    assert "first batches differ" in peers.check_identical(other_batch)[0]
    other_start = {**same, "loraflow": {"hashes": ["abc"], "first_loss": 6.9 * (1 + 3e-4)}}
    assert "first losses differ" in peers.check_identical(other_start)[0]
