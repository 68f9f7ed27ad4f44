"""One probe case in one process (or one rank of two): `python -m loraflow.probes.worker RULE --out FILE`.

Runs the naive Combination, then the Combination loraflow's plan makes of it (unless the plan refuses it, or changes
nothing), and writes one JSON line per mode to FILE (rank 0 only). A failing mode prints its full traceback to
stderr, which is what `scripts/capture_failure_logs.py` keeps as explain's test fixtures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import traceback

from loraflow.probes import Context, Observation, all_cases
from loraflow.probes.plan import plan_setup


# In a batch, a collective that one rank never joins (its case failed on it alone) must fail, not hang the rest of
# the batch until the runner's timeout: the runner then reruns what is left one launch per case.
BATCH_COLLECTIVE_TIMEOUT_S = 90


def _init_distributed(batch: bool = False) -> Context:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        from datetime import timedelta

        import torch.distributed as dist

        if not dist.is_initialized():
            extra = {"timeout": timedelta(seconds=BATCH_COLLECTIVE_TIMEOUT_S)} if batch else {}
            dist.init_process_group("gloo", rank=rank, world_size=world, **extra)
    return Context(rank=rank, world_size=world)


def _barrier(ctx: Context) -> None:
    if ctx.world_size > 1:
        import torch.distributed as dist

        dist.barrier()


def run_mode(case, setup, ctx: Context, mode: str) -> Observation:
    ctx.workdir = tempfile.mkdtemp(prefix=f"probe-{case.rule}-{mode}-")
    print(f"=== probe {case.rule}: {mode} settings: {setup_line(setup)}", file=sys.stderr, flush=True)
    try:
        observation = case.execute(setup, ctx)
    except Exception as exc:  # the failure under study: keep its traceback in the log
        traceback.print_exc()
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        observation = Observation("error", f"{type(exc).__name__}: {first}"[:300])
    print(f"=== probe {case.rule}: {mode} -> {observation.status}: {observation.detail}", file=sys.stderr, flush=True)
    return observation


def setup_line(setup) -> str:
    from loraflow.probes.plan import describe

    return describe(setup)


def run_rule(rule: str, ctx: Context, out: str, only_naive: bool) -> None:
    """The naive run of one case, then the plan's (unless refused or unchanged); rank 0 writes `out`."""
    case = all_cases()[rule]
    naive, final, refusal = plan_setup(case)
    results = {"naive": run_mode(case, naive, ctx, "naive")}
    _barrier(ctx)
    if only_naive:
        pass
    elif refusal:
        results["plan"] = Observation("refused", refusal)
    elif final == naive:
        results["plan"] = Observation(results["naive"].status, "the plan changes nothing: " + results["naive"].detail)
    else:
        results["plan"] = run_mode(case, final, ctx, "plan")
    _barrier(ctx)
    if ctx.rank == 0:
        with open(out, "w") as f:
            for mode, obs in results.items():
                f.write(json.dumps({"mode": mode, "status": obs.status, "detail": obs.detail,
                                    "values": obs.values}) + "\n")


def _in_step(ctx: Context, index: int) -> bool:
    """Whether every rank is about to run the same case of a batch (a failed case can leave them apart)."""
    if ctx.world_size == 1:
        return True
    import torch
    import torch.distributed as dist

    seen = [torch.zeros(1, dtype=torch.long) for _ in range(ctx.world_size)]
    dist.all_gather(seen, torch.tensor([index]))
    return all(int(t) == index for t in seen)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("rules", nargs="+", metavar="RULE")
    p.add_argument("--out", help="one case: its result file")
    p.add_argument("--batch-dir", help="several cases in this launch, one after another: DIR/RULE.jsonl each")
    p.add_argument("--only-naive", action="store_true", help="skip the plan's run (capturing failure logs)")
    args = p.parse_args(argv)
    if not args.batch_dir:
        if len(args.rules) != 1 or not args.out:
            p.error("one RULE with --out, or several with --batch-dir")
        run_rule(args.rules[0], _init_distributed(), args.out, args.only_naive)
        return 0
    # A batch of two-rank cases shares one launch (one start-up of torch, transformers, peft and DeepSpeed per rank
    # instead of one per case). A case that leaves the ranks apart ends the batch: the runner reruns the rest apart.
    ctx = _init_distributed(batch=True)
    for index, rule in enumerate(args.rules):
        try:
            if not _in_step(ctx, index):
                raise RuntimeError(f"the ranks are no longer at the same case before {rule}")
            run_rule(rule, ctx, os.path.join(args.batch_dir, f"{rule}.jsonl"), args.only_naive)
        except Exception:
            traceback.print_exc()
            print(f"=== probe batch stops before finishing {rule}", file=sys.stderr, flush=True)
            sys.stderr.flush()
            os._exit(3)  # no teardown: a process group left apart would hang in it
    return 0


if __name__ == "__main__":
    sys.exit(main())
