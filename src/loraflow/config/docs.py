"""Field documentation read from the attribute docstrings in schema.py (Python keeps no attribute docstrings at
run time, so they are read from the source with `ast`). Feeds `loraflow config` and docs/configuration.md."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import typing
from typing import Any

from loraflow.config import schema
from loraflow.config.loader import _describe, _is_dataclass_type


def _attribute_docs(cls: type) -> dict[str, str]:
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # the class body
    docs: dict[str, str] = {}
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def field_table(cls: type = schema.Config, prefix: str = "") -> list[tuple[str, str, Any, str]]:
    """(key, type, default, doc) for every leaf field, depth first."""
    rows = []
    hints = typing.get_type_hints(cls)
    docs = _attribute_docs(cls)
    defaults = cls()
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if _is_dataclass_type(tp):
            rows += field_table(tp, f"{prefix}{f.name}.")
        else:
            rows.append((f"{prefix}{f.name}", _describe(tp), getattr(defaults, f.name), docs.get(f.name, "")))
    return rows


def render_markdown() -> str:
    lines = [
        "# Configuration reference",
        "",
        "Generated from the attribute docstrings in `src/loraflow/config/schema.py` by",
        "`python scripts/gen_docs.py`; a test fails when this file is stale.",
        "Set keys in a YAML file (sections as below) or on the command line as `section.key=value`.",
        "",
        "| key | type | default | meaning |",
        "|---|---|---|---|",
    ]
    for key, tp, default, doc in field_table():
        shown = "" if default in ("", None) else f"`{default}`"
        cells = [f"`{key}`", tp, shown, doc]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"
