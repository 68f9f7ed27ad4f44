"""FlashAttention in an HF Trainer / TRL run (rule flash-attn-fp32-inputs): the flash-attn kernels take only float16
and bfloat16. transformers casts float32 queries back to the autocast dtype, else to a quantized model's
_pre_quantization_dtype, else to q_proj's weight dtype (integrations/flash_attention.py get_target_dtype; the same
logic in each model's FlashAttention2 class since 4.34): with float32 weights and no mixed precision nothing is cast,
and the kernel refuses. Before 4.37 from_pretrained refused an explicit float32 dtype with flash_attention_2 at
load (modeling_utils.py _check_and_enable_flash_attn_2); from 4.37 it only warns."""

from __future__ import annotations

from loraflow.frontends.common import Draft, at_least
from loraflow.frontends.hf_options import Opt

FLASH = ("flash_attention_2", "flash_attention_3")


def flash_fp32(draft: Draft, opts: dict[str, Opt]) -> None:
    impl = opts.get("attn_implementation")
    old = opts.get("use_flash_attention_2")
    if impl is not None and str(impl.value).lower() in FLASH:
        asked = impl.source
    elif old is not None and str(old.value).lower() in ("true", "1"):
        asked = old.source
    else:
        return
    if "flash_attention_3" not in str(asked):  # FlashAttention-2's own branches (rule fa2-right-padding-cache)
        draft.set("flash_attention", True, asked)
    rows = opts.get("per_device_train_batch_size")
    if rows is not None and str(rows.value).strip() == "1":  # one row: nothing to pad it to
        draft.set("padded_rows", False, f"{rows.source} (one row per micro-batch)")
    if draft.get("precision") != "fp32":
        return  # autocast's dtype is what transformers casts the queries to
    dtype = opts.get("dtype") or opts.get("torch_dtype")
    value = str(dtype.value).lower().removeprefix("torch.") if dtype is not None else ""
    if value in ("float32", "fp32", "float"):
        # A quantized model's queries are cast to its _pre_quantization_dtype: the dtype it was loaded with.
        why = f"{dtype.source}: float32 weights" + (" (the quantized model's pre-quantization dtype)"
                                                     if draft.get("quantization") else "")
    elif draft.get("quantization"):
        return  # bitsandbytes loads with float16 when no dtype is given (its _pre_quantization_dtype)
    elif value in ("", "none") and not at_least(draft, "transformers", "5.0.0"):
        why = "no dtype given: transformers < 5 loads float32 weights"
    else:  # half precision, or "auto" (the checkpoint's, half for most; transformers >= 5's default)
        draft.set("flash_attn_fp32", False, f"{asked} with {value or 'auto'} weights")
        return
    draft.set("flash_attn_fp32", True, f"{asked}, {why}, no bf16/fp16 mixed precision (no autocast)")
