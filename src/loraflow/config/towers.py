"""The `towers` section: what trains in each part of a vision-language model.

An image-text model has three towers: the vision encoder, the projector that maps image features into the
language model's embedding space, and the language model (with its embeddings and output head). Each is frozen,
trained in full, or adapted; the vision encoder also chooses its own checkpointing. A text-only model has only the
language tower, and the section must stay at its defaults there (plan/towers.py checks both).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from loraflow.families import TOWER_NAMES

TowerTrain = Literal["auto", "frozen", "full", "adapter"]


@dataclass(kw_only=True)
class TowerConfig:
    train: TowerTrain = "auto"
    """`frozen`, `full` (every weight of the tower trains and is saved with the adapter, as PEFT's
    modules_to_save), or `adapter` (adapter.method's LoRA/DoRA on the tower's linear layers). `auto`: the language
    model follows adapter.method (adapted, or full for adapter.method=full); the vision encoder and projector stay
    frozen, except under adapter.method=full, where everything trains."""

    rank: int | None = None
    """This tower's adapter rank; empty means adapter.rank."""

    alpha: float | None = None
    """This tower's adapter alpha; empty means adapter.alpha."""

    target_modules: list[str] | None = None
    """The tower's modules that get adapters (name suffixes, or `all-linear`: every linear layer of the tower but
    the output head); empty means adapter.target_modules, matched inside this tower only."""

    checkpointing: Literal["auto", "true", "false"] = "auto"
    """Vision encoder only: recompute its layers in backward. `auto` follows checkpointing.enabled, as
    transformers' own checkpointing covers every tower's layers. The language model's layers follow the
    checkpointing section; the projector has no layers to checkpoint."""


@dataclass(kw_only=True)
class TowersConfig:
    vision: TowerConfig = field(default_factory=TowerConfig)
    """The vision encoder (LLaVA's and Gemma3's vision_tower, Qwen2-VL's visual, Idefics3's vision_model)."""

    projector: TowerConfig = field(default_factory=TowerConfig)
    """The projector (multi_modal_projector, connector, Qwen2-VL's visual.merger)."""

    language: TowerConfig = field(default_factory=TowerConfig)
    """The language model with its embeddings and output head."""

    def changed(self) -> list[str]:
        """Keys set away from their defaults, as `towers.vision.train` (a text-only model accepts none)."""
        default = TowerConfig()
        return [f"towers.{name}.{key}" for name in TOWER_NAMES for key in vars(default)
                if getattr(getattr(self, name), key) != getattr(default, key)]

    def train_of(self, name: str, adapter_method: str) -> str:
        """frozen, full or adapter: the tower's choice with `auto` settled (see TowerConfig.train)."""
        asked = getattr(self, name).train
        if asked != "auto":
            return asked
        if adapter_method == "full":
            return "full"
        return "adapter" if name == "language" else "frozen"

    def problems(self, adapter_method: str = "lora") -> list[str]:
        out: list[str] = []
        for name in TOWER_NAMES:
            train = self.train_of(name, adapter_method)
            if adapter_method == "full" and train == "adapter":
                out.append(f"towers.{name}.train=adapter, but adapter.method=full trains weights in full; set "
                           "adapter.method=lora (or dora) to adapt a tower.")
            if adapter_method == "full" and name == "language" and train != "full":
                out.append(f"towers.language.train={train} with adapter.method=full: full fine-tuning is of the "
                           "language model; set adapter.method=lora and towers.vision.train / towers.projector.train "
                           "to train the other towers on their own.")
            if adapter_method != "full" and name == "language" and train == "full":
                out.append("towers.language.train=full: to train the language model in full set adapter.method=full "
                           "(the vision encoder and projector then choose frozen or full).")
        for name in TOWER_NAMES:
            t = getattr(self, name)
            for key in ("rank", "alpha"):
                value = getattr(t, key)
                if value is not None and not value > 0:
                    out.append(f"towers.{name}.{key}={value} must be > 0.")
            if t.target_modules is not None and not t.target_modules:
                out.append(f"towers.{name}.target_modules is empty; name modules, use all-linear, or remove it.")
            adapter_keys = [k for k in ("rank", "alpha", "target_modules") if getattr(t, k) is not None]
            if adapter_keys and t.train in ("frozen", "full"):
                out.append(f"towers.{name}.{adapter_keys[0]} is for an adapted tower, but towers.{name}.train="
                           f"{t.train}; set towers.{name}.train=adapter or remove towers.{name}.{adapter_keys[0]}.")
            if name != "vision" and t.checkpointing != "auto":
                owner = "the checkpointing section" if name == "language" else "nothing: it has no layers"
                out.append(f"towers.{name}.checkpointing: the {name} tower's recompute is set by {owner}; remove "
                           f"towers.{name}.checkpointing.")
        return out
