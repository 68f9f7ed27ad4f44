"""The flags llama-recipes' finetuning.main accepts, per config dataclass, and the releases some of them date: read at
src/llama_recipes/configs/ (training.py, fsdp.py, peft.py, quantization.py, wandb.py, datasets.py) at each release
tag. Part of the llama-recipes frontend (llama_recipes.py)."""

from __future__ import annotations

# The fields every release's dataclasses have (0.0.1, the PyPI wheel = commit 190c2e52).
_TRAIN = ("model_name", "enable_fsdp", "low_cpu_fsdp", "run_validation", "batch_size_training",
          "gradient_accumulation_steps", "num_epochs", "num_workers_dataloader", "lr", "weight_decay", "gamma", "seed",
          "use_fp16", "mixed_precision", "val_batch_size", "dataset", "peft_method", "use_peft", "output_dir",
          "freeze_layers", "num_freeze_layers", "quantization", "one_gpu", "save_model", "dist_checkpoint_root_folder",
          "dist_checkpoint_folder", "save_optimizer", "use_fast_kernels")
_FSDP = ("mixed_precision", "use_fp16", "sharding_strategy", "checkpoint_type", "fsdp_activation_checkpointing",
         "pure_bf16", "optimizer")
# Fields later releases added: (field, the releases that have it). training.py / fsdp.py at v0.0.2, quantization.py
# and from_peft_checkpoint at v0.0.3 (PR #572), freeze_LLM_only at v0.0.5 (PR #791).
ERA_KEYS = tuple((k, ">=0.0.2") for k in (
    "tokenizer_name", "batching_strategy", "context_length", "gradient_clipping", "gradient_clipping_threshold",
    "max_train_step", "max_eval_step", "use_wandb", "save_metrics", "flop_counter", "flop_counter_start",
    "use_profiler", "profiler_dir", "hsdp", "sharding_group_size", "replica_group_size", "fsdp_cpu_offload")) + tuple(
    (k, ">=0.0.3") for k in ("from_peft_checkpoint", "quant_type", "compute_dtype", "use_double_quant",
                             "quant_storage")) + (("freeze_LLM_only", ">=0.0.5"),)
_LATER_TRAIN = ("tokenizer_name", "batching_strategy", "context_length", "gradient_clipping",
                "gradient_clipping_threshold", "max_train_step", "max_eval_step", "use_wandb", "save_metrics",
                "flop_counter", "flop_counter_start", "use_profiler", "profiler_dir", "from_peft_checkpoint",
                "freeze_LLM_only")
_LATER_FSDP = ("hsdp", "sharding_group_size", "replica_group_size", "fsdp_cpu_offload")
CONFIG_KEYS: dict[str, frozenset[str]] = {
    "train_config": frozenset(_TRAIN + _LATER_TRAIN),
    "fsdp_config": frozenset(_FSDP + _LATER_FSDP),
    "lora_config": frozenset(("r", "lora_alpha", "target_modules", "bias", "task_type", "lora_dropout",
                              "inference_mode")),
    "llama_adapter_config": frozenset(("adapter_len", "adapter_layers", "task_type")),
    "prefix_config": frozenset(("num_virtual_tokens", "task_type")),
    "quantization_config": frozenset(("quant_type", "compute_dtype", "use_double_quant", "quant_storage")),
    "wandb_config": frozenset(("project", "entity", "job_type", "tags", "group", "notes", "mode")),
    # configs/datasets.py: the fields the dataset configs share (a dotted `--custom_dataset.file` names its own).
    "dataset": frozenset(("train_split", "test_split", "data_path", "file", "trust_remote_code")),
}
# Flags only llama-recipes' finetuning takes (to tell its `finetuning.py` from another repository's).
OWN_FLAGS = frozenset(("enable_fsdp", "use_peft", "peft_method", "batch_size_training", "dist_checkpoint_root_folder",
                       "dist_checkpoint_folder", "pure_bf16", "low_cpu_fsdp", "use_fast_kernels", "batching_strategy",
                       "num_freeze_layers", "val_batch_size", "from_peft_checkpoint", "freeze_LLM_only"))
# Where finetuning.py was in the repository, and the releases that shipped it there (git history of
# meta-llama/llama-recipes; a clone's script imports the package of the same tree).
SCRIPTS = (
    (r"(?:^|/)llama_finetuning\.py$", "<0.0.2", "llama_finetuning.py is the 2023-07 layout, before 0.0.2"),
    (r"(?:^|/)examples/finetuning\.py$", "<0.0.2", "examples/finetuning.py is the layout of 2023-09 to 2024-03 "
     "(llama-recipes 0.0.1)"),
    (r"(?:^|/)recipes/finetuning/finetuning\.py$", ">=0.0.2,<0.0.3", "recipes/finetuning/finetuning.py is the layout "
     "of llama-recipes 0.0.2"),
    (r"(?:^|/)recipes/quickstart/finetuning/finetuning\.py$", ">=0.0.3,<0.0.5", "recipes/quickstart/finetuning/ is "
     "the layout of llama-recipes 0.0.3 - 0.0.4"),
    (r"(?:^|/)getting-started/finetuning/finetuning\.py$", ">=0.0.5", "getting-started/finetuning/ is the layout of "
     "llama-cookbook 0.0.5 on"),
    (r"(?:^|/)src/llama_(?:recipes|cookbook)/finetuning\.py$", None, ""),
)
