"""Log-probabilities of the learned tokens: the one code path by which every stage turns a batch into
log pi(y_{t+1} | y_{<=t}) at the positions its loss uses (SFT's assistant tokens, DPO's answers, GRPO's and PPO's
completions, the held-out loss).

The output head runs only where a token is learned. A forward pre-selection would need the body and the head
called separately, which skips the hooks sharded engines put on the root module, so instead the head's own
`forward` is replaced for the duration of one model call: the model runs exactly as usual (DDP's reducer, ZeRO-3's
parameter gathering and FSDP2's units all see the same calls), and the head receives the final hidden states
[B, T, H], keeps the learned positions, and returns their log-probs [N] in place of [B, T, V] logits.

Inside the head the learned positions go through the vocabulary in chunks, so [tokens x vocabulary] logits never
exist whole, in forward or backward:
- a frozen head (the usual LoRA setup): each chunk's gradient d logp / d hidden [n, H] is computed at once in the
  forward (one row per token: a token's log-prob depends on its own hidden state only) and kept in place of its
  logits; the backward scales it by the incoming gradient. Same FLOPs as autograd through full logits at those
  positions, no recompute, and [N, H] kept instead of [N, V].
- a head with trainable weights (LoRA on the head, a trained head, trained tied embeddings): each chunk under
  non-reentrant checkpointing, so backward recomputes one chunk's logits at a time (one more head forward over the
  learned positions).
Models that transform logits after the head (Gemma2's soft-capping, Cohere's and Granite's scales) would apply the
transform to the returned log-probs; for them the plan chooses full logits (`head_mode`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from loraflow.families import IMAGE_BATCHING, LOGIT_TRANSFORMS
from loraflow.losses.sft import IGNORE

MODEL_INPUTS = ("input_ids", "attention_mask", "position_ids")


def model_inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What a batch passes to the model's forward (labels, indices and stage fields stay out): the token inputs,
    and an image-text batch's image inputs (families.IMAGE_BATCHING)."""
    return {k: batch[k] for k in (*MODEL_INPUTS, *IMAGE_BATCHING) if k in batch}


@dataclass(frozen=True)
class HeadMode:
    selected: bool
    """Head only at learned positions (else: full logits, then the learned positions picked from them)."""
    chunk_tokens: int
    """Learned positions per chunk of logits; 0 = all at once."""


FULL = HeadMode(selected=False, chunk_tokens=0)


def logit_transform(hf_config) -> str | None:
    """The first post-head logit transform this model config turns on (families.LOGIT_TRANSFORMS: every family's,
    checked on any model, since a config's attributes say what its forward applies), or None."""
    configs = [hf_config]
    text = getattr(hf_config, "get_text_config", None)
    if callable(text):
        configs.append(text())
    for cfg in configs:
        for name, identity in LOGIT_TRANSFORMS.items():
            value = getattr(cfg, name, identity)
            if value is not None and value != identity:
                return f"{name}={value}"
    return None


def chunk_tokens(vocab_size: int, budget_mib: float) -> int:
    """Tokens per chunk so that one chunk's float32 logits fit in `budget_mib`; 0 (no chunking) for budget 0."""
    if budget_mib <= 0 or vocab_size <= 0:
        return 0
    return max(1, int(budget_mib * 2 ** 20) // (4 * vocab_size))


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers (or PEFT) model inside an engine's wrapper (DDP, a DeepSpeed engine)."""
    inner = model
    while not hasattr(inner, "get_output_embeddings") and isinstance(getattr(inner, "module", None),
                                                                     torch.nn.Module):
        inner = inner.module
    return inner


def output_head(model: torch.nn.Module) -> torch.nn.Module:
    """The module the model calls to turn hidden states into logits, under any wrapper (DDP, a DeepSpeed engine,
    PEFT; a LoRA-adapted head is PEFT's layer, which is what the model calls)."""
    inner = unwrapped(model)
    head = inner.get_output_embeddings()
    if head is None:
        raise LookupError(f"{type(inner).__name__} has no output head (get_output_embeddings() is None)")
    return head


def _pick(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(logits / T)[target], in float32 whatever the logits' dtype (bf16 loses most of a large
    vocabulary's log-softmax precision)."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    return logits.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


class _GradInForward(torch.autograd.Function):
    """log-probs of `targets` under a head without trainable weights, chunk by chunk, each chunk's gradient with
    respect to its hidden states formed in the forward by `chunk_fn(hidden, targets) -> (log-probs, gradient)`
    (see the module docstring); the backward only scales it by the incoming gradient."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, targets: torch.Tensor, chunk_fn: Callable, chunk: int) -> torch.Tensor:
        values, grads = [], []
        step = chunk or hidden.shape[0]
        for start in range(0, hidden.shape[0], step):
            logps, grad = chunk_fn(hidden[start: start + step], targets[start: start + step])
            values.append(logps)
            grads.append(grad)
        ctx.save_for_backward(torch.cat(grads))
        return torch.cat(values)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (grads,) = ctx.saved_tensors
        return grad_out.unsqueeze(-1).to(grads.dtype) * grads, None, None, None


def _autograd_chunk(head: Callable, temperature: float) -> Callable:
    """Any frozen head: the chunk's gradient taken by autograd (a token's log-prob depends on its own hidden state
    only, so the gradient of their sum gives each row its own)."""
    def run(hidden: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = hidden.detach().requires_grad_(True)
        with torch.enable_grad():
            logps = _pick(head(h), targets, temperature)
            (grad,) = torch.autograd.grad(logps.sum(), h)
        return logps.detach(), grad

    return run


def _linear_logps(h: torch.Tensor, targets: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  temperature: float, with_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(h W^T + b / T)[targets] for one chunk, and with `with_grad` its gradient with respect to h.
    Scoring without autograd (reference, old policy, evaluation) runs these same operations, so a policy's
    log-probs scored without autograd equal, bit for bit, those its update computes (PPO's and GRPO's ratio is
    exactly 1 at the first update)."""
    y = targets.unsqueeze(-1)
    logits = torch.nn.functional.linear(h, weight, bias).float()  # a fresh buffer: free to overwrite
    if temperature != 1.0:
        logits.div_(temperature)
    # log-softmax written out in place: logsumexp would allocate and pass over [n, V] again.
    top = logits.amax(-1, keepdim=True)
    picked = logits.gather(-1, y)
    exps = logits.sub_(top).exp_()
    total = exps.sum(-1, keepdim=True)
    logps = (picked - top - total.log()).squeeze(-1)
    if not with_grad:
        return logps, None
    probs = exps.mul_(-1.0 / total)  # -softmax
    probs.scatter_add_(-1, y, torch.ones_like(y, dtype=probs.dtype))  # + onehot
    grad = probs.to(weight.dtype) @ weight
    return logps, (grad / temperature if temperature != 1.0 else grad).to(h.dtype)


def _has_trainable(module: torch.nn.Module) -> bool:
    return any(p.requires_grad for p in module.parameters())


def head_logps(head: Callable, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, chunk: int,
               trainable: bool, linear: torch.nn.Linear | None = None) -> torch.Tensor:
    """[N] log-probs of `targets` from hidden states [N, H] through `head`, never holding more than `chunk`
    rows of logits. `linear`: the head is this plain frozen nn.Linear (its gradient is written out)."""
    if hidden.shape[0] == 0:
        return hidden.new_zeros(0, dtype=torch.float32) + 0 * hidden.sum()  # keeps the graph for a zero loss
    if not torch.is_grad_enabled() or not (hidden.requires_grad or trainable):
        step = chunk or hidden.shape[0]
        if linear is not None and not trainable:  # the same operations as the update's (_linear_logps)
            return torch.cat([_linear_logps(hidden[s: s + step], targets[s: s + step], linear.weight, linear.bias,
                                            temperature, with_grad=False)[0]
                              for s in range(0, hidden.shape[0], step)])
        return torch.cat([_pick(head(hidden[s: s + step]), targets[s: s + step], temperature)
                          for s in range(0, hidden.shape[0], step)])
    if not trainable and linear is not None:  # the gradient written out (_linear_logps)
        return _GradInForward.apply(hidden, targets, lambda h, t: _linear_logps(h, t, linear.weight, linear.bias,
                                                                               temperature, with_grad=True), chunk)
    if not trainable:
        return _GradInForward.apply(hidden, targets, _autograd_chunk(head, temperature), chunk)
    if not chunk or chunk >= hidden.shape[0]:
        return _pick(head(hidden), targets, temperature)
    from torch.utils.checkpoint import checkpoint

    return torch.cat([checkpoint(_pick_through, head, hidden[s: s + chunk], targets[s: s + chunk], temperature,
                                 use_reentrant=False) for s in range(0, hidden.shape[0], chunk)])


def _pick_through(head: Callable, hidden: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    return _pick(head(hidden), targets, temperature)


@contextlib.contextmanager
def _selecting_head(model: torch.nn.Module, mask: torch.Tensor, targets: torch.Tensor, temperature: float,
                    chunk: int) -> Iterator[None]:
    """For one model call: the head returns the learned positions' log-probs [N] instead of logits."""
    head = output_head(model)
    forward = head.forward
    trainable = _has_trainable(head)
    # Exactly nn.Linear: a subclass (bitsandbytes' Linear4bit, say) keeps its weight in a form F.linear cannot read.
    linear = head if type(head) is torch.nn.Linear else None
    batch, width = mask.shape

    def selected(hidden: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if args or kwargs or hidden.dim() != 3 or hidden.shape[0] != batch or hidden.shape[1] != width + 1:
            raise RuntimeError(f"the output head of {type(model).__name__} was called with "
                               f"{tuple(hidden.shape)}, not the final hidden states [{batch}, {width + 1}, H] of the "
                               "batch; this model needs full logits: set train.logits_chunk_mib=0 and "
                               "train.logits=full")
        picked = hidden[:, :-1][mask]
        return head_logps(forward, picked, targets, temperature, chunk, trainable, linear)

    own = head.__dict__.get("forward")  # an instance forward someone else installed stays as it was
    head.forward = selected
    try:
        yield
    finally:
        if own is None:
            del head.forward
        else:
            head.forward = own


def learned_logps(model: torch.nn.Module, batch: dict[str, torch.Tensor], mode: HeadMode, *,
                  temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs [B, T-1] float32, 0 where not learned; mask [B, T-1]): position j holds
    log pi(labels[j + 1] | tokens <= j), as losses.token_logps computes from full logits."""
    inputs = model_inputs(batch)
    labels = batch["labels"]
    mask = labels[:, 1:] != IGNORE
    # use_cache=False always: training never reads a KV cache, and writing one under recompute breaks checkpointing
    # (the plan's `use_cache` decision, rule cache-during-recompute).
    if not mode.selected:
        from loraflow.losses import token_logps

        return token_logps(model(**inputs, use_cache=False).logits, labels, temperature)
    targets = labels[:, 1:][mask]
    with _selecting_head(model, mask, targets, temperature, mode.chunk_tokens):
        picked = model(**inputs, use_cache=False).logits
    out = torch.zeros(mask.shape, dtype=torch.float32, device=picked.device)
    return out.masked_scatter(mask, picked), mask
