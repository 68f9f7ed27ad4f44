"""The plan: each concrete choice with its reason, rules applied and announced, impossible setups refused."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import make_config
from loraflow.environment import detect_environment
from loraflow.errors import ConfigError, PlanError
from loraflow.plan import resolve


def plan_for(model, *overrides):
    return resolve(make_config(model, *overrides), detect_environment())


def decision(plan, key):
    return next(d for d in plan.decisions if d.key == key)


def test_auto_checkpointing_is_non_reentrant_without_hook(tiny_model):
    plan = plan_for(tiny_model, "checkpointing.enabled=true")
    assert plan.reentrant is False and plan.input_grad_hook is False
    assert plan.checkpoint_layers == [0, 1, 2, 3]
    assert "non-reentrant" in decision(plan, "checkpointing.reentrant").reason
    assert plan.findings == []


def test_forced_reentrant_gets_the_hook_with_rule_id(tiny_model):
    plan = plan_for(tiny_model, "checkpointing.enabled=true", "checkpointing.reentrant=true")
    assert plan.input_grad_hook is True
    assert decision(plan, "input_grad_hook").rule == "reentrant-frozen-inputs"
    assert [f.rule.id for f in plan.findings] == ["reentrant-frozen-inputs"]
    assert "[FIXED] reentrant-frozen-inputs" in plan.render()


def test_partial_reentrant_is_named_as_the_silent_variant(tiny_model):
    plan = plan_for(tiny_model, "checkpointing.enabled=true", "checkpointing.reentrant=true",
                    "checkpointing.every_n_layers=2")
    assert plan.checkpoint_layers == [0, 2]
    assert decision(plan, "input_grad_hook").rule == "reentrant-partial-silent"


def test_trainable_embeddings_need_no_hook(tiny_model):
    plan = plan_for(tiny_model, "checkpointing.enabled=true", "checkpointing.reentrant=true",
                    "adapter.train_modules=[embeddings]")
    assert plan.input_grad_hook is False
    assert plan.modules_to_save == ["model.embed_tokens"]


def test_use_cache_is_off_for_training_with_its_reason(tiny_model):
    plan = plan_for(tiny_model)
    assert decision(plan, "use_cache").value is False  # the forwards pass use_cache=False (losses/logprobs.py)
    assert "default is True" in decision(plan, "use_cache").reason
    packed = plan_for(tiny_model, "data.packing=true")
    assert decision(packed, "use_cache").rule == "packing-cache-cross-attention"


def test_zero_matched_modules_is_an_error_before_training(tiny_model):
    plan = plan_for(tiny_model, "adapter.target_modules=[decoder.layers.q_proj]")
    assert [f.rule.id for f in plan.errors] == ["no-adapter-matched"]
    with pytest.raises(PlanError, match="no-adapter-matched"):
        plan.raise_for_errors()


def test_unknown_train_module_is_named(tiny_model):
    with pytest.raises(ConfigError, match="adapter.train_modules: `lm_haed` matches no module"):
        plan_for(tiny_model, "adapter.train_modules=[lm_haed]")


def test_tied_embeddings_trained_are_kept_tied(tiny_tied_model):
    plan = plan_for(tiny_tied_model, "adapter.train_modules=[lm_head]")
    assert plan.ensure_weight_tying is True
    assert decision(plan, "ensure_weight_tying").rule == "tied-embedding-adapter"


def test_missing_model_path_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"model.path=.*does not exist"):
        plan_for(tmp_path / "no-such-model")


def test_directory_without_model_config(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="cannot read a model config there"):
        plan_for(tmp_path / "empty")


@pytest.mark.parametrize("mode,load,trainable,autocast", [
    ("fp32", torch.float32, torch.float32, None),
    ("bf16-mixed", torch.bfloat16, torch.float32, torch.bfloat16),
    ("bf16", torch.bfloat16, torch.bfloat16, None),
])
def test_precision_choices(tiny_model, mode, load, trainable, autocast):
    plan = plan_for(tiny_model, f"precision.mode={mode}")
    assert (plan.load_dtype, plan.trainable_dtype, plan.autocast_dtype) == (load, trainable, autocast)


def test_full_finetuning_under_bf16_mixed_keeps_fp32_master_weights(tiny_model):
    assert plan_for(tiny_model, "precision.mode=bf16-mixed", "adapter.method=full").load_dtype == torch.float32


def test_contradicting_dtype_is_refused(tiny_model):
    with pytest.raises(ConfigError, match="model.dtype=bfloat16 contradicts precision.mode=fp32"):
        plan_for(tiny_model, "model.dtype=bfloat16")


def test_plan_json_is_serialisable(tiny_model):
    plan = plan_for(tiny_model, "checkpointing.enabled=true", "checkpointing.reentrant=true")
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["findings"][0]["rule"] == "reentrant-frozen-inputs"
    assert any(d["key"] == "use_cache" and d["value"] is False for d in data["decisions"])


def test_full_finetuning_with_bf16_storage_under_mixed_is_refused(tiny_model):
    with pytest.raises(ConfigError, match="contradicts full fine-tuning"):
        plan_for(tiny_model, "precision.mode=bf16-mixed", "adapter.method=full", "model.dtype=bfloat16")


def test_fused_experts_no_adapter_reaches_are_named_in_the_plan(tiny_model, tmp_path):
    """transformers 5 stores a mixture of experts' expert MLPs as 3-D parameters, which target_modules cannot name:
    the plan says they stay frozen, how many weights that is, and what trains them."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("qwen2_moe", vocab_size=96, hidden_size=64, intermediate_size=128,
                                  moe_intermediate_size=32, shared_expert_intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    plan = plan_for(tmp_path)
    experts = decision(plan, "experts")
    fused = 2 * 4 * (64 * 64 + 64 * 32)  # 2 layers x 4 experts x (gate_up_proj + down_proj)
    assert experts.value.startswith(f"frozen: 2 fused blocks (experts; {fused:,} weights")
    assert "adapter.method=full" in experts.reason
    assert not any(".experts" in m for m in plan.model.adapter_modules)
    assert "shared_expert" in " ".join(plan.model.adapter_modules)  # its Linear layers are adapted
    assert not any(d.key == "experts" for d in plan_for(tmp_path, "adapter.method=full").decisions)
    assert not any(d.key == "experts" for d in plan_for(tiny_model).decisions)  # dense: nothing to say


def test_fused_experts_peft_wraps_are_named_adapted(tmp_path):
    """peft 0.21's all-linear reaches Mixtral's fused experts (it wraps their parameters): the plan says they are
    adapted, not frozen, and DoRA, which peft cannot put there, is a config error naming adapter.method."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("mixtral", vocab_size=96, hidden_size=64, intermediate_size=128,
                                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                  num_local_experts=4, num_experts_per_tok=2)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    plan = plan_for(tmp_path)
    assert decision(plan, "experts").value.startswith("adapted: 2 fused blocks (experts;")
    assert any(m.endswith(".experts") for m in plan.model.adapter_modules)
    with pytest.raises(ConfigError, match="adapter.method=dora: peft cannot put DoRA"):
        plan_for(tmp_path, "adapter.method=dora")
