"""Megatron-SWIFT: `megatron sft|pt|rlhf ...` (ms-swift's swift/cli/_megatron/, the `megatron` console script of
ms-swift >= 3.4), which trains on Megatron-Core: tensor / pipeline / expert parallel models, Megatron's own activation
recompute (`--recompute_granularity full|selective`), its distributed optimizer and precision, and LoRA layers of
ms-swift's own for Megatron's parallel linears (swift/megatron/tuners). None of that is an engine loraflow check
models: as for verl's and NeMo-RL's Megatron workers (verl_megatron.py), the stage, the adapter, the world size and
the model are read, and the Megatron settings are named in a note rather than listed as unread.

`--tuner_type lora_llm` (examples/megatron/multimodal/lora_llm_vit_full/sft.sh): LoRA on the language model, the
vision tower and aligner trained in full (`--vit_lr`, `--aligner_lr`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loraflow.frontends.argv import Command
from loraflow.frontends.common import Draft

SUBCOMMANDS = ("sft", "pt", "rlhf")

# Megatron-Core / Megatron-SWIFT flags of swift/megatron/argument/megatron_args.py (MegatronArguments: parallelism,
# recompute, batch, schedule, MoE, checkpoint and logging) that the launches of examples/megatron/ set.
KEYS = frozenset("""
tensor_model_parallel_size pipeline_model_parallel_size expert_model_parallel_size expert_tensor_parallel_size
context_parallel_size sequence_parallel decoder_first_pipeline_num_layers decoder_last_pipeline_num_layers
account_for_embedding_in_pipeline_split account_for_loss_in_pipeline_split virtual_pipeline_model_parallel_size
recompute_granularity recompute_method recompute_num_layers recompute_modules micro_batch_size global_batch_size
train_iters lr min_lr lr_warmup_fraction lr_warmup_iters lr_decay_style lr_decay_iters clip_grad finetune
cross_entropy_loss_fusion cross_entropy_fusion_impl moe_permute_fusion moe_grouped_gemm moe_shared_expert_overlap
moe_aux_loss_coeff moe_router_dtype moe_token_dispatcher_type moe_expert_capacity_factor moe_z_loss_coeff
moe_router_load_balancing_type attention_backend vit_lr aligner_lr load save mcore_model mcore_adapters
mcore_ref_model mcore_ref_adapter merge_lora use_distributed_optimizer overlap_grad_reduce overlap_param_gather
optimizer_cpu_offload optimizer_offload_fraction use_precision_aware_optimizer no_save_optim no_save_rng
no_load_optim no_load_rng save_interval eval_interval eval_iters log_interval tensorboard_dir wandb_project
wandb_exp_name wandb_save_dir no_gradient_accumulation_fusion no_masked_softmax_fusion no_bias_dropout_fusion
no_bias_swiglu_fusion no_rope_fusion calculate_per_token_loss loss_scale_window initial_loss_scale min_loss_scale
use_hf mtp_num_layers mtp_loss_scaling_factor fp8_format fp8_recipe fp8_amax_history_len fp8_amax_compute_algo
fp8_param_gather apply_wd_to_qk_layernorm freeze_llm freeze_vit freeze_aligner
""".split())


def subcommand(cmd: Command) -> str | None:
    """`megatron sft ...` -> "sft" (the console script is parsed as a program with its subcommand first)."""
    if Path(cmd.program).name != "megatron":
        return None
    head = cmd.subcommand or (cmd.args[0] if cmd.args else "")
    return head if head in SUBCOMMANDS else None


def recognise(view) -> bool:
    return Path(view.program).name == "megatron" and bool(set(view.positionals[:1]) & set(SUBCOMMANDS))


def apply(draft: Draft, opts: dict[str, tuple[Any, str]], sub: str) -> None:
    """A note on what is not evaluated, and the towers `--tuner_type lora_llm` trains in full."""
    given = sorted(k for k in opts if k in KEYS)
    draft.note(f"megatron {sub}: Megatron-SWIFT trains on Megatron-Core (tensor/pipeline/expert parallel, its own "
               "recompute, precision and distributed optimizer), which is not an engine loraflow check models; stage, "
               "adapter, world size and model are read, the sharding, checkpointing and precision rules are not "
               "evaluated" + (f" ({len(given)} Megatron settings given, e.g. {given[0]})" if given else ""))
    ttype = opts.get("tuner_type", opts.get("train_type"))
    if ttype is not None and str(ttype[0][0] if isinstance(ttype[0], list) else ttype[0]) == "lora_llm":
        draft.set("towers_trainable", True, f"{ttype[1]} (LoRA on the language model, the vision tower and aligner "
                  "trained in full)")
