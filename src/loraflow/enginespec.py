"""The engine table: every engine loraflow runs or `check` describes, declared once, by what it does.

Each engine states its name, the class that implements it (engines/; None for an engine only other frameworks run,
which `check` reasons about), how the plan describes it, whether it needs a process group, the parallel.* keys that
belong to it, and its capabilities: what it shards and from which ZeRO stage, how its sharded units treat
checkpointing and frozen weights, what its parameters are (FSDP1's flat parameters, FSDP2's DTensors). The plan, the
rules (through Combination), the plan's reasons and the harnesses read these fields; nothing outside this module
compares an engine's name. Adding an engine is one entry here, its module in engines/, and its tests.

Like stagespec.py this sits at the bottom of the house and imports nothing of loraflow.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineSpec:
    name: str
    implementation: str | None
    """`module:Class` of the Engine subclass; None: loraflow does not run it (`check` describes other frameworks'
    runs on it)."""
    description: str
    """What it does, for the plan: `engine  <description>`."""
    distributed: bool = True
    """Runs in a process group (even with one process)."""
    keys: tuple[str, ...] = ()
    """parallel.* keys that only this engine reads (the config refuses them under another engine)."""
    chosen_by: tuple[str, ...] = ()
    """parallel.* keys whose setting chooses this engine under parallel.engine=auto."""
    zero: bool = False
    """Configured by a ZeRO stage, offload switches and a DeepSpeed JSON (engines/deepspeed_config.py)."""
    shard_stage: int | None = None
    """Parameters live as shards between uses from this ZeRO stage on (0: always); None: never sharded."""
    optimizer_shard_stage: int | None = None
    """Optimizer state (and its master weights) is partitioned from this ZeRO stage on (0: always)."""
    flat_params: bool = False
    """Each sharded unit's parameters are one flat tensor (FSDP1's FlatParameter): one dtype and one requires_grad
    per unit unless use_orig_params."""
    dtensor_params: bool = False
    """Each parameter is its own sharded DTensor, gathered and cast by the unit's hooks (FSDP2)."""
    gradient_reducer: bool = False
    """Gradients are all-reduced in buckets by a reducer that expects a gradient of every trainable parameter each
    step; find_unused_parameters makes it search for the missing ones (DDP)."""
    checkpoint_outside_shard: bool = False
    """Where layer checkpointing goes by default relative to the sharded unit: outside it (transformers' layer
    checkpointing encloses the unit, as HF and accelerate do under FSDP2)."""
    frozen_units_for: tuple[str, ...] = ()
    """Adapter methods under which each frozen base Linear is a sharded unit of its own (engines/fsdp2.py): DoRA
    reads its base weight after the base forward, so its base stays in the layer's unit."""
    units: str = ""
    """How the model is split into sharded units, for the plan ('' where the engine has none)."""
    mixed_precision: str = ""
    """The engine's own mixed-precision policy under bf16-mixed, for the plan ('' where autocast alone casts)."""
    needs: tuple[str, ...] = ()
    """Optional packages the engine imports (a pyproject.toml extra installs each): the plan refuses the engine
    before any model loads where one is missing (plan/packages.py)."""

    @property
    def runs(self) -> bool:
        """Whether loraflow runs this engine (parallel.engine may name it)."""
        return self.implementation is not None

    def shards_params(self, zero_stage: int = 0) -> bool:
        return self.shard_stage is not None and zero_stage >= self.shard_stage

    def shards_optimizer(self, zero_stage: int = 0) -> bool:
        return self.optimizer_shard_stage is not None and zero_stage >= self.optimizer_shard_stage


ENGINES: dict[str, EngineSpec] = {e.name: e for e in (
    EngineSpec("single", "loraflow.engines.base:SingleEngine", "one process", distributed=False),
    EngineSpec("ddp", "loraflow.engines.ddp:DDPEngine", "DDP (replicated weights, all-reduced gradients)",
               keys=("find_unused_parameters",), gradient_reducer=True),
    EngineSpec("deepspeed", "loraflow.engines.deepspeed:DeepSpeedEngine", "DeepSpeed ZeRO",
               keys=("zero_stage", "deepspeed_config", "offload_optimizer", "offload_params"),
               chosen_by=("zero_stage", "deepspeed_config", "offload_optimizer", "offload_params"),
               zero=True, shard_stage=3, optimizer_shard_stage=1, needs=("deepspeed",)),
    EngineSpec("fsdp2", "loraflow.engines.fsdp2:FSDP2Engine", "FSDP2 fully_shard (every parameter sharded)",
               keys=("fsdp_reshard_after_forward",), shard_stage=0, optimizer_shard_stage=0, dtensor_params=True,
               checkpoint_outside_shard=True, frozen_units_for=("lora",), units="each decoder layer, then the root",
               mixed_precision="param_dtype bfloat16, reduce_dtype float32"),
    EngineSpec("fsdp1", None, "FSDP (FullyShardedDataParallel, flat parameters)", shard_stage=0,
               optimizer_shard_stage=0, flat_params=True),
)}

ENGINE_NAMES: tuple[str, ...] = tuple(n for n, e in ENGINES.items() if e.runs)
"""The engines parallel.engine may name."""

AUTO_SINGLE, AUTO_MANY = "single", "ddp"
"""parallel.engine=auto without another engine's keys: one process, or replicas when several were launched."""


def engine_spec(name: str) -> EngineSpec:
    return ENGINES[name]


def engine_class(name: str) -> type:
    """The Engine subclass that runs `name`."""
    import importlib

    module, cls = ENGINES[name].implementation.split(":")
    return getattr(importlib.import_module(module), cls)


def auto_engine(parallel, world_size: int) -> str:
    """The engine parallel.engine=auto means: the engine whose own keys the config sets (a ZeRO stage, a DeepSpeed
    JSON, an offload), else one process or DDP by the number launched. `parallel` is the config's parallel
    section."""
    for spec in ENGINES.values():
        if spec.runs and choosing_keys(spec, parallel):
            return spec.name
    return AUTO_MANY if world_size > 1 else AUTO_SINGLE


def choosing_keys(spec: EngineSpec, parallel) -> list[str]:
    """The parallel.* keys the config sets (`key=value`) that choose `spec` under parallel.engine=auto."""
    return [f"parallel.{k}={getattr(parallel, k)}" for k in spec.chosen_by
            if getattr(parallel, k) not in (None, "", "auto", "false")]


def wants_process_group(engine: str, world_size: int) -> bool:
    """Whether a run joins a process group: several processes were launched, or parallel.engine names a
    distributed engine (which also runs in one process). Decided before the plan exists, from the config's
    parallel.engine (`auto` included) and the launcher's WORLD_SIZE."""
    return world_size > 1 or (engine != "auto" and ENGINES[engine].distributed)


@dataclass(frozen=True)
class Variant:
    """A named engine setting the verification harnesses run (cross-check cells, the sweep, the matrix)."""
    engine: str
    zero_stage: int | None = None
    offload: bool = False


VARIANTS: dict[str, Variant] = {
    "single": Variant("single"), "ddp": Variant("ddp"),
    **{f"zero{s}": Variant("deepspeed", s) for s in range(4)},
    "zero3-offload": Variant("deepspeed", 3, offload=True),
    "fsdp2": Variant("fsdp2"),
}
"""Harness name -> engine setting: `zeroN[-offload]` is DeepSpeed at ZeRO stage N (offloading optimizer and
parameters to the CPU); the other names are engines of the table."""

SHARD_UNIT = "_loraflow_shard_unit"
"""The attribute by which setup marks, in order, the modules an engine with sharded units (`units` above) shards
(setup/units.py): the engine shards what setup found, without knowing transformers' or a tower's layout."""
