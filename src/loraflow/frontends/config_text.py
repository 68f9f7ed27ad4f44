"""What a config file that does not parse shows, for the error `check` gives: threads paste configs cut short
(an excerpt of a DeepSpeed JSON) or lift a few members out of a JSON file without the braces around them."""

from __future__ import annotations

import json
import re
from contextvars import ContextVar

EXCERPTS: ContextVar[list[str] | None] = ContextVar("excerpts", default=None)
"""While `check` runs: a list that collects what each config read as an excerpt left out (a JSON file cut short is
read up to where it stops rather than refused); None elsewhere, where a cut file stays an error."""


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


def close_cut(text: str) -> tuple[dict, int] | None:
    """A JSON object cut short (a paste that stops mid-file), read up to its last whole line: lines are dropped from
    the end until what is left, with a trailing comma removed and the open brackets closed, parses. (object, last
    line kept), or None when no prefix of a few lines less parses as an object."""
    lines = text.rstrip().splitlines()
    for keep in range(len(lines), max(len(lines) - 6, 0), -1):
        head = "\n".join(lines[:keep]).rstrip().rstrip(",")
        opened: list[str] = []
        quoted = False
        for i, c in enumerate(head):
            if c == '"' and (i == 0 or head[i - 1] != "\\"):
                quoted = not quoted
            elif not quoted and c in "{[":
                opened.append("}" if c == "{" else "]")
            elif not quoted and c in "}]" and opened:
                opened.pop()
        if quoted or not opened:
            continue
        try:
            data = json.loads(head + "".join(reversed(opened)))
        except json.JSONDecodeError:
            continue
        if isinstance(data, dict):
            return data, keep
    return None
