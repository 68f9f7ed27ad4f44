"""How the HF Trainer / TRL frontend gathers its options: flags, a lone YAML/JSON positional (HfArgumentParser),
TRL's `--config`, and the nested sections of vendors' finetune configs. What the options mean is hf.py's part."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loraflow.errors import LoraflowError
from loraflow.frontends import keys
from loraflow.frontends import trl as trl_rel
from loraflow.frontends.argv import Command, parse_flags, resolve_path
from loraflow.frontends.common import Draft, as_bool, load_mapping
from loraflow.frontends.deepspeed import DeepSpeedConfig
from loraflow.frontends.targets import check_targets
from loraflow.frontends.intent import OWN_DS_CONFIG, Intent

# Flags that take several values; and the flags hf.py gives a meaning (`--no_X` negates them).
LISTS = {"lora_target_modules", "lora_modules_to_save", "report_to", "reward_funcs", "reward_weights", "label_names",
         "lora_target_parameters", "reward_model_paths",
         "data_path"}  # Video-LLaVA's and MoE-LLaVA's train.py: `data_path: List[str]` (--data_path a.json b.json)
HANDLED = {"gradient_checkpointing", "activation_checkpointing", "gradient_checkpointing_kwargs",
           "activation_checkpointing_kwargs", "bf16", "fp16", "deepspeed", "fsdp", "fsdp_config",
           "ddp_find_unused_parameters", "ddp_static_graph", "use_cache", "use_peft", "use_dora",
           "lora_target_modules", "lora_modules_to_save", "load_in_4bit", "load_in_8bit", "bnb_4bit_quant_storage",
           "packing", "padding_free", "use_vllm", "ds3_gather_for_generation", "config", "accelerate_config", "dtype",
           "torch_dtype", "attn_implementation", "use_flash_attention_2",
           "peft_default_targets"}  # not a flag: a script's LoraConfig without target_modules (script_facts.py)


_OVERRIDE = re.compile(r"^\+{0,2}((?:[A-Za-z_]\w*\.)*)([A-Za-z_]\w*)=(.*)$")
# A flag of the script's own that names its TrainingArguments file: TRL's `--config recipe.yaml`, and the
# `--train_args_file args.json` (Firefly's train.py: HfArgumentParser.parse_json_file), `--config_file`,
# `--args_file`... of users' scripts built the same way.
ARGS_FILE_FLAG = re.compile(r"^(train(ing)?_)?(args|arguments|config|cfg)(_file|_path)?$")
"""`section.key=value` after the script (Hydra's and OmegaConf's command-line overrides): read by the last key."""


@dataclass
class Opt:
    value: Any
    source: str
    derived: bool = False  # translated from a vendor's section (peft_config:), so not a sign of TRL's own keys


@dataclass
class Run:
    """What each part of reading an HF Trainer / TRL run needs: the options, whether TRL runs them, TRL's trainer
    (sft, dpo, grpo, rloo, kto, reward, orpo...: it decides TRL's per-trainer behaviour), the `trl` subcommand, what
    the script's own flags say (intent) and what the engine read left (info)."""
    opts: dict[str, Opt]
    trl: bool
    trainer: str
    cli: str | None
    intent: Intent
    info: dict[str, Any]
    zero3: bool
    program: str = ""
    """The launched script's path (TRL's own example scripts set some arguments in their code)."""

    @property
    def who(self) -> str:
        return "TRL" if self.trl else "HF Trainer"

    @property
    def custom(self) -> bool:
        """The script has flags of its own (not TrainingArguments', not TRL's)."""
        return bool(self.intent.used)

    def on(self, name: str, default: bool = False) -> bool:
        opts = self.opts
        return as_bool(opts[name].value, opts[name].source) if name in opts else default


def trainer_from_name(text: str) -> str | None:
    """The TRL trainer a script, module or file name names (`dpo_llama.yaml` -> dpo), or None."""
    for trainer in trl_rel.TRAINERS:
        if re.search(r"(?<![a-z])(reward|rm)(?![a-z])" if trainer == "reward" else rf"(?<![a-z]){trainer}(?![a-z])",
                     text):
            return trainer
    return None


def trainer_sections(data: dict) -> dict[str, tuple[Any, str]]:
    """The training options a config file holds, each with the key path it came from. Besides HfArgumentParser's
    flat form, vendors' finetune scripts (GLM-4's finetune.py, ChatGLM3's finetune_demo) nest the TrainingArguments
    under a section such as `training_args:` and PEFT's config under `peft_config:` (`peft_type: LORA`); a nested
    section is lifted when most of its keys are TrainingArguments'."""
    found: dict[str, tuple[Any, str]] = {}
    for key, value in data.items():
        key = str(key)
        if isinstance(value, dict) and _is_peft_section(value):
            kind = str(value.get("peft_type", "LORA")).upper()
            found["use_peft"] = (kind in ("LORA", "DORA"), f"{key}.peft_type {kind}")
            if value.get("use_dora") or kind == "DORA":
                found["use_dora"] = (True, f"{key}.use_dora")
            if "target_modules" in value:
                found["lora_target_modules"] = (value["target_modules"], f"{key}.target_modules")
        elif isinstance(value, dict) and 2 * len(set(map(str, value)) & keys.HF_TRAINER) > len(value):
            found.update({str(k): (v, f"{key}.{k}") for k, v in value.items()})
        else:
            found.setdefault(key, (value, key))
    return found


def _is_peft_section(value: dict) -> bool:
    return "peft_type" in value or {"r", "lora_alpha"} <= set(map(str, value))


def options_from_file(path: Path, into: dict[str, Opt], what: str) -> None:
    for key, (value, where) in trainer_sections(load_mapping(path, what)).items():
        if value is not None:  # `key: null` leaves the dataclass default, as HfArgumentParser does
            into[key] = Opt(value, f"{path.name}: {where}", derived=where.split(".")[-1] != key)


def training_args_file(name: Any, bases: list) -> bool:
    """Whether a file a script's own flag names holds its training arguments: a mapping with output_dir (which
    TrainingArguments require) or at least two of their keys, and no DeepSpeed section."""
    path = resolve_path(str(name or ""), *bases)
    try:
        data = load_mapping(path, "config file") if path is not None else None
    except LoraflowError:
        return False
    if not isinstance(data, dict) or "zero_optimization" in data:
        return False
    return "output_dir" in data or len(set(map(str, data)) & (keys.HF_TRAINER | keys.TRL)) >= 2


def options_from_args(cmd: Command, draft: Draft, bases: list) -> tuple[dict[str, Opt], bool]:
    args, positionals, rest = parse_flags(cmd.args, lists=LISTS)
    opts: dict[str, Opt] = {}
    for pos in [p for p in positionals + rest if p]:  # HfArgumentParser reads a lone .yaml/.json positional as config
        override = _OVERRIDE.match(pos)
        if override:  # a Hydra / OmegaConf override of the script's own config: `model.lora=true`, `sft.bf16=true`
            opts.setdefault(override.group(2), Opt(override.group(3), pos))
            continue
        path = resolve_path(pos, *bases)
        if pos.endswith((".yaml", ".yml", ".json")) and path is not None:
            options_from_file(path, opts, "training config")
            bases.append(path.parent)
        elif pos.endswith((".yaml", ".yml", ".json")):
            draft.unknown.append(f"{pos}: not here (HfArgumentParser reads a lone config file as the training "
                                 "arguments), so only the command's flags were read")
        else:
            draft.unknown.append(f"{pos} (positional argument)")
    config = next((a for a in args if a.name == "config" or (
        ARGS_FILE_FLAG.match(a.name) and str(a.one() or "").endswith((".yaml", ".yml", ".json")))), None)
    if config is not None and config.name != "config" and not training_args_file(config.one(), bases):
        # `--config_file ds.json` of a script's own may name its DeepSpeed or model config as well: read only a file
        # whose keys are TrainingArguments'; what the script does with any other is in its code.
        draft.unknown.append(f"--{config.name} {config.one()}: the script's own file, whose keys are not training "
                             "arguments (or that is not here), so check did not read it")
        config = None
    if config is not None:  # TRL's --config recipe.yaml; command-line flags override it (trl/scripts/utils.py)
        path = resolve_path(config.one() or "", *bases)
        if path is None:  # a launch pasted from elsewhere: its flags are still read, the file's keys are unseen
            draft.unknown.append(f"--{config.name} {config.one()}: not here (the script reads its training arguments "
                                 "from it), so only the command's flags were read")
        else:
            options_from_file(path, opts, f"--{config.name}")
            bases.append(path.parent)
    # HfArgumentParser adds `--no_X` for every boolean field that defaults to true (`--no_remove_unused_columns`).
    negatable = HANDLED | keys.HF_TRAINER | keys.TRL
    for a in args:
        name = a.name[3:] if a.name.startswith("no_") and a.name[3:] in negatable else a.name
        value: Any = False if name != a.name else a.value
        if config is None or a is not config or a.name == "config":  # its keys were read in its place
            opts[name] = Opt(value, a.raw)
    _started_server(cmd, opts)
    trl = cmd.program == "trl" or cmd.program.startswith("trl.") or trl_rel.own_script(cmd.program)
    return opts, trl or trl_keys(opts)


_VLLM_SERVE = re.compile(r"\btrl\s+vllm[-_]serve\b|\btrl\.scripts\.vllm_serve\b")


def _started_server(cmd: Command, opts: dict[str, Opt]) -> None:
    """A launch script that starts `trl vllm-serve` before the run (TRL's GRPO docs' and open-r1's recipe) has the
    run sample from that server: --use_vllm in server mode, though the config that says so may not be here."""
    server = next((s for s in cmd.started if _VLLM_SERVE.search(s)), None)
    if server is not None and "use_vllm" not in opts:
        said = f"the script starts `{' '.join(server.split()[:4])} ...` before the run (a vLLM server to sample from)"
        opts["use_vllm"] = Opt(True, said)
        opts.setdefault("vllm_mode", Opt("server", said))


def kwargs_of(opt: Opt | None) -> dict[str, Any]:
    if opt is None or opt.value in (None, ""):
        return {}
    if isinstance(opt.value, dict):
        return opt.value
    try:
        parsed = json.loads(str(opt.value))
    except ValueError:
        raise LoraflowError(f"{opt.source}: not a JSON object; write e.g. "
                            "--gradient_checkpointing_kwargs '{\"use_reentrant\": false}'.") from None
    if not isinstance(parsed, dict):
        raise LoraflowError(f"{opt.source}: expected a JSON object such as '{{\"use_reentrant\": false}}'.")
    return parsed


def trl_keys(opts: dict[str, Opt]) -> bool:
    """Whether the options include keys only TRL has (not counting those translated from a vendor's section)."""
    return bool({k for k, o in opts.items() if not o.derived} & trl_rel.MARKERS)


def trl_or_not(draft: Draft, cmd: Command, opts: dict[str, Opt]) -> bool:
    """A script that is not here, read as TRL's only by LoRA flag names that many scripts spell the same way
    (`--lora_r`, `--lora_target_modules`: FastChat's, alpaca-lora's): whether it builds TRL's trainer, whose defaults
    differ from transformers' Trainer (checkpointing and bf16 on, its reentrancy for PEFT), is evaluated both ways."""
    if set(k for k, o in opts.items() if not o.derived) & (trl_rel.MARKERS - trl_rel.COMMON_LORA_FLAGS):
        return True
    common = sorted(k for k in opts if k in trl_rel.COMMON_LORA_FLAGS)
    foreign = _foreign(opts)
    if foreign:  # TrlParser -> HfArgumentParser.parse_args_into_dataclasses raises on a flag no dataclass has
        draft.note(f"{cmd.program} takes {', '.join(foreign[:3])}, which TRL's argument parser would reject "
                   "(transformers hf_argparser.py: 'Some specified arguments are not used'): read as a script with "
                   f"LoRA flags of its own ({', '.join('--' + k for k in common)}), not TRL's")
        return False
    return draft.fork("trainer_library", {  # the script's own reading first, as the report shows it
        False: f"{cmd.program} trains with transformers' Trainer and LoRA flags of its own",
        True: f"{cmd.program} trains with TRL's trainer (its LoRA flags are TRL's)"},
        f"{cmd.program} is not here, and its flags ({', '.join('--' + k for k in common)}) are spelled so in TRL's "
        "scripts and in many others")


# TRL's configs' fields beyond those keys.TRL lists for other uses (DPOConfig.max_prompt_length, PPOConfig's model
# paths, ModelConfig's older use_flash_attention_2): a flag among them does not make a launch foreign to TRL.
_ACCEPTED = HANDLED | keys.HF_TRAINER | keys.TRL | keys.HF_EXAMPLES | {
    "model_name_or_path", "model_revision", "max_prompt_length", "max_completion_length", "max_target_length",
    "reward_model_path", "sft_model_path", "tokenizer_name_or_path", "use_flash_attention_2", "num_ppo_epochs",
    "kl_coef", "missing_eos_penalty", "generation_batch_size", "temperature", "loss_type", "ref_model_name_or_path"}


def _foreign(opts: dict[str, Opt]) -> list[str]:
    """Flags of the command that neither TrainingArguments nor TRL's dataclasses have, as written. argparse takes a
    unique prefix of a flag (`--model_name` for --model_name_or_path, allow_abbrev), so such a prefix is not one."""
    out = []
    for name, opt in opts.items():
        if opt.derived or name in _ACCEPTED or _OVERRIDE.match(opt.source):
            continue
        if len([k for k in _ACCEPTED if k.startswith(name)]) != 1:
            out.append(opt.source)
    return out


_LORA_FLAGS = ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "use_dora", "use_rslora")


def lora_flags_without_use_peft(draft: Draft, run: Run, program: str) -> None:
    """LoRA flags without --use_peft on a script that is not TRL's CLI: TRL's ModelConfig ignores them (use_peft false
    trains every weight), while a script with LoRA flags of its own (alpaca-lora's forks, vendors' finetune.py) uses
    them. Which one `program` is its code says, not the launch line: both are evaluated, LoRA read first."""
    given = [run.opts[n].source for n in _LORA_FLAGS if n in run.opts]
    if "use_peft" in run.opts or not given or run.intent.adapter:
        return
    kind = "dora" if run.on("use_dora") else "lora"
    if "trainer_library" in draft.forks:  # whose flags these are is this build's fork (hf_options.trl_or_not)
        draft.set("adapter", *(("full", f"{given[0]} without --use_peft: TRL's ModelConfig ignores it and trains "
                                "every weight (trl/trainer/model_config.py)") if run.trl else
                               (kind, f"{given[0]} (read as the script's own LoRA flag)")))
        if not run.trl and run.intent.targets:  # its own `--target_modules`, now that it adapts
            model = run.opts.get("model_name_or_path")
            check_targets(draft, str(model.value if model is not None else ""), run.intent.targets,
                          run.intent.sources["targets"])
        return
    if not run.trl or not draft.sources.get("adapter", "").startswith("default (TRL"):
        return  # something else decided it (the script's code)
    draft.set("adapter", kind, f"{given[0]} (read as the script's own LoRA flag)")
    draft.maybe("adapter", {kind: f"{Path(program).name} uses {given[0]} itself (its own LoRA flags)",
                            "full": f"{Path(program).name} is TRL's script: ModelConfig ignores {given[0]} without "
                                    "--use_peft and trains every weight (trl/trainer/model_config.py)"},
                f"{given[0]} without --use_peft: TRL's ModelConfig has the flag, and so do scripts of their own")


_OWN_DS_SWITCH = re.compile(r"^((use|enable)_deepspeed|deepspeed_enable)$")
_OWN_ZERO = re.compile(r"^(zero_stage|ds_stage|deepspeed_stage|zero)$")


def own_deepspeed_file(opts: dict[str, Opt]) -> tuple[str, Opt] | None:
    """A script's own flag naming the DeepSpeed JSON it hands to deepspeed.initialize (`--ds_file ds_zero2.json`):
    (its name, the option), or None."""
    return next(((n, o) for n, o in opts.items() if OWN_DS_CONFIG.match(n) and str(o.value).endswith(".json")), None)


def own_deepspeed(opts: dict[str, Opt]) -> tuple[DeepSpeedConfig, set[str]] | None:
    """A script's own DeepSpeed switch (`--use_deepspeed true`, y-trainer's start_training): it calls
    deepspeed.initialize itself, with the ZeRO stage of its own `--zero_stage N` flag, else an unknown stage. Returns
    the config and the flags read."""
    switch = next((o for n, o in opts.items() if _OWN_DS_SWITCH.match(n)), None)
    if switch is None or not as_bool(switch.value if switch.value is not None else True, switch.source):
        return None
    stage = next((o for n, o in opts.items() if _OWN_ZERO.match(n) and str(o.value).strip() in "0123"), None)
    if stage is not None:
        return (DeepSpeedConfig({"zero_optimization": {"stage": int(str(stage.value).strip())}},
                                f"{switch.source} {stage.source} (the script's own DeepSpeed)"),
                {n for n, o in opts.items() if o is switch or o is stage})
    return (DeepSpeedConfig({}, f"{switch.source} (the script's own DeepSpeed)", [f"{switch.source}: the script runs "
                            "DeepSpeed itself with a config the command does not show"], ("stage",)),
            {n for n, o in opts.items() if o is switch})


def no_peft_flag(draft: Draft) -> None:
    """No PEFT flag anywhere the command shows: full fine-tuning, unless the training config it names is not here
    (`--config recipe.yaml`, a lone `lora_sft.yaml` HfArgumentParser reads), which may hold the adapter."""
    unseen = next((u.split(":")[0] for u in draft.unknown if ": not here (" in u), "")
    if unseen:
        draft.set("adapter", "full", "assumed: no PEFT flag in the command")
        draft.maybe("adapter", {"full": "the unseen config trains every weight",
                                "lora": "the unseen config (or the script's code) adds a LoRA adapter"},
                    f"{unseen}: no PEFT flag in the command, and the training config that could hold one is not here")
        return
    draft.set("adapter", "full", "assumed: no PEFT flag, so full fine-tuning")
    draft.note("no PEFT flag in the command: read as full fine-tuning. If the script wraps the model in a PEFT "
               "adapter itself, tell check so by passing the PEFT flags (e.g. --use_peft --lora_r 16, TRL's "
               "ModelConfig flags, which read the script as TRL)")


_NAMED_ADAPTER = re.compile(r"(?<![a-z])(q?lora|dora|peft)(?![a-z])")


def own_kbit_load(run: Run) -> bool:
    """The base is loaded k-bit by a flag of the script's own (`use_4bit: true`, `--bits 4`), not TRL's load_in_4bit:
    the flags are the script's, so TRL's use_peft default (full fine-tuning) says nothing of what it trains."""
    return bool(run.intent.quantization) and not {"load_in_4bit", "load_in_8bit"} & set(run.opts)


def own_adapter(draft: Draft, run: Run) -> bool:
    """No PEFT flag of the HF Trainer's or TRL's, on a script that is not TRL's: what its own LoRA flags (`--lora_r 8`
    once its other flags show it is not TRL's), its own k-bit load (`--quantization_bit 4`, `--bits 4`: a quantized
    base has no float weights to train, so a script that loads one trains adapters on it) or its name
    (`train_lora.py`, `qlora.py`, `finetune_peft.py`) say. False when none says anything."""
    if run.trl and not own_kbit_load(run):
        return False
    given = [run.opts[n].source for n in _LORA_FLAGS if n in run.opts]
    kind = "dora" if run.on("use_dora") else "lora"
    named = _NAMED_ADAPTER.search(Path(run.program).stem.lower()) if run.program else None
    if given:
        draft.set("adapter", kind, f"{given[0]} (read as the script's own LoRA flag)")
    elif run.intent.quantization:
        draft.set("adapter", kind, f"{run.intent.sources['quantization']}: the script loads its base quantized, "
                  "which trains only through adapters (read as LoRA)")
    elif named:
        draft.set("adapter", "dora" if named.group(1) == "dora" else "lora",
                  f"script name {run.program} (read as the script's own {named.group(1)} training)")
    else:
        return False
    run.info["own_adapter"] = True  # the script's own code builds the adapters, so it decides their hooks too
    script = Path(run.program).name if run.program else "the script that reads this file"
    draft.note(f"adapter read as {draft.get('adapter')} from {draft.sources['adapter']}: {script} is not here; pass "
               "--use_peft false (or the script itself) if it trains every weight")
    return True


def fix_flags(draft: Draft, run: Run, cli: bool, gc_name: str, kw_name: str) -> None:
    """The flags that change each field, spelled as this run spells them (a file's keys carry no dashes)."""
    ds = "ds" in run.info
    kw = f"--{kw_name} '{{\"use_reentrant\": ...}}'" if cli else f"{kw_name}: {{use_reentrant: ...}}"
    draft.flag(checkpointing=f"--{gc_name}" if cli else gc_name, reentrant=kw, precision="--bf16 / --fp16" if cli else
               "bf16 / fp16", engine=draft.flags.get("engine", "--deepspeed / --fsdp"),
               find_unused_parameters="--ddp_find_unused_parameters",
               ddp_static_graph="--ddp_static_graph", use_cache="--use_cache" if not run.trl else "",
               adapter="--use_peft / --use_dora", quantization="--load_in_4bit",
               matched_modules="--lora_target_modules", no_default_targets="--lora_target_modules",
               quant_storage_matches="--bnb_4bit_quant_storage", packing="--packing",
               generation_gather="--ds3_gather_for_generation", world_size="the launcher's process count",
               grad_accum_steps="--gradient_accumulation_steps",
               targets_all_towers="--lora_target_modules", **trl_rel.VLLM_FLAGS,
               fsdp_state_dict="--fsdp_config '{\"state_dict_type\": \"SHARDED_STATE_DICT\"}'",
               resumes="--resume_from_checkpoint / --load_best_model_at_end",
               zero_stage="zero_optimization.stage in the --deepspeed JSON" if ds else
               "--zero_stage / zero_stage in the accelerate config",
               adapter_save_gather="stage3_gather_16bit_weights_on_model_save in the --deepspeed JSON" if ds
               else "zero3_save_16bit_model in the accelerate config")
    draft.flags = {k: v if cli else re.sub(r"(^|\s)--", r"\1", v) for k, v in draft.flags.items() if v}
