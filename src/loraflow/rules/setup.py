"""The normalized setup: the one description of a training run that every rule reads.

loraflow's own config maps onto it (plan.py), and so will other frameworks' command lines and configs (the
frontends of `loraflow check`, a later issue). A rule never looks at a framework's config directly.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from packaging.version import Version

CheckpointPlacement = Literal["off", "all", "partial"]


@dataclass(frozen=True)
class Setup:
    stage: str = "sft"
    adapter: Literal["lora", "dora", "full"] = "lora"
    matched_modules: int | None = None
    """Modules the adapter targets matched in this model (None: not known, e.g. the model could not be read)."""
    embeddings_trainable: bool = False
    lm_head_trainable: bool = False
    tied_embeddings: bool = False
    weight_tying_enforced: bool = False
    """PEFT's ensure_weight_tying: trained copies of tied embeddings stay tied on save and reload."""
    checkpointing: CheckpointPlacement = "off"
    checkpoint_every_n: int = 1
    reentrant: bool | None = None
    """torch use_reentrant; None until the plan chooses."""
    checkpoint_impl: Literal["transformers", "torch-wrapper"] = "transformers"
    input_grad_hook: bool = False
    """A forward hook that marks the embedding output as requiring grad."""
    use_cache: bool = True
    packing: bool = False
    precision: str = "fp32"
    quantization: str | None = None
    engine: str = "single"
    zero_stage: int = 0
    offload: bool = False
    world_size: int = 1
    forwards_per_step: int = 1
    versions: dict[str, Version | None] = field(default_factory=dict, hash=False, compare=False)

    @property
    def frozen_params(self) -> bool:
        """Whether any base weight is frozen (every adapter setup; not full fine-tuning)."""
        return self.adapter != "full"

    @property
    def embedding_output_requires_grad(self) -> bool:
        return self.embeddings_trainable or self.input_grad_hook or self.adapter == "full"

    def version(self, package: str) -> Version | None:
        return self.versions.get(package)

    def replace(self, **changes) -> "Setup":
        return dataclasses.replace(self, **changes)
