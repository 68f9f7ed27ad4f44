"""Quantized bases (QLoRA): the bitsandbytes settings a plan decides, and the operations on quantized weights that
loading, the reference run, merging and the memory report share.

bitsandbytes replaces each frozen `nn.Linear` of the base with `Linear4bit` (NF4/FP4, weights packed two to a byte
in a storage dtype, one absmax scale per 64 weights, optionally quantized again: "double quantization") or
`Linear8bitLt` (LLM.int8: int8 weights, one scale per row). The adapters, the output or score head and every module
trained in full stay ordinary float modules (`skip_modules`), as do an image-text model's vision encoder and
projector (plan._quantization says why).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from loraflow.errors import ConfigError

BLOCK = 64
"""Weights per absmax scale in bitsandbytes' 4-bit quantization (blocksize 64)."""
NESTED_BLOCK = 256
"""Scales per second-level fp32 scale under double quantization."""

@dataclass(frozen=True)
class Quantization:
    method: str
    """nf4, fp4 or int8."""
    double_quant: bool
    compute_dtype: torch.dtype
    storage_dtype: torch.dtype
    skip_modules: tuple[str, ...]
    """Full names of the modules that stay unquantized (heads, modules trained in full)."""
    cpu_repack: bool = False
    """Let bitsandbytes repack 4-bit weights for its CPU kernel in eval mode (rule kbit-cpu-repack turns it off)."""

    @property
    def bits(self) -> int:
        return 8 if self.method == "int8" else 4

    def to_dict(self) -> dict:
        """JSON-ready (a reward model's manifest records how its base was quantized)."""
        return {"method": self.method, "double_quant": self.double_quant,
                "compute_dtype": str(self.compute_dtype).replace("torch.", ""),
                "storage_dtype": str(self.storage_dtype).replace("torch.", ""), "skip_modules": list(self.skip_modules)}

    @classmethod
    def from_dict(cls, d: dict) -> "Quantization":
        return cls(method=d["method"], double_quant=d["double_quant"], compute_dtype=getattr(torch, d["compute_dtype"]),
                   storage_dtype=getattr(torch, d["storage_dtype"]), skip_modules=tuple(d["skip_modules"]))

    def hf_config(self):
        """transformers' BitsAndBytesConfig for these settings."""
        require_bitsandbytes(self.method)
        from transformers import BitsAndBytesConfig

        skip = list(self.skip_modules)
        if self.bits == 8:
            return BitsAndBytesConfig(load_in_8bit=True, llm_int8_skip_modules=skip)
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=self.method,
                                  bnb_4bit_use_double_quant=self.double_quant,
                                  bnb_4bit_compute_dtype=self.compute_dtype,
                                  bnb_4bit_quant_storage=self.storage_dtype, llm_int8_skip_modules=skip)

    def bytes_per_weight(self) -> float:
        """Bytes one quantized weight costs as stored, quantization constants included (the memory formula)."""
        return self.packed_bytes_per_weight() + self.scale_bytes_per_weight()

    def packed_bytes_per_weight(self) -> float:
        """The packed weight itself: what ZeRO-3 and FSDP2 shard."""
        return 1.0 if self.bits == 8 else 0.5

    def scale_bytes_per_weight(self) -> float:
        """Its share of the block scales, which every rank keeps whole (0 for 8-bit: one fp32 scale per row, which
        the formula leaves out)."""
        if self.bits == 8:
            return 0.0
        return (1 / BLOCK + 4 / (BLOCK * NESTED_BLOCK)) if self.double_quant else 4 / BLOCK

    def bytes_per_layer(self) -> int:
        """Constants each quantized layer holds whatever its size: 4-bit code tables (16 fp32 values; under double
        quantization also the 256-value table of the 8-bit scales and their fp32 offset)."""
        if self.bits == 8:
            return 0
        return 16 * 4 + ((256 * 4 + 4) if self.double_quant else 0)

    def formula(self) -> str:
        if self.bits == 8:
            return "1 B per int8 weight (+ 4 B per row scale, not in the formula)"
        if self.double_quant:
            return f"0.5 B per 4-bit weight + 1 B / {BLOCK} (8-bit scales) + 4 B / {BLOCK * NESTED_BLOCK} (fp32 " \
                   f"second-level scales) = {self.bytes_per_weight():.4f} B, + {self.bytes_per_layer()} B of code " \
                   "tables per layer"
        return f"0.5 B per 4-bit weight + 4 B / {BLOCK} (fp32 scales) = {self.bytes_per_weight():.4f} B, + " \
               f"{self.bytes_per_layer()} B of code table per layer"


def require_bitsandbytes(method: str) -> None:
    """The last line of defence for callers that build a quantized model without a plan from detect_environment
    (the plan refuses first: plan/packages.py), in the plan's words."""
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        from loraflow.environment import install_line

        raise ConfigError([f"model.quantization.method={method} needs bitsandbytes, which is not installed here: "
                           f"{install_line('bitsandbytes')}, or set model.quantization.method=none."]) from None


def is_quantized_linear(module: torch.nn.Module) -> bool:
    """A bitsandbytes layer (FSDP2 turns its class into a subclass, FSDPLinear4bit: isinstance, not the name). A model
    with such layers has imported bitsandbytes; without it, nothing is quantized and nothing is imported here."""
    bnb = sys.modules.get("bitsandbytes")
    return bnb is not None and isinstance(module, (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt))


def quantized_linears(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The quantized base layers by name (inside PEFT's wrappers too: PEFT's bnb LoRA layers are not themselves
    bitsandbytes modules; their `base_layer` is)."""
    return {n: m for n, m in model.named_modules() if is_quantized_linear(m)}


def dequantized_weight(module: torch.nn.Module) -> torch.Tensor:
    """The float weight a quantized layer computes with (its compute dtype: float32 unless the plan said bf16)."""
    from peft.utils.integrations import dequantize_bnb_weight

    return dequantize_bnb_weight(module.weight, getattr(module, "state", None))


def weight_count(p: torch.Tensor) -> int:
    """The weights a quantized parameter stands for (4-bit storage packs several into one element)."""
    state = getattr(p, "quant_state", None)
    return int(torch.Size(state.shape).numel()) if state is not None else p.numel()


def constants(p: torch.Tensor, module: torch.nn.Module | None = None) -> list[torch.Tensor]:
    """A quantized weight's quantization constants: 4-bit absmax scales (themselves quantized under double
    quantization, with a second level), code tables and offset; 8-bit row scales. Under FSDP2 the weight is a
    plain sharded parameter and the 4-bit state lives on its `module` (bitsandbytes keeps a copy there)."""
    out: list[torch.Tensor] = []
    state = getattr(p, "quant_state", None) or getattr(module, "quant_state", None)
    while state is not None:
        out += [t for t in (getattr(state, a, None) for a in ("absmax", "code", "offset")) if torch.is_tensor(t)]
        state = getattr(state, "state2", None)
    scb = getattr(p, "SCB", None)
    return out + ([scb] if torch.is_tensor(scb) else [])


def keep_layout(model: torch.nn.Module, quantization: Quantization) -> None:
    """Rule kbit-cpu-repack: stop bitsandbytes from rewriting 4-bit weights in place for its CPU kernel, so the
    frozen base stays the one the adapters were trained on, bit for bit, through evaluation and generation."""
    if quantization.cpu_repack:
        return
    for module in quantized_linears(model).values():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False


def dequantize_model(model: torch.nn.Module, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """Replace every quantized layer with a plain `nn.Linear` holding its dequantized weight in `dtype`, in place:
    the base a QLoRA adapter was trained against, as ordinary weights (the reference of the gradient check, and
    what `loraflow merge` merges into). Also clears transformers' record that the model is quantized, so it saves
    as a plain model."""
    for name, module in list(quantized_linears(model).items()):
        linear = torch.nn.Linear(module.in_features, module.out_features, bias=module.bias is not None,
                                 device="meta")
        weight = dequantized_weight(module).to(dtype)
        linear.weight = torch.nn.Parameter(weight, requires_grad=False)
        if module.bias is not None:
            linear.bias = torch.nn.Parameter(module.bias.detach().to(dtype), requires_grad=False)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, linear)
    inner = getattr(model, "base_model", model)
    for owner in {model, inner, getattr(inner, "model", inner)}:
        for attr in ("is_loaded_in_4bit", "is_loaded_in_8bit", "is_quantized", "hf_quantizer"):
            if attr in vars(owner):
                setattr(owner, attr, None if attr == "hf_quantizer" else False)
        cfg = getattr(owner, "config", None)
        if cfg is not None and hasattr(cfg, "quantization_config"):
            del cfg.quantization_config
    return model
