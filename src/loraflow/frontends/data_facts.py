"""What a run's data decides for `check --data FILE`: some rules hold or not depending on the samples, which a
launch line never shows (frontends/vision.py declares them as choices). Read here from the file itself, in the
formats image-text fine-tuning uses: LLaVA (`image` + `conversations` with `<image>`), ShareGPT / LLaMA-Factory /
ms-swift (`messages` + `images`), OpenAI-style content parts (`{"type": "image_url"}`), one JSON list or JSON Lines.

Decided from the data: whether text-only samples are mixed with image samples (`image_every_rank`: a micro-batch
can then hold no image, and a rank's vision tower skips its forward). Not decided: whether a length limit cuts a
sample inside its image tokens, which needs the processor's image-token count (image resolution, the model's patch
and merge sizes); the figures that bear on it are given with the question instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loraflow.errors import LoraflowError

# Keys that hold a sample's images or videos in the formats above (a path, a URL, or a list of them).
_MEDIA_KEYS = ("image", "images", "image_path", "image_paths", "image_url", "img", "video", "videos")
_PLACEHOLDERS = ("<image>", "<|image|>", "<img>", "<|image_pad|>", "<video>")
# Keys that label a turn rather than hold its text.
_LABEL_KEYS = {"role", "from", "id", "type", "name"}


@dataclass(frozen=True)
class DataFacts:
    path: str
    samples: int
    with_images: int
    longest_text_chars: int
    """The longest text (every turn) among samples that hold an image."""
    most_images: int

    @property
    def image_every_rank(self) -> bool | None:
        """True: every sample has an image; False: text-only samples are mixed in; None: no image sample at all."""
        if self.with_images == 0:
            return None
        return self.with_images == self.samples

    def describe(self) -> str:
        return (f"{self.path}: {self.samples} samples, {self.with_images} with an image"
                + (f" (at most {self.most_images} per sample; the longest image sample's text is "
                   f"{self.longest_text_chars} characters)" if self.with_images else ""))


def _records(path: Path) -> list[Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise LoraflowError(f"--data {path}: no such file. Give the training data file the run reads (JSON or "
                            f"JSON Lines).") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise LoraflowError(f"--data {path}: cannot read it ({exc}).") from None
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise LoraflowError(f"--data {path} is not valid JSON (line {exc.lineno}, column {exc.colno}): "
                                f"{exc.msg}.") from None
        return data if isinstance(data, list) else [data]
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise LoraflowError(f"--data {path}, line {number}: not a JSON record ({exc.msg}); the file must be a "
                                f"JSON list or one JSON object per line.") from None
    return records


def _texts(value: Any) -> list[str]:
    """Every string inside a record's turns (message contents, content parts' text)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [t for item in value for t in _texts(item)]
    if isinstance(value, dict):
        return [t for key, item in value.items() if key not in _MEDIA_KEYS and key not in _LABEL_KEYS
                for t in _texts(item)]
    return []


def _images(record: dict) -> int:
    count = 0
    for key in _MEDIA_KEYS:
        value = record.get(key)
        if isinstance(value, list):
            count += sum(1 for v in value if v)
        elif value:
            count += 1
    parts = [p for turn in record.get("messages") or [] if isinstance(turn, dict)
             for p in (turn.get("content") if isinstance(turn.get("content"), list) else [])]
    count += sum(1 for p in parts if isinstance(p, dict) and str(p.get("type", "")).startswith(("image", "video")))
    if count == 0:  # a placeholder alone (the image path given elsewhere) still marks an image sample
        count = sum(t.count(mark) for t in _texts(record) for mark in _PLACEHOLDERS)
    return count


def read(path: str) -> DataFacts:
    records = _records(Path(path))
    if not records:
        raise LoraflowError(f"--data {path} holds no samples.")
    with_images = longest = most = 0
    for number, record in enumerate(records, 1):
        if not isinstance(record, dict):
            raise LoraflowError(f"--data {path}, sample {number}: a {type(record).__name__}, not a JSON object.")
        images = _images(record)
        if images:
            with_images += 1
            most = max(most, images)
            longest = max(longest, sum(len(t) for t in _texts(record)))
    return DataFacts(path, len(records), with_images, longest, most)


def apply(result, facts: DataFacts) -> None:
    """Settle in a frontend's result the choices the data decides (they leave `unsure`, with the file as source);
    add what the data shows to the truncation question."""
    every = facts.image_every_rank
    if "image_every_rank" in result.unsure and every is not None:
        del result.unsure["image_every_rank"]
        result.setup = result.setup.replace(image_every_rank=every)
        result.sources["image_every_rank"] = facts.describe()
    if "mm_token_types_missing" in result.unsure:  # text only: the tokenizer's collator makes no token type ids
        del result.unsure["mm_token_types_missing"]
        result.setup = result.setup.replace(mm_token_types_missing=facts.with_images == 0)
        result.sources["mm_token_types_missing"] = facts.describe()
    if "image_safe_truncation" in result.unsure:
        labels, why = result.unsure["image_safe_truncation"]
        if facts.with_images == 0:
            del result.unsure["image_safe_truncation"]  # no image sample: nothing to cut inside image tokens
            result.setup = result.setup.replace(image_safe_truncation=True)
            result.sources["image_safe_truncation"] = facts.describe()
        else:
            result.unsure["image_safe_truncation"] = (labels, f"{why}; {facts.describe()}, and the image tokens per "
                                                              "image depend on the processor and the image sizes")
