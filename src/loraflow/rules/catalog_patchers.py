"""The rules of kernel patchers: libraries that replace a model's modules or its trainer's code with their own
kernels (Unsloth) and so change what the rest of the stack may assume."""

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
               "unsloth) in a launch with more than one process (torchrun, accelerate, DeepSpeed, FSDP)",
    knobs=("unsloth", "world_size"),
    affected={"unsloth": f"<{UNSLOTH_DDP_SINCE}"},
    when=lambda s: s.unsloth and s.world_size > 1,
    cause=("Unsloth's open-source releases supported one GPU: its trainer patch checks the world size (and, in "
           "older releases, the GPUs holding memory) and raises before the first step; runs that got past it "
           "(DeepSpeed through LLaMA-Factory's early integration) were unsupported and their results unverified "
           "by the maintainers."),
    fix="Launch on one GPU (one process), or drop Unsloth (LLaMA-Factory use_unsloth: false) for the multi-GPU "
        "run, or upgrade Unsloth to a release with data-parallel support.",
    elsewhere="run one process (CUDA_VISIBLE_DEVICES=0) with Unsloth, or train without it under DDP/DeepSpeed/FSDP",
    references=("https://github.com/unslothai/unsloth/issues/859", "https://github.com/unslothai/unsloth/issues/2147",
                "https://github.com/unslothai/unsloth/issues/127",
                "https://github.com/hiyouga/LlamaFactory/issues/2253",
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
                  ZERO3_DEVICE_MAP),  # transformers' refusal of Unsloth's device_map under ZeRO-3 (refusals.py)
        evidence=(Evidence("unsloth", 3, "Unsloth loads the model (with a device_map of its own)"),),
        prior=1.0,
        tells_apart="Unsloth's own refusal of a multi-GPU launch"),
))
