"""Image-text records -> rows for a model with a processor (transformers.AutoProcessor: a tokenizer, an image
processor and a chat template).

Messages follow transformers' multimodal chat convention (a content string, or a list of `text` and `image` parts;
data.images reads the images). The processor's chat template renders the conversation and the processor expands
each image placeholder into that image's tokens. Assistant spans are found as formatting.tokenize_messages finds
them, by rendering the conversation up to each assistant turn and through it, but each prefix is run through the
processor with the images it holds, so the token counts include the image-token expansion. Image tokens are never
learned, wherever they are.

Each row keeps its own image tensors (everything the processor returns besides input_ids and attention_mask);
per-token outputs (token_type_ids, mm_token_type_ids) stay lists beside input_ids so truncation and padding treat
them like the ids. A sample whose image tokens data.max_length would cut is dropped and counted, never cut.

Image-text data is not packed: packing would have to keep every row's images in order and restart the
vision-language position ids (Qwen2-VL's 3-D rope) per sample; rows are padded instead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from loraflow.data.batching import DataStats, Row, cut, tally
from loraflow.data.formatting import (
    CANONICAL,
    IGNORE,
    ROLES,
    EvalPrompt,
    canonical,
    record_format,
    tokenize,
)
from loraflow.data.image_batching import collate_images  # noqa: F401 - loop/evaluate.py and tests import it from here
from loraflow.data.images import content_parts, image_payload, load_image
from loraflow.data.readers import Record
from loraflow.errors import DataError
from loraflow.families import FRAMING_TOKENS, IMAGE_TOKEN_ATTR, TOKEN_KEYS

log = logging.getLogger("loraflow")

TEXT_KEYS = ("input_ids", "attention_mask", "labels")
"""Processor outputs that are not image inputs. `labels`: PaliGemma's processor returns its own (loraflow labels the
assistant turns itself)."""


def image_token_ids(processor) -> set[int]:
    """Ids of the tokens that stand for or frame an image: never learned, never cut by truncation. Every family's
    (families.IMAGE_TOKEN_ATTR, FRAMING_TOKENS): a processor does not say which family it serves."""
    tokenizer = processor.tokenizer
    ids: set[int] = set()
    added = set(tokenizer.get_added_vocab())
    for token in FRAMING_TOKENS:
        if token in added:
            ids.add(tokenizer.convert_tokens_to_ids(token))
    for name, value in vars(processor).items():
        if isinstance(value, str) and IMAGE_TOKEN_ATTR.search(name):
            ids.add(tokenizer.convert_tokens_to_ids(value))
        elif isinstance(value, int) and not isinstance(value, bool) and IMAGE_TOKEN_ATTR.search(name[:-3]) \
                and name.endswith("_id"):
            ids.add(value)
    ids.discard(None)
    ids.discard(tokenizer.unk_token_id)
    return ids


@dataclass
class MultimodalEvalPrompt(EvalPrompt):
    """An exact-match prompt with the image inputs generate() needs beside its prompt ids."""
    images: dict[str, torch.Tensor] | None = None
    token_types: dict[str, list[int]] | None = None


@dataclass
class Chat:
    """A conversation ready for the processor's template: parts only (images without payload), the images in
    order, and how many images each message holds."""
    messages: list[dict[str, Any]]
    images: list[Any]
    per_message: list[int]
    parts: list[str]
    """Where each image is in the record, e.g. `messages[0].content[1] (user)`, for errors."""

    def images_before(self, end: int) -> list[Any]:
        return self.images[: sum(self.per_message[:end])]


def prepare_chat(messages: Any, record: Record, names: list[str] | None = None) -> Chat:
    """Validate roles and parts and open every image (a DataError names the file, line and part). `names` names each
    message for errors (default `messages[i]`; a pair names `prompt[i]`, `chosen[i]`)."""
    if not isinstance(messages, list) or not messages:
        raise DataError(f"{record.origin}: field `messages` must be a non-empty list of {{role, content}} objects.")
    names = names or [f"messages[{i}]" for i in range(len(messages))]
    out, images, counts, where_images = [], [], [], []
    for m, name in zip(messages, names):
        if not isinstance(m, dict):
            raise DataError(f"{record.origin}: `{name}` must be an object with role and content.")
        if m.get("role") not in ROLES:
            raise DataError(f"{record.origin}: `{name}.role` must be one of {', '.join(ROLES)}; got {m.get('role')!r}.")
        parts, n = [], 0
        for j, part in enumerate(content_parts(m.get("content"), record, f"{name}.content")):
            if part["type"] == "image":
                where = f"{name}.content[{j}]" if isinstance(m.get("content"), list) else f"{name}.content"
                images.append(load_image(image_payload(part)[1], record, where))
                where_images.append(f"{where} ({m['role']})")
                parts.append({"type": "image"})  # the template needs only the placeholder; the image goes aside
                n += 1
            else:
                parts.append({"type": "text", "text": part["text"]})
        out.append({**{k: v for k, v in m.items() if k != "content"}, "content": parts})
        counts.append(n)
    return Chat(out, images, counts, where_images)


def _text(processor, messages: list[dict[str, Any]], generation_prompt: bool, origin: str) -> str:
    if not getattr(processor, "chat_template", None):
        raise DataError(f"{origin}: chat `messages` need a processor with a chat template, and this one has none. "
                        "Set model.tokenizer to a processor that has one.")
    try:
        return processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    except Exception as exc:  # jinja raises for role orders and part types a template refuses
        raise DataError(f"{origin}: the processor's chat template rejected these messages ({exc}).") from None


def _encode(processor, text: str, images: list[Any], chat: Chat, origin: str) -> dict[str, Any]:
    try:
        # The template already wrote any BOS it wants; adding special tokens again would double it.
        out = processor(text=[text], images=images or None, add_special_tokens=False, return_tensors="pt")
    except Exception as exc:  # a placeholder count that does not match the images, an image it cannot resize
        if not images and not chat.parts:
            # A processor that demands images (PaliGemma's) for a text-only sample: its tokenizer encodes it, as
            # the model reads a text-only row without pixel values.
            return dict(processor.tokenizer([text], add_special_tokens=False, return_tensors="pt"))
        raise DataError(f"{origin}: the processor could not encode this sample's text with its {len(images)} "
                        f"image(s) ({type(exc).__name__}: {exc}). Image parts: {', '.join(chat.parts) or 'none'}. "
                        "The chat template must render one placeholder per image part (many render images only in "
                        "user turns): move the image to a user message or fix the template.") from None
    return dict(out)


def _length(processor, chat: Chat, end: int, generation_prompt: bool, origin: str) -> list[int]:
    text = _text(processor, chat.messages[:end], generation_prompt, origin)
    return _encode(processor, text, chat.images_before(end), chat, origin)["input_ids"][0].tolist()


def _within(part: list[int], ids: list[int]) -> list[int] | None:
    """`part` (the encoding of the conversation's first turns) as it begins `ids` (the whole conversation's), or
    None. A processor that appends the same few tokens to every text it encodes (PaliGemma's adds a newline after
    the text, having put the image tokens and BOS first) ends `part` with them too: they are dropped where they
    also end `ids`."""
    if ids[: len(part)] == part:
        return part
    for k in (1, 2, 3):
        if len(part) > k and part[-k:] == ids[-k:] and ids[: len(part) - k] == part[:-k]:
            return part[:-k]
    return None


def tokenize_chat(messages: Any, processor, record: Record, first_learned: int = 0,
                  names: list[str] | None = None) -> Row:
    """A conversation as one row: ids, labels on the assistant turns from message `first_learned` on (never on
    image tokens), and its image tensors."""
    chat = prepare_chat(messages, record, names)
    origin = record.origin
    full = _encode(processor, _text(processor, chat.messages, False, origin), chat.images, chat, origin)
    ids = full["input_ids"][0].tolist()
    labels = [IGNORE] * len(ids)
    for i, m in enumerate(chat.messages):
        if i < first_learned or m["role"] != "assistant" or m.get("weight", 1) == 0:
            continue
        prefix = _within(_length(processor, chat, i, True, origin), ids) if i else []
        through = _within(_length(processor, chat, i + 1, False, origin), ids)
        if through is None or prefix is None:
            raise DataError(f"{origin}: this processor's chat template rewrites earlier turns, so assistant tokens "
                            "cannot be located.")
        labels[len(prefix): len(through)] = ids[len(prefix): len(through)]
    special = image_token_ids(processor)
    positions = [k for k, t in enumerate(ids) if t in special]
    if chat.images and not positions:
        raise DataError(f"{origin}: the sample has {len(chat.images)} image(s) but the processor produced no image "
                        "token; the chat template drops image parts. Fix the template or the record.")
    for k in positions:
        labels[k] = IGNORE
    tensors = {k: v for k, v in full.items() if k not in TEXT_KEYS and k not in TOKEN_KEYS}
    types = {k: full[k][0].tolist() for k in TOKEN_KEYS if k in full}
    return Row(ids, labels, None, tensors if chat.images else None, types or None,
               positions[-1] + 1 if positions else 0)


def tokenize_record(record: Record, configured_format: str, processor) -> Row:
    """An SFT record as a row: chat messages through the processor, prompt/completion and text with its
    tokenizer (formatting.tokenize)."""
    record = canonical(record, configured_format, processor)
    fmt = record_format(record, "auto" if configured_format not in CANONICAL else configured_format)
    if fmt != "messages":
        sample = tokenize(record, fmt, processor.tokenizer)
        return Row(sample.input_ids, sample.labels)
    messages = record.data["messages"]
    if not isinstance(messages, list) or not any(isinstance(m, dict) and m.get("role") == "assistant"
                                                 for m in messages):
        raise DataError(f"{record.origin}: field `messages` has no assistant turn; there is nothing to learn.")
    return tokenize_chat(messages, processor, record)


def truncate_rows(rows: list[tuple[Row, str]], max_length: int) -> tuple[list[Row], DataStats]:
    """(row, origin) pairs cut to max_length; a row whose image tokens would be cut, or that keeps no learned
    token, is dropped and counted."""
    stats, kept = DataStats(), []
    for row, origin in rows:
        if len(row.input_ids) > max_length:
            if row.images_end > max_length:
                stats.image_cut += 1
                stats.image_cut_origins.append(origin)
                continue
            stats.truncated += 1
            row = cut(row, max_length)
        if tally(stats, row.input_ids, row.labels, origin):
            kept.append(row)
    return kept, stats


def load_rows(records: list[Record], processor, max_length: int, key: str,
              configured_format: str = "auto") -> tuple[list[Row], DataStats]:
    """SFT records -> truncated, unpacked rows (every image opened and checked on the way)."""
    rows, stats = truncate_rows([(tokenize_record(r, configured_format, processor), r.origin) for r in records],
                                max_length)
    if not rows:
        why = "would cut through image tokens or " if stats.image_cut else ""
        raise DataError(f"{key}: every sample was dropped because truncation to data.max_length={max_length} "
                        f"{why}left no learned token. Raise data.max_length.")
    if stats.image_cut:
        log.warning("%s: %d sample(s) dropped because data.max_length=%d would cut through their image tokens "
                    "(first: %s); raise data.max_length to keep them", key, stats.image_cut, max_length,
                    stats.image_cut_origins[0])
    return rows, stats


def eval_prompt(record: Record, configured_format: str, processor) -> MultimodalEvalPrompt | None:
    """The prompt (with its image inputs) and reference answer for exact match; None for plain text."""
    record = canonical(record, configured_format, processor)
    fmt = record_format(record, "auto" if configured_format not in CANONICAL else configured_format)
    if fmt == "text":
        return None
    if fmt != "messages":
        ids = processor.tokenizer(record.data["prompt"], add_special_tokens=True)["input_ids"]
        return MultimodalEvalPrompt(ids, record.data["completion"], record.origin)
    chat = prepare_chat(record.data["messages"], record)
    last = chat.messages[-1]
    if last["role"] != "assistant":
        raise DataError(f"{record.origin}: for exact-match evaluation the last message must be the assistant's "
                        "reference answer; fix the record or set eval.generate=false.")
    if chat.per_message[-1]:
        raise DataError(f"{record.origin}: the reference answer (last message) holds an image; exact match compares "
                        "text. Set eval.generate=false or drop the image from the answer.")
    out = _encode(processor, _text(processor, chat.messages[:-1], True, record.origin), chat.images, chat,
                  record.origin)
    reference = "".join(p["text"] for p in last["content"] if p["type"] == "text")
    ids = out["input_ids"][0].tolist()
    # Without a suffix the processor appends to every text (PaliGemma's newline): training saw the answer follow
    # the generation prompt directly.
    whole = _encode(processor, _text(processor, chat.messages, False, record.origin), chat.images, chat,
                    record.origin)["input_ids"][0].tolist()
    ids = _within(ids, whole) or ids
    tensors = {k: v for k, v in out.items() if k not in TEXT_KEYS and k not in TOKEN_KEYS}
    types = {k: out[k][0].tolist()[: len(ids)] for k in TOKEN_KEYS if k in out}
    return MultimodalEvalPrompt(ids, reference, record.origin, tensors if chat.images else None, types or None)


def pair_answer_prompt(row, processor) -> MultimodalEvalPrompt:
    """A pair's prompt (the tokens before its chosen answer, with the prompt's images) and its chosen answer."""
    chosen = row.chosen
    first = next(i for i, t in enumerate(chosen.labels) if t != IGNORE)
    answer = [t for t in chosen.labels if t != IGNORE]
    types = {k: v[:first] for k, v in chosen.token_types.items()} if chosen.token_types else None
    return MultimodalEvalPrompt(chosen.input_ids[:first],
                                processor.tokenizer.decode(answer, skip_special_tokens=True).strip(), row.origin,
                                chosen.images, types)


def warn_packing(packing: bool, key: str) -> None:
    if packing:
        log.warning("%s: data.packing is not applied to image-text data (each row keeps its own images and "
                    "positions); rows are padded instead. Set data.packing=false to silence this.", key)


def blank_row(processor) -> Row:
    """One blank image in a user turn, nothing learned: what a micro-batch without an image gets on a multi-rank
    run (plan.blank_images), so every rank runs the vision encoder (rules zero3-vision-skipped,
    ddp-unused-vision-tower). Its tokens attend only to each other (a row of their own), and with no label the
    loss, and so every gradient, is that of the real rows."""
    from PIL import Image

    record = Record({"messages": []}, "loraflow's blank image")
    chat = Chat([{"role": "user", "content": [{"type": "image"}]}], [Image.new("RGB", (32, 32))], [1],
                ["blank image"])
    out = _encode(processor, _text(processor, chat.messages, False, record.origin), chat.images, chat, record.origin)
    ids = out["input_ids"][0].tolist()
    tensors = {k: v for k, v in out.items() if k not in TEXT_KEYS and k not in TOKEN_KEYS}
    types = {k: out[k][0].tolist() for k in TOKEN_KEYS if k in out}
    return Row(ids, [IGNORE] * len(ids), None, tensors, types or None, len(ids))
