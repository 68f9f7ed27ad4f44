"""Losses as pure tensor functions, each with its equation beside it."""

from loraflow.losses.sft import sft_loss, token_nll

__all__ = ["sft_loss", "token_nll"]
