"""The steps of the device check (scripts/gpu_check.sh; the runner is verify/devicecheck.py). Each runs in a process
of its own, bounded by the runner's timeout, and returns a record: `status` (pass / fail), a one-line `headline`
for the summary table, and its figures. Full size on a GPU; `quick` is the same step at tiny sizes (the CPU
rehearsal the test suite runs)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def _cli(args: list[str], log: Path) -> tuple[int, str]:
    """`loraflow ARGS` as a user runs it (in a child process, bounded by the runner's timeout), its output appended
    to `log`; (exit code, output)."""
    proc = subprocess.run([sys.executable, "-m", "loraflow.commands.cli", *args], capture_output=True, text=True,
                          check=False)
    with open(log, "a", encoding="utf-8") as sink:
        sink.write(f"$ loraflow {' '.join(args)}\n{proc.stdout}{proc.stderr}\n(exit {proc.returncode})\n")
    return proc.returncode, proc.stdout + proc.stderr


def _tail(text: str, lines: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


# -- env ------------------------------------------------------------------------------------------------------------
def env(ctx: dict[str, Any]) -> dict[str, Any]:
    """Versions, the device, and what its matmuls deliver in bf16 and fp32."""
    import torch

    import loraflow
    from loraflow.environment import too_old

    code, version = _cli(["--version"], ctx["log"])
    cuda = torch.cuda.is_available()
    figures: dict[str, Any] = {"loraflow_version": version.strip(), "loraflow_path": loraflow.__file__,
                               "python": platform.python_version(),
                               "torch": torch.__version__, "cuda": torch.version.cuda, "device": ctx["device"]}
    if cuda:
        props = torch.cuda.get_device_properties(0)
        figures.update(device_name=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                       multiprocessors=props.multi_processor_count, cudnn=torch.backends.cudnn.version(),
                       tf32_matmul=torch.backends.cuda.matmul.allow_tf32, driver=_driver())
    else:
        figures["device_name"] = _cpu_name()
        figures["cpu_threads"] = torch.get_num_threads()
    sys.path.insert(0, str(ctx["root"] / "benchmarks"))
    from peers_figures import matmul_rate, nominal_peak

    size = 8192 if cuda else (512 if ctx["quick"] else 2048)
    for dtype in ("bfloat16", "float32"):
        figures[f"{dtype}_matmul_tflops"] = round(matmul_rate("cuda" if cuda else "cpu", dtype, size) / 1e12, 3)
    if cuda and nominal_peak(figures["device_name"]):
        figures["datasheet_bf16_tflops"] = nominal_peak(figures["device_name"]) / 1e12
    figures["too_old"] = too_old()
    wrong_device = ctx["device"] == "cuda" and not cuda
    ok = code == 0 and not figures["too_old"] and not wrong_device
    headline = (f"{figures['device_name']}; torch {figures['torch']}"
                + (f", CUDA {figures['cuda']}" if cuda else "") + f"; bf16 matmul {figures['bfloat16_matmul_tflops']:.3g}"
                f" TFLOP/s (size {size}), fp32 {figures['float32_matmul_tflops']:.3g}")
    if figures["too_old"]:
        headline += "; too old: " + "; ".join(figures["too_old"])
    return {"status": "pass" if ok else "fail", "headline": headline, "figures": figures}


def _driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=False).stdout.strip()
        return out or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip() + f" ({os.cpu_count()} CPUs)"
    except OSError:
        pass
    return platform.processor() or "cpu"


# -- grads ----------------------------------------------------------------------------------------------------------
def grads(ctx: dict[str, Any]) -> dict[str, Any]:
    from loraflow.verify import device_grads

    def log(text: str) -> None:
        with open(ctx["log"], "a", encoding="utf-8") as sink:
            sink.write(text + "\n")

    return device_grads.run(ctx["work"] / "grads", log)


# -- peers ----------------------------------------------------------------------------------------------------------
QUICK_SHAPE = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
               "intermediate_size": 256, "vocab_size": 2000}
"""The quick mode's model: the gpu-1b preset's structure (grouped-query attention, tied embeddings) at toy size."""


def peers(ctx: dict[str, Any]) -> dict[str, Any]:
    """benchmarks/peers.py side by side: loraflow, the plain loop and TRL (the gpu-1b preset, or its toy version)."""
    out = ctx["dir"] / "peers.bench.json"
    argv = [sys.executable, str(ctx["root"] / "benchmarks" / "peers.py"), "--preset", "gpu-1b", "--json", str(out),
            "--timeout", str(ctx["peers_worker_timeout"])]
    if ctx["quick"]:
        argv += ["--shape", json.dumps(QUICK_SHAPE), "--cells", "64x2:on", "--steps", "2"]
    from loraflow.engines.launch import run_isolated

    # Stopped (with its workers) a little before the runner's own kill, so the cells measured so far are reported.
    code = run_isolated(argv, ctx["dir"] / "peers.bench.log", max(10.0, ctx["deadline"] - time.time() - 15),
                        env=dict(os.environ))
    if not out.exists():
        return {"status": "fail", "headline": f"benchmarks/peers.py {'timed out' if code is None else f'exited {code}'}"
                                              " before measuring a cell"}
    report = json.loads(out.read_text())
    parts, figures = [], {}
    if report.get("partial"):
        parts.append("stopped at the step's time limit after " + ", ".join(report["cells"]))
    for name, cell in report["cells"].items():
        lf = cell.get("loraflow", {})
        if "error" in lf:
            parts.append(f"{name}: loraflow failed ({lf['error']})")
            continue
        speed = {v: cell[v].get("median_s") for v in ("plain", "trl") if "error" not in cell[v]}
        vs = ", ".join(f"{lf['median_s'] and s / lf['median_s']:.2f}x {v}" for v, s in speed.items() if s)
        text = f"{name}: {lf.get('tokens_per_s', 0):,.0f} tok/s ({vs or 'peers failed'})"
        if lf.get("mfu_nominal") or lf.get("mfu"):
            text += f", MFU {100 * (lf.get('mfu_nominal') or lf['mfu']):.1f}%"
        if "cuda_max_memory_mb" in lf:
            text += f", {lf['cuda_max_memory_mb'] / 1024:.1f} GiB"
        parts.append(text)
        figures[name] = {v: {k: cell[v].get(k) for k in ("median_s", "tokens_per_s", "mfu", "mfu_nominal",
                                                            "cuda_max_memory_mb", "peak_rss_mb", "first_loss",
                                                            "error")} for v in ("plain", "trl", "loraflow")}
        if cell["problems"]:
            parts.append(f"{name} NOT COMPARABLE")
    return {"status": "pass" if code == 0 and not report.get("partial") else "fail", "headline": "; ".join(parts),
            "figures": figures}


# -- head -----------------------------------------------------------------------------------------------------------
def head(ctx: dict[str, Any]) -> dict[str, Any]:
    """benchmarks/head_chunks.py: the output head alone, the plain loop's full logits against loraflow's chunks at
    several sizes (where the peers step's gap to the plain loop may come from)."""
    out = ctx["dir"] / "head.bench.json"
    argv = [sys.executable, str(ctx["root"] / "benchmarks" / "head_chunks.py"), "--device", ctx["device"],
            "--json", str(out)]
    if ctx["quick"]:
        argv += ["--quick", "--repeats", "2", "--rounds", "1"]
    from loraflow.engines.launch import run_isolated

    code = run_isolated(argv, ctx["dir"] / "head.bench.log", max(10.0, ctx["deadline"] - time.time() - 5),
                        env=dict(os.environ))
    if code != 0 or not out.exists():
        return {"status": "fail", "headline": f"benchmarks/head_chunks.py {'timed out' if code is None else code}"}
    report = json.loads(out.read_text())
    rows = report["results"]
    best = max(rows[1:], key=lambda r: r["x_full"])
    worst_err = max(r["grad_rel_err"] for r in rows)
    text = (f"full {rows[0]['median_ms']:.1f} ms; {rows[1]['variant']} {rows[1]['median_ms']:.1f} ms "
            f"({rows[1]['x_full']:.2f}x full); best {best['variant']} {best['median_ms']:.1f} ms "
            f"({best['x_full']:.2f}x); grad err <= {worst_err:.1e}")
    # bf16 logits round differently from loraflow's float32 softmax: agreement within a few percent is the check
    return {"status": "pass" if worst_err < 0.05 else "fail", "headline": text, "figures": report}


# -- the demo, the QLoRA example, one image-text step -------------------------------------------------------------
def _train(ctx: dict[str, Any], name: str, args: list[str]) -> tuple[int, str, dict[str, Any], Path]:
    run_dir = ctx["work"] / name
    code, output = _cli(["train", "sft", *args, f"output.dir={run_dir}", "output.progress_bar=false"], ctx["log"])
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    return code, output, summary, run_dir


def _trained(ctx: dict[str, Any], name: str, args: list[str], floor: float, quick_steps: int) -> dict[str, Any]:
    """A shipped config end to end: full size must reach `floor` exact match (as its test requires); quick runs
    `quick_steps` steps and must lower the eval loss."""
    if ctx["quick"]:
        args = [*args, f"train.max_steps={quick_steps}", "train.warmup_steps=2", "output.log_every_steps=5",
                "eval.max_samples=24"]
    t0 = time.perf_counter()
    code, output, summary, _ = _train(ctx, name, args)
    seconds = time.perf_counter() - t0
    before, after = summary.get("before") or {}, summary.get("after") or {}
    if code != 0 or not after:
        return {"status": "fail", "headline": f"exit {code}: {_tail(output, 3)}", "figures": {"exit": code}}
    figures = {"before": before, "after": after, "steps": summary.get("steps"), "seconds": round(seconds, 1),
               "train_seconds": summary.get("train_seconds")}
    em = f"exact match {before.get('exact_match', 0):.2f} -> {after.get('exact_match', 0):.2f}"
    loss = f"eval loss {before.get('loss', 0):.3f} -> {after.get('loss', 0):.3f}"
    if ctx["quick"]:
        ok = after.get("loss", 1e9) < before.get("loss", 0)
        return {"status": "pass" if ok else "fail", "figures": figures,
                "headline": f"{summary.get('steps')} steps (quick): {loss}, {em}"}
    ok = after.get("exact_match", 0) >= floor
    return {"status": "pass" if ok else "fail", "figures": figures,
            "headline": f"{em} (>= {floor:.2f}), {loss}; {summary.get('steps')} steps in "
                        f"{summary.get('train_seconds', 0):.0f} s"}


def demo(ctx: dict[str, Any]) -> dict[str, Any]:
    """The embedded default of `loraflow train sft` (tests/test_demo.py requires 0.80)."""
    return _trained(ctx, "demo", [], 0.80, quick_steps=20)


def qlora(ctx: dict[str, Any]) -> dict[str, Any]:
    """examples/sft-qlora.yaml: the demo on an NF4 base (tests/test_qlora_demo.py requires 0.80)."""
    return _trained(ctx, "qlora", [str(ctx["root"] / "examples" / "sft-qlora.yaml")], 0.80, quick_steps=10)


def vision(ctx: dict[str, Any]) -> dict[str, Any]:
    """One optimizer step of examples/sft-vision.yaml (MiniCPM-V's towers, every tower checkpointed); on CUDA
    also in bf16-mixed, as image-text models are trained there."""
    precisions = ["fp32", "bf16-mixed"] if ctx["device"] == "cuda" else ["fp32"]
    parts, figures, ok = [], {}, True
    for precision in precisions:
        code, output, _, run_dir = _train(ctx, f"vision-{precision}", [
            str(ctx["root"] / "examples" / "sft-vision.yaml"), "train.max_steps=1", "data.eval=",
            f"precision.mode={precision}", "output.log_every_steps=1"])
        losses = [r["loss"] for r in _metrics(run_dir) if r.get("kind") == "train"]
        good = code == 0 and len(losses) == 1 and losses[0] == losses[0]  # finite (NaN != NaN)
        ok &= good
        figures[precision] = {"exit": code, "loss": losses[0] if losses else None}
        parts.append(f"{precision}: " + (f"1 step, loss {losses[0]:.3f}" if good else
                                         f"failed (exit {code}): {_tail(output, 2)}"))
    return {"status": "pass" if ok else "fail", "headline": "; ".join(parts), "figures": figures}


def rollout(ctx: dict[str, Any]) -> dict[str, Any]:
    """GRPO with its rollouts on a local vLLM engine (rl.rollout.engine=vllm), where vLLM is installed: every step's
    engine/trainer log-prob difference within the plan's bound, and the bytes per sync (the adapter's on a GPU; a CPU
    engine gets merged weights, rl.rollout.sync=auto weighing its slow LoRA path). Where vLLM is not
    installed the step says so and does not count as a failure."""
    from loraflow.rl.vllm_server import EngineError, find_vllm_python

    try:
        python = find_vllm_python()
    except EngineError as exc:
        return {"status": "unavailable", "figures": {},
                "headline": "vLLM is not installed here, so the vLLM rollout path was not run: " + str(exc)[:160]}
    run_dir = ctx["work"] / "rollout"
    steps = 3 if ctx["quick"] else 10
    code, output = _cli(["train", "grpo", "rl.rollout.engine=vllm", f"train.max_steps={steps}", "data.eval=",
                         "output.log_every_steps=1", f"output.dir={run_dir}", "output.progress_bar=false"], ctx["log"])
    rows = [r for r in _metrics(run_dir) if r.get("kind") == "train"]
    if code != 0 or len(rows) != steps:
        return {"status": "fail", "headline": f"exit {code}: {_tail(output, 3)}", "figures": {"exit": code}}
    # The run itself stops on a difference beyond the plan's bound (rule vllm-stale-policy): exit 0 means every
    # sync was within it.
    worst = max(r["rollout/logprob_diff_max"] for r in rows)
    sync = next((line.split()[2].rstrip(":") for line in output.splitlines()
                 if line.strip().startswith("rollout sync ")), "?")
    figures = {"vllm_python": python, "steps": steps, "logprob_diff_max": worst, "sync": sync,
               "sync_bytes": rows[-1]["rollout/sync_bytes"], "tokens_per_s": rows[-1]["tokens_per_s"]}
    ok = all(r["rollout/policy_version"] == r["step"] for r in rows)
    return {"status": "pass" if ok else "fail", "figures": figures,
            "headline": f"{steps} GRPO steps on vLLM: engine/trainer log-probs within {worst:.1e}, "
                        f"{rows[-1]['rollout/sync_bytes']:,.0f} bytes per {sync} sync"}


def _metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


STEPS = {"env": env, "grads": grads, "demo": demo, "qlora": qlora, "vision": vision, "rollout": rollout,
         "head": head, "peers": peers}
"""Run order: the short steps first, so a slow benchmark cannot crowd them out of the time budget."""
