#!/usr/bin/env python
"""The composition sweep: every setup the plan accepts must train (docs/sweep.md).

    python scripts/sweep.py --seed 0 --count 500 --out runs/sweep        # the full sweep (resumes in --out)
    python scripts/sweep.py --ci --out /tmp/sweep-ci                      # the fixed slice CI runs
    python scripts/sweep.py --only '{"stage": "dpo-copy", "engine": "zero3"}' --out /tmp/one   # one setup
    python scripts/sweep.py ... --table docs/sweep.md                    # also write the table of the docs

Setups come from loraflow/verify/sweep_space.py (an all-pairs covering set over the axes plus a seeded random
sample), run in batches, one launch per process count and DeepSpeed environment (loraflow/verify/sweep_judge.py
judges each). Results are appended to OUT/results.jsonl as they finish, so a stopped sweep resumes where it was;
a launch that crashes or hangs (no result for --timeout seconds) is recorded against the setup it was in, and the
rest of its batch is launched again. OUT/summary.json holds setups, accepted, refused, passed and failures (each
with the command that reproduces it). Exit status: 0 when nothing failed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from loraflow.verify import sweep_space as space  # noqa: E402
from loraflow.verify.side_envs import setup_script, side_python  # noqa: E402
from loraflow.verify.sweep_judge import ordered  # noqa: E402

CI_SLICE = [
    {},
    {"checkpointing": "reentrant", "precision": "bf16-mixed", "family": "qwen2"},
    {"stage": "dpo-precomputed", "adapter": "dora", "checkpointing": "mlp", "family": "gemma2"},
    {"stage": "rm", "adapter": "full", "family": "phi3", "logits": "full"},
    {"stage": "grpo", "adapter": "nf4", "checkpointing": "non-reentrant", "family": "qwen3"},
    {"stage": "ppo", "targets": "attention", "family": "mistral", "precision": "bf16"},
    {"family": "qwen2_moe", "packing": "on", "checkpointing": "every-2", "targets": "experts"},
    {"stage": "dpo-adapters-disabled", "engine": "zero3", "family": "granite", "precision": "bf16-mixed"},
    {"stage": "dpo-copy", "engine": "fsdp2", "family": "olmo2", "targets": "lm_head"},
    {"stage": "sft", "engine": "zero2", "adapter": "int8", "family": "gemma"},
    {"stage": "grpo", "engine": "ddp", "family": "mixtral", "targets": "embeddings"},
    {"stage": "rm", "engine": "zero3-offload", "deepspeed": "oldest", "checkpointing": "reentrant"},
    {"stage": "sft", "engine": "zero2", "deepspeed": "oldest", "adapter": "dora", "precision": "bf16-mixed"},
    {"family": "llava", "towers": "vision-full", "precision": "bf16-mixed", "checkpointing": "non-reentrant"},
    {"stage": "dpo-copy", "family": "idefics3", "towers": "vision-adapter", "engine": "zero3"},
    {"family": "mllama", "engine": "fsdp2", "towers": "vision-adapter"},
    {"stage": "dpo-adapters-disabled", "family": "paligemma", "adapter": "nf4", "engine": "ddp"},
    {"stage": "dpo-copy", "family": "qwen2_vl", "towers": "vision-full"},
    {"family": "qwen2_5_vl", "engine": "zero3", "towers": "vision-adapter"},
    {"family": "gemma3", "precision": "bf16-mixed", "checkpointing": "reentrant"},
    {"family": "llava_next", "engine": "ddp", "adapter": "dora"},
    {"stage": "dpo-precomputed", "family": "llava_onevision", "engine": "fsdp2"},
]
"""The CI slice: partial setups (the rest DEFAULT) chosen so that every stage, family, adapter, targets, engine, precision
and towers value appears, and the cells the issue's first failures came from (bf16-mixed with a vision encoder
trained in full)."""


def legacy_python() -> str:
    where = side_python("legacy")
    if not where.is_file():
        raise SystemExit(f"the oldest-DeepSpeed setups need the legacy environment ({where}); build it with "
                         f"bash {setup_script('legacy').relative_to(ROOT)}")
    return str(where)


def read_results(path: Path) -> tuple[dict[str, dict], str | None]:
    """The finished records by id, and the id of a setup that started without finishing (the last one)."""
    done, started = {}, None
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a kill
            if "start" in r:
                started = r["start"]
            else:
                done[r["id"]] = r
                started = None if started == r["id"] else started
    return done, started


def append(path: Path, record: dict) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def run_batch(batch: list[dict], key: tuple[int, str], out: Path, timeout: float, log) -> None:
    """Run the batch's setups (twins included) until every one has a record, relaunching after a crash or hang."""
    from loraflow.engines.launch import launch_env, torchrun_argv

    ranks, deepspeed = key
    python = legacy_python() if deepspeed == "oldest" else sys.executable
    results = out / "results.jsonl"
    # Launch files are numbered on from any earlier invocation's, so a resumed sweep's runs get fresh directories.
    attempt = len(list(out.glob(f"launch-{ranks}-{deepspeed}-*.json")))
    while True:
        done, _ = read_results(results)
        pending = [s for s in batch if space.setup_id(s) not in done]
        if not pending:
            return
        # A pending setup's twins run again in its launch even when done before: the judge compares it with
        # their gradients and losses, which only the launch that ran them holds.
        todo = ordered(pending)
        attempt += 1
        spec = out / f"launch-{ranks}-{deepspeed}-{attempt}.json"
        spec.write_text(json.dumps(todo))
        tail = ["-m", "loraflow.verify.sweep_judge", "--setups", str(spec), "--out", str(results),
                "--workdir", str(out / "work")]
        argv = torchrun_argv(ranks, tail, python) if ranks > 1 else [python, *tail]
        env = launch_env({"PYTHONPATH": str(ROOT / "src")})
        if ranks == 1:
            env.pop("OMP_NUM_THREADS")  # one process may use both cores
        worker_log = out / f"launch-{ranks}-{deepspeed}-{attempt}.log"
        with open(worker_log, "w") as sink:
            proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            seen, last_change, why = len(done), time.monotonic(), None
            while proc.poll() is None:
                time.sleep(1)
                now_done, _ = read_results(results)
                for sid in [s for s in now_done if s not in done]:
                    log(now_done[sid])
                done = now_done
                if len(done) != seen:
                    seen, last_change = len(done), time.monotonic()
                elif time.monotonic() - last_change > timeout:
                    why = f"hung: no result for {timeout:.0f} s"
                    os.killpg(proc.pid, 9)
                    proc.wait()
        done, started = read_results(results)
        if started is not None and started not in done:
            tail_text = worker_log.read_text(errors="replace").splitlines()[-15:]
            setup = next(s for s in todo if space.setup_id(s) == started)
            record = {"id": started, "setup": setup, "status": "failed", "seconds": None,
                      "problems": [why or f"the launch died (exit code {proc.returncode}) in this setup"],
                      "traceback": "\n".join(tail_text)}
            append(results, record)
            log(record)
        elif proc.returncode != 0 and not why:
            raise SystemExit(f"a launch failed before its first setup (exit code {proc.returncode}); its log: "
                             f"{worker_log}")


def summarize(setups: list[dict], done: dict[str, dict], seconds: float, seed: int | None) -> dict:
    """summary.json: the requested setups' verdicts (twins are judged and counted too: they are setups)."""
    records = [done[i] for i in dict.fromkeys(space.setup_id(s) for s in ordered(setups)) if i in done]
    failures = [{"id": r["id"], "setup": r["setup"], "problems": r.get("problems", []),
                 "command": space.command(r["setup"])} for r in records if r["status"] == "failed"]
    refused = [r for r in records if r["status"] == "refused"]
    return {"seed": seed, "setups": len(records), "accepted": len(records) - len(refused), "refused": len(refused),
            "passed": sum(r["status"] == "passed" for r in records), "failed": len(failures),
            "refused_by": dict(Counter(r.get("rule") or "config" for r in refused).most_common()),
            "seconds": round(seconds), "setup_seconds": round(sum(r.get("seconds") or 0 for r in records)),
            "failures": failures, "by_axis": by_axis(records)}


def by_axis(records: list[dict]) -> dict[str, dict[str, dict]]:
    table: dict[str, dict[str, dict]] = {a: defaultdict(lambda: Counter()) for a in space.AXIS_NAMES}
    for r in records:
        for axis in space.AXIS_NAMES:
            row = table[axis][r["setup"][axis]]
            row["setups"] += 1
            row[r["status"]] += 1
            row["seconds"] += r.get("seconds") or 0
            if r["status"] == "refused":
                row["refused:" + (r.get("rule") or "config")] += 1
    return {a: {v: dict(c) for v, c in rows.items()} for a, rows in table.items()}


def render_table(summary: dict) -> str:
    lines = [f"Seed {summary['seed']}: {summary['setups']} setups, {summary['accepted']} accepted, "
             f"{summary['refused']} refused, {summary['passed']} passed, {summary['failed']} failed; "
             f"{summary['seconds']} s of wall time.", ""]
    for axis, rows in summary["by_axis"].items():
        lines += [f"### {axis}", "", "| value | setups | accepted | refused (by rule) | passed | failed | seconds |",
                  "| --- | ---: | ---: | --- | ---: | ---: | ---: |"]
        for value in space.AXES[axis]:
            c = rows.get(value)
            if not c:
                continue
            rules = ", ".join(f"{k.split(':', 1)[1]} {n}" for k, n in sorted(c.items()) if k.startswith("refused:"))
            accepted = c["setups"] - c.get("refused", 0)
            lines.append(f"| {value} | {c['setups']} | {accepted} | {c.get('refused', 0)}"
                         f"{' (' + rules + ')' if rules else ''} | {c.get('passed', 0)} | {c.get('failed', 0)} | "
                         f"{round(c.get('seconds', 0))} |")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--count", type=int, default=500, help="setups at least (the covering set, then random ones)")
    p.add_argument("--out", type=Path, help="results, logs and summary.json; resumed if present (required to run)")
    p.add_argument("--ci", action="store_true", help="the fixed CI slice instead of a seeded sweep")
    p.add_argument("--only", help="one setup as JSON (axis: value; the rest default), or a JSON list of them")
    p.add_argument("--timeout", type=float, default=300, help="seconds without a result before a launch is killed")
    p.add_argument("--table", type=Path, help="write the per-axis table (markdown) to this file")
    p.add_argument("--list", action="store_true", help="print the setups and exit")
    args = p.parse_args()
    if args.only:
        try:
            partials = json.loads(args.only)
        except json.JSONDecodeError as exc:
            p.error(f"--only: not JSON ({exc})")
        partials = partials if isinstance(partials, list) else [partials]
        unknown = [k for partial in partials for k in partial if k not in space.AXES] + \
            [f"{k}={v}" for partial in partials for k, v in partial.items() if k in space.AXES and v not in space.AXES[k]]
        if unknown:
            p.error(f"--only: unknown axis or value {', '.join(unknown)}; axes: "
                    + "; ".join(f"{a}: {', '.join(v)}" for a, v in space.AXES.items()))
        setups, seed = [space.complete(partial) for partial in partials], None
    elif args.ci:
        setups, seed = [space.complete(s) for s in CI_SLICE], None
    else:
        setups, seed = space.generate(args.seed, args.count), args.seed
    if args.list:
        for s in ordered(setups):
            print(space.setup_id(s))
        return 0
    if args.out is None:
        p.error("--out DIR is required (the sweep writes its results there and resumes from them)")
    args.out.mkdir(parents=True, exist_ok=True)
    manifest = args.out / "setups.json"
    if manifest.is_file() and json.loads(manifest.read_text()) != setups:
        raise SystemExit(f"{args.out} holds another sweep's results (other seed, count or slice); give a new --out "
                         "or remove that directory")
    manifest.write_text(json.dumps(setups, indent=0))
    everything = ordered(setups)
    done, _ = read_results(args.out / "results.jsonl")
    total, t0 = len(everything), time.monotonic()
    print(f"{total} setups ({len(setups)} asked, {total - len(setups)} twins), {len(done)} already done in "
          f"{args.out}", flush=True)
    counter = [len([s for s in everything if space.setup_id(s) in done])]

    def log(record: dict) -> None:
        counter[0] += 1
        what = "; ".join(record.get("problems") or []) or record.get("rule") or record.get("message") or ""
        print(f"[{counter[0]}/{total} {time.monotonic() - t0:5.0f} s] {record['status']:8} {record['id']} "
              f"({record.get('seconds')} s) {what[:300]}", flush=True)

    groups: dict[tuple[int, str], list[dict]] = defaultdict(list)
    for s in everything:
        groups[space.launch_key(s)].append(s)
    for key in sorted(groups):
        run_batch(groups[key], key, args.out, args.timeout, log)
    done, _ = read_results(args.out / "results.jsonl")
    walls = args.out / "wall-seconds.json"  # every invocation's wall time: a resumed sweep's total is their sum
    spent = (json.loads(walls.read_text()) if walls.is_file() else []) + [round(time.monotonic() - t0, 1)]
    walls.write_text(json.dumps(spent))
    summary = summarize(setups, done, sum(spent), seed)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    if args.table:
        args.table.write_text(render_table(summary) + "\n")
    print(f"{summary['setups']} setups: {summary['accepted']} accepted, {summary['refused']} refused, "
          f"{summary['passed']} passed, {summary['failed']} failed ({args.out / 'summary.json'})")
    for f in summary["failures"]:
        print(f"FAILED {f['id']}: {'; '.join(f['problems'])[:400]}\n  rerun: {f['command']}")
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
