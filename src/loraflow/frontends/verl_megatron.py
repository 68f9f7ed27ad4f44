"""verl's Megatron workers: `python3 -m verl.trainer.main_ppo --config-path=config
--config-name='ppo_megatron_trainer.yaml' ...` (verl's own examples/*_megatron*.sh), or
`actor_rollout_ref.actor.strategy=megatron` over the FSDP config.

verl/trainer/config/ppo_megatron_trainer.yaml sets `actor_rollout_ref.actor.strategy: megatron` (and the ref's, the
critic's and the reward model's) at every release that ships it (v0.2 on), so a launch that names it runs
verl/workers/megatron_workers.py, not the FSDP workers whose defaults the rest of verl.py reads. Megatron-Core's tensor
and pipeline parallel model, its own recompute (`megatron.override_transformer_config.recompute_*`), precision and
distributed optimizer are not an engine loraflow check models: as for NeMo-RL's Megatron policy (nemo_rl.py), the
stage, the adapter, the world size and the model are read, and the `*.megatron.*` keys are named in a note rather than
listed as unread. LoRA on these workers is Megatron-Bridge's (`actor_rollout_ref.model.lora.rank`, with
`actor.megatron.use_mbridge=True`: examples/grpo_trainer/run_qwen2-7b_math_megatron_lora.sh, "Need to install
Megatron-Bridge" in run_qwen3moe-30b_megatron_lora.sh), never PEFT.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loraflow.frontends.common import Draft, int_value

CONFIG = "ppo_megatron_trainer"
STRATEGY = "actor_rollout_ref.actor.strategy"
LORA_RANK = "actor_rollout_ref.model.lora.rank"
_LORA = "actor_rollout_ref.model.lora."


def config_defaults(config_name: str) -> dict[str, tuple[Any, str]]:
    """What a `--config-name` that is not on this machine sets, when it is verl's Megatron trainer config."""
    if Path(config_name).name.removesuffix(".yaml") != CONFIG:
        return {}
    return {STRATEGY: ("megatron", f"--config-name {config_name} (verl/trainer/config/{CONFIG}.yaml: "
                                   f"{STRATEGY}: megatron)")}


# Newer verl composes ppo_trainer.yaml from `defaults: - model_engine: dp` and `actor@actor_rollout_ref.actor:
# ${model_engine}_actor` (the ref and critic alike): `model_engine=megatron` on the line picks the Megatron workers'
# groups, and ppo_megatron_trainer.yaml became `override model_engine: megatron`. dp is the FSDP workers.
MODEL_ENGINE = "model_engine"


def chosen(options: dict[str, tuple[Any, str]]) -> bool:
    return str(options.get(STRATEGY, ("",))[0]) == "megatron" or str(options.get(MODEL_ENGINE, ("",))[0]) == "megatron"


def engine_choice(value: Any, raw: str) -> str | None:
    """What `model_engine=X` leaves unread: None for dp (the FSDP workers) and megatron (read here), a reason for the
    engines loraflow does not model (torchtitan, veomni)."""
    if str(value) in ("dp", "megatron"):
        return None
    return (f"{raw}: verl's {value} engine (its own sharding, checkpointing and precision) is not an engine loraflow "
            "check models; the launch is read as verl's FSDP workers")


def worker_key(key: str) -> bool:
    """A setting of the Megatron workers themselves (parallel sizes, offload, recompute, mbridge) or of their LoRA."""
    return ".megatron." in f".{key}" or key.startswith(_LORA)


def apply(draft: Draft, options: dict[str, tuple[Any, str]]) -> None:
    """The adapter the Megatron workers train, and a note on what is not evaluated."""
    keys = sorted(k for k in options if worker_key(k) and not k.startswith(_LORA))
    chosen_by = options[STRATEGY][1] if str(options.get(STRATEGY, ("",))[0]) == "megatron" else \
        options[MODEL_ENGINE][1]
    draft.note(f"{chosen_by}: verl's Megatron workers (Megatron-Core tensor/pipeline parallel, its own "
               "recompute, precision and distributed optimizer) are not an engine loraflow check models; stage, "
               "adapter, world size and model are read, the sharding, checkpointing and precision rules are not "
               "evaluated" + (f" ({len(keys)} Megatron settings given, e.g. {keys[0]})" if keys else ""))
    if LORA_RANK in options:
        value, where = options[LORA_RANK]
        rank = int_value(value, where, "a LoRA rank")
        draft.set("adapter", "lora" if rank > 0 else "full", where)
        if rank > 0:
            draft.set("adapter_rank", rank, where)
            draft.set("not_used", ("peft",), f"{where}: Megatron-Bridge's LoRA on verl's Megatron workers, not PEFT")
    else:
        draft.set("adapter", "full", f"default (verl/trainer/config/{CONFIG}.yaml: no {LORA_RANK}, full "
                  "fine-tuning)")


def lora_dict_on_fsdp(raw: str) -> str:
    """Why `actor_rollout_ref.model.lora.rank` does not make the FSDP workers train LoRA: HFModelConfig's `lora` dict
    is the Megatron workers' config ("megatron lora config", verl/workers/config/model.py) while the FSDP workers build
    PEFT from model.lora_rank (fsdp_workers.py; verl/workers/engine/fsdp/transformer_impl.py _build_lora_module
    `"r": self.model_config.lora_rank`). Scripts migrated to `lora.rank` alone train every weight there."""
    rank = raw.partition("=")[2]
    return (f"{raw}: model.lora.* is the LoRA config of verl's Megatron workers; its FSDP workers build the adapter "
            f"from actor_rollout_ref.model.lora_rank, so this launch is read as full fine-tuning (set "
            f"actor_rollout_ref.model.lora_rank={rank} for LoRA on FSDP)")
