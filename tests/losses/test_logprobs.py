"""The learned-token log-prob path (losses/logprobs.py) equals the full-logits computation it replaces: values and every
trainable gradient, fp32, for a frozen head, LoRA on the head, a trained head and tied embeddings, chunked or not,
and it never holds [learned tokens x vocabulary] logits whole."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from loraflow.losses.logprobs import (
    FULL,
    HeadMode,
    chunk_tokens,
    learned_logps,
    logit_transform,
)
from loraflow.losses import token_logps

IGNORE = -100


def _model(head: str, tie: bool = False) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=101, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=tie)
    model = LlamaForCausalLM(cfg)
    if head == "frozen-module":  # not exactly nn.Linear: the generic frozen path (autograd inside the forward)
        model.lm_head.__class__ = type("OtherHead", (torch.nn.Linear,), {})
    targets = ["q_proj", "v_proj", "gate_proj"] + (["lm_head"] if head == "lora" else [])
    save = ["lm_head"] if head == "trained" else (["embed_tokens"] if head == "tied-trained" else None)
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=targets, modules_to_save=save,
                                            init_lora_weights=False))
    return peft


def _batch(seed: int = 1) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 101, (3, 11), generator=gen)
    labels = ids.clone()
    labels[:, :5] = IGNORE  # the prompt
    labels[2, 8:] = IGNORE  # a shorter answer (right padding)
    mask = torch.ones_like(ids)
    mask[2, 8:] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}


def _run(model, batch, mode: HeadMode, temperature: float = 1.0):
    model.zero_grad(set_to_none=True)
    logps, mask = learned_logps(model, batch, mode, temperature=temperature)
    # A loss with a different weight per token, as the policy losses have.
    weights = torch.linspace(0.5, 1.5, logps.numel()).view_as(logps)
    (logps * weights).sum().backward()
    return logps.detach(), mask, _grads(model)


def _reference(model, batch, temperature: float = 1.0):
    model.zero_grad(set_to_none=True)
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask")}
    logps, mask = token_logps(model(**inputs).logits, batch["labels"], temperature)
    weights = torch.linspace(0.5, 1.5, logps.numel()).view_as(logps)
    (logps * weights).sum().backward()
    return logps.detach(), mask, _grads(model)


@pytest.mark.parametrize("head", ["frozen", "frozen-module", "lora", "trained", "tied", "tied-trained"])
@pytest.mark.parametrize("chunk", [0, 4])
def test_selected_head_equals_full_logits(head, chunk):
    model = _model(head, tie=head.startswith("tied"))
    batch = _batch()
    want, want_mask, want_grads = _reference(model, batch, temperature=0.7)
    got, got_mask, got_grads = _run(model, batch, HeadMode(selected=True, chunk_tokens=chunk), temperature=0.7)
    assert torch.equal(got_mask, want_mask)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert got_grads.keys() == want_grads.keys() and want_grads
    if head not in ("frozen", "frozen-module", "tied"):  # the head's own trainable weights get their gradient through the chunked path
        assert any("lm_head" in n or "embed_tokens" in n for n in got_grads)
    for name in want_grads:
        error = (got_grads[name] - want_grads[name]).abs().max() / want_grads[name].abs().max()
        assert error <= 1e-5, (name, float(error))  # relative to the tensor's scale: float32 summation order
    assert "forward" not in vars(model.get_output_embeddings())  # the head's own forward is back


def test_full_mode_is_the_reference():
    model, batch = _model("frozen"), _batch()
    got, _, got_grads = _run(model, batch, FULL)
    want, _, want_grads = _reference(model, batch)
    assert torch.equal(got, want)
    for name in want_grads:
        assert torch.equal(got_grads[name], want_grads[name])


def test_no_grad_scoring_and_empty_selection():
    model, batch = _model("frozen"), _batch()
    with torch.no_grad():
        got, _ = learned_logps(model, batch, HeadMode(True, 3))
        want, _ = token_logps(model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits,
                              batch["labels"])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    empty = {**batch, "labels": torch.full_like(batch["labels"], IGNORE)}
    logps, mask = learned_logps(model, empty, HeadMode(True, 3))
    assert not mask.any() and float(logps.abs().sum()) == 0.0
    logps.sum().backward()  # a micro-batch without learned tokens still backpropagates (zero gradients)


def test_logits_never_whole():
    """The head's matmul never produces more than one chunk of rows of vocabulary logits."""
    model, batch = _model("frozen"), _batch()
    learned = int((batch["labels"][:, 1:] != IGNORE).sum())
    rows = []
    original = torch.nn.functional.linear

    def spy(x, w, b=None):
        out = original(x, w, b)
        if w.shape[0] == 101:
            rows.append(x.reshape(-1, x.shape[-1]).shape[0])
        return out

    torch.nn.functional.linear = spy
    try:
        logps, _ = learned_logps(model, batch, HeadMode(True, 4))
        logps.sum().backward()
    finally:
        torch.nn.functional.linear = original
    assert rows and max(rows) <= 4 and sum(rows) == learned


def test_chunk_size_and_transforms():
    assert chunk_tokens(128_256, 64) == 130  # 64 MiB of float32 logits at Llama 3's vocabulary
    assert chunk_tokens(32_000, 0) == 0
    assert logit_transform(LlamaConfig()) is None
    from transformers import Gemma2Config

    assert logit_transform(Gemma2Config()) == "final_logit_softcapping=30.0"


class _WidestLogits(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the most elements of any tensor an op produces whose last dimension is the vocabulary."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab, self.widest = vocab, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dim() and t.shape[-1] == self.vocab:
                self.widest = max(self.widest, t.numel())
        return out


def test_logits_memory_at_a_128k_vocabulary():
    """Forward and backward at Llama 3's vocabulary (128256), 768 learned positions of 1536: the widest [tokens x
    vocabulary] tensor of the chunked path is at most 1/8 of the unchunked one (64 MiB chunks)."""
    from peft import LoraConfig, get_peft_model

    vocab = 128_256
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048)
    model = get_peft_model(LlamaForCausalLM(cfg), LoraConfig(r=2, target_modules=["q_proj"]))
    ids = torch.randint(0, vocab, (1, 1536))
    labels = ids.clone()
    labels[:, :768] = IGNORE
    batch = {"input_ids": ids, "labels": labels}
    widest = {}
    for name, mode in (("full", FULL), ("learned", HeadMode(True, chunk_tokens(vocab, 64)))):
        with _WidestLogits(vocab) as probe:
            logps, _ = learned_logps(model, batch, mode)
            logps.sum().backward()
        widest[name] = probe.widest
    assert widest["full"] >= 1536 * vocab  # every position's logits
    assert widest["learned"] <= chunk_tokens(vocab, 64) * vocab
    assert widest["learned"] * 8 <= widest["full"]


@pytest.mark.parametrize("head", ["frozen", "frozen-module", "lora"])
def test_bf16_autocast_matches_full_logits(head):
    """Under bf16 autocast (precision.mode=bf16-mixed) the learned-positions path computes what the full path
    computes: both do bf16 matmuls and a float32 log-softmax, so they agree to bf16 rounding."""
    model, batch = _model(head), _batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want, _, want_grads = _reference(model, batch)
        got, _, got_grads = _run(model, batch, HeadMode(True, 4))
    assert float((got - want).abs().max()) < 0.05
    for name in want_grads:
        error = (got_grads[name].float() - want_grads[name].float()).abs().max() / want_grads[name].abs().max()
        assert error < 0.05, (name, float(error))


@pytest.mark.parametrize("head", ["frozen", "frozen-module", "lora"])
def test_scoring_without_autograd_equals_the_update_bit_for_bit(head):
    """Old-policy and reference scoring run without autograd; PPO's and GRPO's first update takes the ratio of the
    same policy's log-probs with autograd, which must be exactly 1."""
    model, batch = _model(head), _batch()
    mode = HeadMode(True, 4)
    with torch.no_grad():
        scored, _ = learned_logps(model, batch, mode, temperature=0.7)
    updated, _ = learned_logps(model, batch, mode, temperature=0.7)
    assert updated.requires_grad and torch.equal(scored, updated.detach())
