"""What a config file that does not parse shows, for the error `check` gives: threads paste configs cut short
(an excerpt of a DeepSpeed JSON) or lift a few members out of a JSON file without the braces around them."""

from __future__ import annotations

import re


def cut_off(text: str, pos: int) -> str:
    """Where a JSON parser stopped at the end of the text: which bracket is still open (a paste cut short)."""
    if text[pos:].strip():
        return ""
    opened: list[int] = []
    quoted = False
    for i, c in enumerate(text):  # strings skipped, so a bracket inside a value is not counted
        if c == '"' and (i == 0 or text[i - 1] != "\\"):
            quoted = not quoted
        elif not quoted and c in "{[":
            opened.append(i)
        elif not quoted and c in "}]" and opened:
            opened.pop()
    if not opened:
        return ""
    line = text.count("\n", 0, opened[-1]) + 1
    return f"; the file ends before the `{text[opened[-1]]}` opened on line {line} is closed (cut short?)"


def json_piece(text: str) -> str:
    """`"name": {...},` pasted out of a JSON file: its members without the braces around them."""
    return "; it reads as members of a JSON object without the `{ }` around them" if re.match(
        r'\s*"[^"\n]+"\s*:', text) else ""
