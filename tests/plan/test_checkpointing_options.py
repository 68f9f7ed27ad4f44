"""The plan's activation-memory decisions beyond on/off: which layers (checkpointing.layers), which sub-block
(checkpointing.granularity) and activation offload, each printed with its reason; and the combinations that cannot
work refused with the key to change."""

from __future__ import annotations

import pytest
from conftest import make_config

from loraflow.environment import detect_environment
from loraflow.errors import ConfigError
from loraflow.plan import resolve


def plan_for(model, *overrides):
    return resolve(make_config(model, *overrides), detect_environment())


def decision(plan, key):
    return next(d for d in plan.decisions if d.key == key)


def test_layers_spread_evenly(tiny_model):
    for n, want in {1: [0], 2: [0, 2], 3: [0, 1, 2], 4: [0, 1, 2, 3]}.items():
        plan = plan_for(tiny_model, "checkpointing.enabled=true", f"checkpointing.layers={n}")
        assert plan.checkpoint_layers == want and plan.checkpoint_block is None
    plan = plan_for(tiny_model, "checkpointing.enabled=true", "checkpointing.layers=3")
    assert decision(plan, "checkpointing").value == "layers 0, 1, 2 of 4 (checkpointing.layers=3, spread evenly)"
    assert "transformers' own layer checkpointing" in decision(plan, "checkpointing").reason


@pytest.mark.parametrize("granularity,block,kept", [("mlp", "mlp", "attention"), ("attention", "self_attn", "MLP")])
def test_sub_block_granularity_is_printed(tiny_model, granularity, block, kept):
    plan = plan_for(tiny_model, "checkpointing.enabled=true", f"checkpointing.granularity={granularity}",
                    "checkpointing.layers=2")
    assert plan.checkpoint_layers == [0, 2] and plan.checkpoint_block == block
    assert plan.checkpoint_in_engine is False
    d = decision(plan, "checkpointing")
    assert d.value == f"the `{block}` sub-block of layers 0, 2 of 4 (checkpointing.layers=2, spread evenly)"
    assert f"the {kept} sub-block keeps its saved tensors" in d.reason
    text = plan.render()
    assert f"the `{block}` sub-block of layers 0, 2 of 4" in text
    # torch's checkpoint, unlike transformers' layer checkpointing, leaves the cache on: the rule turns it off
    assert decision(plan, "use_cache").rule == "cache-during-recompute"


def test_sub_block_placement_under_fsdp2_is_inside_the_unit(tiny_model):
    plan = plan_for(tiny_model, "checkpointing.enabled=true", "checkpointing.granularity=mlp",
                    "parallel.engine=fsdp2")
    # one process: resolve refuses fsdp2 only when the launch contradicts it, so read the decision directly
    assert decision(plan, "checkpoint placement").value.startswith("inside each layer's sharded unit")


def test_offload_decision(tiny_model):
    plan = plan_for(tiny_model, "checkpointing.offload_activations=true")
    assert plan.offload_activations is False  # this machine's device is the CPU
    assert decision(plan, "activation offload").value == "no effect on cpu"
    assert "activation offload" in plan.render() and "no effect on cpu" in plan.render()
    assert all(d.key != "activation offload" for d in plan_for(tiny_model).decisions)  # printed when asked


@pytest.mark.parametrize("overrides,message", [
    (["checkpointing.enabled=true", "checkpointing.layers=5"],
     r"checkpointing.layers=5, but the model has 4 decoder layers; set checkpointing.layers to at most 4"),
    (["checkpointing.enabled=true", "checkpointing.layers=2", "checkpointing.every_n_layers=2"],
     r"both choose which layers recompute; set only one of them"),
    (["checkpointing.granularity=mlp"], r"checkpointing.granularity has no effect with checkpointing.enabled=false"),
    (["checkpointing.layers=2"], r"checkpointing.layers has no effect with checkpointing.enabled=false"),
    (["checkpointing.enabled=true", "checkpointing.layers=0"], r"checkpointing.layers"),
])
def test_impossible_combinations_are_refused_with_the_key(tiny_model, overrides, message):
    with pytest.raises(ConfigError, match=message):
        plan_for(tiny_model, *overrides)


def test_architecture_without_the_sub_block_is_refused(tmp_path):
    """OPT's decoder layer holds fc1/fc2 directly: there is no MLP child to checkpoint on its own."""
    from transformers import OPTConfig

    OPTConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=2,
              word_embed_proj_dim=32, max_position_embeddings=64).save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match=r"checkpointing.granularity=mlp: this opt model's decoder layers have no "
                                          r"mlp child .*Set checkpointing.granularity=layer"):
        plan_for(tmp_path, "checkpointing.enabled=true", "checkpointing.granularity=mlp")
    plan = plan_for(tmp_path, "checkpointing.enabled=true", "checkpointing.granularity=attention")
    assert plan.checkpoint_block == "self_attn"
