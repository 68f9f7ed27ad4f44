"""Rollouts for GRPO and PPO: sampling completions with the policy's own `generate`, and turning prompt +
completion into the batch the update trains on.

Sampling is Gumbel-max with noise keyed per row: token = argmax(logits / T + g), where g is drawn from a
generator seeded by (seed, step, prompt index, completion number, position). That is an exact sample of
softmax(logits / T), and it does not depend on which other rows share the batch or on how prompts are split over
processes, so one process and N processes produce the same tokens (the engine tests compare them).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from loraflow.data.formatting import IGNORE


def _seed(key: tuple[int, ...]) -> int:
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


class KeyedGumbel(LogitsProcessor):
    """Adds per-row Gumbel noise to logits / temperature, so greedy decoding of the result samples."""

    def __init__(self, keys: list[tuple[int, ...]], temperature: float, prompt_width: int):
        self.keys, self.temperature, self.prompt_width = keys, temperature, prompt_width

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        position = input_ids.shape[1] - self.prompt_width
        noise = []
        for key in self.keys:
            g = torch.Generator().manual_seed(_seed((*key, position)))
            u = torch.rand(scores.shape[-1], generator=g, dtype=torch.float64).clamp_(1e-12, 1 - 1e-12)
            noise.append(-torch.log(-torch.log(u)))
        return scores.float() / self.temperature + torch.stack(noise).to(scores.device, torch.float32)


def stop_ids(model, tokenizer) -> list[int]:
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(gen_eos if isinstance(gen_eos, list) else [gen_eos])
    return sorted(i for i in ids if i is not None)


def left_pad(prompts: list[list[int]], width: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    return ids, mask


@torch.no_grad()
def generate(model, prompts: list[list[int]], width: int, max_new_tokens: int, stop: list[int], pad_id: int,
             device: str, keys: list[tuple[int, ...]] | None = None, temperature: float = 1.0,
             synced: bool = False) -> torch.Tensor:
    """Completions [N, max_new_tokens] (pad after the stop token). Prompts are left-padded to `width`, the same
    for every process, so positions and padding never depend on the split. `keys` None means greedy."""
    ids, mask = left_pad(prompts, width, pad_id)
    processors = LogitsProcessorList([KeyedGumbel(keys, temperature, width)] if keys is not None else [])
    out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), do_sample=False,
                         max_new_tokens=max_new_tokens, min_new_tokens=0, eos_token_id=stop, pad_token_id=pad_id,
                         logits_processor=processors, use_cache=True, synced_gpus=synced)
    completion = out[:, width:].cpu()
    if completion.shape[1] < max_new_tokens:  # every row stopped early
        completion = torch.cat([completion, torch.full((len(prompts), max_new_tokens - completion.shape[1]),
                                                       pad_id, dtype=torch.long)], dim=1)
    return completion


def completion_mask(completion: torch.Tensor, stop: list[int]) -> torch.Tensor:
    """1 on each completion's tokens up to and including its first stop token (learned: the model must learn
    where to stop), 0 after it."""
    is_stop = torch.isin(completion, torch.tensor(stop))
    after_stop = (is_stop.cumsum(dim=1) - is_stop.long()) > 0
    return (~after_stop).long()


@dataclass
class Rollout:
    input_ids: torch.Tensor
    """[N, width + max_new_tokens]: left-padded prompt, then completion."""
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    labels: torch.Tensor
    """Completion tokens (through the stop token); IGNORE elsewhere."""
    completions: torch.Tensor

    def as_batch(self, device: str) -> dict[str, torch.Tensor]:
        keys = ("input_ids", "attention_mask", "position_ids", "labels")
        return {k: getattr(self, k).to(device) for k in keys}


def build_rollout(prompts: list[list[int]], completions: torch.Tensor, width: int, stop: list[int],
                  pad_id: int) -> Rollout:
    ids, prompt_mask = left_pad(prompts, width, pad_id)
    done = completion_mask(completions, stop)
    mask = torch.cat([prompt_mask, done], dim=1)
    # The positions generate() used: counted over real tokens, so left padding does not shift them.
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    labels = torch.cat([torch.full_like(ids, IGNORE), completions.masked_fill(done == 0, IGNORE)], dim=1)
    return Rollout(torch.cat([ids, completions], dim=1), mask, positions, labels, completions)


def completion_ids(completions: torch.Tensor, stop: list[int]) -> list[list[int]]:
    """Each completion's token ids up to and including its first stop token."""
    done = completion_mask(completions, stop)
    return [[t for t, m in zip(row, keep) if m] for row, keep in zip(completions.tolist(), done.tolist())]


def decode_ids(tokenizer, ids: list[list[int]]) -> list[str]:
    """Completion texts as reward functions read them: special tokens dropped, surrounding whitespace stripped."""
    return [tokenizer.decode(row, skip_special_tokens=True).strip() for row in ids]


def decode(tokenizer, completions: torch.Tensor, stop: list[int]) -> list[str]:
    return decode_ids(tokenizer, completion_ids(completions, stop))
