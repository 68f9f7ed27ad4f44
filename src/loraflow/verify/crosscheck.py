"""Engine cross-check: the same few optimizer steps under an engine and in one fp32 process, compared.

Each *cell* is one combination (adapter x checkpointing x precision x engine). Under an engine it trains exactly as
`loraflow train` does (pipeline.build_run: config -> plan -> tokenizer -> data -> model -> trainer) for `steps`
optimizer steps on a global batch
of `global_batch` samples, and records the full (gathered, rank-averaged) trainable gradients after the first
backward, the loss of every step and the trainable weights at the end. The reference is the same config in one
process, fp32, no checkpointing, engine single. A cell the plan refuses records the rule that refused it.

    torchrun --nproc_per_node 2 -m loraflow.verify.crosscheck --model DIR --data FILE --cells cells.json --out r.pt
    python -m loraflow.verify.crosscheck ... --reference      (one process; each cell's own reference)

Used by tests/distributed/test_engines.py and scripts/compatibility_matrix.py, so the matrix and the tests measure the same way.
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import json
import os
import tempfile
import traceback
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from loraflow.enginespec import VARIANTS, wants_process_group

STEPS = 3
GLOBAL_BATCH = 4
CELL_TIMEOUT = 240.0
"""Seconds one cell may take before every rank prints the stacks of all its threads and exits (a cell takes 2-30 s):
a hang between ranks (two ranks in different collectives) then fails with each rank's stack in the log instead of
running into the caller's timeout, which kills the launch without a word."""
ZERO3_SHARD_ALL = {"zero_optimization": {"stage3_param_persistence_threshold": 0, "stage3_max_live_parameters": 0,
                                         "stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 0}}
"""Tiny models fall under ZeRO-3's default persistence threshold (100k elements) and would not be partitioned at
all; the cross-check partitions every weight, as a real model's are."""


TOWER_SETUPS = {
    "none": [],
    # Adapters on the language model; the vision encoder and projector frozen (the default).
    "lm": [],
    # MiniCPM-V's finetune_lora.sh with --tune_vision: LoRA on the language model, vision encoder and projector
    # trained in full.
    "minicpm": ["towers.vision.train=full", "towers.projector.train=full"],
    # Adapters in the vision encoder too (own rank), the projector in full.
    "vision": ["towers.vision.train=adapter", "towers.vision.rank=2", "towers.projector.train=full"],
}
"""Cell.towers -> the config overrides of that image-text setup (the model must be an image-text one)."""


@dataclass(frozen=True)
class Cell:
    adapter: str = "lora"  # lora | dora | full
    checkpointing: str = "off"  # off | reentrant | non-reentrant
    precision: str = "fp32"  # fp32 | bf16-mixed
    engine: str = "ddp"  # a name of enginespec.VARIANTS: single | ddp | zero0..zero3 | zero3-offload | fsdp2
    accumulation: int = 1  # micro-batches per optimizer step (the global batch per step stays GLOBAL_BATCH)
    granularity: str = "layer"  # checkpointing.granularity: layer | mlp | attention
    head: str = "frozen"  # the output head: frozen | lora (an adapter on it) | trained (adapter.train_modules)
    quantization: str = "none"  # model.quantization.method: none | nf4 | fp4 | int8
    towers: str = "none"  # an image-text model's towers (TOWER_SETUPS): none (a text model) | lm | minicpm | vision

    @property
    def id(self) -> str:
        gas = f"/gas{self.accumulation}" if self.accumulation > 1 else ""
        ckpt = self.checkpointing + (f"-{self.granularity}" if self.granularity != "layer" else "")
        head = f"/head-{self.head}" if self.head != "frozen" else ""
        quant = f"/{self.quantization}" if self.quantization != "none" else ""
        towers = f"/towers-{self.towers}" if self.towers != "none" else ""
        return f"{self.adapter}/{ckpt}/{self.precision}/{self.engine}{gas}{head}{quant}{towers}"

    @classmethod
    def from_id(cls, cid: str) -> Cell:
        """The cell whose `id` is `cid` (adapter/ckpt[-granularity]/precision/engine[/gasN][/head-X][/quant]).
        Raises ValueError for a string `id` would not produce, so a mistyped id is not silently another cell."""
        parts = cid.split("/")
        if len(parts) < 4:
            raise ValueError(f"cell id {cid!r}: expected adapter/checkpointing/precision/engine[/gasN][/head-X]"
                             "[/quantization]")
        adapter, ckpt, precision, engine, *rest = parts
        granularity = "layer"
        for g in ("mlp", "attention"):  # "non-reentrant" itself has a dash: match the granularity suffix only
            if ckpt.endswith(f"-{g}"):
                ckpt, granularity = ckpt[: -len(g) - 1], g
        kw: dict[str, Any] = {}
        for part in rest:  # the optional parts, in the order `id` writes them
            if part.startswith("gas") and part[3:].isdigit() and not kw:
                kw["accumulation"] = int(part[3:])
            elif part.startswith("towers-") and "towers" not in kw:
                kw["towers"] = part[7:]
            elif part.startswith("head-") and "head" not in kw and "quantization" not in kw:
                kw["head"] = part[5:]
            elif "quantization" not in kw:
                kw["quantization"] = part
            else:
                raise ValueError(f"cell id {cid!r}: unexpected part {part!r}")
        cell = cls(adapter, ckpt, precision, engine, granularity=granularity, **kw)
        if cell.id != cid:
            raise ValueError(f"cell id {cid!r} is not canonical (the cell's id is {cell.id!r})")
        return cell

    def reference(self) -> "Cell":
        """One fp32 process without checkpointing, with the same global micro-batches (and so the same data
        order: an epoch's last global micro-batch may be short). A quantized cell's reference runs on the
        dequantized base (run_cell): the same weights as plain float32 layers."""
        return Cell(self.adapter, "off", "fp32", "single", self.accumulation, head=self.head,
                    quantization=self.quantization, towers=self.towers)

    @property
    def is_reference(self) -> bool:
        return self == self.reference()

    def overrides(self, world_size: int, workdir: Path) -> list[str]:
        out = [f"adapter.method={self.adapter}", f"precision.mode={self.precision}",
               f"checkpointing.enabled={'false' if self.checkpointing == 'off' else 'true'}",
               f"train.micro_batch_size={max(1, GLOBAL_BATCH // (world_size * self.accumulation))}",
               f"train.gradient_accumulation_steps={self.accumulation}", f"train.max_steps={STEPS}",
               "train.learning_rate=1e-3", "train.warmup_steps=0", "train.schedule=constant", "train.seed=3",
               "adapter.rank=4", "adapter.alpha=8", "adapter.dropout=0", "data.eval=", "output.progress_bar=false",
               "output.tensorboard=false", f"output.dir={workdir / self.id.replace('/', '_')}"]
        if self.quantization != "none":
            out.append(f"model.quantization.method={self.quantization}")
        out += TOWER_SETUPS[self.towers]
        if self.adapter == "full":
            out.append("adapter.target_modules=all-linear")
        if self.head == "lora":
            out.append("adapter.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,lm_head]")
        elif self.head == "trained":
            out.append("adapter.train_modules=[lm_head]")
        # The reference computes full logits, as a plain model call does; every other cell runs the head at the
        # learned positions only, in chunks of a few positions (losses/logprobs.py), so the comparison covers both.
        out += (["train.logits=full"] if self.is_reference else
                ["train.logits=learned", "train.logits_chunk_mib=0.002"])
        if self.checkpointing != "off":
            out.append(f"checkpointing.reentrant={'true' if self.checkpointing == 'reentrant' else 'false'}")
            out.append(f"checkpointing.granularity={self.granularity}")
        return out + engine_overrides(self.engine, workdir)


def engine_overrides(variant: str, workdir: Path) -> list[str]:
    """The parallel.* overrides of an engine variant (enginespec.VARIANTS: zero3-offload, fsdp2, ...). ZeRO-3
    partitions every weight, as a real model's are (ZERO3_SHARD_ALL, written under workdir)."""
    v = VARIANTS[variant]
    out = [f"parallel.engine={v.engine}"]
    if v.zero_stage is not None:
        out.append(f"parallel.zero_stage={v.zero_stage}")
        if v.zero_stage == 3:
            from loraflow.checkpoints.store import write_atomic_text

            # Every rank writes it at every cell into the directory they share: in place (truncate, then write), a
            # rank that read it in the other's window got an empty file, failed that cell alone and left the other
            # waiting in the engine's first broadcast (the cross-check hang of full suite runs, under load).
            path = workdir / "zero3-shard-all.json"
            write_atomic_text(path, json.dumps(ZERO3_SHARD_ALL))
            out.append(f"parallel.deepspeed_config={path}")
    if v.offload:
        out += ["parallel.offload_optimizer=true", "parallel.offload_params=true"]
    return out


def run_cell(cell: Cell, model_dir: str, data: str, world_size: int, workdir: Path,
             plan_versions: str = "") -> dict[str, Any]:
    """One cell on this process (every rank calls it). Returns rank 0's record; other ranks' is empty.
    `plan_versions` (PKG=VER,...) makes the plan decide as for those versions, so a remedy for an older stack can be
    run, and checked, on the installed one."""
    from loraflow.config import load_config
    from loraflow.environment import detect_environment, parse_versions, with_versions
    from loraflow.errors import ConfigError, PlanError
    from loraflow.run.pipeline import build_run

    overrides = [f"model.path={model_dir}", f"data.train={data}", *cell.overrides(world_size, workdir)]
    config = load_config(None, overrides)
    env = with_versions(detect_environment(), parse_versions(plan_versions))
    try:
        adjust = _dequantize_then_randomize if cell.is_reference and cell.quantization != "none" else \
            _randomize_lora_b
        run = build_run(config, env, Path(config.output.dir), adjust_model=adjust)
    except PlanError as exc:
        return {"status": "refused", "rule": ",".join(f.rule.id for f in exc.findings),
                "message": "; ".join(f.rule.title for f in exc.findings)}
    except ConfigError as exc:
        return {"status": "refused", "rule": None, "message": str(exc)}
    trainer, plan = run.trainer, run.plan
    losses, grads, blanks = [], None, 0
    for step in range(STEPS):
        stats = trainer.accumulate()
        if step == 0:
            grads = trainer.engine.full_grads()
        blanks += sum("blank_rows" in batch for batch, _ in trainer.prepared[0])
        trainer.apply_update()
        losses.append(stats["loss"])
    (blanks,) = trainer.engine.all_sum([blanks])
    final = trainer.engine.trainable_state()
    if trainer.engine.rank != 0:
        return {}
    saved = _saved_tensors(trainer.model, final, Path(config.output.dir) / "adapter") if cell.adapter != "full" else 0
    return {"status": "ok", "losses": losses, "grads": {k: v.float().cpu() for k, v in grads.items() if v is not None},
            "missing": [k for k, v in grads.items() if v is None],
            "final": {k: v.float() for k, v in final.items()},
            "saved_tensors": saved,
            "blank_batches": int(blanks),  # micro-batches (all ranks) that got the blank image
            "engine_checkpointed_layers": sum(bool(getattr(m, "_loraflow_checkpointed", False))
                                              for m in trainer.engine.module.modules()),
            "decisions": [
                (d.key, str(d.value), d.rule) for d in plan.decisions if d.rule]}


def _saved_tensors(model, state: dict[str, torch.Tensor], directory: Path) -> int:
    """Save the adapter as the trainer does and count the tensors PEFT wrote (0 would be an empty adapter)."""
    from safetensors.torch import load_file

    from loraflow.checkpoints.store import save_weights

    save_weights(model, directory, state)
    return len(load_file(directory / "adapter_model.safetensors"))


def _randomize_lora_b(model: torch.nn.Module, seed: int = 5) -> None:
    """LoRA starts with B = 0, which makes every lora_A gradient exactly zero on the first step and the first-step
    comparison blind to lora_A; a seeded random B (the same on every rank and in the reference) gives each adapter
    weight a real gradient."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad and "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32).to(p.dtype) * 0.02)


def _dequantize_then_randomize(model: torch.nn.Module) -> None:
    """The reference of a quantized cell: its quantized layers replaced by float32 ones with the same (dequantized)
    weights, so the comparison isolates what quantized compute and the engine change."""
    from loraflow.setup.quantize import dequantize_model

    dequantize_model(model)
    _randomize_lora_b(model)


def relative_error(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> tuple[float, str]:
    """The largest per-tensor relative error ||got - want|| / ||want||, and where; a missing tensor is inf."""
    worst, where = 0.0, ""
    for name, ref in want.items():
        if name not in got:
            return float("inf"), name
        err = float((got[name] - ref).norm() / ref.norm().clamp_min(1e-12))
        if err > worst:
            worst, where = err, name
    return worst, where


NULL_GRADIENT = 1e-6
"""A reference gradient this many times smaller than the largest one is zero up to rounding: an attention key
bias's (softmax does not change when every key's score moves by the same amount, so d loss / d k_bias = 0; its
float32 rounding was measured at 1e-11 to 2.4e-8 of the largest gradient on the tiny LLaVAs). A relative error of
rounding noise means nothing, and Adam turns that noise into updates of its own, so such a tensor is checked to
stay below this level and its final weight is not compared. A real engine fault (a lost, doubled or unaveraged
gradient) shows at the tensor's own scale, 1e-3 of the largest or more."""


def compare(result: dict[str, Any], reference: dict[str, Any]) -> dict[str, Any]:
    """Gradient, loss and final-weight agreement of a cell's result with its reference."""
    if result.get("status") != "ok":
        return {"status": result.get("status", "failed"), "rule": result.get("rule"),
                "message": result.get("message", "")}
    want = reference["grads"]
    scale = max((float(g.norm()) for g in want.values()), default=0.0)
    null = sorted(n for n, g in want.items() if float(g.norm()) <= NULL_GRADIENT * scale)
    grad_err, where = relative_error(result["grads"], {n: g for n, g in want.items() if n not in null})
    for name in null:  # a null gradient must stay null: an engine that breaks it shows here
        if name not in result["grads"] or float((result["grads"][name] - want[name]).norm()) > NULL_GRADIENT * scale:
            grad_err, where = float("inf"), name
    if result["missing"]:
        grad_err, where = float("inf"), result["missing"][0]
    loss_err = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(result["losses"], reference["losses"]))
    weight_err, _ = relative_error({n: w for n, w in result["final"].items() if n not in null},
                                   {n: w for n, w in reference["final"].items() if n not in null})
    return {"status": "ok", "grad_error": grad_err, "worst": where, "loss_error": loss_err,
            "weight_error": weight_err, "null_gradients": null, "losses": result["losses"],
            "rules": sorted({r for _, _, r in result["decisions"] if r})}


def worker_argv(cells: list[Cell], model: str, data: str, workdir: Path, tag: str, ranks: int,
                reference: bool = False, python: str | None = None, extra: tuple[str, ...] = ()) -> tuple[list[str], Path]:
    """The command that runs `cells` in this worker (under torchrun for ranks > 1), and the file its results go
    to: the one way the tests, the legacy job and the matrix script launch it."""
    import sys

    from loraflow.engines.launch import torchrun_argv

    spec, out = workdir / f"{tag}.cells.json", workdir / f"{tag}.pt"
    spec.write_text(json.dumps([asdict(c) for c in cells]))
    tail = ["-m", "loraflow.verify.crosscheck", "--model", model, "--data", data, "--cells", str(spec),
            "--out", str(out), *(["--reference"] if reference else []), *extra]
    return (torchrun_argv(ranks, tail, python) if ranks > 1 else [python or sys.executable, *tail]), out


def _between_cells() -> None:
    """Start the next cell on every rank from the same state: the last cell's engine released now (it sits in
    reference cycles, so otherwise the automatic collector destroys it, DeepSpeedEngine.__del__ -> destroy()
    included, at a moment each rank reaches at its own time in the middle of the next cell) and the ranks lined
    up."""
    gc.collect()
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def save(cells: list[Cell], results: dict[str, Any], out: str) -> None:
    """Write the results so far (atomically: a reader never sees half a file)."""
    part = f"{out}.part"
    torch.save({"cells": [asdict(c) for c in cells], "results": results}, part)
    os.replace(part, out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loraflow.verify.crosscheck")
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--cells", required=True, help="JSON list of cells (adapter, checkpointing, precision, engine)")
    p.add_argument("--out", required=True)
    p.add_argument("--reference", action="store_true", help="run each cell's single-process fp32 reference")
    p.add_argument("--cell-timeout", type=float, default=CELL_TIMEOUT, metavar="S",
                   help="seconds per cell before every rank dumps its stacks and exits (a hang)")
    p.add_argument("--plan-versions", default="", metavar="PKG=VER,...",
                   help="let the plan decide as for these versions (run an older stack's remedy on this one)")
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    cells = [Cell(**c) for c in json.loads(Path(args.cells).read_text())]
    if args.reference:
        cells = list(dict.fromkeys(c.reference() for c in cells))
    from loraflow.run.log import setup_logging

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if any(wants_process_group(VARIANTS[c.engine].engine, world) for c in cells):
        from loraflow.engines import init_distributed

        init_distributed("gloo")
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_initialized() else 0
    setup_logging(None, main=False)  # warnings only: the caller prints the comparison
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        shared = [tmp]
        if dist.is_initialized():
            dist.broadcast_object_list(shared, src=0)  # one directory for every rank's checkpoint files
        for cell in cells:
            faulthandler.dump_traceback_later(args.cell_timeout, exit=True)
            try:
                results[cell.id] = run_cell(cell, args.model, args.data, world, Path(shared[0]),
                                          args.plan_versions)
            except Exception as exc:  # recorded, and the next cell still runs (both ranks fail alike)
                results[cell.id] = {"status": "error", "message": f"{type(exc).__name__}: {exc}",
                                    "traceback": traceback.format_exc()}
            _between_cells()
            faulthandler.cancel_dump_traceback_later()
            if rank == 0:
                r = results[cell.id]
                print(f"{cell.id}: {r.get('status')} {r.get('message', '')[:200]}", flush=True)
                save(cells, results, args.out)  # after every cell: a launch killed on a hang keeps what it finished
    if rank == 0:
        save(cells, results, args.out)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
