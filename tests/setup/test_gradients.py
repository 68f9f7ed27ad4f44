"""Gradient equivalence: every checkpointing setting gives the no-checkpointing fp32 gradients, for LoRA, DoRA and
full fine-tuning, with the model's config left at use_cache=True. Adapter dropout is on, so the recompute must
also replay the same dropout masks."""

from __future__ import annotations

import pytest
import torch

from conftest import first_batch, plan_and_model, randomize_adapters
from loraflow.data.batching import learned_tokens
from loraflow.stages.sft import loss_fn

CHECKPOINTING = {
    "off": [],
    "all-reentrant": ["checkpointing.enabled=true", "checkpointing.reentrant=true"],
    "all-non-reentrant": ["checkpointing.enabled=true", "checkpointing.reentrant=false"],
    "every2-reentrant": ["checkpointing.enabled=true", "checkpointing.reentrant=true", "checkpointing.every_n_layers=2"],
    "every2-non-reentrant": ["checkpointing.enabled=true", "checkpointing.reentrant=false",
                             "checkpointing.every_n_layers=2"],
}
METHODS = {"lora": ["adapter.method=lora", "adapter.dropout=0.1"],
           "dora": ["adapter.method=dora", "adapter.dropout=0.1"],
           "full": ["adapter.method=full"]}


def one_step_gradients(tiny_model, chat_data, overrides):
    plan, model, tokenizer = plan_and_model(tiny_model, *overrides, data=chat_data)
    assert model.config.use_cache is True  # left at the model's default; the plan turns it off per forward
    randomize_adapters(model)
    batch = first_batch(tokenizer, chat_data[0])
    torch.manual_seed(123)  # the same dropout masks in every run
    loss = loss_fn(plan)(model, batch, learned_tokens(batch))
    loss.backward()
    grads = {n: p.grad.detach().clone() if p.grad is not None else None
             for n, p in model.named_parameters() if p.requires_grad}
    return plan, loss.item(), grads


@pytest.fixture(scope="module")
def references(tiny_model, chat_data):
    return {m: one_step_gradients(tiny_model, chat_data, METHODS[m]) for m in METHODS}


@pytest.mark.parametrize("checkpointing", sorted(CHECKPOINTING))
@pytest.mark.parametrize("method", sorted(METHODS))
def test_gradients_match_the_reference(tiny_model, chat_data, references, method, checkpointing):
    _, ref_loss, ref = references[method]
    plan, loss, grads = one_step_gradients(tiny_model, chat_data, METHODS[method] + CHECKPOINTING[checkpointing])
    assert loss == pytest.approx(ref_loss, rel=1e-6)
    assert grads.keys() == ref.keys()
    missing = [n for n, g in grads.items() if g is None]
    assert not missing, f"no gradient for {missing[:3]}"
    worst = max(float((grads[n] - ref[n]).norm() / ref[n].norm().clamp_min(1e-30)) for n in ref)
    assert worst <= 1e-6, f"max relative gradient error {worst:.2e}"
    if method != "full":  # the comparison covers every adapter, not a subset
        assert sum("lora_B" in n for n in grads) == 28


def test_reference_gradients_are_not_trivial(references):
    for method, (_, _, grads) in references.items():
        assert all(g is not None and float(g.abs().sum()) > 0 for g in grads.values() if g is not None), method


@pytest.mark.parametrize("mode,adapter_dtype", [("bf16-mixed", torch.float32), ("bf16", torch.bfloat16)])
def test_bf16_modes_train_with_the_planned_dtypes(tiny_model, chat_data, references, mode, adapter_dtype):
    plan, loss, grads = one_step_gradients(tiny_model, chat_data,
                                           METHODS["lora"] + [f"precision.mode={mode}", "checkpointing.enabled=true"])
    _, ref_loss, _ = references["lora"]
    assert loss == pytest.approx(ref_loss, rel=5e-2)  # bf16 rounding, same computation
    assert all(g is not None and torch.isfinite(g).all() and g.dtype == adapter_dtype for g in grads.values())
