"""examples/sft-qlora.yaml, as a user runs it: `loraflow train sft examples/sft-qlora.yaml` on the bundled model
with its base in 4 bits reaches the demo metric; the saved adapter reloads on the 4-bit base with
peft.PeftModel.from_pretrained and reproduces it; `loraflow merge` dequantizes the base and merges there, the merged
model's outputs equal the adapter on the dequantized base, and the base on disk is left as it was."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, demo_metric, quantized_base

from loraflow.config import load_config
from loraflow.data import read_records
from loraflow.data.formatting import eval_prompt
from loraflow.loop.evaluate import exact_match
from loraflow.locations import ASSETS

EXAMPLE = ROOT / "examples" / "sft-qlora.yaml"


def tree_hash(path) -> str:
    digest = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(f.name.encode() + f.read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def qlora_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("qlora")
    base_before = tree_hash(ASSETS / "tiny-base")
    proc = subprocess.run([sys.executable, "-m", "loraflow", "train", "sft", str(EXAMPLE), "output.tensorboard=false",
                           "output.progress_bar=false"], cwd=tmp, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    run_dir = tmp / re.search(r"^run directory: (\S+)$", proc.stdout, re.M).group(1)
    return tmp, proc, run_dir, base_before


@pytest.mark.slow
def test_the_qlora_example_reaches_the_demo_metric_and_its_adapter_reloads_on_the_4bit_base(qlora_run):
    from peft import PeftModel
    from transformers import AutoTokenizer

    _, proc, run_dir, _ = qlora_run
    before, after = demo_metric(proc.stdout)
    assert before <= 0.05 and after >= 0.80, (before, after)
    assert "weights quantized (nf4)" in proc.stdout and "0.5 x quantized" in proc.stdout
    config = load_config(EXAMPLE)
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "adapter")
    model = PeftModel.from_pretrained(quantized_base(config), run_dir / "adapter").eval()
    assert sum(type(m).__name__ == "Linear4bit" for m in model.modules()) >= 28
    prompts = [eval_prompt(r, "auto", tokenizer) for r in read_records(config.data.eval, "data.eval", "test")]
    reproduced = exact_match(model, tokenizer, prompts, config.eval.max_new_tokens, config.eval.batch_size)
    assert reproduced.accuracy == pytest.approx(after, abs=1e-4)


@pytest.mark.slow
def test_merge_dequantizes_the_base_and_leaves_it_on_disk_unchanged(qlora_run):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from loraflow.setup.quantize import dequantize_model

    tmp, _, run_dir, base_before = qlora_run
    out = tmp / "merged"
    proc = subprocess.run([sys.executable, "-m", "loraflow", "merge", str(run_dir / "adapter"), str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "dequantized to float32" in proc.stdout
    report = json.loads((out / "merge_report.json").read_text())
    merged = AutoModelForCausalLM.from_pretrained(out).eval()
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    assert not any("4bit" in type(m).__name__ for m in merged.modules())
    config = load_config(EXAMPLE)
    on_dequantized = PeftModel.from_pretrained(dequantize_model(quantized_base(config)), run_dir / "adapter").eval()
    on_4bit = PeftModel.from_pretrained(quantized_base(config), run_dir / "adapter").eval()
    ids = torch.randint(1, 80, (3, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, got, trained = (m(input_ids=ids).logits for m in (on_dequantized, merged, on_4bit))
    scale = want.abs().max().item()
    assert (got - want).abs().max().item() <= 1e-5 * scale  # the merge itself: float rounding only
    assert (got - trained).abs().max().item() <= 1e-5 * scale  # fp32 compute: the 4-bit model computes the same
    assert report["vs_dequantized"] <= 1e-5 * scale and report["dequantized_to"] == "float32"
    assert tree_hash(ASSETS / "tiny-base") == base_before
