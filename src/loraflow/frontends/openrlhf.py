"""OpenRLHF: `deepspeed --module openrlhf.cli.train_sft ...`, `python -m openrlhf.cli.train_dpo`, `torchrun -m ...`,
`ray job submit ... -- python3 -m openrlhf.cli.train_ppo_ray ...`.

Two CLI generations exist: flat flags up to v0.10.1 (`--zero_stage`, `--gradient_checkpointing`, `--lora_rank`) and the
dotted ones from v0.10.2 (`--ds.zero_stage`, `--model.gradient_checkpointing_enable`, `--ds.lora.rank`, PPO's
`--actor.*`). Both are read; fixes name the spelling the command used.
"""

from __future__ import annotations

from loraflow.errors import LoraflowError
from loraflow.frontends import keys
from loraflow.frontends.argv import Command, parse_flags, script_command
from loraflow.frontends import moe_blocks
from loraflow.frontends.base import Framework, FrontendResult, Mitigation
from loraflow.frontends.common import Draft, as_bool, finish_world, int_value, mitigated
from loraflow.frontends.model_types import model_name_facts
from loraflow.frontends.kbit_facts import MOVE_4BIT_SINCE, move_refused
from loraflow.frontends.table import (
    Default,
    Field,
    all_if_on,
    apply_table,
    at_stage,
    checkpointing_on,
    empty_list,
    fact,
    fraction,
    rank,
    stages,
    switch,
    zero_stage,
)

NAME = "openrlhf"
CLI = "openrlhf/cli/train_sft.py"
# Entry points openrlhf.cli.train_* -> loraflow stage (kto, prm, kd through table.STAGE_ALIASES).
STAGES = stages("sft", "rm", "dpo", "ppo", "ppo_ray", "kto", "prm", "kd", prefix="train_")

# Combination field -> (flat flag, dotted flag, PPO-dotted flag). None: that generation has no such flag.
_FLAGS = {
    "checkpointing": ("gradient_checkpointing", "model.gradient_checkpointing_enable",
                      "actor.gradient_checkpointing_enable"),
    "reentrant": ("gradient_checkpointing_use_reentrant", "model.gradient_checkpointing_reentrant",
                  "actor.gradient_checkpointing_reentrant"),
    "zero_stage": ("zero_stage", "ds.zero_stage", "ds.zero_stage"),
    "offload": ("adam_offload", "ds.adam_offload", "ds.adam_offload"),
    "adapter": ("lora_rank", "ds.lora.rank", "ds.lora.rank"),
    "matched_modules": ("target_modules", "ds.lora.target_modules", "ds.lora.target_modules"),
    "quantization": ("load_in_4bit", "ds.load_in_4bit", "ds.load_in_4bit"),
    "packing": ("packing_samples", "ds.packing_samples", "ds.packing_samples"),
    "precision": ("param_dtype", "ds.param_dtype", "ds.param_dtype"),
}
# train_ppo_ray's vLLM engines, flat (v0.5.8 - v0.10.1) and dotted (v0.10.2+) spellings of each flag
# (https://github.com/OpenRLHF/OpenRLHF/blob/v0.9.10/openrlhf/cli/train_ppo_ray.py#L221-L254; dotted:
# ORL/openrlhf/cli/train_ppo_ray.py#L224-L257).
# ORL = https://github.com/OpenRLHF/OpenRLHF/blob/3c3be6234e0cb353e76bb8019947db9dfe99fca7 (main after v0.11.0)
_VLLM = {"engines": ("vllm_num_engines", "vllm.num_engines"),
         "share": ("vllm_gpu_memory_utilization", "vllm.gpu_memory_utilization"),
         "colocate": ("colocate_all_models", "train.colocate_all"), "async": ("async_train", "train.async_enable"),
         "engine_sleep": ("vllm_enable_sleep", "vllm.enable_sleep"),
         "trainer_sleep": ("deepspeed_enable_sleep", "ds.enable_sleep"),
         "is_correction": ("enable_vllm_is_correction", "algo.advantage.is_correction_enable")}
VLLM_FLAGS = {"engine_gpu_memory_utilization": "--vllm_gpu_memory_utilization",
              "rollout_colocated": "--vllm_enable_sleep with --deepspeed_enable_sleep (or drop --colocate_all_models)",
              "rollout_sync": "--lora_rank 0 or --vllm_num_engines 0 (OpenRLHF broadcasts PEFT's parameters as they "
                              "are)",
              "adapter_rank": "--lora_rank", "rollout_logprobs_used": "--enable_vllm_is_correction"}


FLAGS = {**{field: "--" + names[0] for field, names in _FLAGS.items()},
         "world_size": "the launcher's --num_gpus / --nproc_per_node", **VLLM_FLAGS}
"""Flat spellings (OpenRLHF <= v0.10.1); a command in the dotted style gets its fixes in dotted flags."""
_SWITCHES = {"colocate_all_models", "train.colocate_all", "vllm_enable_sleep", "vllm.enable_sleep",
             "deepspeed_enable_sleep", "ds.enable_sleep", "enable_vllm_is_correction",
             "algo.advantage.is_correction_enable", "async_train", "train.async_enable",
             "gradient_checkpointing", "gradient_checkpointing_use_reentrant", "adam_offload", "load_in_4bit",
             "packing_samples", "bf16", "flash_attn", "model.gradient_checkpointing_enable",
             "model.gradient_checkpointing_reentrant", "actor.gradient_checkpointing_enable",
             "actor.gradient_checkpointing_reentrant", "ds.adam_offload", "ds.load_in_4bit", "ds.packing_samples"}
_LISTS = {"target_modules", "ds.lora.target_modules", "adam_betas", "adam.betas", "reward_clip_range",
          "eps_clip_low_high", "pretrain_data", "prompt_data", "dataset", "eval_dataset", "reward_tokens"}


def entry(cmd: Command) -> str | None:
    """The OpenRLHF entry point a command runs (`train_sft`...), or None. Up to v0.3.5 the entry points were example
    scripts (`deepspeed ../train_sft.py`, examples/train_*.py)."""
    program = cmd.program.replace("/", ".").removesuffix(".py")
    if "openrlhf.cli." in program or program.startswith("openrlhf.cli"):
        return program.rsplit(".", 1)[-1]
    script = program.rsplit(".", 1)[-1]
    return script if script in STAGES else None


# What a flag's spelling reveals about the release (OpenRLHF's git history: the tag that added or removed it).
_ERAS = (("--gradient_checkpointing_use_reentrant", "gradient_checkpointing_use_reentrant", ">=0.1.10,<0.10.2"),
         ("--load_in_4bit / --target_modules", "target_modules", ">=0.1.5,<0.10.2"),
         ("--packing_samples", "packing_samples", ">=0.3.4,<0.10.2"),
         ("--advantage_estimator", "advantage_estimator", ">=0.5.1,<0.10.2"),
         ("--param_dtype", "param_dtype", ">=0.9.2,<0.10.2"),
         ("--bf16", "bf16", "<0.9.2"),
         ("--flash_attn", "flash_attn", "<0.8.10"),
         ("--attn_implementation", "attn_implementation", ">=0.8.10,<0.10.2"),
         ("--colocate_all_models", "colocate_all_models", ">=0.5.8,<0.10.2"),
         ("--vllm_gpu_memory_utilization", "vllm_gpu_memory_utilization", ">=0.5.8,<0.10.2"),
         ("--deepspeed_enable_sleep", "deepspeed_enable_sleep", ">=0.6.0.post1,<0.10.2"),
         ("--enable_vllm_is_correction", "enable_vllm_is_correction", ">=0.8.9,<0.10.2"))
# Defaults that changed across releases (first tag holding each change).
HOOK = Mitigation(("reentrant-frozen-inputs",), "0.1.5", "LoRA models get enable_input_require_grads() before "
                  "get_peft_model", "openrlhf/models/actor.py (PR #189)")
NONREENTRANT_SINCE = "0.1.10"  # {"use_reentrant": args.gradient_checkpointing_use_reentrant}, a store_true (PR #206)
GATHER_SAVE = Mitigation(("zero3-lora-merge",), "0.1.5", "save_model gathers the ZeRO-3 partitions instead of "
                         "merging LoRA into them first", "openrlhf/utils/deepspeed.py save_model")
# requirements.txt pins DeepSpeed exactly in most releases: a release range fixes the DeepSpeed it ran with.
DEPENDS = (("openrlhf", "<0.1.0", {"deepspeed": "==0.11.1"}), ("openrlhf", ">=0.1.0,<0.1.7", {"deepspeed": "==0.12.6"}),
           ("openrlhf", ">=0.1.9,<0.2.6", {"deepspeed": ">=0.13.1,<0.13.3"}),
           ("openrlhf", ">=0.2.6,<0.2.8", {"deepspeed": "==0.14.0"}),
           ("openrlhf", ">=0.2.8,<0.3.6", {"deepspeed": "==0.13.5"}),
           ("openrlhf", ">=0.3.6,<0.4.3", {"deepspeed": "==0.14.4"}),
           ("openrlhf", ">=0.4.3,<0.5.8", {"deepspeed": "==0.15.0"}),
           ("openrlhf", ">=0.5.8,<0.6.1", {"deepspeed": "==0.16.3"}),
           ("openrlhf", ">=0.6.1,<0.8.3", {"deepspeed": ">=0.16.4,<0.17"}),
           ("openrlhf", ">=0.8.3,<0.9.0", {"deepspeed": ">=0.17.0,<0.18"}),
           ("openrlhf", ">=0.9.0,<0.10.4", {"deepspeed": ">=0.18.1,<0.19"}),
           ("openrlhf", ">=0.10.4,<0.11.0", {"deepspeed": "==0.19.1"}),
           ("openrlhf", ">=0.11.0", {"deepspeed": ">=0.19.5"}))


def _eras(draft: Draft, cmd: Command, given: dict, style: int) -> None:
    if style:
        draft.era("openrlhf", ">=0.10.2", "the dotted flags (--ds.*, --model.*, --actor.*) came in v0.10.2")
    elif "openrlhf.cli" not in cmd.program.replace("/", "."):
        draft.era("openrlhf", "<0.3.6", f"`{cmd.program}` is an example script; -m openrlhf.cli.* replaced them in "
                  "v0.3.6")
    else:
        draft.era("openrlhf", ">=0.3.6", "the entry points moved to openrlhf.cli in v0.3.6")
    draft.eras_from("openrlhf", "OpenRLHF", _ERAS, given)
    if not style:
        draft.era("openrlhf", "<0.10.2", "flat flags (--zero_stage, --lora_rank) are the spelling before v0.10.2")


def _table(spelled: dict[str, str]) -> tuple[Field, ...]:
    """What OpenRLHF's flags set, up to precision (whose two flag generations _precision reads); `spelled` names the
    reentrant flag in the command's own style for the default's source."""
    f = _FLAGS
    lora = _adapter_is("lora")
    return (
        # Every trainer runs on DeepSpeed (openrlhf/utils/deepspeed/deepspeed.py), ZeRO stage 2 unless told otherwise.
        fact("engine", "deepspeed", "OpenRLHF always trains through DeepSpeed (openrlhf/utils/deepspeed/deepspeed.py)"),
        Field("zero_stage", f["zero_stage"], zero_stage,
              Default(2, f"default (OpenRLHF {CLI}: --zero_stage default 2)")),
        Field("offload", f["offload"], switch),
        Field("adapter", f["adapter"], _lora_rank,
              Default("full", f"default (OpenRLHF {CLI}: --lora_rank 0 trains every weight)")),
        # LoRA models get enable_input_require_grads() before get_peft_model (openrlhf/models/actor.py), since
        # v0.1.5; before, get_peft_model ran before checkpointing was enabled, so PEFT added no hook either.
        Field("input_grad_hook", when=lora, default=Default(
            False, "OpenRLHF < 0.1.5 adds no input-grad hook (get_peft_model ran before checkpointing was enabled)",
            since=(("openrlhf", HOOK.since, True, "OpenRLHF >= 0.1.5 calls enable_input_require_grads() for LoRA "
                    "(openrlhf/models/actor.py)"),))),
        Field("matched_modules", f["matched_modules"], empty_list, suffix=" (empty list)"),
        Field("checkpointing", f["checkpointing"], all_if_on),
        # The flag is store_true and passed as use_reentrant to gradient_checkpointing_enable
        # (openrlhf/cli/train_sft.py; Actor.gradient_checkpointing_enable default in openrlhf/models/actor.py).
        Field("reentrant", f["reentrant"], when=checkpointing_on, default=Default(
            True, "OpenRLHF < 0.1.10 calls gradient_checkpointing_enable() without kwargs "
            "(transformers 4.x: reentrant)",
            since=(("openrlhf", NONREENTRANT_SINCE, False, f"default (OpenRLHF {CLI}: {spelled['reentrant']} not "
                    "given; non-reentrant since v0.1.10)"),))),
        fact("checkpoint_impl", "transformers", "model.gradient_checkpointing_enable (openrlhf/models/actor.py)",
             when=checkpointing_on),
        fact("use_cache", False, "OpenRLHF sets model.config.use_cache = False (openrlhf/models/actor.py)"),
        Field("packing", f["packing"], switch),
        Field("quantization", f["quantization"], lambda v, w: "4bit" if as_bool(v, w) else None),
        # BitsAndBytesConfig without bnb_4bit_quant_storage: packed uint8 (openrlhf/models/actor.py).
        fact("quant_storage_matches", False, "OpenRLHF sets no bnb_4bit_quant_storage (openrlhf/models/actor.py)",
             when=lambda d: d.get("quantization") == "4bit"),
    )


# After precision: what the trainers always do.
_TRAINERS = (
    # chosen and rejected in one concatenated forward (openrlhf/trainer/dpo_trainer.py)
    fact("forwards_per_step", 1, "concatenated_forward (openrlhf/trainer/dpo_trainer.py, rm_trainer.py)",
         when=at_stage("dpo", "rm")),
    fact("train_mode_at_backward", True, "the trainers call model.train() before each step "
         "(openrlhf/trainer/*_trainer.py, trainer/ray/ppo_actor.py)"),
    # get_llm_for_sequence_regression adds the value head after get_peft_model's freeze and saves only the adapter
    # (openrlhf/models/model.py); the fix (https://github.com/OpenRLHF/OpenRLHF/pull/1342, 2026-09) is unmerged.
    fact("task_head_saved", False, "OpenRLHF's reward model LoRA leaves its new value head out of the adapter "
         "(openrlhf/models/model.py get_llm_for_sequence_regression; PR #1342 unmerged)",
         when=lambda d: d.get("stage") == "rm" and d.get("adapter") != "full"),
)


def _vllm_table(on) -> tuple[Field, ...]:
    """What train_ppo_ray's vLLM flags set; `on(key)` says whether a switch of _VLLM is given."""
    colocated = on("colocate") and not on("async") and not (on("engine_sleep") and on("trainer_sleep"))
    return (
        fact("rollout_engine", "vllm", "--vllm_num_engines > 0: rollouts come from vLLM engines "
             "(openrlhf/cli/train_ppo_ray.py create_vllm_engines)"),
        Field("adapter_rank", ("lora_rank", "ds.lora.rank"), rank, when=_adapter_is("lora")),
        # broadcast_to_vllm sends every model.named_parameters() by name, and for a LoRA actor those are PEFT's
        # (base_model.model...base_layer, lora_A/B): no release merges first (v0.2.0 - v0.11.0, e.g.
        # ORL/openrlhf/trainer/ray/ppo_actor.py#L408-L488;
        # https://github.com/OpenRLHF/OpenRLHF/issues/1081 "not supported", #546, #991, #1349; the merging PR #869
        # was never merged).
        fact("rollout_sync", "unmerged", "OpenRLHF broadcasts the PEFT model's own parameters to vLLM "
             "(openrlhf/trainer/ray/ppo_actor.py broadcast_to_vllm)", when=_adapter_is("lora")),
        fact("rollout_sync", "merged", "OpenRLHF broadcasts every weight under its own name "
             "(openrlhf/trainer/ray/ppo_actor.py broadcast_to_vllm)", when=_adapter_is("full")),
        fact("rollout_sync_proven", True, "every weight is broadcast and loaded with load_weights after each update "
             "(openrlhf/trainer/ray/vllm_worker_wrap.py update_weight)", when=_adapter_is("full")),
        # The engines share the actor's GPUs with --colocate_all_models (not with --async_train); only sleep on both
        # sides frees one's memory while the other runs (--vllm_enable_sleep, --deepspeed_enable_sleep).
        fact("rollout_colocated", colocated, _placement(on, colocated)),
        Field("engine_gpu_memory_utilization", _VLLM["share"], fraction, Default(
            0.9, "default (OpenRLHF < 0.7 train_ppo_ray.py: vllm_gpu_memory_utilization 0.9)",
            since=(("openrlhf", "0.7.0", 0.95, "default (OpenRLHF >= 0.7 train_ppo_ray.py: "
                    "vllm_gpu_memory_utilization 0.95)"),))),
        # The engines are asked for processed log-probs exactly when the trainer uses them (train_ppo_ray.py passes
        # logprobs_mode="processed_logprobs" if the IS correction is on, v0.8.9+:
        # https://github.com/OpenRLHF/OpenRLHF/blob/v0.9.10/openrlhf/cli/train_ppo_ray.py#L78).
        fact("rollout_logprobs_used", on("is_correction"), "--enable_vllm_is_correction" + (
            "" if on("is_correction") else " not given: the actor recomputes every log-prob")),
        fact("rollout_logprobs_processed", on("is_correction"), "train_ppo_ray.py starts the engines with "
             "logprobs_mode=" + ("processed_logprobs for the IS correction" if on("is_correction") else
                                 "None (vLLM's raw_logprobs) without the IS correction")),
        fact("rollout_verified", False, "OpenRLHF does not compare the engines' log-probs with the actor's"),
    )


def _placement(on, colocated: bool) -> str:
    """Why the engines do or do not hold memory beside the training actor (the reason for rollout_colocated)."""
    if not on("colocate"):
        return "--colocate_all_models not given: the engines have GPUs of their own"
    if on("async"):
        # train_ppo_ray.py: "Using --colocate_all_models in async RLHF only colocates DeepSpeed models."
        return "--colocate_all_models with --async_train colocates only the DeepSpeed models: the engines have GPUs " \
               "of their own"
    if not colocated:
        return "--colocate_all_models with --vllm_enable_sleep and --deepspeed_enable_sleep (time-shared)"
    return "--colocate_all_models"


def _lora_rank(value, where: str) -> str:
    return "lora" if int_value(value, where, "a LoRA rank") > 0 else "full"


def _adapter_is(kind: str):
    return lambda draft: draft.get("adapter") == kind


def _known() -> set[str]:
    return set().union(*_FLAGS.values(), *_VLLM.values()) | _SWITCHES | _LISTS | keys.OPENRLHF | {
        "bf16", "advantage_estimator", "algo.advantage.estimator"}


def _unabbreviated(tokens: list[str], draft: Draft) -> list[str]:
    """OpenRLHF's entry points parse with a plain argparse.ArgumentParser (openrlhf/cli/train_ppo_ray.py), whose
    allow_abbrev takes a unique prefix of a flag for the flag: `--colocate_all_model` is --colocate_all_models. Such a
    prefix is spelled out, so the flag's meaning is read; a prefix of several flags is left (argparse refuses it)."""
    known = _known()
    out = []
    for token in tokens:
        name, eq, value = token.partition("=")
        bare = name[2:] if name.startswith("--") else ""
        if bare and bare not in known:
            full = [k for k in known if k.startswith(bare)]
            if len(full) == 1:
                draft.note(f"{name}: argparse takes it for --{full[0]} (a unique prefix, allow_abbrev)")
                token = f"--{full[0]}{eq}{value}"
        out.append(token)
    return out


def _read(cmd: Command, name: str, draft: Draft) -> tuple[dict, list, int]:
    """The flags by name, the flags in order, and the style: 0 flat (<= v0.10.1), 1 dotted, 2 PPO-dotted."""
    args, positionals, _ = parse_flags(_unabbreviated(cmd.args, draft), switches=_SWITCHES, lists=_LISTS,
                                       underscore=False)
    for extra in positionals:
        draft.unknown.append(f"{extra} (a positional argument; OpenRLHF takes none)")
    given = {a.name: a for a in args}
    style = 2 if any(n.startswith("actor.") for n in given) or (name == "train_ppo_ray" and any(
        "." in n for n in given)) else (1 if any("." in n for n in given) else 0)
    return given, args, style


def _stage(draft: Draft, name: str, given: dict) -> str:
    stage = STAGES[name]
    algo = given.get("advantage_estimator") or given.get("algo.advantage.estimator")
    if algo is not None and algo.one() != "gae" and name in ("train_ppo", "train_ppo_ray"):
        # Every estimator but GAE drops the critic (train_ppo_ray.py: `if args.advantage_estimator not in ["gae"]:
        # args.critic_pretrain = None`): group_norm and dr_grpo are GRPO, reinforce, rloo and reinforce_baseline
        # critic-free baselines of the same shape, as verl's other estimators (table.STAGE_ALIASES).
        stage = "grpo"
        draft.set("stage", stage, f"{algo.raw} (no critic)")
    else:
        draft.set("stage", stage, f"openrlhf.cli.{name}")
    if STAGES[name] != name.removeprefix("train_") and name != "train_ppo_ray":
        draft.note(f"{name} is read as stage {stage} (loraflow's stages are sft, rm, dpo, grpo, ppo)")
    return stage


def _precision(draft: Draft, given: dict, style: int) -> None:
    """--bf16 up to v0.9.2, --param_dtype after (default bf16)."""
    param_dtype = next((given[n] for n in _FLAGS["precision"] if n in given), None)
    if "bf16" in given:
        draft.set("precision", "bf16-mixed", "--bf16 (DeepSpeed bf16 keeps fp32 master weights)")
    elif param_dtype is not None:
        dtype = param_dtype.one()
        draft.set("precision", "fp16-mixed" if dtype == "fp16" else "bf16-mixed", param_dtype.raw)
    else:
        draft.set("precision", "bf16-mixed", f"default (OpenRLHF {CLI}: --param_dtype bf16; DeepSpeed bf16 keeps fp32 "
                  "master weights)")
        if style == 0:
            draft.note("OpenRLHF releases before --param_dtype (older than v0.9.2) trained in fp32 unless --bf16 was "
                       "given")


def _save_and_generation(draft: Draft, cmd: Command, name: str, given: dict) -> None:
    # save_model gathers ZeRO-3 partitions before writing the adapter; before v0.1.5 it merged LoRA into the
    # partitioned weights first.
    gathered = mitigated(draft, "zero3-lora-merge")
    draft.set("adapter_save_gather", True, "save_model gathers ZeRO-3 weights (openrlhf/utils/deepspeed/deepspeed.py)")
    if draft.get("adapter") == "lora" and not gathered:
        draft.set("merge_in_sharded", True, "OpenRLHF < 0.1.5 saves by merging LoRA into the partitioned weights, "
                  "then gathering (openrlhf/utils/deepspeed.py)")
    steps = given.get("save_steps")  # default -1: no resumable checkpoint (openrlhf/cli/train_*.py)
    if steps is not None and int_value(steps.value, steps.raw, "a number of steps") > 0:
        draft.set("engine_checkpoints", "all", f"{steps.raw} (save_ckpt calls DeepSpeed's save_checkpoint without "
                  "exclude_frozen_parameters: openrlhf/utils/deepspeed/deepspeed.py)")
    if name == "train_ppo":
        draft.set("generation", True, "train_ppo samples with actor.generate (openrlhf/trainer/ppo_utils/"
                  "experience_maker.py, v0.6 and earlier)")
        draft.set("generation_gather", False, "actor.generate runs on the ZeRO-partitioned model, no gather")
    elif name == "train_ppo_ray":
        draft.set("generation", False, "rollouts come from vLLM engines, not from the DeepSpeed actor "
                  "(openrlhf/trainer/ppo_utils/samples_generator.py)")
        engines = next((given[n] for n in _VLLM["engines"] if n in given), None)
        if engines is not None and int_value(engines.value, engines.raw, "a number of vLLM engines") > 0:
            def on(key: str) -> bool:
                return any(n in given and as_bool(given[n].value, given[n].raw) for n in _VLLM[key])
            apply_table(draft, {n: (a.value, a.raw) for n, a in given.items()}, _vllm_table(on))
        nodes = given.get("actor_num_nodes") or given.get("actor.num_nodes")
        gpus = given.get("actor_num_gpus_per_node") or given.get("actor.num_gpus_per_node")
        n = int_value(nodes.value, nodes.raw, "a number of nodes") if nodes else 1
        g = int_value(gpus.value, gpus.raw, "a number of GPUs") if gpus else 8
        cmd.world_size = n * g
        cmd.world_source = (f"actor nodes x GPUs per node = {n} x {g}" +
                            ("" if gpus else f" (default {g}, openrlhf/cli/train_ppo_ray.py)"))


def _quantized_engines(draft: Draft, name: str, given: dict) -> None:
    """--load_in_4bit reaches every model an entry point loads (cli/train_*.py, trainer/ray/launcher.py), and each is
    handed to deepspeed.initialize, which moves it to its device (utils/deepspeed/deepspeed.py _ds_init_train_model,
    _ds_init_eval_model). A model with LoRA reaches the engine as a PeftModel, an nn.Module whose .to never meets
    transformers' check; one without is a transformers model whose PreTrainedModel.to refuses 4 bits before
    bitsandbytes 0.43.2: the reference model of DPO, KTO and PPO, PPO's reward model (unless remote), and the trained
    model itself without --lora_rank."""
    if draft.get("quantization") != "4bit":
        return
    bare = []
    if name in ("train_dpo", "train_kto", "train_ppo", "train_ppo_ray"):
        bare.append("the reference model")
    remote = any(n in given for n in ("remote_rm_url", "reward.remote_url"))
    if name in ("train_ppo", "train_ppo_ray") and not remote:
        bare.append("the reward model")
    if draft.get("adapter") == "full":
        bare.append("the trained model (no --lora_rank)")
    if bare and move_refused(draft, "4bit"):
        draft.set("quantized_moved", True, f"--load_in_4bit: OpenRLHF hands {', '.join(bare)}, loaded in 4 bits "
                  "without an adapter, to deepspeed.initialize, which moves it to its device (transformers refuses "
                  f"before bitsandbytes {MOVE_4BIT_SINCE}; openrlhf/utils/deepspeed/deepspeed.py)")


def from_command(cmd: Command, versions: dict) -> FrontendResult:
    name = entry(cmd)
    if name not in STAGES:
        raise LoraflowError(f"`{cmd.describe()}` is not an OpenRLHF training entry point loraflow reads; expected "
                            f"openrlhf.cli.{{{','.join(STAGES)}}} (or an example script train_*.py of v0.3.5 and "
                            "earlier).")
    draft = Draft(NAME, versions)
    given, args, style = _read(cmd, name, draft)
    spelled = {field: "--" + (names[style] or names[0]) for field, names in _FLAGS.items()}
    _eras(draft, cmd, given, style)
    _stage(draft, name, given)
    options = {n: (a.value, a.raw) for n, a in given.items()}
    apply_table(draft, options, _table(spelled))
    _precision(draft, given, style)
    apply_table(draft, options, _TRAINERS)
    _save_and_generation(draft, cmd, name, given)
    _quantized_engines(draft, name, given)
    model = given.get("pretrain") or given.get("actor.model_name_or_path")
    if model is not None:
        model_name_facts(draft, model.one() or "", model.raw)
    known = _known()
    for a in args:
        if a.name not in known and a.name not in keys.OPENRLHF:
            draft.unknown.append(a.raw)
    draft.flag(**VLLM_FLAGS)
    draft.flag(**spelled, world_size="--actor_num_gpus_per_node" if name == "train_ppo_ray" else
               "the launcher's --num_gpus / --nproc_per_node")
    if "bf16" in given:
        draft.flag(precision="--bf16")
    finish_world(draft, cmd)
    return draft.result()


def from_files(paths: list[str], versions: dict) -> FrontendResult:
    """OpenRLHF has no config file of its own: read the launch line of a training script (.sh)."""
    return from_command(script_command(paths, NAME, "deepspeed --module openrlhf.cli.train_sft ..."), versions)


def _recognise(view) -> bool:
    # `-m openrlhf.cli.train_sft`, or an example script of the early releases (`deepspeed ../train_sft.py`) with
    # OpenRLHF's own flags.
    if view.runs("openrlhf"):
        return True
    script = view.program.rsplit("/", 1)[-1].removesuffix(".py")
    return script in STAGES and len(view.flags & {"pretrain", "micro_train_batch_size", "save_path", "zero_stage",
                                                   "max_len", "input_key"}) >= 2


FRAMEWORK = Framework(name=NAME, title="OpenRLHF", module="openrlhf", recognise=_recognise, flags=FLAGS,
                      log_paths=r"openrlhf[/\\]|openrlhf\.cli", depends=DEPENDS, dated=True,
                      mitigations=(HOOK, GATHER_SAVE, *moe_blocks.mitigations(NAME)))
