"""TRL's defaults per release, read by the HF Trainer / TRL frontend (hf.py). TRL's own git history gives the first
tag of each change; without `--versions trl=X`, `check` evaluates every release range these boundaries make."""

from __future__ import annotations

from packaging.version import Version

from loraflow.frontends.common import Draft, at_least
from loraflow.frontends.table import stages

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
         ("ds3_gather_for_generation", ">=0.14.0"))
_CLI_ERAS = {"grpo": ">=0.14.0", "rloo": ">=0.22.0", "reward": ">=0.27.0", "sft": ">=0.8.0", "dpo": ">=0.8.0",
             "kto": ">=0.13.0"}
# TRL before 0.27 does not install with transformers 5 (its releases predate it).
DEPENDS = (("trl", "<0.27.0", {"transformers": "<5.0.0"}),)


def eras(draft: Draft, given: set[str], cli: str | None) -> None:
    """The TRL releases a command can be: from the transformers given beside it and from its flag spellings."""
    transformers = draft.version("transformers")
    if draft.version("trl") is None and transformers is not None and transformers < Version("5.0.0"):
        for limit, trl in _FOR_TRANSFORMERS:
            if transformers < Version(limit):
                draft.era("trl", f"<={trl}", f"TRL {trl} is the newest that installs with transformers {transformers} "
                          f"(later TRL needs transformers >= {limit})")
                break
    draft.eras_from("trl", "TRL", _ERAS, given, prefix="--")
    if cli in _CLI_ERAS:
        draft.era("trl", _CLI_ERAS[cli], f"`trl {cli}` exists in TRL {_CLI_ERAS[cli]}")


def since(draft: Draft, version: str) -> bool:
    return at_least(draft, "trl", version)


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
