"""The family table: every entry's names are those of the architecture transformers builds for its model_type, and
every lookup that does not know the family matches every entry's names."""

from __future__ import annotations

import pytest
import torch

from loraflow import families
from loraflow.families import FAMILIES, UNLISTED, Family, family
from loraflow.frontends.intent import TOWER_MODULE

# Keys a default config lacks for building the model (transformers 5.23's DbrxAttentionConfig has no rope_theta).
CONFIG_FIXES = {"dbrx": {"attn_config": {"rope_theta": 10000.0}}}
REMOTE = {"minicpmv"}  # remote code only: transformers has no config class for it


def _skeleton(model_type: str):
    from transformers import AutoConfig

    from loraflow.setup.preflight import model_auto_class

    config = AutoConfig.for_model(model_type, **CONFIG_FIXES.get(model_type, {}))
    with torch.device("meta"):
        return model_auto_class(config).from_config(config)


def _last(name: str) -> str:
    return name.rsplit(".", 1)[-1]


@pytest.mark.parametrize("model_type", [t for t in FAMILIES if t not in REMOTE])
def test_an_entry_names_what_transformers_builds(model_type):
    from transformers.modeling_layers import GradientCheckpointingLayer

    f = family(model_type)
    model = _skeleton(model_type)
    names = {_last(n) for n, _ in model.named_modules() if n}
    if f.vision:
        assert set(f.vision) & names and set(f.projector) & names, model_type
        return
    layer = next(m for m in model.modules() if isinstance(m, GradientCheckpointingLayer))
    children = {n for n, _ in layer.named_children()}
    assert not f.attention or set(f.attention) & children, (model_type, children)
    assert set(f.mlp) & children, (model_type, children)
    assert _last(next(n for n, m in model.named_modules() if m is model.get_input_embeddings())) in f.embedding
    assert _last(next(n for n, m in model.named_modules() if m is model.get_output_embeddings())) in f.head
    linears = {_last(n) for n, m in layer.named_modules() if isinstance(m, torch.nn.Linear)
               or type(m).__name__ == "Conv1D"}
    assert set(f.linears[0]) | set(f.linears[1]) <= linears, (model_type, linears)


def test_an_unknown_model_type_gets_the_default_entry():
    assert family("not-a-model") == families.DEFAULT == Family()


def test_the_generic_lists_hold_every_entry_names():
    for f in (*FAMILIES.values(), UNLISTED):
        assert set(f.vision) <= set(families.VISION_NAMES) and set(f.projector) <= set(families.PROJECTOR_NAMES)
        assert set(f.attention) <= set(families.SUB_BLOCKS["attention"])
        assert set(f.mlp) <= set(families.SUB_BLOCKS["mlp"])
        assert set(f.embedding) <= set(families.EMBEDDING_NAMES) and set(f.head) <= set(families.HEAD_NAMES)
        assert dict(f.logit_transforms).items() <= families.LOGIT_TRANSFORMS.items()
        assert set(f.image_inputs) <= set(families.IMAGE_BATCHING)
        assert set(f.framing_tokens) <= set(families.FRAMING_TOKENS)
        assert all(families.IMAGE_TOKEN_ATTR.search(f"{word}_token") for word in f.image_token_words)
    assert families.TOKEN_KEYS == {"token_type_ids", "mm_token_type_ids"}


def test_a_target_naming_any_vision_encoder_names_the_tower():
    # The frontends' pattern is built from the same names setup finds the towers by.
    assert all(TOWER_MODULE.search(f"model.{name}.layers") for name in families.VISION_NAMES)
    assert not any(TOWER_MODULE.search(name) for name in families.PROJECTOR_NAMES)
