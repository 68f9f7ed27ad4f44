"""The towers of an image-text model, found in its module tree: the vision encoder, the projector, and the language
model (everything else: token embeddings, decoder layers, output head).

transformers names them differently per family (loraflow/families.py VISION_NAMES and PROJECTOR_NAMES, every
family's names), first match wins; a model with a vision config whose towers none of the names find is refused by
the plan rather than trained as a text model.
The same function runs on the meta skeleton the plan inspects and on the live model setup builds, so the layer
indices the plan prints are the ones checkpointing applies to.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from loraflow.families import PROJECTOR_NAMES, VISION_NAMES

COPY_PARTS = ("original_module",)
"""PEFT's modules_to_save keeps the untouched original beside the trained copy; only the copy runs."""


@dataclass
class Tower:
    name: str
    roots: list[str] = field(default_factory=list)
    """Module names at the tower's root ("" for the language model: whatever no other tower holds)."""
    layers: list[str] = field(default_factory=list)
    """Its GradientCheckpointingLayer modules in forward order (what checkpointing indexes)."""
    parameters: int = 0


def _last(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _under(name: str, root: str) -> bool:
    return name == root or name.startswith(root + ".")


def find_towers(model: torch.nn.Module) -> dict[str, Tower] | None:
    """{vision, projector, language} for an image-text model, None for a text-only one. A tower holding
    modules_to_save copies lists each layer once, as the copy that runs."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    names = [n for n, _ in model.named_modules() if n]
    vision = next((n for n in names if _last(n) in VISION_NAMES), None)
    if vision is None:
        return None
    projector = next((n for n in names if _last(n) in PROJECTOR_NAMES), None)
    towers = {"vision": Tower("vision", [strip_peft(vision)]),
              "projector": Tower("projector", [strip_peft(projector)] if projector else []),
              "language": Tower("language", [""])}
    for name, module in model.named_modules():
        if isinstance(module, GradientCheckpointingLayer) and not set(name.split(".")) & set(COPY_PARTS):
            towers[tower_of(name, towers)].layers.append(name)
    for name, p in model.named_parameters():
        if not set(name.split(".")) & set(COPY_PARTS):
            towers[tower_of(name, towers)].parameters += p.numel()
    return towers


def tower_of(name: str, towers: dict[str, Tower]) -> str:
    """The tower a module or parameter belongs to; the projector wins where it sits inside the vision encoder
    (Qwen2-VL's visual.merger)."""
    name = strip_peft(name)
    for tower in ("projector", "vision"):
        if any(_under(name, root) for root in towers[tower].roots):
            return tower
    return "language"


def strip_peft(name: str) -> str:
    """A name inside a PEFT model (base_model.model.<name>, modules_to_save copies) as the plain model names it."""
    prefix = "base_model.model."
    name = name[len(prefix):] if name.startswith(prefix) else name
    return name.replace(".modules_to_save.default", "").replace(".original_module", "")


def tower_layers(model: torch.nn.Module, tower: str) -> list[torch.nn.Module]:
    """The live layer modules of one tower, in the order find_towers lists them."""
    towers = find_towers(model)
    modules = dict(model.named_modules())
    return [modules[n] for n in towers[tower].layers] if towers else []


def unreached_modules(model: torch.nn.Module, hf_config, towers: dict[str, Tower]) -> list[str]:
    """Vision-encoder modules whose output the image-text forward never reads, so their weights can get no gradient
    (they stay frozen, whatever the tower's choice, or DDP would wait for their gradients and the first-step guard
    would flag them). Most still run (CLIP computes every layer and its pooled output), on the tower's own
    activations:
    - the layers after the one `vision_feature_layer` reads (LLaVA's default -2 skips the last layer) and the
      final norm that only the pooled output uses;
    - a pooling head (SigLIP's MultiheadAttentionPoolingHead): image-text models read the patch features."""
    root = towers["vision"].roots[0]
    modules = dict(model.named_modules())
    out: list[str] = []
    pick = getattr(hf_config, "vision_feature_layer", None)
    layers = towers["vision"].layers
    if pick is not None and layers:
        # hidden_states[i] is the output of layer i - 1 (0: the patch embeddings), so negative picks count from
        # len(layers) + 1 entries.
        deepest = max(p % (len(layers) + 1) for p in (pick if isinstance(pick, (list, tuple)) else [pick]))
        out += layers[deepest:]
        out += [n for n in modules if _under(n, root) and _last(n) == "post_layernorm"]
    out += [n for n, m in modules.items() if _under(n, root) and "PoolingHead" in type(m).__name__]
    return out


def tower_root_modules(model: torch.nn.Module, roots: list[str]) -> list[torch.nn.Module]:
    """The live modules at the given tower roots, deepest first (an engine wraps inner units before outer ones).
    A root PEFT trains in full (modules_to_save) is two modules, the trained copy and the untouched original,
    and both are listed: the original never runs, and as a unit of its own it is never gathered."""
    from peft.utils.other import ModulesToSaveWrapper

    found = [(n, m) for n, m in model.named_modules() if n and strip_peft(n) in roots
             and not isinstance(m, (ModulesToSaveWrapper, torch.nn.ModuleDict))]
    return [m for _, m in sorted(found, key=lambda item: -item[0].count("."))]
