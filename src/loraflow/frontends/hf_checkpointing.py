"""Checkpointing of an HF Trainer / TRL run: whether it is on (TRL's default since 0.22, a script's own switch),
and the reentrancy and input-grad hook that TRL's trainers, transformers' releases or the script decide. Part of the
HF Trainer / TRL frontend (hf.py), which calls `checkpointing` once the adapter and the engine are known."""

from __future__ import annotations

from typing import Any

from loraflow.frontends import trl as trl_rel
from loraflow.frontends import vision, vlm_lineage
from loraflow.frontends.common import Draft, as_bool, at_least, int_value
from loraflow.frontends.hf_options import Run, kwargs_of
from loraflow.frontends.table import Default


def checkpointing(draft: Draft, run: Run) -> tuple[bool, str, str]:
    """Checkpointing: TRL turns it on by default (trl/trainer/base_config.py, since TRL 0.22); the Trainer does not.
    A script's own switch (InternVL's --grad_checkpoint) counts where the Trainer's flag is absent. Returns whether
    it checkpoints and the spellings the run uses for the switch and its kwargs."""
    opts, intent, trl = run.opts, run.intent, run.trl
    gc_name = next((n for n in ("activation_checkpointing", "gradient_checkpointing") if n in opts),
                   "gradient_checkpointing")
    kw_name = next((n for n in ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs") if n in opts),
                   "gradient_checkpointing_kwargs")
    own_gc = gc_name not in opts and intent.checkpointing is not None
    gc = (run.on(gc_name) if gc_name in opts else intent.checkpointing if own_gc else
          bool(trl and trl_rel.since(draft, "0.22.0")))
    if gc_name in opts:
        gc_src = opts[gc_name].source
    elif own_gc:
        gc_src = f"{intent.sources['checkpointing']} (the script's own switch)"
    else:
        gc_src = f"default ({run.who} " + ("trl/trainer/base_config.py: gradient_checkpointing true since TRL 0.22)"
                                           if trl else "TrainingArguments: false)")
    if gc and draft.get("checkpoint_impl") == "torch-wrapper":
        # transformers trainer.py create_accelerator_and_postprocess raises ValueError (since PR #25771 brought FSDP
        # activation checkpointing to the Trainer): the run stops before its first step.
        draft.stop(f"{gc_src} with FSDP activation_checkpointing ({draft.sources.get('checkpointing', '')}): "
                   "the Trainer refuses both (\"activation_checkpointing in FSDP config and the "
                   "gradient_checkpointing in training arg can't be set to True simultaneously\"); keep "
                   f"FSDP's and set {gc_name} false")
    if not gc:
        return gc, gc_name, kw_name
    kwargs = kwargs_of(opts.get(kw_name))
    every = int_value(kwargs.get("every_n_layers", 1), f"{opts[kw_name].source if kw_name in opts else kw_name}: "
                      "every_n_layers", "a number of layers")
    draft.set("checkpointing", "partial" if every > 1 else "all", gc_src)
    if every > 1:
        draft.set("checkpoint_every_n", every, opts[kw_name].source)
    draft.set("checkpoint_impl", "transformers", f"{run.who} calls model.gradient_checkpointing_enable")
    if draft.get("engine") == "fsdp2":
        draft.set("checkpoint_outside_shard", *checkpoint_outside_shard(draft))
        # accelerate shards the root under the layers' mp_policy too (fsdp2_prepare_model), but with bf16/fp16 it
        # also wraps forward in autocast (accelerator.py prepare_model, native_amp), which the recompute under
        # fully_shard loses before torch 2.13 (pytorch#148831): fsdp2_root_in_policy stays False here.
    _reentrant(draft, run, kwargs, kw_name)
    _input_grad_hook(draft, run)
    # A known image-text script that is not here answers what the two calls above leave to its code.
    vlm_lineage.apply(draft, run.program, opts)
    model = run.opts.get("model_name_or_path")
    vision.tower_hook(draft, str(model.value or "") if model is not None else "")
    return gc, gc_name, kw_name


def checkpoint_outside_shard(draft: Draft) -> tuple[bool, str]:
    """Where transformers' layer checkpointing sits relative to FSDP2's units (fully_shard on each decoder layer):
    transformers < 5.23 checkpoints each layer's __call__, FSDP2's forward hooks (and their mixed-precision casts)
    inside the recompute; 5.23 checkpoints forward and leaves the hooks outside. For every framework that enables
    transformers' checkpointing and then shards with FSDP2."""
    outside = not at_least(draft, "transformers", "5.23.0")
    return outside, ("transformers < 5.23 checkpoints the layer's __call__, FSDP2's hooks included" if outside else
                     "transformers >= 5.23 checkpoints the layer's forward, inside FSDP2's hooks")


def _reentrant(draft: Draft, run: Run, kwargs: dict[str, Any], kw_name: str) -> None:
    opts, intent, trl, trainer = run.opts, run.intent, run.trl, run.trainer
    peft = draft.get("adapter") != "full"
    forced = trl_rel.FORCED_SINCE.get(trainer)
    if trl and peft and run.zero3 and forced and trl_rel.since(draft, forced):
        # TRL forces reentrant for PEFT + ZeRO-3, overriding an explicit false: SFT since 0.28 (PR #4951), the
        # DPO, GRPO, RLOO, KTO and reward trainers since 1.9 (PR #6356).
        draft.set("reentrant", True, f"TRL >= {forced} forces use_reentrant=True for PEFT + ZeRO-3 "
                  f"(trl/trainer/{trainer}_trainer.py)")
        if kwargs.get("use_reentrant") is False:
            draft.note(f"{opts[kw_name].source}: TRL overrides use_reentrant=false to true under PEFT + ZeRO-3")
    elif trl and (by_script := trl_rel.script_reentrant(draft, run.program)):
        draft.set("reentrant", *by_script)
    elif "use_reentrant" in kwargs:
        draft.set("reentrant", as_bool(kwargs["use_reentrant"], kw_name), opts[kw_name].source)
    elif trl and (by_cli := trl_rel.cli_reentrant(draft, run.cli)):
        draft.set("reentrant", *by_cli)
    elif intent.reentrant is not None:
        draft.set("reentrant", intent.reentrant, f"{intent.sources['reentrant']} (inferred: the script passes it "
                  "to gradient_checkpointing_enable)")
    elif trl and trl_rel.since(draft, "0.27.0"):
        draft.set("reentrant", False, "default (TRL >= 0.27 sets use_reentrant=False when unset, trl/trainer/"
                  f"{trainer}_trainer.py; transformers >= 5 defaults to False as well)")
    else:
        draft.set("reentrant", *_TRANSFORMERS_REENTRANT(draft))
    if run.custom and kw_name not in opts and intent.reentrant is None:
        draft.maybe("reentrant", {True: "the script checkpoints reentrant", False: "the script checkpoints "
                                  "non-reentrant (use_reentrant=False)"},
                    "a training script of its own may pass gradient_checkpointing_kwargs itself")


# gradient_checkpointing_enable() without use_reentrant: transformers PR #43203 turned the default to False in 5.0.
_TRANSFORMERS_REENTRANT = Default(
    True, "default (transformers < 5.0: use_reentrant=True when gradient_checkpointing_kwargs is unset; transformers "
    "PR #43203)", since=(("transformers", "5.0.0", False, "default (transformers >= 5.0: use_reentrant=False when "
                          "gradient_checkpointing_kwargs is unset; transformers PR #43203)"),))


def _input_grad_hook(draft: Draft, run: Run) -> None:
    peft = draft.get("adapter") != "full"
    # A script read as training adapters by its name or its own flags (`qlora.py`, `--bits 4`) builds them itself;
    # QLoRA scripts call prepare_model_for_kbit_training, which adds the hook (artidoro/qlora#12 ran under DDP).
    if peft and (run.custom or run.info.get("own_adapter")):
        draft.set("input_grad_hook", True, "assumed: scripts that train adapters with checkpointing call "
                  "enable_input_require_grads() themselves")
        draft.maybe("input_grad_hook", {True: "the script calls enable_input_require_grads()",
                                        False: "the script adds no input-grad hook"},
                    "only the script's code shows whether it hooks the embedding output")
    elif peft and run.trl:
        draft.set("input_grad_hook", *trl_rel.hook(draft, run.trainer))
    elif peft and at_least(draft, "transformers", "5.0.0"):
        draft.set("input_grad_hook", True, "transformers >= 5 checkpointing hooks the embedding output of "
                  "input_ids models (transformers modeling_utils.py activation_checkpointing_enable)")
    elif peft:
        draft.set("input_grad_hook", False, "transformers < 5: the Trainer's hook is skipped for a PeftModel "
                  "(transformers issue #42489)")
