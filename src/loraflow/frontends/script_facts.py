"""What the calls of a training script mean (script_code.py reads them): the options the HF Trainer / TRL frontend
already parses (a TrainingArguments keyword is the flag of the same name, `BitsAndBytesConfig(load_in_4bit=True)` is
`--load_in_4bit`, `LoraConfig(use_dora=True)` is `--use_dora`), plus what only code shows: which model is quantized,
moved, cast or merged, which adapter is loaded frozen, whether the input-grad hook is added, whether Unsloth loads it.
python_script.py turns these into the Combination."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from loraflow.frontends import lightning
from loraflow.frontends.hf_options import HANDLED, Opt, trainer_from_name
from loraflow.frontends.trl import MARKERS
from loraflow.frontends.script_code import PARSERS, Call, Code, FromFlag, Parsed, Unread
from loraflow.frontends.script_unsloth_facts import unsloth_full_modules
from loraflow.frontends.targets import unset_targets
from loraflow.frontends.script_names import HARMLESS as _HARMLESS, LIBRARY_ALIASES, bf16_query, model_class, passed

TRAINING_ARGS = ("TrainingArguments", "Seq2SeqTrainingArguments")
PLAIN_TRAINERS = ("Trainer", "Seq2SeqTrainer")
ADAPTER_CONFIGS = ("LoraConfig", "AdaLoraConfig", "LoHaConfig", "LoKrConfig", "IA3Config", "VeraConfig", "OFTConfig",
                   "BOFTConfig")
UNSLOTH = ("FastLanguageModel", "FastModel", "FastVisionModel")
PEFT_LOADERS = ("PeftModel", "PeftModelForCausalLM", "PeftModelForSequenceClassification")
# Packages whose calls the reader looks at; a call of theirs it does not read is listed.
API_PACKAGES = ("transformers", "peft", "trl", "unsloth", "bitsandbytes", "accelerate", "deepspeed")
# Method names that place or cast a model.
_CASTS = {"half": "float16", "bfloat16": "bfloat16", "float": "float32"}
_MOVES = ("cuda", "cpu", "xpu")
_HEADS = ("score", "classifier", "v_head", "value_head", "summary")


@dataclass
class Facts:
    opts: dict[str, Opt] = field(default_factory=dict)
    trainer: Call | None = None
    named_by: Call | None = None
    """The trainer or TRL config call that names the stage."""
    trainer_key: str | None = None
    """TRL's trainer (sft, dpo, grpo, reward...) the script's classes name; None for transformers' own Trainer."""
    trl: bool = False
    seqcls: Call | None = None
    trains: str = ""
    trained_at: int = 0
    """The line of the first training step (`trainer.train()`, `loss.backward()`): models loaded after it are for
    inference or merging and set no training option."""
    parser: str = ""
    wraps: list[Call] = field(default_factory=list)
    """Calls that put adapters on a model (get_peft_model, add_adapter, Unsloth's get_peft_model)."""
    configs: list[Call] = field(default_factory=list)
    loads: list[Call] = field(default_factory=list)
    peft_loads: list[Call] = field(default_factory=list)
    saved_configs: list[Call] = field(default_factory=list)
    casts: list[tuple[Call, str]] = field(default_factory=list)
    moves: list[Call] = field(default_factory=list)
    merges: list[Call] = field(default_factory=list)
    engine_moves: list[Call] = field(default_factory=list)
    """Engines that move the model they wrap to their device (deepspeed.initialize)."""
    hook: str = ""
    unsloth: str = ""
    unsloth_vision: bool = False
    """Loaded by FastModel / FastVisionModel (unsloth/models/vision.py), whose training preparation differs."""
    gc: Call | None = None
    """The first call that turns checkpointing on in code (gradient_checkpointing_enable, k-bit preparation)."""
    gc_kwargs: dict | None = None
    unknown: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    late: dict[str, Opt] = field(default_factory=dict)
    """Attributes set on the training arguments after they are built or parsed: they override flags too."""
    lightning: Call | None = None
    """Lightning's Trainer or Fabric, when it runs the loop (lightning.py reads its arguments)."""
    state_dict_patch: str = ""
    """Where the code replaces a model's state_dict with PEFT's adapter state dict (alpaca-lora's finetune.py)."""
    zero_inits: list[Call] = field(default_factory=list)
    """transformers' HfDeepSpeedConfig(ds_config): from_pretrained builds under zero.Init while it is alive
    (script_zero_init.py)."""


def kind(call: Call, code: Code) -> str:
    """What a call is, by its name and what it is called on."""
    name, owner = LIBRARY_ALIASES.get(call.name, call.name), call.owner_name.rsplit(".", 1)[-1]
    if name in TRAINING_ARGS or (name.endswith("Config") and trainer_from_name(snake(name))
                                 and name not in ADAPTER_CONFIGS):
        return "args"
    if lightning.is_loop(call, code):
        return "lightning"
    if _trainer_class(name, code):
        return "trainer"
    if name == "from_pretrained":
        if owner in UNSLOTH:
            return "unsloth_load"
        if owner in PEFT_LOADERS or owner.startswith("AutoPeftModel"):
            return "peft_load"
        if owner in ("PeftConfig", *ADAPTER_CONFIGS):
            return "saved_config"
        return "load" if model_class(owner, code.bases) else "harmless"
    if name == "get_peft_model":
        return "unsloth_wrap" if owner in UNSLOTH else "wrap"
    if name.endswith("Config") and code.imports.get(name) == "peft" and name not in ("PeftConfig", "LoftQConfig"):
        return "adapter_config"  # any PEFT method's config (LoHa, LoKr, Arrow...) puts adapters on the model
    return _SIMPLE.get(name, "") or _method_kind(call, code)


_SIMPLE = {"BitsAndBytesConfig": "bnb", "add_adapter": "wrap", "prepare_model_for_kbit_training": "kbit_prep",
           "prepare_model_for_int8_training": "kbit_prep", "gradient_checkpointing_enable": "gc",
           "enable_input_require_grads": "hook", "Accelerator": "accelerator", "HfDeepSpeedConfig": "zero_init",
           "DeepSpeedPlugin": "ds_plugin",
           "merge_and_unload": "merge", "merge_adapter": "merge", "load_adapter": "peft_load",
           "backward": "trains", **{n: "adapter_config" for n in ADAPTER_CONFIGS}, **{n: "parser" for n in PARSERS}}


def _method_kind(call: Call, code: Code) -> str:
    name = call.name
    if name == "initialize" and call.owner_name == "deepspeed":
        return "ds_init"
    if name in ("to", *_CASTS, *_MOVES) and is_model(call, code):
        return "place"
    owner = call.owner_name.rsplit(".", 1)[-1].lower()
    loop = isinstance(call.owner, Call) and kind(call.owner, code) in ("trainer", "lightning")
    if (name == "train" and ("trainer" in owner or loop)) or (name == "step" and "optim" in owner) or \
            (name == "fit" and ("trainer" in owner or loop)):
        return "trains"
    if name == "train":  # model.train(): the mode switch
        return "harmless"
    if name in _HARMLESS or call.owner_name.rsplit(".", 1)[-1] in _HARMLESS:
        return "harmless"
    return ""


def snake(name: str) -> str:
    """`OnlineDPOConfig` -> `online_dpo_config` (what trainer_from_name reads)."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


def _trainer_class(name: str, code: Code) -> str | None:
    """The library trainer a class is or derives from (`class MyTrainer(SFTTrainer)` -> SFTTrainer)."""
    if name in _HARMLESS:  # Unsloth's PatchDPOTrainer() patches TRL's trainer; it is not one
        return None
    for _ in range(8):
        name = LIBRARY_ALIASES.get(name, name)
        if name in PLAIN_TRAINERS or (name.endswith("Trainer") and trainer_from_name(snake(name))):
            return name
        if name not in code.bases:
            return name if name.endswith("Trainer") and name in code.imports else None
        name = code.bases[name]
    return None


_MODEL_KINDS = ("load", "unsloth_load", "peft_load", "wrap", "unsloth_wrap", "kbit_prep", "merge", "place")


def is_model(call: Call, code: Code) -> bool:
    """The method is called on a model: a value the script built with a model call, or (in a fragment whose
    model is built elsewhere) a name that says it is one."""
    owner = call.owner
    if isinstance(owner, Call):
        return kind(owner, code) in _MODEL_KINDS
    return bool(_MODEL_NAME.search(call.owner_name.rsplit(".", 1)[-1])) and not isinstance(owner, Parsed)


# Names that hold a model in scripts: model, base_model, peft_model, ref_model, reward_model (not model_name).
_MODEL_NAME = re.compile(r"(^|_)model$", re.I)


def gather(code: Code) -> Facts:
    facts = Facts()
    for call in code.calls:
        k = kind(call, code)
        handler = _HANDLERS.get(k)
        if facts.trained_at and call.line > facts.trained_at and k in ("load", "unsloth_load", "peft_load", "bnb"):
            handler = _later_load
        if handler is not None:
            handler(facts, call, code)
        elif k == "" and _api_call(call, code):
            facts.unknown.append(f"{call.at()} (a call check does not read)")
    _attributes(facts, code)
    return facts


def _api_call(call: Call, code: Code) -> bool:
    root = call.func.split(".", 1)[0]
    return code.imports.get(root) in API_PACKAGES or (bool(call.owner_name) and is_model(call, code))


def literal(facts: Facts, call: Call, key: str) -> Any:
    """A keyword's value when the code gives it literally; a computed one is listed (where check reads that key)
    and reads as absent."""
    value = call.kwargs.get(key)
    if isinstance(value, (Unread, Call)):  # computed (`r = int(os.environ.get("LORA_RANK", 64))`): not a value
        if key in READ_KEYS:
            facts.unknown.append(f"{call.at(key)} (not a literal: its value is not visible here)")
        return None
    return None if isinstance(value, (FromFlag, Parsed)) else value


# The keywords whose value check reads (hf.py's options, TRL's own, the configs read here): a computed value of any
# other (learning_rate=args.lr) changes nothing check evaluates and is not listed.
READ_KEYS = HANDLED | MARKERS | set("""vllm_mode vllm_gpu_memory_utilization vllm_enable_sleep_mode
vllm_importance_sampling_correction target_modules modules_to_save quantization_config torch_dtype dtype mixed_precision
hf_ds_config zero_stage gradient_checkpointing_kwargs use_gradient_checkpointing is_trainable task_type fsdp_config
offload_optimizer_device offload_param_device""".split())


def _args(facts: Facts, call: Call, code: Code) -> None:
    """TrainingArguments / SFTConfig / DPOConfig...: every keyword is the flag of the same name."""
    name = LIBRARY_ALIASES.get(call.name, call.name)
    key = trainer_from_name(snake(name)) if name not in TRAINING_ARGS else None
    facts.trl = facts.trl or key is not None
    if key and facts.trainer_key is None and facts.trainer is None:
        facts.trainer_key, facts.named_by = key, call
    if call.splat:
        facts.unknown.append(f"{call.file}:{call.line}: {call.func}({call.splat}) (not visible)")
    for name in call.kwargs:
        if name == "embedding_learning_rate" and call.name == "UnslothTrainingArguments":
            continue  # a learning rate of its own for modules_to_save embeddings: nothing check evaluates
        text = call.texts.get(name, "")
        on_bf16 = bf16_query(text) if name in ("bf16", "fp16") else None
        value = on_bf16 if on_bf16 is not None else literal(facts, call, name)
        if value is not None:
            facts.opts[name] = Opt(value, call.at(name) + (" (on a GPU with bfloat16; a T4 or V100 trains in fp16)"
                                                           if on_bf16 is not None else ""))


def _trainer(facts: Facts, call: Call, code: Code) -> None:
    base = _trainer_class(call.name, code) or call.name
    key = trainer_from_name(snake(base)) if base not in PLAIN_TRAINERS else None
    if key and code.imports.get(base, "trl") not in ("trl", "transformers"):
        # `from sotopia_rl import SotopiaSFTTrainer`: a package's own trainer, named like TRL's but not TRL's
        facts.unknown.append(f"{call.file}:{call.line}: {call.name}(...) from {code.imports[base]} (its own trainer, "
                             "not TRL's: TRL's defaults not assumed)")
        key = None
    origin = code.imports.get(base, "transformers")  # `from calm_trainer import Trainer`: a project's own class
    if base in PLAIN_TRAINERS and origin.split(".")[0] not in ("transformers", "trl", "unsloth"):
        facts.unknown.append(f"{call.at()} from {origin} (its own trainer: transformers' Trainer defaults not assumed)")
    facts.trainer, facts.trainer_key = call, key
    if key or facts.named_by is None:
        facts.named_by = call
    facts.trl = facts.trl or key is not None
    facts.trains = facts.trains or call.at()
    peft = call.kwargs.get("peft_config")
    # A helper's result (`peft_config=build_lora_config(cfg)`) is an adapter config too; TRL's own get_peft_config
    # (harmless here) returns None unless ModelConfig.use_peft, which hf.py reads from the flags.
    if isinstance(peft, (Unread, Parsed)) or (isinstance(peft, Call) and kind(peft, code) == ""):
        facts.opts["use_peft"] = Opt(True, call.at("peft_config") + " (an adapter config built elsewhere)", True)
    built = call.kwargs.get("args")
    if isinstance(built, Unread) or (isinstance(built, Call) and kind(built, code) != "args"):
        facts.unknown.append(f"{call.at('args')} (the training arguments are built where the code does not show: "
                             "their defaults are assumed)")
    model = call.kwargs.get("model", call.args[0] if call.args else None)
    if isinstance(model, str):  # TRL loads a model named by its id
        facts.opts.setdefault("model_name_or_path", Opt(model, call.at("model"), True))
    if key == "reward" and isinstance(model, str):
        facts.seqcls = facts.seqcls or call


def _lightning(facts: Facts, call: Call, code: Code) -> None:
    if facts.lightning is not None:  # a second Trainer (to test or predict) trains nothing new
        return
    facts.lightning = call
    facts.trains = facts.trains or call.at()
    facts.opts.update(lightning.options(call))


def _bnb(facts: Facts, call: Call, code: Code) -> None:
    if not passed(call, code):  # built, but no load takes it (PaliGemma fine-tuning scripts keep one unused)
        facts.notes.append(f"{call.at()}: a BitsAndBytesConfig no from_pretrained takes: the model loads unquantized")
        return
    for name in ("load_in_4bit", "load_in_8bit", "bnb_4bit_quant_storage"):
        value = literal(facts, call, name)
        if value not in (None, False):
            facts.opts[name] = Opt(value, call.at(name), True)


def _load(facts: Facts, call: Call, code: Code) -> None:
    facts.loads.append(call)
    _load_kwargs(facts, call)
    name = call.arg(0, "pretrained_model_name_or_path", call.kwargs.get("model_name"))
    if isinstance(name, str):
        facts.opts.setdefault("model_name_or_path", Opt(name, call.at(), True))
        if prequantized(name):
            facts.opts.setdefault("load_in_4bit", Opt(True, f"{call.at()} (a pre-quantized bitsandbytes "
                                                            f"checkpoint, by its name {name})", True))


def _peft_load(facts: Facts, call: Call, code: Code) -> None:
    """PeftModel.from_pretrained(base, path) / AutoPeftModelForCausalLM.from_pretrained(path) / load_adapter: a saved
    adapter (AutoPeftModel loads the base its adapter_config.json names, with these keywords)."""
    facts.peft_loads.append(call)
    facts.opts.setdefault("use_peft", Opt(True, f"{call.at()} (a saved adapter)", True))
    if call.owner_name.startswith("AutoPeftModel"):
        _load_kwargs(facts, call)


def _load_kwargs(facts: Facts, call: Call) -> None:
    if call.owner_name.endswith("ForSequenceClassification"):
        facts.seqcls = call
    if call.splat:  # `from_pretrained(name, **kwargs)` of a dict not built here: a quantization may be in it
        facts.unknown.append(f"{call.file}:{call.line}: {call.func}({call.splat}) (not visible)")
    for name in ("load_in_4bit", "load_in_8bit", "use_cache", "use_flash_attention_2"):
        value = literal(facts, call, name)
        if value is not None and (value or name == "use_cache"):
            facts.opts[name] = Opt(value, call.at(name), True)
    for name in ("torch_dtype", "dtype", "attn_implementation"):
        if isinstance(value := literal(facts, call, name), str):
            facts.opts["attn_implementation" if name[0] == "a" else "torch_dtype"] = Opt(value, call.at(name), True)
    quant = call.kwargs.get("quantization_config")
    if isinstance(quant, dict):
        for name in ("load_in_4bit", "load_in_8bit"):
            if quant.get(name) is True:
                facts.opts[name] = Opt(True, call.at("quantization_config"), True)
            elif isinstance(quant.get(name), (Unread, Call, FromFlag)):
                facts.unknown.append(f"{call.at('quantization_config')} ({name} computed: not visible)")
    elif isinstance(quant, (Unread, Parsed)):
        facts.unknown.append(f"{call.at('quantization_config')} (built elsewhere: whether it quantizes is not "
                             "visible)")


def prequantized(name: str) -> bool:
    """Checkpoints saved in bitsandbytes 4-bit, which load quantized whatever the call says (unsloth's
    `*-bnb-4bit` uploads)."""
    return bool(re.search(r"bnb[-_]?4bit", name, re.I))


def _unsloth_load(facts: Facts, call: Call, code: Code) -> None:
    """FastLanguageModel.from_pretrained: Unsloth loads in 4 bits unless told otherwise (load_in_4bit=True by
    default, unsloth/models/loader.py); full_finetuning=True trains every weight."""
    facts.unsloth = facts.unsloth or call.at()
    facts.unsloth_vision = facts.unsloth_vision or call.owner_name.rsplit(".", 1)[-1] != "FastLanguageModel"
    four = call.kwargs.get("load_in_4bit", True)
    _load(facts, call, code)
    if four is True and not call.kwargs.get("load_in_8bit") and not call.kwargs.get("full_finetuning"):
        facts.opts.setdefault("load_in_4bit", Opt(True, call.at("load_in_4bit") if "load_in_4bit" in call.kwargs else
                                                  f"default ({call.at()}: Unsloth loads in 4 bits, load_in_4bit=True "
                                                  "in unsloth/models/loader.py)", True))
    if call.kwargs.get("full_finetuning") is True:
        facts.opts["use_peft"] = Opt(False, call.at("full_finetuning"), True)


def _adapter_config(facts: Facts, call: Call, code: Code) -> None:
    facts.configs.append(call)
    facts.opts.setdefault("use_peft", Opt(True, call.at(), True))
    if literal(facts, call, "use_dora"):
        facts.opts["use_dora"] = Opt(True, call.at("use_dora"), True)
    for key, opt in (("target_modules", "lora_target_modules"), ("modules_to_save", "lora_modules_to_save"),
                     ("r", "lora_r")):
        if (value := literal(facts, call, key)) is not None:
            facts.opts[opt] = Opt(value, call.at(key), True)
    if "lora_target_modules" not in facts.opts and unset_targets(call.func, call.kwargs, call.splat):
        facts.opts["peft_default_targets"] = Opt(True, f"{call.at()}: no target_modules", True)
    if call.splat:
        facts.unknown.append(f"{call.file}:{call.line}: {call.func}({call.splat}) (not visible)")


def _wrap(facts: Facts, call: Call, code: Code) -> None:
    facts.wraps.append(call)
    facts.opts.setdefault("use_peft", Opt(True, call.at(), True))
    if call.kwargs.get("autocast_adapter_dtype") is False:
        facts.casts.append((call, "base"))  # adapters keep the base's dtype (peft get_peft_model)


def _unsloth_wrap(facts: Facts, call: Call, code: Code) -> None:
    """FastLanguageModel.get_peft_model: LoRA, with Unsloth's checkpointing on by default
    (use_gradient_checkpointing="unsloth"), prepared by unsloth_zoo's prepare_model_for_training (use_reentrant=True,
    the inputs made to require grad)."""
    _adapter_config(facts, call, code)
    _wrap(facts, call, code)
    facts.unsloth = facts.unsloth or call.at()
    if "r" not in call.kwargs and not call.splat:
        facts.opts["lora_r"] = Opt(16, f"default ({call.at()}: get_peft_model(r=16), unsloth/models/llama.py)", True)
    unsloth_full_modules(facts.opts)
    gc = call.kwargs.get("use_gradient_checkpointing", "unsloth")
    if gc in (True, "unsloth") and facts.gc is None:
        facts.gc, facts.gc_kwargs = call, {"use_reentrant": True}
        facts.hook = facts.hook or (f"{call.at('use_gradient_checkpointing')} (Unsloth's prepare_model_for_training "
                                    "makes the inputs require grad)")


def _kbit_prep(facts: Facts, call: Call, code: Code) -> None:
    """prepare_model_for_kbit_training(model, use_gradient_checkpointing=True, gradient_checkpointing_kwargs=None):
    checkpointing on and enable_input_require_grads unless use_gradient_checkpointing=False (peft utils/other.py)."""
    if call.kwargs.get("use_gradient_checkpointing", True) is not True:
        return
    kwargs = call.kwargs.get("gradient_checkpointing_kwargs")
    _gc_on(facts, call, kwargs)
    facts.hook = facts.hook or f"{call.at()} (calls enable_input_require_grads)"


def _gc(facts: Facts, call: Call, code: Code) -> None:
    _gc_on(facts, call, call.kwargs.get("gradient_checkpointing_kwargs"))


def _gc_on(facts: Facts, call: Call, kwargs: Any) -> None:
    if facts.gc is None:
        facts.gc = call
        facts.gc_kwargs = kwargs if isinstance(kwargs, dict) else None
        if isinstance(kwargs, (Unread, Call)):
            facts.unknown.append(f"{call.at('gradient_checkpointing_kwargs')} (computed in the script: its "
                                 "use_reentrant is not visible)")


def _hook(facts: Facts, call: Call, code: Code) -> None:
    facts.hook = facts.hook or call.at()


def _accelerator(facts: Facts, call: Call, code: Code) -> None:
    mp = literal(facts, call, "mixed_precision")
    if mp in ("bf16", "fp16"):
        facts.opts[mp] = Opt(True, call.at("mixed_precision"), True)


def _ds_plugin(facts: Facts, call: Call, code: Code) -> None:
    """accelerate's DeepSpeedPlugin: a DeepSpeed config file, or the ZeRO stage and offload in its arguments."""
    config = literal(facts, call, "hf_ds_config")
    if config is None:
        stage = literal(facts, call, "zero_stage")
        offload = literal(facts, call, "offload_optimizer_device") or literal(facts, call, "offload_param_device")
        config = {"zero_optimization": {"stage": stage if stage is not None else 2,
                                        **({"offload_optimizer": {"device": offload}} if offload else {})}}
    facts.opts["deepspeed"] = Opt(config, call.at("hf_ds_config" if "hf_ds_config" in call.kwargs else
                                                  "zero_stage"), True)


def _ds_init(facts: Facts, call: Call, code: Code) -> None:
    """deepspeed.initialize(model=..., config=...): the DeepSpeed engine, which moves the module to its device."""
    config = call.kwargs.get("config", call.kwargs.get("config_params"))
    if isinstance(config, (str, dict)):
        facts.opts["deepspeed"] = Opt(config, call.at("config" if "config" in call.kwargs else "config_params"), True)
    else:
        facts.unknown.append(f"{call.at('config')} (the DeepSpeed config is built elsewhere)")
    facts.engine_moves.append(call)
    facts.trains = facts.trains or call.at()


def _place(facts: Facts, call: Call, code: Code) -> None:
    """model.to(...), .cuda(), .half(), .bfloat16(): a cast when a dtype is named, else a move."""
    if call.name in _CASTS:
        facts.casts.append((call, _CASTS[call.name]))
        return
    target = call.kwargs.get("dtype", call.args[0] if call.args else call.kwargs.get("device"))
    if call.name == "to" and target in ("float16", "bfloat16", "float32"):
        facts.casts.append((call, target))
    else:
        facts.moves.append(call)


def _simple(attr: str):
    def record(facts: Facts, call: Call, code: Code) -> None:
        getattr(facts, attr).append(call)
    return record


def _trains(facts: Facts, call: Call, code: Code) -> None:
    facts.trains = facts.trains or call.at()
    facts.trained_at = facts.trained_at or call.line


def _later_load(facts: Facts, call: Call, code: Code) -> None:
    """A model loaded after training (to merge or evaluate the result) sets nothing; merges trace back to it through
    their own lineage."""


def _parser(facts: Facts, call: Call, code: Code) -> None:
    facts.parser = facts.parser or call.at()


_HANDLERS = {"args": _args, "trainer": _trainer, "lightning": _lightning, "bnb": _bnb, "load": _load,
             "unsloth_load": _unsloth_load,
             "adapter_config": _adapter_config, "wrap": _wrap, "unsloth_wrap": _unsloth_wrap, "kbit_prep": _kbit_prep,
             "gc": _gc, "hook": _hook, "accelerator": _accelerator, "ds_plugin": _ds_plugin, "ds_init": _ds_init,
             "place": _place, "merge": _simple("merges"), "peft_load": _peft_load,
             "saved_config": _simple("saved_configs"), "trains": _trains, "parser": _parser,
             "zero_init": _simple("zero_inits")}


def _attributes(facts: Facts, code: Code) -> None:
    """`training_args.gradient_checkpointing = True` after the arguments are built or parsed (it overrides flags
    and keywords alike); `model.config.use_cache = False`."""
    facts.late = parsed_sets(code, lambda c: kind(c, code) == "args")
    for owner, attr, value, source in code.attributes:
        if owner.endswith(".config") and attr == "use_cache" and isinstance(value, bool):
            facts.opts["use_cache"] = Opt(value, source, True)
    for owner, attr, called, source in code.replaced:
        # model.state_dict answering with get_peft_model_state_dict(...): PEFT's save_pretrained filters that
        # already filtered dict again (rule adapter-state-dict-patched).
        if attr == "state_dict" and "get_peft_model_state_dict" in called:
            facts.state_dict_patch = facts.state_dict_patch or source


def parsed_sets(code: Code, is_args) -> dict[str, Opt]:
    """Attribute assignments on training arguments (built by the script or parsed from the command line)."""
    found: dict[str, Opt] = {}
    for owner, attr, value, source in code.attributes:
        held = code.owners.get(owner)
        if (isinstance(held, Parsed) or (isinstance(held, Call) and is_args(held))) and \
                not isinstance(value, (Unread, Call, Parsed, FromFlag)):
            found[attr] = Opt(value, source)
    return found
