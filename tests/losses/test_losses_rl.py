"""The preference and policy losses against independent computations on fixed tensors: plain Python over float64
numbers, written from the papers' equations, never calling the function under test."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from loraflow.losses import (dpo_loss, gae, group_advantages, grpo_loss, importance_weights, kl_penalized_rewards,
                             masked_moments, pairwise_rm_loss, ppo_policy_loss, sequence_logps, token_logps,
                             value_loss, whiten)


def logsig(x: float) -> float:
    return -math.log1p(math.exp(-x))


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(0)


# token_logps against a hand-normalised softmax per position.
def test_token_logps_is_log_softmax_of_the_next_token(gen):
    logits = torch.randn(2, 5, 7, generator=gen)
    labels = torch.tensor([[-100, 3, 1, -100, 6], [-100, -100, 2, 2, 0]])
    logps, mask = token_logps(logits, labels, temperature=0.7)
    for b in range(2):
        for t in range(4):
            target = int(labels[b, t + 1])
            if target == -100:
                assert not mask[b, t] and logps[b, t] == 0
                continue
            row = [float(v) / 0.7 for v in logits[b, t]]
            want = row[target] - math.log(sum(math.exp(v) for v in row))
            assert float(logps[b, t]) == pytest.approx(want, abs=1e-5)
    summed = sequence_logps(logits, labels)
    averaged = sequence_logps(logits, labels, average=True)
    plain, _ = token_logps(logits, labels)
    assert torch.allclose(summed, plain.sum(1)) and torch.allclose(averaged, plain.sum(1) / mask.sum(1))


# Bradley-Terry: -log sigmoid(r_c - r_r) per pair, by hand.
def test_pairwise_rm_loss(gen):
    c, r = torch.randn(6, generator=gen), torch.randn(6, generator=gen)
    want = sum(-logsig(float(a - b)) for a, b in zip(c, r)) / 10
    assert float(pairwise_rm_loss(c, r, 10)) == pytest.approx(want, rel=1e-6)
    halves = pairwise_rm_loss(c[:3], r[:3], 10) + pairwise_rm_loss(c[3:], r[3:], 10)
    assert torch.allclose(halves, pairwise_rm_loss(c, r, 10))


# DPO eq. 7 with conservative label smoothing, and IPO eq. 17, by hand.
@pytest.mark.parametrize("variant,eps", [("sigmoid", 0.0), ("sigmoid", 0.2), ("ipo", 0.0)])
def test_dpo_family(gen, variant, eps):
    pc, pr, rc, rr = (torch.randn(5, generator=gen) for _ in range(4))
    beta = 0.3
    out = dpo_loss(pc, pr, rc, rr, beta, 8, variant, eps)
    for i in range(5):
        h = (float(pc[i]) - float(rc[i])) - (float(pr[i]) - float(rr[i]))
        want = -(1 - eps) * logsig(beta * h) - eps * logsig(-beta * h) if variant == "sigmoid" else \
            (h - 1 / (2 * beta)) ** 2
        assert float(out.losses[i]) == pytest.approx(want, rel=1e-5)
        assert float(out.chosen_rewards[i]) == pytest.approx(beta * (float(pc[i]) - float(rc[i])), rel=1e-5)
    assert float(out.loss) == pytest.approx(float(out.losses.sum()) / 8, rel=1e-6)
    with pytest.raises(ValueError):
        dpo_loss(pc, pr, rc, rr, beta, 8, "kto")


# Gradient of DPO w.r.t. the policy log-probs: -beta (1 - sigmoid(beta h)) / N for the chosen (eps = 0).
def test_dpo_gradient(gen):
    pc = torch.randn(4, generator=gen, dtype=torch.float64, requires_grad=True)
    pr, rc, rr = (torch.randn(4, generator=gen, dtype=torch.float64) for _ in range(3))
    dpo_loss(pc, pr, rc, rr, 0.5, 4).loss.backward()
    for i in range(4):
        h = (float(pc[i]) - float(rc[i])) - (float(pr[i]) - float(rr[i]))
        want = -0.5 * (1 - 1 / (1 + math.exp(-0.5 * h))) / 4
        assert float(pc.grad[i]) == pytest.approx(want, rel=1e-5)


# Group advantages with statistics.mean / statistics.stdev per group.
def test_group_advantages(gen):
    rewards = torch.rand(12, generator=gen)
    got = group_advantages(rewards, 4)
    for g in range(3):
        group = [float(v) for v in rewards[4 * g:4 * g + 4]]
        mean, std = statistics.mean(group), statistics.stdev(group)
        for k, value in enumerate(group):
            assert float(got[4 * g + k]) == pytest.approx((value - mean) / (std + 1e-4), rel=1e-5)
    assert torch.all(group_advantages(torch.ones(4), 4) == 0)  # identical rewards: no advantage, no NaN


def _grpo_by_hand(logps, old, ref, adv, mask, eps, beta, n):
    total = 0.0
    for i in range(len(logps)):
        terms = []
        for t in range(len(logps[i])):
            if not mask[i][t]:
                continue
            ratio = math.exp(logps[i][t] - old[i][t])
            surrogate = min(ratio * adv[i], max(min(ratio, 1 + eps), 1 - eps) * adv[i])
            d = ref[i][t] - logps[i][t]
            terms.append(surrogate - beta * (math.exp(d) - d - 1))
        total += sum(terms) / len(terms) if terms else 0.0
    return -total / n


# GRPO eq. 3 with the k3 KL of eq. 4, token by token; a fully masked completion contributes nothing.
def test_grpo_loss(gen):
    logps = -torch.rand(3, 5, generator=gen, dtype=torch.float64)
    old = logps + 0.3 * torch.randn(3, 5, generator=gen, dtype=torch.float64)
    ref = logps + 0.2 * torch.randn(3, 5, generator=gen, dtype=torch.float64)
    adv = torch.tensor([1.2, -0.7, 0.4], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1], [0, 0, 0, 0, 0]], dtype=torch.bool)
    loss, stats = grpo_loss(logps, old, ref, adv, mask, 0.2, 0.05, 6)
    want = _grpo_by_hand(logps.tolist(), old.tolist(), ref.tolist(), adv.tolist(), mask.tolist(), 0.2, 0.05, 6)
    assert float(loss) == pytest.approx(want, rel=1e-9)
    assert 0 < stats["clip_fraction"] < 1 and stats["kl"] > 0
    split = grpo_loss(logps[:1], old[:1], ref[:1], adv[:1], mask[:1], 0.2, 0.05, 6)[0] + \
        grpo_loss(logps[1:], old[1:], ref[1:], adv[1:], mask[1:], 0.2, 0.05, 6)[0]
    assert float(split) == pytest.approx(float(loss), rel=1e-12)


# At ratio 1 the gradient per token is -(A - beta * dKL/dlogp) / |o_i| / N, with dKL/dlogp = 1 - exp(ref - logp).
def test_grpo_gradient_at_ratio_one(gen):
    logps = (-torch.rand(2, 4, generator=gen, dtype=torch.float64)).requires_grad_()
    ref = logps.detach() + 0.1 * torch.randn(2, 4, generator=gen, dtype=torch.float64)
    adv = torch.tensor([0.9, -1.1], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    loss, _ = grpo_loss(logps, logps.detach(), ref, adv, mask, 0.2, 0.1, 2)
    loss.backward()
    for i in range(2):
        n_tokens = int(mask[i].sum())
        for t in range(4):
            d = float(ref[i, t] - logps[i, t])
            want = -(float(adv[i]) - 0.1 * (1 - math.exp(d))) / n_tokens / 2 if mask[i, t] else 0.0
            assert float(logps.grad[i, t]) == pytest.approx(want, rel=1e-9, abs=1e-15)


# Importance weights of engine-sampled tokens, by hand: per token or per completion, truncated or masked at the cap.
def test_importance_weights_by_hand():
    trainer = torch.tensor([[-1.0, -2.0, -0.5, 0.0], [-0.3, -0.2, 0.0, 0.0]])
    engine = torch.tensor([[-1.0, -0.5, -2.0, 0.0], [-0.35, -0.2, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    ratios = [[1.0, math.exp(-1.5)], [math.exp(0.05)]]

    def weights(mode, cap):
        return importance_weights(trainer, engine, mask, mode, cap).flatten().tolist()

    assert weights("token_truncate", 3.0) == pytest.approx([1.0, ratios[0][1], 3.0, 0, ratios[1][0], 1.0, 0, 0])
    assert weights("token_mask", 3.0) == pytest.approx([1.0, ratios[0][1], 0, 0, ratios[1][0], 1.0, 0, 0])
    # per completion: exp of the summed differences (0 for the first row, 0.05 for the second) on each of its tokens
    assert weights("sequence_mask", 1.02) == pytest.approx([1.0, 1.0, 1.0, 0, 0, 0, 0, 0])
    assert weights("sequence_truncate", 1.02) == pytest.approx([1.0, 1.0, 1.0, 0, 1.02, 1.02, 0, 0])
    # a grossly wrong token (another policy) gives a finite weight, at the cap
    far = importance_weights(torch.zeros(1, 2), torch.full((1, 2), -1e4), torch.ones(1, 2, dtype=torch.bool),
                             "token_truncate", 3.0)
    assert far.tolist() == [[3.0, 3.0]]


# The weights scale each token's policy term (not the KL term, as TRL); unit weights change nothing.
def test_weighted_policy_losses(gen):
    logps = -torch.rand(2, 4, generator=gen, dtype=torch.float64)
    old = logps + 0.1 * torch.randn(2, 4, generator=gen, dtype=torch.float64)
    ref = logps + 0.2 * torch.randn(2, 4, generator=gen, dtype=torch.float64)
    adv = torch.tensor([0.8, -1.3], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    weights = 0.5 + torch.rand(2, 4, generator=gen, dtype=torch.float64)
    plain = float(grpo_loss(logps, old, ref, adv, mask, 0.2, 0.0, 2)[0])
    assert float(grpo_loss(logps, old, ref, adv, mask, 0.2, 0.0, 2, torch.ones_like(logps))[0]) == \
        pytest.approx(plain, rel=1e-12)
    weighted = grpo_loss(logps, old, None, adv, mask, 0.2, 0.0, 2, weights)[0]
    ratio = torch.exp(logps - old)
    a = adv.unsqueeze(-1)
    term = torch.min(ratio * a, ratio.clamp(0.8, 1.2) * a) * weights * mask
    want = -float((term.sum(-1) / mask.sum(-1)).sum() / 2)
    assert float(weighted) == pytest.approx(want, rel=1e-12)
    with_kl = grpo_loss(logps, old, ref, adv, mask, 0.2, 0.1, 2, weights)[0]
    kl = torch.exp(ref - logps) - (ref - logps) - 1
    assert float(with_kl) == pytest.approx(want + 0.1 * float(((kl * mask).sum(-1) / mask.sum(-1)).sum() / 2),
                                           rel=1e-12)
    adv_t = torch.randn(2, 4, generator=gen, dtype=torch.float64)
    loss, stats = ppo_policy_loss(logps, old, adv_t, mask, 0.2, 7, weights)
    want = -float((torch.min(ratio * adv_t, ratio.clamp(0.8, 1.2) * adv_t) * weights * mask).sum() / 7)
    assert float(loss) == pytest.approx(want, rel=1e-12)
    assert stats == ppo_policy_loss(logps, old, adv_t, mask, 0.2, 7)[1]  # the statistics count tokens, unweighted


# Per-token KL penalty with the score on the last completion token (InstructGPT eq. 2), by hand.
def test_kl_penalized_rewards():
    logps = torch.tensor([[-1.0, -2.0, -0.5, 0.0], [-0.2, -0.3, 0.0, 0.0]])
    ref = torch.tensor([[-1.5, -1.0, -0.5, 0.0], [-0.1, -0.3, 0.0, 0.0]])
    mask = torch.tensor([[0, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    got = kl_penalized_rewards(torch.tensor([2.0, -1.0]), logps, ref, mask, 0.1)
    want = [[0.0, -0.1 * (-2.0 + 1.0), -0.1 * 0.0 + 2.0, 0.0], [-0.1 * (-0.2 + 0.1), -0.1 * 0.0 - 1.0, 0.0, 0.0]]
    assert torch.allclose(got, torch.tensor(want))


# GAE by the explicit backward recursion of Schulman et al. 2016, per row over its masked span only.
def test_gae(gen):
    rewards, values = torch.randn(3, 6, generator=gen), torch.randn(3, 6, generator=gen)
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1], [0, 1, 0, 0, 0, 0]], dtype=torch.bool)
    adv, ret = gae(rewards, values, mask, 0.9, 0.8)
    for b in range(3):
        span = [t for t in range(6) if mask[b, t]]
        running = 0.0
        for j in reversed(range(len(span))):
            t = span[j]
            next_v = float(values[b, span[j + 1]]) if j + 1 < len(span) else 0.0
            delta = float(rewards[b, t]) + 0.9 * next_v - float(values[b, t])
            running = delta + 0.9 * 0.8 * running
            assert float(adv[b, t]) == pytest.approx(running, rel=1e-5, abs=1e-6)
            assert float(ret[b, t]) == pytest.approx(running + float(values[b, t]), rel=1e-5, abs=1e-6)
        assert all(float(adv[b, t]) == 0 for t in range(6) if not mask[b, t])


# PPO eq. 7 and PPO2's clipped value loss, token by token.
def test_ppo_losses(gen):
    logps = -torch.rand(2, 4, generator=gen, dtype=torch.float64)
    old = logps + 0.3 * torch.randn(2, 4, generator=gen, dtype=torch.float64)
    adv = torch.randn(2, 4, generator=gen, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1]], dtype=torch.bool)
    loss, _ = ppo_policy_loss(logps, old, adv, mask, 0.2, 7)
    want = 0.0
    for i in range(2):
        for t in range(4):
            if mask[i, t]:
                r = math.exp(float(logps[i, t] - old[i, t]))
                a = float(adv[i, t])
                want -= min(r * a, max(min(r, 1.2), 0.8) * a)
    assert float(loss) == pytest.approx(want / 7, rel=1e-9)
    v, v_old, ret = (torch.randn(2, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    got = value_loss(v, v_old, ret, mask, 0.1, 7)
    want = 0.0
    for i in range(2):
        for t in range(4):
            if mask[i, t]:
                clipped = float(v_old[i, t]) + max(min(float(v[i, t] - v_old[i, t]), 0.1), -0.1)
                want += 0.5 * max((float(v[i, t]) - float(ret[i, t])) ** 2, (clipped - float(ret[i, t])) ** 2)
    assert float(got) == pytest.approx(want / 7, rel=1e-9)


# Advantage whitening over a step split into two micro-batches (or ranks): the summed moments give the mean and
# sample standard deviation of all masked entries together, as statistics.mean/stdev compute them.
def test_whiten_uses_the_whole_steps_statistics(gen):
    parts = [torch.randn(2, 5, generator=gen) * 3 + 1 for _ in range(2)]
    masks = [torch.tensor([[0, 1, 1, 1, 0], [1, 1, 0, 0, 0]], dtype=torch.bool),
             torch.tensor([[0, 0, 1, 1, 1], [0, 0, 0, 0, 0]], dtype=torch.bool)]
    moments = [sum(c) for c in zip(*(masked_moments(a, m) for a, m in zip(parts, masks)))]
    pooled = [float(a[b, t]) for a, m in zip(parts, masks) for b in range(2) for t in range(5) if m[b, t]]
    mean, std = statistics.mean(pooled), statistics.stdev(pooled)
    assert moments[2] == len(pooled) == 8
    for a, m in zip(parts, masks):
        got = whiten(a, m, moments)
        for b in range(2):
            for t in range(5):
                want = (float(a[b, t]) - mean) / std if m[b, t] else 0.0
                assert float(got[b, t]) == pytest.approx(want, rel=1e-4, abs=1e-5)
