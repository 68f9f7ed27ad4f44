"""Axolotl: a config YAML on its own, `axolotl train config.yml [--key value ...] [-- launcher args]`,
`accelerate launch -m axolotl.cli.train config.yml`, or `python -m axolotl.cli.train config.yml`.

Axolotl fills gradient_checkpointing_kwargs itself: `{use_reentrant: true}` for SFT-style runs without
unfrozen_parameters (src/axolotl/utils/config/__init__.py normalize_config), `{use_reentrant: false}` for RL
(src/axolotl/core/builders/base.py); adapters always get enable_input_require_grads() (src/axolotl/loaders/adapter.py).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from loraflow.errors import LoraflowError
from loraflow.frontends import deepspeed, keys, liger, vision
from loraflow.frontends.argv import (
    Command,
    _launcher_options,
    _world_from_launcher,
    parse_bool,
    parse_flags,
    resolve_path,
    split_command,
)
from loraflow.frontends.shell import command_from_script
from loraflow.frontends import moe_blocks
from loraflow.frontends.base import Framework, FrontendResult, Mitigation
from loraflow.frontends.accelerate_options import apply_accelerate, apply_fsdp_options
from loraflow.frontends.trainer_checkpoints import trainer_checkpoints
from loraflow.frontends.targets import check_targets
from loraflow.frontends.common import (
    STAGE_IN_NAME,
    Draft,
    accessors,
    as_bool,
    as_list,
    at_least,
    embedding_targets,
    finish_world,
    int_value,
    mapping_value,
    mitigated,
    read_keyed_files,
    trainer_dtypes,
)
from loraflow.frontends.model_types import model_name_facts
from loraflow.frontends.intent import TOWER_MODULE
from loraflow.frontends.axolotl_checkpointing import checkpointing
from loraflow.frontends.table import (
    Field,
    apply_table,
    at_stage,
    fact,
    parameter_targets,
    stages,
    steps,
    switch,
    weight_reading_init,
)

NAME = "axolotl"
# `rl:` -> loraflow stage (the preference objectives and ebft through table.STAGE_ALIASES).
_RL = stages("dpo", "ipo", "orpo", "kto", "simpo", "gdpo", "grpo", "ebft")
# Combination field -> the Axolotl config key that changes it (also read by `loraflow explain` through flags_for).
FLAGS = {"checkpointing": "gradient_checkpointing", "reentrant": "gradient_checkpointing_kwargs: {use_reentrant: ...}",
         "fsdp_state_dict": "fsdp_config.fsdp_state_dict_type",
         "resumes": "resume_from_checkpoint / auto_resume_from_checkpoints / load_best_model_at_end",
         "zero_stage": "deepspeed (e.g. deepspeed_configs/zero2.json)", "engine": "deepspeed / fsdp / fsdp_version",
         "adapter": "adapter / peft_use_dora", "precision": "bf16 / fp16", "quantization": "load_in_4bit",
         "matched_modules": "lora_target_modules / lora_target_linear", "packing": "sample_packing",
         "find_unused_parameters": "ddp_find_unused_parameters", "embeddings_trainable": "lora_modules_to_save",
         "lm_head_trainable": "lora_modules_to_save", "weight_tying_enforced": "peft_ensure_weight_tying",
         "offload": "deepspeed offload config / fsdp_config.offload_params",
         "fsdp_use_orig_params": "fsdp_config.use_orig_params", "world_size": "accelerate --num_processes",
         "grad_accum_steps": "gradient_accumulation_steps", "optimizer_8bit": "optimizer (a 32-bit one: adamw_torch)",
         "saves_optimizer_state": "save_only_model",
         "adapter_save_gather": "gather_16bit_weights_on_model_save in the DeepSpeed JSON",
         "targets_all_towers": "lora_target_linear / lora_target_modules", "image_safe_truncation": "sequence_len",
         "adapter_reads_base": "peft_init_lora_weights / lora_target_parameters"}
_CLI = {"launcher", "cloud", "use_exec", "no_use_exec", "accelerate", "no_accelerate", "debug", "shard", "sweep"}


def _stage(draft: Draft, cfg: dict) -> None:
    get, src, on = accessors(cfg)
    rl = get("rl")
    if rl:
        if str(rl) not in _RL:
            raise LoraflowError(f"{src('rl')}: `{rl}` is not an Axolotl rl type ({', '.join(_RL)}).")
        draft.set("stage", _RL[str(rl)], src("rl"))
    else:
        draft.set("stage", "rm" if get("reward_model") else "sft", src("reward_model") if get("reward_model") else
                  "default (no rl: supervised fine-tuning)")


def _engine(draft: Draft, cfg: dict, cmd: Command | None, bases: list) -> tuple[dict, dict, str]:
    """accelerate's config, `deepspeed:` and `fsdp:` / `fsdp_config:`. Returns (accelerate's leftovers,
    deepspeed.apply's info, the DeepSpeed config's label)."""
    get, src, on = accessors(cfg)
    acc = apply_accelerate(draft, cmd, tuple(bases)) if cmd is not None and cmd.launcher == "accelerate" else {}
    info: dict[str, Any] = {}
    label = ""
    if get("deepspeed"):
        ds = deepspeed.read(get("deepspeed"), src("deepspeed"), tuple(bases))
        info, label = deepspeed.apply(draft, ds), ds.label
    fsdp_cfg = mapping_value(get("fsdp_config"), src("fsdp_config") if "fsdp_config" in cfg else "fsdp_config")
    if get("fsdp") or fsdp_cfg:
        options = {str(k).removeprefix("fsdp_"): v for k, v in fsdp_cfg.items()}
        where = src("fsdp_version") if "fsdp_version" in cfg else (f"{src('fsdp_config')}.fsdp_version" if
                                                                  "fsdp_config" in cfg else "fsdp_version")
        version = int_value(get("fsdp_version") or options.get("version") or 1, where, "an FSDP version", (1, 2))
        draft.set("engine", "fsdp2" if version == 2 else "fsdp1", src("fsdp_version") if "fsdp_version" in cfg else
                  (src("fsdp_config") if "fsdp_config" in cfg else src("fsdp")) + f" (FSDP{version})")
        if "offload" in as_list(get("fsdp")):
            draft.set("offload", True, src("fsdp"))
        apply_fsdp_options(draft, options, src("fsdp_config") if "fsdp_config" in cfg else src("fsdp"))
    trainer_checkpoints(draft, cfg, bool(get("fsdp") or fsdp_cfg))  # axolotl hands fsdp to TrainingArguments
    return acc, info, label


def _precision(draft: Draft, cfg: dict, info: dict, label: str) -> bool:
    """bf16 / fp16 (and DeepSpeed's sections). Returns whether bf16 trains."""
    get, src, on = accessors(cfg)
    # bf16: auto resolves to true on GPUs with bf16 (resolve_dtype in src/axolotl/utils/config/__init__.py).
    bf16 = get("bf16")
    bf = (bf16 == "auto" or on("bf16") or on("bfloat16")) and not on("fp16")
    fp = on("fp16") or on("float16")
    if bf16 == "auto" and not on("fp16"):
        draft.note("bf16: auto turns bf16 on when the GPU supports it (Ampere or newer): assumed it does")
    if info:
        deepspeed.resolve_precision(draft, info, label, bf, fp, "bf16/fp16 in the config")
    if not draft.has("precision") and (bf or fp):
        key = next(k for k in ("bf16", "bfloat16", "fp16", "float16") if k in cfg and (bf if "b" in k else fp))
        draft.set("precision", "bf16-mixed" if bf else "fp16-mixed", src(key))
    return bf


def _adapter(draft: Draft, cfg: dict, bf: bool) -> None:
    """adapter: lora / qlora (+ DoRA), its targets and extra trained modules, then load_in_4bit / 8bit."""
    get, src, on = accessors(cfg)
    adapter = get("adapter")
    if adapter in ("lora", "qlora"):
        dora = on("peft_use_dora")
        draft.set("adapter", "dora" if dora else "lora", f"{src('adapter')}" + (f" + {src('peft_use_dora')}" if dora
                                                                                   else ""))
        # load_adapter hooks the embedding output since v0.3.0 (PR #345); before, only k-bit preparation did.
        hooked = adapter == "qlora" or on("load_in_8bit") or mitigated(draft, "reentrant-frozen-inputs")
        draft.set("input_grad_hook", hooked, "load_adapter calls enable_input_require_grads() "
                  "(src/axolotl/loaders/adapter.py, since v0.3.0)" if hooked else "Axolotl < 0.3.0 hooks only "
                  "k-bit models (prepare_model_for_kbit_training)")
        targets = as_list(get("lora_target_modules"))
        if "lora_target_modules" in cfg and not targets and not on("lora_target_linear"):
            draft.set("matched_modules", 0, f"{src('lora_target_modules')} (empty, lora_target_linear off)")
        elif targets and not on("lora_target_linear"):
            check_targets(draft, str(get("base_model") or ""), targets, src("lora_target_modules"))
        if targets:
            liger.head_adapter(draft, targets, src("lora_target_modules"))
        if on("liger_fused_linear_cross_entropy"):  # LigerPlugin patches the model class before load
            liger.fused(draft, src("liger_fused_linear_cross_entropy"))
        if "lora_modules_to_save" in cfg:
            embedding_targets(draft, as_list(get("lora_modules_to_save")), src("lora_modules_to_save"),
                              str(get("base_model") or ""))
        for key, parse in (("peft_init_lora_weights", weight_reading_init),
                           ("lora_target_parameters", parameter_targets)):
            kind = parse(get(key), src(key)) if key in cfg else None
            if kind:  # passed to PEFT's LoraConfig (src/axolotl/loaders/adapter.py)
                draft.set("adapter_reads_base", kind, src(key))
        if on("peft_ensure_weight_tying"):
            draft.set("weight_tying_enforced", True, src("peft_ensure_weight_tying"))
    elif adapter:
        raise LoraflowError(f"{src('adapter')}: `{adapter}`: Axolotl adapters are lora and qlora.")
    else:
        draft.set("adapter", "full", "no adapter key: full fine-tuning")
    if on("load_in_4bit"):
        draft.set("quantization", "4bit", src("load_in_4bit"))
        # qlora: bnb_4bit_quant_storage=bfloat16 (src/axolotl/loaders/model.py), the model dtype when bf16 trains.
        draft.set("quant_storage_matches", bf, "Axolotl stores 4-bit weights as bfloat16 "
                  "(src/axolotl/loaders/model.py)")
    elif on("load_in_8bit"):
        draft.set("quantization", "8bit", src("load_in_8bit"))
    if get("unfrozen_parameters"):
        draft.set("frozen_modules", True, f"{src('unfrozen_parameters')}: every other weight stays frozen")
        # Regexes matched against parameter names (src/axolotl/utils/freeze.py freeze_layers_except): one naming the
        # embeddings (`^model.embed_tokens.weight$`) trains them, so their output requires grad.
        words = [w for p in as_list(get("unfrozen_parameters")) for w in re.findall(r"[A-Za-z_]\w*", str(p))]
        embedding_targets(draft, words, src("unfrozen_parameters"), str(get("base_model") or ""))


def _trainer(draft: Draft, cfg: dict) -> None:
    """The KV cache, packing, DDP's unused parameters and the preference forward."""
    get, src, on = accessors(cfg)
    # A key set to null counts as unset (accessors).
    apply_table(draft, {k: v for k, v in cfg.items() if v[0] is not None}, _TRAINER)
    if "ddp_find_unused_parameters" in cfg:
        draft.set("find_unused_parameters", on("ddp_find_unused_parameters"), src("ddp_find_unused_parameters"))
    elif draft.get("engine") not in ("deepspeed", "fsdp1", "fsdp2"):
        draft.set("find_unused_parameters", False, "default (Axolotl passes bool(ddp_find_unused_parameters) "
                  "under DDP, src/axolotl/core/builders/causal.py)")
    apply_table(draft, {}, _STEP)


_TRAINER = (
    fact("use_cache", False, "Axolotl sets config.use_cache = False (src/axolotl/loaders/utils.py)"),
    Field("packing", ("sample_packing",), switch),
    Field("grad_accum_steps", ("gradient_accumulation_steps",), steps),
    fact("accumulation_loop", "hf-trainer", "Axolotl trains with the HF Trainer (src/axolotl/core/trainers)"),
)
_STEP = (
    fact("forwards_per_step", 1, "TRL's DPOTrainer concatenates chosen and rejected (trl/trainer/dpo_trainer.py)",
         when=at_stage("dpo")),
)


def _rollouts_and_save(draft: Draft, cfg: dict, acc: dict, info: dict) -> None:
    get, src, on = accessors(cfg)
    if draft.get("stage") == "grpo":
        trl = mapping_value(get("trl"), src("trl") if "trl" in cfg else "trl")
        vllm = as_bool(trl.get("use_vllm", False), "trl.use_vllm")
        draft.set("generation", not vllm, "trl.use_vllm (rollouts from vLLM)" if vllm else
                  "default (Axolotl trl.use_vllm false: model.generate, src/axolotl/utils/schemas/trl.py)")
        if not vllm:
            draft.set("generation_gather", True, "TRL GRPOTrainer ds3_gather_for_generation default true "
                      "(trl/trainer/grpo_config.py)")
    draft.set("train_mode_at_backward", True, "Trainer.training_step calls model.train()")
    if draft.get("engine") == "deepspeed" and draft.get("zero_stage") == 3:
        new = at_least(draft, "transformers", "5.0.0")
        gather = new or deepspeed.gather_on_save(draft, info) or bool(acc.get("zero3_save_16bit_model"))
        draft.set("adapter_save_gather", gather, "transformers >= 5 Trainer.save_model consolidates the trainable "
                  "ZeRO-3 params (transformers trainer.py)" if new else
                  f"{info.get('gather_key', 'gather_16bit_weights_on_model_save')} in the DeepSpeed config")


def _apply(draft: Draft, cfg: dict[str, tuple[Any, str]], cmd: Command | None, bases: list) -> None:
    _eras(draft, cfg, cmd)
    _stage(draft, cfg)
    acc, info, label = _engine(draft, cfg, cmd, bases)
    bf = _precision(draft, cfg, info, label)
    _adapter(draft, cfg, bf)
    checkpointing(draft, cfg)
    _trainer(draft, cfg)
    _rollouts_and_save(draft, cfg, acc, info)
    _image_text(draft, cfg)
    for name, (value, source) in cfg.items():
        if name not in keys.AXOLOTL and name not in _CLI:
            draft.unknown.append(source)
    trainer_dtypes(draft, draft.get("precision") != "fp32", "Axolotl loads the model in bf16/fp16 when set")
    draft.flag(**FLAGS)


def _image_text(draft: Draft, cfg: dict[str, tuple[Any, str]]) -> None:
    """The image-text fields: the base model's name or `processor_type` (set only for multimodal models), then what
    the adapter targets reach. Axolotl loads multimodal models with their image-text auto class
    (src/axolotl/loaders/model.py _set_auto_model_loader)."""
    get, src, on = accessors(cfg)
    model = str(get("base_model") or "")
    model_name_facts(draft, model, src("base_model") if model else "")
    if not vision.recognise(draft, model, src("base_model") if model else "",
                            src("processor_type") if get("processor_type") else None):
        return
    if draft.get("adapter") == "full":
        frozen = get("unfrozen_parameters")
        if not frozen or any(TOWER_MODULE.search(str(p)) for p in as_list(frozen)):
            draft.set("towers_trainable", True, src("unfrozen_parameters") if frozen else
                      f"{draft.sources['adapter']}: full fine-tuning trains the vision tower too")
    elif on("lora_target_linear"):
        # find_all_linear_names collects the short name of every Linear in the whole model, vision blocks and
        # projector included, at every release (src/axolotl/loaders/adapter.py; utils/models.py before v0.10).
        why = f"{src('lora_target_linear')} (find_all_linear_names takes every Linear of the model, vision tower " \
              "included)"
        for name in ("targets_all_towers", "tower_adapters", "towers_trainable"):
            draft.set(name, True, why)
    elif "lora_target_modules" in cfg:
        targets = get("lora_target_modules")
        where = src("lora_target_modules")
        if isinstance(targets, str) and re.search(r"[\\^$*+?()\[\]|{}]", targets):
            # A regex string: PEFT matches it against full module paths, so it reaches only what it names.
            draft.set("targets_all_towers", False, f"{where} (a regex over full module paths)")
            if TOWER_MODULE.search(targets):
                draft.set("tower_adapters", True, f"{where} (names vision-tower modules)")
                draft.set("towers_trainable", True, f"{where} (adapters in the vision tower)")
        elif vision.targets_reach_towers(model, as_list(targets)):
            vision.targets_enter_tower(draft, where, ": short names are matched by PEFT against the whole model, "
                                       "the vision tower included", model)
    vision.tower_hook(draft)
    vision.data_unknowns(draft, "sequence_len")


# What a key or launch form says about the release (Axolotl's git history).
_ERAS = (("peft_use_dora", ">=0.5.0"), ("fsdp_version", ">=0.8.1"), ("activation_offloading", ">=0.12.0"))
DEPENDS = (("axolotl", ">=0.5.0,<0.5.1", {"deepspeed": "==0.15.3"}),
           ("axolotl", ">=0.5.1,<0.6.0", {"deepspeed": "==0.15.4"}),
           ("axolotl", ">=0.6.0,<0.8.0", {"deepspeed": "==0.16.1"}), ("axolotl", ">=0.10.0,<0.13.0",
                                                                     {"deepspeed": ">=0.17.0,<0.18"}),
           ("axolotl", ">=0.15.0", {"deepspeed": ">=0.18.6,<0.19.0"}),
           ("axolotl", "<0.14.0", {"transformers": "<5.0.0"}))


def _eras(draft: Draft, cfg: dict, cmd: Command | None) -> None:
    draft.eras_from("axolotl", "Axolotl", _ERAS, cfg)
    if cfg.get("rl", (None,))[0] == "grpo":
        draft.era("axolotl", ">=0.7.0", "rl: grpo exists in Axolotl >=0.7.0")
    if str(cfg.get("gradient_checkpointing", (None,))[0]) == "unsloth":
        draft.era("axolotl", ">=0.5.0,<0.12.0", "gradient_checkpointing: unsloth exists in Axolotl 0.5 - 0.11")
    if cmd is not None:
        if cmd.program == "axolotl":
            draft.era("axolotl", ">=0.6.0", "the `axolotl` command came in v0.6.0")
        elif cmd.program.endswith("finetune.py"):
            draft.era("axolotl", "<0.7.0", "scripts/finetune.py was removed in v0.7.0")


def _from_name(name: str, draft: Draft) -> dict[str, tuple[Any, str]]:
    """A config that is not on this machine (a launch pasted from elsewhere, `examples/llama-3/qlora.yml` of the
    repository): what its name says (the examples are named lora / qlora / fft / fsdp / zero3), the rest unseen,
    which the report lists as not understood (exit 1), instead of refusing the whole launch."""
    stem = Path(name).name.lower()
    said = f"{name} (not here; read from its name)"
    cfg: dict[str, tuple[Any, str]] = {}
    if "qlora" in stem:
        cfg.update(adapter=("qlora", said), load_in_4bit=(True, said))
        # The storage dtype follows bf16 (_adapter), which only the file says.
        draft.maybe("quant_storage_matches", {True: f"{name} trains in bf16 (4-bit weights stored as bfloat16)",
                                              False: f"{name} does not train in bf16"}, f"{name} is not here")
    elif "lora" in stem or "dora" in stem:
        cfg["adapter"] = ("lora", said)
        if "dora" in stem:
            cfg["peft_use_dora"] = (True, said)
    elif not re.search(r"fft|full", stem):
        draft.maybe("adapter", {"lora": f"{name} sets adapter: lora", "full": f"{name} sets no adapter"},
                    f"{name} is not here and its name does not say the adapter")
    if "fsdp" in stem:
        cfg["fsdp"] = (["full_shard", "auto_wrap"], said)
        if "fsdp2" in stem:
            cfg["fsdp_config"] = ({"fsdp_version": 2}, said)
    m = STAGE_IN_NAME.search(stem)
    if m and re.search(r"zero|ds", stem):
        cfg["deepspeed"] = (f"zero{next(g for g in m.groups() if g is not None)}.json", said)
    draft.unknown.append(f"{name}: not here, so only its name and the command's flags were read (run from the "
                         "directory the path is relative to)")
    return cfg


def _read(paths: list[str], draft: Draft) -> tuple[dict[str, tuple[Any, str]], list]:
    return read_keyed_files(paths, "Axolotl config")


# Entry points of src/axolotl/cli/ that do not train: a merge, inference, preprocessing, sharding, evaluation.
_NOT_TRAINING = ("merge_lora", "merge_sharded_fsdp_weights", "inference", "preprocess", "shard", "quantize",
                 "evaluate", "vllm_serve", "delinearize_llama4")


def _merge(draft: Draft, named: str) -> None:
    """A merge run (`axolotl merge-lora CFG`, `python -m axolotl.cli.merge_lora CFG`, scripts/finetune.py
    --merge_lora): it loads the base as the config says and merges the adapter into it. Since v0.4.0 the merge forces
    load_in_8bit/load_in_4bit off (src/axolotl/cli/merge_lora.py, PR #1086); before, a QLoRA config merged into the
    quantized base."""
    draft.note(f"{named} merges the trained adapter into the base; the config's training settings are read as well")
    if draft.get("quantization") is None:
        return
    if mitigated(draft, "kbit-merge"):
        draft.set("merge_into_quantized", False, f"{named}: axolotl >= 0.4.0 loads the base unquantized to merge "
                  "(cli/merge_lora.py: load_in_4bit = load_in_8bit = False)")
    else:
        draft.set("merge_into_quantized", True, f"{named}: axolotl < 0.4.0 loads the base as the config quantizes "
                  "it, then merge_and_unload")


def _cli_launcher(cmd: Command, cfg: dict[str, tuple[Any, str]], after: list[str]) -> None:
    """`axolotl train cfg.yml` runs `accelerate launch -m axolotl.cli.train` (src/axolotl/cli/main.py: --accelerate
    default True from 0.6.0, `--launcher accelerate|torchrun|python` default accelerate from 0.12.0), so the machine's
    default accelerate config decides the engine the YAML leaves open; what follows `--` goes to the launcher."""
    launcher = str(cfg.get("launcher", ("accelerate",))[0])
    if "no_accelerate" in cfg or str(cfg.get("accelerate", (True,))[0]).lower() in ("false", "0"):
        launcher = "python"
    if launcher in ("accelerate", "torchrun"):
        options, _ = _launcher_options(after, set()) if after else ([], 0)
        cmd.launcher, cmd.launcher_args = launcher, options
        _world_from_launcher(cmd)


def from_command(cmd: Command, versions: dict) -> FrontendResult:
    draft = Draft(NAME, versions)
    entry = cmd.program.rsplit(".", 1)[-1] if cmd.program_kind == "module" else None
    args, positionals, after = parse_flags(cmd.args)
    merge = (entry == "merge_lora" or (cmd.program_kind == "cli" and cmd.subcommand in ("merge-lora", "merge_lora"))
             or any(a.name == "merge_lora" and parse_bool(a.value, a.raw) for a in args))
    if not merge and ((cmd.program_kind == "cli" and cmd.subcommand != "train") or entry in _NOT_TRAINING):
        raise LoraflowError(f"`{cmd.describe()}`: loraflow check reads training and merge runs (axolotl train "
                            "CONFIG, axolotl merge-lora CONFIG, python -m axolotl.cli.train CONFIG).")
    args = [a for a in args if a.name != "merge_lora"]
    configs = [p for p in positionals if p.endswith((".yml", ".yaml"))]
    if not configs and positionals and "$" in positionals[0]:
        # `-m axolotl.cli.train $1` or `"$CONFIG_FILE" "$@"` (a wrapper script's arguments): the config is not
        # visible, read as one not here; what follows it is listed as unread
        configs = positionals[:1]
    elif not configs and not positionals and cmd.program_kind == "module":
        # a wrapper script's `-m axolotl.cli.train $1`: its argument expands to nothing here
        configs = ["(the config: the wrapper's argument)"]
    if len(configs) != 1:
        raise LoraflowError(f"`{cmd.describe()}` needs exactly one config YAML, got {len(configs)}.")
    path = resolve_path(configs[0])
    cfg, bases = _read([str(path)], draft) if path is not None else (_from_name(configs[0], draft), [])
    for extra in positionals:
        if extra != configs[0] and extra.strip():
            draft.unknown.append(f"{extra} (positional argument)")
    for a in args:  # CLI flags override config keys (axolotl's --key value overrides)
        cfg[a.name] = (a.value if a.value is not None else True, a.raw)
    if cmd.program_kind == "cli" and not merge and cmd.launcher is None:
        _cli_launcher(cmd, cfg, after)
    _apply(draft, cfg, cmd, bases)
    if merge:
        _merge(draft, cmd.describe())
    finish_world(draft, cmd)
    return draft.result()


def from_files(paths: list[str], versions: dict) -> FrontendResult:
    """An Axolotl YAML (optionally with the DeepSpeed JSON it uses), or a launch script (.sh)."""
    if any(p.endswith(".sh") for p in paths):
        return from_command(split_command(command_from_script(next(p for p in paths if p.endswith(".sh")))), versions)
    draft = Draft(NAME, versions)
    cfg, bases = _read(paths, draft)
    _apply(draft, cfg, None, bases)
    finish_world(draft, None)
    return draft.result()


MARKERS = frozenset({"base_model", "adapter", "datasets", "sequence_len"})


def _recognise(view) -> bool:
    return view.cli == "axolotl" or view.runs("axolotl") or bool(view.yaml_keys & MARKERS)


MITIGATIONS = (
    Mitigation(("reentrant-frozen-inputs",), "0.3.0", "load_adapter calls enable_input_require_grads() for every "
               "LoRA model, not only k-bit ones", "src/axolotl/utils/models.py load_adapter (PR #345)"),
    Mitigation(("kbit-merge",), "0.4.0", "merge-lora loads the base unquantized whatever the config says",
               "src/axolotl/cli/merge_lora.py do_cli: load_in_4bit = load_in_8bit = False (PR #1086)"))
FRAMEWORK = Framework(name=NAME, title="Axolotl", module="axolotl", recognise=_recognise, flags=FLAGS,
                      log_paths=r"axolotl[/\\]", file_markers=MARKERS, depends=DEPENDS, dated=True,
                      mitigations=MITIGATIONS + moe_blocks.mitigations(NAME))
