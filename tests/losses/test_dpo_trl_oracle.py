"""loraflow's DPO and IPO losses against TRL's, used here as an oracle only: TRL's own loss code
(DPOTrainer._compute_loss of trl 1.16, with precomputed reference log-probs) runs on the same sequence
log-probs, one pair at a time, and must give the same per-pair loss.

TRL computes the loss inside the training step, from a model output carrying per-token log-probs; the test feeds
it an output whose per-token log-probs sum to the chosen numbers, and the smallest trainer state that code reads.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from trl import DPOTrainer

from loraflow.losses import dpo_loss


class _OneProcess:
    """What DPOTrainer reads from accelerate's Accelerator in one process: a device and identity gathers."""
    device = torch.device("cpu")

    @staticmethod
    def gather(t):
        return t

    gather_for_metrics = gather


def trl_loss(loss_type: str, beta: float, chosen: float, rejected: float, ref_chosen: float,
             ref_rejected: float) -> float:
    trainer = object.__new__(DPOTrainer)
    policy = torch.nn.Linear(1, 1)  # only its .training is read
    state = dict(model=policy, accelerator=_OneProcess(), aux_loss_enabled=False, ld_alpha=None,
                 precompute_ref_logps=True, f_divergence_type="reverse_kl", loss_types=[loss_type],
                 loss_weights=[1.0], beta=beta, label_smoothing=0.0, use_weighting=False,
                 _metrics={"train": defaultdict(list), "eval": defaultdict(list)}, _total_train_tokens=0, _tp_size=1)
    for key, value in state.items():
        object.__setattr__(trainer, key, value)
    seq = 4  # completion tokens 1..3 of each row; the sequence log-prob sits on the first of them
    completion_mask = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 1]])
    log_probs = torch.zeros(2, seq - 1)
    log_probs[0, 0], log_probs[1, 0] = chosen, rejected
    outputs = SimpleNamespace(log_probs=log_probs, entropy=torch.zeros(2, seq - 1),
                              mean_logits=torch.zeros(2, seq - 1), is_top1=torch.zeros(2, seq - 1, dtype=torch.bool))
    inputs = {"input_ids": torch.ones(2, seq, dtype=torch.long), "attention_mask": torch.ones(2, seq, dtype=torch.long),
              "completion_mask": completion_mask, "ref_chosen_logps": torch.tensor([ref_chosen]),
              "ref_rejected_logps": torch.tensor([ref_rejected])}
    return float(trainer._compute_loss(lambda **kwargs: outputs, inputs, return_outputs=False))


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_dpo_matches_trl(loss_type):
    gen = torch.Generator().manual_seed(1)
    pc, pr, rc, rr = (-5 * torch.rand(6, generator=gen) for _ in range(4))
    beta = 0.1
    # IPO is defined on length-averaged log-probs; TRL divides by the completion length (3 here) inside, so
    # loraflow gets the averaged numbers, as its dpo stage passes them.
    scale = 3.0 if loss_type == "ipo" else 1.0
    ours = dpo_loss(pc / scale, pr / scale, rc / scale, rr / scale, beta, 1, loss_type).losses
    for i in range(6):
        want = trl_loss(loss_type, beta, float(pc[i]), float(pr[i]), float(rc[i]), float(rr[i]))
        assert float(ours[i]) == pytest.approx(want, rel=1e-5), (loss_type, i)
