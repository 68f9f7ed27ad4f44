"""Where a model, tokenizer, data file or adapter named in the config or on the command line lives: a packaged
`builtin:` asset, an existing local path, or a hub id; and where a reward named in rl.rewards or rl.reward_model
lives, and which kind it is.

It sits on the ground floor (it imports only loraflow.errors), because both data/ (data files) and setup/ (models,
tokenizers, adapters) read it and data/ must not import setup/; plan/ words the rewards' decisions from it and rl/
loads them, and neither may import the other. Not to be confused with frontends.argv's
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


# -- rewards (rl.rewards, rl.reward_model) -------------------------------------------------------------------------

REWARD_MODEL_MANIFEST = "reward_model.json"
"""What `loraflow train rm` writes beside the reward model's weights (its base, method, merges, quantization)."""


def reward_model_location(spec: str, key: str = "rl.reward_model") -> tuple[str, str]:
    """(kind, location) of a reward model: `loraflow` for a `loraflow train rm` output (its manifest is there),
    `huggingface` for a sequence-classification model directory or a hub id. Nothing is loaded."""
    location = location_of(spec, key)
    path = Path(location)
    if (path / REWARD_MODEL_MANIFEST).is_file():
        return "loraflow", location
    if path.exists() and not (path / "config.json").is_file():
        raise ConfigError([f"{key}={spec}: {path} holds neither {REWARD_MODEL_MANIFEST} (the `adapter` or `model` "
                           "directory of a `loraflow train rm` run) nor config.json (a Hugging Face sequence-"
                           f"classification model). Point {key} at one of those."])
    return "huggingface", location  # a directory, or a hub id (from_pretrained reads it)


def reward_function_location(entry: str) -> tuple[str, str, str]:
    """(form, target, function) of an rl.rewards entry: `builtin` (target empty), `file` (target a path: it ends in
    .py or has a slash) or `module` (target a dotted module name)."""
    if entry.startswith(BUILTIN):
        return "builtin", "", entry[len(BUILTIN):]
    target, _, function = entry.rpartition(":")  # the last colon: a Windows path has one of its own
    is_file = target.endswith(".py") or "/" in target or os.sep in target
    return ("file" if is_file else "module"), target, function


def reward_file(target: str) -> Path:
    """A file entry's path: a relative one is read from the working directory, as every path in the config is (a
    resumed run reads its config from the run directory, where a path relative to the config would point
    elsewhere)."""
    path = Path(os.path.expanduser(target))
    return path if path.is_absolute() else Path.cwd() / path
