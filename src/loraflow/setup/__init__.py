"""Turn a plan into a ready model, in the one documented order:
load -> adapters -> freeze -> checkpointing -> engine wrap -> optimizer (the last two in the trainer/engines)."""

from __future__ import annotations

from loraflow.setup.adapters import apply_adapters
from loraflow.setup.checkpointing import apply_checkpointing
from loraflow.setup.model import load_model


def build_model(plan, tokenizer=None):
    """The model for the plan: loaded, adapted, frozen and checkpointed, on the plan's device. The tokenizer is
    only used to check that its vocabulary fits the model."""
    if tokenizer is not None:
        _check_vocab(plan, tokenizer)
    model = load_model(plan.config, plan.model.path, plan.load_dtype)
    model = apply_adapters(model, plan)  # adapters + freezing
    apply_checkpointing(model, plan)
    model.to(plan.device)
    model.train()
    return model


def _check_vocab(plan, tokenizer) -> None:
    from loraflow.errors import ConfigError

    if plan.model.vocab_size and len(tokenizer) > plan.model.vocab_size:
        raise ConfigError([f"the tokenizer has {len(tokenizer)} tokens but the model's embedding has "
                           f"{plan.model.vocab_size}; model.tokenizer does not belong to model.path."])
