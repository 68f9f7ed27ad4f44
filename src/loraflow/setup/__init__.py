"""Turn a plan into a ready model, in the one documented order:
load -> adapters -> freeze -> checkpointing -> engine wrap -> optimizer (the last two in the trainer/engines)."""

from __future__ import annotations

from loraflow.setup.adapters import apply_adapters
from loraflow.setup.checkpointing import apply_checkpointing
from loraflow.setup.model import load_merged
from loraflow.setup.preflight import check_vocab
from loraflow.setup.units import mark_shard_units


def load_base(plan, tokenizer=None):
    """The starting model before this run's adapter: loaded, with model.merge_adapters folded in."""
    if tokenizer is not None:
        check_vocab(plan.config, tokenizer, plan.model.vocab_size)
    model = load_merged(plan.config, plan.model.path, plan.load_dtype, plan.head, plan.attn_implementation,
                        plan.quantization, plan.device, plan.config.model.merge_adapters)
    if plan.head == "score" and tokenizer is not None:
        model.config.pad_token_id = tokenizer.pad_token_id  # the score is read at the last non-pad token
    return model


def build_model(plan, tokenizer=None):
    """The model for the plan: loaded, adapted, frozen and checkpointed, on the plan's device. The tokenizer is
    only used to check that its vocabulary fits the model."""
    model = load_base(plan, tokenizer)
    model = apply_adapters(model, plan)  # adapters + freezing
    if plan.head == "value":  # PPO's critic, trained in full; after PEFT so the saved adapter stays plain
        from loraflow.setup.value_head import attach_value_head

        attach_value_head(model, plan.trainable_dtype)
    apply_checkpointing(model, plan)
    mark_shard_units(model, plan)  # after checkpointing, which places its wrappers inside the units
    model.to(plan.device)
    model.train()
    return model


def frozen_copy(plan, tokenizer=None):
    """A separately loaded, frozen, eval-mode copy of the starting model: the reference policy of full
    fine-tuning (dpo.reference=copy). Not sharded by the engine: it is only read, without autograd."""
    model = load_base(plan, tokenizer)
    model.requires_grad_(False)
    return model.to(plan.device).eval()

