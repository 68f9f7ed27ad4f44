"""Losses as pure tensor functions, each with its equation beside it."""

from loraflow.losses.policy import (
                                    gae,
                                    group_advantages,
                                    grpo_loss,
                                    importance_weights,
                                    kl_penalized_rewards,
                                    masked_moments,
                                    ppo_policy_loss,
                                    sequence_logps,
                                    summed_logps,
                                    token_logps,
                                    value_loss,
                                    whiten,
)
from loraflow.losses.preference import DPOOutput, dpo_loss, pairwise_rm_loss
from loraflow.losses.sft import sft_loss, sft_loss_from_logps, token_nll

__all__ = ["DPOOutput", "dpo_loss", "gae", "group_advantages", "grpo_loss", "importance_weights",
           "kl_penalized_rewards", "masked_moments", "pairwise_rm_loss", "ppo_policy_loss", "sequence_logps",
           "sft_loss", "sft_loss_from_logps", "summed_logps", "token_logps", "token_nll", "value_loss", "whiten"]
