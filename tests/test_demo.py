"""The README's main job: `loraflow train sft` with no config, on the bundled model and data. It must reach the
metric the README promises, and the saved adapter, loaded with peft.PeftModel.from_pretrained, must reproduce it."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loraflow.config import load_config
from loraflow.data import read_records
from loraflow.data.formatting import eval_prompt
from loraflow.evaluate import exact_match
from loraflow.run import demo_config
from loraflow.setup.model import ASSETS


ZERO3_JSON = Path(__file__).resolve().parent.parent / "examples" / "deepspeed" / "zero3-shard-small-models.json"


def _metric(stdout: str) -> tuple[float, float]:
    found = re.search(r"eval exact_match: ([\d.]+) -> ([\d.]+)", stdout)
    assert found, stdout[-2000:]
    return float(found.group(1)), float(found.group(2))


@pytest.fixture(scope="module")
def single_demo(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("demo")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "loraflow", "train", "sft"], cwd=tmp, capture_output=True,
                          text=True, timeout=900)
    wall = time.perf_counter() - start
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return tmp, proc, wall


@pytest.mark.slow
def test_demo_reaches_its_metric_and_the_saved_adapter_reproduces_it(single_demo):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp_path, proc, wall = single_demo
    before, after = _metric(proc.stdout)
    print(f"demo: exact match {before:.2f} -> {after:.2f} in {wall:.0f}s wall (including start-up)")
    assert before <= 0.05, "the base model should not already do the task"
    assert after >= 0.80

    run_dir = tmp_path / re.search(r"^run directory: (\S+)$", proc.stdout, re.M).group(1)
    adapter = run_dir / "adapter"
    tokenizer = AutoTokenizer.from_pretrained(adapter)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(ASSETS / "tiny-base"), adapter)
    config = load_config(demo_config("sft"))
    prompts = [eval_prompt(r, "auto", tokenizer) for r in read_records(config.data.eval, "data.eval", "test")]
    reproduced = exact_match(model, tokenizer, prompts, config.eval.max_new_tokens, config.eval.batch_size)
    assert reproduced.accuracy == pytest.approx(after, abs=1e-4)
    assert Path(run_dir / "metrics.jsonl").is_file() and (run_dir / "tensorboard").is_dir()


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["zero3", "fsdp2"])
def test_demo_on_two_processes_reaches_the_single_process_metric(engine, single_demo, tmp_path):
    """The embedded default under `torchrun --nproc_per_node 2`, with the same global batch (8 per process)."""
    from loraflow.engines.launch import launch_env, run_isolated, torchrun_argv

    args = ["parallel.engine=fsdp2"] if engine == "fsdp2" else \
        ["parallel.engine=deepspeed", f"parallel.deepspeed_config={ZERO3_JSON}"]
    log = tmp_path / "train.log"
    start = time.perf_counter()
    code = run_isolated(torchrun_argv(2, ["-m", "loraflow", "train", "sft", "train.micro_batch_size=8", *args]),
                        log, 900, launch_env(), cwd=str(tmp_path))
    wall = time.perf_counter() - start
    out = log.read_text()
    assert code == 0, out[-5000:]
    single = _metric(single_demo[1].stdout)
    before, after = _metric(out)
    print(f"demo under {engine} on 2 processes: exact match {before:.2f} -> {after:.2f} in {wall:.0f}s wall; "
          f"one process: {single[0]:.2f} -> {single[1]:.2f}")
    assert before == single[0] and after == pytest.approx(single[1], abs=0.02)
    assert "memory per rank after the first step" in out
