"""The side environments the checks run beside the main one: `legacy` (the oldest DeepSpeed loraflow accepts,
scripts/setup_legacy_venv.sh) and `floor` (the oldest transformers and peft pyproject.toml declares,
scripts/setup_floor_venv.sh). scripts/test.sh builds both before pytest and exports their interpreters; the sweep
and the tests find them the same way."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
"""The source checkout (the setup scripts live in its scripts/)."""


def setup_script(name: str) -> Path:
    return ROOT / "scripts" / f"setup_{name}_venv.sh"


def side_python(name: str) -> Path:
    """$LORAFLOW_<NAME>_PYTHON, else where the setup script builds the environment (its --where answer: a cache
    directory keyed by what goes into it). It may not exist yet: callers say how to build it."""
    found = os.environ.get(f"LORAFLOW_{name.upper()}_PYTHON")
    if found:
        return Path(found)
    proc = subprocess.run(["bash", str(setup_script(name)), "--where"], capture_output=True, text=True, timeout=60,
                          check=True)
    return Path(proc.stdout.strip())
