"""The composition sweep's worker and judge: runs a list of setups (loraflow/verify/sweep_space.py) in one launch,
one after another in one process group, each as `loraflow train` builds it (pipeline.build_run), and judges it.

    torchrun --nproc_per_node 2 -m loraflow.verify.sweep_judge --setups S.json --out R.jsonl --workdir DIR
    python -m loraflow.verify.sweep_judge ...        (the one-process setups)

A setup passes when it is refused before its model loads (a rule of the plan, or a config error naming the key),
or when it runs its 3 optimizer steps with an evaluation between them and then:
- every logged loss is finite;
- every trained tensor changed and every frozen one is bit-identical (fingerprints of each rank's own shard);
- the saved weights reload (an adapter with peft.PeftModel.from_pretrained on the base as loraflow loads it, a full
  fine-tune with transformers) holding exactly the trained tensors, and, in one process, giving the trained
  model's outputs;
- in one fp32 process, its first-step gradients and its losses (GRPO, PPO: the first, see _twin_problems) match
  its unoptimised twin's (no checkpointing, full logits) as the compatibility matrix's cells do (1e-5);
- in bf16 (mixed or pure), its losses follow its fp32 twin's within BF16_LOSS (non-sampling stages).
Anything else, a crash included, is a failure. Rank 0 appends one JSON line per setup to the results file, and a
`{"start": id}` line before it, so a launch that dies or hangs names the setup it died in.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch

from loraflow.verify import sweep_space as space

FP32_TOLERANCE = 1e-5
BF16_LOSS = {"bf16-mixed": 0.05, "bf16": 0.10}
"""Largest relative difference of any of the 3 losses from the fp32 twin's. bf16-mixed rounds activations to 8
mantissa bits (relative 4e-3 each) and the error grows over layers and steps: the device check measured 1e-3 to
8e-3 on tiny-base's loss after 3 steps; 0.05 leaves room for the sweep's families (soft-capped logits, experts),
and a lost, doubled or misrouted gradient moves the second and third losses by more. Pure bf16 also rounds the
adapter weights and their updates, so twice that."""
OUTPUT_TOLERANCE = {"fp32": 1e-4, "bf16-mixed": 2e-2, "bf16": 0.1}
"""Reloaded vs trained model outputs (largest absolute difference over the largest absolute output): the same
weights through the same code, so only kernel order differs in fp32; bf16-mixed rounds the outputs themselves.
In pure bf16 PEFT's reload upcasts the adapters to float32 (autocast_adapter_dtype) where the run kept them in
bf16, a different rounding of the adapter path: measured up to 5.1e-2 on the sweep's models. The tensors
themselves are compared exactly above; this check catches an adapter the reload does not apply."""


def twins(setup: dict[str, str]) -> list[dict[str, str]]:
    """The setups this one is compared with, which must run before it in the same launch."""
    out = []
    # A sampling stage's bf16 run samples other tokens than its fp32 twin at the first near-tie, after which their
    # losses are of different completions: only its finiteness is judged.
    if setup["precision"] != "fp32" and not space.samples(setup):
        out.append({**setup, "precision": "fp32"})
    if space.ranks(setup) == 1 and (setup["precision"] == "fp32" or out) and \
            (setup["checkpointing"] != "off" or setup["logits"] != "full"):
        base = out[0] if out else setup
        out.insert(0, {**base, "checkpointing": "off", "logits": "full"})
    return out


def ordered(setups: list[dict[str, str]]) -> list[dict[str, str]]:
    """The setups with their twins, each twin before the setups compared with it, no setup twice."""
    seen: dict[str, dict[str, str]] = {}

    def add(s: dict[str, str]) -> None:
        for t in twins(s):
            add(t)
        seen.setdefault(space.setup_id(s), s)

    for s in setups:
        add(s)
    return list(seen.values())


class LoadedFlag:
    """build_run's adjust_model hook: marks that the model has loaded (a refusal after it is a failure), and gives
    LoRA's B a seeded random start as the cross-check does, so every adapter weight has a first-step gradient."""

    def __init__(self):
        self.loaded = False

    def __call__(self, model: torch.nn.Module) -> None:
        from loraflow.verify.crosscheck import _randomize_lora_b

        self.loaded = True
        _randomize_lora_b(model)


def run_setup(setup: dict[str, str], workdir: Path, rank: int, memory: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One setup on this process (every rank calls it). Returns the judged record (rank 0's is the one kept)."""
    from loraflow.environment import detect_environment
    from loraflow.errors import ConfigError, LoraflowError, PlanError
    from loraflow.loop.guards import FrozenWeights
    from loraflow.run.pipeline import build_run
    from loraflow.run.config import demo_config, load_run_config

    sid = space.setup_id(setup)
    out_dir = memory["runs"] / space.digest([setup])
    stage = space.stage_of(setup)
    flag = LoadedFlag()
    try:
        model = str(memory["models"][setup["family"]])
        config = load_run_config(stage, str(demo_config(stage)), space.overrides(setup, model, out_dir, workdir))
        out_dir.mkdir(parents=True, exist_ok=True)
        run = build_run(config, detect_environment(), out_dir, record=rank == 0, adjust_model=flag)
    except PlanError as exc:
        return {"status": "refused", "rule": ",".join(f.rule.id for f in exc.findings if f.rule),
                "message": " ".join(str(exc).split())[:800]}
    except (ConfigError, LoraflowError) as exc:
        if not flag.loaded:
            return {"status": "refused", "rule": None, "message": " ".join(str(exc).split())[:800]}
        raise
    trainer, engine = run.trainer, run.trainer.engine
    grads: list[dict[str, Any]] = []
    apply = trainer.apply_update

    def first_grads(*args, **kwargs):  # the first step's gradients, as the cross-check takes them
        if not grads:
            grads.append(engine.full_grads())
        return apply(*args, **kwargs)

    trainer.apply_update = first_grads
    frozen = FrozenWeights(run.model, engine.local_tensor)
    before = engine.trainable_state()
    run.fit()
    after = engine.trainable_state()
    engine.settle()  # the last evaluation may have left FSDP2's root unit gathered
    frozen_changed = frozen.changed(run.model)  # each rank checks its own shards
    (changed_anywhere,) = engine.all_sum([float(len(frozen_changed))])
    problems: list[str] = []
    if changed_anywhere:
        first = f" (first on rank 0: {frozen_changed[0]})" if frozen_changed else ""
        problems.append(f"{int(changed_anywhere)} frozen tensor shards changed{first}")
    record: dict[str, Any] = {"status": "ran"}
    if rank == 0:
        losses = [r["loss"] for r in _metrics(out_dir) if r.get("kind") == "train"]
        record["losses"] = losses
        if len(losses) != space.STEPS or not all(math.isfinite(x) for x in losses):
            problems.append(f"losses {losses}: expected {space.STEPS} finite ones")
        gone = [n for n in before if n not in after]
        if gone:
            new = [n for n in after if n not in before]
            problems.append(f"{len(gone)} trained tensors missing after training (first: {gone[0]})"
                            + (f"; {len(new)} appeared instead (first: {new[0]})" if new else ""))
        same = [n for n in before if n in after and torch.equal(before[n], after[n])]
        if same:
            problems.append(f"{len(same)} of {len(before)} trained tensors never changed (first: {same[0]})")
        problems += _reload_problems(run, after, out_dir, setup, single=space.ranks(setup) == 1)
        problems += _twin_problems(setup, losses, grads[0] if grads else {}, after, memory)
        memory["done"][sid] = {"losses": losses, "grads": grads[0] if grads else {}, "final": after}
    record.update(status="failed" if problems else "passed", problems=problems)
    return record


def _metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def _reload_problems(run, trained: dict[str, torch.Tensor], out_dir: Path, setup: dict[str, str],
                     single: bool) -> list[str]:
    """The saved weights reload, hold the trained tensors, and (in one process) give the trained outputs."""
    from loraflow.setup import load_base
    from loraflow.setup.model import load_merged

    plan = run.plan
    saved = out_dir / plan.saves
    if not saved.is_dir():
        return [f"nothing saved at {saved}"]
    if plan.saves == "adapter":
        from peft import PeftModel

        reloaded = PeftModel.from_pretrained(load_base(plan), saved)
    else:
        reloaded = load_merged(plan.config, str(saved), plan.load_dtype, plan.head, plan.attn_implementation,
                               plan.quantization, plan.device, [])
    state = {k: v for k, v in reloaded.state_dict().items()}
    missing, differ = [], []
    for name, tensor in trained.items():
        key = name if name in state else name.replace("base_model.model.", "", 1) if plan.saves == "model" else name
        if key not in state:
            if "v_head" not in name:  # PPO's critic is the run's own, saved beside the policy
                missing.append(name)
            continue
        # The reload holds the tensor in the dtype its base was loaded in (a bf16 base rounds a float32 score
        # head PEFT copies into it): equal after that same rounding.
        if not torch.equal(state[key].cpu(), tensor.to(state[key].dtype)):
            differ.append(name)
    problems = []
    if missing:
        problems.append(f"{len(missing)} trained tensors not in the reloaded model (first: {missing[0]})")
    if differ:
        problems.append(f"{len(differ)} reloaded tensors differ from the trained ones (first: {differ[0]})")
    if single and not problems:
        problems += _output_problems(run, reloaded, setup["precision"])
    return problems


@torch.no_grad()
def _output_problems(run, reloaded: torch.nn.Module, precision: str) -> list[str]:
    from loraflow.setup.precision import autocast

    plan = run.plan
    ids = torch.tensor([run.tokenizer("Please write the word apple backwards.")["input_ids"]], device=plan.device)
    trained = run.trainer.engine.module
    outs = []
    for model in (trained, reloaded):
        was = model.training
        model.eval()
        with autocast(plan.device, plan.autocast_dtype):
            out = model(input_ids=ids, attention_mask=torch.ones_like(ids))
        model.train(was)
        outs.append(out.logits.float())
    scale = float(outs[0].abs().max().clamp_min(1e-6))
    err = float((outs[0] - outs[1]).abs().max()) / scale
    if err > OUTPUT_TOLERANCE[precision]:
        return [f"reloaded model's outputs differ from the trained model's by {err:.2e} (limit "
                f"{OUTPUT_TOLERANCE[precision]:g})"]
    return []


def _twin_problems(setup: dict[str, str], losses: list[float], grads: dict[str, Any],
                   final: dict[str, torch.Tensor], memory: dict[str, Any]) -> list[str]:
    from loraflow.verify.crosscheck import compare

    problems = []
    for twin in twins(setup):
        tid = space.setup_id(twin)
        other = memory["done"].get(tid)
        if other is None:
            problems.append(f"twin {tid} did not run")
            continue
        if twin["precision"] == setup["precision"]:  # the unoptimised fp32 reference of a one-process setup
            # GRPO and PPO sample each rollout from the updated policy: weights equal to 1e-7 can flip a near-tie
            # in the second rollout, after which the losses are of other completions. The first rollout comes from
            # the same weights, so its loss and the first gradients are compared.
            compared = losses[:1] if space.samples(setup) else losses
            theirs = other["losses"][:1] if space.samples(setup) else other["losses"]
            r = compare({"status": "ok", "losses": compared, "grads": {k: v.float().cpu() for k, v in grads.items()
                                                                      if v is not None},
                         "missing": [k for k, v in grads.items() if v is None],
                         "final": {k: v.float() for k, v in final.items()}, "decisions": []},
                        {"grads": {k: v.float().cpu() for k, v in other["grads"].items() if v is not None},
                         "losses": theirs, "final": {k: v.float() for k, v in other["final"].items()}})
            if r["grad_error"] > FP32_TOLERANCE or r["loss_error"] > FP32_TOLERANCE:
                problems.append(f"against its unoptimised twin: gradient error {r['grad_error']:.2e} "
                                f"({r['worst']}), loss error {r['loss_error']:.2e} (limit {FP32_TOLERANCE:g})")
        else:
            limit = BF16_LOSS[setup["precision"]]
            err = max((abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, other["losses"])), default=0.0)
            if err > limit:
                problems.append(f"losses {['%.4f' % x for x in losses]} against the fp32 twin's "
                                f"{['%.4f' % x for x in other['losses']]}: relative {err:.3f} (limit {limit})")
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loraflow.verify.sweep_judge")
    p.add_argument("--setups", required=True, help="JSON list of setups, twins before the setups they judge")
    p.add_argument("--out", required=True, help="results, one JSON line per setup (appended)")
    p.add_argument("--workdir", required=True)
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch.distributed as dist

    from loraflow.run.log import setup_logging
    from loraflow.verify.sweep_models import image_text, model_dir

    setups = json.loads(Path(args.setups).read_text())
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from loraflow.engines import init_distributed

        init_distributed("gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    setup_logging(None, main=False)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    # Each launch its own run directories: a setup run again (a twin of one resumed) starts from an empty one.
    memory: dict[str, Any] = {"done": {}, "models": {}, "runs": workdir / "runs" / Path(args.setups).stem}
    for setup in setups:
        if setup["family"] not in memory["models"]:
            memory["models"][setup["family"]] = model_dir(setup["family"]) if rank == 0 else None
            if dist.is_initialized():
                shared = [memory["models"][setup["family"]]]
                dist.broadcast_object_list(shared, src=0)  # rank 0 builds a missing model, the others wait
                memory["models"][setup["family"]] = shared[0]
        if rank == 0 and image_text(setup["family"]):
            space.image_data(workdir, space.stage_of(setup), write=True)
    if dist.is_initialized():
        dist.barrier()  # the image data is written before any rank reads it
    out = open(args.out, "a", encoding="utf-8") if rank == 0 else None
    for setup in setups:
        sid = space.setup_id(setup)
        if out:
            out.write(json.dumps({"start": sid}) + "\n")
            out.flush()
        t0 = time.perf_counter()
        try:
            record = run_setup(setup, workdir, rank, memory)
        except Exception as exc:  # judged a failure; the next setup still runs (every rank fails alike)
            record = {"status": "failed", "problems": [f"{type(exc).__name__}: {exc}".splitlines()[0]],
                      "traceback": traceback.format_exc()[-4000:]}
        record.update(id=sid, setup=setup, seconds=round(time.perf_counter() - t0, 1))
        if out:
            out.write(json.dumps(record) + "\n")
            out.flush()
            os.fsync(out.fileno())
        if dist.is_initialized():
            dist.barrier()
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
