"""Preference pairs (rm, dpo) and RL prompts (grpo, ppo): records -> token ids, with errors that name the record.

Pair record (data.formats reads TRL's explicit- and implicit-prompt preference formats into it): {"prompt": str or
chat messages, "chosen": ..., "rejected": ...} ("messages" is accepted for a chat prompt); with a chat prompt each
answer is a string (one assistant turn) or a list of messages continuing the prompt. A chat prompt's answers are
rendered by the tokenizer's chat template exactly as SFT renders them (formatting.tokenize_messages), so the
end-of-turn marker is part of what is compared, and only the answers' assistant turns are labelled; a plain prompt
gets the answer appended with eos.
Prompt record: {"prompt": str or chat messages, ...other fields}; the other fields go to reward functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from loraflow.data.batching import DataStats, Row, collate, cut
from loraflow.data.formats import BY_NAME, choose, to_canonical
from loraflow.data.formatting import (
    IGNORE,
    _render,
    _validate_messages,
    has_template,
    tokenize,
    tokenize_messages,
)
from loraflow.data.readers import Record
from loraflow.errors import DataError


@dataclass
class PairRow:
    chosen: Row
    rejected: Row
    origin: str


@dataclass
class PromptRow:
    prompt_ids: list[int]
    fields: dict[str, Any] = field(default_factory=dict)
    origin: str = ""
    prompt: Any = None
    """The prompt as the record holds it (a string or chat messages): TRL-style reward functions receive it, and a
    reward model with its own tokenizer re-encodes it."""


def _prompt(record: Record) -> tuple[str, Any]:
    data = record.data
    key = "prompt" if "prompt" in data else "messages" if "messages" in data else None
    if key is None:
        raise DataError(f"{record.origin}: missing field `prompt` (a string, or a list of chat messages). Fields "
                        f"present: {', '.join(sorted(data)) or 'none'}.")
    prompt = data[key]
    if isinstance(prompt, str):
        if not prompt.strip():
            raise DataError(f"{record.origin}: field `{key}` is empty.")
        return key, prompt
    if not isinstance(prompt, list) or not prompt or not all(isinstance(m, dict) for m in prompt):
        raise DataError(f"{record.origin}: field `{key}` must be a string or a non-empty list of {{role, content}} "
                        f"messages, got {type(prompt).__name__}.")
    if prompt[-1].get("role") == "assistant":
        raise DataError(f"{record.origin}: field `{key}` ends with an assistant turn; the prompt must end where the "
                        "answer starts (put the answers in chosen/rejected).")
    return key, prompt


def _chat_row(record: Record, prompt: list, answer: list, name: str, key: str, processor) -> Row:
    """An image-text pair side: the prompt's images go with each side, since chosen and rejected are separate
    rows (collate_pairs)."""
    from loraflow.data.multimodal import tokenize_chat

    names = [f"{key}[{i}]" for i in range(len(prompt))] + [f"{name}[{i}]" for i in range(len(answer))]
    return tokenize_chat([*prompt, *answer], processor, record, first_learned=len(prompt), names=names)


def _answer(record: Record, prompt: Any, name: str, tokenizer, processor=None, key: str = "prompt") -> Row:
    answer = record.data.get(name)
    if isinstance(answer, list) and not isinstance(prompt, str):
        if not answer or not all(isinstance(m, dict) for m in answer) or answer[0].get("role") != "assistant":
            raise DataError(f"{record.origin}: field `{name}` must be a non-empty list of messages starting with the "
                            "assistant's turn (or a string).")
        if processor is not None:
            return _chat_row(record, prompt, answer, name, key, processor)
        messages = _validate_messages(Record({"messages": [*prompt, *answer]}, record.origin))
        return Row(*tokenize_messages(messages, tokenizer, record.origin, first_learned=len(prompt)))
    if not isinstance(answer, str) or not answer.strip():
        got = "missing" if name not in record.data else "empty" if isinstance(answer, str) else \
            f"a {type(answer).__name__}"
        raise DataError(f"{record.origin}: field `{name}` must be a non-empty string (or, after a chat prompt, a list "
                        f"of assistant messages), got {got}.")
    if isinstance(prompt, str):
        sample = tokenize(Record({"prompt": prompt, "completion": answer}, record.origin), "prompt_completion",
                          tokenizer)
        return Row(sample.input_ids, sample.labels)
    if processor is not None:
        return _chat_row(record, prompt, [{"role": "assistant", "content": answer}], name, key, processor)
    messages = _validate_messages(Record({"messages": [*prompt, {"role": "assistant", "content": answer}]},
                                         record.origin))
    return Row(*tokenize_messages(messages, tokenizer, record.origin, first_learned=len(prompt)))


def _same(a: Any, b: Any) -> bool:
    return a.strip() == b.strip() if isinstance(a, str) and isinstance(b, str) else a == b


def tokenize_pair(record: Record, tokenizer, configured_format: str = "auto", processor=None) -> PairRow:
    """A pair record in any preference format (explicit or implicit prompt, standard or conversational). With a
    `processor`, a chat prompt may hold images (data.multimodal): both sides carry them."""
    chat = has_template(processor or tokenizer)
    fmt = choose(record, "pairs", chat, configured_format)
    record = to_canonical(record, BY_NAME[fmt.name], chat)
    key, prompt = _prompt(record)
    if processor is not None:
        tokenizer = processor.tokenizer  # plain-text pairs of an image-text model use its tokenizer
    chosen = _answer(record, prompt, "chosen", tokenizer, processor, key)
    rejected = _answer(record, prompt, "rejected", tokenizer, processor, key)
    if _same(record.data["chosen"], record.data["rejected"]):
        raise DataError(f"{record.origin}: fields `chosen` and `rejected` are the same answer; there is no "
                        "preference to learn. Fix or drop the record.")
    return PairRow(chosen, rejected, record.origin)


def truncate_pairs(pairs: list[PairRow], max_length: int) -> tuple[list[PairRow], DataStats]:
    """Cut both answers to max_length tokens; a pair where either side keeps no learned token, or where the cut
    would go through image tokens, is dropped."""
    stats, kept = DataStats(), []
    for p in pairs:
        if any(len(r.input_ids) > max_length and r.images_end > max_length for r in (p.chosen, p.rejected)):
            stats.image_cut += 1
            stats.image_cut_origins.append(p.origin)
            continue
        rows = []
        for row in (p.chosen, p.rejected):
            if len(row.input_ids) > max_length:
                stats.truncated += 1
                row = cut(row, max_length)
            rows.append(row)
        learned = [sum(1 for t in r.labels[1:] if t != IGNORE) for r in rows]
        if min(learned) == 0:
            stats.dropped += 1
            stats.dropped_origins.append(p.origin)
            continue
        stats.samples += 1
        stats.tokens += sum(len(r.input_ids) for r in rows)
        stats.label_tokens += sum(learned)
        kept.append(PairRow(rows[0], rows[1], p.origin))
    return kept, stats


def collate_pairs(rows: list[PairRow], pad_id: int, pack_to: int = 0) -> dict[str, torch.Tensor]:
    """One batch of the P pairs' 2P sequences, chosen first then rejected, so both go through one forward: a row
    each, or, with `pack_to` (data.packing), packed in that order into rows of at most `pack_to` tokens. Packed
    rows restart their position ids per sequence (transformers then keeps sequences from attending to each other)
    and carry `segments`: the sequence (0..2P-1) each position belongs to, -1 on padding, so per-sequence sums and
    last tokens can be read back. Image-text pairs are not packed."""
    sequences = [r.chosen for r in rows] + [r.rejected for r in rows]
    # Image-text sequences are never packed (data.multimodal): each keeps its own images, padded to a row.
    if not pack_to or any(s.images or s.token_types for s in sequences):
        batch = collate(sequences, pad_id)
        batch["num_pairs"] = torch.tensor(len(rows))
        return batch
    packed: list[Row] = []
    owners: list[list[int]] = []
    for k, seq in enumerate(sequences):
        if not packed or len(packed[-1].input_ids) + len(seq.input_ids) > pack_to:
            packed.append(Row([], [], []))
            owners.append([])
        row = packed[-1]
        row.input_ids += seq.input_ids
        row.labels += [IGNORE] + seq.labels[1:]  # never predicted from the previous sequence's last token
        row.position_ids += list(range(len(seq.input_ids)))
        owners[-1] += [k] * len(seq.input_ids)
    batch = collate(packed, pad_id)
    segments = torch.full(batch["input_ids"].shape, -1, dtype=torch.long)
    for i, owner in enumerate(owners):
        segments[i, :len(owner)] = torch.tensor(owner)
    batch["segments"] = segments
    batch["num_pairs"] = torch.tensor(len(rows))
    return batch


def sequence_ends(segments: torch.Tensor, count: int, candidates: torch.Tensor | None = None) -> torch.Tensor:
    """[count] flat positions (into segments.view(-1)) of each packed sequence's last token, or of its last
    position where `candidates` is true."""
    flat = segments.reshape(-1)
    if candidates is not None:
        flat = torch.where(candidates.reshape(-1), flat, -1)
    positions = torch.arange(flat.numel(), device=flat.device)
    ends = torch.full((count,), -1, dtype=torch.long, device=flat.device)
    return ends.scatter_reduce(0, flat.clamp(min=0), torch.where(flat >= 0, positions, -1), reduce="amax")


def pair_count(batch: dict[str, torch.Tensor]) -> int:
    return int(batch["num_pairs"])


def tokenize_prompt(record: Record, tokenizer) -> PromptRow:
    key, prompt = _prompt(record)
    if isinstance(prompt, str):
        ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
    else:
        ids = _render(tokenizer, prompt, True, record.origin)
    fields = {k: v for k, v in record.data.items() if k != key}
    return PromptRow(ids, fields, record.origin, prompt)


def load_pairs(records: list[Record], key: str, tokenizer, max_length: int,
               processor=None) -> tuple[list[PairRow], DataStats]:
    """Canonical pair records (data.sources read them) -> truncated pairs (with `processor`: image-text pairs)."""
    pairs, stats = truncate_pairs([tokenize_pair(r, tokenizer, processor=processor) for r in records], max_length)
    if not pairs:
        raise DataError(f"{key}: no pair left after truncation to data.max_length={max_length}; raise it.")
    return pairs, stats


def load_prompts(records: list[Record], key: str, tokenizer, max_length: int) -> tuple[list[PromptRow], DataStats]:
    rows, stats = [], DataStats()
    for record in records:
        row = tokenize_prompt(record, tokenizer)
        if len(row.prompt_ids) > max_length:
            raise DataError(f"{record.origin}: the prompt has {len(row.prompt_ids)} tokens, more than "
                            f"data.max_length={max_length}; cutting it would change the task. Raise "
                            "data.max_length or shorten the prompt.")
        rows.append(row)
        stats.samples += 1
        stats.tokens += len(row.prompt_ids)
    if not rows:
        raise DataError(f"{key}: no prompts.")
    return rows, stats


def answer_prompt(row: PairRow, tokenizer):
    """The prompt of a pair (the tokens before its chosen answer) and the chosen answer's text, for exact match."""
    from loraflow.data.formatting import IGNORE, EvalPrompt

    first = next(i for i, t in enumerate(row.chosen.labels) if t != IGNORE)
    answer = [t for t in row.chosen.labels if t != IGNORE]
    return EvalPrompt(row.chosen.input_ids[:first], tokenizer.decode(answer, skip_special_tokens=True).strip(),
                      row.origin)
