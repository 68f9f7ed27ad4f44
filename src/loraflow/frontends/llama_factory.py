"""LLaMA-Factory: `llamafactory-cli train examples/train_lora/x.yaml [key=value ...]` (or `--key value` flags), the
same YAML on its own, `python src/train.py x.yaml`, or `accelerate launch --config_file examples/accelerate/...`.

LLaMA-Factory checkpoints by default (`disable_gradient_checkpointing: false`) with `use_reentrant_gc: true`, and its
own checkpoint function marks the hidden-state input of every checkpointed trainable layer as requiring grad
(src/llamafactory/model/model_utils/checkpointing.py), which does what an input-grad hook does.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from loraflow.errors import LoraflowError
from loraflow.frontends import adapter_dtype, deepspeed, keys, llama_factory_keys, llama_factory_quant
from loraflow.frontends import liger, llama_factory_vision
from loraflow.frontends import llama_factory_export as exports
from loraflow.frontends.argv import (
    Command,
    parse_flags,
    resolve_path,
    split_command,
)
from loraflow.frontends.shell import command_from_script, is_launch_script
from loraflow.frontends import moe_blocks
from loraflow.frontends.base import Framework, FrontendResult, Mitigation
from loraflow.frontends.accelerate_options import apply_accelerate
from loraflow.frontends.trainer_checkpoints import trainer_checkpoints
from loraflow.frontends.targets import check_targets
from loraflow.frontends.common import (
    Draft,
    accessors,
    as_bool,
    as_list,
    at_least,
    embedding_targets,
    finish_world,
    int_value,
    precision_from,
    read_keyed_files,
    trainer_dtypes,
    world_from_env,
    yaml_null,
)
from loraflow.frontends.table import (
    Default,
    Field,
    apply_table,
    at_stage,
    checkpointing_on,
    empty_targets,
    fact,
    stages,
    steps,
    switch,
)

NAME = "llama-factory"
HP = "src/llamafactory/hparams"
# LLaMA-Factory's stages -> loraflow's (pt and kto through table.STAGE_ALIASES).
STAGES = stages("pt", "sft", "rm", "dpo", "kto", "ppo")
# Combination field -> the LLaMA-Factory key (YAML) or flag that changes it (also read by `loraflow explain`).
FLAGS = {"checkpointing": "disable_gradient_checkpointing", "reentrant": "use_reentrant_gc",
         "fsdp_state_dict": "fsdp_state_dict_type in the accelerate config",
         "resumes": "resume_from_checkpoint / load_best_model_at_end",
         "zero_stage": "deepspeed (e.g. examples/deepspeed/ds_z2_config.json)", "adapter": "finetuning_type / use_dora",
         "precision": "bf16 / fp16 / pure_bf16", "quantization": "quantization_bit", "matched_modules": "lora_target",
         "packing": "packing / neat_packing", "find_unused_parameters": "ddp_find_unused_parameters",
         "embeddings_trainable": "additional_target", "lm_head_trainable": "additional_target",
         "engine": "deepspeed / accelerate --config_file", "world_size": "NPROC_PER_NODE / CUDA_VISIBLE_DEVICES",
         "grad_accum_steps": "gradient_accumulation_steps", "optimizer_8bit": "optim (a 32-bit one: adamw_torch)",
         "saves_optimizer_state": "save_only_model",
         "adapter_save_gather": "stage3_gather_16bit_weights_on_model_save in the deepspeed JSON",
         "targets_all_towers": "lora_target / freeze_vision_tower", "image_safe_truncation": "cutoff_len / "
         "image_max_pixels", "towers_trainable": "freeze_vision_tower / freeze_multi_modal_projector",
         "merge_into_quantized": exports.FLAGS["merge_into_quantized"],
         "unsloth": "use_unsloth", "adapter_reads_base": "pissa_init"}
_HANDLED = {"stage", "finetuning_type", "use_dora", "lora_target", "additional_target", "quantization_bit",
            "quantization_method", "disable_gradient_checkpointing", "use_reentrant_gc", "use_unsloth_gc", "deepspeed",
            "bf16", "fp16", "pure_bf16", "packing", "neat_packing", "ddp_find_unused_parameters", "ddp_static_graph",
            "gradient_checkpointing", "fsdp", "fsdp_config", "model_name_or_path", "use_unsloth", "pissa_init"}


def _refuse_accelerate(path: str, data: dict) -> None:
    if "distributed_type" in data:
        raise LoraflowError(f"{path} is an accelerate config: pass it on the launch line "
                            f"(accelerate launch --config_file {path} src/train.py ...) after `--`.")


def _read(cmd: Command | None, paths: list[str], draft: Draft) -> tuple[dict[str, tuple[Any, str]], list]:
    """Options from YAML/JSON files, then `key=value` overrides (OmegaConf) or `--key value` flags
    (HfArgumentParser), as src/llamafactory/hparams/parser.py reads them. A null, in a file or an override
    (`resume_from_checkpoint: null`, `deepspeed=~`), keeps LLaMA-Factory's default: the key is dropped."""
    opts, bases = read_keyed_files(paths, "LLaMA-Factory config", keep_null=False, inspect=_refuse_accelerate)
    if cmd is None:
        return opts, bases
    args, positionals, _ = parse_flags(cmd.args)
    for pos in positionals:
        if "=" in pos:
            key, _, value = pos.partition("=")
            opts[key] = (value, pos)
        elif pos.endswith((".yaml", ".yml", ".json")):
            path = resolve_path(pos)
            if path is None:
                opts = {**_from_name(pos, draft), **opts}
                continue
            more, more_bases = _read(None, [str(path)], draft)
            opts = {**more, **opts}
            bases += more_bases
        else:
            draft.unknown.append(f"{pos} (positional argument)")
    for a in args:
        opts[a.name] = (a.value if a.value is not None else True, a.raw)  # a bare `--switch` is on
    return {k: v for k, v in opts.items() if not (v[1] == f"{k}={v[0]}" and yaml_null(v[0]))}, bases


def _from_name(name: str, draft: Draft) -> dict[str, tuple[Any, str]]:
    """A config the launch names but this machine lacks (`examples/train_lora/llama3_lora_sft_ds3.yaml`): what its
    name says (stage, finetuning type, DeepSpeed stage), LLaMA-Factory's defaults for the rest."""
    stem = Path(name).stem.lower()
    said = f"{name} (inferred from its name)"
    opts: dict[str, tuple[Any, str]] = {}
    for stage in ("sft", "dpo", "kto", "ppo", "rm", "pt"):
        if re.search(rf"(^|[_-]){stage}([_-]|$)", stem):
            opts["stage"] = (stage, said)
            break
    kind = "qlora" if "qlora" in stem else "lora" if "lora" in stem else "full" if "full" in stem else None
    if kind:
        opts["finetuning_type"] = ("full" if kind == "full" else "lora", said)
        if kind == "qlora":
            opts["quantization_bit"] = (4, said)
    m = re.search(r"(?:ds|zero|z)[_-]?(\d)|(?:^|[_-])ds(?:[_-]|$)", stem)
    if m:
        opts["deepspeed"] = (f"ds_z{m.group(1)}_config.json" if m.group(1) else "ds_config.json", said)
    read = ", ".join(f"{k}: {v[0]}" for k, v in opts.items()) or "nothing"
    draft.note(f"{name}: no such file here, so read from its name ({read}); LLaMA-Factory's defaults for the rest")
    draft.unknown.append(f"{name}: not here, so only its name and the command's flags were read")  # exit >= 1
    return opts


# What a key or launch form says about the release (LLaMA-Factory's git history).
_ERAS = (("disable_gradient_checkpointing", ">=0.5.0"), ("use_dora", ">=0.5.3"), ("pure_bf16", ">=0.6.0"),
         ("neat_packing", ">=0.8.3"), ("use_reentrant_gc", ">=0.9.2"), ("use_unsloth_gc", ">=0.9.0"))
# Its `deepspeed` extra caps DeepSpeed per release (setup.py / pyproject.toml).
DEPENDS = (("llama-factory", ">=0.7.1,<0.8.3", {"deepspeed": "<=0.14.0"}),
           ("llama-factory", ">=0.9.0,<0.9.2", {"deepspeed": "<=0.14.4"}),
           ("llama-factory", ">=0.9.2,<0.9.3", {"deepspeed": "<=0.16.4"}),
           ("llama-factory", ">=0.9.3,<0.9.5", {"deepspeed": "<=0.16.9"}),
           ("llama-factory", "<0.9.5", {"transformers": "<5.0.0"}))


def _eras(draft: Draft, opts: dict, cmd: Command | None) -> None:
    llama_factory_keys.old_spellings(draft, opts, _ERAS, cmd.program if cmd is not None else "")
    if str(opts.get("stage", ("",))[0]) == "kto":
        draft.era("llama-factory", ">=0.8.0", "stage kto exists from LLaMA-Factory 0.8.0")
    if cmd is not None:
        if cmd.program.endswith("train_bash.py"):
            draft.era("llama-factory", "<0.7.1", "src/train_bash.py was replaced by llamafactory-cli in v0.7.1")
        elif cmd.program in ("llamafactory-cli", "lmf"):
            draft.era("llama-factory", ">=0.7.1", "llamafactory-cli came in v0.7.1")


# use_reentrant per release when use_reentrant_gc is not given: transformers' default (reentrant) to v0.4; v0.5.0
# non-reentrant; reentrant again from v0.5.2 (use_reentrant_gc from v0.9.2).
_REENTRANT = Default(True, "LLaMA-Factory < 0.5: gradient_checkpointing_enable() without kwargs (transformers 4.x: "
                     "reentrant)", since=(
                         ("llama-factory", "0.5.2", True, f"default ({HP}/model_args.py: use_reentrant_gc true; "
                          "reentrant since v0.5.2)"),
                         ("llama-factory", "0.5.0", False, "LLaMA-Factory 0.5.0 - 0.5.1 checkpoints with "
                          "use_reentrant=False (model/patcher.py)")))


def _reentrant(draft: Draft, opts: dict, on) -> tuple[bool, str]:
    """use_reentrant: forced off under FSDP2 from v0.9.4, else use_reentrant_gc, else the release's default."""
    if draft.get("engine") == "fsdp2" and at_least(draft, "llama-factory", "0.9.4"):
        return False, "LLaMA-Factory >= 0.9.4 sets use_reentrant_gc false under FSDP2 (model_utils/checkpointing.py)"
    if "use_reentrant_gc" in opts:
        return on("use_reentrant_gc"), opts["use_reentrant_gc"][1]
    return _REENTRANT(draft)


def _stage(draft: Draft, opts: dict) -> str:
    """Returns LLaMA-Factory's own stage name (pt, kto... decide packing and the trainer)."""
    get, src, on = accessors(opts)
    stage_raw = str(get("stage", "sft"))
    if stage_raw not in STAGES:
        raise LoraflowError(f"stage: `{stage_raw}` is not a LLaMA-Factory stage ({', '.join(STAGES)}).")
    draft.set("stage", STAGES[stage_raw],
              src("stage") if "stage" in opts else f"default ({HP}/finetuning_args.py: sft)")
    if stage_raw in ("pt", "kto"):
        draft.note(f"stage {stage_raw} is read as {STAGES[stage_raw]} (loraflow's stages are sft, rm, dpo, grpo, ppo)")
    return stage_raw


def _engine_and_precision(draft: Draft, opts: dict, cmd: Command | None, bases: list) -> tuple[dict, dict]:
    """accelerate's config and the DeepSpeed JSON, then bf16 / fp16 / pure_bf16. Returns (accelerate's leftovers,
    deepspeed.apply's info)."""
    get, src, on = accessors(opts)
    acc = apply_accelerate(draft, cmd, tuple(bases)) if cmd is not None and cmd.launcher == "accelerate" else {}
    info: dict[str, Any] = {}
    if "deepspeed" in opts and get("deepspeed"):
        ds = deepspeed.read(get("deepspeed"), "deepspeed", tuple(bases))
        info, label = deepspeed.apply(draft, ds), ds.label
    fp16, bf16, pure = on("fp16"), on("bf16"), on("pure_bf16")
    if pure:
        # pure_bf16 keeps the trainable weights in bf16 too (no fp32 cast, src/llamafactory/model/adapter.py).
        draft.set("precision", "bf16", src("pure_bf16"))
    if info:  # LLaMA-Factory hands its training arguments and the file to the HF Trainer
        deepspeed.trainer_values(draft, info, {n: (get(n), src(n)) for n in deepspeed.TRAINER_FIELDS if n in opts},
                                 defaults=True)
    if info and not pure:
        deepspeed.resolve_precision(draft, info, label, bf16, fp16, src("bf16") if "bf16" in opts else
                                    src("fp16") if "fp16" in opts else "bf16/fp16")
    if not draft.has("precision") and (bf16 or fp16):
        draft.set("precision", precision_from(bf16, fp16), src("bf16") if bf16 else src("fp16"))
    elif not draft.has("precision") and acc.get("mixed_precision") in ("bf16", "fp16"):
        draft.set("precision", precision_from(acc["mixed_precision"] == "bf16", acc["mixed_precision"] == "fp16"),
                  "accelerate mixed_precision")
    return acc, info


def _adapter(draft: Draft, opts: dict) -> str:
    """finetuning_type, DoRA, extra trained modules, targets and quantization. Returns finetuning_type."""
    get, src, on = accessors(opts)
    ftype = str(get("finetuning_type", "lora"))
    ftsrc = src("finetuning_type") if "finetuning_type" in opts else f"default ({HP}/finetuning_args.py: lora)"
    if ftype == "full":
        draft.set("adapter", "full", ftsrc)
    else:
        draft.set("adapter", "dora" if ftype == "lora" and on("use_dora") else "lora",
                  f"{ftsrc} + {src('use_dora')}" if on("use_dora") else ftsrc)
        if ftype != "lora":
            draft.note(f"finetuning_type {ftype} trains some weights and freezes the rest (embeddings included): "
                       "read like an adapter setup")
    if "additional_target" in opts:
        embedding_targets(draft, as_list(get("additional_target")), src("additional_target"),
                          str(get("model_name_or_path") or ""))
    apply_table(draft, opts, (Field("matched_modules", ("lora_target",), empty_targets, suffix=" (empty)"),))
    if ftype == "lora" and "lora_target" in opts:
        check_targets(draft, str(get("model_name_or_path") or ""), as_list(get("lora_target")), src("lora_target"))
        liger.head_adapter(draft, get("lora_target"), src("lora_target"))
    if on("enable_liger_kernel") and str(get("stage") or "sft") in ("pt", "sft"):
        liger.fused(draft, src("enable_liger_kernel"), "on for pt and sft, src/llamafactory/model/loader.py")
    llama_factory_quant.apply(draft, opts)
    return ftype


_CHECKPOINTING = (
    Field("checkpointing", ("disable_gradient_checkpointing",), lambda v, w: "off" if as_bool(v, w) else "all",
          Default("all", f"default ({HP}/model_args.py: disable_gradient_checkpointing false)")),
    fact("checkpoint_impl", "transformers", "model_utils/checkpointing.py: _set_gradient_checkpointing",
         when=checkpointing_on),
)


def _checkpointing(draft: Draft, opts: dict) -> None:
    get, src, on = accessors(opts)
    if "gradient_checkpointing" in opts:
        draft.note(f"{src('gradient_checkpointing')}: LLaMA-Factory checkpoints through disable_gradient_checkpointing "
                   "(default false, so on); the Trainer's own flag is not how it enables it")
    apply_table(draft, opts, _CHECKPOINTING)
    if checkpointing_on(draft):
        draft.set("reentrant", *_reentrant(draft, opts, on))
        draft.set("input_grad_hook", True, "LLaMA-Factory's checkpoint function marks each trainable layer's hidden-"
                  "state input as requiring grad (model_utils/checkpointing.py)")
        if on("use_unsloth_gc"):
            draft.note("use_unsloth_gc: activations are offloaded to CPU by LLaMA-Factory's own autograd function")
    draft.set("use_cache", False, "LLaMA-Factory turns the KV cache off for training (model_utils/kv_cache.py)")


def _trainer(draft: Draft, opts: dict, stage_raw: str, ftype: str) -> None:
    """Packing and the DDP settings."""
    get, src, on = accessors(opts)
    packing = on("neat_packing") or (on("packing") if "packing" in opts else stage_raw == "pt")
    if packing:
        draft.set("packing", True, src("neat_packing") if on("neat_packing") else src("packing") if "packing" in opts
                  else f"default ({HP}/parser.py: packing on for stage pt)")
    if "ddp_find_unused_parameters" in opts:
        draft.set("find_unused_parameters", on("ddp_find_unused_parameters"), src("ddp_find_unused_parameters"))
    elif draft.get("engine") in ("deepspeed", "fsdp1", "fsdp2"):
        pass  # DDP settings do not apply
    elif ftype == "lora":
        draft.set("find_unused_parameters", False, f"LLaMA-Factory sets it false for LoRA under DDP ({HP}/parser.py)")
    else:
        draft.set("find_unused_parameters", False, "default (HF Trainer: false with gradient checkpointing)")
    trainer_checkpoints(draft, opts, bool(get("fsdp")))
    if ftype == "freeze" and draft.get("engine_checkpoints") == "peft-trainable":  # read like an adapter, not one
        draft.set("engine_checkpoints", "all", f"{src('finetuning_type')}: no PeftModel, so the Trainer's DeepSpeed "
                  "checkpoints keep every weight (it excludes frozen ones for PEFT models only)")
    apply_table(draft, opts, _FACTS)


_FACTS = (
    Field("ddp_static_graph", ("ddp_static_graph",), switch),
    Field("grad_accum_steps", ("gradient_accumulation_steps",), steps),
    fact("accumulation_loop", "hf-trainer", "LLaMA-Factory trains with the HF Trainer (src/llamafactory/train)",
         when=lambda d: d.get("stage") != "ppo"),
    # use_unsloth loads the model through unsloth.FastLanguageModel (src/llamafactory/model/model_utils/unsloth.py).
    Field("unsloth", ("use_unsloth",), switch),
    # pissa_init initializes LoRA from the base weight's SVD (src/llamafactory/model/adapter.py: init_lora_weights).
    Field("adapter_reads_base", ("pissa_init",), lambda v, w: "svd" if as_bool(v, w) else None),
    fact("forwards_per_step", 1, "concatenated_forward (src/llamafactory/train/dpo/trainer.py)",
         when=at_stage("dpo", "rm")),
    fact("generation", True, "PPO samples with generate (src/llamafactory/train/ppo/trainer.py)", when=at_stage("ppo")),
    Field("generation_gather", when=at_stage("ppo"), default=Default(
        False, "LLaMA-Factory < 0.8 generates on the partitioned model (unwrap_model().generate)", since=(
            ("llama-factory", "0.8.0", True, "trl unwrap_model_for_generation gathers ZeRO-3 weights once "
             "(train/ppo/trainer.py, since v0.8.0)"),))),
    fact("train_mode_at_backward", True, "model.train() before each step (HF Trainer; ppo/trainer.py)"),
)


def _save_gather(draft: Draft, stage_raw: str, acc: dict, info: dict) -> None:
    if draft.get("engine") != "deepspeed" or draft.get("zero_stage") != 3:
        return
    if stage_raw != "ppo" and at_least(draft, "transformers", "5.0.0"):
        draft.set("adapter_save_gather", True, "transformers >= 5 Trainer.save_model consolidates the trainable "
                  "ZeRO-3 params of a PeftModel (transformers trainer.py)")
    else:
        gather = deepspeed.gather_on_save(draft, info) or bool(acc.get("zero3_save_16bit_model"))
        key = info.get("gather_key", "stage3_gather_16bit_weights_on_model_save")
        why = ("PPO saves through accelerator.get_state_dict, train/ppo/trainer.py" if stage_raw == "ppo" else
               "transformers < 5 saves through it")
        draft.set("adapter_save_gather", gather, f"{key} in the DeepSpeed config ({why})")


def _adapter_dtype(draft: Draft, ftype: str) -> None:
    """Before v0.4.0 LLaMA-Factory loaded the model in the compute dtype (model/loader.py: torch_dtype=compute_dtype,
    fp16 with --fp16) and added LoRA without casting what trains to float32 (model/adapter.py); the cast came with
    commit 7a03c8d "use peft 0.7.0, fix #1561 #1764" (first in v0.4.0), when PEFT began creating adapters in the
    base's dtype."""
    half = {"fp16-mixed": "float16", "bf16-mixed": "bfloat16"}.get(draft.get("precision"))
    if ftype != "lora" or half is None or draft.get("quantization"):
        return  # a k-bit base: PEFT wraps integer weights, so the adapters stay float32
    if not at_least(draft, "llama-factory", "0.4.0") and adapter_dtype.adapters_follow_base(draft):
        adapter_dtype.trained_in_half(draft, half, f"LLaMA-Factory < 0.4.0 loads the model in {half} and keeps "
                                      f"the LoRA weights PEFT makes ({adapter_dtype.WHY}; model/adapter.py)")


def _apply(draft: Draft, opts: dict[str, tuple[Any, str]], cmd: Command | None, bases: list) -> None:
    _eras(draft, opts, cmd)
    stage_raw = _stage(draft, opts)
    acc, info = _engine_and_precision(draft, opts, cmd, bases)
    ftype = _adapter(draft, opts)
    _adapter_dtype(draft, ftype)
    _checkpointing(draft, opts)
    _trainer(draft, opts, stage_raw, ftype)
    _save_gather(draft, stage_raw, acc, info)
    llama_factory_vision.image_text(draft, opts, ftype)
    trainer_dtypes(draft, draft.get("precision") != "fp32", "LLaMA-Factory loads the model in the compute dtype")
    cli = cmd is not None and any(a.startswith("--") for a in cmd.args)
    for name, (value, source) in opts.items():
        if name not in _HANDLED | keys.LLAMA_FACTORY | keys.HF_TRAINER | llama_factory_keys.OLD:
            draft.unknown.append(source)
    draft.flag(**{k: ("--" + v if cli and "/" not in v and " " not in v else v) for k, v in FLAGS.items()})


# bnb_4bit_quant_storage = the compute dtype ("crucial for fsdp+qlora"), added with the FSDP+QLoRA example
# (examples/extras/fsdp_qlora, README news 2024-03-20) in the v0.6.0 line; the v0.5 patcher.py passes none.
QUANT_STORAGE = Mitigation(("qlora-storage-dtype",), "0.6.0", "4-bit weights are stored in the compute dtype, "
                           "which FSDP and ZeRO-3 shard as floats", "src/llmtuner/model/patcher.py "
                           "_configure_quantization (later model/model_utils/quantization.py)")

def from_command(cmd: Command, versions: dict) -> FrontendResult:
    draft = Draft(NAME, versions)
    if cmd.program_kind == "cli" and cmd.subcommand not in ("train", "export"):
        raise LoraflowError(f"`{cmd.describe()}`: loraflow check reads training runs (llamafactory-cli train ...) "
                            "and merges (llamafactory-cli export ...).")
    opts, bases = _read(cmd, [], draft)
    if cmd.program_kind == "cli" and cmd.subcommand == "export":  # a load and merge of the adapter, not training
        # A config that is not here says nothing by its name about an export: its keys are unknown, not inferred.
        named = {k: v for k, v in opts.items() if v[1].endswith("(inferred from its name)")}
        missing = [p for p in cmd.args if p.endswith((".yaml", ".yml", ".json")) and resolve_path(p) is None]
        draft.notes = [n for n in draft.notes if not any(n.startswith(f"{p}: no such file here") for p in missing)]
        draft.unknown = [u for u in draft.unknown if not any(u.startswith(f"{p}: not here") for p in missing)]
        draft.unknown += [f"{p} (not on this machine: the export's keys in it are not read)" for p in missing]
        _eras(draft, opts, cmd)
        exports.read(draft, {k: v for k, v in opts.items() if k not in named}, cmd.describe(),
                     llama_factory_vision.VLM_TEMPLATE, complete=not missing)
        return draft.result()
    # llamafactory-cli runs torchrun itself: NPROC_PER_NODE x NNODES, or one process per visible device
    # (src/llamafactory/launcher.py); under USE_RAY=1 it starts no torchrun (cli.py main: torchrun only when
    # FORCE_TORCHRUN or `not use_ray()`) and Ray's TorchTrainer runs ScalingConfig(num_workers=ray_num_workers)
    # processes (train/trainer_utils.py get_ray_trainer; RayArguments in hparams/training_args.py: 1 by default).
    on = [str(cmd.env.get(k, "")).lower() in ("true", "y", "1") for k in ("USE_RAY", "FORCE_TORCHRUN")]
    if on == [True, False] and cmd.world_size is None:
        workers, where = opts.get("ray_num_workers", (1, "ray_num_workers default 1"))
        cmd.world_size, cmd.world_source = int_value(workers, where, "a number of Ray workers"), f"USE_RAY=1, {where}"
    world_from_env(draft, cmd, all_visible=cmd.launcher is None)
    _apply(draft, opts, cmd, bases)
    finish_world(draft, cmd)
    return draft.result()


def from_files(paths: list[str], versions: dict) -> FrontendResult:
    """A LLaMA-Factory YAML (and optionally the DeepSpeed JSON it names), or a launch script (.sh)."""
    scripts = [p for p in paths if p.endswith(".sh") or is_launch_script(p)]
    if scripts:
        cmd = split_command(command_from_script(scripts[0]))
        cmd.args += [a for a in paths if a not in scripts]
        return from_command(cmd, versions)
    draft = Draft(NAME, versions)
    opts, bases = _read(None, paths, draft)
    if "export_dir" in opts:  # an export config (examples/merge_lora/*.yaml): `llamafactory-cli export` reads it
        exports.read(draft, opts, f"llamafactory-cli export {' '.join(paths)}",
                     llama_factory_vision.VLM_TEMPLATE)
        return draft.result()
    _apply(draft, opts, None, bases)
    finish_world(draft, None)
    return draft.result()


MARKERS = frozenset({"finetuning_type", "lora_target", "template", "stage"})


def _recognise(view) -> bool:
    if view.cli in ("llamafactory-cli", "lmf") or view.runs("llamafactory") or view.runs("llmtuner"):
        return True
    if view.yaml_keys & MARKERS:
        return True
    script = view.program.rsplit("/", 2)
    in_src = len(script) >= 2 and script[-2] == "src" and script[-1] in ("train.py", "train_bash.py")
    # src/train.py CONFIG.yaml (the file may not be here to peek into), or the flags of src/train_bash.py.
    return in_src and (any(p.endswith((".yaml", ".yml")) for p in view.positionals) or
                       len(view.flags & MARKERS) >= 2) or script[-1] == "train_bash.py" or \
        bool(llama_factory_keys.stage_script(view.program)) and "finetuning_type" in view.flags


FRAMEWORK = Framework(name=NAME, title="LLaMA-Factory", module="llama_factory", recognise=_recognise, flags=FLAGS,
                      log_paths=r"llamafactory[/\\]|llmtuner[/\\]|llamafactory-cli|LLaMA-Factory",
                      file_markers=MARKERS, depends=DEPENDS, dated=True,
                      aliases=("llamafactory", "llama_factory"),
                      mitigations=(llama_factory_vision.FAKE_IMAGE, QUANT_STORAGE,
                                   *moe_blocks.mitigations(NAME)))
