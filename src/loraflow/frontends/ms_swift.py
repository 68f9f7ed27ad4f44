"""ms-swift: `swift sft|pt ...` and `swift rlhf --rlhf_type dpo|grpo|ppo|kto ...`, usually with
`CUDA_VISIBLE_DEVICES=... NPROC_PER_NODE=N` in front (swift starts torchrun itself when NPROC_PER_NODE is set).

ms-swift checkpoints by default and patches torch.utils.checkpoint so that, unless gradient_checkpointing_kwargs
says otherwise, use_reentrant is False for plain multi-process DDP and True everywhere else (single process,
DeepSpeed, FSDP) (swift/trainers/mixin.py _fix_gradient_checkpointing). It always adds the input-grad hook.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from loraflow.errors import LoraflowError
from loraflow.frontends import deepspeed, keys, liger, ms_swift_megatron
from loraflow.frontends import ms_swift_export as exports
from loraflow.frontends import ms_swift_vllm as rollouts
from loraflow.frontends.ms_swift_vision import image_text
from loraflow.frontends.ms_swift_checkpointing import ARGS, checkpointing, unused_parameters_default
from loraflow.frontends.kbit_facts import storage_honoured
from loraflow.frontends.argv import (
    Command,
    parse_flags,
    resolve_path,
    split_command,
    visible_devices,
)
from loraflow.frontends.shell import command_from_script
from loraflow.frontends import moe_blocks
from loraflow.frontends.base import Framework, FrontendResult, Mitigation
from loraflow.frontends.accelerate_options import apply_accelerate, apply_fsdp_options
from loraflow.frontends.trainer_checkpoints import trainer_checkpoints
from loraflow.frontends.common import (
    Draft,
    as_bool,
    as_list,
    at_least,
    embedding_targets,
    finish_world,
    int_value,
    load_mapping,
    mapping_value,
    precision_from,
    trainer_dtypes,
    world_from_env,
)
from loraflow.frontends.table import (
    Default,
    Field,
    apply_table,
    at_stage,
    empty_targets,
    fact,
    parameter_targets,
    stages,
    steps,
    switch,
    weight_reading_init,
)

NAME = "ms-swift"
# --rlhf_type -> loraflow stage (kto, orpo, simpo, cpo, gkd through table.STAGE_ALIASES).
RLHF = stages("dpo", "grpo", "ppo", "rm", "kto", "orpo", "simpo", "cpo", "gkd")
# Combination field -> the ms-swift flag that changes it (also read by `loraflow explain` through flags_for).
FLAGS = {**exports.FLAGS, "checkpointing": "--gradient_checkpointing",
         "fsdp_state_dict": "state_dict_type in the --fsdp JSON's fsdp_config", "resumes": "--resume_from_checkpoint",
         "reentrant": "--gradient_checkpointing_kwargs '{\"use_reentrant\": ...}'",
         "zero_stage": "--deepspeed (zero2, zero3, zero3_offload, ...)",
         "offload": "--deepspeed zero2_offload / zero3_offload", "engine": "--deepspeed / --fsdp",
         "adapter": "--tuner_type / --use_dora", "precision": "--torch_dtype / --bf16",
         "quantization": "--quant_bits", "quant_storage_matches": "--bnb_4bit_quant_storage",
         "matched_modules": "--target_modules", "packing": "--packing / --padding_free",
         "find_unused_parameters": "--ddp_find_unused_parameters", "ddp_static_graph": "--ddp_static_graph",
         "generation_gather": "--ds3_gather_for_generation", "embeddings_trainable": "--modules_to_save",
         "lm_head_trainable": "--modules_to_save", "world_size": "NPROC_PER_NODE",
         "grad_accum_steps": "--gradient_accumulation_steps",
         "targets_all_towers": "--target_modules", "towers_trainable": "--freeze_vit / --freeze_aligner",
         "unsloth": "--tuner_backend", "adapter_reads_base": "--init_weights / --target_parameters",
         "image_safe_truncation": "--max_length / MAX_PIXELS", **rollouts.VLLM_FLAGS}
_HANDLED = {"train_type", "tuner_type", "sft_type", "use_dora", "target_modules", "modules_to_save",
            "gradient_checkpointing", "gradient_checkpointing_kwargs", "deepspeed", "fsdp", "fsdp_config",
            "torch_dtype", "bf16", "fp16", "quant_bits", "quant_method", "bnb_4bit_quant_storage", "packing",
            "padding_free", "ddp_find_unused_parameters", "ddp_static_graph", "use_vllm", "ds3_gather_for_generation",
            "rlhf_type", "model", "model_id_or_path", "vllm_mode", "vllm_enable_lora", "vllm_gpu_memory_utilization",
            "sleep_level", "offload_model", "lora_rank", "activation_cpu_offload"}


def _first(value: Any) -> Any:
    return value[0] if isinstance(value, list) and len(value) == 1 else value


def _accessors(opts: dict[str, tuple[Any, str]]):
    """get, src and on over ms-swift's options; every flag is parsed as a list (nargs), so one value is unwrapped."""
    def get(name: str, default: Any = None) -> Any:
        return _first(opts[name][0]) if name in opts else default

    def src(name: str) -> str:
        return opts[name][1]

    def on(name: str, default: bool = False) -> bool:
        return as_bool(get(name), src(name)) if name in opts else default
    return get, src, on


def _stage(draft: Draft, opts: dict, sub: str, program: str = "swift") -> None:
    get, src, on = _accessors(opts)
    if sub == "rlhf":
        kind = str(get("rlhf_type", "dpo"))
        if kind not in RLHF:
            raise LoraflowError(f"--rlhf_type {kind}: not one loraflow reads ({', '.join(RLHF)}).")
        draft.set("stage", RLHF[kind], src("rlhf_type") if "rlhf_type" in opts else
                  "default (ms-swift swift/arguments/rlhf_args.py: rlhf_type dpo)")
        if RLHF[kind] != kind:
            draft.note(f"rlhf_type {kind} is read as stage {RLHF[kind]}")
    else:
        draft.set("stage", "sft", f"{program} {sub}")


def _engine(draft: Draft, opts: dict) -> dict[str, Any]:
    """--deepspeed (a preset name or a JSON) or --fsdp (the fsdp2 preset or a JSON); returns deepspeed.apply's info."""
    get, src, on = _accessors(opts)
    info: dict[str, Any] = {}
    if get("deepspeed"):
        ref = str(get("deepspeed"))
        ds = deepspeed.read(ref, "--deepspeed", (), names=deepspeed.SWIFT_NAMES)
        info = deepspeed.apply(draft, ds)
        if ref == "default-zero3" and not at_least(draft, "ms-swift", "1.5.4"):
            # The preset gained stage3_gather_16bit_weights_on_model_save in v1.5.4 (swift/llm/ds_config/zero3.json).
            info["gather"] = False
    if get("fsdp"):
        ref = str(get("fsdp"))
        if ref == "fsdp2":  # swift/config/fsdp2.json: FSDP2 with activation_checkpointing (swift/arguments/sft_args.py)
            options = {"version": 2, "activation_checkpointing": True}
            label = "--fsdp fsdp2 (swift/config/fsdp2.json)"
        else:
            if not Path(ref).is_file():
                raise LoraflowError(f"--fsdp {ref}: neither the preset fsdp2 nor an existing FSDP config JSON.")
            data = load_mapping(ref, "--fsdp")
            options = {str(k).removeprefix("fsdp_"): v for k, v in
                       mapping_value(data.get("fsdp_config"), f"{ref}: fsdp_config").items()}
            label = src("fsdp")
        version = int_value(options.get("version", 2), f"{label}: fsdp_version", "an FSDP version", (1, 2))
        draft.set("engine", "fsdp2" if version == 2 else "fsdp1", label)
        apply_fsdp_options(draft, options, label)
        trainer_checkpoints(draft, {n: (get(n), src(n)) for n in ("resume_from_checkpoint", "load_best_model_at_end")
                                    if n in opts}, True)
    return info


def _precision(draft: Draft, opts: dict, info: dict) -> str | None:
    """Mixed precision follows torch_dtype: bfloat16 -> bf16, float16/float32 -> fp16
    (swift/arguments/base_args/model_args.py _init_mixed_precision); unset, the model's own dtype decides.
    Returns --torch_dtype."""
    get, src, on = _accessors(opts)
    dtype = str(get("torch_dtype", "")) or None
    bf16 = on("bf16", default=dtype == "bfloat16") if "bf16" in opts or dtype else None
    fp16 = on("fp16", default=dtype in ("float16", "float32")) if "fp16" in opts or dtype else None
    hf = src("bf16") if "bf16" in opts else src("fp16") if "fp16" in opts else (src("torch_dtype") if dtype else "")
    if bf16 is None and fp16 is None:
        bf16, fp16, hf = True, False, "default (ms-swift: torch_dtype from the model config, bfloat16 for most LLMs)"
        draft.note("--torch_dtype not given: ms-swift takes the model's dtype; assumed bfloat16 (bf16 mixed precision)")
    if info:
        deepspeed.resolve_precision(draft, info, src("deepspeed"), bool(bf16), bool(fp16), hf)
    if not draft.has("precision"):
        draft.set("precision", precision_from(bool(bf16), bool(fp16)), hf)
    return dtype


def _full_in_half(draft: Draft, opts: dict, dtype: str | None) -> None:
    """Full fine-tuning trains the weights in the dtype --torch_dtype loads them in: prepare_model
    (swift/llm/train/tuner.py in 3.x, swift/llm/sft.py in 2.x) only calls model.requires_grad_(True) for full, and
    casts trainable fp16 parameters to fp32 for adapters alone. Under DDP or one process the HF Trainer's autocast
    keeps no fp32 copy, so bfloat16 trains pure bf16 weights (float16 is not: 2.x's _init_mixed_precision loads a
    full run in fp32 instead, "Fine-tuning with full parameters does not support fp16"). DeepSpeed keeps fp32 master
    weights and FSDP is read by its own options (puzhiyuan/AiO train_ddp.sh: `--train_type full --torch_dtype
    bfloat16` on 8 processes without --deepspeed)."""
    if draft.get("adapter") != "full" or draft.has("engine") or (dtype, draft.get("precision")) != \
            ("bfloat16", "bf16-mixed"):
        return
    draft.set("precision", "bf16", f"{_accessors(opts)[1]('torch_dtype')} with --train_type full and no --deepspeed: "
              "the weights train in bfloat16 without an fp32 copy (swift/llm/train/tuner.py prepare_model)")


def _adapter(draft: Draft, opts: dict, dtype: str | None) -> None:
    get, src, on = _accessors(opts)
    ttype_name = next((n for n in ("tuner_type", "train_type", "sft_type") if n in opts), None)
    ttype = str(get(ttype_name)) if ttype_name else "lora"
    tsrc = src(ttype_name) if ttype_name else "default (ms-swift swift/arguments/base_args/base_args.py: lora)"
    if ttype == "full":
        draft.set("adapter", "full", tsrc)
    else:
        draft.set("adapter", "dora" if on("use_dora") else "lora", f"{tsrc} + {src('use_dora')}" if on("use_dora")
                  else tsrc)
        if ttype not in ("lora", "longlora"):
            draft.note(f"tuner_type {ttype} is read like LoRA (frozen base weights, small trained modules)")
    apply_table(draft, opts, (Field("matched_modules", ("target_modules",), empty_targets, suffix=" (empty)"),))
    if "target_modules" in opts:
        liger.head_adapter(draft, opts["target_modules"][0], src("target_modules"))
    if on("use_liger_kernel") and (draft.get("stage") == "grpo" or not at_least(draft, "transformers", "4.45.0")
                                   or at_least(draft, "transformers", "4.49.0")):
        # ms-swift patches the model type itself before transformers 4.45, else leaves it to the Trainer (a PEFT
        # model from 4.49); its GRPO loss passes lm_head.weight (swift/trainers/rlhf_trainer/grpo_trainer.py).
        liger.fused(draft, src("use_liger_kernel"))
    if "modules_to_save" in opts:
        embedding_targets(draft, as_list(opts["modules_to_save"][0]), src("modules_to_save"),
                          str(get("model") or get("model_id_or_path") or ""))
    bits = get("quant_bits")
    if bits is not None and str(get("quant_method", "bnb")) == "bnb":
        bits = int_value(bits, src("quant_bits"), "a number of bits")
        draft.set("quantization", "4bit" if bits == 4 else "8bit", src("quant_bits"))
        storage = get("bnb_4bit_quant_storage")
        same = storage is not None and storage == (dtype or "bfloat16")
        # The flag reaches the weights only from transformers 4.39 / bitsandbytes 0.43 (kbit_facts).
        draft.set("quant_storage_matches", same and storage_honoured(draft),
                  src("bnb_4bit_quant_storage") + ("" if not same or storage_honoured(draft) else
                                                   ", unused before transformers 4.39 / bitsandbytes 0.43")
                  if storage else "default (bnb_4bit_quant_storage unset: uint8, "
                  "swift/arguments/base_args/quant_args.py)")


def _rollouts(draft: Draft) -> bool:
    return draft.get("stage") in ("grpo", "ppo")


# What ms-swift's Trainer flags set once the model, engine and checkpointing are known.
_TRAINER = (
    fact("use_cache", False, "ms-swift sets config.use_cache = False for training (swift/trainers/mixin.py)"),
    Field("packing", ("packing",), switch),
    Field("packing", ("padding_free",), switch),
    Field("find_unused_parameters", ("ddp_find_unused_parameters",), default=unused_parameters_default),
    Field("ddp_static_graph", ("ddp_static_graph",), switch),
    fact("accumulation_loop", "hf-trainer", "ms-swift trains with the HF Trainer (swift/trainers)"),
    # --tuner_backend unsloth loads and patches the model with Unsloth (swift/llm/model/register.py).
    Field("unsloth", ("tuner_backend",), lambda v, w: True if str(v).lower() == "unsloth" else None),
    # --init_weights passes PEFT's init_lora_weights; --target_parameters its target_parameters (swift/arguments).
    Field("adapter_reads_base", ("init_weights",), weight_reading_init),
    Field("adapter_reads_base", ("target_parameters",), parameter_targets),
    Field("generation", ("use_vllm",), lambda v, w: False if as_bool(v, w) else None, when=_rollouts,
          suffix=" (rollouts come from vLLM)"),
    fact("generation", True, "default (ms-swift swift/rlhf_trainers/args_mixin.py: use_vllm false, model.generate)",
         when=lambda d: _rollouts(d) and not d.has("generation")),
    Field("generation_gather", ("ds3_gather_for_generation",), when=lambda d: _rollouts(d) and d.get("generation"),
          default=Default(True, f"default (ms-swift {ARGS}: ds3_gather_for_generation true)")),
    fact("forwards_per_step", 1, "concatenated_forward (swift/rlhf_trainers/dpo_trainer.py)", when=at_stage("dpo")),
)


def _accumulation(opts: dict) -> Field:
    """ms-swift 3 fills an unset --gradient_accumulation_steps so a step sees 16 samples: ceil(16 / per-device batch
    / processes) (swift/trainers/arguments.py TrainArgumentsMixin.__post_init__)."""
    def default(draft: Draft) -> tuple[int, str] | None:
        if "world_size" in draft.unsure or not at_least(draft, "ms-swift", "3.0.0"):
            return None
        batch = steps(_first(opts.get("per_device_train_batch_size", (1, ""))[0]), "--per_device_train_batch_size")
        batch, world = batch or 1, draft.get("world_size")
        return max(1, math.ceil(16 / batch / world)), (f"default (ms-swift swift/trainers/arguments.py: ceil(16 / "
                                                        f"per-device batch {batch} / {world} processes))")
    return Field("grad_accum_steps", ("gradient_accumulation_steps",), steps, default=default)


def _train_mode_and_save(draft: Draft, opts: dict, info: dict) -> None:
    get, src, on = _accessors(opts)
    if draft.get("stage") == "grpo" and draft.get("generation") and not at_least(draft, "ms-swift", "3.1.1"):
        # GRPO's PT-engine rollouts put the policy in eval mode; train() after them came with v3.1.1 (issue #3107).
        draft.set("train_mode_at_backward", False, "ms-swift < 3.1.1 GRPO without vLLM leaves the policy in eval mode "
                  "after generating (swift/trainers/rlhf_trainer/grpo_trainer.py; fixed after issue #3107)")
    else:
        draft.set("train_mode_at_backward", True, "Trainer.training_step calls model.train()")
    if draft.get("engine") == "deepspeed" and draft.get("zero_stage") == 3:
        gather = at_least(draft, "transformers", "5.0.0") or deepspeed.gather_on_save(draft, info)
        why = ("ms-swift gathers the trainable ZeRO-3 params on save (swift/trainers/mixin.py "
               "_fix_zero3_gather_all_parameters) when the DeepSpeed config gathers 16-bit weights" if gather else
               f"{src('deepspeed')}: stage3_gather_16bit_weights_on_model_save false")
        draft.set("adapter_save_gather", gather, why)


def _apply(draft: Draft, opts: dict[str, tuple[Any, str]], sub: str, cmd: Command | None) -> None:
    _stage(draft, opts, sub, "megatron" if cmd is not None and ms_swift_megatron.subcommand(cmd) else "swift")
    _eras(draft, opts, sub, cmd)
    if cmd is not None and ms_swift_megatron.subcommand(cmd):
        ms_swift_megatron.apply(draft, opts, sub)
        _adapter(draft, opts, None)
        image_text(draft, *_accessors(opts), opts)
        _unknown(draft, opts, ms_swift_megatron.KEYS)
        return
    if cmd is not None and cmd.launcher == "accelerate":
        # `accelerate launch --config_file fsdp_offload.json swift/cli/sft.py ...` (examples/train/multi-gpu/
        # fsdp_qlora): the accelerate config picks the engine and the process count; --deepspeed / --fsdp still win.
        apply_accelerate(draft, cmd)
    info = _engine(draft, opts)
    dtype = _precision(draft, opts, info)
    _adapter(draft, opts, dtype)
    _full_in_half(draft, opts, dtype)
    checkpointing(draft, opts, _accessors(opts))
    apply_table(draft, {k: (_first(v), where) for k, (v, where) in opts.items()}, _TRAINER + (_accumulation(opts),))
    _train_mode_and_save(draft, opts, info)
    rollouts.apply(draft, *_accessors(opts), {k: (_first(v), where) for k, (v, where) in opts.items()},
                   visible_devices(cmd) if cmd is not None else (None, None))
    image_text(draft, *_accessors(opts), opts)
    _unknown(draft, opts)
    trainer_dtypes(draft, draft.get("precision") != "fp32", "ms-swift loads the model in --torch_dtype")
    draft.flag(**FLAGS)


def _unknown(draft: Draft, opts: dict[str, tuple[Any, str]], more: frozenset = frozenset()) -> None:
    for name, (value, source) in opts.items():
        if name not in _HANDLED | keys.MS_SWIFT | keys.HF_TRAINER | keys.MS_SWIFT_V2 | _V2_RLHF_KEYS | more:
            draft.unknown.append(source)


# What a flag's spelling says about the release (ms-swift's git history). --model_type dates nothing: 2.x named the
# model by it, and 3.x and 4.x keep it to name the model's group (swift/llm/argument/base_args/model_args.py).
_ERAS = (("sft_type", "<3.0.0"), ("model_id_or_path", "<3.0.0"),
         ("train_type", ">=3.0.0,<4.1.0"), ("tuner_type", ">=4.0.0"), ("ds3_gather_for_generation", ">=3.1.1"),
         ("vllm_mode", ">=3.5.0"), ("rollout_importance_sampling_mode", ">=3.11.0"))
DEPENDS = (("ms-swift", "<2.0.0", {"transformers": "<4.41"}), ("ms-swift", ">=2.0.0,<3.0.0", {"transformers": "<4.48"}),
           ("ms-swift", ">=3.0.0,<4.0.0", {"transformers": "<4.58"}))


def _eras(draft: Draft, opts: dict, sub: str, cmd: Command | None) -> None:
    draft.eras_from("ms-swift", "ms-swift", _ERAS, opts, prefix="--")
    preset = str(_first(opts["deepspeed"][0])) if "deepspeed" in opts else ""
    if preset.startswith("default-zero"):
        draft.era("ms-swift", ">=1.5.0,<3.0.0", f"--deepspeed {preset} is the preset name of ms-swift 1.5 - 2.x")
    elif preset in deepspeed.SWIFT_NAMES:
        draft.era("ms-swift", ">=3.0.0", f"--deepspeed {preset} is the preset name from ms-swift 3.0")
    if "model" in opts:
        draft.era("ms-swift", ">=3.0.0", "--model replaced --model_id_or_path in ms-swift 3.0")
    if str(_first(opts.get("rlhf_type", ("",))[0])) == "grpo":
        draft.era("ms-swift", ">=3.1.0", "--rlhf_type grpo exists from ms-swift 3.1")


def from_command(cmd: Command, versions: dict) -> FrontendResult:
    draft = Draft(NAME, versions)
    # `swift sft`, `python -m swift.cli.sft`, `swift/cli/sft.py`, ms-swift 2.x's examples/pytorch/llm/llm_sft.py
    sub = (cmd.subcommand or Path(cmd.program.replace(".", "/").removesuffix("/py")).name).removeprefix("llm_")
    args_in = list(cmd.args)
    megatron = ms_swift_megatron.subcommand(cmd)
    if megatron and not cmd.subcommand:  # `megatron sft ...`: the console script's subcommand is its first word
        sub, args_in = megatron, args_in[1:]
    if sub in _V2_RLHF:
        # ms-swift 2.x routed `swift dpo|orpo|simpo` to its rlhf entry with `--rlhf_type NAME` in front (swift/cli/
        # main.py cli_main); 3.0 dropped these subcommands.
        draft.era("ms-swift", "<3.0.0", f"`swift {sub}` exists in ms-swift < 3.0")
        args_in = ["--rlhf_type", sub, *args_in] if "--rlhf_type" not in args_in else args_in
        sub = "rlhf"
    if sub in exports.SUBCOMMANDS:  # a load of the trained adapter (and a merge), not a training run
        exports.read(cmd, draft, sub, args_in)
        return draft.result()
    if sub not in ("sft", "pt", "rlhf"):
        raise LoraflowError(f"`{cmd.describe()}`: loraflow check reads `swift sft`, `swift pt` and `swift rlhf`, and "
                            "the runs that load or merge their adapters: `swift export`, `swift merge-lora`, "
                            "`swift infer`, `swift deploy`.")
    args, positionals, _ = parse_flags(args_in, lists=keys.MS_SWIFT | keys.MS_SWIFT_V2 | keys.HF_TRAINER | _HANDLED |
                                       set(_V2_NAMES) | ms_swift_megatron.KEYS)
    for pos in positionals:
        draft.unknown.append(f"{pos} (positional argument)")
    opts: dict[str, tuple[Any, str]] = {}
    for a in args:
        if a.name == "config":  # --config file.yaml holds the same keys
            found = resolve_path(str(_first(a.value)))
            if found is None:  # a file elsewhere or `$1`: its keys are unseen (exit 1), not a refusal
                draft.unknown.append(f"--config {_first(a.value)}: not here, so only the command's flags were read")
                continue
            for key, value in load_mapping(str(found), "--config").items():
                if value is not None:
                    opts.setdefault(key, (value, f"{_first(a.value)}: {key}"))
            continue
        # Every name is parsed as a list (nargs); a flag with nothing after it is a bare switch: `--use_dora`.
        opts[a.name] = (True if a.value == [] else a.value, a.raw)
    _v2_spellings(opts)
    # swift runs one process unless NPROC_PER_NODE is set; several visible devices without it means device_map
    # model parallelism in one process (swift/cli/main.py).
    world_from_env(draft, cmd, all_visible=False)
    if cmd.world_size is None and cmd.launcher is None:
        cmd.world_size, cmd.world_source = 1, "one process: NPROC_PER_NODE not set (swift/cli/main.py)"
    if cmd.world_size:
        draft.set("world_size", cmd.world_size, cmd.world_source or "")
    _apply(draft, opts, sub, cmd)
    finish_world(draft, cmd)
    return draft.result()


def from_files(paths: list[str], versions: dict) -> FrontendResult:
    """A launch script with `swift sft|rlhf ...`: ms-swift is configured by flags only, so the file is read for its
    launch line whatever its name (a .sh, a notebook cell saved as text), as DeepSpeed-Chat's scripts are."""
    if len(paths) != 1:
        raise LoraflowError("--framework ms-swift takes one launch script (e.g. a .sh holding `swift sft ...`); or "
                            "give the command after `--`.")
    return from_command(split_command(command_from_script(paths[0])), versions)


# ms-swift < 3.0 names for arguments 3.0 renamed (swift/llm/utils/argument.py, v2.6.0): --quantization_bit,
# --lora_target_modules (ALL: every linear layer), --dtype bf16|fp16|fp32|AUTO (AUTO: the model's own dtype).
_V2_NAMES = {"quantization_bit": "quant_bits", "lora_target_modules": "target_modules", "dtype": "torch_dtype"}
_V2_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
# `swift dpo` / `swift rlhf` < 3.0: RLHFArguments' own fields that say nothing about the rules (the prompt's length
# cap, the reference model's id, the SFT loss weight; swift/llm/utils/argument.py of 2.x). Seen in users' DPO launches
# (`swift dpo --max_prompt_length 512`, copied from ms-swift's 2.x examples/pytorch/llm/scripts/dpo).
_V2_RLHF_KEYS = frozenset({"max_prompt_length", "ref_model_id_or_path", "ref_model_free", "sft_beta"})


def _v2_spellings(opts: dict[str, tuple[Any, str]]) -> None:
    for old, new in _V2_NAMES.items():
        if old not in opts or new in opts:
            continue
        value, where = opts.pop(old)
        if old == "lora_target_modules" and str(_first(value)).upper() == "ALL":
            value = ["all-linear"]
        if old == "dtype":
            if str(_first(value)).upper() == "AUTO":
                continue  # the model's own dtype, as when --torch_dtype is not given
            value = [_V2_DTYPES.get(str(_first(value)), str(_first(value)))]
        opts[new] = (value, where)


# The rlhf methods ms-swift 2.x also ran as subcommands of their own (`swift dpo`, examples' llm_dpo.py).
_V2_RLHF = ("dpo", "orpo", "simpo")
# ms-swift 2.x's example entry points (examples/pytorch/llm/llm_sft.py: `from swift.llm import sft_main`), told apart
# from other frameworks' scripts of the same name by a flag only ms-swift 2.x has.
_V2_SCRIPT = re.compile(r"(^|/)llm_(sft|pt|rlhf|dpo|orpo|simpo)\.py$")
_V2_FLAGS = {"sft_type", "model_id_or_path", "template_type"}


def _recognise(view) -> bool:
    return view.cli == "swift" or view.runs("swift") or bool(_V2_SCRIPT.search(view.program) and
                                                               view.flags & _V2_FLAGS) or \
        ms_swift_megatron.recognise(view)


# `swift export --merge_lora true` (and merge-lora, infer --merge_lora) of a QLoRA adapter (ms_swift_export.py).
QLORA_MERGE = Mitigation(("kbit-merge",), "3.7.0", "the merge loads the base unquantized whatever the line or the "
                         "checkpoint's args.json quantizes it with", "swift/llm/export/merge_lora.py merge_lora: "
                         "args.quant_method = None (PR #5190)")
FRAMEWORK = Framework(name=NAME, title="ms-swift", module="ms_swift", recognise=_recognise, flags=FLAGS,
                      log_paths=r"[/\\]swift[/\\](llm|trainers|cli|rlhf_trainers)[/\\]|swift (sft|rlhf)",
                      depends=DEPENDS, dated=True, aliases=("swift", "ms_swift"),
                      mitigations=(rollouts.SLEEP2_BASE_SYNC, QLORA_MERGE, *moe_blocks.mitigations(NAME)))
