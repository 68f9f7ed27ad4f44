"""What transformers allows with a bitsandbytes-quantized model after it is loaded, per release: read by the script
reader and by the frontends whose framework moves a quantized model itself (a DeepSpeed engine calls
module.to(device) on the model it wraps: DeepSpeedEngine._configure_distributed_model)."""

from __future__ import annotations

from loraflow.frontends.common import Draft, at_least

# transformers' PreTrainedModel.to refuses an 8-bit model, and a 4-bit one unless bitsandbytes >= 0.43.2, which
# moves 4-bit weights across devices (modeling_utils.py; older transformers refused every k-bit move).
MOVE_4BIT_SINCE = "0.43.2"


def move_refused(draft: Draft, bits: str | None) -> bool:
    """Whether transformers refuses `.to(device)` on a model loaded in `bits` (4bit / 8bit) in this evaluation."""
    return bits == "8bit" or (bits == "4bit" and not at_least(draft, "bitsandbytes", MOVE_4BIT_SINCE))


# BitsAndBytesConfig takes bnb_4bit_quant_storage from transformers 4.39.0 (the FSDP-QLoRA release), and bitsandbytes
# stores Params4bit in it from 0.43.0 (bitsandbytes PR #970). An older transformers leaves the argument unused (its
# `Unused kwargs` warning): the weights stay packed in uint8 whatever the framework asked for.
QUANT_STORAGE_SINCE = (("transformers", "4.39.0"), ("bitsandbytes", "0.43.0"))


def storage_honoured(draft: Draft) -> bool:
    """Whether a bnb_4bit_quant_storage the framework passes takes effect in this evaluation (every boundary is
    queried, so `check` evaluates both sides of each)."""
    return all([at_least(draft, package, since) for package, since in QUANT_STORAGE_SINCE])
