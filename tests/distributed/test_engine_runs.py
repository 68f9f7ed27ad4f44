"""`loraflow train` under torchrun, as a user runs it: with the same global batch, a 2-process run under DDP,
ZeRO-2, ZeRO-3 (also with CPU offload) and FSDP2, stopped after 2 steps and resumed to 4, logs the losses of an
uninterrupted single-process run; its saved adapter (gathered from the shards) equals the single-process one and
loads with peft.PeftModel.from_pretrained; the evaluation (loss and generated exact match) agrees."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT

from loraflow.engines.launch import launch_env, run_isolated, torchrun_argv
from loraflow.loop.metrics import read_metrics
from loraflow.locations import ASSETS

ZERO3_JSON = ROOT / "examples" / "deepspeed" / "zero3-shard-small-models.json"
# Warmup over 3 steps: the lr of step 3 depends on the restored schedule state (and not on max_steps), so a resume
# that lost it would log different losses.
COMMON = ["train.max_steps=4", "train.learning_rate=1e-3", "train.warmup_steps=3", "train.schedule=constant",
          "output.log_every_steps=1", "output.progress_bar=false", "output.tensorboard=false", "eval.max_samples=8",
          "eval.max_new_tokens=8", "adapter.rank=4", "data.max_length=48"]
ENGINES = {
    "ddp": ["parallel.engine=ddp"],
    "zero2": ["parallel.engine=deepspeed", "parallel.zero_stage=2"],
    "zero3": ["parallel.engine=deepspeed", f"parallel.deepspeed_config={ZERO3_JSON}", "checkpointing.enabled=true"],
    "zero3-offload": ["parallel.engine=deepspeed", f"parallel.deepspeed_config={ZERO3_JSON}",
                      "parallel.offload_optimizer=true", "parallel.offload_params=true"],
    "fsdp2": ["parallel.engine=fsdp2", "checkpointing.enabled=true"],
}
GLOBAL_BATCH = 8


def train(tmp: Path, ranks: int, *args: str, timeout: float = 300) -> str:
    tail = ["-m", "loraflow", "train", "sft", *args]
    argv = torchrun_argv(ranks, tail) if ranks > 1 else [sys.executable, *tail]
    log = tmp / f"train-{len(list(tmp.glob('train-*.log')))}.log"
    code = run_isolated(argv, log, timeout, launch_env(), cwd=str(tmp))
    text = log.read_text()
    assert code == 0, f"exit {code}:\n{text[-5000:]}"
    return text


def losses(run_dir: Path) -> list[float]:
    return [r["loss"] for r in read_metrics(run_dir, "train")]


def adapter_state(run_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(run_dir / "adapter" / "adapter_model.safetensors")


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("single")
    train(tmp, 1, *COMMON, f"train.micro_batch_size={GLOBAL_BATCH}", f"output.dir={tmp / 'run'}")
    return tmp / "run"


@pytest.mark.parametrize("engine", list(ENGINES))
def test_stopped_resumed_engine_run_equals_one_uninterrupted_process(engine, reference, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run = tmp_path / "run"
    args = [*COMMON, *ENGINES[engine], f"train.micro_batch_size={GLOBAL_BATCH // 2}", f"output.dir={run}"]
    first = train(tmp_path, 2, *[a for a in args if not a.startswith("train.max_steps")], "train.max_steps=2")
    assert "memory per rank after the first step" in first
    train(tmp_path, 2, "--resume", str(run), "--extend", "train.max_steps=4")  # warmup 3, then constant: as asked

    got, want = losses(run), losses(reference)
    assert len(got) == len(want) == 4
    assert got == pytest.approx(want, rel=1e-5), (got, want)

    saved, expected = adapter_state(run), adapter_state(reference)
    assert saved.keys() == expected.keys()
    for key, ref in expected.items():
        assert saved[key].shape == ref.shape and saved[key].numel() > 0, key  # never the empty ZeRO-3 placeholder
        # Adam divides by sqrt(v): for an element whose gradient is near zero, m / sqrt(v) is about +-1 whatever
        # the gradient's size, so rounding differences of the reduction order can flip such an update by 2 x lr.
        # Gradients agree to 1e-6 (test_engines.py, beside this file); after 4 Adam steps the weights agree to 1e-3
        # (measured: at most 2.6e-4, on a lora_B under ZeRO-3).
        err = float((saved[key] - ref).norm() / ref.norm().clamp_min(1e-12))
        assert err < 1e-3, (key, err)

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(ASSETS / "tiny-base"), run / "adapter")
    loaded = {k: v for k, v in model.state_dict().items() if "lora_" in k}
    assert len(loaded) == len(expected)

    evals = read_metrics(run, "eval")[-1], read_metrics(reference, "eval")[-1]
    assert evals[0]["loss"] == pytest.approx(evals[1]["loss"], rel=1e-4)
    assert evals[0]["exact_match"] == evals[1]["exact_match"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 4

    if engine == "ddp":  # a checkpoint of 2 processes is not resumed by another number of them
        log = tmp_path / "wrong-world.log"
        code = run_isolated([sys.executable, "-m", "loraflow", "train", "sft", "--resume", str(run), "--extend",
                             "train.max_steps=6"], log, 300, launch_env(), cwd=str(tmp_path))
        assert code == 2 and "written by 2 processes; resume it with the same number" in log.read_text()


@pytest.mark.parametrize("engine", ["zero3", "fsdp2"])
def test_a_distributed_engine_runs_in_one_process_without_a_launcher(engine, reference, tmp_path):
    """One process, no torchrun: a one-rank group of its own (DeepSpeed's offload on one GPU is the use)."""
    run = tmp_path / "run"
    args = [*COMMON, *ENGINES[engine], f"train.micro_batch_size={GLOBAL_BATCH}", f"output.dir={run}"]
    train(tmp_path, 1, *args)
    assert losses(run) == pytest.approx(losses(reference), rel=1e-5)


def test_full_fine_tuning_under_zero3_saves_the_whole_model(reference, tmp_path_factory):
    """Gathered one parameter at a time; the saved model equals one process's and loads with transformers."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    runs = {}
    for name, ranks, extra in (("single", 1, []), ("zero3", 2, ENGINES["zero3"])):
        tmp = tmp_path_factory.mktemp(f"full-{name}")
        runs[name] = tmp / "run"
        train(tmp, ranks, *COMMON, "adapter.method=full", "train.max_steps=2", "eval.generate=false", *extra,
              f"train.micro_batch_size={GLOBAL_BATCH // ranks}", f"output.dir={runs[name]}")
    got, want = (load_file(runs[n] / "model" / "model.safetensors") for n in ("zero3", "single"))
    assert got.keys() == want.keys() and len(want) > 10
    for key, ref in want.items():
        err = float((got[key] - ref).norm() / ref.norm().clamp_min(1e-12))
        assert err < 1e-3, (key, err)
    AutoModelForCausalLM.from_pretrained(runs["zero3"] / "model")
