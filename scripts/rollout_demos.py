"""The RL demos (`loraflow train grpo`, `loraflow train ppo` on their embedded defaults) with rollouts sampled by
transformers' generate (`hf`) and by a local vLLM engine (`vllm`), on one process and on 2 ranks under ZeRO-3 and
FSDP2, each judged by the demo metrics tests/stages/test_stages.py holds the hf runs to (issue 30's "done when").

    python scripts/rollout_demos.py                          # both stages, both engines, all three layouts
    python scripts/rollout_demos.py --stages grpo --layouts single --engines vllm
    python scripts/rollout_demos.py --json out.json --set train.seed=1

On 2 ranks each rank takes half the prompts of a step (train.micro_batch_size halved), so every layout trains on
the same global batch. The vLLM engine is the local server loraflow starts for the run (scripts/setup_vllm.sh builds
its venv); each run stops itself if the engine's log-probs ever differ from the trainer's beyond the plan's bound.
Prints, per run: the demo metrics before -> after against the demo's floor and gain, wall seconds, the sync the
plan chose, the largest engine/trainer log-prob difference and the bytes of one sync.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "stages"))

LAYOUTS = {
    "single": (1, []),
    "zero3": (2, ["parallel.engine=deepspeed",
                  f"parallel.deepspeed_config={ROOT / 'examples' / 'deepspeed' / 'zero3-shard-small-models.json'}"]),
    "fsdp2": (2, ["parallel.engine=fsdp2"]),
}


def micro_batch(stage: str) -> int:
    from loraflow.config import load_config
    from loraflow.run.config import demo_config

    return load_config(str(demo_config(stage)), [f"stage={stage}"]).train.micro_batch_size


def run(stage: str, engine: str, layout: str, extra: list[str], work: Path, timeout: float) -> dict:
    from loraflow.engines.launch import launch_env, run_isolated, torchrun_argv

    ranks, flags = LAYOUTS[layout]
    run_dir = work / f"{stage}-{engine}-{layout}"
    micro = micro_batch(stage) // ranks
    tail = ["-m", "loraflow", "train", stage, f"output.dir={run_dir}", "output.progress_bar=false",
            "output.log_every_steps=1", f"rl.rollout.engine={engine}", f"train.micro_batch_size={micro}", *flags,
            *extra]
    argv = torchrun_argv(ranks, tail) if ranks > 1 else [sys.executable, *tail]
    log = work / f"{run_dir.name}.log"
    started = time.monotonic()
    code = run_isolated(argv, log, timeout, launch_env() if ranks > 1 else None, cwd=str(ROOT))
    out = {"stage": stage, "engine": engine, "layout": layout, "exit": code,
           "seconds": round(time.monotonic() - started, 1), "log": str(log)}
    if code != 0:
        out["tail"] = log.read_text()[-2000:]
        return out
    summary = json.loads((run_dir / "summary.json").read_text())
    out["before"], out["after"] = summary["before"], summary["after"]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r.get("kind") == "train"]
    if engine == "vllm":
        out["logprob_diff_max"] = max(r["rollout/logprob_diff_max"] for r in train)
        out["sync_bytes"] = train[-1]["rollout/sync_bytes"]
        text = log.read_text()
        out["sync"] = next((line.split()[2].rstrip(":") for line in text.splitlines()
                            if line.strip().startswith("rollout sync ")), "?")
    return out


def verdict(result: dict) -> tuple[bool, str]:
    from test_stages import DEMOS

    if result["exit"] != 0:
        return False, f"exit {result['exit']}"
    parts, ok = [], True
    for metric, floor, gain in DEMOS[result["stage"]]:
        before, after = result["before"][metric], result["after"][metric]
        good = after >= floor and after - before >= gain
        ok &= good
        parts.append(f"{metric} {before:.3f}->{after:.3f} ({'ok' if good else 'MISSED'}: >= {floor:g}, "
                     f"gain >= {gain:g})")
    return ok, "; ".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stages", default="grpo,ppo")
    parser.add_argument("--engines", default="hf,vllm")
    parser.add_argument("--layouts", default="single,zero3,fsdp2")
    parser.add_argument("--set", action="append", default=[], help="KEY=VALUE for every run")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results, failed = [], 0
    with tempfile.TemporaryDirectory(prefix="loraflow-rollout-demos-") as tmp:
        for stage in args.stages.split(","):
            for layout in args.layouts.split(","):
                for engine in args.engines.split(","):
                    result = run(stage, engine, layout, args.set, Path(tmp), args.timeout)
                    ok, text = verdict(result)
                    failed += not ok
                    extra = (f"; sync {result['sync']} {result['sync_bytes']:,.0f} B, log-prob diff max "
                             f"{result['logprob_diff_max']:.1e}" if "sync" in result else "")
                    print(f"{stage:4} {engine:4} {layout:6} {result['seconds']:7.1f} s  {text}{extra}", flush=True)
                    if "tail" in result:
                        print(result["tail"])
                    results.append(result)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
