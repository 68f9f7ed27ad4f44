"""A prompt for `loraflow generate` and `chat`, as read from --prompt, --image, a --prompts file or the chat: its own
module so that the image handling (commands/vision.py) and generate.py both build it without importing each other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Prompt:
    messages: list[dict[str, Any]] | None
    """Chat turns as given (content a string or a list of text and image parts): what --json writes back."""
    text: str | None
    reference: str | None = None
    """The record's own answer (a trailing assistant message or a `completion` field), shown beside the output."""
    origin: str = "--prompt"
    """Where the prompt came from (`--prompts FILE line N`, `--image`), for errors."""
    chat: Any = None
    """data.multimodal.Chat: the messages with their images opened, for prompts given with content parts."""

    def shown(self) -> str:
        if self.messages is None:
            return self.text
        content = self.messages[-1]["content"]
        if isinstance(content, str):
            return content
        return " ".join(p["text"] if p.get("type") == "text" else f"[image {p['path']}]" if p.get("path") else "[image]"
                        for p in content if isinstance(p, dict))
