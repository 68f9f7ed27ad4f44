"""The `model.quantization` section: the frozen base loaded in 4 or 8 bits by bitsandbytes (QLoRA). The plan turns
it into setup/quantize.py's Quantization (plan._quantization)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(kw_only=True)
class QuantizationConfig:
    method: Literal["none", "nf4", "fp4", "int8"] = "none"
    """Load the frozen base weights quantized by bitsandbytes (QLoRA): `nf4` or `fp4` (4-bit), `int8` (8-bit,
    LLM.int8). The adapters, the output or score head and the modules in adapter.train_modules stay unquantized.
    Needs bitsandbytes (`pip install loraflow[qlora]`); the base must be trained through adapters."""

    double_quant: bool = True
    """4-bit: quantize the per-block scales as well (about 0.516 bytes per weight instead of 0.5625)."""

    compute_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """The dtype a 4-bit weight is dequantized to for each matmul. `auto` follows precision.mode: float32 for fp32,
    bfloat16 for bf16-mixed and bf16."""

    storage_dtype: Literal["auto", "uint8", "float32", "bfloat16"] = "auto"
    """The dtype the packed 4-bit weights are stored in (bnb_4bit_quant_storage). `auto`: uint8, or under an engine
    that shards parameters (ZeRO-3, FSDP2) the dtype of the other weights, which sharding needs (rule
    qlora-storage-dtype)."""

    @property
    def enabled(self) -> bool:
        return self.method != "none"

    @property
    def bits(self) -> int:
        return 8 if self.method == "int8" else 4

    @property
    def needs(self) -> tuple[str, ...]:
        """Optional packages this quantization imports (the plan refuses it without them: plan/packages.py)."""
        return ("bitsandbytes",) if self.enabled else ()
