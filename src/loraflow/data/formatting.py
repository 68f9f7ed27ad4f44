"""Records -> token ids with labels on the learned tokens only.

Chat `messages` are rendered with the tokenizer's own chat template. Assistant spans are found by rendering the
conversation up to each assistant turn (with the generation prompt) and through it: the tokens in between are the
turn, end-of-turn marker included, so the model learns to stop. This works for any template that only appends,
and a template that rewrites earlier text is refused rather than silently mislabelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loraflow.data.readers import Record
from loraflow.errors import DataError

IGNORE = -100
ROLES = ("system", "user", "assistant", "tool")


@dataclass
class Sample:
    input_ids: list[int]
    labels: list[int]
    origin: str


@dataclass
class EvalPrompt:
    prompt_ids: list[int]
    reference: str
    origin: str


def record_format(record: Record, configured: str) -> str:
    data = record.data
    if configured == "messages" or (configured == "auto" and "messages" in data):
        if "messages" not in data:
            raise DataError(f"{record.origin}: missing field `messages` (data.format=messages). Fields present: "
                            f"{', '.join(sorted(data)) or 'none'}.")
        return "messages"
    if configured == "prompt_completion" or (configured == "auto" and ("prompt" in data or "completion" in data)):
        for name in ("prompt", "completion"):
            if not isinstance(data.get(name), str):
                got = "missing" if name not in data else f"a {type(data[name]).__name__}"
                raise DataError(f"{record.origin}: field `{name}` must be a string, got {got}.")
        if not data["completion"].strip():
            raise DataError(f"{record.origin}: field `completion` is empty; there is nothing to learn.")
        return "prompt_completion"
    raise DataError(f"{record.origin}: no `messages` and no `prompt`/`completion` fields (found: "
                    f"{', '.join(sorted(data)) or 'none'}). Use one of the two formats, or set data.format.")


def _validate_messages(record: Record) -> list[dict[str, str]]:
    messages = record.data["messages"]
    if not isinstance(messages, list) or not messages:
        raise DataError(f"{record.origin}: field `messages` must be a non-empty list of {{role, content}} objects.")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise DataError(f"{record.origin}: field `messages[{i}]` must be an object with role and content.")
        if m.get("role") not in ROLES:
            raise DataError(f"{record.origin}: field `messages[{i}].role` must be one of {', '.join(ROLES)}; "
                            f"got {m.get('role')!r}.")
        if not isinstance(m.get("content"), str):
            raise DataError(f"{record.origin}: field `messages[{i}].content` must be a string.")
    if not any(m["role"] == "assistant" for m in messages):
        raise DataError(f"{record.origin}: field `messages` has no assistant turn; there is nothing to learn.")
    return messages


def _render(tokenizer, messages: list[dict[str, Any]], generation_prompt: bool, origin: str) -> list[int]:
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(f"{origin}: chat `messages` need a tokenizer with a chat template, and this one has none. "
                        "Use prompt/completion records, or set model.tokenizer to one that has a template.")
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    except Exception as exc:  # jinja raises for role orders a template refuses
        raise DataError(f"{origin}: the chat template rejected these messages ({exc}).") from None
    # The template already wrote any BOS it wants; adding special tokens again would double it.
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _tokenize_messages(record: Record, tokenizer) -> tuple[list[int], list[int]]:
    messages = _validate_messages(record)
    ids = _render(tokenizer, messages, False, record.origin)
    labels = [IGNORE] * len(ids)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        prefix = _render(tokenizer, messages[:i], True, record.origin) if i else []
        start = len(prefix)
        through = _render(tokenizer, messages[: i + 1], False, record.origin)
        # Both ends must be prefixes of the whole conversation, or the span would be shifted silently (a
        # generation prompt the template renders differently inside a conversation, a merge across the boundary).
        if ids[: len(through)] != through or ids[:start] != prefix:
            raise DataError(f"{record.origin}: this tokenizer's chat template rewrites earlier turns, so assistant "
                            "tokens cannot be located. Use prompt/completion records for this model.")
        labels[start: len(through)] = ids[start: len(through)]
    return ids, labels


def _tokenize_prompt_completion(record: Record, tokenizer) -> tuple[list[int], list[int]]:
    prompt = tokenizer(record.data["prompt"], add_special_tokens=True)["input_ids"]
    completion = tokenizer(record.data["completion"], add_special_tokens=False)["input_ids"]
    if tokenizer.eos_token_id is not None:
        completion = completion + [tokenizer.eos_token_id]  # learn to stop
    return prompt + completion, [IGNORE] * len(prompt) + completion


def tokenize(record: Record, configured_format: str, tokenizer) -> Sample:
    fmt = record_format(record, configured_format)
    if fmt == "messages":
        ids, labels = _tokenize_messages(record, tokenizer)
    else:
        ids, labels = _tokenize_prompt_completion(record, tokenizer)
    return Sample(ids, labels, record.origin)


def eval_prompt(record: Record, configured_format: str, tokenizer) -> EvalPrompt:
    """The prompt to generate from and the reference answer, for exact-match evaluation."""
    fmt = record_format(record, configured_format)
    if fmt == "messages":
        messages = _validate_messages(record)
        if messages[-1]["role"] != "assistant":
            raise DataError(f"{record.origin}: for exact-match evaluation the last message must be the assistant's "
                            "reference answer; fix the record or set eval.generate=false.")
        ids = _render(tokenizer, messages[:-1], True, record.origin)
        return EvalPrompt(ids, messages[-1]["content"], record.origin)
    ids = tokenizer(record.data["prompt"], add_special_tokens=True)["input_ids"]
    return EvalPrompt(ids, record.data["completion"], record.origin)
