"""Live reproductions of the rollout-engine rules (rules/catalog_rollout.py) on a real vLLM server.

The trainer is the GRPO demo's, built by build_run as `loraflow train grpo` builds it (smaller steps, see SMALL),
with rl.rollout.urls naming one of the shared servers of probes/vllm_servers.py: vLLM with its defaults for a naive
setup (raw log-probs, --max-lora-rank 16), loraflow's server for the plan's (processed log-probs, the plan's rank).
The silent rules are judged by what the run's own check measures after each sync: the largest difference between
the engine's and the trainer's log-probability of a sampled token, against the precision's bound. A naive setup runs
without the check (as other frameworks do: rl.rollout.max_logprob_diff set out of reach), so the difference is
measured and reported instead of stopping the run.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path

from loraflow.probes.base import Context, Observation, case
from loraflow.probes.vllm_servers import DEFAULT, ENV, LORAFLOW, Served
from loraflow.rules.combination import Combination

ROLLOUT = Combination(adapter="lora", matched_modules=14, generation=True, rollout_engine="vllm",
                      rollout_sync="adapter", adapter_rank=16)
"""GRPO of the demo's rank-16 LoRA with rollouts on vLLM and adapter sync; nothing else set."""
SERVERS = (DEFAULT, LORAFLOW)
SMALL = ("rl.group_size=4", "train.micro_batch_size=2", "rl.max_new_tokens=8", "train.warmup_steps=0")
"""Steps of 2 prompts x 4 completions of 8 tokens (about a second each here): enough for rewards to differ within a
group, so that the first update, at the full learning rate, moves the policy."""
UNCHECKED = 1e9
"""rl.rollout.max_logprob_diff of a setup without the check: nothing stops the run, the difference is measured."""
TEMPERATURE = 0.7
"""Where vllm-raw-logprobs samples: below 1, raw and processed log-probs differ (at 1 they are the same)."""


def server_for(setup: Combination) -> tuple[str, str]:
    """(url, base) of the shared server started with the flags the setup names."""
    from loraflow.plan import DEFAULT_MAX_LORA_RANK

    served = Served.from_env()
    kind = LORAFLOW if setup.rollout_logprobs_processed else DEFAULT
    if kind == DEFAULT and setup.engine_max_lora_rank != DEFAULT_MAX_LORA_RANK:
        raise ValueError(f"no shared server has raw log-probs and --max-lora-rank {setup.engine_max_lora_rank}")
    if kind not in served.urls:
        raise RuntimeError(f"no {kind} server named in {ENV}: rollout cases run through the probe runner "
                           "(run_probes, run_case), which starts the servers they name")
    return served.urls[kind], served.base


@contextlib.contextmanager
def grpo_run(setup: Combination, ctx: Context, *overrides: str) -> Iterator:
    """The GRPO demo's trainer for the setup, on its server's base; its adapters leave the server at the end."""
    from loraflow.config import load_config
    from loraflow.environment import detect_environment
    from loraflow.run.config import demo_config
    from loraflow.run.pipeline import build_run

    url, base = server_for(setup)
    unchecked = [] if setup.rollout_verified else [f"rl.rollout.max_logprob_diff={UNCHECKED}"]
    config = load_config(str(demo_config("grpo")), [
        "stage=grpo", "data.eval=", f"model.path={base}", "model.merge_adapters=[]", f"adapter.method={setup.adapter}",
        f"adapter.rank={setup.adapter_rank}", f"rl.rollout.urls=[{url}]", f"rl.rollout.sync={setup.rollout_sync}",
        *unchecked, *SMALL, f"output.dir={ctx.workdir}", "output.progress_bar=false", "output.tensorboard=false",
        *overrides])
    trainer = build_run(config, detect_environment(), Path(ctx.workdir)).trainer
    try:
        yield trainer
    finally:
        trainer.hooks.finish()  # the stage's RolloutWorker.close: unloads the run's adapter from the server


def steps(trainer, n: int) -> dict[str, float]:
    """n optimizer steps as the loop takes them (each: sync, sample on the engine, compare, update); the last
    step's statistics."""
    for _ in range(n):
        stats = trainer.optimizer_step(None)
    return stats


def compared(trainer, stats: dict[str, float], what: str) -> Observation:
    """The engine/trainer log-prob difference of the step's sampled tokens against the precision's bound."""
    from loraflow.plan import LOGPROB_BOUNDS

    bound = LOGPROB_BOUNDS[trainer.plan.config.precision.mode]
    worst, mean = stats["rollout/logprob_diff_max"], stats["rollout/logprob_diff_mean"]
    values = {"logprob_diff_max": worst, "logprob_diff_mean": mean, "bound": bound}
    if worst > bound:
        return Observation("wrong", f"no error raised, but {what}: the engine's log-probs of its sampled tokens differ "
                                    f"from the trainer's by up to {worst:.3g} (mean {mean:.2g}), beyond the bound "
                                    f"{bound:g} loraflow's check stops a run at", values)
    return Observation("ok", f"{what}: the engine's log-probs of its sampled tokens match the trainer's within "
                             f"{worst:.1e} (bound {bound:g})", values)


def refusal(exc: Exception, rule_id: str) -> Observation:
    """vLLM's own message (the error body's `message`) when it is one of the rule's log signs: the failure under
    study. Any other failure is the probe's own (a server that went away, a changed API), not a reproduction."""
    from loraflow.rules import get_rule

    text = str(exc)
    found = re.search(r'"message":\s*"((?:[^"\\]|\\.)*)"', text)
    message = found.group(1) if found else text
    if any(re.search(sign.pattern, message) for sign in get_rule(rule_id).log.messages):
        return Observation("error", f"vLLM refused the adapter: {message}")
    return Observation("failed", f"vLLM failed otherwise than {rule_id} says: {text[:300]}")


# -- vllm-stale-policy --------------------------------------------------------------------------------------------

def hand_initial_adapter(trainer) -> None:
    """The naive sync: every version is loaded from the first version's directory, written before any update (B = 0:
    the frozen base), as verl's async LoRA path handed its engine only the base for a whole run."""
    er = trainer.hooks.finish.__self__.engine_rollouts  # the stage's RolloutWorker holds the engine side

    def load(version: int) -> None:
        for client in er.clients:
            client.load_adapter(er.name(version), er._version_dir(1))
            if version > 1:
                client.unload_adapter(er.name(version - 1))

    er._load = load


@case("vllm-stale-policy", ROLLOUT, servers=SERVERS)
def stale_sync(setup: Combination, ctx: Context) -> Observation:
    """two GRPO steps with rollouts on vLLM: naive, each sync hands the engine the initial adapter (the frozen base)
    again, unchecked; plan, loraflow's adapter sync. Engine vs trainer log-probs after the first update"""
    with grpo_run(setup, ctx) as trainer:
        if not setup.rollout_verified:
            hand_initial_adapter(trainer)
        stats = steps(trainer, 2)
        what = "after one update, synced by loraflow" if setup.rollout_verified else "after one update, stale sync"
        return compared(trainer, stats, what)


# -- vllm-max-lora-rank ---------------------------------------------------------------------------------------------

@case("vllm-max-lora-rank", ROLLOUT.replace(adapter_rank=32), servers=SERVERS)
def rank_32_adapter(setup: Combination, ctx: Context) -> Observation:
    """one GRPO step of a rank-32 LoRA with rollouts on vLLM: its adapter synced to a server started without
    --max-lora-rank (vLLM's 16), or with the rank the plan picks"""
    from loraflow.rl.vllm_server import EngineError

    with grpo_run(setup, ctx) as trainer:
        try:
            stats = steps(trainer, 1)
        except EngineError as exc:
            return refusal(exc, "vllm-max-lora-rank")
        seen = compared(trainer, stats, f"the rank-{setup.adapter_rank} adapter loaded by a server with "
                                        f"--max-lora-rank {setup.engine_max_lora_rank} and sampled")
    seen.values["max_lora_rank"] = float(setup.engine_max_lora_rank)
    return seen


# -- vllm-raw-logprobs ----------------------------------------------------------------------------------------------

@case("vllm-raw-logprobs", ROLLOUT, servers=SERVERS)
def logprobs_at_temperature(setup: Combination, ctx: Context) -> Observation:
    """one GRPO step with rollouts on vLLM at temperature 0.7: the engine's log-probs of its samples (raw from a
    default server, processed from loraflow's) vs the trainer's at that temperature"""
    with grpo_run(setup, ctx, f"rl.temperature={TEMPERATURE}") as trainer:
        mode = "processed" if setup.rollout_logprobs_processed else "raw"
        return compared(trainer, steps(trainer, 1), f"{mode} log-probs at temperature {TEMPERATURE}")


# -- vllm-adapter-unservable ----------------------------------------------------------------------------------------

@case("vllm-adapter-unservable", ROLLOUT.replace(adapter="dora"), servers=SERVERS)
def dora_policy(setup: Combination, ctx: Context) -> Observation:
    """a DoRA policy for GRPO with rollouts on vLLM: naive, its PEFT adapter loaded as a LoRA adapter; plan, two
    steps with merged sync (the served base put back afterwards)"""
    from loraflow.rl.vllm_server import Client, EngineError

    url, base = server_for(setup)
    if setup.rollout_sync == "adapter":
        with grpo_run(setup, ctx) as trainer:
            adapter = Path(ctx.workdir) / "dora-adapter"
            trainer.engine.module.save_pretrained(adapter)  # what a framework without merged sync hands vLLM
        try:
            Client(url).load_adapter("probe-dora", adapter)
        except EngineError as exc:
            return refusal(exc, "vllm-adapter-unservable")
        Client(url).unload_adapter("probe-dora")
        return Observation("ok", "vLLM loaded the DoRA adapter as a LoRA adapter")
    try:
        with grpo_run(setup, ctx) as trainer:
            return compared(trainer, steps(trainer, 2), "after one update, merged sync")
    finally:
        Client(url).reload_weights(Path(base))  # the other cases (and the test session) start from this base
