"""The training loop shared by every stage and engine: data split over ranks, accumulation, guards, logging, eval,
checkpoints and the memory report.

A stage supplies its `StageHooks`: the loss (a pure function of the batch), how rows become a batch and what one
item of the loss's normalisation is, an optional `prepare` that turns the step's batches into what the update
trains on (rollouts, reference and reward scoring: no autograd) and its evaluation. The engine (engines/) owns
wrapping, backward, the optimizer step and gathering; nothing here depends on which engine runs.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from loraflow.checkpoints.store import (
    export_weights,
    latest_checkpoint,
    load_checkpoint,
    restore_rng,
    rng_state,
    save_checkpoint,
)
from loraflow.data import BatchOrder, DataSplit, collate, learned_tokens
from loraflow.data.batching import real_tokens
from loraflow.data.blank_images import images_in_step
from loraflow.loop.divergence import DivergenceWatch
from loraflow.engines import Engine, build_engine
from loraflow.loop.memory import MemoryReport
from loraflow.errors import Stopped
from loraflow.loop.guards import FrozenWeights, assert_train_mode, check_first_gradients
from loraflow.loop.metrics import MetricsWriter
from loraflow.loop.preemption import StopRequests
from loraflow.setup.precision import autocast
from loraflow.setup.saved_tensors import ActivationSaving
from loraflow.stagespec import stage_spec

log = logging.getLogger("loraflow")

LossFn = Callable[[torch.nn.Module, dict[str, torch.Tensor], int], Any]
EvalFn = Callable[[Engine], dict[str, Any]]
Batches = list[tuple[dict[str, torch.Tensor], bool]]


@dataclass
class StageHooks:
    loss_fn: LossFn
    """(model, batch, num_items) -> loss, or (loss, {name: sum}) where a sum is over this micro-batch's items
    (reported as its mean over the step's items) or a (sum, count) pair (reported as sum / count over the
    step)."""
    evaluate_fn: EvalFn | None = None
    collate: Callable[[list[Any], int], dict[str, torch.Tensor]] = field(default=collate)
    """(rows, pad id) -> one micro-batch: everything a row becomes in a batch, an image-text run's blank image
    included (data.blank_images.blank_image_collate)."""
    count: Callable[[dict[str, torch.Tensor]], int] = field(default=learned_tokens)
    """The items the loss is normalised by (learned tokens, pairs, completions) in one batch."""
    prepare: Callable[[Engine, Batches, int], Batches] | None = None
    """(engine, the step's (batch, real) pairs, step number) -> the batches the update trains on. Runs before the
    first forward of the step: rollouts, reference and reward scoring."""
    updates_per_prepare: int = 1
    """Optimizer steps on each prepared set of batches (several PPO/GRPO updates on one rollout). The data
    position advances once per set; checkpoints fall between sets (the config requires it)."""
    start: Callable[[Engine], None] | None = None
    """Once the engine exists, before the first evaluation (e.g. reference log-probs computed once)."""
    finish: Callable[[], None] | None = None
    """When fit ends, however it ends (e.g. a rollout engine's server stopped)."""


@dataclass
class Progress:
    step: int = 0
    """Optimizer steps done."""
    position: int = 0
    """Global micro-batches consumed (the data position)."""
    tokens: int = 0


def rank_slice(indices: list[int], rank: int, world: int) -> tuple[list[int], bool]:
    """This rank's share of a global micro-batch, and whether it is real. A short last batch of an epoch can
    leave a rank without rows; it then computes a zero-weighted loss on the first row, because sharded engines
    need every rank in every forward."""
    per = math.ceil(len(indices) / world)
    mine = indices[rank * per:(rank + 1) * per]
    return (mine, True) if mine else (indices[:1], False)


def agreed_latest_checkpoint(run_dir: Path) -> Path:
    """The checkpoint to resume from, chosen by rank 0 alone (verifying means hashing every file: once is enough,
    and a damaged one is moved aside by one process) and sent to the others; its error is raised on every rank."""
    import torch.distributed as dist

    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return latest_checkpoint(run_dir)
    box: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            box = [str(latest_checkpoint(run_dir))]
        except Exception as exc:  # every rank must leave the broadcast, then raise the same error
            box = [exc]
    dist.broadcast_object_list(box, src=0)
    if isinstance(box[0], Exception):
        raise box[0]
    return Path(box[0])


class Trainer:
    def __init__(self, plan, model: torch.nn.Module, tokenizer, train: DataSplit, hooks: StageHooks, run_dir: Path,
                 resume: bool = False):
        self.plan, self.tokenizer, self.train, self.hooks = plan, tokenizer, train, hooks
        self.loss_fn, self.evaluate_fn, self.run_dir = hooks.loss_fn, hooks.evaluate_fn, Path(run_dir)
        t = plan.config.train
        self.accum = t.gradient_accumulation_steps
        world = plan.setup.world_size
        self.order = BatchOrder(len(train.rows), t.micro_batch_size * world, t.seed)
        self.reuse = hooks.updates_per_prepare
        self.total_steps = t.max_steps or self.reuse * max(1, math.ceil(t.epochs * self.order.per_epoch /
                                                                        self.accum))
        self.progress = Progress()
        self.prepared: tuple[Batches, int] | None = None  # the batches the next updates reuse, and their item count
        self.uses_left = 0
        state, self.resumed_from = None, None
        if resume:  # weights go into the plain model, before any engine shards it
            from loraflow.errors import CheckpointError

            self.resumed_from = agreed_latest_checkpoint(self.run_dir)
            state = load_checkpoint(self.resumed_from, model)
            if state.get("world_size", 1) != world:
                raise CheckpointError(f"{self.resumed_from} was written by {state.get('world_size', 1)} processes; "
                                      f"resume it with the same number (this launch has {world}): the data order "
                                      "and any sharded optimizer state depend on it.")
            if state["progress"]["step"] % self.reuse:
                raise CheckpointError(f"{self.resumed_from} was written after step {state['progress']['step']}, "
                                      f"inside a rollout's {self.reuse} updates (rl.updates_per_rollout); resume "
                                      "from a checkpoint whose step is a multiple of it.")
        self.engine = build_engine(plan, model, self.total_steps)
        self.main = self.engine.rank == 0
        if state is not None:
            self.engine.load_optimizer_state(state, self.resumed_from)
            self.engine.sync_learning_rate()  # --extend: the longer schedule's rate from the first resumed step on
            self.progress = Progress(**state["progress"])
            rngs = state["rng"] if isinstance(state["rng"], list) else [state["rng"]]
            restore_rng(rngs[self.engine.rank] if self.engine.rank < len(rngs) else rngs[0])
        self.pad_id = tokenizer.pad_token_id
        unit = stage_spec(plan.config.stage).unit.format(**vars(plan.config.rl))
        log.info("training: %d optimizer steps of %d x %d %s x %d processes", self.total_steps, self.accum,
                 t.micro_batch_size, unit, world)
        self.metrics = MetricsWriter(self.run_dir, plan.config.output.tensorboard, enabled=self.main,
                                     wandb_project=plan.config.output.wandb)
        if state is not None:  # the steps after the checkpoint are replayed: their rows must not appear twice
            self.metrics.truncate_after(self.progress.step)
        self.memory: MemoryReport | None = None
        self.activations = ActivationSaving(plan, self.engine.module)  # offload; counted on the first forward
        self.watch = DivergenceWatch(plan)

    @property
    def model(self) -> torch.nn.Module:
        """The unwrapped model (names, saving, generation)."""
        return self.engine.module

    # -- one optimizer step -------------------------------------------------------------------------------
    def next_batches(self) -> tuple[Batches, int]:
        """This step's (batch, real) micro-batches and the global item count the loss is normalised by: a fresh
        draw from the data (prepared by the stage), or the previous one again while it has updates left."""
        if self.uses_left == 0:
            self.prepared, self.uses_left = self.draw(), self.reuse
        self.uses_left -= 1
        return self.prepared

    def draw(self) -> tuple[Batches, int]:
        e, h = self.engine, self.hooks
        shares = [rank_slice(self.order.indices(self.progress.position + k), e.rank, e.world_size)
                  for k in range(self.accum)]
        batches = []
        for rows, real in shares:
            batch = h.collate([self.train.rows[i] for i in rows], self.pad_id)
            batch["index"] = torch.tensor(rows)  # the rows' positions in the data (reference log-probs, sampling)
            batches.append(({key: v.to(self.plan.device) for key, v in batch.items()}, real))
        self.progress.position += self.accum
        if h.prepare is not None:
            batches = h.prepare(e, batches, self.progress.step)
        local_items = sum(h.count(b) for b, real in batches if real)
        (num_items,) = e.all_sum([local_items])  # normalise by the whole global step (see losses/sft.py)
        return batches, num_items

    def accumulate(self) -> dict[str, float]:
        """Forward and backward over one optimizer step's micro-batches; gradients are left to the engine."""
        e = self.engine
        batches, num_items = self.next_batches()
        total_loss, tokens, sums = 0.0, 0, {}
        for k, (batch, real) in enumerate(batches):
            tokens += real_tokens(batch) if real else 0
            with e.micro_step(last=k == self.accum - 1):
                with autocast(self.plan.device, self.plan.autocast_dtype), self.activations.forward():
                    out = self.loss_fn(e.model, batch, int(num_items))
                loss, stats = out if isinstance(out, tuple) else (out, {})
                weight = e.loss_scale if real else 0.0  # engines average over ranks; see engines/__init__.py
                assert_train_mode(e.module)
                e.backward(loss * weight)
            total_loss += float(loss.detach()) if real else 0.0
            for name, value in stats.items():  # a sum over the loss's items, or (sum, count of what it sums)
                value, count = value if isinstance(value, tuple) else (value, None)
                was = sums.get(name, (0.0, 0.0 if count is not None else None))
                sums[name] = (was[0] + (float(value) if real else 0.0),
                              None if count is None else was[1] + (float(count) if real else 0.0))
        names = sorted(sums)
        flat = [x for n in names for x in (sums[n][0], sums[n][1] or 0.0)]
        total_loss, tokens, *values = e.all_sum([total_loss, tokens, *flat])
        means = {n: values[2 * i] / max(values[2 * i + 1] if sums[n][1] is not None else num_items, 1e-12)
                 for i, n in enumerate(names)}
        return {"loss": total_loss, "tokens": int(tokens), **means}

    def apply_update(self) -> float:
        """Clip, step the optimizer and the schedule, clear gradients; returns the pre-clip gradient norm."""
        return self.engine.step()

    def optimizer_step(self, guard: FrozenWeights | None) -> dict[str, float]:
        """One optimizer step. With a guard (the first step of a process), gradients are checked after the
        backward, frozen weights after the update, and the memory report is taken."""
        stats = self.accumulate()
        step = self.progress.step + 1
        self.watch.check_loss(step, stats["loss"])  # the same reduced number on every rank: all stop together
        if guard is not None:
            images = images_in_step(self.plan.towers, self.prepared[0], self.engine.all_sum)
            check_first_gradients(self.model, self.plan, self.engine.full_grads(), images)
            self.memory = MemoryReport.after_backward(self.engine)
            self.memory.activations = self.activations.counted
        stats["grad_norm"] = self.apply_update()
        self.watch.check_gradients(step, stats["grad_norm"], applied=not self.engine.norm_before_update)
        if guard is not None:
            guard.assert_unchanged(self.model)
            self.memory.after_step(self.engine)
            self._report_memory()
        self.progress.step += 1
        self.progress.tokens += stats["tokens"]
        return stats

    def _report_memory(self) -> None:
        report = self.memory.gathered(self.engine)
        if self.main:
            log.info("%s", report.render())
            self.metrics.write("memory", self.progress.step, report.to_metrics())

    # -- state ----------------------------------------------------------------------------------------------
    def save(self) -> Path:
        e = self.engine
        state = {"progress": vars(self.progress).copy(), "rng": e.gather_objects(rng_state()),
                 "total_steps": self.total_steps, "world_size": e.world_size, **e.optimizer_state()}
        return save_checkpoint(self.run_dir, self.progress.step, self.model, self._weights(), state,
                               self.plan.config.output.keep_checkpoints, e)

    def _weights(self) -> dict[str, torch.Tensor]:
        """What a checkpoint and the export hold (plan.saves): every weight, or the trainable ones (collective)."""
        return self.engine.full_state() if self.plan.saves == "model" else self.engine.trainable_state()

    # -- the loop -------------------------------------------------------------------------------------------
    def evaluate(self, label: str) -> dict[str, Any]:
        if self.evaluate_fn is None:
            return {}
        values = self.evaluate_fn(self.engine)
        self.metrics.write("eval", self.progress.step, values)
        shown = ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in values.items())
        if self.main:
            log.info("eval (%s, step %d): %s", label, self.progress.step, shown)
        return values

    def fit(self) -> dict[str, Any]:
        try:
            with StopRequests() as stops:
                return self._fit(stops)
        finally:
            if self.hooks.finish is not None:
                self.hooks.finish()

    def _fit(self, stops: StopRequests) -> dict[str, Any]:
        import sys

        from tqdm.auto import tqdm

        out = self.plan.config.output
        if self.hooks.start is not None:
            self.hooks.start(self.engine)
        before = None
        if self.resumed_from is not None:
            if self.main:
                log.info("resumed from %s at step %d (micro-batch %d)", self.resumed_from, self.progress.step,
                         self.progress.position)
        else:
            before = self.evaluate("before training")
        self.engine.settle()  # the evaluation may have left FSDP2's root unit gathered
        guard = FrozenWeights(self.model, self.engine.local_tensor)  # the first step this process runs is checked
        # A bar only on a terminal: written to a file its redraws pile onto one line, and the step lines logged
        # every output.log_every_steps say the same in plain text. mininterval + refresh=False: at most two
        # redraws a second.
        bar = tqdm(total=self.total_steps, initial=self.progress.step, desc=f"{self.plan.config.stage}",
                   disable=not (out.progress_bar and self.main and sys.stderr.isatty()), dynamic_ncols=True,
                   mininterval=0.5)
        window, extras, start = [], {}, time.perf_counter()
        tokens_at_start = self.progress.tokens
        while self.progress.step < self.total_steps:
            lr = self.engine.lr()  # the rate this step applies: the schedule moves on inside the step
            stats = self.optimizer_step(guard)
            guard = None
            window.append(stats["loss"])
            for name, value in stats.items():
                if name not in ("loss", "tokens", "grad_norm"):
                    extras.setdefault(name, []).append(value)
            elapsed = time.perf_counter() - start
            tps = (self.progress.tokens - tokens_at_start) / max(elapsed, 1e-9)
            bar.set_postfix(loss=f"{stats['loss']:.4f}", tok_s=f"{tps:,.0f}", refresh=False)
            bar.update(1)
            step = self.progress.step
            if step % out.log_every_steps == 0 or step == self.total_steps:
                row = {"loss": sum(window) / len(window), "grad_norm": stats["grad_norm"], "lr": lr,
                       "tokens_per_s": tps, "tokens": self.progress.tokens,
                       **{n: sum(v) / len(v) for n, v in extras.items()}}
                self.metrics.write("train", step, row)
                if self.main:
                    more = "".join(f", {n} {v:.4g}" for n, v in row.items() if n not in
                                   ("loss", "grad_norm", "lr", "tokens_per_s", "tokens"))
                    log.info("step %d/%d: loss %.4f, grad_norm %.4g, lr %.3g, %s tokens/s%s", step,
                             self.total_steps, row["loss"], row["grad_norm"], row["lr"], f"{tps:,.0f}", more)
                window, extras = [], {}
            if self.plan.config.eval.every_steps and step % self.plan.config.eval.every_steps == 0 \
                    and step != self.total_steps:
                self.evaluate("during training")
            stop = self._agreed_stop(stops)  # every step, so the ranks agree; acted on between rollouts only,
            # where a checkpoint can be resumed (rl.updates_per_rollout)
            if stop is not None and step % self.reuse == 0 and step != self.total_steps:
                bar.close()
                self._stop(stop)
            if out.save_every_steps and step % out.save_every_steps == 0 and step != self.total_steps:
                self.save()
        bar.close()
        wall = time.perf_counter() - start
        self.save()
        weights = self.run_dir / self.plan.saves
        state = self._weights()
        if self.main:
            export_weights(self.model, weights, state, self.train.processor or self.tokenizer)
        self.engine.barrier()
        after = self.evaluate("after training")
        self.metrics.close()
        return {"before": before, "after": after, "steps": self.progress.step, "train_seconds": wall,
                "tokens": self.progress.tokens, "weights": str(weights),
                "memory": self.memory.to_metrics() if self.memory and self.main else None}

    def _agreed_stop(self, stops: StopRequests) -> int | None:
        """The signal that asked any rank to stop, the same on every rank (one small collective per step)."""
        import signal as sig

        from loraflow.loop.preemption import SIGNALS

        votes = self.engine.all_sum([1.0 if stops.signum == s else 0.0 for s in SIGNALS])
        asked = [s for s, v in zip(SIGNALS, votes) if v > 0]
        # SIGTERM first: it is the scheduler's, and the kill that follows it does not wait.
        return None if not asked else sig.SIGTERM if sig.SIGTERM in asked else asked[0]

    def _stop(self, signum: int) -> None:
        import shlex
        import signal as sig

        name = sig.Signals(signum).name
        if self.main:
            log.warning("%s received: finishing step %d and writing a checkpoint", name, self.progress.step)
        path = self.save()
        self.metrics.close()
        stage = self.plan.config.stage
        message = (f"stopped by {name} after step {self.progress.step} of {self.total_steps}; checkpoint written to "
                   f"{path}. Resume with: loraflow train {stage} --resume {shlex.quote(str(self.run_dir))}")
        if self.main:
            log.warning("%s", message)
        raise Stopped(message, signum)
