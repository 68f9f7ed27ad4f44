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


def old_spellings(draft, opts: dict, eras: tuple) -> None:
    """Dates the release from the keys present (the frontend's era table and the llmtuner-era keys above), then reads
    a renamed key under its later name."""
    draft.eras_from("llama-factory", "LLaMA-Factory", eras + ERAS, opts)
    for old, new in RENAMED.items():
        if old in opts and new not in opts:
            opts[new] = opts.pop(old)
