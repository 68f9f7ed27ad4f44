"""Axolotl's activation checkpointing: gradient_checkpointing through the HF Trainer, with the reentrancy Axolotl
writes into gradient_checkpointing_kwargs itself, or (activation_offloading: true) its own checkpoint_wrapper around
each decoder layer."""

from __future__ import annotations

from loraflow.frontends.common import Draft, accessors, as_bool, at_least, mapping_value
from loraflow.frontends.hf_checkpointing import _TRANSFORMERS_REENTRANT

CFG = "src/axolotl/utils/config/__init__.py"


def checkpointing(draft: Draft, cfg: dict) -> None:
    """gradient_checkpointing, and the reentrancy Axolotl writes into gradient_checkpointing_kwargs itself."""
    get, src, on = accessors(cfg)
    rl = get("rl")
    gc = get("gradient_checkpointing", False)
    offloading = get("activation_offloading")
    if str(offloading).lower() == "true":
        _offload_wrapper(draft, src("activation_offloading"))
        return
    if offloading == "hidden_states":
        gc = True
    if not gc or draft.get("checkpoint_impl") == "torch-wrapper":
        return
    draft.set("checkpointing", "all", src("gradient_checkpointing") if "gradient_checkpointing" in cfg
              else src("activation_offloading"))
    draft.set("checkpoint_impl", "transformers", "HF Trainer gradient_checkpointing (src/axolotl/core/builders/"
              "base.py)")
    kwargs = mapping_value(get("gradient_checkpointing_kwargs"), src("gradient_checkpointing_kwargs") if
                           "gradient_checkpointing_kwargs" in cfg else "gradient_checkpointing_kwargs")
    model_type = str(get("model_config_type") or get("base_model") or "")
    if "use_reentrant" in kwargs:
        draft.set("reentrant", as_bool(kwargs["use_reentrant"], "use_reentrant"),
                  src("gradient_checkpointing_kwargs"))
    elif "gemma4" in model_type.lower() or "gemma-4" in model_type.lower():
        draft.set("reentrant", False, f"Axolotl forces use_reentrant false for Gemma4 ({CFG})")
    elif (rl and at_least(draft, "axolotl", "0.5.0")) or offloading == "hidden_states":
        draft.set("reentrant", False, "default (Axolotl: use_reentrant false for rl (since v0.5.0), "
                  "src/axolotl/core/builders/base.py)")
    elif get("unfrozen_parameters"):
        draft.set("reentrant", *_unfrozen_reentrant(draft))
    else:
        draft.set("reentrant", True, f"default (Axolotl {CFG}: gradient_checkpointing_kwargs "
                  "{use_reentrant: true} when unset; transformers 4.x's reentrant default before v0.4.0)")
    if gc in ("offload", "offload_disk"):
        draft.note(f"gradient_checkpointing: {gc} offloads the checkpointed activations to CPU/disk")


def _offload_wrapper(draft: Draft, where: str) -> None:
    """`activation_offloading: true` (not legacy / disk / hidden_states): the builder turns the Trainer's
    gradient_checkpointing off ("don't use the HF gradient checkpointing, manually wrap", core/builders/base.py
    _configure_gradient_checkpointing) and the loader wraps every GradientCheckpointingLayer in torch's
    checkpoint_wrapper (loaders/model.py _apply_activation_checkpointing -> ac_wrap_hf_model, CheckpointImpl
    NO_REENTRANT by default), at load, so before FSDP2's fully_shard; TRL's offloader then moves what the wrapped
    layers save to CPU. Adapters and full fine-tuning alike: the layers are recomputed, not left unchecked."""
    why = f"{where} (Axolotl wraps each decoder layer in torch's checkpoint_wrapper, src/axolotl/loaders/model.py)"
    draft.set("checkpointing", "all", why)
    draft.set("checkpoint_impl", "torch-wrapper", why)
    draft.set("reentrant", False, f"{where} (checkpoint_wrapper's default CheckpointImpl.NO_REENTRANT)")
    if draft.get("engine") == "fsdp2":
        draft.set("checkpoint_outside_shard", False, f"{where} (wrapped at model load, before fully_shard)")
    draft.note(f"{where}: Axolotl's own checkpoint wrapper replaces the Trainer's gradient checkpointing, and TRL's "
               "offloader keeps what each layer saves on CPU (core/trainers/mixins/activation_checkpointing.py)")


def _unfrozen_reentrant(draft: Draft) -> tuple[bool, str]:
    """unfrozen_parameters leave gradient_checkpointing_kwargs unset (normalize_config fills it only without them).
    From v0.10.0 the shared builder turns unset into use_reentrant false (core/builders/base.py
    _configure_gradient_checkpointing); before it only the RL builder did, and the SFT builder
    (core/trainer_builder.py) passed nothing, so transformers' own default applied."""
    if at_least(draft, "axolotl", "0.10.0"):
        return False, ("default (Axolotl >= 0.10 with unfrozen_parameters: gradient_checkpointing_kwargs unset, "
                       "so src/axolotl/core/builders/base.py passes use_reentrant false)")
    reentrant, why = _TRANSFORMERS_REENTRANT(draft)
    return reentrant, (f"Axolotl < 0.10 with unfrozen_parameters passes no gradient_checkpointing_kwargs "
                       f"(src/axolotl/core/trainer_builder.py); {why}")
