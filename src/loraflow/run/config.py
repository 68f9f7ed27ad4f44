"""Which config file a new run starts from: the user's, or the stage's built-in demo when the user names neither a
config nor a model. `train` and `check` read a new run's config through `load_run_config`, so both see the same."""

from __future__ import annotations

from pathlib import Path

from loraflow.config import Config, load_config


def demo_config(stage: str) -> Path:
    """The stage's built-in demo config, shipped with the package."""
    from loraflow.locations import ASSETS

    return ASSETS / "configs" / f"{stage}.yaml"


def starting_config(stage: str, config_path: str | None, overrides: list[str]) -> str | None:
    """The file a new run's config is read from: the user's, or the stage's built-in demo when the user gives
    neither a config nor a model. A user's own model starts from the neutral defaults, so nothing of the demo (its
    data, its eval set, the adapters RL demos merge into the tiny base) leaks into a run on other weights."""
    if config_path is not None:
        return config_path
    if any(o.split("=", 1)[0].strip() == "model.path" for o in overrides):
        return None
    return str(demo_config(stage))


def load_run_config(stage: str, config_path: str | None, overrides: list[str]) -> Config:
    """A new run's config as `train` and `check` read it (see `starting_config`)."""
    return load_config(starting_config(stage, config_path, overrides), [f"stage={stage}", *overrides])
