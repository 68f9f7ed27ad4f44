"""The dtype the trained weights are stored in when a framework loads the base in half precision and adds PEFT
adapters: one fact of PEFT's releases, read by every frontend whose framework does that (a training script's code,
LLaMA-Factory's loader), so it is declared once."""

from __future__ import annotations

from loraflow.enginespec import engine_spec
from loraflow.frontends.common import Draft, at_least

# PEFT's LoRA layers take the dtype of the layer they wrap from 0.7.0, when the base_layer refactor made the base
# weight visible as the adapter is created (tuners/lora/layer.py update_layer: `self.to(weight.device,
# dtype=weight.dtype)`); in 0.6 the new layer had no weight yet at that point and _replace_module moved the adapters
# to the device only, so they stayed float32. From 0.12 get_peft_model upcasts half adapters to float32
# (tuners_utils.py _cast_adapter_dtype, autocast_adapter_dtype=True).
FOLLOWS_BASE = ("0.7.0", "0.12.0")
WHY = ("peft 0.7 - 0.11 create LoRA weights in the base layer's dtype (0.12 keeps them in float32: "
       "autocast_adapter_dtype)")


def adapters_follow_base(draft: Draft) -> bool:
    """Whether this evaluation's PEFT creates LoRA weights in the dtype of a (non-quantized) base layer."""
    since, until = FOLLOWS_BASE
    return at_least(draft, "peft", since) and not at_least(draft, "peft", until)


def trained_in_half(draft: Draft, dtype: str, source: str) -> None:
    """The weights that train are stored in `dtype` ("bfloat16" / "float16"). Under fp16 mixed precision the loss
    scaler then unscales float16 gradients (precision `fp16`); DeepSpeed keeps float32 master weights of whatever it
    trains, so there nothing changes."""
    if engine_spec(draft.get("engine")).zero:
        return
    if dtype == "bfloat16":
        draft.set("precision", "bf16", source)
    elif draft.get("precision") == "fp16-mixed":  # fp16 loss scaling over fp16 weights
        draft.set("precision", "fp16", source)
    else:
        draft.note(f"{source}: trained in float16 without loss scaling (fp16=True is off)")
