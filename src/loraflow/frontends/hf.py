"""HF Trainer and TRL: `trl sft|dpo|grpo ...`, `accelerate launch train.py ...`, `python train.py --deepspeed ds.json
--use_peft --lora_r 16 ...`, or a YAML/JSON of TrainingArguments / SFTConfig / DPOConfig / GRPOConfig.

TRL is recognised by its CLI or by flags only TRL has (ModelConfig's `--use_peft`, `--lora_r`; SFT/GRPO config fields);
anything else, transformers' own example scripts (run_clm.py...) included, is read as a script built on transformers'
Trainer, training every weight unless PEFT flags say otherwise. When the script is here, its code is read too (never
run: script_setup.py), so what it does with the model (enable_input_require_grads, a PeftModel) is seen; otherwise
the notes say what was assumed. TRL's defaults
changed across releases; without `--versions trl=X`, the TRL that goes with the given transformers is assumed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from loraflow.errors import LoraflowError
from loraflow.frontends import deepspeed, keys, liger, script_setup
from loraflow.frontends import trl as trl_rel
from loraflow.frontends.argv import (
    Arg,
    Command,
    pull_accelerate_options,
    resolve_path,
    split_command,
)
from loraflow.frontends.shell import command_from_script
from loraflow.frontends.base import Framework, FrontendResult
from loraflow.frontends import lightning
from loraflow.frontends.script_facts import is_model
from loraflow.frontends.hf_adapter import LENGTH_KEYS, MODEL_KEYS, adapter, image_text
from loraflow.frontends.accelerate_options import apply_accelerate, apply_fsdp_options, refuse_beside
from loraflow.frontends.common import (
    Draft,
    as_bool,
    as_list,
    at_least,
    finish_world,
    int_value,
    load_mapping,
    mapping_value,
    one_process_ddp,
    precision_from,
    trainer_dtypes,
)
from loraflow.frontends.hf_checkpointing import checkpointing
from loraflow.frontends.hf_attention import flash_fp32
from loraflow.frontends.trainer_checkpoints import trainer_checkpoints, trainer_fsdp_version
from loraflow.frontends.hf_quant import quant_storage
from loraflow.frontends.hf_options import (
    HANDLED,
    Opt,
    Run,
    fix_flags,
    lora_flags_without_use_peft,
    options_from_args,
    options_from_file,
    trainer_from_name,
    trl_keys,
    own_deepspeed,
    own_deepspeed_file,
    trl_or_not,
)
from loraflow.frontends.intent import apply_fsdp, infer, names_training_flag
from loraflow.frontends.table import Field, apply_table, fact, steps, switch

NAME = "hf"
# Combination field -> the HF Trainer / TRL flag that changes it (command-line spelling; also read by
# `loraflow explain`).
FLAGS = {"checkpointing": "--gradient_checkpointing",
         "reentrant": "--gradient_checkpointing_kwargs '{\"use_reentrant\": ...}'", "precision": "--bf16 / --fp16",
         "engine": "--deepspeed / --fsdp", "find_unused_parameters": "--ddp_find_unused_parameters",
         "ddp_static_graph": "--ddp_static_graph", "use_cache": "--use_cache", "adapter": "--use_peft / --use_dora",
         "adapter_reads_base": "--lora_target_parameters",
         "quantization": "--load_in_4bit", "matched_modules": "--lora_target_modules",
         "no_default_targets": "--lora_target_modules", "flash_attn_fp32": "--bf16 / --torch_dtype bfloat16",
         "quant_storage_matches": "--bnb_4bit_quant_storage", "packing": "--packing",
         "generation_gather": "--ds3_gather_for_generation", "world_size": "the launcher's process count",
         "model_split": "device_map= in the script's from_pretrained ({'': local rank} per process)",
         "flash_attention": "--attn_implementation (sdpa)", "optimizer_8bit": "--optim (a 32-bit one: adamw_torch)",
         "saves_optimizer_state": "--save_only_model",
         "mm_token_types_missing": "the collator: token_type_ids in every batch (the model's processor)",
         "device_map_load": "device_map= / --low_cpu_mem_usage for the script's from_pretrained (neither under ZeRO-3)",
         "grad_accum_steps": "--gradient_accumulation_steps",
         "zero_stage": "zero_optimization.stage in the --deepspeed JSON",
         "adapter_save_gather": "stage3_gather_16bit_weights_on_model_save in the --deepspeed JSON",
         "targets_all_towers": "--lora_target_modules",
         "fsdp_state_dict": "--fsdp_config '{\"state_dict_type\": \"SHARDED_STATE_DICT\"}'",
         "resumes": "--resume_from_checkpoint / --load_best_model_at_end", **trl_rel.VLLM_FLAGS}


def _engine(draft: Draft, opts: dict[str, Opt], cmd: Command | None, bases: list) -> dict[str, Any]:
    acc = apply_accelerate(draft, cmd, tuple(bases)) if cmd is not None and cmd.launcher == "accelerate" else {}
    ds_ref = opts["deepspeed"].value if "deepspeed" in opts else acc.get("deepspeed_config_file")
    info: dict[str, Any] = {"acc": acc}
    own = own_deepspeed_file(opts) if not ds_ref else None  # the script's own `--ds_file x.json`
    if own is not None:
        ds_ref, info["own_ds"], info["own_flags"] = own[1].value, own[1], {own[0]}
        draft.note(f"{own[1].source}: read as the DeepSpeed config the script itself hands to DeepSpeed")
    switch = own_deepspeed(opts) if not ds_ref else None  # `--use_deepspeed true`: the script's own DeepSpeed
    if switch is not None:
        info["ds"], info["ds_label"], info["own_flags"] = deepspeed.apply(draft, switch[0]), switch[0].label, switch[1]
    if ds_ref:
        if isinstance(ds_ref, str) and ds_ref.lstrip().startswith("{"):
            try:
                ds_ref = json.loads(ds_ref)
            except ValueError as exc:
                raise LoraflowError(f"{opts['deepspeed'].source if 'deepspeed' in opts else 'deepspeed_config_file'}: "
                                    f"inline DeepSpeed config is not valid JSON ({exc}).") from None
        flag = "--deepspeed" if "deepspeed" in opts else info["own_ds"].source.split()[0] if "own_ds" in info else \
            "deepspeed_config_file"
        if isinstance(ds_ref, dict) and "deepspeed" in opts and ".py:" in opts["deepspeed"].source:
            flag = opts["deepspeed"].source  # a config built in a script's code: name that line
        ds = deepspeed.read(ds_ref, flag, tuple(bases))
        refuse_beside(draft, acc if "deepspeed" in opts else {}, flag)  # accelerate's own DeepSpeed fields beside it
        info["ds"], info["ds_label"] = deepspeed.apply(draft, ds), ds.label
    fsdp = opts.get("fsdp")
    if fsdp is not None and fsdp.value not in (None, "", False, []):
        words = as_list(fsdp.value) if fsdp.value is not True else ["full_shard"]
        cfg = opts.get("fsdp_config")
        options = cfg.value if cfg is not None else {}
        if isinstance(options, str) and options.lstrip().startswith("{"):  # TrainingArguments' dict fields take JSON
            try:
                options = json.loads(options)
            except ValueError as exc:
                raise LoraflowError(f"{cfg.source}: inline FSDP config is not valid JSON ({exc}).") from None
        if isinstance(options, str):
            path = resolve_path(options, *bases)
            if path is None:
                raise LoraflowError(f"{cfg.source}: FSDP config file not found.")
            options = load_mapping(path, "--fsdp_config")
        where = cfg.source if cfg is not None else "fsdp_config"
        options = {str(k).removeprefix("fsdp_"): v for k, v in mapping_value(options or None, where).items()}
        version = int_value(options.get("version", trainer_fsdp_version(draft)), f"{where}: fsdp_version",
                            "an FSDP version", (1, 2))
        which = (f" + fsdp_config version {version}" if "version" in options else
                 f" (FSDP{version}: TrainingArguments' default, version 2 from transformers 5.10)")
        draft.set("engine", "fsdp2" if version == 2 else "fsdp1", fsdp.source + which)
        if "offload" in words:
            draft.set("offload", True, fsdp.source)
        if "use_orig_params" not in options:
            # TrainingArguments writes FSDP_USE_ORIG_PARAMS itself (over accelerate launch's default): "false" until
            # transformers PR #27652 (4.36.0), "true" after (transformers#27744 failed on 4.33.3 with PEFT).
            draft.set("fsdp_use_orig_params", at_least(draft, "transformers", "4.36.0"), f"default ({fsdp.source}: "
                      "TrainingArguments fsdp_config use_orig_params, true from transformers 4.36.0, false before)")
        apply_fsdp_options(draft, options, cfg.source if cfg is not None else fsdp.source)
    return info


def _arg(name: str, value: str) -> Arg:
    return Arg(name, value, f"--{name} {value}")


def apply(draft: Draft, opts: dict[str, Opt], trl: bool, stage: tuple[str, str], cmd: Command | None,
          bases: list, trainer: str = "") -> None:
    """`trainer`: the TRL trainer (sft, dpo, grpo, rloo, kto, reward, orpo...), which decides TRL's per-trainer
    behaviour; empty means the one named by the stage."""
    cli = cmd.subcommand if cmd is not None and cmd.program == "trl" else None
    if trl:
        trl_rel.eras(draft, set(opts), cli, cmd.program if cmd is not None and cmd.program != "trl" else "")
    draft.set("stage", *stage)
    info = _engine(draft, opts, cmd, bases)
    zero3 = draft.get("engine") == "deepspeed" and draft.get("zero_stage") == 3
    trainer = trainer or {"rm": "reward"}.get(stage[0], stage[0])
    bf16, fp16 = _precision(draft, opts, trl, info)
    # A script's own flags (not TrainingArguments', not TRL's): what they say about adapters, quantization,
    # reentrancy and frozen towers (frontends/intent.py).
    known = keys.HF_TRAINER | keys.TRL | keys.HF_EXAMPLES | HANDLED | set(MODEL_KEYS) | set(LENGTH_KEYS)
    intent = infer({n: (o.value, o.source) for n, o in opts.items() if n not in known})
    apply_fsdp(draft, intent)
    run = Run(opts, trl, trainer, cli, intent, info, zero3, cmd.program if cmd is not None else "")
    adapter(draft, run)
    liger.trl(draft, trainer, {n: (o.value, o.source) for n, o in opts.items()}, trl)
    if cmd is not None and not (cmd.program == "trl" or cmd.program.startswith("trl.")):
        lora_flags_without_use_peft(draft, run, cmd.program)
    image_text(draft, opts, intent, cmd)
    quant_storage(draft, run, bf16, fp16)
    flash_fp32(draft, opts)
    gc, gc_name, kw_name = checkpointing(draft, run)
    apply_table(draft, {n: (o.value, o.source) for n, o in opts.items()}, _cache_and_ddp(run, gc))
    _rollouts_and_mode(draft, run)
    if trl:
        trl_rel.vllm_rollouts(draft, {n: (o.value, o.source) for n, o in opts.items()}, trainer)
    _save_gather(draft, run)
    low = opts.get("low_cpu_mem_usage")  # transformers' examples (run_clm.py) pass it to from_pretrained
    if low is not None and as_bool(low.value, low.source) and not draft.has("device_map_load"):
        draft.set("device_map_load", "low_cpu_mem_usage", f"{low.source} (the script passes it to from_pretrained)")
    trainer_checkpoints(draft, {n: (o.value, o.source) for n, o in opts.items()},
                        "fsdp" in opts and opts["fsdp"].value not in (None, "", False, []), True if trl else None)
    dtype = str((opts.get("dtype") or opts.get("torch_dtype") or Opt("", "")).value)
    # The base is half precision when loaded so, or when ZeRO-3's zero.Init partitions it in the DeepSpeed dtype.
    half_init = zero3 and draft.get("precision") in ("bf16-mixed", "fp16-mixed")
    trainer_dtypes(draft, dtype in ("bfloat16", "float16", "bf16", "fp16") or half_init,
                   "--dtype / --torch_dtype" if not half_init else "ZeRO-3 zero.Init in the DeepSpeed dtype")
    fix_flags(draft, run, cmd is not None, gc_name, kw_name)
    for name, opt in opts.items():
        if name not in known | intent.used | info.get("own_flags", set()):
            draft.unknown.append(opt.source)


def _precision(draft: Draft, opts: dict[str, Opt], trl: bool, info: dict) -> tuple[bool, bool]:
    """TRL defaults bf16 on unless fp16 (trl/trainer/*_config.py since 0.19, base_config.py now); the Trainer
    defaults to fp32. Returns (bf16, fp16) as the Trainer reads them."""
    fp16 = as_bool(opts["fp16"].value, opts["fp16"].source) if "fp16" in opts else False
    bf16 = (as_bool(opts["bf16"].value, opts["bf16"].source) if "bf16" in opts else
            bool(trl and not fp16 and trl_rel.since(draft, "0.19.0")))
    hf_src = (opts["bf16"].source if "bf16" in opts else opts["fp16"].source if "fp16" in opts else
              "default (TRL trl/trainer/base_config.py: bf16 unless fp16, since TRL 0.19)" if bf16 else "")
    if "ds" in info:
        deepspeed.resolve_precision(draft, info["ds"], info["ds_label"], bf16, fp16, hf_src or "--bf16/--fp16")
        deepspeed.trainer_values(draft, {**info["ds"], "label": info["ds_label"]},
                                 {n: (o.value, o.source) for n, o in opts.items() if n in deepspeed.TRAINER_FIELDS},
                                 defaults=trl and not any(o.derived for o in opts.values()))
    if not draft.has("precision"):
        mp = info["acc"].get("mixed_precision")
        if bf16 or fp16:
            draft.set("precision", precision_from(bf16, fp16), hf_src)
        elif mp in ("bf16", "fp16"):
            draft.set("precision", precision_from(mp == "bf16", mp == "fp16"), "accelerate mixed_precision")
    return bf16, fp16


def _cache_and_ddp(run: Run, gc: bool) -> tuple[Field, ...]:
    """use_cache, packing and DDP's settings (which do not apply under DeepSpeed or FSDP)."""
    def cache_default(draft: Draft) -> tuple[bool, str] | None:
        if at_least(draft, "transformers", "5.0.0"):
            return False, ("default (transformers 5 Trainer sets config.use_cache = args.use_cache, default false; "
                           "transformers trainer.py)")
        return None

    def unused_default(draft: Draft) -> tuple[bool, str] | None:
        if draft.get("engine") in ("deepspeed", "fsdp1", "fsdp2"):
            return None
        if draft.get("adapter") != "full":
            return True, ("default (HF Trainer: a PeftModel is not a PreTrainedModel, so find_unused_parameters=True; "
                          "transformers trainer.py)")
        return not gc, "default (HF Trainer: not gradient_checkpointing; trainer.py)"

    return (
        fact("use_cache", False, "TRL passes use_cache=False in the training forward (trl/trainer/sft_trainer.py)",
             when=lambda d: run.trl),
        Field("use_cache", ("use_cache",), default=cache_default, when=lambda d: not run.trl),
        Field("packing", ("packing",), switch),
        Field("packing", ("padding_free",), switch),
        Field("find_unused_parameters", ("ddp_find_unused_parameters",), default=unused_default),
        Field("ddp_static_graph", ("ddp_static_graph",), switch),
        Field("grad_accum_steps", ("gradient_accumulation_steps",), steps),
        fact("accumulation_loop", "hf-trainer", "the HF Trainer's loop (transformers trainer.py "
             "_inner_training_loop)", when=lambda d: not d.has("accumulation_loop")),
    )


def _rollouts_and_mode(draft: Draft, run: Run) -> None:
    opts, trl, trainer = run.opts, run.trl, run.trainer
    if draft.get("stage") in ("grpo", "ppo"):
        if run.on("use_vllm"):
            draft.set("generation", False, opts["use_vllm"].source + " (rollouts come from vLLM)")
        else:
            draft.set("generation", True, f"{draft.get('stage')} samples with model.generate (use_vllm false)")
            gather = run.on("ds3_gather_for_generation", default=True)
            draft.set("generation_gather", gather, opts["ds3_gather_for_generation"].source if
                      "ds3_gather_for_generation" in opts else "default (TRL trl/trainer/grpo_config.py: "
                      "ds3_gather_for_generation true)")
    if draft.get("stage") == "dpo":
        trl_rel.dpo(draft)
    if trl and trl_rel.paged_eval(draft, trainer, run.on("use_transformers_paged")):
        draft.set("train_mode_at_backward", False, f"TRL 0.20 - 0.23 {trainer} with --use_transformers_paged: the "
                  "continuous-batching generator leaves the policy in eval mode (restored from 0.24, PR #4065)")
    else:
        draft.set("train_mode_at_backward", True, "Trainer.training_step calls model.train()")
    if trl and trainer == "ppo" and not trl_rel.since(draft, "0.12.0"):
        # The legacy PPOTrainer (to 0.11): generate without gathering before 0.8.2, save without gathering.
        draft.set("generation", True, "legacy PPOTrainer samples with generate (trl/trainer/ppo_trainer.py)")
        draft.set("generation_gather", trl_rel.since(draft, "0.8.2"), "unwrap_model_for_generation gathers once "
                  "since TRL 0.8.2 (PR #1483)")


def _save_gather(draft: Draft, run: Run) -> None:
    if not run.zero3:
        return
    info = run.info
    if at_least(draft, "transformers", "5.0.0"):
        draft.set("adapter_save_gather", True, "transformers >= 5 Trainer.save_model consolidates the trainable "
                  "ZeRO-3 params of a PeftModel (transformers trainer.py)")
    else:
        gather = (deepspeed.gather_on_save(draft, info.get("ds", {}))
                  or bool(info["acc"].get("zero3_save_16bit_model")))
        draft.set("adapter_save_gather", gather, f"{info.get('ds_label', 'accelerate config')}: "
                  "stage3_gather_16bit_weights_on_model_save (transformers < 5 saves through it)")


def from_command(cmd: Command, versions: dict) -> FrontendResult:
    local = cmd.program_kind == "script" or (cmd.program_kind == "module" and cmd.program.isidentifier())  # -m train
    script = script_setup.script_of(cmd.program) if local else None
    if script is not None:  # the script is here: its code and the flags are read together
        return _from_script(cmd, script, versions)
    draft = Draft(NAME, versions)
    bases: list = []
    if cmd.program == "trl":
        pull_accelerate_options(cmd)
    opts, trl = options_from_args(cmd, draft, bases)
    if trl and cmd.program != "trl" and not cmd.program.startswith("trl.") and not trl_rel.own_script(cmd.program):
        trl = trl_or_not(draft, cmd, opts)
    if cmd.program == "trl":
        if cmd.subcommand not in trl_rel.TRL_COMMANDS:
            raise LoraflowError(f"`trl {cmd.subcommand}` is not a training command loraflow reads; expected one of "
                                f"{', '.join(trl_rel.TRL_COMMANDS)}.")
        trainer, source = cmd.subcommand, f"trl {cmd.subcommand}"
    else:
        # `-m trl.scripts.dpo` names its trainer in the last dotted part, a script in its file name.
        name = cmd.program.rsplit(".", 1)[-1] if cmd.program_kind == "module" else Path(cmd.program).stem
        trainer, source = trainer_from_name(name.lower()), f"script name {cmd.program}"
    if trainer is None:
        trainer, source = "sft", f"assumed ({cmd.program} does not name a stage)"
    apply(draft, opts, trl, (trl_rel.TRAINERS[trainer], source), cmd, bases, trainer)
    one_process_ddp(draft, cmd)
    finish_world(draft, cmd)
    if trl and trainer == "grpo":
        trl_rel.grpo_groups(draft, {n: (o.value, o.source) for n, o in opts.items()})
    return draft.result()


def _from_script(cmd: Command, script: script_setup.Script, versions: dict) -> FrontendResult:
    """A launch line whose script is here: the code, then the flags over it (HfArgumentParser fills the
    TrainingArguments from them), then attributes the code sets on the parsed arguments."""
    draft = Draft(NAME, versions)
    bases: list = [script.path.parent]
    flags, trl = options_from_args(cmd, draft, bases)
    named = trainer_from_name(script.path.stem.lower())
    fallback = ((trl_rel.TRAINERS[named], f"script name {cmd.program}"), named) if named else None
    apply_script(draft, script, cmd, flags, trl, fallback, bases)
    draft.note(f"{script.path.name} was read (statically, never run) together with the flags; a flag overrides the "
               "code's TrainingArguments keyword of the same name")
    if flags and not script.facts.parser:
        draft.note(f"{script.path.name} shows no argument parser (HfArgumentParser, TrlParser, argparse): the flags "
                   "were read as its TrainingArguments, but the code may ignore them")
    return draft.result()


def apply_script(draft: Draft, script: script_setup.Script, cmd: Command | None, flags: dict[str, Opt],
                 trl: bool, fallback, bases: list) -> None:
    """A training script's code read as this frontend reads options (script_setup.py says what the code gives and
    what only code shows), with its launch line's flags, if any, over the code."""
    script = script_setup.live(draft, script, flags)
    stage, trainer = script_setup.stage(script, fallback)
    opts = script_setup.options(draft, script, flags)
    apply(draft, opts, script.facts.trl or trl, stage, cmd, bases, trainer)
    if script.facts.lightning is not None:  # Lightning's loop, not the HF Trainer's, decides these
        saves = [c for c in script.code.calls if c.name == "save_pretrained" and is_model(c, script.code)]
        lightning.apply(draft, script.facts, saves)
        if cmd is not None and cmd.launcher == "python":  # Lightning starts its devices' processes itself
            cmd.world_size = None
    script_setup.code_only(draft, script, whole=cmd is not None or script.whole)
    if script.facts.lightning is None:
        one_process_ddp(draft, cmd)
    finish_world(draft, cmd)
    if (script.facts.trl or trl) and trainer == "grpo":
        trl_rel.grpo_groups(draft, {n: (o.value, o.source) for n, o in opts.items()})
    script_setup.finish(draft, script)
    if script.facts.lightning is not None:
        draft.flags.update(lightning.FLAGS)


def from_files(paths: list[str], versions: dict) -> FrontendResult:
    """Training-argument YAML/JSON files (later files override earlier keys), plus optionally a DeepSpeed JSON, an
    accelerate config YAML, or a launch script (.sh) whose flags override the files."""
    draft = Draft(NAME, versions)
    opts: dict[str, Opt] = {}
    cmd: Command | None = None
    bases: list = []
    ds_files = []
    for path in paths:
        p = Path(path)
        if p.suffix == ".sh":
            cmd = split_command(command_from_script(path))
            continue
        data = load_mapping(p, "config file")
        bases.append(p.parent)
        if "zero_optimization" in data:
            ds_files.append(str(p))
        elif "distributed_type" in data:
            cmd = cmd or Command(argv=[], launcher="accelerate", program=path)
            cmd.launcher_args.append(_arg("config_file", str(p)))
        else:
            options_from_file(p, opts, "training config")
    for path in ds_files:  # a DeepSpeed JSON given alongside replaces the config's `deepspeed:` path
        opts["deepspeed"] = Opt(path, path)
    trl = trl_keys(opts)
    named = next((Path(p).name for p in paths if trainer_from_name(Path(p).stem.lower())), None)
    trainer, source = (trainer_from_name(Path(named).stem.lower()), f"file name {named}") if named else (None, "")
    if cmd is not None and cmd.args:
        more, trl_cli = options_from_args(cmd, draft, bases)
        opts.update(more)
        trl = trl or trl_cli
        if cmd.program == "trl" and cmd.subcommand in trl_rel.TRL_COMMANDS:
            trainer, source = cmd.subcommand, f"trl {cmd.subcommand}"
    for key, implied in (("num_generations", "grpo"), ("beta", "dpo")):
        if trainer is None and key in opts:
            trainer, source = implied, opts[key].source
    if trainer is None:
        trainer, source = "sft", "assumed (no stage in the file names)"
    stage = (trl_rel.TRAINERS[trainer], source)
    apply(draft, opts, trl, stage, cmd, bases, trainer)
    one_process_ddp(draft, cmd)
    finish_world(draft, cmd)
    return draft.result()


def _recognise(view) -> bool:
    if view.cli == "trl" or view.runs("trl"):
        return True
    # `accelerate launch -m src.train_sft`, `python -m pkg.train`: a module of the user's own.
    module = view.cli is None and re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", view.program) is not None
    if not view.program.endswith(".py") and not module:
        return False
    # HF TrainingArguments flags, a script launched by accelerate (the HF launcher) with none of another framework's
    # markers, or a script's own adapter / quantization switches (`python main.py --enable_lora`).
    return (bool((view.flags | view.yaml_keys) & (keys.HF_TRAINER | keys.TRL | keys.HF_EXAMPLES))
            or view.launcher == "accelerate" or script_setup.script_of(view.program) is not None
            or names_training_flag(view.flags))


FRAMEWORK = Framework(name=NAME, title="HF Trainer / TRL", module="hf", recognise=_recognise, flags=FLAGS,
                      log_paths=trl_rel.LOG_PATHS,
                      depends=trl_rel.DEPENDS)
