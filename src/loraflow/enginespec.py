"""The engine table: every engine loraflow runs, declared once.

Each engine states its name, the class that implements it (engines/), how the plan describes it, whether it needs
a process group, and the parallel.* keys that belong to it (the config refuses them under another engine). The
config schema, the launch decision, the plan's reasons and `build_engine` read this table. Adding an engine is one
entry here, its module in engines/, its rules in the registry and its tests.

Like stagespec.py this sits at the bottom of the house and imports nothing of loraflow.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineSpec:
    name: str
    implementation: str
    """`module:Class` of the Engine subclass."""
    description: str
    """What it does, for the plan: `engine  <description>`."""
    distributed: bool = True
    """Runs in a process group (even with one process)."""
    keys: tuple[str, ...] = ()
    """parallel.* keys that only this engine reads."""


ENGINES: dict[str, EngineSpec] = {e.name: e for e in (
    EngineSpec("single", "loraflow.engines.base:SingleEngine", "one process", distributed=False),
    EngineSpec("ddp", "loraflow.engines.ddp:DDPEngine", "DDP (replicated weights, all-reduced gradients)",
               keys=("find_unused_parameters",)),
    EngineSpec("deepspeed", "loraflow.engines.deepspeed:DeepSpeedEngine", "DeepSpeed ZeRO",
               keys=("zero_stage", "deepspeed_config", "offload_optimizer", "offload_params")),
    EngineSpec("fsdp2", "loraflow.engines.fsdp2:FSDP2Engine", "FSDP2 fully_shard (every parameter sharded)",
               keys=("fsdp_reshard_after_forward",)),
)}

ENGINE_NAMES: tuple[str, ...] = tuple(ENGINES)


def engine_spec(name: str) -> EngineSpec:
    return ENGINES[name]


def engine_class(name: str) -> type:
    """The Engine subclass that runs `name`."""
    import importlib

    module, cls = ENGINES[name].implementation.split(":")
    return getattr(importlib.import_module(module), cls)


def wants_process_group(engine: str, world_size: int) -> bool:
    """Whether a run joins a process group: several processes were launched, or parallel.engine names a
    distributed engine (which also runs in one process). Decided before the plan exists, from the config's
    parallel.engine (`auto` included) and the launcher's WORLD_SIZE."""
    return world_size > 1 or (engine != "auto" and ENGINES[engine].distributed)
