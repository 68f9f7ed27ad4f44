"""Tiny decoder models of the families transformers ships, built from their configs for the composition sweep
(loraflow/verify/sweep_space.py), each saved with the bundled tiny-base tokenizer so every stage's bundled data
fits it. Nothing is downloaded: the weights are random, which is all a composition check needs (it judges that a
setup trains and stays consistent, not what it learns).

Each family's config is transformers' own default for its model_type with the sizes below laid over it; the keys
a family names differently (the expert counts of a mixture-of-experts model) are in FAMILY_SIZES."""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import shutil
from pathlib import Path
from typing import Any

from loraflow import families
from loraflow.locations import ASSETS
from loraflow.verify import sweep_vision

COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=256, pad_token_id=0, bos_token_id=1,
              eos_token_id=2, tie_word_embeddings=False)
"""Two layers (checkpointing every other layer still leaves one checkpointed), grouped-query attention (2 key/value
heads for 4 query heads: the layout most current families ship)."""

FAMILY_SIZES: dict[str, dict[str, Any]] = {
    "llama": {},
    "mistral": {"sliding_window": None},
    "qwen2": {},
    "qwen3": {},
    "gemma": {"tie_word_embeddings": True},  # tied, as Gemma's checkpoints are (and small Llama and Qwen ones)
    "gemma2": {"sliding_window": 64, "final_logit_softcapping": 30.0},  # a family whose logits are transformed
    "phi3": {},
    "olmo2": {},
    "granite": {"logits_scaling": 2.0},
    "qwen2_moe": {"moe_intermediate_size": 32, "shared_expert_intermediate_size": 64, "num_experts": 4,
                  "num_experts_per_tok": 2, "decoder_sparse_step": 1},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
}
"""model_type -> the keys beyond COMMON its tiny config needs."""

TEXT_FAMILIES = tuple(FAMILY_SIZES)
EXPERT_FAMILIES = ("qwen2_moe", "mixtral")
"""Mixtures of experts: their fused expert weights are an adapter target of their own (`experts`)."""
FAMILIES = TEXT_FAMILIES + sweep_vision.FAMILIES
"""Text families, then the image-text ones (built with their processors by sweep_vision)."""


def image_text(family: str) -> bool:
    return family in sweep_vision.FAMILIES


def linear_names(family: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(attention, MLP) linear layer names of the family's decoder layers (families.Family.linears)."""
    return families.family(family).linears


def cache_root() -> Path:
    return Path(os.environ.get("LORAFLOW_CACHE", Path.home() / ".cache" / "loraflow")) / "sweep-models"


def model_dir(family: str, root: Path | None = None) -> Path:
    """The family's tiny model, built on first use (keyed by family, sizes and transformers version, so a new
    transformers release builds afresh)."""
    import transformers

    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; the sweep's families are {', '.join(FAMILIES)}")
    # An image-text family's builder is code, not sizes: the builders' source is the key.
    sizes = FAMILY_SIZES[family] if family in FAMILY_SIZES else inspect.getsource(sweep_vision)
    key = hashlib.sha256(json.dumps([family, COMMON, sizes, transformers.__version__],
                                    sort_keys=True).encode()).hexdigest()[:10]
    out = (root or cache_root()) / f"{family}-{key}"
    if not (out / "config.json").is_file():
        _build(family, out)
    return out


def _build(family: str, out: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tmp = out.with_name(out.name + f".part{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    if image_text(family):
        sweep_vision.build_image_text(tmp, family)
    else:
        tokenizer = AutoTokenizer.from_pretrained(ASSETS / "tiny-base")
        config = AutoConfig.for_model(family, **{**COMMON, **FAMILY_SIZES[family], "vocab_size": len(tokenizer)})
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    generation = ASSETS / "tiny-base" / "generation_config.json"
    shutil.copy(generation, tmp / "generation_config.json")
    try:
        os.replace(tmp, out)  # another process may have built it meanwhile: theirs is as good
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
