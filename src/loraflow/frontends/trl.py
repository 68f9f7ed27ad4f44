"""TRL's defaults per release, read by the HF Trainer / TRL frontend (hf.py). TRL's own git history gives the first
tag of each change; without `--versions trl=X`, `check` evaluates every release range these boundaries make."""

from __future__ import annotations

from packaging.version import Version

from loraflow.frontends.common import Draft, as_bool, at_least
from loraflow.frontends.table import Default, Field, apply_table, fact, fraction, rank, stages

# `trl SUBCOMMAND` -> loraflow stage (reward, kto, rloo through table.STAGE_ALIASES).
TRL_COMMANDS = stages("sft", "dpo", "grpo", "reward", "kto", "rloo")
# Flags only TRL has - not TrainingArguments, not transformers' example scripts (whose --dataset_name, and the generic
# --packing / --beta, say nothing about TRL): ModelConfig (trl/trainer/model_config.py), ScriptArguments
# (trl/scripts/utils.py) and SFT/GRPO config fields (trl/trainer/*_config.py).
MARKERS = {"use_peft", "lora_r", "lora_target_modules", "lora_modules_to_save", "lora_task_type",
           "lora_target_parameters", "use_rslora", "use_dora", "use_bnb_nested_quant", "dataset_train_split",
           "dataset_test_split", "dataset_streaming", "gradient_checkpointing_use_reentrant", "ignore_bias_buffers",
           "dataset_text_field", "completion_only_loss", "assistant_only_loss", "num_generations",
           "max_completion_length", "use_vllm", "vllm_mode", "ds3_gather_for_generation", "reward_funcs",
           "use_transformers_paged"}
COMMON_LORA_FLAGS = frozenset({"lora_r", "lora_target_modules", "lora_modules_to_save", "use_dora", "use_rslora"})
"""TRL's LoRA flag names that other training scripts spell the same way (FastChat, alpaca-lora and many own scripts):
alone they do not show that a script is TRL's."""
# TRL trainer (CLI subcommand or script name) -> loraflow stage.
TRAINERS = stages("grpo", "rloo", "online_dpo", "kto", "orpo", "simpo", "cpo", "dpo", "ppo", "reward", "sft")
# TRL forces use_reentrant=True for PEFT + ZeRO-3 + checkpointing: SFTTrainer since 0.28.0 (PR #4951), DPO, GRPO,
# RLOO, KTO and reward trainers since 1.9.0 (PR #6356); the other trainers never.
FORCED_SINCE = {"sft": "0.28.0", "dpo": "1.9.0", "grpo": "1.9.0", "rloo": "1.9.0", "kto": "1.9.0", "reward": "1.9.0"}
# The first release whose trainer adds enable_input_require_grads() for a PEFT model with checkpointing (before it,
# only k-bit preparation did): SFT PR #1006, DPO PR #927, GRPO PR #2848, the unified prepare_peft_model PR #3882.
HOOK_SINCE = {"sft": "0.7.5", "dpo": "0.7.3", "kto": "0.8.0", "grpo": "0.16.0", "online_dpo": "0.22.0",
              "rloo": "0.22.0", "reward": "0.22.0", "ppo": "0.9.3"}
# GRPO/RLOO with use_transformers_paged: transformers' continuous-batching generator leaves the policy in eval mode
# and TRL restored it only from 0.24.0 (PR #4065).
PAGED_EVAL = {"grpo": (">=0.20.0,<0.24.0", "0.20.0"), "rloo": (">=0.22.0,<0.24.0", "0.22.0")}
# Newest TRL that installs with a transformers 4.x, from TRL's declared minimum (setup.cfg / pyproject.toml): 0.19
# needs transformers >= 4.51.0, 0.21 >= 4.55.0, 0.23 >= 4.56.1, 0.27 up to 1.9 >= 4.56.2.
_FOR_TRANSFORMERS = (("4.51.0", "0.18.2"), ("4.55.0", "0.20.0"), ("4.56.1", "0.22.2"), ("4.56.2", "0.26.2"))
# What a flag's spelling says about the release (TRL's ModelConfig / configs / CLI across tags).
_ERAS = (("use_dora", ">=0.16.0"), ("dtype", ">=0.23.0"), ("torch_dtype", "<0.27.0"),
         ("gradient_checkpointing_use_reentrant", ">=0.8.0,<0.27.0"), ("use_transformers_paged", ">=0.20.0,<1.7.0"),
         ("lora_target_parameters", ">=0.21.0"), ("bnb_4bit_quant_storage", ">=0.26.0"),
         ("ds3_gather_for_generation", ">=0.14.0"), ("use_vllm", ">=0.14.0"), ("vllm_device", "<0.18.0"),
         ("vllm_mode", ">=0.18.0"), ("vllm_importance_sampling_correction", ">=0.23.0"),
         ("vllm_enable_sleep_mode", ">=0.23.0"))
# What a script's path says about the release: the tags whose tree holds it (git cat-file on every vX.Y.Z tag of
# huggingface/trl, through v1.9.0; a path still there has no upper bound). The scripts moved from
# examples/scripts/*_trainer.py to examples/scripts/*.py in 0.7.2, gained trl/scripts/ copies in 0.13.
_PATH_ERAS = (("examples/scripts/sft_trainer.py", ">=0.5.0,<0.7.2"),
              ("examples/scripts/vsft_llava.py", ">=0.8.2,<0.12.0"),
              ("examples/scripts/ppo.py", ">=0.7.2,<0.12.0"), ("examples/scripts/ppo/ppo.py", ">=0.9.3"),
              ("examples/scripts/sft_vlm.py", ">=0.12.0"), ("examples/scripts/dpo_vlm.py", ">=0.12.0"),
              ("examples/scripts/kto.py", ">=0.8.0"), ("examples/scripts/sft_gemma3.py", ">=0.16.0"),
              ("examples/scripts/sft.py", ">=0.7.2"), ("examples/scripts/dpo.py", ">=0.7.2"),
              ("examples/scripts/reward_modeling.py", ">=0.7.2"), ("trl/scripts/sft.py", ">=0.13.0"),
              ("trl/scripts/dpo.py", ">=0.13.0"), ("trl/scripts/kto.py", ">=0.13.0"),
              ("trl/scripts/grpo.py", ">=0.14.0"), ("trl/scripts/reward.py", ">=0.24.0"))
# TRL's example scripts that set gradient_checkpointing_kwargs={"use_reentrant": False} in their own code, whatever
# the flags say (`training_args.gradient_checkpointing_kwargs = dict(use_reentrant=False)` after parsing), and the
# tags whose copy does (git grep on every vX.Y.Z tag of huggingface/trl; 0.27 removed the lines when TRL itself
# turned non-reentrant by default).
_SCRIPT_NON_REENTRANT = (("examples/scripts/reward_modeling.py", ">=0.8.0,<0.27.0"),
                         ("examples/scripts/vsft_llava.py", ">=0.8.2,<0.12.0"),
                         ("examples/scripts/sft_vlm.py", ">=0.12.0,<0.27.0"),
                         ("examples/scripts/prm.py", ">=0.13.0,<0.27.0"),
                         ("examples/scripts/sft_video_llm.py", ">=0.13.0,<0.27.0"),
                         ("examples/scripts/sft_vlm_smol_vlm.py", ">=0.13.0,<0.22.0"),
                         ("examples/scripts/sft_gemma3.py", ">=0.16.0,<0.27.0"),
                         ("examples/scripts/sft_vlm_gemma3.py", ">=0.17.0,<0.27.0"),
                         ("examples/scripts/rloo.py", ">=0.22.0,<0.27.0"))
_CLI_ERAS = {"grpo": ">=0.14.0", "rloo": ">=0.22.0", "reward": ">=0.27.0", "sft": ">=0.8.0", "dpo": ">=0.8.0",
             "kto": ">=0.13.0"}
# TRL before 0.27 does not install with transformers 5 (its releases predate it).
DEPENDS = (("trl", "<0.27.0", {"transformers": "<5.0.0"}),)


def eras(draft: Draft, given: set[str], cli: str | None, program: str = "") -> None:
    """The TRL releases a command can be: from the transformers given beside it, its flag spellings and the path of
    TRL's own script it runs (`program`: a script path, or `trl.scripts.sft` run as a module)."""
    transformers = draft.version("transformers")
    if draft.version("trl") is None and transformers is not None and transformers < Version("5.0.0"):
        for limit, trl in _FOR_TRANSFORMERS:
            if transformers < Version(limit):
                draft.era("trl", f"<={trl}", f"TRL {trl} is the newest that installs with transformers {transformers} "
                          f"(later TRL needs transformers >= {limit})", firm=True)
                break
    draft.eras_from("trl", "TRL", _ERAS, given, prefix="--")
    path = program.replace("\\", "/")
    path = path.replace(".", "/") + ".py" if path.startswith("trl.scripts.") else path
    for tail, spec in _PATH_ERAS:
        if path == tail or path.endswith("/" + tail):
            draft.era("trl", spec, f"TRL's {tail} exists in TRL {spec}")
            break
    if cli in _CLI_ERAS:
        draft.era("trl", _CLI_ERAS[cli], f"`trl {cli}` exists in TRL {_CLI_ERAS[cli]}")


def _script_path(program: str) -> str:
    path = program.replace("\\", "/")
    return path.replace(".", "/") + ".py" if path.startswith("trl.scripts.") else path


def _tail(path: str, tail: str) -> bool:
    return path == tail or path.endswith("/" + tail)


def own_script(program: str) -> bool:
    """Whether the program is one of TRL's own scripts (examples/scripts/sft.py, trl/scripts/dpo.py...): it runs
    TRL's trainers whatever flags it is given."""
    path = _script_path(program)
    return any(_tail(path, tail) for tail, _ in _PATH_ERAS + _SCRIPT_NON_REENTRANT)


def script_reentrant(draft: Draft, program: str) -> tuple[bool, str] | None:
    """use_reentrant=False written by TRL's own example script in the releases whose copy writes it."""
    path = _script_path(program)
    for tail, spec in _SCRIPT_NON_REENTRANT:
        if _tail(path, tail):
            first, last = (part.lstrip("<>=") for part in spec.split(","))
            if since(draft, first) and not since(draft, last):
                return False, (f"TRL {spec} {tail} sets gradient_checkpointing_kwargs use_reentrant=False in its "
                               "code, over any flag")
            return None
    return None


LOG_PATHS = r"trl[/\\]trainer[/\\]|transformers[/\\]trainer\.py|accelerate[/\\]accelerator\.py|unsloth(?:_zoo)?[/\\]"
"""Frames of a run the HF Trainer / TRL frontend reads: TRL's and transformers' trainers, accelerate's, and Unsloth's,
which patches them (unsloth/models, unsloth_zoo)."""


def since(draft: Draft, version: str) -> bool:
    return at_least(draft, "trl", version)


def dpo(draft: Draft) -> None:
    """TRL's DPOTrainer: chosen and rejected in one forward; a policy trained in full has a second model as its
    reference, which under ZeRO-3 is built partitioned by zero.Init and was left to accelerate's prepare_model, which
    does not hand it to DeepSpeed, before 0.7.2 (PR #687 prepares it with deepspeed.initialize)."""
    draft.set("forwards_per_step", 1, "TRL concatenates chosen and rejected in one forward (trl/trainer/dpo_trainer.py)")
    if draft.get("adapter") == "full" and draft.get("engine") == "deepspeed" and draft.get("zero_stage") == 3:
        prepared = since(draft, "0.7.2")
        draft.set("model_outside_engine", not prepared, "TRL >= 0.7.2 prepares the reference model with DeepSpeed "
                  "(dpo_trainer.py _prepare_deepspeed, PR #687)" if prepared else "TRL < 0.7.2 leaves DPO's "
                  "reference model to accelerate's prepare_model, outside the DeepSpeed engine (trl#669)")


def hook(draft: Draft, trainer: str) -> tuple[bool, str]:
    """Whether this TRL trainer adds the input-grad hook to a PEFT model with checkpointing."""
    first = HOOK_SINCE.get(trainer, "0.22.0")
    if since(draft, first):
        return True, (f"TRL >= {first} calls enable_input_require_grads() for PEFT + checkpointing "
                      f"(trl/trainer/{trainer}_trainer.py)")
    return False, (f"TRL < {first}: the {trainer} trainer adds no input-grad hook to a PEFT model (only k-bit "
                   "preparation did)")


def cli_reentrant(draft: Draft, cli: str | None) -> tuple[bool, str] | None:
    """TRL 0.8.x's CLI wrote gradient_checkpointing_kwargs from --gradient_checkpointing_use_reentrant (default
    False); from 0.9 the flag parsed but did nothing, and 0.27 removed it."""
    if cli and since(draft, "0.8.0") and not since(draft, "0.9.0"):
        return False, "TRL 0.8.x CLI: gradient_checkpointing_kwargs from --gradient_checkpointing_use_reentrant " \
                      "(default false)"
    return None


def paged_eval(draft: Draft, trainer: str, paged: bool) -> bool:
    """The policy is left in eval mode at backward (GRPO/RLOO with use_transformers_paged, TRL 0.20 - 0.23)."""
    if not paged or trainer not in PAGED_EVAL:
        return False
    spec, start = PAGED_EVAL[trainer]
    return since(draft, start) and not since(draft, "0.24.0")


# --- Rollouts on vLLM (--use_vllm) -----------------------------------------------------------------------------
# TRL = https://github.com/huggingface/trl/blob/f2cd57710ae345ea6428ae95363267fcf38a3dc8 (main after v1.9.0)
# The trainers that sample with vLLM when --use_vllm is on (GRPOConfig, RLOOConfig, OnlineDPOConfig).
VLLM_TRAINERS = ("grpo", "rloo", "online_dpo")
# TRL 0.14 loaded the PEFT model's own state_dict into vLLM (https://github.com/huggingface/trl/issues/2698); 0.15
# merges the adapter and strips PEFT's prefixes first (https://github.com/huggingface/trl/pull/2725; now
# TRL/trl/generation/vllm_generation.py#L456-L473 _iter_named_params), so the engine gets merged weights under the base
# model's names.
MERGED_SYNC_SINCE = "0.15.0"
# --vllm_mode came with 0.18 (https://github.com/huggingface/trl/pull/3394), server by default until 1.0 made colocate
# the default (TRL/trl/trainer/grpo_config.py#L584, TRL/MIGRATION.md); 0.14 - 0.15 ran vLLM in the training process on
# --vllm_device (auto: the first GPU no rank trains on; v0.14.0 grpo_trainer.py). The colocated share defaults to
# 0.3 from 0.18 (TRL/trl/trainer/grpo_config.py#L646), 0.9 before (https://github.com/huggingface/trl/issues/2688).
COLOCATE_DEFAULT_SINCE, COLOCATE_SHARE_SINCE = "1.0.0", "0.18.0"
# GRPO's importance-sampling correction against vLLM's log-probs, on by default (TRL/trl/trainer/grpo_config.py#L915,
# https://github.com/huggingface/trl/pull/3867).
IS_CORRECTION_SINCE = "0.23.0"
# vLLM asked for processed (temperature-scaled) log-probs: the colocated engine from
# https://github.com/huggingface/trl/pull/4163 (TRL/trl/generation/vllm_generation.py#L365), `trl vllm-serve` from
# https://github.com/huggingface/trl/pull/4873 (TRL/trl/scripts/vllm_serve.py#L361).
PROCESSED_COLOCATE_SINCE, PROCESSED_SERVER_SINCE = "0.24.0", "0.28.0"
# From 0.26 (https://github.com/huggingface/trl/pull/4571) waking a sleeping colocated engine reloaded the initial
# checkpoint from disk over the weights just synced (https://github.com/huggingface/trl/issues/5312, reproduced on
# 1.9.0). The fix (https://github.com/huggingface/trl/pull/5313) merged after v1.9.0; 1.16.0 is the first release whose
# source was read with it (generation/vllm_generation.py re-syncs after sleep), so 1.10 - 1.15 count as affected.
SLEEP_STALE = ("0.26.0", "1.16.0")


# Combination field -> the TRL flag that changes it (the rollout rules' knobs).
VLLM_FLAGS = {"engine_gpu_memory_utilization": "--vllm_gpu_memory_utilization",
              "rollout_colocated": "--vllm_mode server (a vLLM server on GPUs of its own, `trl vllm-serve`)",
              "rollout_sync_proven": "--vllm_enable_sleep_mode false", "adapter_rank": "--lora_r",
              "rollout_sync": "the TRL release (>= 0.15 merges the adapter before the sync)"}


def vllm_rollouts(draft: Draft, options: dict, trainer: str) -> None:
    """The vLLM rollout fields of a TRL run with --use_vllm (options: name -> (value, source))."""
    if trainer not in VLLM_TRAINERS or "use_vllm" not in options:
        return
    if not as_bool(*options["use_vllm"]):
        return
    sleeps = "vllm_enable_sleep_mode" in options and as_bool(*options["vllm_enable_sleep_mode"])
    apply_table(draft, options, _vllm_table(trainer, sleeps))
    if draft.get("engine") == "deepspeed" and draft.get("zero_stage") == 3 and _lora(draft) and since(draft, "0.14.0"):
        whole_model_sync(draft, "TRL gathers every parameter at once to merge the adapter before each sync "
                                "(grpo_trainer.py _move_model_to_vllm; trl/generation/vllm_generation.py in 1.x)")


def whole_model_sync(draft: Draft, why: str) -> None:
    """A sync that gathers the whole ZeRO-3 model on every rank (rule zero3-sync-full-gather) fails where the
    model's 16-bit copy does not fit beside the rank's share, which the launch does not show."""
    draft.maybe("sync_gathers_whole", {True: "the model's 16-bit copy does not fit one GPU beside the rank's "
                                             "shards (as a model trained under ZeRO-3 usually does not)",
                                       False: "the model's 16-bit copy fits one GPU beside the rank's shards"}, why)


def _lora(draft: Draft) -> bool:
    return draft.get("adapter") != "full"


def _sync(draft: Draft) -> tuple[str, str]:
    if _lora(draft) and not since(draft, MERGED_SYNC_SINCE):
        return "unmerged", ("TRL < 0.15 loads the PEFT model's own state_dict into vLLM (trl/trainer/grpo_trainer.py "
                            "_move_model_to_vllm; fixed by PR #2725)")
    return "merged", ("TRL merges the adapter and loads the merged weights under the base model's names "
                      "(trl/generation/vllm_generation.py _iter_named_params; grpo_trainer.py before 1.x)")


def _merge_into_quantized(draft: Draft) -> tuple[bool, str] | None:
    if draft.get("rollout_sync") != "merged" or not _lora(draft) or not draft.get("quantization"):
        return None
    return True, ("TRL merges the adapter into the quantized weights before each sync and unmerges it after "
                  "(merge_adapter / unmerge_adapter on PEFT's bitsandbytes layers)")


def _processed(draft: Draft) -> tuple[bool, str]:
    first = PROCESSED_COLOCATE_SINCE if draft.get("rollout_colocated") else PROCESSED_SERVER_SINCE
    where = "the colocated engine (PR #4163)" if draft.get("rollout_colocated") else "`trl vllm-serve` (PR #4873)"
    if since(draft, first):
        return True, f"TRL >= {first} starts {where} with logprobs_mode=processed_logprobs"
    return False, f"TRL < {first} leaves {where} in vLLM's default raw_logprobs mode"


def _vllm_table(trainer: str, sleeps: bool) -> tuple[Field, ...]:
    colocated = lambda d: d.get("rollout_colocated")  # noqa: E731

    def proven(draft: Draft) -> tuple[bool, str] | None:
        if draft.get("rollout_sync") == "unmerged":
            return None  # the first sync crashes (vllm-sync-peft-names)
        if sleeps and colocated(draft) and since(draft, SLEEP_STALE[0]) and not since(draft, SLEEP_STALE[1]):
            return False, (f"TRL {SLEEP_STALE[0]} - 1.15 with --vllm_enable_sleep_mode: waking the engine reloads the "
                           "initial checkpoint over the synced weights (trl#5312, fixed by PR #5313)")
        return True, "TRL reloads the updated weights into the engine before every generation (trl#3189)"

    return (
        fact("rollout_engine", "vllm", "--use_vllm (rollouts from vLLM)"),
        Field("adapter_rank", ("lora_r",), rank, Default(16, "default (TRL trl/trainer/model_config.py: lora_r 16)"),
              when=_lora),
        Field("rollout_sync", default=_sync),
        Field("merge_into_quantized", default=_merge_into_quantized),
        Field("rollout_colocated", ("vllm_mode",), lambda v, w: str(v) == "colocate", Default(
            False, "default (TRL < 1.0: vllm_mode server; before 0.18 vllm_device auto, a GPU no rank trains on)",
            since=(("trl", COLOCATE_DEFAULT_SINCE, True, "default (TRL >= 1.0 grpo_config.py: vllm_mode colocate)"),))),
        # TRL 0.14 - 0.15: the engine on a device rank 0 trains on (the trainer warns `is also used for training`).
        Field("rollout_colocated", ("vllm_device",), lambda v, w: True if str(v) == "cuda:0" else None),
        Field("engine_gpu_memory_utilization", ("vllm_gpu_memory_utilization",), fraction, Default(
            0.9, "default (TRL < 0.18 grpo_config.py: vllm_gpu_memory_utilization 0.9)",
            since=(("trl", COLOCATE_SHARE_SINCE, 0.3, "default (TRL >= 0.18 grpo_config.py: "
                    "vllm_gpu_memory_utilization 0.3, colocate mode)"),)), when=colocated),
        Field("rollout_logprobs_used", ("vllm_importance_sampling_correction",), default=Default(
            False, "TRL < 0.23 recomputes every log-prob with the trainer",
            since=(("trl", IS_CORRECTION_SINCE, True, "default (TRL >= 0.23 grpo_config.py: "
                    "vllm_importance_sampling_correction true, PR #3867)"),)), when=lambda d: trainer == "grpo"),
        fact("rollout_logprobs_used", False, f"TRL's {trainer} trainer recomputes every log-prob with the trainer "
             "(no importance-sampling correction against vLLM)", when=lambda d: trainer != "grpo"),
        Field("rollout_logprobs_processed", default=_processed),
        Field("rollout_sync_proven", default=proven),
        fact("rollout_verified", False, "TRL logs sampling/sampling_logp_difference but never stops on it "
             "(trl/trainer/grpo_trainer.py)"),
    )


def grpo_groups(draft: Draft, options: dict) -> None:
    """TRL's GRPO refuses, before the first step, a generation batch that does not hold whole groups of
    num_generations completions of one prompt: from 0.15 (PR #2776) per_device_train_batch_size counts completions.
    The batch it checks grew across releases (read from the trl wheels): processes x batch (0.15 - 0.16,
    grpo_trainer.py __init__), x gradient_accumulation_steps (0.17), x steps_per_generation or generation_batch_size
    (0.18 on, grpo_config.py __post_init__). Read only where the process count is on the launch line."""
    if not since(draft, "0.15.0") or not draft.has("world_size") or "world_size" in draft.unsure:
        return

    def number(key: str, default: int | None) -> int | None:
        value = options.get(key, (default, ""))[0]
        return int(value) if str(value).lstrip("-").isdigit() else None

    procs, batch, accum = (draft.get("world_size"), number("per_device_train_batch_size", 8),
                           number("gradient_accumulation_steps", 1))
    groups = number("num_generations", 8)
    if None in (batch, groups, accum):
        return
    ranks = f"{procs} process{'es' * (procs != 1)} x {batch}"
    if since(draft, "0.18.0") and "generation_batch_size" in options:
        size, shown, where = number("generation_batch_size", None), "--generation_batch_size", "grpo_config.py"
    elif since(draft, "0.17.0"):
        steps = number("steps_per_generation", accum) if since(draft, "0.18.0") else accum
        size, shown = None if steps is None else procs * batch * steps, f"{ranks} x {steps}"
        where = "grpo_config.py" if since(draft, "0.18.0") else "grpo_trainer.py"
    else:
        size, shown, where = procs * batch, ranks, "grpo_trainer.py"
    if size is None or (groups >= 2 and size % groups == 0 and groups <= size):
        return
    draft.stop(f"TRL GRPO refuses its generation batch ({shown} = {size} completions) for --num_generations {groups}: "
               f"each prompt's {groups} completions must fit whole in it (trl/trainer/{where}); make "
               f"--per_device_train_batch_size (or the process count, or the accumulation steps) a multiple of "
               f"{groups} in total, or pass --num_generations that divides {size}")
