"""Parsing a training script's text for script_code.py: snippets pasted into issues are fragments, so lines that do
not parse are skipped one at a time (each reported with its number), `...` standing for elided arguments is read as
nothing, and notebook magics (`!pip install`) are dropped. Line numbers always stay those of the text."""

from __future__ import annotations

import ast
import re
import textwrap
from typing import Any

_MAX_SKIPS = 60


# `...` in an argument list or a list literal (`f(x, ..., y=1)`): a poster's elision, read as `*()` (nothing).
_ELLIPSIS = re.compile(r"(?<=[(\[,])(\s*)\.\.\.(?=\s*[,)\]])")


# `...` standing for statements: alone on its line (`# setup the trainer` / `...`) or as a value (`trainer = ...`).
_ELIDED_CODE = re.compile(r"(?:[\w.\[\]\s]+=\s*)?\.\.\.(?:\s*#.*)?$")


def parse(text: str, code: Any) -> ast.Module:
    lines = textwrap.dedent(text.replace("\t", "    ")).splitlines()
    depth = 0
    for i, line in enumerate(lines):
        stripped = line.strip()
        # Notebook magics and shell escapes (`!pip install`, `%time`) are not Python.
        if stripped.startswith(("!", "%")):
            code.skipped.append(f"{code.file}:{i + 1}: skipped (a notebook command): {stripped[:80]}")
            lines[i] = ""
        elif depth > 0 and stripped in ("...", "...,"):  # a line of its own inside a call: `f(\n ...\n x=1)`
            lines[i] = line.replace("...", "*()," if stripped == "..." else "*()", 1)
            code.elided.append(i + 1)
        elif "..." in line and _ELLIPSIS.search(line):
            lines[i] = _ELLIPSIS.sub(r"\1*()", line)
            code.elided.append(i + 1)
        elif depth == 0 and _ELIDED_CODE.match(stripped):
            code.elided_code.append(i + 1)
        # Open brackets so far (strings and comments are not told apart: a guess is enough here).
        code_part = line.split("#", 1)[0]
        depth = max(0, depth + sum(code_part.count(c) for c in "([{") - sum(code_part.count(c) for c in ")]}"))
    for _ in range(_MAX_SKIPS):
        try:
            return ast.parse("\n".join(lines))
        except SyntaxError as exc:
            if not _repair(lines, exc, code):
                break
    return ast.Module(body=[], type_ignores=[])


def _repair(lines: list[str], exc: SyntaxError, code: Any) -> bool:
    """Make the line the parser stopped at harmless, keeping every other line where it is (line numbers stay)."""
    row = min(max((exc.lineno or 1) - 1, 0), len(lines) - 1) if lines else -1
    while row > 0 and not lines[row].strip():
        row -= 1
    if row < 0 or not lines[row].strip():
        return False
    line = lines[row]
    indent = line[:len(line) - len(line.lstrip())]
    if _close_or_separate(lines, exc, code):
        return True
    if exc.msg.startswith("unexpected indent"):
        # A pasted block whose first lines were left out: pull it back to the previous line's indentation.
        prev = next((x for x in reversed(lines[:row]) if x.strip()), "")
        cut = len(indent) - (len(prev) - len(prev.lstrip()))
        for j in range(row, len(lines)):
            if lines[j].strip() and not lines[j].startswith(indent):
                break
            lines[j] = lines[j][cut:] if lines[j].strip() else lines[j]
        return True
    code.skipped.append(f"{code.file}:{row + 1}: skipped ({exc.msg}): {line.strip()[:80]}")
    # A block header that does not parse keeps its indented body a block; prose ending in a colon has none.
    after = next((x for x in lines[row + 1:] if x.strip()), "")
    opens = line.rstrip().endswith(":") and len(after) - len(after.lstrip()) > len(indent)
    lines[row] = indent + ("if True:" if opens else "pass")
    return True


_UNCLOSED = re.compile(r"'([(\[{])' was never closed")
_CLOSER = {"(": ")", "[": "]", "{": "}"}


def _close_or_separate(lines: list[str], exc: SyntaxError, code: Any) -> bool:
    """Two slips of a pasted excerpt that keep the call they sit in: the paste stops inside a call (`'(' was never
    closed`: the bracket is closed on a line added after the last one, so `get_peft_model(model, r=16,` cut there
    still reads as that call), and a comma left out between two arguments on consecutive lines (`x=1` / `y=2` inside
    a call: Python's 'Perhaps you forgot a comma?'), put back at the end of the first line."""
    unclosed = _UNCLOSED.match(exc.msg)
    if unclosed:
        lines.append(_CLOSER[unclosed.group(1)])
        code.elided.append(len(lines))
        return True
    row, end = (exc.lineno or 0) - 1, (exc.end_lineno or 0) - 1
    if "forgot a comma" in exc.msg and 0 <= row < end < len(lines):
        line = lines[row]
        # A `#` in a line with quotes may sit in a string: only a line without quotes has its comment told apart.
        body, hash_, comment = line.partition("#") if not any(q in line for q in "'\"") else (line, "", "")
        if body.strip() and not body.rstrip().endswith(",") and (hash_ or "#" not in line):
            lines[row] = body.rstrip() + "," + (" " + hash_ + comment if hash_ else "")
            code.skipped.append(f"{code.file}:{row + 1}: read with a comma added ({exc.msg})")
            return True
    return False
