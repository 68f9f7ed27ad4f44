"""`loraflow train` with a 4-bit base under torchrun, as a user runs it: FSDP2 and ZeRO-3 on two processes with
checkpointing, through every guard (first-step gradients, frozen weights unchanged), evaluation and the adapter
save, give the losses and the adapter of one process with the same global batch (the engine cross-checks compare
gradients; this runs the whole command), and the memory report shows the 4-bit weights sharded."""

from __future__ import annotations

import re

import pytest
from conftest import quantized_base
from test_engine_runs import (
    COMMON,
    GLOBAL_BATCH,
    ZERO3_JSON,
    adapter_state,
    losses,
    train,
)

QLORA = ["model.quantization.method=nf4", "checkpointing.enabled=true"]
ENGINES = {"fsdp2": ["parallel.engine=fsdp2"],
           "zero3": ["parallel.engine=deepspeed", f"parallel.deepspeed_config={ZERO3_JSON}"]}


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("qlora-single")
    text = train(tmp, 1, *COMMON, *QLORA, f"train.micro_batch_size={GLOBAL_BATCH}", f"output.dir={tmp / 'run'}")
    return tmp / "run", text


def frozen_mib(text: str) -> float:
    """Rank 0's frozen-parameter figure in the memory report."""
    return float(re.search(r"^\s+0\s+([\d.]+) MiB", text, re.M).group(1))


@pytest.mark.parametrize("engine", list(ENGINES))
def test_a_4bit_run_under_an_engine_equals_one_process(engine, single, tmp_path):
    from peft import PeftModel

    reference, single_text = single
    text = train(tmp_path, 2, *COMMON, *QLORA, *ENGINES[engine], f"train.micro_batch_size={GLOBAL_BATCH // 2}",
                 f"output.dir={tmp_path / 'run'}")
    assert losses(tmp_path / "run") == pytest.approx(losses(reference), rel=1e-5)
    got, want = adapter_state(tmp_path / "run"), adapter_state(reference)
    assert got.keys() == want.keys()
    # After 4 Adam steps, as in test_engine_runs.py: near-zero gradients make m / sqrt(v) sensitive to rounding.
    worst = max(float((got[k] - v).norm() / v.norm().clamp_min(1e-12)) for k, v in want.items())
    assert worst < 1e-3, worst
    assert "802,816 weights quantized (nf4)" in text
    # 4-bit weights sharded over two ranks: the frozen bytes per rank fall well below one process's
    assert frozen_mib(text) < 0.6 * frozen_mib(single_text)
    from loraflow.config import load_config
    from loraflow.setup.quantize import quantized_linears

    config = load_config(tmp_path / "run" / "config.yaml")
    model = PeftModel.from_pretrained(quantized_base(config), tmp_path / "run" / "adapter")
    assert len(quantized_linears(model)) == 28
