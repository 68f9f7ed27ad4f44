"""LLaMA-Factory keys of its `llmtuner` era (src/llmtuner/hparams/, before the package was renamed `llamafactory` in
v0.8.0) that later releases renamed or dropped, and that say nothing about the rules: freeze tuning's module names,
the DPO/PPO options before their `pref_*` names, data options. Users' `src/train_bash.py` launches still set them
(flashlin/Samples torch-qa/LLaMA-Factory: `--resume_lora_training True`). Keys that do matter stay unread:
`checkpoint_dir` (loads adapters); `sft_packing` is read as the `packing` it was renamed to.

Read from hiyouga/LLaMA-Factory at llmtuner-era commits: src/llmtuner/hparams/finetuning_args.py (031f4795:
FreezeArguments name_module_trainable / num_layer_trainable, RLHFArguments dpo_beta / dpo_loss / dpo_ftx /
ppo_logger; earlier versions LoraArguments resume_lora_training, default True: resume the loaded adapter as
trainable) and src/llmtuner/hparams/data_args.py (01d478be: split, train_last_turn_only, reserved_label_len,
cache_path)."""

from __future__ import annotations

import re

OLD = frozenset({"name_module_trainable", "num_layer_trainable", "dpo_beta", "dpo_loss", "dpo_ftx", "ppo_logger",
                 "resume_lora_training", "split", "train_last_turn_only", "reserved_label_len", "cache_path"})

# Renamed keys of the same meaning: data_args.py (01d478be) `sft_packing` "Packing the questions and answers in the
# supervised fine-tuning stage" (preprocess_packed_supervised_dataset: examples concatenated into cutoff_len blocks),
# which later releases call `packing`.
RENAMED = {"sft_packing": "packing"}

# Each dates the launch: the key exists only in the llmtuner era (src/llmtuner/ was renamed in v0.8.0);
# resume_lora_training is already gone at 031f4795 (GaLore, v0.6 of March 2024: create_new_adapter instead), so
# before the first PyPI release 0.7.1 that the release table starts at.
ERAS = tuple((key, "<0.7.1" if key == "resume_lora_training" else "<0.8.0") for key in sorted(OLD | set(RENAMED)))


# Before src/train_bash.py --stage (v0.1, July 2023), LLaMA-Efficient-Tuning ran one script per stage:
# src/train_sft.py, train_pt.py, train_rm.py, train_ppo.py (hiyouga/LLaMA-Factory 17024ebc src/train_sft.py:
# prepare_args(stage="sft"), load_pretrained(...)); ChatGLM-Efficient-Tuning, its sibling, kept the layout
# (YerongLi/ChatGLM-Efficient-Tuning train.sh: `python src/train_sft.py --finetuning_type lora --quantization_bit 4`).
# `src/train_sft.py` is a common name: only with LLaMA-Factory's own flags (see _recognise).
_STAGE_SCRIPT = re.compile(r"(?:^|/)src/train_(sft|pt|rm|ppo|dpo)\.py$")


def stage_script(program: str) -> str | None:
    """The stage a per-stage script of LLaMA-Efficient-Tuning runs, or None."""
    found = _STAGE_SCRIPT.search(program.replace("\\", "/"))
    return found.group(1) if found else None


def old_spellings(draft, opts: dict, eras: tuple, program: str = "") -> None:
    """Dates the release from the keys present (the frontend's era table and the llmtuner-era keys above), reads a
    renamed key under its later name, and a per-stage script's stage."""
    stage = stage_script(program)
    if stage:
        opts.setdefault("stage", (stage, f"{program} (LLaMA-Efficient-Tuning's {stage} script)"))
        draft.era("llama-factory", "<0.7.1", f"{program} is LLaMA-Efficient-Tuning's layout, before train_bash.py")
    draft.eras_from("llama-factory", "LLaMA-Factory", eras + ERAS, opts)
    for old, new in RENAMED.items():
        if old in opts and new not in opts:
            opts[new] = opts.pop(old)
