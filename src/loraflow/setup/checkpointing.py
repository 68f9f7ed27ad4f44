"""Activation checkpointing and the input-grad hook, exactly as the plan says.

Checkpointing goes through transformers' own per-layer mechanism (GradientCheckpointingLayer), which checkpoints
the layer's `forward` (module hooks stay outside the recompute) and turns the KV cache off inside checkpointed
layers. transformers 5 also adds an input-grad hook on its own; loraflow removes or keeps it so the model does
what the printed plan says, and verifies the checkpointed layers afterwards.
"""

from __future__ import annotations

import inspect

import torch

from loraflow.errors import LoraflowError


def hf_model(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers PreTrainedModel inside a PEFT wrapper (or the model itself)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def checkpointed_layers(model: torch.nn.Module) -> list[int]:
    """Indices of the decoder layers that will recompute in backward."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in hf_model(model).modules() if isinstance(m, GradientCheckpointingLayer)]
    return [i for i, m in enumerate(layers) if m.gradient_checkpointing]


def enable_layer_checkpointing(base: torch.nn.Module, reentrant: bool, every_n: int) -> None:
    kwargs = {"use_reentrant": reentrant}
    enable = getattr(base, "activation_checkpointing_enable", None)
    if enable is not None and "every_n_layers" in inspect.signature(enable).parameters:
        enable(activation_checkpointing_kwargs=kwargs, every_n_layers=every_n)
        return
    # transformers before the every_n_layers argument (< 5.x): enable all, then switch off the skipped layers.
    base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in base.modules() if isinstance(m, GradientCheckpointingLayer)]
    for i, layer in enumerate(layers):
        layer.gradient_checkpointing = i % every_n == 0


def set_input_grad_hook(model: torch.nn.Module, enabled: bool) -> None:
    base = hf_model(model)
    has_hook = bool(getattr(base, "_require_grads_hooks", None) or getattr(base, "_require_grads_hook", None))
    if enabled and not has_hook:
        base.enable_input_require_grads()
    elif not enabled and has_hook:
        base.disable_input_require_grads()


def apply_checkpointing(model: torch.nn.Module, plan) -> None:
    base = hf_model(model)
    if plan.checkpoint_in_engine:  # FSDP2 wraps the layers inside their sharded units itself (engines/fsdp2.py)
        set_input_grad_hook(model, plan.input_grad_hook)
        return
    if plan.checkpoint_layers:
        enable_layer_checkpointing(base, bool(plan.reentrant), plan.config.checkpointing.every_n_layers)
    set_input_grad_hook(model, plan.input_grad_hook)  # after: transformers 5 adds its own hook when enabling
    actual = checkpointed_layers(model)
    if actual != plan.checkpoint_layers:
        raise LoraflowError(f"checkpointing applied to layers {actual}, but the plan says {plan.checkpoint_layers}; "
                            f"this {type(base).__name__} does not follow transformers' layer checkpointing. "
                            "Set checkpointing.enabled=false for this model.")
