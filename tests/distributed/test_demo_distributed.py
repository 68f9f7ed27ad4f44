"""The README's main job on two processes: `loraflow train sft` under `torchrun --nproc_per_node 2` with DeepSpeed
ZeRO-2 reaches the metric of the one-process run (conftest's `sft_demo`, trained once per session and shared with
tests/test_demo.py): 400 steps with an exact-match evaluation, the long-horizon check that gradient partitioning and
the global batch keep a whole run equal to one process.

ZeRO-3 ran here (132 s with every weight partitioned, 89 s with DeepSpeed's default thresholds, against 34 s for
ZeRO-2) until CI needed the time for the composition sweep's slice. ZeRO-3's partitioned weights are covered by
tests/distributed/test_engines.py (one step's gradients equal one process's), test_engine_runs.py (`loraflow train`
under torchrun, stopped and resumed, equal to one uninterrupted process, with CPU offload too) and the sweep's ZeRO-3
setups; FSDP2's torchrun run is test_engine_runs.py's. `engine` below still takes zero3 and fsdp2 by hand."""

from __future__ import annotations

import time

import pytest
from conftest import ROOT, demo_metric

from loraflow.engines.launch import launch_env, run_isolated, torchrun_argv

ZERO3_JSON = ROOT / "examples" / "deepspeed" / "zero3-shard-small-models.json"


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["zero2"])
def test_demo_on_two_processes_reaches_the_single_process_metric(engine, sft_demo, tmp_path):
    """The embedded default under `torchrun --nproc_per_node 2`, with the same global batch (8 per process)."""
    args = {"fsdp2": ["parallel.engine=fsdp2"],
            "zero2": ["parallel.engine=deepspeed", "parallel.zero_stage=2"],
            "zero3": ["parallel.engine=deepspeed", f"parallel.deepspeed_config={ZERO3_JSON}"]}[engine]
    log = tmp_path / "train.log"
    start = time.perf_counter()
    code = run_isolated(torchrun_argv(2, ["-m", "loraflow", "train", "sft", "train.micro_batch_size=8", *args]),
                        log, 900, launch_env(), cwd=str(tmp_path))
    wall = time.perf_counter() - start
    out = log.read_text()
    assert code == 0, out[-5000:]
    single = demo_metric(sft_demo[1].stdout)
    before, after = demo_metric(out)
    print(f"demo under {engine} on 2 processes: exact match {before:.2f} -> {after:.2f} in {wall:.0f}s wall; "
          f"one process: {single[0]:.2f} -> {single[1]:.2f}")
    assert before == single[0] and after == pytest.approx(single[1], abs=0.02)
    assert "memory per rank after the first step" in out
