"""GRPO with rollouts on the session's vLLM server (tests/conftest.py vllm_url) on two gloo ranks under ZeRO-3 and
FSDP2, against one process: each rank samples its own prompts, yet every step's samples, rewards and losses equal
the one-process run's (a request's seed comes from the run's seed, the step and the prompt, never from the rank);
every sync gathers only the adapter (its bytes, counted) and the engine's log-probs match the trainer's."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import LAUNCH_TIMEOUT, ROOT

from loraflow.engines.launch import launch_env, run_isolated, torchrun_argv

pytestmark = pytest.mark.slow

STEPS = 3
COMMON = ["grpo", "data.eval=", f"train.max_steps={STEPS}", "output.log_every_steps=1", "output.progress_bar=false"]


def train_rows(run_dir) -> list[dict]:
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"]


def launch(tmp_path, name: str, ranks: int, *overrides: str) -> list[dict]:
    run_dir = tmp_path / name
    tail = ["-m", "loraflow", "train", *COMMON, f"output.dir={run_dir}", *overrides]
    argv = torchrun_argv(ranks, tail) if ranks > 1 else [sys.executable, *tail]
    log = tmp_path / f"{name}.log"
    code = run_isolated(argv, log, LAUNCH_TIMEOUT, launch_env(), cwd=str(ROOT))
    assert code == 0, f"{name} exited with {code}:\n{log.read_text()[-4000:]}"
    return train_rows(run_dir)


@pytest.fixture(scope="module")
def one_process(vllm_url, tmp_path_factory) -> list[dict]:
    return launch(tmp_path_factory.mktemp("one"), "one", 1, f"rl.rollout.urls=[{vllm_url}]",
                  "train.micro_batch_size=8")


@pytest.mark.parametrize("engine", [("parallel.engine=deepspeed", "parallel.zero_stage=3"),
                                    ("parallel.engine=fsdp2",)], ids=["zero3", "fsdp2"])
def test_two_ranks_sample_on_vllm_as_one_process_does(engine, vllm_url, one_process, tmp_path):
    one = one_process
    two = launch(tmp_path, "two", 2, f"rl.rollout.urls=[{vllm_url}]", "train.micro_batch_size=4", *engine)
    assert [r["step"] for r in two] == list(range(1, STEPS + 1))
    for a, b in zip(one, two):
        # the same samples (the sums differ only in float32 rounding: each rank sums its own rows first)
        assert b["reward"] == pytest.approx(a["reward"], rel=1e-6)
        assert b["completion_tokens"] == pytest.approx(a["completion_tokens"], rel=1e-6)
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4, abs=1e-7)
        assert b["rollout/logprob_diff_max"] <= 1e-4 and b["rollout/policy_version"] == b["step"]
    # rank 0 gathered the adapter, and nothing else, for each sync: its bytes equal the saved adapter's
    from safetensors.torch import load_file

    saved = load_file(tmp_path / "two" / "adapter" / "adapter_model.safetensors")
    assert {r["rollout/sync_bytes"] for r in two} == {sum(t.numel() * t.element_size() for t in saved.values())}
