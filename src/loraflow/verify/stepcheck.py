"""One optimizer step of a stage, recorded so that an engine can be compared with one process (the stage tests):
the loss and the stage's statistics, every trainable parameter's full gradient, the rollout tokens by prompt,
and, for the sharded engines, how often the weights were gathered for generation and how many all-gathers ran
inside generate itself.

    python -m loraflow.verify.stepcheck --stage grpo --out result.pt [--update N] key=value ...
    (under torchrun for several processes; every rank runs it, rank 0 writes the result)

--update N records the N-th optimizer step (the earlier ones are applied first): with rl.updates_per_rollout=N,
the last update on the first rollout, where the ratio has moved away from 1 and the clip acts.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

COUNTED = ("all_gather_into_tensor", "all_gather", "_all_gather_base")


class GatherCounter:
    """Counts all-gather collectives while inside `generate`, and entries into the engine's generation gather.
    It counts calls and passes them through unchanged."""

    def __init__(self):
        self.inside_generate = False
        self.allgathers_in_generate = 0
        self.gather_contexts = 0
        self.generate_calls = 0

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

                setattr(module, name, counted)
        import loraflow.stages.rl as rl

        original_generate = rl.generate

        def generate(*args, **kwargs):
            self.inside_generate, self.generate_calls = True, self.generate_calls + 1
            try:
                return original_generate(*args, **kwargs)
            finally:
                self.inside_generate = False

        rl.generate = generate
        original_gather = engine.gathered_for_generation

        @contextlib.contextmanager
        def gathered():
            self.gather_contexts += 1
            with original_gather() as model:
                yield model

        engine.gathered_for_generation = gathered


def run(stage: str, overrides: list[str], out: str, update: int = 1) -> dict[str, Any] | None:
    from loraflow.config import load_config
    from loraflow.engines import init_distributed
    from loraflow.enginespec import wants_process_group
    from loraflow.environment import detect_environment
    from loraflow.pipeline import build_run
    from loraflow.run import demo_config
    from loraflow.stagespec import stage_spec
    from loraflow.verify.crosscheck import _randomize_lora_b

    config = load_config(str(demo_config(stage)), [f"stage={stage}", *overrides])
    if wants_process_group(config.parallel.engine, int(os.environ.get("WORLD_SIZE", "1"))):
        init_distributed(config.parallel.backend)
    run = build_run(config, detect_environment(), Path(config.output.dir), adjust_model=_randomize_lora_b)
    plan, trainer, train, tokenizer = run.plan, run.trainer, run.train, run.tokenizer
    generates = stage_spec(stage).generates
    engine = trainer.engine
    counter = GatherCounter()
    counter.install(engine)
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
    for _ in range(update - 1):
        trainer.accumulate()
        trainer.apply_update()
    stats = trainer.accumulate()
    grads = engine.full_grads()
    control = None
    if plan.setup.zero3 and generates:
        # The control: generating without the gather fetches weights at every decoding step. (FSDP2 has no such
        # control: PEFT's generate enters the model below FSDP2's root, so without the gather it fails outright.)
        from loraflow.rollout import generate

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
    result = {"stats": stats, "grads": {k: v.float().cpu() for k, v in grads.items() if v is not None},
              "missing": [k for k, v in grads.items() if v is None], "tokens": merged, "counts": counts,
              "engine": plan.setup.engine, "world_size": plan.setup.world_size}
    torch.save(result, out)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stage", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--update", type=int, default=1, help="record the N-th optimizer step")
    parser.add_argument("overrides", nargs="*")
    args, _ = parser.parse_known_args()
    run(args.stage, args.overrides, args.out, args.update)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
