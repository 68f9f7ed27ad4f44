"""Pairwise preference losses: the reward model's Bradley-Terry loss and the DPO family."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


def pairwise_rm_loss(chosen_scores: torch.Tensor, rejected_scores: torch.Tensor, num_items: int) -> torch.Tensor:
    """L = sum_i -log sigmoid(r(x, y_c) - r(x, y_r)) / N  (Bradley-Terry; InstructGPT, Ouyang et al. 2022 eq. 1).
    N is the number of pairs in the whole optimizer step, so summed micro-batch losses are the step mean."""
    margin = chosen_scores.float() - rejected_scores.float()
    return -F.logsigmoid(margin).sum() / max(num_items, 1)


@dataclass
class DPOOutput:
    loss: torch.Tensor
    """Sum of the per-pair losses / pairs in the optimizer step."""
    losses: torch.Tensor
    chosen_rewards: torch.Tensor
    """beta * (log pi(y_c|x) - log pi_ref(y_c|x)), detached: DPO's implicit reward."""
    rejected_rewards: torch.Tensor


def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, beta: float, num_items: int, variant: str = "sigmoid",
             label_smoothing: float = 0.0) -> DPOOutput:
    """With h = (log pi(y_c) - log pi_ref(y_c)) - (log pi(y_r) - log pi_ref(y_r)):

    - sigmoid: -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h)   (DPO, Rafailov et al. 2023 eq. 7;
      eps > 0 is conservative DPO, Mitchell 2023, "A note on DPO with noisy preferences")
    - ipo: (h - 1 / (2 beta))^2   (IPO, Azar et al. 2023 eq. 17). IPO is defined on length-averaged log-probs,
      which the caller passes (as TRL does).
    The reference log-probs are constants."""
    if variant not in ("sigmoid", "ipo"):
        raise ValueError(f"unknown DPO variant {variant!r}; use sigmoid or ipo")
    if variant == "ipo" and label_smoothing:
        raise ValueError("label_smoothing applies to the sigmoid loss only")
    chosen_ratio = policy_chosen.float() - ref_chosen.detach().float()
    rejected_ratio = policy_rejected.float() - ref_rejected.detach().float()
    h = chosen_ratio - rejected_ratio
    if variant == "sigmoid":
        losses = -(1 - label_smoothing) * F.logsigmoid(beta * h) - label_smoothing * F.logsigmoid(-beta * h)
    else:
        losses = (h - 1 / (2 * beta)) ** 2
    return DPOOutput(losses.sum() / max(num_items, 1), losses, beta * chosen_ratio.detach(),
                     beta * rejected_ratio.detach())
