"""The precision area: the dtype each kind of tensor is stored and computed in (precision.mode, model.dtype)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from loraflow.config.schema import Config
from loraflow.errors import ConfigError
from loraflow.plan.context import dtype_name
from loraflow.plan.types import Decision


@dataclass(frozen=True)
class Precision:
    load: torch.dtype
    """The dtype the model's weights load in (frozen ones stay in it)."""
    trainable: torch.dtype
    """The dtype of every weight the optimizer updates."""
    autocast: torch.dtype | None
    """The matmul dtype under autocast; None: no autocast."""
    decision: Decision


def decide_precision(config: Config) -> Precision:
    """The dtypes of precision.mode, or a ConfigError naming the key for a model.dtype that contradicts it."""
    mode, asked, full = config.precision.mode, config.model.dtype, config.adapter.method == "full"
    problems: list[str] = []
    if mode == "fp32":
        if asked not in ("auto", "float32"):
            problems.append(f"model.dtype={asked} contradicts precision.mode=fp32; use model.dtype=auto or "
                            "precision.mode=bf16-mixed.")
        load, trainable, autocast, why = torch.float32, torch.float32, None, \
            "precision.mode=fp32: every tensor in float32"
    elif mode == "bf16":
        if asked not in ("auto", "bfloat16"):
            problems.append(f"model.dtype={asked} contradicts precision.mode=bf16 (pure bf16); use model.dtype=auto.")
        load, trainable, autocast, why = torch.bfloat16, torch.bfloat16, None, \
            "precision.mode=bf16: weights, adapters and optimizer state all in bfloat16"
    else:
        # bf16-mixed: frozen weights may be stored in bf16; anything the optimizer updates stays float32.
        if full and asked == "bfloat16":
            problems.append("model.dtype=bfloat16 contradicts full fine-tuning under precision.mode=bf16-mixed, "
                            "which keeps float32 master weights; use model.dtype=auto, or precision.mode=bf16 for "
                            "pure bf16.")
        load = torch.float32 if (full or asked == "float32") else torch.bfloat16
        kept = ("full fine-tuning keeps float32 master weights" if full else
                "frozen base weights are only read, so bfloat16 storage halves their memory")
        trainable, autocast = torch.float32, torch.bfloat16
        why = (f"precision.mode=bf16-mixed: {kept}; trainable parameters float32; matmuls under bfloat16 "
               "autocast")
    if problems:
        raise ConfigError(problems)
    value = f"load {dtype_name(load)}, trainable {dtype_name(trainable)}, autocast " \
            f"{dtype_name(autocast) if autocast else 'off'}"
    return Precision(load, trainable, autocast, Decision("precision", value, why))
