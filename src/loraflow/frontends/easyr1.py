"""EasyR1 (hiyouga/EasyR1): `python3 -m verl.trainer.main config=examples/config.yaml worker.actor.model.lora.rank=64
...`. EasyR1 is a fork of verl whose package is still named `verl`, but its entry point (`verl.trainer.main`) and its
config are its own: one dataclass tree (verl/trainer/config.py PPOConfig, verl/workers/actor/config.py ActorConfig)
under `data.`, `algorithm.`, `worker.actor|ref|rollout|reward.` and `trainer.`, merged with the YAML that `config=`
names and the `key=value` words of the line (OmegaConf.from_cli, verl/trainer/main.py). verl.py hands such launches
here; the result is reported under verl's name, whose package EasyR1 ships.

What its workers do with the settings is read from hiyouga/EasyR1 verl/workers/fsdp_workers.py (FSDPWorker
_build_model_optimizer), verl/workers/actor/dp_actor.py and verl/workers/sharding_manager/fsdp_vllm.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loraflow.frontends import vision
from loraflow.frontends.argv import Command
from loraflow.frontends.common import Draft, as_bool, as_list, int_value, load_mapping
from loraflow.frontends.model_types import model_name_facts
from loraflow.frontends.dotlist import Override, flatten, split_overrides
from loraflow.frontends.table import Default, Field, apply_table, fact, fraction, rank, stage_of

MODULE = "verl.trainer.main"
A = "worker.actor."
M = A + "model."
WORKERS = "EasyR1 verl/workers/fsdp_workers.py"
CONFIG = "EasyR1 verl/workers/actor/config.py"
FLAGS = {"adapter": M + "lora.rank", "adapter_rank": M + "lora.rank", "matched_modules": M + "lora.target_modules",
         "checkpointing": M + "enable_gradient_checkpointing", "fsdp_use_orig_params": A + "fsdp.use_orig_params",
         "offload": A + "offload.offload_params / " + A + "fsdp.enable_cpu_offload",
         "precision": A + "fsdp.torch_dtype / " + A + "fsdp.mp_param_dtype", "packing": A + "padding_free",
         "sequence_parallel": A + "ulysses_size", "world_size": "trainer.n_gpus_per_node x trainer.nnodes",
         "engine_gpu_memory_utilization": "worker.rollout.gpu_memory_utilization",
         "rollout_colocated": A + "offload.offload_params and " + A + "offload.offload_optimizer",
         "targets_all_towers": M + "lora.exclude_modules"}
# The actor's own keys (ActorConfig and its model/fsdp/offload sections, in the releases read); its optimizer and the
# other sections (data, algorithm, trainer, worker.rollout's sampling, worker.reward, worker.ref's offload) set nothing
# loraflow models, so their keys are taken as given.
_ACTOR_KEYS = frozenset({
    "strategy", "global_batch_size", "micro_batch_size_per_device_for_update",
    "micro_batch_size_per_device_for_experience", "max_grad_norm", "clip_ratio_low", "clip_ratio_high",
    "clip_ratio_dual", "loss_avg_mode", "loss_type", "ppo_epochs", "padding_free", "dynamic_batching", "ulysses_size",
    "ulysses_sequence_parallel_size", "use_torch_compile", "tau_positive", "tau_negative",
    "model.model_path", "model.tokenizer_path", "model.enable_gradient_checkpointing", "model.trust_remote_code",
    "model.freeze_vision_tower", "model.lora.rank", "model.lora.alpha", "model.lora.target_modules",
    "model.lora.exclude_modules", "fsdp.enable_full_shard", "fsdp.enable_cpu_offload", "fsdp.enable_rank0_init",
    "fsdp.use_orig_params", "fsdp.torch_dtype", "fsdp.fsdp_size", "fsdp.mp_param_dtype", "fsdp.mp_reduce_dtype",
    "fsdp.mp_buffer_dtype", "offload.offload_params", "offload.offload_optimizer"})
_SECTIONS = ("data.", "algorithm.", "trainer.", "worker.rollout.", "worker.reward.", "worker.ref.", "worker.critic.")
_HALF = {"bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16"}


def launches(program: str, args: list[str]) -> bool:
    """`-m verl.trainer.main` (verl itself has no such module: its entry points are main_ppo and the SFT trainers),
    or another module given EasyR1's `worker.actor.` keys."""
    if program.replace("/", ".").removesuffix(".py").endswith("verl.trainer.main"):
        return True
    return sum(a.startswith(("worker.actor.", "config=")) for a in args) >= 2


def _base(overrides: list[Override], draft: Draft) -> dict[str, tuple[Any, str]]:
    """The YAML `config=` names, when it is here; otherwise its keys are unseen (listed, so check exits 1)."""
    given = next((o for o in overrides if o.key == "config"), None)
    if given is None:
        return {}
    path = Path(str(given.value))
    if not path.is_file():
        draft.unknown.append(f"{given.raw}: {path} is not here, so its keys are read as EasyR1's dataclass "
                             "defaults (examples/config.yaml turns offload_params and offload_optimizer on)")
        return {}
    return {k: (v, f"{path.name}: {k}") for k, v in flatten(load_mapping(path, "EasyR1 config")).items()}


def _unread(options: dict[str, tuple[Any, str]], draft: Draft) -> None:
    for key, (_, where) in options.items():
        if key == "config" or key.startswith(_SECTIONS) or key.startswith((M + "override_config.", A + "optim.")):
            continue
        if not key.startswith(A) or key.removeprefix(A) not in _ACTOR_KEYS:
            draft.unknown.append(f"{where} (not a key of EasyR1's config as read)")


def _table(lora) -> tuple[Field, ...]:
    return (
        Field("stage", ("algorithm.adv_estimator",), lambda v, w: stage_of(str(v)),
              Default("grpo", "default (EasyR1 verl/trainer/config.py AlgorithmConfig: adv_estimator grpo)")),
        Field("adapter", (M + "lora.rank",), lambda v, w: "lora" if int_value(v, w, "a LoRA rank") > 0 else "full",
              Default("full", f"default ({CONFIG} LoraConfig: rank 0, full fine-tuning)")),
        Field("adapter_rank", (M + "lora.rank",), rank, when=lora),
        Field("matched_modules", (M + "lora.target_modules",), lambda v, w: 0 if not as_list(v) else None, when=lora,
              suffix=" (an empty list)"),
        Field("checkpointing", (M + "enable_gradient_checkpointing",), lambda v, w: "all" if as_bool(v, w) else "off",
              Default("all", f"default ({CONFIG} ModelConfig: enable_gradient_checkpointing True)")),
        fact("reentrant", False, f"EasyR1 passes use_reentrant=False to gradient_checkpointing_enable ({WORKERS})",
             when=lambda d: d.get("checkpointing") != "off"),
        fact("checkpoint_impl", "transformers", f"model.gradient_checkpointing_enable ({WORKERS})",
             when=lambda d: d.get("checkpointing") != "off"),
        fact("input_grad_hook", True, f"EasyR1 calls enable_input_require_grads() before get_peft_model ({WORKERS})",
             when=lora),
        fact("use_cache", False, "the actor's forwards pass use_cache=False (EasyR1 verl/workers/actor/dp_actor.py)"),
        Field("packing", (A + "padding_free",), lambda v, w: as_bool(v, w),
              Default(True, f"default ({CONFIG} ActorConfig: padding_free True)")),
        Field("sequence_parallel", (A + "ulysses_size", A + "ulysses_sequence_parallel_size"),
              lambda v, w: int_value(v, w, "a sequence-parallel size") > 1 or None),
        fact("forwards_per_step", 1, "one forward per micro-batch (EasyR1 verl/workers/actor/dp_actor.py)"),
        fact("train_mode_at_backward", True, "update_policy calls actor_module.train() (EasyR1 dp_actor.py)"),
        # FSDP1 only (FullyShardedDataParallel), use_orig_params from the config (freeze_vision_tower turns it on).
        fact("engine", "fsdp1", f"EasyR1 wraps the actor in FullyShardedDataParallel (FSDP1, {WORKERS})"),
        Field("fsdp_use_orig_params", (A + "fsdp.use_orig_params",), lambda v, w: as_bool(v, w),
              Default(False, f"default ({CONFIG} FSDPConfig: use_orig_params False)")),
        fact("fsdp_frozen_units_separate", True, "get_fsdp_wrap_policy(is_lora_model=True) wraps each LoRA leaf as "
             "its own FSDP unit (EasyR1 verl/utils/fsdp_utils.py)", when=lora),
    )


def _offload_and_precision(draft: Draft, options: dict) -> None:
    """offload_params/offload_optimizer move the actor to CPU between phases (offload_fsdp_model); enable_cpu_offload
    is FSDP's CPUOffload. The actor loads in torch_dtype (fp32 unless told; LoRA keeps frozen weights in bf16) and
    FSDP's MixedPrecision computes in mp_param_dtype (bf16 unless told)."""
    for key in (A + "offload.offload_params", A + "offload.offload_optimizer", A + "fsdp.enable_cpu_offload"):
        if key in options and as_bool(*options[key]):
            draft.set("offload", True, options[key][1])
    weights, weights_src = options.get(A + "fsdp.torch_dtype", (None, ""))
    compute, compute_src = options.get(A + "fsdp.mp_param_dtype", ("bf16", f"default ({CONFIG} FSDPConfig: "
                                                                           "mp_param_dtype bf16)"))
    if str(weights) in _HALF:
        draft.set("precision", _HALF[str(weights)], f"{weights_src} (weights stored in half precision)")
    elif str(compute) in _HALF:
        draft.set("precision", f"{_HALF[str(compute)]}-mixed", f"{compute_src} over fp32 weights" + (
            f" ({weights_src})" if weights_src else f" (torch_dtype unset: the actor loads in fp32, {WORKERS})"))
    else:
        draft.set("precision", "fp32", compute_src)


def _rollout(draft: Draft, options: dict) -> None:
    """vLLM on the actor's GPUs (hybrid engine): it sleeps (level 1) while the actor trains, and the actor stays on the
    GPUs while vLLM generates unless both offloads are on. A LoRA actor reaches vLLM as an adapter
    (TensorLoRARequest, fsdp_vllm.py); a full one by load_weights in place."""
    lora = draft.get("adapter") == "lora"
    draft.set("rollout_engine", "vllm", "EasyR1 rolls out with vLLM (verl/workers/rollout)")
    draft.set("generation", False, "rollouts come from vLLM, not from the FSDP actor")
    if lora:
        draft.note("EasyR1 loads the LoRA into vLLM as an adapter (TensorLoRARequest, verl/workers/sharding_manager/"
                   "fsdp_vllm.py); the engine's max_lora_rank is not read, so the adapter-sync rules are not evaluated")
    else:
        draft.set("rollout_sync", "merged", "EasyR1 loads every weight into vLLM in place (fsdp_vllm.py load_weights)")
        draft.set("rollout_sync_renamed", True, "EasyR1 renames transformers 4.52's image-text module names to the "
                  "checkpoint's before the sync (fsdp_vllm.py _rename_weight_keys; checkouts from before it, May "
                  "2025, did not: hiyouga/EasyR1#305)")
    # Each sync adds the adapter under a new id (lora_int_id from time_ns), so vLLM never serves a stale one.
    draft.set("rollout_sync_proven", True, "EasyR1 syncs the actor into vLLM before every rollout, a LoRA under a new "
              "id each time (fsdp_vllm.py load_vllm_and_sync_weights)")
    draft.set("rollout_verified", False, "EasyR1 does not compare the engine's log-probs with the actor's")
    draft.set("rollout_logprobs_used", False, "the actor recomputes old_log_probs (dp_actor.py compute_log_prob)")
    off = [options[k] for k in (A + "offload.offload_params", A + "offload.offload_optimizer") if k in options]
    shared = len(off) == 2 and all(as_bool(*o) for o in off)
    draft.set("rollout_colocated", not shared, "vLLM shares the actor's GPUs and sleeps while it trains; " + (
        "the actor is offloaded while vLLM runs (" + ", ".join(o[1] for o in off) + ")" if shared else
        "the actor stays on them while vLLM runs (offload_params and offload_optimizer not both on)"))
    apply_table(draft, options, (Field("engine_gpu_memory_utilization", ("worker.rollout.gpu_memory_utilization",),
                                       fraction, Default(0.6, "default (EasyR1 verl/workers/rollout/config.py: "
                                                              "gpu_memory_utilization 0.6)")),))


def _model(draft: Draft, options: dict) -> None:
    """The model's family, and for a vision-language actor whether all-linear reaches the vision tower."""
    model, source = options.get(M + "model_path", ("", ""))
    model_name_facts(draft, str(model or ""), source)
    if not vision.recognise(draft, str(model or ""), source):
        return
    if M + "freeze_vision_tower" in options and as_bool(*options[M + "freeze_vision_tower"]):
        draft.set("frozen_modules", True, options[M + "freeze_vision_tower"][1])
        draft.set("fsdp_use_orig_params", True, f"{options[M + 'freeze_vision_tower'][1]} (EasyR1 turns "
                  f"use_orig_params on, {WORKERS})")
    if draft.get("adapter") == "lora":
        targets, where = options.get(M + "lora.target_modules", ("all-linear", f"default ({CONFIG}: target_modules "
                                                                               "all-linear)"))
        if options.get(M + "lora.exclude_modules", (None,))[0]:
            draft.note(f"{options[M + 'lora.exclude_modules'][1]}: modules kept out of the adapter")
        elif vision.targets_reach_towers(str(model), as_list(targets)):
            vision.targets_enter_tower(draft, where, " (PEFT matches it against the whole model, vision encoder "
                                       "included)", str(model))
    elif not draft.get("frozen_modules"):
        draft.set("towers_trainable", True, f"{draft.sources['adapter']}: full fine-tuning trains the vision tower")
    vision.data_unknowns(draft, "data.max_prompt_length")


def _world(draft: Draft, options: dict) -> None:
    count, where = 1, []
    for key, default in (("trainer.nnodes", 1), ("trainer.n_gpus_per_node", 8)):
        value, source = options.get(key, (default, f"default (EasyR1 verl/trainer/config.py: {key} {default})"))
        if isinstance(value, str) and "$" in value:
            draft.maybe("world_size", {1: "one process", 2: "several processes"}, f"{source} is not visible")
            return
        count *= int_value(value, source, "a number of nodes or GPUs")
        where.append(source)
    draft.set("world_size", count, " x ".join(where))


def read(cmd: Command, draft: Draft) -> None:
    """Fill `draft` from an EasyR1 launch (program `verl.trainer.main`, its `key=value` words)."""
    overrides, others = split_overrides(cmd.args)
    for token in others:
        draft.unknown.append(f"{token} (EasyR1 takes key=value words only)")
    draft.note(f"{cmd.program}: EasyR1's trainer (hiyouga/EasyR1, a verl fork with its own config), not verl's "
               "main_ppo")
    options = {**_base(overrides, draft), **{o.key: (o.value, o.raw) for o in overrides if o.key != "config"}}
    _apply(options, draft)


def is_config(keys) -> bool:
    """A YAML of EasyR1's shape (examples/config.yaml): its actor under worker.actor."""
    return any(k.startswith(A) for k in keys)


def read_config(path: Path, keys: dict[str, Any], draft: Draft) -> None:
    """Fill `draft` from an EasyR1 YAML given alone (`loraflow check --framework verl examples/config.yaml`)."""
    draft.note(f"{path.name}: read as EasyR1's config (hiyouga/EasyR1 examples/config.yaml shape)")
    _apply({k: (v, f"{path.name}: {k}") for k, v in keys.items()}, draft)


def _apply(options: dict[str, tuple[Any, str]], draft: Draft) -> None:
    _unread(options, draft)
    lora = lambda d: d.get("adapter") == "lora"  # noqa: E731
    apply_table(draft, options, _table(lora))
    _offload_and_precision(draft, options)
    _model(draft, options)
    _rollout(draft, options)
    _world(draft, options)
    draft.flag(**FLAGS)
