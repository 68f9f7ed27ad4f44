"""Tensors saved for backward: where they live (checkpointing.offload_activations) and how many bytes each decoder
layer keeps (the memory report's activation table).

One `saved_tensors_hooks` pair does both jobs, because torch applies only the innermost pair: a counting pair
nested inside `torch.autograd.graph.save_on_cpu` would hide every tensor from the offload, and the other way round
from the count. Inside a non-reentrant checkpoint, torch's own pair is innermost, so what a checkpointed region
would have saved never reaches these hooks (it is recomputed, not kept); what the checkpoint does keep, the
region's input, is counted by a forward pre-hook on the region.

The count runs on the first forward of the run only (the memory report's step): later forwards take the plain
path, or only the offload.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from loraflow.setup.checkpointing import checkpoint_targets, decoder_layers, hf_model

OUTSIDE = -1
"""The region of saved tensors outside any decoder layer (embeddings, final norm, head, loss), and of inputs every
layer shares (rotary cos/sin, masks), which are held once for all layers."""


def _is_weight(t: torch.Tensor) -> bool:
    """A parameter or a view of one (linear saves weight.t()): kept on the device, and not an activation."""
    return isinstance(t, torch.nn.Parameter) or (t._is_view() and isinstance(t._base, torch.nn.Parameter))


def _key(t: torch.Tensor) -> int:
    storage = t.untyped_storage()
    return storage.data_ptr() or id(storage)


def _tensors(values) -> Iterator[torch.Tensor]:
    for v in values:
        if torch.is_tensor(v):
            yield v
        elif isinstance(v, (tuple, list)):  # position_embeddings = (cos, sin)
            yield from (x for x in v if torch.is_tensor(x))


def _main_input(args: tuple, kwargs: dict[str, Any]) -> torch.Tensor | None:
    """The residual stream entering a layer or sub-block: the first positional tensor, or `hidden_states`
    (Llama's decoder layer calls self_attn with keywords only)."""
    first = args[0] if args else kwargs.get("hidden_states")
    return first if torch.is_tensor(first) else None


@dataclass
class SavedBytes:
    """Bytes saved for backward by one forward (the run's first micro-batch), per decoder layer."""

    per_layer: list[int]
    outside: int
    floor: list[int]
    """Per layer: element size of the compute dtype x the elements of the layer's input (batch x seq x hidden),
    what a layer that is fully recomputed must still keep (its input)."""
    dtype: str
    shape: tuple[int, ...] = ()
    recomputes: list[str] = field(default_factory=list)

    def ratios(self) -> list[float]:
        return [s / f if f else float("nan") for s, f in zip(self.per_layer, self.floor)]

    def render(self) -> list[str]:
        shape = " x ".join(map(str, self.shape))
        lines = [f"  bytes saved for backward per decoder layer (first micro-batch, each storage once, weights "
                 f"excluded); floor = {self.dtype} ({self.floor_element_size} B) x {shape} (layer input):",
                 "  layer  recomputes        saved          floor  saved / floor"]
        for i, (s, f, r) in enumerate(zip(self.per_layer, self.floor, self.ratios())):
            lines.append(f"  {i:>5}  {self.recomputes[i] or 'nothing':<10}  {_mib(s):>11}  {_mib(f):>13}  {r:>13.2f}")
        lines.append(f"  outside layers (embeddings, head, loss, shared rotary/masks): {_mib(self.outside)}; all "
                     f"layers: {_mib(sum(self.per_layer))}")
        return lines

    @property
    def floor_element_size(self) -> int:
        return torch.empty(0, dtype=getattr(torch, self.dtype)).element_size()

    def to_metrics(self) -> dict[str, Any]:
        out: dict[str, Any] = {"saved_outside_bytes": self.outside, "saved_dtype": self.dtype}
        for i, (s, f) in enumerate(zip(self.per_layer, self.floor)):
            out[f"layer{i}_saved_bytes"], out[f"layer{i}_floor_bytes"] = s, f
        return out


class _Counter:
    """Attributes each saved storage (once) to the decoder layer whose forward is running."""

    def __init__(self, model: torch.nn.Module, plan) -> None:
        self.layers = decoder_layers(model)
        self.top = hf_model(model)
        self.dtype = plan.autocast_dtype
        self.weights = {_key(p.to_local() if hasattr(p, "to_local") else p) for p in model.parameters()}
        self.seen: set[int] = set()
        self.shared: set[int] = set()
        self.bytes: dict[int, int] = defaultdict(int)
        self.floor: dict[int, int] = defaultdict(int)
        self.shape: tuple[int, ...] = ()
        self.current: list[int] = []
        self.recording = False
        self.targets = checkpoint_targets(model, plan) if plan.checkpoint_layers else []
        self.recomputes = [""] * len(self.layers)
        for i, _ in self.targets:
            self.recomputes[i] = plan.checkpoint_block or "layer"

    def saw(self, t: torch.Tensor, region: int | None = None) -> None:
        if t.numel() == 0 or _is_weight(t):
            return
        key = _key(t)
        if key in self.weights or key in self.seen:
            return
        self.seen.add(key)
        if region is None:
            region = OUTSIDE if key in self.shared or not self.current else self.current[-1]
        self.bytes[region] += t.untyped_storage().nbytes()

    @contextlib.contextmanager
    def hooks(self) -> Iterator[None]:
        handles = [self.top.register_forward_pre_hook(self._top_pre)]
        for i, layer in enumerate(self.layers):
            handles.append(layer.register_forward_pre_hook(self._layer_pre(i), with_kwargs=True))
            handles.append(layer.register_forward_hook(self._layer_post))
        for i, module in self.targets:  # what a checkpoint keeps: its region's input
            handles.append(module.register_forward_pre_hook(self._held_input(i), with_kwargs=True))
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    def _top_pre(self, module, args) -> None:
        # Forwards without autograd (a reference or reward model run on the policy) save nothing: their layer
        # inputs are not counted either. Inside a reentrant checkpoint the layer itself runs under no_grad, so the
        # decision is taken here, at the model's entry.
        self.recording = torch.is_grad_enabled()

    def _layer_pre(self, i: int):
        def hook(module, args, kwargs):
            self.current.append(i)
            if not self.recording:
                return
            for t in _tensors(list(args[1:]) + list(kwargs.values())):
                if t is not _main_input(args, kwargs):
                    self.shared.add(_key(t))
            x = _main_input(args, kwargs)
            if x is not None:
                dtype = self.dtype or x.dtype
                self.dtype = dtype
                self.shape = self.shape or tuple(x.shape)
                self.floor[i] += x.numel() * torch.empty(0, dtype=dtype).element_size()
        return hook

    def _layer_post(self, module, args, output) -> None:
        self.current.pop()

    def _held_input(self, i: int):
        def hook(module, args, kwargs):
            x = _main_input(args, kwargs)
            if self.recording and x is not None:
                self.saw(x, region=i)
        return hook

    def result(self) -> SavedBytes:
        n = len(self.layers)
        return SavedBytes(per_layer=[self.bytes[i] for i in range(n)], outside=self.bytes[OUTSIDE],
                          floor=[self.floor[i] for i in range(n)],
                          dtype=str(self.dtype or torch.float32).replace("torch.", ""), shape=self.shape,
                          recomputes=self.recomputes)


class ActivationSaving:
    """The context the trainer runs each forward in: offloads saved tensors when the plan says so, and counts
    them on the first forward."""

    def __init__(self, plan, model: torch.nn.Module, count: bool = True, offload: bool | None = None) -> None:
        self.plan, self.model = plan, model
        self.offload = plan.offload_activations if offload is None else offload
        self.pin = torch.cuda.is_available()
        self.count_next = count
        self.counted: SavedBytes | None = None
        self.offloaded = 0
        """How many saved tensors went through the offload (a check that it acts)."""

    @contextlib.contextmanager
    def forward(self) -> Iterator[None]:
        counter = _Counter(self.model, self.plan) if self.count_next else None
        self.count_next = False
        if counter is None and not self.offload:
            yield
            return
        with torch.autograd.graph.saved_tensors_hooks(self._pack(counter), self._unpack), \
                counter.hooks() if counter is not None else contextlib.nullcontext():
            yield
        if counter is not None:
            self.counted = counter.result()

    def _pack(self, counter: _Counter | None):
        offload, pin = self.offload, self.pin

        def pack(t: torch.Tensor):
            if counter is not None:
                counter.saw(t)
            if not offload or _is_weight(t):
                return t
            # As torch.autograd.graph.save_on_cpu, minus the weights. A CPU tensor is copied as well: rare on an
            # accelerator, and the plan turns offload off on CPU runs, so the tests can run this path there.
            packed = torch.empty(t.size(), dtype=t.dtype, layout=t.layout, pin_memory=pin and not t.is_sparse)
            packed.copy_(t)
            self.offloaded += 1
            return t.device, packed

        return pack

    @staticmethod
    def _unpack(packed):
        if isinstance(packed, tuple):
            device, t = packed
            return t.to(device, non_blocking=t.is_pinned())
        return packed


def _mib(n: float) -> str:
    return f"{n / 2**20:.3f} MiB"
