"""ms-swift's activation checkpointing: on by default, with its own use_reentrant default per release (it patches
torch.utils.checkpoint, swift/trainers/mixin.py _fix_gradient_checkpointing), and DDP's find_unused_parameters
default that depends on it."""

from __future__ import annotations

import json

from loraflow.errors import LoraflowError
from loraflow.frontends.common import Draft, as_bool, at_least, mapping_value

ARGS = "swift/trainers/arguments.py"
"""Where ms-swift 3 declares its training arguments' defaults (cited by every default read from it)."""


def checkpointing(draft: Draft, opts: dict, accessors) -> None:
    """--gradient_checkpointing (on by default from v1.3), its reentrancy per release, and the input-grad hook
    ms-swift always adds with it. `accessors`: (get, src, on) over `opts`."""
    get, src, on = accessors
    if on("activation_cpu_offload"):
        # swift/plugin/activation_cpu_offload.py ActivationCpuOffloadCallBack.on_train_begin (veRL's offloader): FSDP
        # only, and with gradient checkpointing it calls gradient_checkpointing_disable() to checkpoint the FSDP
        # units itself; the saved tensors of each unit go to CPU.
        engine = "FSDP" if draft.get("engine") in ("fsdp1", "fsdp2") else "no FSDP here: ms-swift raises ValueError"
        draft.note(f"{src('activation_cpu_offload')}: activations saved for backward are offloaded to CPU per FSDP "
                   f"unit (swift/plugin/activation_cpu_offload.py; {engine})")
    fsdp_ac = draft.get("checkpoint_impl") == "torch-wrapper"
    # Checkpointing by default from v1.3 (llm_sft.py of v1.1 - v1.2 had it off).
    gc = on("gradient_checkpointing", default=not fsdp_ac and at_least(draft, "ms-swift", "1.3.0"))
    if fsdp_ac and on("gradient_checkpointing"):
        draft.note("ms-swift turns --gradient_checkpointing off when FSDP activation_checkpointing is on "
                   "(swift/arguments/sft_args.py)")
    if not gc or fsdp_ac:
        return
    draft.set("checkpointing", "all", src("gradient_checkpointing") if "gradient_checkpointing" in opts
              else f"default (ms-swift {ARGS}: gradient_checkpointing true)")
    draft.set("checkpoint_impl", "transformers", "model.gradient_checkpointing_enable (swift/trainers/mixin.py)")
    kwargs = get("gradient_checkpointing_kwargs")
    try:
        kwargs = json.loads(kwargs) if isinstance(kwargs, str) and kwargs.strip() else (kwargs or {})
    except ValueError:
        raise LoraflowError(f"{src('gradient_checkpointing_kwargs')}: not JSON; write e.g. "
                            "--gradient_checkpointing_kwargs '{\"use_reentrant\": false}'.") from None
    kwargs = mapping_value(kwargs, src("gradient_checkpointing_kwargs") if "gradient_checkpointing_kwargs" in opts
                           else "gradient_checkpointing_kwargs")
    if "use_reentrant" in kwargs:
        draft.set("reentrant", as_bool(kwargs["use_reentrant"], "use_reentrant"), src("gradient_checkpointing_kwargs"))
    else:
        draft.set("reentrant", *reentrant_default(draft))
    draft.set("input_grad_hook", True, "ms-swift calls enable_input_require_grads() with gradient "
              "checkpointing (swift/trainers/mixin.py)")


def unused_parameters_default(draft: Draft) -> tuple[bool, str] | None:
    if draft.get("engine") in ("deepspeed", "fsdp1", "fsdp2"):
        return None
    if draft.get("checkpointing") != "off" and at_least(draft, "ms-swift", "1.3.0") and \
            not at_least(draft, "ms-swift", "3.0.0"):
        # "Compatible with transformers PR #25903": v1.3 - 2.x set it false under DDP with gradient checkpointing
        # (swift/llm/sft.py, then swift/llm/utils/argument.py _init_training_args); 3.0 left the Trainer's default.
        return False, ("default (ms-swift 1.3 - 2.x: ddp_find_unused_parameters false with gradient checkpointing, "
                       "swift/llm/utils/argument.py _init_training_args)")
    if draft.get("adapter") != "full":
        return True, ("default (HF Trainer: a PeftModel is not a PreTrainedModel, so find_unused_parameters=True; "
                      "transformers trainer.py)")
    return None


def reentrant_default(draft: Draft) -> tuple[bool, str]:
    """use_reentrant when the command does not set it, per ms-swift release."""
    if at_least(draft, "ms-swift", "3.6.0"):
        plain_ddp = draft.get("world_size") > 1 and draft.get("engine") not in ("deepspeed", "fsdp1", "fsdp2")
        return not plain_ddp, ("default (ms-swift >= 3.6 swift/trainers/mixin.py: use_reentrant " +
                               ("False for multi-process DDP)" if plain_ddp else "True unless multi-process DDP)"))
    if at_least(draft, "ms-swift", "3.0.0"):
        return True, "default (ms-swift 3.0 - 3.5 swift/trainers/arguments.py: use_reentrant True for every launch)"
    if at_least(draft, "ms-swift", "1.4.0"):
        # ms-swift patches the checkpoint functions to default to non-reentrant, but transformers >= 4.45 passes
        # use_reentrant=True explicitly, which wins.
        explicit = at_least(draft, "transformers", "4.45.0")
        return explicit, ("transformers >= 4.45 passes use_reentrant=True, overriding ms-swift 1.4 - 2.x's "
                          "non-reentrant patch" if explicit else "default (ms-swift 1.4 - 2.x patch torch's checkpoint "
                          "to non-reentrant)")
    return True, "default (ms-swift < 1.4: transformers 4.x checkpoints reentrant)"
