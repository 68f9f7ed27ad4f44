"""The training loop shared by every stage: accumulation, schedule, clipping, guards, logging, eval, checkpoints.

A stage supplies two functions: `loss_fn(model, batch, num_items) -> loss` (a pure function of the batch) and
`evaluate_fn(model) -> metrics`. Everything else lives here once.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from tqdm.auto import tqdm

from loraflow.checkpoint import (export_weights, latest_checkpoint, load_checkpoint, restore_rng, rng_state,
                                 save_checkpoint)
from loraflow.data import BatchOrder, DataSplit, collate, learned_tokens
from loraflow.guards import FrozenWeights, assert_train_mode, check_first_gradients
from loraflow.metrics import MetricsWriter
from loraflow.setup.precision import autocast

log = logging.getLogger("loraflow")

LossFn = Callable[[torch.nn.Module, dict[str, torch.Tensor], int], torch.Tensor]
EvalFn = Callable[[torch.nn.Module], dict[str, Any]]


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


@dataclass
class Progress:
    step: int = 0
    """Optimizer steps done."""
    position: int = 0
    """Micro-batches consumed (the data position)."""
    tokens: int = 0


class Trainer:
    def __init__(self, plan, model: torch.nn.Module, tokenizer, train: DataSplit, loss_fn: LossFn,
                 evaluate_fn: EvalFn | None, run_dir: Path):
        self.plan, self.model, self.tokenizer, self.train = plan, model, tokenizer, train
        self.loss_fn, self.evaluate_fn, self.run_dir = loss_fn, evaluate_fn, Path(run_dir)
        t = plan.config.train
        self.accum = t.gradient_accumulation_steps
        self.order = BatchOrder(len(train.rows), t.micro_batch_size, t.seed)
        self.total_steps = t.max_steps or max(1, math.ceil(t.epochs * self.order.per_epoch / self.accum))
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=t.learning_rate, betas=tuple(t.adam_betas),
                                           weight_decay=t.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(t.warmup_steps, self.total_steps, t.schedule))
        self.progress = Progress()
        self.pad_id = tokenizer.pad_token_id
        self.metrics = MetricsWriter(self.run_dir, plan.config.output.tensorboard)

    # -- one optimizer step -------------------------------------------------------------------------------
    def accumulate(self) -> dict[str, float]:
        """Forward and backward over one optimizer step's micro-batches; gradients are left in .grad."""
        batches = [collate([self.train.rows[i] for i in self.order.indices(self.progress.position + k)],
                           self.pad_id) for k in range(self.accum)]
        self.progress.position += self.accum
        num_items = sum(learned_tokens(b) for b in batches)  # normalise by the whole step (see losses/sft.py)
        total_loss, tokens = 0.0, 0
        for batch in batches:
            batch = {k: v.to(self.plan.device) for k, v in batch.items()}
            # Real tokens: the attention mask (pad may equal eos), or every position of a packed row.
            mask = batch.get("attention_mask")
            tokens += int(mask.sum()) if mask is not None else batch["input_ids"].numel()
            with autocast(self.plan.device, self.plan.autocast_dtype):
                loss = self.loss_fn(self.model, batch, num_items)
            assert_train_mode(self.model)
            loss.backward()
            total_loss += float(loss.detach())
        return {"loss": total_loss, "tokens": tokens}

    def apply_update(self) -> float:
        """Clip, step the optimizer and the schedule, clear gradients; returns the pre-clip gradient norm."""
        max_norm = self.plan.config.train.max_grad_norm or float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, max_norm))
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def optimizer_step(self, guard: FrozenWeights | None) -> dict[str, float]:
        """One optimizer step. With a guard (the first step of a process), gradients are checked after the
        backward and frozen weights after the update."""
        stats = self.accumulate()
        if guard is not None:
            check_first_gradients(self.model, self.plan)
        stats["grad_norm"] = self.apply_update()
        if guard is not None:
            guard.assert_unchanged(self.model)
        self.progress.step += 1
        self.progress.tokens += stats["tokens"]
        return stats

    # -- state ----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "progress": vars(self.progress).copy(), "rng": rng_state(), "total_steps": self.total_steps}

    def save(self) -> Path:
        return save_checkpoint(self.run_dir, self.progress.step, self.model, self.state_dict(),
                               self.plan.config.output.keep_checkpoints)

    def resume(self) -> Path:
        path = latest_checkpoint(self.run_dir)
        state = load_checkpoint(path, self.model)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.progress = Progress(**state["progress"])
        restore_rng(state["rng"])
        return path

    # -- the loop -------------------------------------------------------------------------------------------
    def evaluate(self, label: str) -> dict[str, Any]:
        if self.evaluate_fn is None:
            return {}
        values = self.evaluate_fn(self.model)
        self.metrics.write("eval", self.progress.step, values)
        shown = ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in values.items())
        log.info("eval (%s, step %d): %s", label, self.progress.step, shown)
        return values

    def fit(self, resume: bool = False) -> dict[str, Any]:
        out = self.plan.config.output
        before = None
        if resume:
            path = self.resume()
            log.info("resumed from %s at step %d (micro-batch %d)", path, self.progress.step, self.progress.position)
        else:
            before = self.evaluate("before training")
        guard = FrozenWeights(self.model)  # the first step this process runs is checked
        # mininterval + refresh=False below: at most two redraws a second, so logs of non-terminal runs stay short.
        bar = tqdm(total=self.total_steps, initial=self.progress.step, disable=not out.progress_bar,
                   desc=f"{self.plan.config.stage}", dynamic_ncols=True, mininterval=0.5)
        window, start = [], time.perf_counter()
        tokens_at_start = self.progress.tokens
        while self.progress.step < self.total_steps:
            stats = self.optimizer_step(guard)
            guard = None
            window.append(stats["loss"])
            elapsed = time.perf_counter() - start
            tps = (self.progress.tokens - tokens_at_start) / max(elapsed, 1e-9)
            bar.set_postfix(loss=f"{stats['loss']:.4f}", tok_s=f"{tps:,.0f}", refresh=False)
            bar.update(1)
            step = self.progress.step
            if step % out.log_every_steps == 0 or step == self.total_steps:
                self.metrics.write("train", step, {"loss": sum(window) / len(window), "grad_norm": stats["grad_norm"],
                                                   "lr": self.scheduler.get_last_lr()[0], "tokens_per_s": tps,
                                                   "tokens": self.progress.tokens})
                window = []
            if self.plan.config.eval.every_steps and step % self.plan.config.eval.every_steps == 0 \
                    and step != self.total_steps:
                self.evaluate("during training")
            if out.save_every_steps and step % out.save_every_steps == 0 and step != self.total_steps:
                self.save()
        bar.close()
        wall = time.perf_counter() - start
        self.save()
        weights = self.run_dir / ("model" if self.plan.config.adapter.method == "full" else "adapter")
        export_weights(self.model, weights, self.tokenizer)
        after = self.evaluate("after training")
        self.metrics.close()
        return {"before": before, "after": after, "steps": self.progress.step, "train_seconds": wall,
                "tokens": self.progress.tokens, "weights": str(weights)}
