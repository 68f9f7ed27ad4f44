"""Where a model, tokenizer, data file or adapter named in the config or on the command line lives: a packaged
`builtin:` asset, an existing local path, or a hub id.

It sits on the ground floor (it imports only loraflow.errors), because both data/ (data files) and setup/ (models,
tokenizers, adapters) read it and data/ must not import setup/. Not to be confused with frontends.argv's
`resolve_path`, which finds a file another framework's command line names, relative to its launch directory.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from loraflow.errors import ConfigError

ASSETS = Path(__file__).resolve().parent / "assets"
BUILTIN = "builtin:"

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
LOCAL_SUFFIXES = (".json", ".jsonl", ".parquet", ".yaml", ".yml", ".safetensors")


def location_of(spec: str, key: str) -> str:
    """Where the value `spec` of the config key (or flag) `key` points: `builtin:NAME` -> the packaged asset; a
    local path must exist; anything else is tried as a hub id. An error names `key`."""
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
