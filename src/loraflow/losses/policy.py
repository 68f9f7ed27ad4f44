"""Policy-gradient losses for GRPO and PPO, and the log-probs, advantages and rewards they need.

All take per-token tensors aligned with `token_logps`: position j is the token at j + 1 of the row, predicted
from position j; `mask` marks completion tokens.
"""

from __future__ import annotations

import torch

from loraflow.losses.sft import IGNORE


def token_logps(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi(y_{t+1} | y_{<=t}) at temperature T, float32 ([B, T-1], 0 where ignored), and the mask."""
    shift = logits[:, :-1].float() / temperature
    targets = labels[:, 1:]
    mask = targets != IGNORE
    logps = torch.log_softmax(shift, dim=-1).gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return logps * mask, mask


def sequence_logps(logits: torch.Tensor, labels: torch.Tensor, average: bool = False) -> torch.Tensor:
    """log pi(y | x) = sum over the answer's tokens (or their mean, with `average`), per row [B]."""
    return summed_logps(*token_logps(logits, labels), average=average)


def summed_logps(logps: torch.Tensor, mask: torch.Tensor, average: bool = False,
                 segments: torch.Tensor | None = None, count: int = 0) -> torch.Tensor:
    """Per sequence: the sum of its per-token log-probs [B, T-1] (0 where not learned), or their mean with
    `average`. A row is a sequence, or, for packed rows, `segments` [B, T] gives each position's sequence
    (0..count-1; the token at j + 1 is the one position j predicts) and the result is [count]."""
    if segments is None:
        total, tokens = logps.sum(dim=-1), mask.sum(dim=-1)
    else:
        owner = segments[:, 1:][mask]
        total = logps.new_zeros(count).index_add(0, owner, logps[mask])
        tokens = torch.zeros(count, dtype=torch.long, device=owner.device).index_add(0, owner,
                                                                                     torch.ones_like(owner))
    return total / tokens.clamp(min=1) if average else total


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-4) -> torch.Tensor:
    """A_i = (r_i - mean(group)) / (std(group) + eps) over consecutive groups of `group_size` completions of one
    prompt (DeepSeekMath, Shao et al. 2024, section 4.1.2, outcome supervision; Bessel-corrected std as TRL)."""
    grouped = rewards.float().view(-1, group_size)
    mean = grouped.mean(dim=1, keepdim=True)
    std = grouped.std(dim=1, keepdim=True)
    return ((grouped - mean) / (std + eps)).view(-1)


def _masked_mean_rows(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)


@torch.no_grad()
def importance_weights(trainer_logps: torch.Tensor, engine_logps: torch.Tensor, mask: torch.Tensor, mode: str,
                       cap: float) -> torch.Tensor:
    """Per-token weights w correcting for tokens sampled by an engine whose policy differs slightly from the
    trainer's (truncated importance sampling, Ionides 2008; for RL rollouts on vLLM: Yao et al. 2025, "Your
    Efficient RL Framework Secretly Brings You Off-Policy RL Training"):
        token_*:    w_t = pi_trainer(o_t) / pi_engine(o_t)
        sequence_*: w_t = prod_t' pi_trainer(o_t') / pi_engine(o_t')   for every token of the completion,
    then `*_truncate`: min(w, cap); `*_mask`: w where w <= cap, else 0 (the token or completion drops out).
    Float32 [B, T-1], 0 outside the mask."""
    m = mask.float()
    delta = (trainer_logps.float() - engine_logps.float()) * m
    if mode.startswith("sequence"):
        delta = delta.sum(dim=-1, keepdim=True).expand_as(m)
    w = torch.exp(delta.clamp(max=20.0))  # exp(20) is far beyond any cap: no overflow for a grossly wrong token
    w = w.clamp(max=cap) if mode.endswith("truncate") else torch.where(w <= cap, w, torch.zeros_like(w))
    return w * m


def grpo_loss(logps: torch.Tensor, old_logps: torch.Tensor, ref_logps: torch.Tensor | None,
              advantages: torch.Tensor, mask: torch.Tensor, clip_eps: float, beta: float,
              num_items: int, weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO objective (DeepSeekMath eq. 3), negated:
        J = 1/G sum_i 1/|o_i| sum_t [ w_t min(rho A_i, clip(rho, 1-eps, 1+eps) A_i) - beta KL_t ],
        rho = pi(o_t) / pi_old(o_t),  KL_t = pi_ref/pi - log(pi_ref/pi) - 1  (the k3 estimator, eq. 4),
    w_t the importance weights of engine-sampled tokens (importance_weights; 1 without them, and the KL term is
    not weighted, as in TRL). The per-completion token means are summed and divided by N, the completions in the
    whole optimizer step."""
    m = mask.to(logps.dtype)
    ratio = torch.exp(logps - old_logps.detach())
    adv = advantages.detach().to(logps.dtype).unsqueeze(-1)
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps)
    objective = torch.min(ratio * adv, clipped * adv)
    if weights is not None:
        objective = objective * weights.detach().to(logps.dtype)
    kl = torch.zeros_like(logps)
    if beta:
        delta = ref_logps.detach() - logps
        kl = torch.exp(delta) - delta - 1
        objective = objective - beta * kl
    loss = -_masked_mean_rows(objective, m).sum() / max(num_items, 1)
    tokens = m.sum().clamp(min=1)
    was_clipped = ((ratio - clipped).abs() > 0).float()
    return loss, {"kl": float((kl.detach() * m).sum() / tokens),
                  "clip_fraction": float((was_clipped * m).sum() / tokens)}


@torch.no_grad()
def kl_penalized_rewards(scores: torch.Tensor, logps: torch.Tensor, ref_logps: torch.Tensor, mask: torch.Tensor,
                         kl_coef: float) -> torch.Tensor:
    """r_t = -kl_coef (log pi(o_t) - log pi_ref(o_t)), plus the sequence's score at its last token
    (Ziegler et al. 2019 eq. 2; InstructGPT eq. 2)."""
    m = mask.float()
    rewards = -kl_coef * (logps.float() - ref_logps.float()) * m
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask, positions, torch.full_like(positions, -1)).max(dim=1).values
    has = last >= 0
    rows = torch.arange(mask.shape[0], device=mask.device)[has]
    rewards[rows, last[has]] += scores.float()[has]
    return rewards


@torch.no_grad()
def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016 eq. 16):
        delta_t = r_t + gamma V_{t+1} - V_t,  A_t = sum_l (gamma lam)^l delta_{t+l},
    with V = 0 after a completion's last token. Returns (A, A + V), zero outside the mask."""
    m = mask.float()
    v = values.float() * m
    r = rewards.float() * m
    advantages = torch.zeros_like(r)
    running = torch.zeros(r.shape[0], device=r.device)
    next_value = torch.zeros(r.shape[0], device=r.device)
    for t in reversed(range(r.shape[1])):
        delta = r[:, t] + gamma * next_value - v[:, t]
        running = delta + gamma * lam * running
        # Outside the mask nothing accumulates; the next masked token sees V = 0 beyond the completion's end.
        running = running * m[:, t]
        advantages[:, t] = running
        next_value = v[:, t]
    return advantages, (advantages + v) * m


def masked_moments(values: torch.Tensor, mask: torch.Tensor) -> list[float]:
    """[sum, sum of squares, count] of the masked entries: summed over micro-batches and ranks, they give the
    whole step's mean and variance for `whiten`."""
    m = mask.float()
    v = values.float() * m
    return [float(v.sum()), float((v * v).sum()), float(m.sum())]


@torch.no_grad()
def whiten(values: torch.Tensor, mask: torch.Tensor, moments: list[float], eps: float = 1e-8) -> torch.Tensor:
    """(A - mean) / sqrt(var + eps) over the masked entries, with mean and (Bessel-corrected) variance from
    `moments` = [sum, sum of squares, count] of the whole optimizer step, zero outside the mask. PPO implementations
    whiten advantages this way (OpenAI baselines' PPO2, TRL, OpenRLHF): the critic starts untrained, so raw
    advantages carry the reward model's offset and would push every sampled token the same way."""
    total, squares, count = moments
    mean = total / max(count, 1.0)
    var = max(squares - count * mean * mean, 0.0) / max(count - 1.0, 1.0)
    return (values.float() - mean) / (var + eps) ** 0.5 * mask.float()


def ppo_policy_loss(logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                    clip_eps: float, num_items: int, weights: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped surrogate (Schulman et al. 2017 eq. 7): -w_t min(rho A_t, clip(rho, 1-eps, 1+eps) A_t), summed over
    completion tokens / N, the completion tokens of the whole optimizer step; w_t the importance weights of
    engine-sampled tokens (1 without them)."""
    m = mask.to(logps.dtype)
    w = m if weights is None else m * weights.detach().to(logps.dtype)
    ratio = torch.exp(logps - old_logps.detach())
    adv = advantages.detach().to(logps.dtype)
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps)
    loss = -(torch.min(ratio * adv, clipped * adv) * w).sum() / max(num_items, 1)
    tokens = m.sum().clamp(min=1)
    diff = (logps - old_logps).detach()
    return loss, {"clip_fraction": float((((ratio - clipped).abs() > 0).float() * m).sum() / tokens),
                  "approx_kl": float((0.5 * diff ** 2 * m).sum() / tokens)}


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               clip_range: float, num_items: int) -> torch.Tensor:
    """0.5 max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2) per completion token, summed / N (value clipping
    of OpenAI baselines' PPO2); c <= 0 disables the clipped term."""
    v = values.float() if values.dtype != torch.float64 else values
    m = mask.to(v.dtype)
    old, ret = old_values.detach().to(v.dtype), returns.detach().to(v.dtype)
    loss = (v - ret) ** 2
    if clip_range > 0:
        clipped = old + torch.clamp(v - old, -clip_range, clip_range)
        loss = torch.max(loss, (clipped - ret) ** 2)
    return 0.5 * (loss * m).sum() / max(num_items, 1)
