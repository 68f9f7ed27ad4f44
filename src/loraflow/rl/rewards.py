"""Reward functions for the RL stages, as users write them (docs/rl-rewards.md).

rl.rewards (and rl.eval_rewards) name each function in one of three forms; their rewards are summed:
  builtin:NAME              a function of this module (the demo's task)
  path/to/file.py:function  a Python file; a relative path is read from the working directory, as every path in the
                            config is (locations.reward_file says why)
  module:function           an importable module; the working directory is put first on sys.path, as `python -m`
                            does, because the `loraflow` console script's sys.path[0] is its bin directory and a
                            myrewards.py beside the user would otherwise not be found

How a function is called depends on its signature (`bind`, which also words the reason):
  a parameter named `fields`   loraflow's form: fn(completions: list[str], fields: list[dict]), each record's
                               fields other than its prompt
  otherwise                    TRL GRPOTrainer's form: fn(prompts=, completions=, completion_ids=, **columns), each a
                               list with one entry per completion; a chat prompt comes as its messages and its
                               completion as [{"role": "assistant", "content": text}], as TRL passes them. A function
                               without **kwargs gets only the arguments it names.
Either returns one float per completion; None counts 0 (TRL sums rewards with nansum, so None adds nothing).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import math
import os
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from loraflow.errors import ConfigError, LoraflowError
from loraflow.locations import reward_file, reward_function_location

TRL_ARGUMENTS = ("prompts", "completions", "completion_ids")
"""What loraflow passes a TRL-style function besides the prompt records' fields. TRL 1.x also passes trainer_state,
log_extra and log_metric (objects of its Trainer); loraflow has no equivalent and passes none of them."""
FIX_SIGNATURE = ("loraflow calls a reward function as fn(completions, fields) when it has a parameter named "
                 "`fields`, otherwise TRL's way: fn(prompts=..., completions=..., completion_ids=..., **columns)")


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


@dataclass(frozen=True)
class RewardInputs:
    """One rollout's completions, as every reward function form reads them."""
    texts: list[str]
    """Each completion decoded by the policy's tokenizer, up to its stop token, stripped."""
    fields: list[dict[str, Any]]
    """Each completion's prompt record without its prompt (e.g. the demo's `answer`)."""
    prompts: list[Any]
    """Each completion's prompt as the record holds it: a string, or a list of chat messages."""
    completion_ids: list[list[int]]
    """Each completion's token ids (the policy's tokenizer) up to and including its stop token."""


@dataclass(frozen=True)
class RewardFunction:
    name: str
    """Its name in the metrics (reward/NAME, gold/NAME)."""
    entry: str
    """The rl.rewards entry as written, for errors."""
    key: str
    fn: Callable
    trl_style: bool
    accepts: frozenset[str] | None
    """TRL style: the keyword arguments it names; None when it takes **kwargs (it gets them all)."""

    def __call__(self, inputs: RewardInputs) -> list[float]:
        try:
            values = self.fn(**self._keywords(inputs)) if self.trl_style else self.fn(inputs.texts, inputs.fields)
        except Exception as exc:  # the user's line and the entry, not a traceback through the trainer
            code = getattr(self.fn, "__code__", None)
            hint = (" With chat prompts a TRL-style function gets each completion as [{'role': 'assistant', "
                    "'content': text}], as TRL passes it: read completion[0]['content']."
                    if self.trl_style and any(isinstance(p, list) for p in inputs.prompts) else "")
            raise LoraflowError(f"{self.key}: {self.entry} raised {_user_line(exc, code and Path(code.co_filename))}."
                                f"{hint}") from exc
        return self._checked(values, len(inputs.texts))

    def _keywords(self, inputs: RewardInputs) -> dict[str, Any]:
        chat = [isinstance(p, list) for p in inputs.prompts]
        out: dict[str, Any] = {
            "prompts": list(inputs.prompts),
            "completions": [[{"role": "assistant", "content": t}] if c else t for t, c in zip(inputs.texts, chat)],
            "completion_ids": [list(ids) for ids in inputs.completion_ids]}
        for column in sorted({k for f in inputs.fields for k in f} - set(out)):
            out[column] = [f.get(column) for f in inputs.fields]
        return out if self.accepts is None else {k: v for k, v in out.items() if k in self.accepts}

    def _checked(self, values: Any, count: int) -> list[float]:
        values = values.tolist() if hasattr(values, "tolist") else values
        if not isinstance(values, (list, tuple)) or len(values) != count:
            got = f"{len(values)} values" if isinstance(values, (list, tuple)) else f"a {type(values).__name__}"
            raise LoraflowError(f"{self.key}: {self.entry} returned {got} for {count} completions; a reward function "
                                "returns a list with one float per completion (None counts 0).")
        out = []
        for i, v in enumerate(values):
            if v is None:
                out.append(0.0)
                continue
            try:
                out.append(float(v))
            except (TypeError, ValueError):
                out.append(math.nan)
            if not math.isfinite(out[-1]):  # NaN would reach the loss and stop the run as a divergence, far from here
                raise LoraflowError(f"{self.key}: {self.entry} returned {v!r} for completion {i}; each reward must "
                                    "be a finite number, or None for no reward (it counts 0).")
        return out


class _Refused(Exception):
    """One entry's problem, collected by load_reward_functions and raised once."""


def load_reward_functions(entries: list[str], key: str = "rl.rewards",
                          columns: set[str] | frozenset[str] = frozenset()) -> list[RewardFunction]:
    """rl.rewards -> the functions, or one ConfigError naming every entry that cannot be used. `columns`: the
    prompt records' fields, which a TRL-style function may name as arguments."""
    out, problems, names = [], [], set()
    for entry in entries:
        try:
            name, fn = resolve_entry(entry, key)
            reward = bind(entry, key, name if name not in names else entry, fn, columns)
        except _Refused as exc:
            problems.append(str(exc))
            continue
        names.add(reward.name)
        out.append(reward)
    if problems:
        raise ConfigError(problems)
    return out


def resolve_entry(entry: str, key: str) -> tuple[str, Any]:
    """(metrics name, the object the entry names), importing its file or module."""
    form, target, attr = reward_function_location(entry)
    if form == "builtin":
        if attr not in BUILTIN:
            raise _Refused(f"{key}: {entry} is not a built-in reward; built-ins are "
                           f"{', '.join('builtin:' + b for b in BUILTIN)}.")
        return attr, BUILTIN[attr]
    if not target or not attr:
        raise _Refused(f"{key}: {entry!r} names no function; write path/to/file.py:function, module:function or "
                       "builtin:NAME.")
    module, where = _import_file(entry, key, target) if form == "file" else _import_module(entry, key, target)
    if not hasattr(module, attr):
        defined = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                         and getattr(v, "__module__", None) == module.__name__)
        raise _Refused(f"{key}: {entry}: {where} defines no `{attr}`. Functions it defines: "
                       f"{', '.join(defined) or 'none'}. Fix the name after the colon.")
    return attr, getattr(module, attr)


def _import_file(entry: str, key: str, target: str):
    path = reward_file(target).resolve()
    if not path.is_file():
        raise _Refused(f"{key}: {entry}: no file {path} (tried relative to the working directory {Path.cwd()}, "
                       "where loraflow reads every relative path of the config). Give the file's path from the "
                       "directory you run loraflow in, or an absolute path.")
    # A name of its own per file (two rewards.py in different folders stay apart), registered in sys.modules so
    # dataclasses and pickling inside the file work; the file's folder goes on sys.path so that it can import its
    # neighbours, as it could when run as a script.
    name = f"loraflow_rewards_{path.stem}_{hashlib.blake2b(str(path).encode(), digest_size=4).hexdigest()}"
    if name in sys.modules:
        return sys.modules[name], path.name
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise _Refused(f"{key}: {entry}: importing {path} failed: {_user_line(exc, path)}. Fix the file (`python "
                       f"{path}` shows the whole traceback).") from None
    return module, path.name


def _import_module(entry: str, key: str, target: str):
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        spec = importlib.util.find_spec(target)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        raise _Refused(f"{key}: {entry}: no module {target} in the working directory {cwd} nor among the installed "
                       f"packages. Put {target.replace('.', '/')}.py in the directory you run loraflow in, or name the "
                       f"file: {key}: [path/to/{target.split('.')[-1]}.py:{entry.rpartition(':')[2]}].")
    try:
        return importlib.import_module(target), spec.origin or target
    except Exception as exc:
        origin = Path(spec.origin) if spec.origin else None
        raise _Refused(f"{key}: {entry}: importing {target} ({spec.origin}) failed: {_user_line(exc, origin)}. "
                       f"Fix the module (`python -c 'import {target}'` shows the whole traceback).") from None


def _user_line(exc: Exception, path: Path | None) -> str:
    """The error and the line of the user's file that raised it (the deepest frame in that file; the deepest frame
    outside importlib when the file is unknown), as `file, line N: code -> Type: message`."""
    what = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}, line {exc.lineno}: {(exc.text or '').strip()} -> {what}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "importlib" not in f.filename]
    mine = [f for f in frames if path is not None and Path(f.filename) == path] or frames
    if not mine:
        return what
    f = mine[-1]
    return f"{f.filename}, line {f.lineno}: {(f.line or '').strip()} -> {what}"


def bind(entry: str, key: str, name: str, fn: Any, columns: set[str] | frozenset[str]) -> RewardFunction:
    """How the function is called, read from its signature; wrong signatures are refused here, before step one."""
    if not callable(fn):
        raise _Refused(f"{key}: {entry}: `{name}` is of type {type(fn).__name__}, not a function. Point the entry at a "
                       "function that returns one float per completion.")
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None)):
        raise _Refused(f"{key}: {entry}: `{name}` is an async function; loraflow calls reward functions "
                       "synchronously (TRL's async rewards are not supported). Make it a plain def, running its "
                       "coroutine with asyncio.run inside.")
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        raise _Refused(f"{key}: {entry}: the signature of `{name}` cannot be read, so loraflow cannot tell how to "
                       "call it. Wrap it in a Python function def f(completions, **kwargs).") from None
    shown = f"`{name}{inspect.signature(fn)}`"
    kinds = inspect.Parameter
    if "fields" in params:  # loraflow's form
        try:
            inspect.signature(fn).bind([], [])
        except TypeError as exc:
            raise _Refused(f"{key}: {entry}: {shown} has a `fields` parameter, so it is called as fn(completions, "
                           f"fields), which it does not accept ({exc}). Make those its first two parameters.") from None
        return RewardFunction(name, entry, key, fn, False, None)
    takes_all = any(p.kind is kinds.VAR_KEYWORD for p in params.values())
    if "completions" not in params and not takes_all:
        raise _Refused(f"{key}: {entry}: {shown} takes neither `completions` nor **kwargs. {FIX_SIGNATURE}.")
    given = set(TRL_ARGUMENTS) | set(columns)
    positional = [n for n, p in params.items() if p.kind is kinds.POSITIONAL_ONLY and p.default is p.empty]
    missing = [n for n, p in params.items() if p.default is p.empty and n not in given
               and p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)]
    if positional or missing:
        fields = ", ".join(sorted(columns)) or "none"
        raise _Refused(f"{key}: {entry}: {shown} requires {', '.join(positional + missing)}, which loraflow does "
                       f"not pass: it passes {', '.join(TRL_ARGUMENTS)} and the prompt records' fields ({fields}) "
                       "by keyword. Give those parameters defaults, or add the fields to every prompt record.")
    accepts = None if takes_all else frozenset(n for n in params if n in given)
    return RewardFunction(name, entry, key, fn, True, accepts)
