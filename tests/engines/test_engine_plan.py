"""The plan per engine and installed version (no processes started): which engine runs, what a user DeepSpeed JSON
may say, and the composition decisions each engine rule makes, printed with the rule's id."""

from __future__ import annotations

import dataclasses
import json

import pytest

from loraflow.config import load_config
from loraflow.engines.deepspeed_config import build_config, deepspeed_settings
from loraflow.environment import detect_environment, parse_versions, with_versions
from loraflow.errors import ConfigError, PlanError
from loraflow.plan import resolve
from loraflow.run.config import demo_config

DEMO = demo_config("sft")  # the bundled tiny model: plans need a model's config


def plan_for(*overrides: str, world: int = 2, versions: str = ""):
    env = dataclasses.replace(with_versions(detect_environment(), parse_versions(versions)), world_size=world)
    return resolve(load_config(DEMO, list(overrides)), env)


def decision(plan, key: str):
    return next(d for d in plan.decisions if d.key == key)


def test_auto_engine_is_single_for_one_process_and_ddp_under_a_launcher():
    assert plan_for(world=1).setup.engine == "single"
    assert plan_for(world=2).setup.engine == "ddp"
    with pytest.raises(ConfigError, match="parallel.engine=single, but 2 processes"):
        plan_for("parallel.engine=single", world=2)


def test_engine_options_need_their_engine():
    with pytest.raises(ConfigError, match="parallel.offload_params is a deepspeed setting, but parallel.engine=fsdp2; "
                                          "set parallel.engine=deepspeed"):
        load_config(DEMO, ["parallel.engine=fsdp2", "parallel.offload_params=true"])
    with pytest.raises(ConfigError, match="needs ZeRO stage 3"):
        plan_for("parallel.engine=deepspeed", "parallel.zero_stage=2", "parallel.offload_params=true")


def write(tmp_path, data) -> str:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_a_user_deepspeed_json_is_adopted_filled_and_checked(tmp_path):
    path = write(tmp_path, {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                                  "reduce_bucket_size": "auto", "overlap_comm": True},
                            "train_micro_batch_size_per_gpu": "auto", "bf16": {"enabled": "auto"}})
    config = load_config(DEMO, ["parallel.engine=deepspeed", f"parallel.deepspeed_config={path}",
                                "train.micro_batch_size=4", "train.gradient_accumulation_steps=2"])
    settings = deepspeed_settings(config.parallel)
    assert (settings.stage, settings.offload_optimizer, settings.offload_params) == (3, True, False)
    ds = build_config(config, settings, world_size=2)
    assert ds["train_micro_batch_size_per_gpu"] == 4 and ds["train_batch_size"] == 16
    assert ds["gradient_accumulation_steps"] == 2 and "bf16" not in ds
    assert ds["zero_optimization"]["overlap_comm"] is True  # the user's tuning is kept
    assert "reduce_bucket_size" not in ds["zero_optimization"]  # `auto`: DeepSpeed's default applies
    plan = plan_for("parallel.engine=deepspeed", f"parallel.deepspeed_config={path}")
    assert decision(plan, "engine").value == "DeepSpeed ZeRO-3, offload_optimizer to cpu"


@pytest.mark.parametrize("data, overrides, message", [
    ({"optimizer": {"type": "AdamW"}}, [], "sets `optimizer`.*train.learning_rate"),
    ({"bf16": {"enabled": True}}, [], "sets `bf16`.*precision.mode"),
    ({"zero_optimization": {"stage": 3}}, ["parallel.zero_stage=2"], "zero_stage=2 contradicts"),
    ({"zero_optimization": {"offload_param": {"device": "nvme"}}}, [], "NVMe"),
    ({"train_micro_batch_size_per_gpu": 3}, [], "train_micro_batch_size_per_gpu=3 contradicts train.micro_batch"),
    ({"gradient_clipping": 0.5}, [], "gradient_clipping=0.5 contradicts train.max_grad_norm"),
])
def test_a_contradicting_deepspeed_json_is_an_error_naming_both_keys(tmp_path, data, overrides, message):
    path = write(tmp_path, data)
    config = load_config(DEMO, ["parallel.engine=deepspeed", f"parallel.deepspeed_config={path}", *overrides])
    with pytest.raises(ConfigError, match=message):
        build_config(config, deepspeed_settings(config.parallel), world_size=2)


def test_a_missing_deepspeed_json_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match="parallel.deepspeed_config"):
        plan_for("parallel.engine=deepspeed", f"parallel.deepspeed_config={tmp_path / 'none.json'}")


ZERO3_CKPT = ("parallel.engine=deepspeed", "parallel.zero_stage=3", "checkpointing.enabled=true")


def test_zero3_checkpoint_mode_follows_the_installed_deepspeed():
    old = plan_for(*ZERO3_CKPT, versions="deepspeed=0.15.3")
    assert old.reentrant is True and old.input_grad_hook is True
    assert decision(old, "checkpointing.reentrant").rule == "zero3-frozen-recompute"
    assert "[zero3-frozen-recompute]" in old.render()
    new = plan_for(*ZERO3_CKPT, versions="deepspeed=0.19.8")
    assert new.reentrant is False and decision(new, "checkpointing.reentrant").rule is None
    assert decision(new, "adapter save").rule == "zero3-empty-adapter-save"
    assert decision(new, "generation").rule == "zero3-generation-gather"


FSDP2_CKPT = ("parallel.engine=fsdp2", "checkpointing.enabled=true", "precision.mode=bf16-mixed")


def test_fsdp2_checkpoint_placement_follows_the_installed_torch():
    old = plan_for(*FSDP2_CKPT, versions="torch=2.12.0")
    assert old.checkpoint_in_engine and decision(old, "checkpoint placement").rule == "fsdp2-recompute-cast"
    new = plan_for(*FSDP2_CKPT, versions="torch=2.13.0")
    assert not new.checkpoint_in_engine and decision(new, "checkpoint placement").rule is None
    fp32 = plan_for("parallel.engine=fsdp2", "checkpointing.enabled=true", versions="torch=2.12.0")
    assert not fp32.checkpoint_in_engine  # the cast problem needs half precision


def test_fsdp2_gives_frozen_base_weights_units_of_their_own_for_lora_only():
    lora = plan_for("parallel.engine=fsdp2")
    assert lora.setup.fsdp_frozen_units_separate
    assert "fsdp-frozen-grad-memory" in decision(lora, "fsdp units").reason
    dora = plan_for("parallel.engine=fsdp2", "adapter.method=dora")
    assert not dora.setup.fsdp_frozen_units_separate and "DoRA" in decision(dora, "fsdp units").reason


def test_ddp_never_pairs_reentrant_checkpointing_with_the_unused_parameter_search():
    plan = plan_for("parallel.engine=ddp", "checkpointing.enabled=true", "checkpointing.reentrant=true",
                    "parallel.find_unused_parameters=true")
    assert plan.setup.find_unused_parameters is False
    assert decision(plan, "find_unused_parameters").rule == "ddp-reentrant-unused"
    kept = plan_for("parallel.engine=ddp", "parallel.find_unused_parameters=true")
    assert kept.setup.find_unused_parameters is True  # without reentrant checkpointing the user's choice stands


def test_the_plan_states_the_global_batch():
    plan = plan_for("parallel.engine=fsdp2", "train.micro_batch_size=4", "train.gradient_accumulation_steps=2")
    assert decision(plan, "global batch").value.startswith("4 x 2 x 2 = 16")


def test_check_plans_a_config_for_a_given_process_count(capsys):
    from loraflow.commands.cli import main

    code = main(["check", "--nproc", "2", "--versions", "torch=2.12.0", "parallel.engine=fsdp2",
                 "checkpointing.enabled=true", "precision.mode=bf16-mixed"])
    out = capsys.readouterr().out
    assert code == 0 and "cpu, 2 processes" in out
    assert "inside each sharded unit (torch checkpoint around the layer's forward, under FSDP2's hooks) " \
        "[fsdp2-recompute-cast]" in out and "inside its FSDP2 unit" in out


def test_auto_engine_follows_deepspeed_keys_and_ddp_keys_need_ddp():
    assert plan_for("parallel.zero_stage=3").setup.engine == "deepspeed"
    assert plan_for("parallel.offload_optimizer=true", "parallel.zero_stage=2").setup.zero3 is False
    with pytest.raises(ConfigError, match="find_unused_parameters is a ddp setting, but parallel.engine=fsdp2"):
        load_config(DEMO, ["parallel.engine=fsdp2", "parallel.find_unused_parameters=true"])


def test_pure_bf16_is_refused_under_zero_which_keeps_fp32_masters():
    refused = plan_for("parallel.engine=deepspeed", "parallel.zero_stage=2", "precision.mode=bf16")
    assert [f.rule.id for f in refused.errors] == ["bf16-zero-master-weights"]
    with pytest.raises(PlanError, match="bf16-zero-master-weights"):
        refused.raise_for_errors()
    allowed = plan_for("parallel.engine=deepspeed", "parallel.zero_stage=0", "precision.mode=bf16")
    assert allowed.setup.engine == "deepspeed" and not allowed.errors


@pytest.mark.parametrize("data, message", [
    ({"managed_gradient_accumulation": False}, "managed_gradient_accumulation=false"),
    ({"torch_autocast": {"enabled": True}}, "sets `torch_autocast`"),
])
def test_deepspeed_json_keys_that_would_change_the_step_are_refused(tmp_path, data, message):
    path = write(tmp_path, data)
    with pytest.raises(ConfigError, match=message):
        plan_for("parallel.engine=deepspeed", f"parallel.deepspeed_config={path}")
