"""Activation checkpointing and the input-grad hook, exactly as the plan says: the one implementation of both
mechanisms, applied to exactly `plan.checkpoint_layers` (indices into `decoder_layers`).

- Outside any sharded unit (every engine, and FSDP2 with checkpoint_outside_shard): transformers' own per-layer
  mechanism (GradientCheckpointingLayer), which checkpoints the layer's `forward` (module hooks stay outside the
  recompute) and turns the KV cache off inside checkpointed layers. `apply_checkpointing` does it at setup.
- Inside each FSDP2 unit (plan.checkpoint_in_engine, rule fsdp2-recompute-cast): torch's checkpoint around the
  layer's forward, so that FSDP2's gather and mixed-precision casts, which run in the unit's __call__, stay outside
  the recompute. It has to be in place before fully_shard, so `apply_checkpointing` places it at setup too
  (`checkpoint_in_units`), before the engine shards the units setup/units.py marked.
- One sub-block of each chosen layer (plan.checkpoint_block: checkpointing.granularity=mlp or attention): torch's
  checkpoint around that child's forward (`checkpoint_forward`), at setup for every engine. The child sits inside
  its layer, so under FSDP2 the recompute is inside the layer's sharded unit whichever placement the plan chose.
transformers 5 also adds an input-grad hook on its own; loraflow removes or keeps it so the model does what the
printed plan says, and verifies the checkpointed layers (and sub-blocks) afterwards.
"""

from __future__ import annotations

import torch

from loraflow.errors import LoraflowError
from loraflow.families import SUB_BLOCKS

CHECKPOINTED = "_loraflow_checkpointed"
"""Marks a layer whose forward `checkpoint_forward` wrapped (verify/crosscheck.py counts them)."""


def hf_model(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers PreTrainedModel inside a PEFT wrapper (or the model itself)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The language model's decoder layers in order, whatever the architecture calls their list (transformers
    marks them as GradientCheckpointingLayer, and counts them in this order for every_n_layers): what
    plan.checkpoint_layers indexes. An image-text model's vision layers are GradientCheckpointingLayers too, and
    are not among them (vision_layers)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    from loraflow.setup.towers import find_towers, tower_layers

    base = hf_model(model)
    if find_towers(base) is not None:
        return tower_layers(base, "language")
    return [m for m in base.modules() if isinstance(m, GradientCheckpointingLayer)]


def vision_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """An image-text model's vision-encoder layers (plan.vision_checkpoint_layers indexes them); [] for a text
    model."""
    from loraflow.setup.towers import tower_layers

    return tower_layers(hf_model(model), "vision")


def sub_block_name(child_names, granularity: str) -> str | None:
    """The decoder layer's child that `granularity` recomputes (None: the layer has no such child), by the names
    families.SUB_BLOCKS lists for it, first match wins."""
    return next((n for n in SUB_BLOCKS[granularity] if n in set(child_names)), None)


def checkpoint_targets(model: torch.nn.Module, plan) -> list[tuple[int, torch.nn.Module]]:
    """(layer index, module whose forward recomputes) for every checkpointed region the plan chose: the layer
    itself, or its plan.checkpoint_block child."""
    layers = decoder_layers(model)
    if not plan.checkpoint_block:
        return [(i, layers[i]) for i in plan.checkpoint_layers]
    return [(i, getattr(layers[i], plan.checkpoint_block)) for i in plan.checkpoint_layers]


def _recomputes(m: torch.nn.Module) -> bool:
    return bool(getattr(m, "gradient_checkpointing", False) or getattr(m, CHECKPOINTED, False))


def checkpointed_layers(model: torch.nn.Module) -> list[int]:
    """Indices of the decoder layers that will recompute in backward (whole or a sub-block), by either mechanism."""
    return [i for i, (_, block) in enumerate(checkpointed_blocks(model)) if block]


def checkpointed_blocks(model: torch.nn.Module) -> list[tuple[int, str]]:
    """(layer index, what recomputes: `layer` or the child's name, "" for nothing) for every decoder layer."""
    out = []
    for i, layer in enumerate(decoder_layers(model)):
        children = [n for n, c in layer.named_children() if getattr(c, CHECKPOINTED, False)]
        out.append((i, "layer" if _recomputes(layer) else ",".join(children)))
    return out


def enable_layer_checkpointing(base: torch.nn.Module, reentrant: bool, layers: list[int],
                               vision: list[int] | None = None) -> None:
    """transformers' layer checkpointing on exactly `layers` (and an image-text model's `vision` layers): enabled
    on every layer of every tower (which also installs the checkpoint function with our use_reentrant), then
    switched off on the others."""
    kwargs = {"use_reentrant": reentrant}
    enable = getattr(base, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs=kwargs)
    else:  # transformers before activation_checkpointing_enable
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    chosen = set(layers)
    for i, layer in enumerate(decoder_layers(base)):
        layer.gradient_checkpointing = i in chosen
    for i, layer in enumerate(vision_layers(base)):
        layer.gradient_checkpointing = i in set(vision or [])


def checkpoint_forward(layer: torch.nn.Module, reentrant: bool) -> None:
    """Checkpoint the layer's `forward` in place: hooks that run in the module's __call__ (FSDP2's gather and
    mixed-precision casts) stay outside the recomputed region, so recompute happens inside the sharded unit. Unlike
    torch's checkpoint_wrapper this adds no wrapper module, so parameter names (and the adapter PEFT saves) stay the
    same."""
    from torch.utils.checkpoint import checkpoint

    forward = layer.forward

    def checkpointed(*args, **kwargs):
        if not reentrant:
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)
        # Reentrant checkpoint takes positional inputs only: pass the keyword tensors (rotary cos/sin, masks) as
        # inputs too, so the recompute sees them.
        keys, n = list(kwargs), len(args)

        def run(*flat):
            return forward(*flat[:n], **dict(zip(keys, flat[n:])))

        return checkpoint(run, *args, *kwargs.values(), use_reentrant=True)

    layer.forward = checkpointed
    setattr(layer, CHECKPOINTED, True)


def _verify(model: torch.nn.Module, plan) -> None:
    actual = [(i, block) for i, block in checkpointed_blocks(model) if block]
    want = [(i, plan.checkpoint_block or "layer") for i in plan.checkpoint_layers]
    if actual != want:
        key = "checkpointing.granularity=layer" if plan.checkpoint_block else "checkpointing.enabled=false"
        raise LoraflowError(f"checkpointing applied to (layer, block) {actual}, but the plan says {want}; this "
                            f"{type(hf_model(model)).__name__} does not follow transformers' layer "
                            f"checkpointing. Set {key} for this model.")
    vision = [i for i, layer in enumerate(vision_layers(model)) if _recomputes(layer)]
    if vision != plan.vision_checkpoint_layers:
        raise LoraflowError(f"checkpointing applied to vision layers {vision}, but the plan says "
                            f"{plan.vision_checkpoint_layers}; set towers.vision.checkpointing=false for this "
                            f"{type(hf_model(model)).__name__}.")


def apply_checkpointing(model: torch.nn.Module, plan) -> None:
    if plan.checkpoint_in_engine:  # inside the engine's sharded units: placed now, before the engine shards
        set_input_grad_hook(model, plan.input_grad_hook)
        checkpoint_in_units(model, plan)
        return
    if plan.checkpoint_block:  # sub-blocks: inside their layer (and its FSDP2 unit) for every engine
        for i, layer in enumerate(decoder_layers(model)):
            if i in plan.checkpoint_layers and not hasattr(layer, plan.checkpoint_block):
                raise LoraflowError(f"decoder layer {i} ({type(layer).__name__}) has no `{plan.checkpoint_block}` "
                                    "child to checkpoint; set checkpointing.granularity=layer for this model.")
        for _, block in checkpoint_targets(model, plan):
            checkpoint_forward(block, bool(plan.reentrant))
        _checkpoint_vision(model, plan)  # granularity is the language model's; vision layers recompute whole
    elif plan.checkpoint_layers or plan.vision_checkpoint_layers:
        enable_layer_checkpointing(hf_model(model), bool(plan.reentrant), plan.checkpoint_layers,
                                   plan.vision_checkpoint_layers)
    set_input_grad_hook(model, plan.input_grad_hook)  # after: transformers 5 adds its own hook when enabling
    _verify(model, plan)


def checkpoint_in_units(model: torch.nn.Module, plan) -> None:
    """Checkpointing inside FSDP2's units (plan.checkpoint_in_engine): torch's checkpoint around the forward of
    exactly plan.checkpoint_layers, placed before the engine's fully_shard wraps each layer. (Sub-blocks are inside
    their layer's unit anyway.)"""
    chosen = set(plan.checkpoint_layers)
    for i, layer in enumerate(decoder_layers(model)):
        if i in chosen:
            checkpoint_forward(layer, bool(plan.reentrant))
    _checkpoint_vision(model, plan)
    _verify(model, plan)


def _checkpoint_vision(model: torch.nn.Module, plan) -> None:
    for i, layer in enumerate(vision_layers(model)):
        if i in plan.vision_checkpoint_layers:
            checkpoint_forward(layer, bool(plan.reentrant))


def set_input_grad_hook(model: torch.nn.Module, enabled: bool) -> None:
    base = hf_model(model)
    has_hook = bool(getattr(base, "_require_grads_hooks", None) or getattr(base, "_require_grads_hook", None))
    if enabled and not has_hook:
        base.enable_input_require_grads()
    elif not enabled and has_hook:
        base.disable_input_require_grads()
