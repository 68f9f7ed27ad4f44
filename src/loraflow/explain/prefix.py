"""What launchers and tools put before each line of a process's output, and how to take it off. On its own so that
both the log reader (logread) and the reader of loraflow's own log lines (own) use it without importing each other."""

from __future__ import annotations

import re

# What launchers and tools put before each line of a process's output: `[rank0]: `, `[default0]:`, Ray's
# `(WorkerDict pid=81325, ip=10.0.0.1) `, pytest's `E   `, `rank0: `, a timestamp.
_PREFIX = re.compile(r"^(?:\s*(?:\[[^\]]{0,60}\]:?|\([A-Za-z]\w* pid=[^)]{0,80}\)|E {2,}|rank\d+:|"
                     r"\d{4}-\d\d-\d\d[ T][\d:,.]+(?:\s*-)?)\s?)+")


def strip_prefix(line: str) -> str:
    return _PREFIX.sub("", line, count=1)
