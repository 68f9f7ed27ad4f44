"""The README's main job: `loraflow train sft` with no config, on the bundled model and data. It must reach the
metric the README promises, and the saved adapter, loaded with peft.PeftModel.from_pretrained, must reproduce it.
(The run is conftest's session fixture `sft_demo`; tests/distributed/test_demo_distributed.py runs the same job on
two processes and compares with it.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import demo_metric

from loraflow.config import load_config
from loraflow.data import read_records
from loraflow.data.formatting import eval_prompt
from loraflow.loop.evaluate import exact_match
from loraflow.run.config import demo_config
from loraflow.locations import ASSETS


@pytest.mark.slow
def test_demo_reaches_its_metric_and_the_saved_adapter_reproduces_it(sft_demo):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp_path, proc, wall = sft_demo
    before, after = demo_metric(proc.stdout)
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
