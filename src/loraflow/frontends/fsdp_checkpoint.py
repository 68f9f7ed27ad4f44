"""The HF Trainer's resumable FSDP checkpoints, as rule fsdp2-adapter-resume-lost reads them: which state dict type
accelerate's FSDP plugin saves them with, whether only the adapter goes through it, and whether the run reloads one.
Read for every framework whose checkpoints are the Trainer's (HF scripts, TRL, LLaMA-Factory, axolotl, ms-swift)."""

from __future__ import annotations

from typing import Any

from loraflow.errors import LoraflowError
from loraflow.frontends.common import Draft, as_bool, at_least

TRAINER_FSDP2_DEFAULT = "5.10.0"
"""TrainingArguments' `--fsdp` builds FSDP2 (fsdp_config version 2) with state_dict_type FULL_STATE_DICT unless the
fsdp_config says otherwise (transformers training_args.py; version 1 and accelerate's default type before)."""
ADAPTER_ONLY_SINCE = "4.38.0"
"""Trainer._get_fsdp_ckpt_kwargs passes adapter_only=True to accelerate's save_fsdp_model / load_fsdp_model."""

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


def trainer_checkpoints(draft: Draft, settings: dict[str, tuple[Any, str]], trainer_fsdp: bool) -> None:
    """Once the engine is known. `settings`: the run's TrainingArguments values, name -> (value, source);
    `trainer_fsdp`: FSDP was asked for through TrainingArguments' `--fsdp` (not an accelerate config alone)."""
    engine = draft.get("engine")
    if engine not in ("fsdp1", "fsdp2"):
        return
    if trainer_fsdp and at_least(draft, "transformers", TRAINER_FSDP2_DEFAULT):
        draft.default("fsdp_state_dict", "full", "transformers >= 5.10 TrainingArguments: fsdp_config "
                      "state_dict_type FULL_STATE_DICT")
    else:
        draft.default("fsdp_state_dict", "full" if engine == "fsdp1" else "sharded", "accelerate's FSDP plugin: "
                      "FULL_STATE_DICT for FSDP1, SHARDED_STATE_DICT for FSDP2 (utils/dataclasses.py)")
    draft.set("checkpoint_adapter_only", at_least(draft, "transformers", ADAPTER_ONLY_SINCE),
              "transformers >= 4.38 Trainer passes adapter_only=True to accelerate's save_fsdp_model / "
              "load_fsdp_model (trainer.py _get_fsdp_ckpt_kwargs)")
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
