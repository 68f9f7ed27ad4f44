"""The HF Trainer's resumable checkpoints: under FSDP, which state dict type accelerate's plugin saves them with and
whether only the adapter goes through it (rule fsdp2-adapter-resume-lost); under DeepSpeed, whether the engine
checkpoint keeps the frozen weights (rules zero-checkpoint-frozen-base, zero-peft-resume-strict); and whether the run
reloads one. Read for every framework whose checkpoints are the Trainer's (HF scripts, TRL, LLaMA-Factory, axolotl,
ms-swift)."""

from __future__ import annotations

import re
from typing import Any

from loraflow.errors import LoraflowError
from loraflow.frontends.common import Draft, as_bool, at_least
from loraflow.rules.signs import BNB_8BIT_OPTIMIZERS

TRAINER_FSDP2_DEFAULT = "5.10.0"
"""TrainingArguments' `--fsdp` builds FSDP2 (fsdp_config version 2) with state_dict_type FULL_STATE_DICT unless the
fsdp_config says otherwise (transformers training_args.py; version 1 and accelerate's default type before)."""
ADAPTER_ONLY_SINCE = "4.38.0"
"""Trainer._get_fsdp_ckpt_kwargs passes adapter_only=True to accelerate's save_fsdp_model / load_fsdp_model."""
PEFT_EXCLUDES_FROZEN = "4.37.0"
"""Trainer._save_optimizer_and_scheduler passes exclude_frozen_parameters=True to DeepSpeed's save_checkpoint for a
PeftModel (transformers PR #27825); 4.37 still resumed with load_module_strict=True (fixed in 4.38, PR #28746)."""

_BNB_8BIT = re.compile(BNB_8BIT_OPTIMIZERS)

# accelerate's StateDictType by name or by number (FULL_STATE_DICT = 1, LOCAL_STATE_DICT = 2, SHARDED_STATE_DICT = 3);
# a local state dict is per rank like a sharded one.
_TYPES = {"FULL_STATE_DICT": "full", "1": "full", "SHARDED_STATE_DICT": "sharded", "3": "sharded",
          "LOCAL_STATE_DICT": "sharded", "2": "sharded"}


def trainer_fsdp_version(draft: Draft) -> int:
    """The FSDP version TrainingArguments' `--fsdp` builds when its fsdp_config names none."""
    return 2 if at_least(draft, "transformers", TRAINER_FSDP2_DEFAULT) else 1


def state_dict_type(draft: Draft, value: Any, source: str) -> None:
    """An FSDP config's state_dict_type (accelerate's fsdp_state_dict_type, the Trainer's fsdp_config)."""
    if value is None:
        return
    kind = _TYPES.get(str(value).strip().upper())
    if kind is None:
        raise LoraflowError(f"{source}: state_dict_type {value!r} is not one accelerate accepts "
                            "(FULL_STATE_DICT, SHARDED_STATE_DICT or LOCAL_STATE_DICT).")
    draft.set("fsdp_state_dict", kind, source)


def trainer_checkpoints(draft: Draft, settings: dict[str, tuple[Any, str]], trainer_fsdp: bool,
                        peft_model: bool | None = True) -> None:
    """Once the engine is known. `settings`: the run's TrainingArguments values, name -> (value, source);
    `trainer_fsdp`: FSDP was asked for through TrainingArguments' `--fsdp` (not an accelerate config alone);
    `peft_model`: the trained model is a PeftModel (None: not known, as for a script whose own flag adds adapters,
    which may wrap a submodule only: InternVL's wrap_llm_lora)."""
    engine = draft.get("engine")
    only_model = settings.get("save_only_model")
    unknown = peft_model is None and draft.get("adapter") != "full"
    if engine == "deepspeed" and not unknown and not (only_model is not None and
                                                      as_bool(only_model[0], only_model[1])):
        peft = at_least(draft, "transformers", PEFT_EXCLUDES_FROZEN)
        draft.set("engine_checkpoints", "peft-trainable" if peft else "all", "the Trainer's DeepSpeed checkpoints: "
                  + ("save_checkpoint(exclude_frozen_parameters=True) for a PeftModel from transformers 4.37 "
                     "(trainer.py _save_optimizer_and_scheduler)" if peft else "save_checkpoint keeps every weight "
                     "before transformers 4.37"))
        _resumes(draft, settings)
    if engine not in ("fsdp1", "fsdp2"):
        return
    _optimizer_state(draft, settings)
    if trainer_fsdp and at_least(draft, "transformers", TRAINER_FSDP2_DEFAULT):
        draft.default("fsdp_state_dict", "full", "transformers >= 5.10 TrainingArguments: fsdp_config "
                      "state_dict_type FULL_STATE_DICT")
    else:
        draft.default("fsdp_state_dict", "full" if engine == "fsdp1" else "sharded", "accelerate's FSDP plugin: "
                      "FULL_STATE_DICT for FSDP1, SHARDED_STATE_DICT for FSDP2 (utils/dataclasses.py)")
    if unknown:  # accelerate takes the adapter-only branch for a PeftModel only (is_peft_model)
        return
    draft.set("checkpoint_adapter_only", at_least(draft, "transformers", ADAPTER_ONLY_SINCE),
              "transformers >= 4.38 Trainer passes adapter_only=True to accelerate's save_fsdp_model / "
              "load_fsdp_model (trainer.py _get_fsdp_ckpt_kwargs)")
    _resumes(draft, settings)


def _resumes(draft: Draft, settings: dict[str, tuple[Any, str]]) -> None:
    resume, best = settings.get("resume_from_checkpoint"), settings.get("load_best_model_at_end")
    auto = settings.get("auto_resume_from_checkpoints")  # axolotl: the newest checkpoint in output_dir
    if resume is not None and str(resume[0]).strip().lower() not in ("", "none", "null", "false", "~"):
        draft.set("resumes", True, resume[1])
    elif auto is not None and as_bool(auto[0], auto[1]):
        draft.set("resumes", True, auto[1])
    elif best is not None and as_bool(best[0], best[1]):
        draft.set("resumes", True, best[1] + " (reloads the best checkpoint)")
    else:
        draft.maybe("resumes", {True: "the run will be resumed from one of its checkpoints (resume_from_checkpoint)",
                                False: "the run is never resumed from its checkpoints"},
                    "whether the run is resumed later is not in the launch")


def _optimizer_state(draft: Draft, settings: dict[str, tuple[Any, str]]) -> None:
    """A bitsandbytes 8-bit optimizer, and whether the Trainer's checkpoints save its state (rule
    fsdp1-8bit-optimizer-save)."""
    optim = settings.get("optim") or settings.get("optimizer")
    if optim is None or not _BNB_8BIT.fullmatch(str(optim[0]).strip().lower()):
        return
    draft.set("optimizer_8bit", True, f"{optim[1]} (bitsandbytes: uint8 state beside float32 block statistics)")
    strategy, only = settings.get("save_strategy"), settings.get("save_only_model")
    if strategy is not None and str(strategy[0]).strip().lower() == "no":
        draft.set("saves_optimizer_state", False, f"{strategy[1]}: no checkpoint is saved")
    elif only is not None and as_bool(only[0], only[1]):
        draft.set("saves_optimizer_state", False, f"{only[1]}: checkpoints hold the model only")
    else:
        draft.set("saves_optimizer_state", True, (strategy[1] if strategy else "default (TrainingArguments "
                  "save_strategy steps, save_steps 500)") + ": every checkpoint saves the optimizer's state "
                  "(trainer.py _save_optimizer_and_scheduler)")
