"""Verifiable rewards for the RL stages.

A reward function is `fn(completions: list[str], fields: list[dict]) -> list[float]`: one float per completion,
given each prompt record's other fields (for the demo task, its `answer`). rl.rewards names them as
`builtin:NAME` (functions here) or `package.module:function` (any importable module); their rewards are summed.
"""

from __future__ import annotations

import importlib
from typing import Callable

from loraflow.errors import ConfigError

RewardFn = Callable[[list[str], list[dict]], list[float]]


def reverse_exact(completions: list[str], fields: list[dict]) -> list[float]:
    """1 when the completion is exactly the prompt's `answer`, else 0."""
    return [float(c.strip() == str(f["answer"]).strip()) for c, f in zip(completions, fields)]


def reverse_partial(completions: list[str], fields: list[dict]) -> list[float]:
    """1 for the exact answer; otherwise half the fraction of positions that match. A small policy rarely gets
    everything right at first, and a group whose completions all score 0 has no advantage to learn from (GRPO
    normalises within the group); partial credit gives near misses a gradient towards the answer."""
    out = []
    for c, f in zip(completions, fields):
        c, a = c.strip(), str(f["answer"]).strip()
        if c == a:
            out.append(1.0)
            continue
        same = sum(x == y for x, y in zip(c, a))
        out.append(0.5 * same / max(len(a), len(c), 1))
    return out


BUILTIN = {"reverse_exact": reverse_exact, "reverse_partial": reverse_partial}


def load_reward_functions(names: list[str]) -> list[tuple[str, RewardFn]]:
    """rl.rewards -> [(short name, function)], or a ConfigError naming the entry."""
    out, problems = [], []
    for name in names:
        if name.startswith("builtin:"):
            short = name[len("builtin:"):]
            if short not in BUILTIN:
                problems.append(f"rl.rewards: {name} is not a built-in reward; built-ins are "
                                f"{', '.join('builtin:' + b for b in BUILTIN)}.")
                continue
            out.append((short, BUILTIN[short]))
            continue
        module_name, _, attr = name.partition(":")
        if not module_name or not attr:
            problems.append(f"rl.rewards: {name!r} must be builtin:NAME or package.module:function.")
            continue
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            problems.append(f"rl.rewards: cannot import {module_name} for {name} ({exc}); is it on PYTHONPATH?")
            continue
        fn = getattr(module, attr, None)
        if not callable(fn):
            problems.append(f"rl.rewards: {module_name} has no function {attr} (for {name}).")
            continue
        out.append((attr, fn))
    if problems:
        raise ConfigError(problems)
    return out
