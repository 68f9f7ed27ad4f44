"""Load a Config from YAML plus `key.sub=value` overrides.

Every problem (unknown key, wrong type, value outside a Literal, cross-field conflict) is collected and raised
once as a ConfigError, each message naming the key and, for typos, the closest valid key.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml

from loraflow.config.schema import Config
from loraflow.errors import ConfigError


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _closest(name: str, options: list[str], prefix: str) -> str:
    match = difflib.get_close_matches(name, options, n=1, cutoff=0.5)
    if match:
        return f" Did you mean `{prefix}{match[0]}`?"
    return f" Valid keys here: {', '.join(prefix + o for o in sorted(options))}."


def _describe(tp: Any) -> str:
    if get_origin(tp) is Literal:
        return " | ".join(str(a) for a in get_args(tp))
    if get_origin(tp) in (Union, types.UnionType):
        return " or ".join("empty" if a is type(None) else _describe(a) for a in get_args(tp))
    if get_origin(tp) is list:
        return f"list of {_describe(get_args(tp)[0])}"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str, errors: list[str]) -> Any:
    """Convert a YAML value to the annotated type, appending a message to `errors` on failure."""
    origin = get_origin(tp)
    if origin is Literal:
        choices = get_args(tp)
        # YAML reads `true`/`false` as booleans; Literal["true", "false"] wants the strings.
        if isinstance(value, bool) and str(value).lower() in choices:
            return str(value).lower()
        if value in choices:
            return value
        hint = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
        suggestion = f" Did you mean `{hint[0]}`?" if hint else ""
        errors.append(f"{key}={value!r} is not one of: {', '.join(map(str, choices))}.{suggestion}")
        return None
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:  # first type that accepts the value without complaint
            trial: list[str] = []
            out = _coerce(value, arg, key, trial)
            if not trial:
                return out
        errors.append(f"{key}={value!r} must be {_describe(tp)}.")
        return None
    if origin is list:
        if isinstance(value, str):  # `k=a,b` on the command line
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list):
            errors.append(f"{key}={value!r} must be a list ({_describe(tp)}).")
            return None
        (item_tp,) = get_args(tp)
        return [_coerce(v, item_tp, f"{key}[{i}]", errors) for i, v in enumerate(value)]
    if tp is type(None):  # pragma: no cover - only reached through Optional, handled above
        if value is not None:
            errors.append(f"{key}={value!r} must be empty.")
        return None
    if tp is bool:
        if isinstance(value, bool):
            return value
        errors.append(f"{key}={value!r} must be true or false.")
        return None
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        errors.append(f"{key}={value!r} must be an integer.")
        return None
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # PyYAML reads 2e-4 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        errors.append(f"{key}={value!r} must be a number.")
        return None
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        hint = " (YAML reads yes/no/on/off as booleans: quote the value)" if isinstance(value, bool) else ""
        errors.append(f"{key}={value!r} must be a string{hint}.")
        return None
    raise TypeError(f"unsupported config annotation {tp!r} at {key}")


def _build(cls: type, data: Any, prefix: str, errors: list[str]) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        errors.append(f"{prefix or 'the config'} must be a mapping of keys, got {type(data).__name__}.")
        return cls()
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        full = f"{prefix}{key}"
        if key not in names:
            errors.append(f"unknown key `{full}`.{_closest(str(key), names, prefix)}")
            continue
        tp = hints[key]
        if _is_dataclass_type(tp):
            kwargs[key] = _build(tp, value, f"{full}.", errors)
        else:
            kwargs[key] = _coerce(value, tp, full, errors)
    try:
        return cls(**{k: v for k, v in kwargs.items() if v is not None or _optional(hints[k])})
    except TypeError as exc:  # pragma: no cover - all fields have defaults
        errors.append(f"{prefix}: {exc}")
        return cls()


def _optional(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType) and type(None) in get_args(tp)


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """Turn ["train.max_steps=10", "adapter.target_modules=[q_proj,v_proj]"] into a nested dict."""
    tree: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError([f"override `{item}` is not of the form key.sub=value (for example train.max_steps=100)."])
        key, raw = item.split("=", 1)
        value = yaml.safe_load(raw) if raw.strip() else None
        node = tree
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError([f"override `{item}` sets a key below `{part}`, which is not a section."])
        node[parts[-1]] = value
    return tree


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError([f"config file {path} does not exist."])
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError([f"{path} is not valid YAML: {exc}"]) from None
    if not isinstance(data, dict):
        raise ConfigError([f"{path} must hold a mapping of sections (model:, adapter:, ...), got {type(data).__name__}."])
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                base: dict[str, Any] | None = None) -> Config:
    """Build a validated Config from (optionally) a base dict, a YAML file and command-line overrides."""
    data = dict(base or {})
    if path is not None:
        data = _merge(data, read_yaml(path))
    if overrides:
        data = _merge(data, parse_overrides(overrides))
    errors: list[str] = []
    config = _build(Config, data, "", errors)
    # Range checks run on the partly built config too (bad fields keep their defaults), so one run reports all.
    errors.extend(config.problems())
    if errors:
        raise ConfigError(errors, source=str(path) if path else None)
    return config


def config_to_dict(config: Config) -> dict[str, Any]:
    return dataclasses.asdict(config)


def dump_config(config: Config) -> str:
    return yaml.safe_dump(config_to_dict(config), sort_keys=False)
