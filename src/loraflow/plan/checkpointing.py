"""The checkpointing area: which decoder layers recompute in backward, which part of each, in which mode
(reentrant or not), whether saved activations move to the CPU, and the two switches that follow from it: the
input-grad hook and the KV cache."""

from __future__ import annotations

from dataclasses import dataclass

from loraflow.config.schema import Config
from loraflow.errors import ConfigError
from loraflow.families import SUB_BLOCKS
from loraflow.plan.context import Context
from loraflow.plan.types import Decision
from loraflow.setup.model import ModelInfo


def checkpoint_layers(config: Config, num_layers: int) -> list[int]:
    c = config.checkpointing
    if not c.enabled:
        return []
    if c.layers is not None:  # spread evenly: layers=2 of 4 is 0, 2 (= every_n_layers=2)
        if c.layers > num_layers:
            raise ConfigError([f"checkpointing.layers={c.layers}, but the model has {num_layers} decoder layers; "
                               f"set checkpointing.layers to at most {num_layers}."])
        return sorted({i * num_layers // c.layers for i in range(c.layers)})
    n = c.every_n_layers
    return [i for i in range(num_layers) if i % n == 0]  # transformers' every_n_layers semantics


def checkpoint_block(config: Config, info: ModelInfo) -> str | None:
    """The decoder-layer child checkpointing.granularity recomputes (None: the whole layer), found by name in the
    inspected model's module names; a ConfigError naming the key when the architecture has none."""
    from loraflow.setup.checkpointing import sub_block_name

    granularity = config.checkpointing.granularity
    if granularity == "layer" or not config.checkpointing.enabled:
        return None
    # Children of the first decoder layer: `<...>.0.<child>` (layers are the only numbered list with them all); an
    # image-text model's vision layers are numbered too, and granularity is the language model's.
    from loraflow.setup.towers import tower_of

    children = {n.rsplit(".", 1)[1] for n in info.module_names if n.count(".") and n.rsplit(".", 2)[-2] == "0"
                and (info.towers is None or tower_of(n, info.towers) == "language")}
    found = sub_block_name(children, granularity)
    if found is None and info.inspected:
        raise ConfigError([f"checkpointing.granularity={granularity}: this {info.model_type} model's decoder layers "
                           f"have no {granularity} child (looked for {', '.join(SUB_BLOCKS[granularity])}; its "
                           f"layers hold {', '.join(sorted(children)) or 'nothing named'}). Set "
                           "checkpointing.granularity=layer."])
    return found or SUB_BLOCKS[granularity][0]


def asked_reentrant(config: Config, layers: list[int], vision_layers: list[int]) -> bool | None:
    """checkpointing.reentrant as asked (`auto` is non-reentrant); None where nothing recomputes."""
    if not (layers or vision_layers):
        return None
    return config.checkpointing.reentrant == "true"


@dataclass(frozen=True)
class Checkpointing:
    block: str | None
    """The sub-block each checkpointed layer recomputes (None: the whole layer, or nothing recomputes)."""
    offload_activations: bool
    """Tensors saved for backward go to CPU memory (never on a CPU device, where they already are)."""
    decisions: list[Decision]
    """checkpointing, checkpointing.reentrant, activation offload."""
    hooks: list[Decision]
    """input_grad_hook and use_cache, which the plan prints after the logits."""


def decide_checkpointing(ctx: Context, layers: list[int], block: str | None, in_engine: bool) -> Checkpointing:
    """The rules' final word on the mode and the hook, with every reason."""
    offload = ctx.config.checkpointing.offload_activations and ctx.env.device != "cpu"
    return Checkpointing(block if layers else None, offload,
                         _checkpointing(ctx, layers, block if layers else None, in_engine, offload),
                         [_input_grad_hook(ctx, layers), _use_cache(ctx)])


def _checkpointing(ctx: Context, layers: list[int], block: str | None, in_engine: bool,
                   offload: bool) -> list[Decision]:
    c = ctx.config.checkpointing
    if not layers:
        return [Decision("checkpointing", "off", "checkpointing.enabled=false: activations are kept for backward"),
                *_offload(ctx, offload)]
    n, total = len(layers), ctx.model.num_layers
    chosen = f"checkpointing.layers={c.layers}, spread evenly" if c.layers is not None else \
        f"every {c.every_n_layers}"
    where = "every layer" if n == total else f"layers {', '.join(map(str, layers))} of {total} ({chosen})"
    how = "torch's checkpoint around each layer's forward, inside its FSDP2 unit" if in_engine else \
        "transformers' own layer checkpointing"
    asked = f"checkpointing.layers={c.layers}" if c.layers is not None else \
        f"checkpointing.every_n_layers={c.every_n_layers}"
    if block:
        kept = "MLP" if c.granularity == "attention" else "attention"
        what = f"the `{block}` sub-block of {where}"
        why = (f"checkpointing.granularity={c.granularity} with {asked}: torch's checkpoint around each chosen "
               f"layer's {c.granularity} sub-block; the {kept} sub-block keeps its saved tensors, so only the "
               f"{c.granularity} part recomputes in backward")
    else:
        what, why = where, f"checkpointing.enabled=true with {asked}, through {how}"
    out = [Decision("checkpointing", what, why)]
    rule = ctx.rule("reentrant")
    reentrant = ctx.setup.reentrant
    if rule:
        out.append(Decision("checkpointing.reentrant", reentrant, f"checkpointing.reentrant={c.reentrant} "
                            "would fail on the installed versions with this engine", rule))
    elif c.reentrant == "auto":
        out.append(Decision("checkpointing.reentrant", False,
                            "chosen: non-reentrant records gradients for weights that are not layer inputs "
                            "(the adapters), so it needs no input-grad hook and is exact with partial "
                            "checkpointing; it is torch's recommended mode"))
    else:
        out.append(Decision("checkpointing.reentrant", reentrant,
                            f"requested (checkpointing.reentrant={c.reentrant})"))
    return out + _offload(ctx, offload)


def _offload(ctx: Context, offload: bool) -> list[Decision]:
    """Printed only when asked for (checkpointing.offload_activations=true)."""
    if not ctx.config.checkpointing.offload_activations:
        return []
    if not offload:
        return [Decision("activation offload", "no effect on cpu", "checkpointing.offload_activations=true, but "
                         "the device is the CPU, where saved tensors already live")]
    return [Decision("activation offload", "tensors saved for backward to pinned CPU memory during the forward",
                     "checkpointing.offload_activations=true; weights (and views of them) stay on the device, as "
                     "they are kept there anyway")]


def _input_grad_hook(ctx: Context, layers: list[int]) -> Decision:
    if ctx.setup.input_grad_hook:
        return Decision("input_grad_hook", True, "reentrant checkpointing only records a graph when a layer "
                        "input requires grad and the embeddings are frozen", ctx.rule("input_grad_hook"))
    if not layers:
        why = "no checkpointing, so autograd records every layer"
    elif ctx.asked.embedding_output_requires_grad:
        why = "the embedding output already requires grad (embeddings train)"
    else:
        why = "non-reentrant checkpointing tracks the adapter weights directly"
    return Decision("input_grad_hook", False, why)


def _use_cache(ctx: Context) -> Decision:
    """Training forwards never write a KV cache (they pass use_cache=False: logprobs.learned_logps)."""
    rule = ctx.rule("use_cache")
    if rule:
        return Decision("use_cache", False, f"the model's default is {ctx.asked.use_cache}; training must not "
                        "write a KV cache here", rule)
    return Decision("use_cache", False, f"the model's default is {ctx.asked.use_cache}, but training never reads "
                    "the KV cache; turning it off saves its memory and keeps the forward free of cache state")
