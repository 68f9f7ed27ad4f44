"""The plan's precision at run time: one autocast context for training and evaluation alike."""

from __future__ import annotations

import contextlib

import torch


def autocast(device: str, dtype: torch.dtype | None):
    """bf16 autocast when the plan asks for it (precision.mode=bf16-mixed), otherwise nothing."""
    return torch.autocast(device, dtype=dtype) if dtype else contextlib.nullcontext()
