"""The quantization area (QLoRA): what bitsandbytes quantizes and how, and the k-bit preparation (what peft's
prepare_model_for_kbit_training does, each part decided here)."""

from __future__ import annotations

import torch

from loraflow.config.schema import Config
from loraflow.errors import ConfigError
from loraflow.plan.context import Context, dtype_name
from loraflow.plan.types import Decision
from loraflow.setup.model import ModelInfo
from loraflow.setup.quantize import Quantization


def storage_matches(config: Config, load_dtype: torch.dtype) -> bool:
    """Whether the asked 4-bit storage dtype is the dtype sharding would see beside it (auto: loraflow picks it)."""
    asked = config.model.quantization.storage_dtype
    return asked == "auto" or getattr(torch, asked) == load_dtype


def decide_quantization(ctx: Context, load_dtype: torch.dtype, modules_to_save: list[str],
                        input_grad_hook: bool) -> tuple[Quantization | None, list[Decision]]:
    """bitsandbytes settings (setup/quantize.py). Compute dtype: the precision's matmul dtype unless asked. Storage:
    uint8 unless parameters are sharded, where it must be the dtype of the other weights (rule qlora-storage-dtype,
    which fixes an explicit storage_dtype that differs). Heads and modules trained in full stay unquantized. The
    schema's dtype choices are torch's own names."""
    config, info, final = ctx.config, ctx.model, ctx.setup
    q = config.model.quantization
    _check_prequantized(config, info)
    if not q.enabled:
        return None, []
    compute = getattr(torch, q.compute_dtype) if q.compute_dtype != "auto" else \
        (torch.float32 if config.precision.mode == "fp32" else torch.bfloat16)
    if final.sharded_params and final.quant_storage_matches:
        storage = load_dtype
    else:
        storage = torch.uint8 if q.storage_dtype == "auto" else getattr(torch, q.storage_dtype)
    head_name = "score" if ctx.spec.head == "score" else info.lm_head_name
    # An image-text model quantizes its language model only. Its vision encoder and projector are a few percent of
    # the weights, so quantizing them saves little while degrading the image features a frozen tower feeds the
    # adapters (llm-compressor's vision-language recipes leave them unquantized for that reason), and
    # bitsandbytes' CPU 8-bit matmul reshapes only 3-D inputs: Mllama's projector takes 5-D ones and crashed.
    vision = [r for t in (info.towers or {}).values() if t.name != "language" for r in t.roots] + list(info.unreached)
    skip = tuple(dict.fromkeys([n for n in (head_name,) if n] + list(modules_to_save) + vision))
    chosen = Quantization(method=q.method, double_quant=q.double_quant, compute_dtype=compute, storage_dtype=storage,
                          skip_modules=skip, cpu_repack=final.quant_cpu_repack)
    return chosen, _decisions(ctx, chosen, load_dtype, input_grad_hook)


def _check_prequantized(config: Config, info: ModelInfo) -> None:
    """A checkpoint saved quantized loads quantized whatever the config says: the plan must know, and agree."""
    saved, asked = info.prequantized, config.model.quantization.method
    if saved is None or saved == asked:
        return
    if saved not in ("nf4", "fp4", "int8"):
        raise ConfigError([f"model.path={config.model.path} holds weights quantized by {saved} (config.json "
                           "quantization_config); loraflow trains float bases or bitsandbytes quantization: point "
                           "model.path at the unquantized model and set model.quantization.method=nf4."])
    raise ConfigError([f"model.path={config.model.path} holds weights already quantized by bitsandbytes as {saved} "
                       f"(config.json quantization_config), but model.quantization.method={asked}; set "
                       f"model.quantization.method={saved}."])


def _decisions(ctx: Context, q: Quantization, load_dtype: torch.dtype, input_grad_hook: bool) -> list[Decision]:
    asked = ctx.config.model.quantization
    kind = "int8 (LLM.int8)" if q.bits == 8 else f"{q.method} 4-bit" + (", double quantization" if
                                                                         q.double_quant else "")
    out = [Decision("quantization", f"{kind}; unquantized: {', '.join(q.skip_modules) or 'none'}",
                    f"model.quantization.method={q.method}: the frozen linear layers load quantized by bitsandbytes "
                    f"({q.formula()}); the head, modules trained in full"
                    f"{' and the vision encoder and projector' if ctx.model.image_text else ''} stay in "
                    f"{dtype_name(load_dtype)}")]
    if q.bits == 4:
        out.append(Decision("quantization.compute_dtype", q.compute_dtype,
                            f"model.quantization.compute_dtype={asked.compute_dtype}" + (
                                f": precision.mode={ctx.config.precision.mode} computes in "
                                f"{dtype_name(q.compute_dtype)}" if asked.compute_dtype == "auto" else "")))
        rule = ctx.rule("quant_storage_matches")
        if ctx.setup.sharded_params:
            why = (f"model.quantization.storage_dtype={asked.storage_dtype} would not shard beside the "
                   f"{dtype_name(load_dtype)} weights" if rule else
                   "parameters are sharded, and sharding needs the packed weights in the dtype of the others")
        else:
            why = (f"model.quantization.storage_dtype={asked.storage_dtype}" + (": parameters are not sharded, so "
                   "the packed weights keep bitsandbytes' byte storage" if asked.storage_dtype == "auto" else ""))
        out.append(Decision("quantization.storage_dtype", q.storage_dtype, why, rule))
        if ctx.setup.cpu:
            out.append(Decision("quantization.cpu_repack", q.cpu_repack, "bitsandbytes would rewrite the frozen "
                                "4-bit weights for its CPU kernel at the first evaluation",
                                ctx.rule("quant_cpu_repack")))
    hook = "an input-grad hook (reentrant checkpointing)" if input_grad_hook else "no input-grad hook (below)"
    out.append(Decision("kbit preparation", f"base frozen; unquantized weights in {dtype_name(load_dtype)}; {hook}",
                        "what peft's prepare_model_for_kbit_training does, decided by the plan: it freezes the base "
                        "(the adapters train), adds the hook only for reentrant checkpointing, and upcasts fp16/bf16 "
                        "norms to float32 for fp16 training, which loraflow does not run (bf16-mixed computes norms "
                        "in float32 under autocast)"))
    return out
