"""The engine area: which engine runs (parallel.*, the launch), its settings, and what it does to the model, read
from the engine table's capabilities (enginespec.py), never from its name."""

from __future__ import annotations

from typing import Any

from loraflow.config.schema import Config
from loraflow.data.sources import has_eval_set
from loraflow.engines.deepspeed_config import DeepSpeedSettings, deepspeed_settings
from loraflow.enginespec import ENGINES, auto_engine, engine_spec
from loraflow.environment import Environment
from loraflow.errors import ConfigError
from loraflow.plan.context import Context
from loraflow.plan.types import Decision
from loraflow.stagespec import stage_spec


def resolve_engine(config: Config, env: Environment) -> tuple[str, DeepSpeedSettings | None]:
    """The engine from parallel.* and the launch, and, for a ZeRO engine, its settings (stage, offload, the user's
    JSON read and checked: once per run, here). A ConfigError for a contradiction."""
    engine = config.parallel.engine
    if engine == "auto":
        engine = auto_engine(config.parallel, env.world_size)
    spec = engine_spec(engine)
    if not spec.distributed and env.world_size > 1:
        raise ConfigError([f"parallel.engine={engine}, but {env.world_size} processes were launched (WORLD_SIZE="
                           f"{env.world_size}); set parallel.engine to "
                           f"{', '.join(e.name for e in ENGINES.values() if e.distributed and e.runs)}, or launch "
                           "one process."])
    if not spec.zero:
        return engine, None
    return engine, deepspeed_settings(config.parallel)  # pure bf16 under ZeRO: rule bf16-zero-master-weights


def engine_fields(config: Config, engine: str, ds: DeepSpeedSettings | None) -> dict[str, Any]:
    """The Combination fields the engine and the stage's extra forwards decide, before any rule's fix."""
    spec = engine_spec(engine)
    stage = stage_spec(config.stage)
    # Rollouts, and exact-match evaluation, generate with the trained model.
    generates = stage.generates or (stage.eval_generates and has_eval_set(config.data) and config.eval.generate)
    return dict(
        engine=engine, zero_stage=ds.stage if ds else 0,
        offload=bool(ds and (ds.offload_optimizer or ds.offload_params)),
        find_unused_parameters=spec.gradient_reducer and config.parallel.find_unused_parameters == "true",
        # What HF/accelerate do under FSDP2: transformers' layer checkpointing, which encloses the sharded unit.
        checkpoint_outside_shard=spec.checkpoint_outside_shard,
        # loraflow's FSDP2 layout for LoRA (DoRA reads its base weight after the base forward, so it stays in the
        # layer's unit): see engines/fsdp2.py.
        fsdp_frozen_units_separate=config.adapter.method in spec.frozen_units_for,
        generation=generates,
        # Generation and a reference scored through the trained model (zero3-stale-trace); a loss-only evaluation
        # keeps ZeRO-3's trace intact.
        outside_forwards=generates or stage.reference == "always",
        evaluates=has_eval_set(config.data),
        # Chosen and rejected (rm, dpo) go through one concatenated forward; the reference forward runs without
        # autograd, so it leaves nothing for the backward to meet (fsdp2-multi-forward-dtensor).
        forwards_per_step=1,
    )


def checkpoint_in_engine(ctx: Context, layers: list[int], block: str | None) -> bool:
    """Whether the engine applies the layer checkpointing itself, inside its sharded units (FSDP2 when the rules
    moved recompute inside the unit); a sub-block's checkpoint is always inside its layer."""
    s = ctx.setup
    return bool(layers) and bool(s.engine_spec.units) and not s.checkpoint_outside_shard and block is None


def engine_decisions(ctx: Context, deepspeed: DeepSpeedSettings | None, layers: list[int], block: str | None,
                     mixed: bool) -> list[Decision]:
    """The device, the engine and what it does: the global batch, DDP's unused-parameter search, the sharded
    units and where checkpointing sits in them, ZeRO-3's gathers."""
    s, cfg = ctx.setup, ctx.config
    spec, t, n = s.engine_spec, cfg.train, s.world_size
    device = ctx.env.device
    out = [Decision("device", device if n == 1 else f"{device}, {n} processes",
                    "the only device available" if device == "cpu" else "one accelerator per process")]
    asked = f"parallel.engine={cfg.parallel.engine}" + (f" with {n} processes" if n > 1 else "")
    if deepspeed is not None:
        offload = [k for k in ("offload_optimizer", "offload_params") if getattr(deepspeed, k)]
        value = f"DeepSpeed ZeRO-{s.zero_stage}" + (f", {' + '.join(offload)} to cpu" if offload else "")
        why = f"{asked}; stage and offload from {deepspeed.source}"
    else:
        value = spec.description
        why = asked if spec.distributed or cfg.parallel.engine != "auto" else "one process was launched"
    out.append(Decision("engine", value, why))
    if n > 1 or spec.distributed:
        out.append(Decision("global batch", f"{t.micro_batch_size} x {t.gradient_accumulation_steps} x {n} = "
                            f"{t.micro_batch_size * t.gradient_accumulation_steps * n} samples per optimizer step",
                            "train.micro_batch_size per process x train.gradient_accumulation_steps x processes; "
                            "the loss is normalised by the learned tokens of all processes, so the averaged "
                            "gradient equals one process's on the same global batch"))
    if spec.gradient_reducer:
        rule = ctx.rule("find_unused_parameters")
        out.append(Decision("find_unused_parameters", s.find_unused_parameters,
                            "every trainable weight gets a gradient every step, so the search only costs time"
                            if not rule else "the search marks parameters ready twice under reentrant recompute",
                            rule))
    if spec.units:
        out += _units(ctx, layers, block, mixed)
    if s.zero3:
        out.append(Decision("adapter save", "gathers the trainable partitions only", "under ZeRO-3 the module holds "
                            "empty placeholders between uses", ctx.rule("adapter_save_gather")))
        if s.generation:
            out.append(Decision("generation", "weights gathered once per rollout", "generate() would all-gather "
                                "every weight at every token", ctx.rule("generation_gather")))
    if s.dora_weight_gather:
        out.append(Decision("dora weight norm", "reads the gathered base weight", "DoRA reads the base weight after "
                            "ZeRO-3 released it", ctx.rule("dora_weight_gather")))
    return out


def _units(ctx: Context, layers: list[int], block: str | None, mixed: bool) -> list[Decision]:
    """An engine with sharded units: what each unit holds, where checkpointing sits, its mixed precision."""
    s = ctx.setup
    spec = s.engine_spec
    out = [Decision("fsdp units", spec.units + (
        "; the frozen base Linear of every LoRA module in a unit of its own" if s.fsdp_frozen_units_separate else ""),
        "frozen weights never share a gather or gradient buffer with the adapters, so gradient memory is the "
        "adapters' (fsdp-frozen-grad-memory)" if s.fsdp_frozen_units_separate else
        "full fine-tuning trains every weight" if s.adapter == "full" else
        "DoRA reads its base weight after the base forward, so the base stays gathered with its layer")]
    if block:
        out.append(Decision("checkpoint placement", f"inside each layer's sharded unit (torch checkpoint around its "
                            f"`{block}` sub-block)", "a sub-block is inside its layer, so FSDP2's "
                            "gather and casts in the layer's unit stay outside the recompute",
                            ctx.rule("checkpoint_outside_shard")))
    elif layers:
        rule = ctx.rule("checkpoint_outside_shard")
        where = "outside each sharded unit (transformers' layer checkpointing)" if s.checkpoint_outside_shard \
            else "inside each sharded unit (torch checkpoint around the layer's forward, under FSDP2's hooks)"
        out.append(Decision("checkpoint placement", where, "recompute outside the unit skips FSDP2's mixed-precision "
                            "cast on this torch" if rule else "this torch recomputes correctly either way; "
                            "transformers' own mechanism is the default", rule))
    if mixed and spec.mixed_precision:
        out.append(Decision("fsdp mixed precision", spec.mixed_precision,
                            "precision.mode=bf16-mixed: bf16 compute, fp32 gradient reduction and sharded fp32 "
                            "trainable weights"))
    return out
