"""A training script's own loop (no HF Trainer, no Lightning: `loss.backward()`, `accelerator.backward(loss)`, a
DeepSpeed engine's backward): what the code wraps the model in (torch FSDP, fully_shard, DDP), the loss scaler and
autocast it runs under, the checkpoint calls it makes itself, and the mode the model is in at backward. hf.py fills
these fields with the HF Trainer's own behaviour (it calls model.train(), wraps PEFT adapters as FSDP units of their
own, asks DDP to find unused parameters for a PeftModel); a loop of the script's own does none of that, so the
torch / accelerate defaults apply instead (each class was seen in public scripts: tests/frontends/
test_wild_scripts5.py)."""

from __future__ import annotations

from typing import Any

from loraflow.frontends import common
from loraflow.frontends.common import Draft, at_least
from loraflow.frontends.script_code import Call, Code, FromFlag, Parsed, Unread
from loraflow.frontends.script_facts import Facts, kind

_FSDP1 = ("FullyShardedDataParallel", "FSDP")
_DDP = ("DistributedDataParallel", "DDP")
# Wrap policies that put trainable leaves (the adapters) in FSDP units of their own: PEFT's fsdp_auto_wrap_policy
# and the llama-recipes helper copied from it (an _or_policy of a lambda policy on `weight.requires_grad` and the
# transformer layers). transformer_auto_wrap_policy / size_based_auto_wrap_policy mix them with the frozen base.
_SEPARATING = ("fsdp_auto_wrap_policy", "lambda_auto_wrap_policy", "_or_policy", "peft_wrap_policy")
_MIXING = ("transformer_auto_wrap_policy", "size_based_auto_wrap_policy", "ModuleWrapPolicy")
# The fixes in the loop's words (fields no TrainingArguments flag sets).
_FIXES = {"fsdp_use_orig_params": "FSDP(model, use_orig_params=True, ...)",
          "fsdp_frozen_units_separate": "FSDP(model, auto_wrap_policy=fsdp_auto_wrap_policy(model), ...) (peft.utils."
                                        "other: the adapters as units of their own)",
          "mixed_param_dtypes": "get_peft_model(model, config, autocast_adapter_dtype=False), or load the base in "
                                "float32 and cast with FSDP's MixedPrecision",
          "train_mode_at_backward": "model.train() before the loop's forward (after any model.eval())"}
_TRAINER_UNUSED = "default (HF Trainer"
_TRAINER_MODE = "Trainer.training_step calls model.train()"
_TRAINER_UNITS = "transformers >= 4.39 Trainer"


def own_loop(facts: Facts, code: Code) -> bool:
    """The script runs its own training step: a backward it calls itself, with no Trainer or Lightning around it."""
    return facts.trainer is None and facts.lightning is None and bool(_backwards(code))


def apply_loop(draft: Draft, facts: Facts, code: Code) -> None:
    """Before the casts are read (script_setup.code_only): the engine and precision decide what a cast means."""
    if not own_loop(facts, code):
        return
    _wrapper(draft, code)
    draft.flags.update(_FIXES)
    _scaler(draft, code)
    _manual_checkpoint(draft, facts, code)
    _mode(draft, facts, code)
    _save_gather(draft, code)
    _accumulation(draft, code)
    source = draft.sources.get("find_unused_parameters", "")
    if source.startswith(_TRAINER_UNUSED):
        draft.set("find_unused_parameters", False, "default (the script's own loop: torch DDP's "
                  "find_unused_parameters=False, torch/nn/parallel/distributed.py, as accelerate's "
                  "DistributedDataParallelKwargs, accelerate/utils/dataclasses.py; the HF Trainer's True for a "
                  "PeftModel does not apply)")
    if draft.get("engine") == "fsdp1" and _TRAINER_UNITS in draft.sources.get("fsdp_frozen_units_separate", ""):
        # transformers/distributed/fsdp.py sets PEFT's fsdp_auto_wrap_policy on accelerate's plugin inside the
        # Trainer; accelerate's own prepare wraps by the config's policy (transformer layers) alone.
        draft.set("fsdp_frozen_units_separate", False, "the script's own loop: accelerate wraps by its config's "
                  "policy; only transformers' Trainer adds PEFT's adapter wrap policy "
                  "(transformers/distributed/fsdp.py)")


def _accumulation(draft: Draft, code: Code) -> None:
    """The script's own loop accumulates through accelerate where it calls accelerator.accumulate(model): between
    the micro-steps accelerate enters the model's no_sync. Its steps come from Accelerator(gradient_accumulation_
    steps=N); otherwise the loop is its own (what it does between micro-steps is in its code)."""
    accumulate = next((c for c in code.calls if c.name == "accumulate" and c.owner_name
                       and c.owner_name not in ("np", "numpy", "itertools", "operator")), None)  # not a running sum
    if accumulate is None:
        draft.set("accumulation_loop", "own", "the script's own loop")
        return
    draft.set("accumulation_loop", "accelerate", f"{accumulate.at()}: accelerate's accumulate() enters no_sync "
              "between micro-steps (accelerate/accelerator.py)")
    built = next((c for c in code.calls if c.name == "Accelerator" and "gradient_accumulation_steps" in c.kwargs),
                 None)
    value = built.kwargs["gradient_accumulation_steps"] if built is not None else None
    if isinstance(value, int) and not isinstance(value, bool):
        draft.set("grad_accum_steps", value, built.at("gradient_accumulation_steps"))


def _backwards(code: Code) -> list[Call]:
    return [c for c in code.calls if c.name == "backward" and kind(c, code) == "trains"]


def _torch(name: str, code: Code) -> bool:
    return code.imports.get(name) == "torch"


def _named(code: Code, names: tuple[str, ...]) -> Call | None:
    """The first call of one of torch's classes or functions, by the name the script imported it as."""
    for call in code.calls:
        root = call.func.split(".", 1)[0]
        if call.name in names and (_torch(call.name, code) or root in ("torch", "nn", "fsdp", "dist")):
            return call
    return None


def _wrapper(draft: Draft, code: Code) -> None:
    """torch's FSDP1 (use_orig_params=False by default, torch/distributed/fsdp/fully_sharded_data_parallel.py),
    FSDP2 (fully_shard) or DDP (find_unused_parameters=False by default), as the code wraps the model itself."""
    fsdp2 = _named(code, ("fully_shard",))
    fsdp1 = _named(code, _FSDP1)
    ddp = _named(code, _DDP)
    if fsdp2 is not None:
        draft.set("engine", "fsdp2", f"{fsdp2.at()} (the script shards the model itself)")
    elif fsdp1 is not None:
        draft.set("engine", "fsdp1", f"{fsdp1.at()} (the script wraps the model in torch's FSDP itself)")
        _flag(draft, fsdp1, "use_orig_params", "fsdp_use_orig_params", "torch's FSDP default use_orig_params=False "
              "(torch/distributed/fsdp/fully_sharded_data_parallel.py)")
        _units(draft, fsdp1)
        half = _half_load(code)
        common.trainer_dtypes(draft, half is not None, half.at() if half is not None else fsdp1.at())
    elif ddp is not None:
        draft.set("engine", "ddp", f"{ddp.at()} (the script wraps the model in DDP itself)")
        _flag(draft, ddp, "find_unused_parameters", "find_unused_parameters",
              "torch DDP's default find_unused_parameters=False (torch/nn/parallel/distributed.py)")
    else:
        handler = next((c for c in code.calls if c.name == "DistributedDataParallelKwargs"), None)
        if handler is not None:
            _flag(draft, handler, "find_unused_parameters", "find_unused_parameters",
                  "accelerate's DistributedDataParallelKwargs default find_unused_parameters=False "
                  "(accelerate/utils/dataclasses.py)")


def _half_load(code: Code) -> Call | None:
    """The load of a base in bf16/fp16 (torch_dtype= / dtype=), whose adapters PEFT keeps in float32."""
    return next((c for c in code.calls if kind(c, code) == "load" and str(c.kwargs.get("torch_dtype", c.kwargs.get(
        "dtype"))) in ("bfloat16", "float16")), None)


def _flag(draft: Draft, call: Call, key: str, field: str, default: str) -> None:
    value = call.kwargs.get(key)
    if isinstance(value, bool):
        draft.set(field, value, call.at(key))
    elif key in call.kwargs or call.splat:
        draft.unknown.append(f"{call.at(key) if key in call.kwargs else call.at()} (its {key} is not visible here)")
    else:
        draft.set(field, False, f"{default}: {call.at()} leaves it out")


def _text(value: Any) -> str:
    if isinstance(value, Call):
        return " ".join([value.func, *map(_text, value.args), *map(_text, value.kwargs.values())])
    if isinstance(value, Unread):
        return value.text
    return str(value)


def _units(draft: Draft, call: Call) -> None:
    """Whether FSDP1's units keep the adapters apart from the frozen base weights they sit in."""
    if "auto_wrap_policy" not in call.kwargs:
        draft.set("fsdp_frozen_units_separate", False, f"{call.at()}: no auto_wrap_policy (one unit, the whole model)")
        return
    _policy(draft, call.kwargs["auto_wrap_policy"], call.at("auto_wrap_policy"))


def _policy(draft: Draft, value: Any, where: str) -> None:
    """An FSDP1 auto_wrap_policy: PEFT's (the adapters as units of their own), a layer policy (mixed), or unseen."""
    policy = _text(value)
    if any(n in policy for n in _SEPARATING):
        draft.set("fsdp_frozen_units_separate", True, f"{where} (trainable leaves wrapped as their own units)")
    elif any(n in policy for n in _MIXING):
        draft.set("fsdp_frozen_units_separate", False, f"{where} (units hold adapters beside frozen base weights)")
    else:
        draft.maybe("fsdp_frozen_units_separate", {True: "the policy wraps the adapters as units of their own",
                                                   False: "the policy wraps whole layers"},
                    f"{where}: built where the code does not show")


def _scaler(draft: Draft, code: Code) -> None:
    """A GradScaler the loop scales the loss with is fp16 mixed precision (autocast to float16 around a float32
    or float16 model); autocast to bfloat16 without one is bf16 mixed precision."""
    if "precision" in draft.sources and not draft.sources["precision"].startswith("not set"):
        return
    scaler = next((c for c in code.calls if c.name == "GradScaler"), None)
    if scaler is not None:
        enabled = scaler.arg(1 if scaler.args and isinstance(scaler.args[0], str) else 0, "enabled", True)
        if enabled is True:
            draft.set("precision", "fp16-mixed", f"{scaler.at()} (the loop scales an fp16 autocast loss)")
        elif isinstance(enabled, (Unread, FromFlag, Parsed, Call)):
            draft.maybe("precision", {"fp16-mixed": "the scaler is enabled (fp16 autocast)",
                                      "fp32": "the scaler is disabled"}, f"{scaler.at('enabled')}: not visible here")
        return
    cast = next((c for c in code.calls if c.name == "autocast" and c.kwargs.get("dtype") == "bfloat16"), None)
    if cast is not None:
        draft.set("precision", "bf16-mixed", f"{cast.at('dtype')} (the loop's own autocast)")


def _manual_checkpoint(draft: Draft, facts: Facts, code: Code) -> None:
    """torch.utils.checkpoint.checkpoint(fn, *args) called by the script on its layers: use_reentrant=True when it is
    not passed (torch/utils/checkpoint.py only warns, then `use_reentrant = True`)."""
    if draft.get("checkpointing") != "off" or not (facts.wraps or facts.configs):
        return
    calls = [c for c in code.calls if c.name in ("checkpoint", "checkpoint_sequential")
             and (code.imports.get(c.name) == "torch" or c.func.startswith(("torch.", "checkpoint.")))]
    if not calls:
        return
    call = calls[0]
    draft.set("checkpointing", "all", f"{call.at()} (the script checkpoints its layers itself)")
    draft.set("checkpoint_impl", "torch-wrapper", f"{call.at()} (torch's checkpoint, whatever the module's mode)")
    value = call.kwargs.get("use_reentrant")
    if isinstance(value, bool):
        draft.set("reentrant", value, call.at("use_reentrant"))
    elif "use_reentrant" in call.kwargs:
        draft.unknown.append(f"{call.at('use_reentrant')} (not visible here)")
    else:
        draft.set("reentrant", True, f"default ({call.at()} without use_reentrant: torch/utils/checkpoint.py warns and "
                  "uses use_reentrant=True)")


def _mode(draft: Draft, facts: Facts, code: Code) -> None:
    """transformers' from_pretrained returns the model in eval mode (modeling_utils.py `model.eval()`), and
    get_peft_model, accelerate and DeepSpeed keep the mode: a loop that never calls .train(), or calls .eval() just
    before its first backward, runs backward in eval mode (dropout off, transformers' checkpointing skipped)."""
    if not draft.sources.get("train_mode_at_backward", "").startswith(_TRAINER_MODE):
        return
    first = _backwards(code)[0]
    modes = [c for c in code.calls if c.name in ("train", "eval") and kind(c, code) != "trains"
             and "trainer" not in c.owner_name.lower()]
    if not modes:
        loads = [c for c in facts.loads if c.line < first.line]
        if loads:
            draft.set("train_mode_at_backward", False, f"{loads[0].at()} (from_pretrained returns the model in eval "
                      "mode) and the script never calls model.train() before its backward")
        else:
            draft.set("train_mode_at_backward", True, "assumed (the script's own loop shows no .eval() before "
                      "backward)")
        return
    before = [c for c in modes if c.scope == first.scope and c.line < first.line]
    last = before[-1] if before else None
    if last is not None and (last.name == "eval" or last.args[:1] == [False]):
        draft.set("train_mode_at_backward", False, f"{last.at()} (the model is in eval mode at {first.at()})")
    else:
        where = last.at() if last is not None else "the script's own loop"
        draft.set("train_mode_at_backward", True, f"{where} (the model is in train mode at backward)")


def _save_gather(draft: Draft, code: Code) -> None:
    """hf.py reads a ZeRO-3 save as the HF Trainer's (it consolidates a PeftModel's partitions, or saves through the
    config's 16-bit gather); a loop of the script's own saves only what it saves itself, and PEFT's save_pretrained
    reads the module's [0] placeholders unless the code gathers them (deepspeed.zero.GatheredParameters, accelerate's
    get_state_dict, the engine's save_16bit_model)."""
    if not (draft.get("engine") == "deepspeed" and draft.get("zero_stage") == 3):
        return
    saves = [c for c in code.calls if c.name == "save_pretrained" and not any(
        n in c.owner_name.lower() for n in ("token", "processor", "config"))]
    if not saves:
        draft.set("adapter_save_gather", True, "the script's own loop saves no adapter with save_pretrained (nothing "
                  "is read from ZeRO-3's partitions)")
        return
    given = next((c for c in saves if "get_state_dict" in c.texts.get("state_dict", "")), None)
    gather = next((c for c in code.calls if c.name in ("GatheredParameters", "save_16bit_model")), None)
    if given is not None or gather is not None:
        where = given.at("state_dict") if given is not None else gather.at()
        draft.set("adapter_save_gather", True, f"{where} (gathers the ZeRO-3 partitions for the save)")
    else:
        draft.set("adapter_save_gather", False, f"{saves[0].at()} in the script's own loop under ZeRO-3: PEFT's "
                  "save_pretrained reads the module's partitioned placeholders; nothing gathers them "
                  "(deepspeed.zero.GatheredParameters or state_dict=accelerator.get_state_dict(model))")


def plugin_policy(draft: Draft, code: Code) -> None:
    """`trainer.accelerator.state.fsdp_plugin.auto_wrap_policy = policy` (transformers#27573's way to give the HF
    Trainer a wrap policy of one's own, and accelerate loops' `accelerator.state.fsdp_plugin.auto_wrap_policy =
    fsdp_auto_wrap_policy(model)`): the policy set last decides whether the adapters are units of their own."""
    if draft.get("engine") != "fsdp1":
        return
    sets = [(value, source) for owner, attr, value, source in code.attributes
            if attr == "auto_wrap_policy" and owner.endswith("fsdp_plugin")]
    if not sets:
        return
    value, source = sets[-1]
    _policy(draft, value, source)
