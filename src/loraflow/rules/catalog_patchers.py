"""The rules of code that replaces what transformers would run: kernel patchers, libraries that swap a model's modules
or its trainer's code for their own kernels (Unsloth), and a Hub model's own modeling code (trust_remote_code), written
against the transformers of its day; either changes what the rest of the stack may assume."""

from __future__ import annotations

from loraflow.rules.refusals import UNSLOTH_VRAM, UNSLOTH_ZERO3, ZERO3_DEVICE_MAP
from loraflow.rules.rule import Rule, register
from loraflow.rules.signs import Evidence, LogSigns, Message

UNSLOTH_DDP_SINCE = "2026.6.2"
"""Unsloth's open-source releases refused more than one process until data-parallel support landed (PR #3917):
a comment in unslothai/unsloth#127 says it fixed that issue on 2026-06-10, and 2026.6.2 is the release uploaded
that day (release_dates.json); the maintainers' comment of 2026-06-18 in #2147 allows that it reached PyPI a
release or two later, so a run on 2026.6.2 - 2026.6.8 may still be refused."""

register(Rule(
    id="unsloth-multi-gpu",
    title="Unsloth on more than one GPU in a release without its multi-GPU support",
    verdict="error",
    impact="crash",
    conditions="a model patched by Unsloth (FastLanguageModel, LLaMA-Factory use_unsloth, ms-swift --tuner_backend "
               "unsloth) in a launch with more than one process (torchrun, accelerate, DeepSpeed, FSDP), or "
               "spread over several GPUs by device_map in one process",
    knobs=("unsloth", "world_size", "model_split"),
    affected={"unsloth": f"<{UNSLOTH_DDP_SINCE}"},
    when=lambda s: s.unsloth and (s.world_size > 1 or s.model_split),
    cause=("Unsloth's open-source releases supported one GPU: its trainer patch checks the world size (and, in "
           "older releases, the GPUs holding memory) and raises before the first step; runs that got past it "
           "(DeepSpeed through LLaMA-Factory's early integration) were unsupported and their results unverified "
           "by the maintainers. A model device_map spreads over several GPUs meets its patched kernels, which "
           "assume one device: tensors on two GPUs in one op."),
    fix="Launch on one GPU (one process, CUDA_VISIBLE_DEVICES=0 where device_map='auto' would spread the model), "
        "or drop Unsloth (LLaMA-Factory use_unsloth: false) for the multi-GPU run, or upgrade Unsloth to a release "
        "with multi-GPU support.",
    elsewhere="run one process (CUDA_VISIBLE_DEVICES=0) with Unsloth, or train without it under DDP/DeepSpeed/FSDP",
    references=("https://github.com/unslothai/unsloth/issues/859", "https://github.com/unslothai/unsloth/issues/2147",
                "https://github.com/unslothai/unsloth/issues/127",
                "https://github.com/hiyouga/LlamaFactory/issues/2253",
                "https://github.com/unslothai/unsloth/issues/2467",
                "https://github.com/unslothai/unsloth/blob/main/unsloth/models/llama.py (get_max_steps)"),
    fixed_in=UNSLOTH_DDP_SINCE,
    log=LogSigns(
        messages=(Message(r"Unsloth currently does not support multi GPU setups", "own",
                          "unsloth/models/_utils.py, llama.py: the trainer patch's GPU check"),
                  # The 2024 releases' wording, raised where the patched training loop is missing or finds several
                  # GPUs (llama.py get_peft_model / patch_peft_model, and the exec'd _fast_inner_training_loop).
                  Message(r"Unsloth currently does not work on multi GPU setups", "own",
                          "unsloth/models/llama.py: FastLlamaModel.get_peft_model and the patched train loop",
                          "unsloth 2024.x"),
                  UNSLOTH_VRAM,  # Unsloth 2024.6's wording (refusals.py)
                  UNSLOTH_ZERO3,  # LLaMA-Factory's refusal of use_unsloth under ZeRO-3 (refusals.py)
                  ZERO3_DEVICE_MAP,  # transformers' refusal of Unsloth's device_map under ZeRO-3 (refusals.py)
                  Message(r"Expected all tensors to be on the same device, but found at least two devices, "
                          r"cuda:\d+ and cuda:\d+", "generic", "a patched kernel given a model spread over GPUs")),
        evidence=(Evidence("unsloth", 3, "Unsloth loads the model (with a device_map of its own)"),),
        prior=1.0,
        tells_apart="Unsloth's own refusal of a multi-GPU launch"),
))


UNSLOTH_PRECISION_REFUSED = "2025.2.9"
"""Unsloth's patched TRL trainers refuse a mixed precision other than the model's half dtype from its release after
unslothai/unsloth#1701 (2025-02-13, unsloth/models/rl.py; 2025.2.9 was uploaded the next day)."""

register(Rule(
    id="unsloth-precision-mismatch",
    title="Unsloth refuses a mixed precision other than the model's dtype",
    verdict="error",
    impact="crash",
    conditions="a model loaded by Unsloth with adapters (not full fine-tuning) in bfloat16 and trained with fp16=True, "
               "or loaded in float16 and trained with bf16=True; Unsloth loads in bfloat16 where the GPU supports it "
               "unless told a dtype (dtype=None), float16 on a T4 or V100",
    knobs=("unsloth", "precision_against_load"),
    affected={"unsloth": f">={UNSLOTH_PRECISION_REFUSED}"},
    when=lambda s: s.unsloth and s.precision_against_load and s.adapter != "full",
    cause=("Unsloth's trainer patch compares the model's dtype with the trainer's fp16/bf16 before training and "
           "raises (`Unsloth: Model is in bfloat16 precision but you want to use float16 precision`): its kernels "
           "compute in the model's dtype, so the autocast of the other half dtype would mix them. Full fine-tuning "
           "is switched to the model's dtype instead."),
    fix="loraflow picks the mixed precision from the model's dtype.",
    elsewhere="set bf16=is_bfloat16_supported() and fp16=not is_bfloat16_supported() (Unsloth's notebooks), or load "
              "with dtype matching the trainer's flag; leaving both flags unset lets Unsloth choose",
    references=("https://github.com/unslothai/unsloth/pull/1701",
                "https://github.com/unslothai/unsloth/blob/main/unsloth/models/rl.py (the patched trainer's "
                "precision check)"),
    fixed_in="design (Unsloth refuses the pair since 2025.2.9)",
    log=LogSigns(
        messages=(Message(r"Unsloth: Model is in (bfloat16|float16) precision but you want to use (float16|bfloat16) "
                          r"precision", "own", "unsloth/models/rl.py: the patched trainer config's precision check"),),
        prior=1.0,
        tells_apart="Unsloth's own refusal names the model's dtype and the trainer's precision"),
))



register(Rule(
    id="liger-head-adapter-bypassed",
    title="Liger's fused loss reads lm_head's base weight: an adapter on the head never trains",
    verdict="error",
    impact="silent",
    conditions="Liger's fused linear cross entropy (use_liger_kernel / use_liger_loss, LLaMA-Factory "
               "enable_liger_kernel for pt/sft, axolotl liger_fused_linear_cross_entropy, ms-swift "
               "--use_liger_kernel) with a LoRA or DoRA layer on lm_head (lm_head in the target modules)",
    knobs=("head_adapter",),
    when=lambda s: s.adapter != "full" and s.head_adapter and s.liger_fused_ce,
    cause=("Liger fuses the output projection into the loss and passes it lm_head.weight instead of calling "
           "lm_head. On a PEFT layer that attribute is the frozen base weight, so the head's lora_A/lora_B (and "
           "DoRA's magnitude) never enter the graph: they get no gradient, stay at their initial value (lora_B "
           "zero) and are saved so, with no error while the other adapters train and the loss falls. A "
           "modules_to_save copy of lm_head is read correctly."),
    fix="loraflow does not use Liger's fused loss; train the head as a full copy (modules_to_save) or leave it "
        "out of the targets.",
    elsewhere="drop lm_head from the target modules (put it in modules_to_save to train it), or turn the fused "
              "cross entropy off (liger fused_linear_cross_entropy false); TRL >= 1.7 (GRPO) and >= 1.15 (SFT) "
              "refuse the pair",
    references=("https://github.com/huggingface/trl/issues/4612", "https://github.com/huggingface/trl/pull/5977",
                "https://github.com/huggingface/transformers/issues/34016"),
    fixed_in="not fixed in liger-kernel (0.8.5); TRL refuses it (GRPO 1.7.0, SFT 1.15.0)",
))

OLD_GC_HOOK_FALLBACK = "4.36.0"
"""transformers' gradient_checkpointing_enable calls a model's own _set_gradient_checkpointing(module, value) the old
way again when its signature has `value` (PR #27610, modeling_utils.py of the 4.35.2 and 4.36.0 wheels)."""
# Hub models whose remote code overrides _set_gradient_checkpointing(self, module, value=False): Qwen (Qwen-7B/14B,
# Qwen-VL), ChatGLM2/3, Baichuan / Baichuan2, InternLM (v1). None of them has native support in 4.35.
OLD_GC_HOOK_MODELS = ("qwen", "chatglm", "baichuan", "internlm")


register(Rule(
    id="remote-code-old-gc-hook",
    title="transformers 4.35 calls a remote-code model's checkpointing hook with a keyword it does not take",
    verdict="fix",
    impact="crash",
    conditions="activation checkpointing on a model run from its own Hub code (trust_remote_code: Qwen-1, "
               "ChatGLM2/3, Baichuan, InternLM v1) with transformers 4.35.x",
    knobs=("checkpointing",),
    affected={"transformers": f">=4.35.0,<{OLD_GC_HOOK_FALLBACK}"},
    when=lambda s: s.checkpointing != "off" and s.model_type in OLD_GC_HOOK_MODELS,
    cause=("Before 4.35 gradient_checkpointing_enable applied the model's _set_gradient_checkpointing(module, "
           "value=True) to every module, and the Hub code of these models overrides that hook with that signature. "
           "transformers 4.35 refactored checkpointing and calls the hook as _set_gradient_checkpointing(enable=True, "
           "gradient_checkpointing_func=...), which the old override does not accept, so the Trainer (or PEFT's "
           "prepare_model_for_kbit_training) stops before the first step: `_set_gradient_checkpointing() got an "
           "unexpected keyword argument 'enable'`. 4.36 calls the old signature again."),
    fix="loraflow requires transformers >= 5.6, which calls an old-style hook the old way (its fallback since 4.36).",
    remedy=lambda s: {"checkpointing": "off"},
    elsewhere="transformers >= 4.36 (or <= 4.34), a model revision whose code drops the override, or checkpointing "
              "off",
    references=("https://github.com/huggingface/transformers/issues/27596",
                "https://github.com/huggingface/transformers/pull/27610", "https://github.com/QwenLM/Qwen/issues/661",
                "https://github.com/axolotl-ai-cloud/axolotl/issues/895",
                "https://github.com/modelscope/ms-swift/issues/142",
                "https://github.com/hiyouga/LlamaFactory/issues/1391",
                "https://github.com/datawhalechina/self-llm/issues/34"),
    fixed_in=f"transformers {OLD_GC_HOOK_FALLBACK}",
    log=LogSigns(
        messages=(Message(r"_set_gradient_checkpointing\(\) got an unexpected keyword argument 'enable'", "own",
                          "transformers modeling_utils.py gradient_checkpointing_enable (4.35) into a remote-code "
                          "override"),),
        # diffusers' own models met the same refactor in their code, another fix (not this rule's)
        evidence=(Evidence("diffusers", -6, "diffusers' models are in the traceback, not a Hub model's remote code",
                           excludes=True),),
        prior=1.0,
        tells_apart="the remote-code model's old checkpointing hook is called with the new keyword"),
))
