"""Where a model, tokenizer, data file or adapter named in the config lives (`builtin:` assets, local paths, hub
ids), and a context that keeps transformers and PEFT quiet while loraflow builds throwaway models."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
from pathlib import Path

from loraflow.errors import ConfigError

ASSETS = Path(__file__).resolve().parent.parent / "assets"
BUILTIN = "builtin:"

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
LOCAL_SUFFIXES = (".json", ".jsonl", ".parquet", ".yaml", ".yml", ".safetensors")


def resolve_path(spec: str, key: str) -> str:
    """`builtin:NAME` -> the packaged asset; a local path must exist; anything else is tried as a hub id."""
    if not spec.strip():  # not "the current directory", which exists
        raise ConfigError([f"{key} is not set. Name a local path or a hub id (`loraflow train STAGE` with no config "
                           "and no model.path trains the built-in demo instead)."])
    if spec.startswith(BUILTIN):
        path = ASSETS / spec[len(BUILTIN):]
        if not path.exists():
            shipped = sorted(p.name for p in ASSETS.iterdir() if not p.name.startswith((".", "_")))
            raise ConfigError([f"{key}={spec}: no such built-in asset. Shipped: {', '.join(shipped)}."])
        return str(path)
    expanded = os.path.expanduser(spec)
    if Path(expanded).exists():
        return expanded
    if HUB_ID.match(spec) and Path(spec).suffix not in LOCAL_SUFFIXES:
        return spec  # tried on the hub; a failure there is reported by the loader with this key
    raise ConfigError([f"{key}={spec} does not exist. Give an existing local path, a hub id such as org/name, "
                       "or a builtin: asset."])


@contextlib.contextmanager
def quiet():
    """Silence transformers/PEFT chatter while building throwaway skeletons."""
    loggers = [logging.getLogger(n) for n in ("transformers", "peft")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                yield
    finally:
        for lg, lv in zip(loggers, levels):
            lg.setLevel(lv)
