"""One optimizer step of a stage, recorded so that an engine can be compared with one process (the stage tests):
the loss and the stage's statistics, every trainable parameter's full gradient, the rollout tokens by prompt,
and, for the sharded engines, how often the weights were gathered for generation and how many all-gathers ran
inside generate itself.

One launch runs a list of *cells* (stage, overrides, update), one after another in the same process group, so a
test pays the start-up of torch, transformers and DeepSpeed once per engine rather than once per stage:

    torchrun --nproc_per_node 2 -m loraflow.verify.stepcheck --cells cells.json --out results.pt
    python -m loraflow.verify.stepcheck --cells cells.json --out results.pt      (one process: the references)

cells.json is a list of {"stage": ..., "overrides": [key=value, ...], "update": N}; results.pt holds
{"results": {cell id: record}}, written by rank 0 after every cell. A cell that raises is recorded with its
traceback and the next one still runs. `update` N records the N-th optimizer step (the earlier ones are applied
first): with rl.updates_per_rollout=N, the last update on the first rollout, where the ratio has moved away from 1
and the clip acts.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
import traceback
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

COUNTED = ("all_gather_into_tensor", "all_gather", "_all_gather_base")


@dataclass(frozen=True)
class StepCell:
    stage: str
    overrides: tuple[str, ...] = field(default_factory=tuple)
    update: int = 1
    dequantize: bool = False
    """A quantized base's reference: its quantized layers replaced by float32 ones with the same weights."""

    @property
    def id(self) -> str:
        return f"{self.stage}/update{self.update}" + ("/dequantized" if self.dequantize else "")


class GatherCounter:
    """Counts all-gather collectives while inside `generate`, and entries into the engine's generation gather.
    It counts calls and passes them through unchanged; `uninstall` puts every original back, so the next cell of
    the launch starts from the library's own functions."""

    def __init__(self):
        self.inside_generate = False
        self.allgathers_in_generate = 0
        self.gather_contexts = 0
        self.generate_calls = 0
        self._originals: list[tuple[Any, str, Any]] = []

    def _patch(self, owner, name: str, replacement) -> None:
        self._originals.append((owner, name, getattr(owner, name)))
        setattr(owner, name, replacement)

    def install(self, engine) -> None:
        modules = [dist]
        if engine.name == "deepspeed":  # ZeRO-3 calls its own comm layer, which holds torch's functions
            import deepspeed.comm

            modules.append(deepspeed.comm)
        for module in modules:
            for name in COUNTED + ("allgather_fn",):
                original = getattr(module, name, None)
                if original is None:
                    continue

                def counted(*args, _original=original, **kwargs):
                    if self.inside_generate:
                        self.allgathers_in_generate += 1
                    return _original(*args, **kwargs)

                self._patch(module, name, counted)
        from loraflow.stages import rl

        original_generate = rl.generate

        def generate(*args, **kwargs):
            self.inside_generate, self.generate_calls = True, self.generate_calls + 1
            try:
                return original_generate(*args, **kwargs)
            finally:
                self.inside_generate = False

        self._patch(rl, "generate", generate)
        original_gather = engine.gathered_for_generation

        @contextlib.contextmanager
        def gathered():
            self.gather_contexts += 1
            with original_gather() as model:
                yield model

        self._patch(engine, "gathered_for_generation", gathered)

    def uninstall(self) -> None:
        for owner, name, original in reversed(self._originals):
            setattr(owner, name, original)
        self._originals.clear()


def _config(cell: StepCell):
    from loraflow.config import load_config
    from loraflow.run.config import demo_config

    return load_config(str(demo_config(cell.stage)), [f"stage={cell.stage}", *cell.overrides])


def run_cell(cell: StepCell) -> dict[str, Any] | None:
    """One cell on this process (every rank calls it): built with pipeline.build_run as `train` builds it, its
    `update`-th step recorded. Returns rank 0's record, None on the other ranks."""
    from loraflow.environment import detect_environment
    from loraflow.run.pipeline import build_run
    from loraflow.stagespec import stage_spec
    from loraflow.verify.crosscheck import _dequantize_then_randomize, _randomize_lora_b

    config = _config(cell)
    run = build_run(config, detect_environment(), Path(config.output.dir),
                    adjust_model=_dequantize_then_randomize if cell.dequantize else _randomize_lora_b)
    counter = GatherCounter()
    try:
        counter.install(run.trainer.engine)
        return _record(cell, run, counter, stage_spec(cell.stage).generates)
    finally:
        counter.uninstall()
        _tear_down(run)


def _record(cell: StepCell, run, counter: GatherCounter, generates: bool) -> dict[str, Any] | None:
    plan, trainer, train, tokenizer = run.plan, run.trainer, run.train, run.tokenizer
    engine = trainer.engine
    tokens: dict[int, list[list[int]]] = {}
    prepare = trainer.hooks.prepare
    if prepare is not None and generates:
        def recording(e, batches, step):
            prepared = prepare(e, batches, step)
            for (before, real), (after, _) in zip(batches, prepared):
                if real:
                    index = before["index"].tolist()
                    rows = after["input_ids"].cpu().tolist()
                    group = len(rows) // len(index)
                    for k, i in enumerate(index):
                        tokens[i] = rows[k * group:(k + 1) * group]
            return prepared

        trainer.hooks.prepare = recording
    for _ in range(cell.update - 1):
        trainer.accumulate()
        trainer.apply_update()
    stats = trainer.accumulate()
    grads = engine.full_grads()
    control = None
    if plan.setup.zero3 and generates:
        # The control: generating without the gather fetches weights at every decoding step. (FSDP2 has no such
        # control: PEFT's generate enters the model below FSDP2's root, so without the gather it fails outright.)
        from loraflow.rl.rollout import generate

        row = train.rows[0]
        counter.inside_generate, before = True, counter.allgathers_in_generate
        generate(engine.module, [row.prompt_ids], len(row.prompt_ids), 4, [tokenizer.eos_token_id],
                 tokenizer.pad_token_id, plan.device, None, 1.0, synced=True)
        counter.inside_generate, control = False, counter.allgathers_in_generate - before
    merged: dict[int, Any] = {}
    for part in engine.gather_objects(tokens):
        merged.update(part)
    counts = engine.gather_objects({"gather_contexts": counter.gather_contexts,
                                    "allgathers_in_generate": counter.allgathers_in_generate - (control or 0),
                                    "generate_calls": counter.generate_calls, "control_allgathers": control})
    if engine.rank != 0:
        return None
    return {"status": "ok", "stats": stats,
            "grads": {k: v.float().cpu() for k, v in grads.items() if v is not None},
            "missing": [k for k, v in grads.items() if v is None], "tokens": merged, "counts": counts,
            "engine": plan.setup.engine, "world_size": plan.setup.world_size}


def _tear_down(run) -> None:
    """Release the cell's engine before the next cell builds its own: DeepSpeed's ZeRO-3 keeps hooks on the
    model and buffers in its optimizer until `destroy`; the rest goes with the last reference."""
    wrapped = getattr(run.trainer.engine, "model", None)
    destroy = getattr(wrapped, "destroy", None)
    if callable(destroy):
        destroy()
    run.trainer = run.model = None
    gc.collect()


def worker_argv(cells: list[StepCell], workdir: Path, tag: str, ranks: int,
                python: str | None = None) -> tuple[list[str], Path]:
    """The command that runs `cells` in one launch (under torchrun for ranks > 1), and the file its results go to."""
    from loraflow.engines.launch import torchrun_argv

    spec, out = workdir / f"{tag}.cells.json", workdir / f"{tag}.pt"
    spec.write_text(json.dumps([asdict(c) for c in cells]))
    tail = ["-m", "loraflow.verify.stepcheck", "--cells", str(spec), "--out", str(out)]
    return (torchrun_argv(ranks, tail, python) if ranks > 1 else [python or sys.executable, *tail]), out


def _save(results: dict[str, Any], out: str) -> None:
    part = f"{out}.part"  # atomically: a reader never sees half a file
    torch.save({"results": results}, part)
    os.replace(part, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loraflow.verify.stepcheck", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", required=True, help="JSON list of {stage, overrides, update}")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    cells = [StepCell(c["stage"], tuple(c.get("overrides", ())), int(c.get("update", 1)), bool(c.get("dequantize")))
             for c in json.loads(Path(args.cells).read_text())]
    if len({c.id for c in cells}) < len(cells):
        raise SystemExit(f"{args.cells}: two cells with the same stage and update; their results would collide")
    from loraflow.engines import init_distributed
    from loraflow.enginespec import wants_process_group

    # One process group for the whole launch, joined before the first cell and left after the last.
    world = int(os.environ.get("WORLD_SIZE", "1"))
    for config in map(_config, cells):
        if wants_process_group(config.parallel.engine, world):
            init_distributed(config.parallel.backend)
            break
    rank = dist.get_rank() if dist.is_initialized() else 0
    results: dict[str, Any] = {}
    for cell in cells:
        try:
            results[cell.id] = run_cell(cell)
        except Exception as exc:  # recorded, and the next cell still runs (the ranks fail alike)
            results[cell.id] = {"status": "error", "message": f"{type(exc).__name__}: {exc}",
                                "traceback": traceback.format_exc()}
        if dist.is_initialized():
            dist.barrier()  # every rank has torn the cell down before any builds the next
        if rank == 0:
            print(f"{cell.id}: {results[cell.id]['status']} {results[cell.id].get('message', '')[:300]}", flush=True)
            _save(results, args.out)  # after every cell: a launch killed on a hang keeps what it finished
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
