"""Supervised fine-tuning loss: negative log-likelihood of the learned (completion / assistant) tokens."""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE = -100


def token_nll(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position NLL of predicting token t+1 from position t: -log p(y_{t+1} | y_{<=t}).

    Returns (nll [B, T-1] with zeros where ignored, mask [B, T-1]). Computed in float32 whatever the logits'
    dtype, since log-softmax over a large vocabulary in bf16 loses most of its precision."""
    shift_logits = logits[:, :-1].float()
    shift_labels = labels[:, 1:]
    mask = shift_labels != IGNORE
    nll = F.cross_entropy(shift_logits.reshape(-1, shift_logits.size(-1)), shift_labels.reshape(-1),
                          ignore_index=IGNORE, reduction="none").view_as(shift_labels)
    return nll, mask


def sft_loss(logits: torch.Tensor, labels: torch.Tensor, num_items: int) -> torch.Tensor:
    """L = sum_t mask_t * nll_t / N, where N is the number of learned tokens in the whole optimizer step
    (all accumulated micro-batches), not in this micro-batch: summing the micro-batch losses then gives exactly
    the mean over the step, so gradient accumulation does not change the result."""
    nll, _ = token_nll(logits, labels)
    return nll.sum() / max(num_items, 1)


def sft_loss_from_logps(logps: torch.Tensor, num_items: int) -> torch.Tensor:
    """The same loss from the learned tokens' log-probs (logprobs.learned_logps, 0 where not learned):
    L = -sum_t logp_t / N."""
    return -logps.sum() / max(num_items, 1)
