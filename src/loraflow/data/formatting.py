"""Records -> token ids with labels on the learned tokens only.

Chat `messages` are rendered with the tokenizer's own chat template. Assistant spans are found by rendering the
conversation up to each assistant turn (with the generation prompt) and through it: the tokens in between are the
turn, end-of-turn marker included, so the model learns to stop. This works for any template that only appends,
and a template that rewrites earlier text is refused rather than silently mislabelled. An assistant message with
`"weight": 0` (OpenAI's fine-tuning format) is rendered but not learned.

Plain `text` records (continued pretraining) learn every token; the tokenizer adds its special tokens and eos is
appended so packed documents are separated. Other formats (alpaca, sharegpt) are converted by data.formats first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loraflow.data.formats import choose, detect, refusal, to_canonical
from loraflow.data.readers import Record
from loraflow.errors import DataError

IGNORE = -100
ROLES = ("system", "user", "assistant", "tool")
CANONICAL = ("messages", "prompt_completion", "text")


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
    if configured == "text" or (configured == "auto" and "text" in data):
        if not isinstance(data.get("text"), str) or not data["text"].strip():
            raise DataError(f"{record.origin}: field `text` must be a non-empty string.")
        return "text"
    raise refusal(record, "sft", True, configured)


def has_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def canonical(record: Record, configured: str, tokenizer) -> Record:
    """alpaca and sharegpt records converted to messages (or prompt/completion without a chat template)."""
    if configured in CANONICAL:
        return record
    fmt = choose(record, "sft", has_template(tokenizer), configured) if configured != "auto" else \
        detect(record.data, "sft")
    if fmt is None or fmt.name in CANONICAL:
        return record
    return to_canonical(record, fmt, has_template(tokenizer))


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


def tokenize_messages(messages: list[dict[str, Any]], tokenizer, origin: str,
                      first_learned: int = 0) -> tuple[list[int], list[int]]:
    """Ids and labels of a conversation; assistant turns from message `first_learned` on are learned (a preference
    pair learns only its answers, not assistant turns inside its prompt)."""
    ids = _render(tokenizer, messages, False, origin)
    labels = [IGNORE] * len(ids)
    for i, m in enumerate(messages):
        if i < first_learned or m["role"] != "assistant" or m.get("weight", 1) == 0:
            continue
        prefix = _render(tokenizer, messages[:i], True, origin) if i else []
        start = len(prefix)
        through = _render(tokenizer, messages[: i + 1], False, origin)
        # Both ends must be prefixes of the whole conversation, or the span would be shifted silently (a
        # generation prompt the template renders differently inside a conversation, a merge across the boundary).
        if ids[: len(through)] != through or ids[:start] != prefix:
            raise DataError(f"{origin}: this tokenizer's chat template rewrites earlier turns, so assistant "
                            "tokens cannot be located. Use prompt/completion records for this model.")
        labels[start: len(through)] = ids[start: len(through)]
    return ids, labels


def _tokenize_prompt_completion(record: Record, tokenizer) -> tuple[list[int], list[int]]:
    prompt = tokenizer(record.data["prompt"], add_special_tokens=True)["input_ids"]
    completion = tokenizer(record.data["completion"], add_special_tokens=False)["input_ids"]
    if tokenizer.eos_token_id is not None:
        completion = completion + [tokenizer.eos_token_id]  # learn to stop
    return prompt + completion, [IGNORE] * len(prompt) + completion


def _tokenize_text(record: Record, tokenizer) -> tuple[list[int], list[int]]:
    ids = tokenizer(record.data["text"], add_special_tokens=True)["input_ids"]
    if tokenizer.eos_token_id is not None and (not ids or ids[-1] != tokenizer.eos_token_id):
        ids = ids + [tokenizer.eos_token_id]  # ends the document, so packed documents are told apart
    return ids, list(ids)


def tokenize(record: Record, configured_format: str, tokenizer) -> Sample:
    record = canonical(record, configured_format, tokenizer)
    fmt = record_format(record, "auto" if configured_format not in CANONICAL else configured_format)
    if fmt == "messages":
        ids, labels = tokenize_messages(_validate_messages(record), tokenizer, record.origin)
    elif fmt == "text":
        ids, labels = _tokenize_text(record, tokenizer)
    else:
        ids, labels = _tokenize_prompt_completion(record, tokenizer)
    return Sample(ids, labels, record.origin)


def eval_prompt(record: Record, configured_format: str, tokenizer) -> EvalPrompt | None:
    """The prompt to generate from and the reference answer, for exact-match evaluation; None for plain text,
    which has no answer to compare with."""
    record = canonical(record, configured_format, tokenizer)
    fmt = record_format(record, "auto" if configured_format not in CANONICAL else configured_format)
    if fmt == "text":
        return None
    if fmt == "messages":
        messages = _validate_messages(record)
        if messages[-1]["role"] != "assistant":
            raise DataError(f"{record.origin}: for exact-match evaluation the last message must be the assistant's "
                            "reference answer; fix the record or set eval.generate=false.")
        ids = _render(tokenizer, messages[:-1], True, record.origin)
        return EvalPrompt(ids, messages[-1]["content"], record.origin)
    ids = tokenizer(record.data["prompt"], add_special_tokens=True)["input_ids"]
    return EvalPrompt(ids, record.data["completion"], record.origin)
