"""The sharded units of an engine that has them (the engine table's `units`: FSDP2), found at setup and marked on
the model in the order they are sharded: the vision encoder's layers, the decoder layers, then what each tower
holds outside its layers. The engine shards the marked modules (engines/fsdp2.py) and the root."""

from __future__ import annotations

from typing import Iterator

import torch

from loraflow.enginespec import SHARD_UNIT
from loraflow.errors import LoraflowError
from loraflow.setup.checkpointing import decoder_layers, hf_model, vision_layers
from loraflow.setup.towers import tower_root_modules


def mark_shard_units(model: torch.nn.Module, plan) -> None:
    if not plan.setup.engine_spec.units:
        return
    layers = decoder_layers(model)
    if not layers:
        raise LoraflowError(f"{type(hf_model(model)).__name__} has no transformers decoder layers to shard; "
                            f"parallel.engine={plan.setup.engine} needs a model whose layers are "
                            "GradientCheckpointingLayer.")
    # An image-text model's vision layers are units like the decoder layers, and the vision encoder and projector
    # are units of their own: each tower is gathered only while it runs.
    # The mark is (order, whether the unit is a layer): a layer's frozen LoRA base Linears may be units of their own.
    order = 0
    for layer in [*vision_layers(model), *layers]:
        setattr(layer, SHARD_UNIT, (order, True))
        order += 1
    roots = [r for t in plan.towers if t.name != "language" for r in t.roots]
    for unit in _tower_units(tower_root_modules(hf_model(model), roots)):
        setattr(unit, SHARD_UNIT, (order, False))
        order += 1


def _marked(module: torch.nn.Module) -> bool:
    # The module's own attribute only: PEFT's wrappers forward unknown attributes to the module they wrap.
    return SHARD_UNIT in vars(module)


def _tower_units(roots: list[torch.nn.Module]) -> Iterator[torch.nn.Module]:
    """The units that hold a tower's weights outside its layers. A tower that is a transformers sub-model (the
    vision encoder) is not sharded whole: fully_shard swaps a module's class for an FSDP subclass, and transformers
    5.23 looks up which outputs a model can record by the class's name (utils/output_capturing.py
    _CanRecordRegistry), so a sharded vision encoder stops returning the hidden states LLaVA reads its features
    from (`'NoneType' object is not subscriptable`). Its children that hold weights outside the layer units are
    sharded instead (embeddings, norms); a plain module (the projector) is a unit itself. A generator: each unit
    is marked before the next root is looked at, so a unit inside a later root (Qwen2-VL's merger in its vision
    encoder) is not taken twice."""
    from transformers import PreTrainedModel

    for root in roots:
        if isinstance(root, (torch.nn.ModuleList, torch.nn.ModuleDict)):
            # A container has no forward for fully_shard to hook (Qwen2.5-VL's vision blocks are a root when its
            # merger, inside the same encoder, is left out): its members are the units, where not units already.
            yield from _tower_units([m for m in root.children() if not any(_marked(x) for x in m.modules())])
            continue
        if not isinstance(root, PreTrainedModel):
            if not _marked(root):
                yield root
            continue
        for child in list(root.children()):
            if any(True for _ in child.parameters()) and not any(_marked(m) for m in child.modules()):
                yield from _tower_units([child])  # a container child (its blocks) gives its members
