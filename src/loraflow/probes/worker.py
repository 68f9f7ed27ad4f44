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


def _init_distributed() -> Context:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("gloo", rank=rank, world_size=world)
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("rule")
    p.add_argument("--out", required=True)
    p.add_argument("--only-naive", action="store_true", help="skip the plan's run (capturing failure logs)")
    args = p.parse_args(argv)
    case = all_cases()[args.rule]
    ctx = _init_distributed()
    naive, final, refusal = plan_setup(case)
    results = {"naive": run_mode(case, naive, ctx, "naive")}
    _barrier(ctx)
    if args.only_naive:
        pass
    elif refusal:
        results["plan"] = Observation("refused", refusal)
    elif final == naive:
        results["plan"] = Observation(results["naive"].status, "the plan changes nothing: " + results["naive"].detail)
    else:
        results["plan"] = run_mode(case, final, ctx, "plan")
    _barrier(ctx)
    if ctx.rank == 0:
        with open(args.out, "w") as f:
            for mode, obs in results.items():
                f.write(json.dumps({"mode": mode, "status": obs.status, "detail": obs.detail,
                                    "values": obs.values}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
