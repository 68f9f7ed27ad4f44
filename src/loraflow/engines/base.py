"""The Engine interface and the single-process engine (the reference every other engine must reproduce)."""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist

WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_fsdp_wrapped_module.")


def clean_name(name: str) -> str:
    """A parameter's name without wrapper prefixes: the name the single-process model gives it."""
    for part in WRAPPER_PREFIXES:
        name = name.replace(part, "")
    return name


def lr_lambda(warmup: int, total: int, kind: str) -> Callable[[int], float]:
    """Multiplier of the peak learning rate at optimizer step `s` (0-based): linear warmup, then the schedule
    decays to 0 at the last step."""

    def f(s: int) -> float:
        if s < warmup:
            return (s + 1) / warmup
        progress = (s - warmup) / max(1, total - warmup)
        if kind == "cosine":
            return 0.5 * (1 + math.cos(math.pi * progress))
        if kind == "linear":
            return max(0.0, 1 - progress)
        return 1.0

    return f


def make_optimizer(params: list[torch.nn.Parameter], train) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters only (frozen weights get no optimizer state at all)."""
    return torch.optim.AdamW(params, lr=train.learning_rate, betas=tuple(train.adam_betas),
                             weight_decay=train.weight_decay)


def make_scheduler(optimizer: torch.optim.Optimizer, train, total_steps: int):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(train.warmup_steps, total_steps, train.schedule))


class Engine:
    """One rank's view of training. Subclasses override what their engine does differently."""

    name = "single"

    def __init__(self, plan, model: torch.nn.Module, total_steps: int):
        self.plan = plan
        self.module = model
        """The unwrapped (PEFT or transformers) model: names, saving, generation."""
        self.model: Any = model
        """What the loss function calls: the engine's wrapper."""
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world_size = dist.get_world_size() if dist.is_initialized() else 1
        self.train_cfg = plan.config.train
        self.total_steps = total_steps

    # -- the step -----------------------------------------------------------------------------------------
    @property
    def trainable(self) -> list[tuple[str, torch.nn.Parameter]]:
        return [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]

    @contextlib.contextmanager
    def micro_step(self, last: bool) -> Iterator[None]:
        """Encloses one micro-batch's forward and backward; `last` marks the optimizer step's final one."""
        yield

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    norm_before_update = True
    """Whether `step` measures the gradient norm before applying the update, so that a non-finite one is never
    applied (see loop/divergence.py). DeepSpeed with ZeRO >= 1 measures it only while stepping."""

    def step(self) -> float:
        """Clip, optimizer step, schedule step, clear gradients; returns the pre-clip global gradient norm. A
        non-finite norm skips the update (the run stops on it): Adam would turn it into NaN weights."""
        max_norm = self.train_cfg.max_grad_norm or float("inf")
        for _, p in self.trainable:
            if p.grad is None:
                # A tower that did not run this step (no image in any micro-batch) steps with a zero gradient, as
                # it does where a blank image ran it (multi-rank runs, and ZeRO, which always fills one): Adam's
                # momentum then moves it alike on every engine, instead of skipping it in one process only.
                p.grad = torch.zeros_like(p)
        norm = torch.nn.utils.clip_grad_norm_([p for _, p in self.trainable], max_norm)
        norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        if math.isfinite(norm):
            self.optimizer.step()
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def label(self) -> str:
        """The engine as the memory report names it."""
        return self.name

    def lr(self) -> float:
        return self.scheduler.get_last_lr()[0]

    @property
    def loss_scale(self) -> float:
        """Every engine averages gradients over ranks; the loss is scaled up so the average is the global sum."""
        return float(self.world_size)

    def all_sum(self, values: list[float]) -> list[float]:
        """Sum numbers over ranks (collective)."""
        if self.world_size == 1:
            return values
        # nccl reduces only tensors on this rank's GPU; gloo takes them on the CPU.
        device = f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"
        t = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(t)
        return t.tolist()

    def gather_objects(self, obj: Any) -> list[Any]:
        """One picklable object per rank, in rank order (collective)."""
        if self.world_size == 1:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    # -- gathering ------------------------------------------------------------------------------------------
    def full_grads(self) -> dict[str, torch.Tensor | None]:
        """Every trainable parameter's full, rank-averaged gradient by its single-process name (collective)."""
        return {clean_name(n): None if p.grad is None else p.grad.detach().clone() for n, p in self.trainable}

    def local_tensor(self, p: torch.nn.Parameter) -> torch.Tensor:
        """The part of a parameter this rank stores (all of it unless sharded)."""
        return p.detach()

    def settle(self) -> None:
        """Put sharded weights back in their resting layout, so that local_tensor reads each rank's shard (FSDP2's
        root unit stays gathered after a forward without backward, such as an evaluation)."""

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """Full copies of the trainable parameters on rank 0 (collective; other ranks get an empty dict)."""
        return {clean_name(n): p.detach().to("cpu", copy=True) for n, p in self.trainable} if self.rank == 0 else {}

    def full_state(self) -> dict[str, torch.Tensor]:
        """The whole model's state dict on rank 0 (collective): what full fine-tuning saves."""
        if self.rank != 0:
            return {}
        return {clean_name(k): v.detach().to("cpu", copy=True) for k, v in self.module.state_dict().items()}

    @contextlib.contextmanager
    def gathered_for_generation(self) -> Iterator[torch.nn.Module]:
        """The model with whole weights for a rollout or exact-match evaluation (collective)."""
        yield self.module

    # -- resumable state ------------------------------------------------------------------------------------
    def optimizer_state(self) -> dict[str, Any]:
        """Optimizer and schedule state to put in trainer_state.pt (collective; only rank 0's is written)."""
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_optimizer_state(self, state: dict[str, Any], checkpoint_dir) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])

    def sync_learning_rate(self) -> None:
        """After loading a checkpoint: the learning rate of the next step from this run's schedule at the restored
        step. The optimizer state restored the rate the checkpointed run had set for that step; a run resumed with
        --extend has a longer schedule, whose rate there differs (identical otherwise)."""
        s = self.scheduler
        for group, base, factor in zip(s.optimizer.param_groups, s.base_lrs, s.lr_lambdas):
            group["lr"] = base * factor(s.last_epoch)
        s._last_lr = [group["lr"] for group in s.optimizer.param_groups]  # what get_last_lr() reports (torch's own)

    def save_engine_files(self, directory) -> None:
        """Engine-specific files inside a checkpoint being written (collective); none by default."""

    # -- memory ---------------------------------------------------------------------------------------------
    def optimizer_tensors(self) -> list[torch.Tensor]:
        """Every tensor the optimizer keeps (states and any master copies) on this rank."""
        return [t for s in self.optimizer.state.values() for t in s.values() if torch.is_tensor(t)]

    def gradient_tensors(self) -> list[torch.Tensor]:
        """The gradient storage this rank holds (after a backward, before the step clears it)."""
        return [self.local_tensor(p.grad) for _, p in self.trainable if p.grad is not None]


class SingleEngine(Engine):
    name = "single"

    def __init__(self, plan, model: torch.nn.Module, total_steps: int):
        super().__init__(plan, model, total_steps)
        self.optimizer = make_optimizer([p for _, p in self.trainable], self.train_cfg)
        self.scheduler = make_scheduler(self.optimizer, self.train_cfg, total_steps)
