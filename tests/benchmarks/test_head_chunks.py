"""benchmarks/head_chunks.py at toy size: every chunking of loraflow's learned-position head gives the gradient of the
plain loop's full-logits cross-entropy (the benchmark's timing is only worth reading on a GPU)."""

from __future__ import annotations

import json
import sys

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

from head_chunks import main  # noqa: E402


def test_every_chunking_gives_the_full_heads_gradient(tmp_path, capsys):
    out = tmp_path / "head.json"
    assert main(["--quick", "--device", "cpu", "--repeats", "1", "--rounds", "1", "--chunks", "7,64",
                 "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    names = [r["variant"] for r in report["results"]]
    assert names[0] == "full" and names[1].startswith("chunk=default") and names[2:] == ["chunk=7", "chunk=64"]
    full_loss = report["results"][0]["loss"]
    for r in report["results"]:
        assert r["grad_rel_err"] < 1e-4, r  # the same bf16 logits, softmax in float32 either way
        assert abs(r["loss"] - full_loss) < 1e-4 * abs(full_loss), r
    assert "x full" in capsys.readouterr().out
