"""The five reports loraflow was founded on: `explain` on the error text each one quotes and `check` on its launch,
written in that framework's style, at the versions where the failure happened (and without them)."""

from __future__ import annotations

import json
import shlex

from loraflow.frontends import parse_versions
from loraflow.explain import explain_text
from loraflow.frontends import run_check

_META = ("saved metadata: {{'shape': torch.Size([{saved}]), 'dtype': torch.{dtype}, 'device': device(type='cuda', "
         "index=0)}}\nrecomputed metadata: {{'shape': torch.Size([{recomputed}]), 'dtype': torch.{recomputed_dtype}, "
         "'device': device(type='cuda', index=0)}}\n")


def checked(line: str, versions: str = "") -> dict[str, str | None]:
    doc = json.loads(run_check(shlex.split(line), None, [], parse_versions(versions), as_json=True)[0])
    return {f["rule"]: f["holds_if"] for f in doc["findings"]}


def top(text: str) -> tuple[str, str]:
    candidates, _, _ = explain_text(text)
    return candidates[0].rule.id, candidates[0].confidence


def test_deepspeed_chat_step1_gradient_checkpointing_with_only_optimize_lora():
    """DeepSpeed-Chat, spring 2023: checkpointing with --only_optimize_lora freezes every input of the reentrant
    segments (no input-grad hook before PR #658)."""
    assert top("RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn\n") == (
        "reentrant-frozen-inputs", "possible")
    line = ("deepspeed main.py --model_name_or_path facebook/opt-1.3b --gradient_checkpointing --only_optimize_lora "
            "--lora_dim 128 --zero_stage 2 --deepspeed --output_dir out")
    assert checked(line, "deepspeed-chat=2023-05-10,transformers=4.29.2")["reentrant-frozen-inputs"] is None
    assert "deepspeed-chat<2023.8.3" in checked(line)["reentrant-frozen-inputs"]
    assert "reentrant-frozen-inputs" not in checked(line, "deepspeed-chat=2023-09-01,transformers=4.33.0")


def test_openrlhf_train_dpo_with_zero3_checkpointing_and_lora():
    text = ("[rank0]: torch.utils.checkpoint.CheckpointError: torch.utils.checkpoint: Recomputed values for the "
            "following tensors have different metadata than during the forward pass.\n[rank0]: tensor at position 4:\n"
            + _META.format(saved="4096", dtype="bfloat16", recomputed="0", recomputed_dtype="bfloat16"))
    assert top(text) == ("zero3-frozen-recompute", "confirmed")
    line = ("deepspeed --module openrlhf.cli.train_dpo --pretrain meta-llama/Meta-Llama-3-8B-Instruct --zero_stage 3 "
            "--gradient_checkpointing --lora_rank 32 --lora_alpha 64 --bf16 --flash_attn --beta 0.1")
    assert checked(line, "deepspeed=0.15.0")["zero3-frozen-recompute"] is None
    assert checked(line)["zero3-frozen-recompute"] is None  # every release with these flags pins DeepSpeed < 0.19.3


def test_vision_language_finetune_lora_with_zero3_json():
    """MiniCPM-V's finetune_lora.sh: LoRA on the language model, the vision tower trained in full, ZeRO-3 and
    checkpointing: the recompute saw shape [3584], then [0]."""
    text = "".join(_META.format(saved=s, dtype="float16", recomputed="0", recomputed_dtype="float16")
                   for s in ("3584", "3584, 3584", "3584"))
    assert top(text) == ("zero3-frozen-recompute", "confirmed")
    line = ("torchrun --nproc_per_node 8 finetune.py --model_name_or_path openbmb/MiniCPM-V-2_6 --llm_type qwen2 "
            "--use_lora true --tune_vision true --tune_llm false --gradient_checkpointing true --fp16 true "
            "--deepspeed ds_config_zero3.json --output_dir output")
    found = checked(line, "deepspeed=0.14.4,transformers=4.40.0")
    assert "zero3-frozen-recompute" in found  # whether the script checkpoints non-reentrant is its own choice
    assert "non-reentrant" in found["zero3-frozen-recompute"]


def test_peft_dora_under_accelerate_fsdp_with_checkpointing_and_bf16():
    """PEFT DoRA on FSDP2 with the Trainer's checkpointing and bf16 mixed precision: the recompute ran without FSDP2's
    casts (torch < 2.13)."""
    text = ("torch.utils.checkpoint.CheckpointError: torch.utils.checkpoint: Recomputed values for the following "
            "tensors have different metadata than during the forward pass.\ntensor at position 12:\n"
            + _META.format(saved="2, 512, 4096", dtype="bfloat16", recomputed="2, 512, 4096",
                           recomputed_dtype="float32"))
    assert top(text) == ("fsdp2-recompute-cast", "confirmed")
    line = ("accelerate launch --use_fsdp --fsdp_version 2 --num_processes 8 --mixed_precision bf16 train.py "
            "--use_peft --use_dora --lora_r 16 --gradient_checkpointing --bf16 --output_dir out")
    assert checked(line, "torch=2.5.1,transformers=4.57.0")["fsdp2-recompute-cast"] is None
    assert "fsdp2-recompute-cast" not in checked(line, "torch=2.13.0,transformers=5.23.0")


def test_swift_rlhf_grpo_under_zero3():
    """ms-swift GRPO without vLLM, early 2025: the policy left in eval mode after generating, then DeepSpeed
    <= 0.15.3 asserted in ZeRO-3's backward hooks."""
    assert top("AssertionError: backward pass is invalid for module in evaluation mode\n") == (
        "zero3-eval-backward", "confirmed")
    line = ("NPROC_PER_NODE=8 swift rlhf --rlhf_type grpo --model Qwen/Qwen2.5-7B-Instruct --train_type lora "
            "--deepspeed zero3 --reward_funcs accuracy --num_generations 8")
    assert checked(line, "ms-swift=3.1.0,deepspeed=0.14.5")["zero3-eval-backward"] is None
    assert "zero3-eval-backward" not in checked(line, "ms-swift=3.2.0,deepspeed=0.14.5")
    assert "ms-swift<3.1.1" in checked(line, "deepspeed=0.14.5")["zero3-eval-backward"]
