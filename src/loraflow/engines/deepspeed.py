"""DeepSpeed ZeRO stage 0-3 with optional CPU offload, driven by loraflow's own AdamW and schedule.

The registry's remedies for ZeRO-3 are carried out here, each only when the plan says so:
- adapter_save_gather (zero3-empty-adapter-save): saving gathers only the trainable partitions;
- generation_gather (zero3-generation-gather): one gather of every weight per rollout, with DeepSpeed's per-module
  fetch/release hooks lifted for its duration;
- dora_weight_gather (dora-sharded-weight): DoRA's weight norm reads the gathered base weight.
The plan has already chosen the checkpoint mode for the installed DeepSpeed (zero3-frozen-recompute).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from typing import Any, Iterator

import torch

from loraflow.engines.base import Engine, clean_name, make_optimizer, make_scheduler


def import_deepspeed(device: str):
    """DeepSpeed picks its accelerator at import; on a machine without CUDA it must be told (DS_ACCELERATOR=cpu).
    DeepSpeed 0.15's CPU accelerator also reads LOCAL_SIZE, which torchrun calls LOCAL_WORLD_SIZE."""
    if device == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        os.environ.setdefault("LOCAL_SIZE", os.environ.get("LOCAL_WORLD_SIZE", "1"))
    try:
        import deepspeed
    except ImportError:  # the plan refuses this first (plan/packages.py); a harness with a hand-made environment
        from loraflow.environment import install_line
        from loraflow.errors import ConfigError

        raise ConfigError([f"parallel.engine=deepspeed needs deepspeed, which is not installed here: "
                           f"{install_line('deepspeed')}, or set parallel.engine to ddp or fsdp2."]) from None
    import torch._dynamo  # noqa: F401  zero.Init on torch 2.13 + deepspeed 0.19 fails on dynamo's lazy import

    skip_shm_build(deepspeed)
    return deepspeed


def skip_shm_build(deepspeed) -> None:
    """The CPU accelerator builds a shared-memory all-reduce op with g++ when DeepSpeed's communication backend
    starts (about 40 s the first time). Only inference_all_reduce uses it; ZeRO training communicates through
    torch.distributed, so mark it unavailable and skip the build."""
    compatible = getattr(deepspeed.ops, "__compatible_ops__", None)
    if isinstance(compatible, dict):
        compatible["deepspeed_shm_comm"] = False


class DeepSpeedEngine(Engine):
    name = "deepspeed"

    def __init__(self, plan, model: torch.nn.Module, total_steps: int):
        super().__init__(plan, model, total_steps)
        from loraflow.engines.deepspeed_config import build_config

        deepspeed = import_deepspeed(plan.device)
        self.settings = plan.deepspeed  # resolved once by the plan
        self.ds_config = build_config(plan.config, self.settings, self.world_size)
        self.zero3 = self.settings.stage == 3
        if plan.setup.dora_weight_gather and self.zero3:
            dora_gather_base_weight(model)
        optimizer = make_optimizer([p for _, p in self.trainable], self.train_cfg)
        self.model, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, config=self.ds_config, dist_init_required=False,
            lr_scheduler=lambda opt: make_scheduler(opt, self.train_cfg, total_steps))
        self.module = self.model.module
        self._last = True

    @contextlib.contextmanager
    def micro_step(self, last: bool) -> Iterator[None]:
        self._last = last
        yield

    def backward(self, loss: torch.Tensor) -> None:
        # The loss is already normalised by the whole step's tokens: DeepSpeed must not divide it by the
        # accumulation steps again.
        self.model.backward(loss, scale_wrt_gas=False)
        if not self._last:
            self.model.step()  # only advances DeepSpeed's micro-step count; it updates at the boundary

    def step(self) -> float:
        own = None
        if self.settings.stage == 0:  # DeepSpeed reports no norm for a client optimizer without ZeRO: measure it
            grads = [p.grad.detach().float().norm() for _, p in self.trainable if p.grad is not None]
            own = float(torch.stack(grads).norm()) if grads else 0.0
        if own is not None and not math.isfinite(own):
            return own  # not applied: the run stops on it (loop/divergence.py), so DeepSpeed's counters do not matter
        self.model.step()  # clips (gradient_clipping), steps optimizer and schedule, clears gradients
        norm = self.model.get_global_grad_norm() if own is None else own
        return float(norm) if norm is not None else 0.0

    @property
    def norm_before_update(self) -> bool:  # ZeRO >= 1 partitions the gradients: the norm comes out of the step
        return self.settings.stage == 0

    def label(self) -> str:
        s = self.settings
        offload = [k for k, on in (("optimizer", s.offload_optimizer), ("params", s.offload_params)) if on]
        return f"deepspeed ZeRO-{s.stage}" + (f" offload {'+'.join(offload)}" if offload else "")

    def lr(self) -> float:
        return self.scheduler.get_last_lr()[0]

    def full_grads(self) -> dict[str, torch.Tensor | None]:
        from deepspeed.utils import safe_get_full_grad

        out = {}
        for n, p in self.trainable:
            g = safe_get_full_grad(p)  # under ZeRO-0 this is p.grad itself, which the step clips in place: copy
            out[clean_name(n)] = None if g is None else g.detach().clone()
        return out

    def local_tensor(self, p: torch.Tensor) -> torch.Tensor:
        ds_tensor = getattr(p, "ds_tensor", None)
        return ds_tensor.detach() if ds_tensor is not None else p.detach()

    @contextlib.contextmanager
    def _gathered(self, params: list[torch.nn.Parameter]) -> Iterator[None]:
        if not self.zero3:
            yield
            return
        import deepspeed

        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            yield

    def trainable_state(self) -> dict[str, torch.Tensor]:
        # zero3-empty-adapter-save: only the trainable partitions are gathered, never the frozen base.
        with self._gathered([p for _, p in self.trainable]):
            return super().trainable_state()

    def full_state(self) -> dict[str, torch.Tensor]:
        """Full fine-tuning's whole model on rank 0, gathered one parameter at a time (never the whole model at
        once on every rank, which is what ZeRO-3 exists to avoid)."""
        if not self.zero3:
            return super().full_state()
        params = dict(self.module.named_parameters(remove_duplicate=False))
        copies: dict[int, torch.Tensor] = {}  # tied weights are gathered once
        out = {}
        for key, value in self.module.state_dict(keep_vars=True).items():
            p = params.get(key)
            if p is None:
                tensor = value.detach().to("cpu", copy=True) if self.rank == 0 else None  # a buffer: whole already
            elif id(p) in copies:
                tensor = copies[id(p)]
            else:
                with self._gathered([p]):
                    tensor = p.detach().to("cpu", copy=True) if self.rank == 0 else None
                copies[id(p)] = tensor
            if self.rank == 0:
                out[clean_name(key)] = tensor
        return out

    @contextlib.contextmanager
    def gathered_for_generation(self) -> Iterator[torch.nn.Module]:
        if not (self.zero3 and self.plan.setup.generation_gather):
            yield self.module
            return
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(self.module.parameters()), modifier_rank=None):
            lift_zero3_hooks(self.model)
            try:
                yield self.module
            finally:
                restore_zero3_hooks(self.model)

    # -- resumable state: DeepSpeed's own partitioned checkpoint, inside loraflow's atomic directory ----------
    def optimizer_state(self) -> dict[str, Any]:
        return {}

    def save_engine_files(self, directory) -> None:
        self.model.save_checkpoint(str(directory / "deepspeed"), tag="state", save_latest=False,
                                   exclude_frozen_parameters=True)

    def load_optimizer_state(self, state: dict[str, Any], checkpoint_dir) -> None:
        path, _ = self.model.load_checkpoint(str(checkpoint_dir / "deepspeed"), tag="state",
                                             load_module_strict=False, load_optimizer_states=True,
                                             load_lr_scheduler_states=True)
        if path is None:
            from loraflow.errors import CheckpointError

            raise CheckpointError(f"{checkpoint_dir}/deepspeed holds no DeepSpeed state for this run's ranks.")

    # -- memory ---------------------------------------------------------------------------------------------
    def optimizer_tensors(self) -> list[torch.Tensor]:
        """Adam's moments plus ZeRO's fp32 master partitions (the optimizer steps those, not the weights)."""
        opt = self.optimizer
        out = [t for s in getattr(opt, "optimizer", opt).state.values() for t in s.values() if torch.is_tensor(t)]
        for attr in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat"):
            out += [t for t in getattr(opt, attr, []) or [] if torch.is_tensor(t)]
        return out

    def gradient_tensors(self) -> list[torch.Tensor]:
        opt = self.optimizer
        out: list[torch.Tensor] = []
        for attr in ("averaged_gradients", "fp32_partitioned_groups_flat", "single_partition_of_fp32_groups"):
            holder = getattr(opt, attr, None)
            values = holder.values() if isinstance(holder, dict) else (holder or [])
            for v in values:
                items = v if isinstance(v, (list, tuple)) else [v]
                out += [t.grad if attr != "averaged_gradients" else t for t in items
                        if torch.is_tensor(t) and (attr == "averaged_gradients" or t.grad is not None)]
        out += [p.grad for _, p in self.trainable if p.grad is not None]
        return out


def lift_zero3_hooks(engine) -> None:
    """What TRL's unwrap_model_for_generation does inside GatheredParameters: take DeepSpeed's per-module fetch and
    release hooks off, so the gathered weights stay whole for the rollout instead of being released after each
    module and fetched again at the next token."""
    offload = engine.optimizer.parameter_offload
    for p in offload.module.parameters():
        p.ds_active_sub_modules.clear()
    for hook in offload.forward_hooks + offload.backward_hooks:
        hook.remove()
    offload.forward_hooks, offload.backward_hooks = [], []


def restore_zero3_hooks(engine) -> None:
    offload = engine.optimizer.parameter_offload
    register = getattr(offload, "_register_deepspeed_module", None) or offload._register_hooks_recursively
    register(offload.module)


def dora_gather_base_weight(model) -> None:
    """dora_weight_gather, in forward: gather what DoRA reads around each DoRA module's forward, and nothing else.

    peft's DoraLinearLayer reads `base_layer.weight` for ||W + s*BA|| after the base layer's own forward (when
    ZeRO-3 has released it to an empty partition), and `lora_A.weight.shape[1]` before lora_A's forward (to build
    the identity it pushes through lora_A and lora_B). Inside the engine's forward ZeRO-3's external-parameter
    discovery fetches such reads on access (on 0.15.3 only through `engine(...)`); a forward of the unwrapped
    module on 0.15.3, e.g. a rollout before any step, reads shape [0]: `IndexError: tuple index out of range`.
    GatheredParameters over just those two tensors (read-only, re-partitioned on exit), only when they are
    released, is the smallest change that makes the norm correct; gathering whole layers would give up the
    sharding the user asked for. A quantized (QDoRA) base weight replaced during the forward is restored.
    """
    import deepspeed
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
    from peft.tuners.lora import LoraLayer

    def gathered(forward, *args, **kwargs):
        base = kwargs["base_layer"]
        managed = base.weight
        lora_a = kwargs["lora_A"]  # a Linear; for an Embedding's DoRA, its A matrix itself (a transposed view)
        read = [managed, lora_a.weight] if hasattr(lora_a, "weight") else [managed]
        released = [p for p in read if getattr(p, "ds_status", None) == ZeroParamStatus.NOT_AVAILABLE]
        with deepspeed.zero.GatheredParameters(released, modifier_rank=None, enabled=bool(released)):
            try:
                return forward(*args, **kwargs)
            finally:
                # On the CPU, peft's dequantize_module_weight (peft 0.21.2, utils/integrations.py) reassigns a 4-bit
                # base weight with `module.weight = module.weight.to(device)`, which for a Params4bit builds a new
                # parameter that ZeRO-3 never converted ("'Params4bit' object has no attribute 'ds_status'" at the
                # next fetch). The values are the same: put the parameter ZeRO-3 manages back, also when a
                # non-reentrant recompute stops early inside this forward (torch ends it with an exception).
                if base.weight is not managed:
                    base.weight = managed

    for module in model.modules():
        if isinstance(module, LoraLayer) and any(module.use_dora.values()):
            for dora in module.lora_magnitude_vector.values():
                dora.forward = functools.partial(gathered, dora.forward)
