"""What is installed and where we run: the second input of the plan (the first is the config).

Rules compare these versions against the versions that fixed an upstream bug; `check --versions` (a later issue)
evaluates against versions given on the command line instead of the installed ones.
"""

from __future__ import annotations

import importlib.metadata
import os
from dataclasses import dataclass, field

from packaging.version import InvalidVersion, Version

TRACKED_PACKAGES = ("torch", "transformers", "peft", "deepspeed", "bitsandbytes", "accelerate")


def installed_version(package: str) -> Version | None:
    try:
        raw = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None
    try:
        return Version(raw.split("+")[0])  # "2.13.0+cpu" -> 2.13.0
    except InvalidVersion:
        return None


@dataclass(frozen=True)
class Environment:
    versions: dict[str, Version | None] = field(default_factory=dict)
    device: str = "cpu"
    world_size: int = 1

    def version(self, package: str) -> Version | None:
        return self.versions.get(package)

    def describe(self) -> str:
        shown = ", ".join(f"{k} {v}" for k, v in self.versions.items() if v is not None)
        return f"{self.device}, world size {self.world_size}; {shown}"


def detect_environment() -> Environment:
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    return Environment(versions={p: installed_version(p) for p in TRACKED_PACKAGES}, device=device,
                       world_size=world_size)
