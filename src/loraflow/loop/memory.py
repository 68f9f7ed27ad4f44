"""Per-rank memory accounting: bytes of parameters, gradients and optimizer state this rank actually holds,
counted from the tensors themselves (each storage once), set beside the textbook formula for adapters under full
sharding: (b x base params + 16 x adapter params) / world size, where b is the base weights' bytes per element
(2 in bf16) and 16 = fp32 weight 4 + fp32 gradient 4 + Adam's two fp32 moments 8.

Taken on the first step: gradients right after the first backward, optimizer state right after the first update
(Adam allocates its moments lazily), so the figures are what the run holds from then on. Beside them, the bytes
each decoder layer saved for backward on the first micro-batch, against the floor of full recompute.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from loraflow.setup.quantize import constants, quantized_linears

MiB = 2**20


def _bytes(tensors) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None or not torch.is_tensor(t):
            continue
        if hasattr(t, "to_local"):  # a DTensor (FSDP2 parameter, gradient or optimizer state): this rank's shard
            t = t.to_local()
        if t.numel() == 0:
            continue
        storage = t.untyped_storage()
        seen[storage.data_ptr() or id(storage)] = storage.nbytes()
    return sum(seen.values())


@dataclass
class RankMemory:
    frozen_params: int = 0
    trainable_params: int = 0
    gradients: int = 0
    optimizer: int = 0

    @property
    def total(self) -> int:
        return self.frozen_params + self.trainable_params + self.gradients + self.optimizer


@dataclass
class MemoryReport:
    engine: str
    world_size: int
    base_elements: int
    adapter_elements: int
    base_bytes_per_element: int
    ranks: list[RankMemory] = field(default_factory=list)
    mine: RankMemory = field(default_factory=RankMemory)
    activations: Any = None
    """This rank's bytes saved for backward per decoder layer on the first micro-batch (setup/saved_tensors.py's
    SavedBytes), when the trainer counted them."""

    quantized_elements: int = 0
    """Weights of the base stored quantized (QLoRA), counted as weights, not as their packed storage elements."""
    quantized_layers: int = 0
    quantization: Any = None
    """setup/quantize.py's Quantization of the run, for the formula's bytes per quantized weight."""

    @classmethod
    def after_backward(cls, engine) -> "MemoryReport":
        params = list(engine.module.named_parameters())
        # Found by their layers: FSDP2 replaces a quantized weight with a plain sharded parameter.
        layers = {id(m.weight): m for m in quantized_linears(engine.module).values()}
        frozen = [p for _, p in params if not p.requires_grad and id(p) not in layers]
        quantized = [p for _, p in params if id(p) in layers]
        trainable = [p for _, p in params if p.requires_grad]
        numel = _full_numel
        report = cls(engine=engine.label(), world_size=engine.world_size,
                     base_elements=sum(numel(p) for p in frozen), adapter_elements=sum(numel(p) for p in trainable),
                     base_bytes_per_element=frozen[0].element_size() if frozen else 4,
                     quantized_elements=sum(m.in_features * m.out_features for m in layers.values()),
                     quantized_layers=len(quantized),
                     quantization=engine.plan.quantization)
        # Quantization constants (absmax scales, code tables) are plain attributes of each weight, on every rank.
        report.mine.frozen_params = _bytes([engine.local_tensor(p) for p in frozen + quantized]
                                           + [t for p in quantized for t in constants(p, layers[id(p)])])
        report.mine.trainable_params = _bytes(engine.local_tensor(p) for p in trainable)
        report.mine.gradients = _bytes(engine.gradient_tensors())
        return report

    def after_step(self, engine) -> None:
        self.mine.optimizer = _bytes(engine.optimizer_tensors())

    def gathered(self, engine) -> "MemoryReport":
        """Every rank's figures on every rank (collective)."""
        self.ranks = engine.gather_objects(self.mine)
        return self

    @property
    def formula(self) -> float:
        """Bytes per rank: (b x base + p x quantized + 16 x adapter) / world size, where p is the packed bytes per
        quantized weight, plus the quantization constants (block scales, code tables), which every rank keeps."""
        q = self.quantization
        packed = q.packed_bytes_per_weight() * self.quantized_elements if q is not None else 0.0
        return (self.base_bytes_per_element * self.base_elements + packed + 16 * self.adapter_elements) \
            / self.world_size + self.replicated_constants

    @property
    def replicated_constants(self) -> float:
        q = self.quantization
        return 0.0 if q is None else (q.scale_bytes_per_weight() * self.quantized_elements
                                      + q.bytes_per_layer() * self.quantized_layers)

    def render(self) -> str:
        quantized = (f"{self.quantized_elements:,} weights quantized ({self.quantization.method}), "
                     if self.quantization is not None else "")
        lines = [f"memory per rank after the first step ({self.engine}, {self.world_size} processes; {quantized}"
                 f"{self.base_elements:,} frozen and {self.adapter_elements:,} trainable elements):",
                 "  rank  frozen params  trainable params   gradients  optimizer state      total"]
        for r, m in enumerate(self.ranks):
            lines.append(f"  {r:>4}  {_mib(m.frozen_params):>13}  {_mib(m.trainable_params):>16}  "
                         f"{_mib(m.gradients):>10}  {_mib(m.optimizer):>15}  {_mib(m.total):>9}")
        worst = max((m.total for m in self.ranks), default=0)
        q = self.quantization
        term = f"{q.packed_bytes_per_weight():g} x quantized + " if q is not None else ""
        constants = (f" + constants on every rank ({q.scale_bytes_per_weight():.4f} x quantized + "
                     f"{q.bytes_per_layer()} x {self.quantized_layers} layers)") if q is not None else ""
        lines.append(f"  formula (fully sharded): ({self.base_bytes_per_element} x base + {term}16 x adapter) / "
                     f"{self.world_size}{constants} = {_mib(self.formula)}; largest rank / formula = "
                     f"{worst / self.formula:.2f}" if self.formula else "")
        if q is not None:
            lines.append(f"  quantized weight: {q.formula()}")
        if self.activations is not None:
            lines += self.activations.render()
        return "\n".join(lines)

    def to_metrics(self) -> dict[str, Any]:
        out: dict[str, Any] = {"engine": self.engine, "world_size": self.world_size,
                               "base_elements": self.base_elements, "adapter_elements": self.adapter_elements,
                               "quantized_elements": self.quantized_elements, "formula_bytes": self.formula}
        for r, m in enumerate(self.ranks):
            for key in ("frozen_params", "trainable_params", "gradients", "optimizer"):
                out[f"rank{r}_{key}_bytes"] = getattr(m, key)
            out[f"rank{r}_total_bytes"] = m.total
        if self.activations is not None:
            out.update(self.activations.to_metrics())
        return out


def _full_numel(p: torch.Tensor) -> int:
    ds_numel = getattr(p, "ds_numel", None)  # a ZeRO-3 placeholder's real size
    return int(ds_numel) if ds_numel is not None else p.numel()


def _mib(n: float) -> str:
    return f"{n / MiB:.3f} MiB"
