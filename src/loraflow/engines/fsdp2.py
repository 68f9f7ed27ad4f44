"""PyTorch FSDP2 (`fully_shard`): every parameter sharded on its own across ranks, gathered per unit.

Units: each decoder layer (and an image-text model's vision layers, vision encoder and projector), then the root
(embeddings, final norm, head). With LoRA the frozen base Linear of every
adapted module is a unit of its own first (plan.fsdp_frozen_units_separate, rule fsdp-frozen-grad-memory): the
frozen weights never share a gather or reduce buffer with trainable ones, so the gradient memory is the adapters'.
Precision: MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) for bf16-mixed (sharded fp32 adapters,
bf16 compute, fp32 gradient reduction). Checkpointing sits where the plan says (fsdp2-recompute-cast): outside the
unit (transformers' layer checkpointing, already applied at setup) or inside it (torch's checkpoint around the
layer's forward). Both mechanisms live in setup/checkpointing.py, which places either before this engine shards;
the units themselves are found and marked at setup too (setup/units.py), so this engine knows no model layout.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from loraflow.engines.base import Engine, clean_name, make_optimizer, make_scheduler
from loraflow.enginespec import SHARD_UNIT
from loraflow.errors import LoraflowError


def _is_dtensor(t: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


class FSDP2Engine(Engine):
    name = "fsdp2"

    def __init__(self, plan, model: torch.nn.Module, total_steps: int):
        super().__init__(plan, model, total_steps)
        self._shard(model)
        self.optimizer = make_optimizer([p for _, p in self.trainable], self.train_cfg)
        self.scheduler = make_scheduler(self.optimizer, self.train_cfg, total_steps)

    def _shard(self, model: torch.nn.Module) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        plan = self.plan
        mesh = init_device_mesh(plan.device, (self.world_size,))
        policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
                  if plan.autocast_dtype == torch.bfloat16 else MixedPrecisionPolicy())
        reshard = plan.config.parallel.fsdp_reshard_after_forward
        # The units setup marked (setup/units.py), in its order: layers (with the frozen base Linear of each LoRA
        # module first, where the plan separates them), then the towers' other weights. Checkpointing inside the
        # units was placed at setup, before this sharding (setup/checkpointing.py).
        # Read from the module's own __dict__: PEFT's wrappers forward unknown attributes to the module they wrap,
        # so getattr would find a wrapped unit's mark on its wrapper too.
        units = sorted((m for m in model.modules() if SHARD_UNIT in vars(m)), key=lambda m: vars(m)[SHARD_UNIT])
        if not units:
            raise LoraflowError("the model has no sharded units marked; build it with loraflow.setup.build_model, "
                                "which marks them for parallel.engine=fsdp2.")
        for unit in units:
            if plan.setup.fsdp_frozen_units_separate and vars(unit)[SHARD_UNIT][1]:  # a layer
                for base in _frozen_base_layers(unit):
                    fully_shard(base, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
            fully_shard(unit, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        self._units = [m for m in model.modules() if _is_fsdp(m)]

    def full_grads(self) -> dict[str, torch.Tensor | None]:
        out = {}
        for n, p in self.trainable:
            g = p.grad
            # A copy in every case: on one rank full_tensor() returns the local shard itself (nothing to gather),
            # which the step's clipping then scales in place.
            out[clean_name(n)] = None if g is None else (g.full_tensor() if _is_dtensor(g) else g).detach().clone()
        return out

    def local_tensor(self, p: torch.Tensor) -> torch.Tensor:
        return p.to_local().detach() if _is_dtensor(p) else p.detach()

    def settle(self) -> None:
        # The root unit never reshards after forward (backward needs it at once), so after an evaluation's forward
        # its parameters are the gathered ones: a fingerprint taken then compares a whole tensor with a shard.
        for unit in self._units:
            unit.reshard()

    def trainable_state(self) -> dict[str, torch.Tensor]:
        # Gathered (after a forward without backward, the root unit's) parameters are the compute copies, bf16 under
        # bf16-mixed: the values to save are the float32 shards.
        self.settle()
        out = {}
        for n, p in self.trainable:
            full = p.full_tensor() if _is_dtensor(p) else p.detach()  # collective: every rank takes part
            if self.rank == 0:
                out[clean_name(n)] = full.detach().to("cpu", copy=True)
        return out

    def full_state(self) -> dict[str, torch.Tensor]:
        self.settle()  # as trainable_state: the shards hold the trained values
        out = {}
        for k, v in self.module.state_dict().items():
            full = v.full_tensor() if _is_dtensor(v) else v
            if self.rank == 0:
                out[clean_name(k)] = full.detach().to("cpu", copy=True)
        return out

    @contextlib.contextmanager
    def gathered_for_generation(self) -> Iterator[torch.nn.Module]:
        """Every unit gathered once and kept whole for the rollout (not re-gathered at every decoded token)."""
        # FSDP2 initialises lazily at the root's first forward. A rollout can come before any forward (GRPO's
        # first step), and unsharding a layer unit first would make that unit a root of its own ("FSDP state
        # has already been lazily initialized"), so the root is initialised here first (private torch API).
        self.module._get_fsdp_state()._lazy_init()
        for unit in self._units:
            unit.set_reshard_after_forward(False, recurse=False)
            unit.unshard()
        try:
            yield self.module
        finally:
            for unit in self._units:
                unit.reshard()
            reshard = self.plan.config.parallel.fsdp_reshard_after_forward
            for unit in self._units:
                if unit is not self.module:  # the root never reshards after forward: backward needs it at once
                    unit.set_reshard_after_forward(reshard, recurse=False)

    # -- resumable state: the full optimizer state on rank 0, broadcast back on resume ------------------------
    def optimizer_state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return {"optimizer": get_optimizer_state_dict(self.module, self.optimizer, options=options),
                "scheduler": self.scheduler.state_dict()}

    def load_optimizer_state(self, state: dict[str, Any], checkpoint_dir) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_optimizer_state_dict(self.module, self.optimizer, state["optimizer"] if self.rank == 0 else {},
                                 options=options)
        self.scheduler.load_state_dict(state["scheduler"])


def _is_fsdp(module: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def _frozen_base_layers(layer: torch.nn.Module) -> list[torch.nn.Module]:
    """The frozen Linear inside each LoRA module of a decoder layer, each once: peft wraps a fused expert block
    once per adapted parameter (gate_up_proj, then down_proj around it), and every wrapper leads to the same base
    module, which fully_shard takes only once."""
    from peft.tuners.lora import LoraLayer
    from peft.tuners.lora.layer import ParamWrapper

    # A fused expert block adapted through its parameters stays in its layer's unit: peft adds the adapter's
    # delta to the parameter itself, which in a unit of its own is still a shard (a DTensor) when the layer's
    # forward reads it ("got mixed torch.Tensor and DTensor").
    bases = [m.get_base_layer() for m in layer.modules() if isinstance(m, LoraLayer) and not isinstance(m, ParamWrapper)]
    wrapped = {id(m.get_base_layer()) for m in layer.modules() if isinstance(m, ParamWrapper)}
    unique = list({id(b): b for b in bases if id(b) not in wrapped}.values())
    return [b for b in unique if not any(p.requires_grad for p in b.parameters())]
