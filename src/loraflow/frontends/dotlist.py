"""Dotted `key=value` overrides and nested YAML configs, as Hydra (verl) and OmegaConf (torchtune's `tune run`) read
them: `a.b.c=value`, `+a.b=value` (add a key the config lacks), `++a.b=value` (add or override), `~a.b` (delete).
Values are read as OmegaConf reads them (YAML flow syntax: `true`, `null`, `64`, `[q_proj,v_proj]`), any other text
as a string. Shared by the frontends whose launches take such overrides."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml

_KEY = re.compile(r"^(\+\+|\+|~)?([A-Za-z_][\w\-]*(\.[\w\-@]+)*)(=(.*))?$", re.S)


@dataclass
class Override:
    key: str
    value: Any
    raw: str
    """The token as written (what reports and unknown lists show)."""
    mode: str = ""
    """`+` adds a key the config lacks, `++` adds or overrides, `~` deletes; empty: overrides a key that exists."""


def parse_value(text: str) -> Any:
    """An override's value as OmegaConf types it: booleans, null, numbers and `[a,b]` lists by YAML's flow rules
    (which Hydra's grammar follows for these); `1e-6`, `.*visual.*`, `all-linear` stay text."""
    if text == "":
        return ""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return text if isinstance(value, dict) else value


def split_overrides(tokens: list[str]) -> tuple[list[Override], list[str]]:
    """The `key=value` overrides among `tokens`, and every other token (flags, stray words) in order. Empty tokens
    (a `"$@"` that expanded to nothing) are dropped."""
    found: list[Override] = []
    others: list[str] = []
    for token in tokens:
        if token == "":
            continue
        m = _KEY.match(token)
        if m is None or (m.group(4) is None and m.group(1) != "~"):
            others.append(token)
            continue
        value = parse_value(m.group(5)) if m.group(4) is not None else None
        found.append(Override(m.group(2), value, token, m.group(1) or ""))
    return found, others


def flatten(data: dict, prefix: str = "") -> dict[str, Any]:
    """A nested config as dotted keys (`{"model": {"lora_rank": 8}}` -> `{"model.lora_rank": 8}`); an empty mapping
    is a key of its own."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
