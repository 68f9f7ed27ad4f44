"""The plan decides where the output head runs (train.logits): learned positions only, chunked by
train.logits_chunk_mib, unless the model transforms its logits after the head or the stage has a score head."""

from __future__ import annotations

import shutil

import pytest

from conftest import TOKENIZER_FILES, make_config
from loraflow.environment import detect_environment
from loraflow.errors import ConfigError
from loraflow.plan import resolve
from loraflow.locations import ASSETS


def plan_for(model, *overrides):
    return resolve(make_config(model, *overrides), detect_environment())


def decision(plan, key):
    return next(d for d in plan.decisions if d.key == key)


@pytest.fixture(scope="module")
def soft_capped_model(tmp_path_factory):
    """A tiny Gemma2: it soft-caps its logits after the head (final_logit_softcapping)."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    path = tmp_path_factory.mktemp("gemma2")
    cfg = Gemma2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=16, pad_token_id=0, bos_token_id=1,
                       eos_token_id=2)
    Gemma2ForCausalLM(cfg).save_pretrained(path)
    for name in TOKENIZER_FILES:
        shutil.copy(ASSETS / "tiny-base" / name, path / name)
    return path


def test_learned_positions_by_default_in_chunks(tiny_model):
    plan = plan_for(tiny_model)
    assert plan.logits.selected and plan.logits.chunk_tokens == 256 * 2 ** 20 // (4 * 96)
    d = decision(plan, "logits")
    assert d.value.startswith("learned positions only") and "train.logits_chunk_mib" in d.value
    unchunked = plan_for(tiny_model, "train.logits_chunk_mib=0")
    assert unchunked.logits.selected and unchunked.logits.chunk_tokens == 0
    full = plan_for(tiny_model, "train.logits=full")
    assert not full.logits.selected and decision(full, "logits").reason == "train.logits=full"


def test_reward_model_has_no_vocabulary_head(tiny_model):
    plan = plan_for(tiny_model, "stage=rm")
    assert not plan.logits.selected and "score head" in decision(plan, "logits").value


def test_logit_transform_needs_full_logits(soft_capped_model):
    plan = plan_for(soft_capped_model)
    assert not plan.logits.selected
    assert "final_logit_softcapping" in decision(plan, "logits").reason
    with pytest.raises(ConfigError, match="train.logits=learned: this gemma2 model applies final_logit_softcapping"):
        plan_for(soft_capped_model, "train.logits=learned")


def test_trainable_head_under_zero3_is_one_block(tiny_model):
    """ZeRO-3 gathers a trainable head's sub-modules at each call; chunks per rank differ, so one block."""
    plan = plan_for(tiny_model, "parallel.engine=deepspeed", "parallel.zero_stage=3", "adapter.train_modules=[lm_head]")
    assert plan.logits.selected and plan.logits.chunk_tokens == 0
    assert "ZeRO-3" in decision(plan, "logits").value
    frozen = plan_for(tiny_model, "parallel.engine=deepspeed", "parallel.zero_stage=3")
    assert frozen.logits.chunk_tokens > 0  # a frozen Linear head has no sub-modules to gather: chunks are safe
