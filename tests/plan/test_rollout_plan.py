"""The rollout area of the plan (plan/rollout.py): which engine samples, how the policy reaches it, and the bound of
the engine/trainer check, each with its reason and the rule that set it."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import make_config

from loraflow.environment import detect_environment
from loraflow.errors import ConfigError
from loraflow.plan import resolve

GRPO = ("stage=grpo", "rl.rewards=[builtin:reverse_partial]")


def plan_for(model, *overrides):
    # The plan's choices for a vLLM engine, on a machine with or without one: where vLLM is missing the plan refuses
    # a local engine first (tests/plan/test_packages.py), which is not what these tests look at.
    env = detect_environment()
    return resolve(make_config(model, *GRPO, *overrides), dataclasses.replace(env, missing=env.missing - {"vllm"}))


def decision(plan, key):
    return next(d for d in plan.decisions if d.key == key)


def test_the_trainer_samples_itself_unless_told_otherwise(tiny_model):
    plan = plan_for(tiny_model)
    assert plan.rollout.engine == "hf" and plan.setup.rollout_engine == "hf"
    assert not any(f.rule.id.startswith("vllm-") for f in plan.findings)


def test_servers_named_make_auto_use_them_with_adapter_sync_and_a_checked_policy(tiny_model):
    plan = plan_for(tiny_model, "rl.rollout.urls=[http://127.0.0.1:8000]")
    assert (plan.rollout.engine, plan.rollout.sync, plan.rollout.urls) == ("vllm", "adapter",
                                                                          ("http://127.0.0.1:8000",))
    assert decision(plan, "rollout sync").rule is None  # plain LoRA: nothing to change
    check = decision(plan, "rollout check")
    assert check.rule == "vllm-stale-policy" and plan.rollout.bound == 1e-3
    assert {f.rule.id for f in plan.findings} >= {"vllm-stale-policy", "vllm-raw-logprobs", "vllm-tokenizer-mismatch"}


@pytest.mark.parametrize("overrides", [("adapter.method=dora",), ("adapter.method=full",),
                                       ("adapter.train_modules=[lm_head]",)])
def test_what_vllm_cannot_serve_as_an_adapter_is_synced_merged(tiny_model, overrides):
    plan = plan_for(tiny_model, "rl.rollout.engine=vllm", "rl.rollout.sync=adapter", *overrides)
    assert plan.rollout.sync == "merged"
    assert decision(plan, "rollout sync").rule == "vllm-adapter-unservable"


def test_a_local_engine_is_started_with_room_for_the_adapter_rank(tiny_model):
    plan = plan_for(tiny_model, "rl.rollout.engine=vllm", "rl.rollout.sync=adapter", "adapter.rank=48",
                    "adapter.alpha=96")
    assert plan.rollout.max_lora_rank == 64
    assert decision(plan, "engine max LoRA rank").rule == "vllm-max-lora-rank"
    assert plan.rollout.base is not None  # no merged adapters: the engine loads model.path itself


# auto weighs the measured costs of a CPU engine: merged sampling is 2.8x faster there, its sync 0.13 s dearer.
def test_auto_sync_on_a_local_cpu_engine_weighs_sampling_against_the_sync(tiny_model):
    from loraflow.plan.rollout import BREAK_EVEN_TOKENS

    local = plan_for(tiny_model, "rl.rollout.engine=vllm")  # the default batch: far past the break-even
    assert local.rollout.sync == "merged" and "2.8x faster" in decision(local, "rollout sync").reason
    assert 50 < BREAK_EVEN_TOKENS < 200
    short = plan_for(tiny_model, "rl.rollout.engine=vllm", "train.micro_batch_size=1", "rl.group_size=2",
                     "rl.max_new_tokens=8")
    assert short.rollout.sync == "adapter" and "16 tokens per process" in decision(short, "rollout sync").reason
    remote = plan_for(tiny_model, "rl.rollout.urls=[http://127.0.0.1:8000]")
    assert remote.rollout.sync == "adapter"


def test_the_bound_follows_the_precision_or_the_key(tiny_model):
    assert plan_for(tiny_model, "rl.rollout.engine=vllm", "precision.mode=bf16-mixed").rollout.bound == 1.0
    assert plan_for(tiny_model, "rl.rollout.engine=vllm", "rl.rollout.max_logprob_diff=0.01").rollout.bound == 0.01


def test_importance_correction_follows_the_precision_or_the_key(tiny_model):
    fp32 = plan_for(tiny_model, "rl.rollout.engine=vllm")
    assert fp32.rollout.importance == "off" and "within 4e-5" in decision(fp32, "importance correction").reason
    bf16 = plan_for(tiny_model, "rl.rollout.engine=vllm", "precision.mode=bf16-mixed")
    assert bf16.rollout.importance == "token_truncate"
    assert "capped at 3" in decision(bf16, "importance correction").value
    asked = plan_for(tiny_model, "rl.rollout.engine=vllm", "rl.rollout.importance=sequence_mask",
                     "rl.rollout.importance_cap=2")
    assert (asked.rollout.importance, asked.rollout.importance_cap) == ("sequence_mask", 2.0)
    assert decision(asked, "importance correction").reason == "rl.rollout.importance=sequence_mask"


def test_rollout_keys_that_cannot_work_are_refused_by_name(tiny_model):
    with pytest.raises(ConfigError) as err:
        make_config(tiny_model, *GRPO, "rl.rollout.engine=hf", "rl.rollout.urls=[http://h:1]",
                    "rl.rollout.sync_every=0", "rl.rollout.max_logprob_diff=0", "rl.rollout.importance_cap=1")
    text = str(err.value)
    for key in ("rl.rollout.urls names servers", "rl.rollout.sync_every=0", "rl.rollout.max_logprob_diff=0",
                "rl.rollout.importance_cap=1"):
        assert key in text


def test_a_quantized_base_is_served_dequantized_locally_and_refused_on_a_remote_adapter_sync(tiny_model):
    local = plan_for(tiny_model, "rl.rollout.engine=vllm", "model.quantization.method=nf4")
    assert local.rollout.base is None  # the trainer writes the dequantized base for the engine
    assert "dequantized" in decision(local, "rollout engine").value
    with pytest.raises(ConfigError, match="rl.rollout.sync=merged"):
        plan_for(tiny_model, "rl.rollout.urls=[http://h:1]", "model.quantization.method=nf4")
    merged = plan_for(tiny_model, "rl.rollout.urls=[http://h:1]", "model.quantization.method=nf4",
                      "rl.rollout.sync=merged")
    assert merged.rollout.sync == "merged"
