"""Evaluation: held-out loss, and greedy exact match (generate an answer per prompt, compare with the reference).

Works on any causal LM or PeftModel, so a test can load a saved adapter with peft.PeftModel.from_pretrained and
reproduce the metric the run printed.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from loraflow.data import EvalPrompt, Row, collate
from loraflow.losses.logprobs import FULL, HeadMode, learned_logps
from loraflow.setup.precision import autocast


@dataclass
class ExactMatch:
    accuracy: float
    correct: int
    total: int
    examples: list[tuple[str, str, str]]
    """(origin, reference, generated) for the first few prompts, for the log."""


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module):
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _stop_ids(model, tokenizer) -> list[int]:
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(gen_eos if isinstance(gen_eos, list) else [gen_eos])
    return sorted(i for i in ids if i is not None)


@torch.no_grad()
def exact_match(model, tokenizer, prompts: list[EvalPrompt], max_new_tokens: int, batch_size: int,
                device: str = "cpu", autocast_dtype: torch.dtype | None = None) -> ExactMatch:
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    correct, examples = 0, []
    with eval_mode(model), autocast(device, autocast_dtype):
        for start in range(0, len(prompts), batch_size):
            chunk = prompts[start: start + batch_size]
            width = max(len(p.prompt_ids) for p in chunk)
            # Left padding: every prompt ends at the same column, so generation continues each one directly.
            ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for i, p in enumerate(chunk):
                ids[i, width - len(p.prompt_ids):] = torch.tensor(p.prompt_ids)
                mask[i, width - len(p.prompt_ids):] = 1
            images = {k: v.to(device) for k, v in _prompt_images(chunk, width).items()}
            out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), do_sample=False,
                                 max_new_tokens=max_new_tokens, eos_token_id=_stop_ids(model, tokenizer),
                                 pad_token_id=pad, use_cache=True, **images)
            for p, row in zip(chunk, out[:, width:].tolist()):
                text = tokenizer.decode(row, skip_special_tokens=True).strip()
                correct += text == p.reference.strip()
                if len(examples) < 5:
                    examples.append((p.origin, p.reference.strip(), text))
    return ExactMatch(correct / max(len(prompts), 1), correct, len(prompts), examples)


def _prompt_images(chunk: list[EvalPrompt], width: int) -> dict[str, torch.Tensor]:
    """An image-text chunk's image inputs for generate(): the images batched as for training
    (data.multimodal.collate_images), per-token inputs left-padded like the prompts."""
    with_images = [p for p in chunk if getattr(p, "images", None) or getattr(p, "token_types", None)]
    if not with_images:
        return {}
    from loraflow.data.multimodal import collate_images

    rows = [Row(p.prompt_ids, [], images=getattr(p, "images", None)) for p in chunk]
    out = collate_images(rows, width, left=True)
    for key in dict.fromkeys(k for p in with_images for k in (p.token_types or {})):
        values = torch.zeros((len(chunk), width), dtype=torch.long)
        for i, p in enumerate(chunk):
            types = (getattr(p, "token_types", None) or {}).get(key)
            if types:
                values[i, width - len(types):] = torch.tensor(types)
        out[key] = values
    return out


@torch.no_grad()
def eval_loss(model, rows: list[Row], batch_size: int, pad_id: int, device: str = "cpu",
              autocast_dtype: torch.dtype | None = None, logits: HeadMode = FULL) -> float:
    """Mean NLL per learned token over the held-out rows (the head where the plan runs it: plan.logits)."""
    total, count = 0.0, 0
    with eval_mode(model), autocast(device, autocast_dtype):
        for start in range(0, len(rows), batch_size):
            batch = {k: v.to(device) for k, v in collate(rows[start: start + batch_size], pad_id).items()}
            logps, mask = learned_logps(model, batch, logits)
            total -= float(logps.sum())
            count += int(mask.sum())
    return total / max(count, 1)
