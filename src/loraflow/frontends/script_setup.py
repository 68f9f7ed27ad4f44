"""The training script side of `loraflow check` that needs no HF frontend: reading a script once (script_code.py,
script_facts.py), recognising one, and what the code decides around the HF Trainer / TRL reading of its options -
the options the code gives (a flag of the launch line overrides the keyword of the same name; attributes the code
sets on the parsed arguments override both), the stage its trainer class names, and the fields only code shows (a
model moved or cast after a quantized load, an adapter merged into a quantized base, a saved adapter loaded frozen,
the input-grad hook, Unsloth). hf.py's apply_script puts them together; python_script.py is the frontend.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from loraflow.errors import LoraflowError
from loraflow.frontends import adapter_dtype
from loraflow.frontends import trl as trl_rel
from loraflow.frontends.argv import resolve_path
from loraflow.frontends.base import Mitigation
from loraflow.frontends.common import Draft, as_bool, at_least
from loraflow.frontends.hf_options import Opt
from loraflow.frontends.intent import infer
from loraflow.frontends.kbit_facts import move_refused
from loraflow.frontends.script_args import as_parsed
from loraflow.frontends.script_code import Call, Code, Parsed, Unread, read_code
from loraflow.frontends.script_dicts import settle
from loraflow.frontends.script_flags import keyword_flags
from loraflow.frontends import script_unsloth as unsloth_vllm
from loraflow.frontends.script_zero_init import apply_zero_init, computed_config, deepspeed_opt
from loraflow.frontends.script_lineage import bits_of, lineage, load_of
from loraflow.frontends.script_loop import apply_loop, plugin_policy
from loraflow.frontends.script_optimizer import optimizer_params
from loraflow.frontends.script_placement import placement
from loraflow.frontends.script_facts import API_PACKAGES, Facts, gather, kind, prequantized
from loraflow.frontends.script_wild import (adalora, adapter_reads, cause_fixes, engine_moves_peft, kbit_prep_after_wrap,
                                             nothing_truncates, peft_config_on_peft_model, plain_args_defaults,
                                             spawned)

NAME = "python-script"
# Combination field -> what to change in the script's code (words every fix; the launch-line path keeps hf's flags
# and adds the fields only code sets).
CODE_FLAGS = {"adapter_loaded_frozen": "PeftModel.from_pretrained(..., is_trainable=True)",
              "quantized_moved": "from_pretrained(device_map={'': local_rank}) for the quantized model, and no "
                                 ".to(...) / .cuda() / .half() on it afterwards",
              "merge_into_quantized": "merge_and_unload() on the quantized model (merge into a base loaded in "
                                      "bf16/fp16)",
              "task_head_saved": "LoraConfig(task_type=\"SEQ_CLS\") or modules_to_save=[\"score\"]",
              "model_split": "device_map= in from_pretrained ({'': local rank} per process; 'auto' in one process "
                             "only)",
              "device_map_load": "device_map= / low_cpu_mem_usage= in from_pretrained (neither under ZeRO-3)",
              "unsloth": "FastLanguageModel (Unsloth)", "input_grad_hook": "model.enable_input_require_grads()",
              "state_dict_patched": "the `model.state_dict = ... get_peft_model_state_dict(...)` lines (delete them: "
                                    "model.save_pretrained saves the adapter)",
              "peft_config_on_peft_model": "the get_peft_model(...) before the trainer, or the trainer's peft_config= "
                                           "(keep one)",
              "adapter_rank": "LoraConfig(r=...) / FastLanguageModel.get_peft_model(r=...)",
              "engine_max_lora_rank": "FastLanguageModel.from_pretrained(max_lora_rank=...) (Unsloth's vLLM engine)"}
FLAGS = {"checkpointing": "gradient_checkpointing=True (TrainingArguments) or model.gradient_checkpointing_enable()",
         "reentrant": "gradient_checkpointing_kwargs={\"use_reentrant\": ...}",
         "precision": "bf16= / fp16= (TrainingArguments); keep what trains in float32 (no .half() / .to(dtype) after "
                      "get_peft_model, no float16 torch_dtype with modules_to_save)",
         "engine": "deepspeed= / fsdp= (TrainingArguments) or the launcher",
         "zero_stage": "\"stage\" in the zero_optimization section of the DeepSpeed config the script passes",
         "offload": "offload_optimizer / offload_param in the DeepSpeed config the script passes",
         "adapter": "LoraConfig(...) + get_peft_model (use_dora=True for DoRA)",
         "quantization": "BitsAndBytesConfig(load_in_4bit=...) in from_pretrained(quantization_config=...)",
         "quant_storage_matches": "BitsAndBytesConfig(bnb_4bit_quant_storage=...)",
         "matched_modules": "LoraConfig(target_modules=...)", "no_default_targets": "LoraConfig(target_modules=...)",
         "use_cache": "model.config.use_cache",
         "find_unused_parameters": "ddp_find_unused_parameters= (TrainingArguments)",
         "ddp_static_graph": "ddp_static_graph=True (TrainingArguments)",
         "world_size": "the launcher's process count",
         "grad_accum_steps": "gradient_accumulation_steps= (TrainingArguments, or Accelerator(...) in the script's "
                             "own loop)", **CODE_FLAGS}
# Importing one of these makes a file a training script check reads (accelerate and deepspeed alone do not: their
# calls are read where a script makes them).
_LIBRARIES = tuple(p for p in API_PACKAGES if p not in ("accelerate", "deepspeed"))


@dataclass
class Script:
    path: Path
    code: Code
    facts: Facts

    @property
    def whole(self) -> bool:
        """The code shows how it trains (a trainer or a training step), and leaves no code out (`trainer = ...`):
        not a fragment, nor an inference script."""
        return bool(self.facts.trainer or self.facts.trains) and not self.code.elided_code


_CACHE: dict[tuple[str, int, int], Script] = {}


def read_script(path: str | Path) -> Script:
    p = Path(path)
    try:
        stat = p.stat()
        key = (str(p.resolve()), stat.st_mtime_ns, stat.st_size)
        if key not in _CACHE:  # check builds the setup once per release scenario: parse once
            text = p.read_text(encoding="utf-8", errors="replace")
            code = read_code(text, p.name)
            _CACHE[key] = Script(p, code, gather(code))
        return _CACHE[key]
    except OSError as exc:
        raise LoraflowError(f"cannot read the training script {path}: {exc.strerror}.") from None


def recognised(code: Code) -> bool:
    """The code imports or calls what check reads: transformers, PEFT, TRL, bitsandbytes, Unsloth."""
    if code.packages() & set(_LIBRARIES):
        return True
    return any(kind(c, code) not in ("", "harmless", "trains", "parser", "place") for c in code.calls)


def looks_like_script(text: str) -> bool:
    """Pasted text that is Python training code (a snippet from an issue), not a config file or a command."""
    return recognised(read_code(text, "snippet.py"))


def script_of(program: str) -> Script | None:
    """The launch line's program when it is a Python file here that check can read (for hf.py). A module launch of a
    script of one's own (`torchrun -m hf_trainer`, Chunk-loss-LoRA's example/hf_trainer.py) is its file here; dotted
    modules (`-m axolotl.cli.train`) belong to a package, not to a script beside the launch."""
    if program.isidentifier():
        program += ".py"
    if not program.endswith(".py"):
        return None
    path = resolve_path(program)
    if path is None:
        return None
    script = read_script(path)
    return script if recognised(script.code) else None


def live(draft: Draft, script: Script, flags: dict[str, Opt]) -> Script:
    """The script as this launch runs it: calls under an `if` over a parsed flag that the launch line, or else the
    field's default in the script's own argument dataclass, turns off are dropped (MiniCPM-V's finetune.py builds
    its LoraConfig under `if training_args.use_lora:`, which finetune_ds.sh leaves at False)."""
    off: dict[str, str] = {}

    def runs(guard: tuple[tuple[str, bool], ...]) -> bool:
        for name, wanted in guard:
            given = [o for o, dest in script.code.dests.items() if dest == name and o in flags]
            opt = flags.get(given[0]) if given else flags.get(name)
            default = script.code.defaults.get(name)
            value, where = as_parsed(script.code, name, opt.value if opt.value is not None else True, opt.source) \
                if opt is not None else (default, f"{script.code.file}: {name} defaults to {default}")
            if isinstance(value, bool) or (isinstance(value, str) and opt is not None):
                try:
                    if as_bool(value, where) != wanted:
                        off.setdefault(name, f"it needs {name} {'on' if wanted else 'off'}; {where}")
                        return False
                except LoraflowError:
                    continue
        return True
    calls = [c for c in script.code.calls if runs(c.guard)]
    attributes = [a for a in script.code.attributes if runs(script.code.attribute_guards.get(a[3], ()))]
    if len(calls) == len(script.code.calls) and len(attributes) == len(script.code.attributes):
        return script
    for name, where in off.items():
        draft.note(f"{script.code.file}: the code under an `if` on {name} does not run here ({where})")
    code = replace(script.code, calls=calls, attributes=attributes)
    return Script(script.path, code, gather(code))


def options(draft: Draft, script: Script, flags: dict[str, Opt]) -> dict[str, Opt]:
    """The options hf.py reads: the code's, the launch line's flags over them, then what the code sets on the parsed
    arguments afterwards (`training_args.gradient_checkpointing = True`)."""
    flags = {n: Opt(*as_parsed(script.code, script.code.dests.get(n, n), o.value, o.source), o.derived)
             for n, o in flags.items()}  # `--fp16 False` to a `type=bool` flag is True
    mapped, used = keyword_flags(draft, script.code, flags)
    opts = {**plain_args_defaults(script.code, script.facts), **script.facts.opts, **mapped,
            **{n: o for n, o in flags.items() if n not in used}}
    for name, where in script.code.refused.items():
        if name not in opts:  # the script stops when it is on, so a run that trains has it off
            opts[name] = Opt(False, f"{where} (the script stops if it is on)")
        elif as_bool(opts[name].value, opts[name].source):
            draft.note(f"{opts[name].source}: the script stops at {where}")
    hint = opts.get("use_peft")
    if hint is not None and hint.source.endswith(_ELSEWHERE) and "use_peft" not in flags:
        # peft_config comes from a helper; the script's own flags (--use_peft_lora True) say whether it is one.
        said = infer({n: (o.value, o.source) for n, o in flags.items()})
        if said.adapter:
            opts["use_peft"] = Opt(said.adapter != "full", f"{said.sources['adapter']} (the script's own flag; "
                                   f"{hint.source.removesuffix(_ELSEWHERE)} takes its adapter)")
            if said.adapter == "dora":
                opts["use_dora"] = Opt(True, said.sources["adapter"])
    _checkpointing(opts, script.facts)
    opts.update(script.facts.late)
    unsloth_vllm.vllm_options(script.code, script.facts, opts)  # Unsloth's trainer sets these after the late ones
    if "deepspeed" not in opts:  # named by HfDeepSpeedConfig, else computed: still a DeepSpeed run
        found = deepspeed_opt(draft, script.facts) or computed_config(script.code)
        if found is not None:
            opts["deepspeed"] = found
    settle(draft, opts, flags, script.code)  # dicts with computed values: the literal keys read, the rest listed
    nothing_truncates(draft, script.facts, script.code, opts)
    return opts


def finish(draft: Draft, script: Script) -> None:
    """After the world size is known: per-rank placement, what was not read, and the fixes in the code's words."""
    spawned(draft, script.code)
    placement(draft, script)
    _unsloth_ddp(draft, script)
    unsloth_vllm.vllm_rollouts(draft, script.code, script.facts)
    unsloth_vllm.vision_tower_hook(draft, script.facts)
    unsloth_vllm.precision_against_load(draft, script.code, script.facts)
    draft.unknown.extend(script.facts.unknown)
    for note in script.facts.notes:
        draft.note(note)
    # A fix names the code to change where the code set the value, the flag where a flag did.
    # A script without an argument parser takes no flags: every fix is in its code's words.
    draft.flags.update({k: v for k, v in FLAGS.items() if draft.sources.get(k, "").startswith(script.code.file + ":")
                        or k in CODE_FLAGS or not script.facts.parser})
    draft.flags.update(cause_fixes(draft.sources))
    for line in script.code.skipped:
        draft.note(line)
    if script.code.elided:
        draft.note(f"{script.code.file}: `...` on line(s) {', '.join(map(str, script.code.elided))} stands for "
                   "arguments left out of the snippet; they are not read")


def _checkpointing(opts: dict[str, Opt], facts: Facts) -> None:
    """Checkpointing the code turns on itself. The Trainer calls gradient_checkpointing_enable again at train() with
    its own kwargs when its switch is on, so the code's call decides only where the switch is off or absent."""
    call = facts.gc
    if call is None:
        return
    switch = opts.get("gradient_checkpointing")
    if switch is not None and as_bool(switch.value, switch.source):
        return
    opts["gradient_checkpointing"] = Opt(True, call.at())
    if facts.gc_kwargs is not None:
        where = (f"{call.at('use_gradient_checkpointing')} (Unsloth's prepare_model_for_training: use_reentrant=True, "
                 "unsloth_zoo/training_utils.py)" if facts.unsloth and call.name == "get_peft_model" else
                 call.at("gradient_checkpointing_kwargs"))
        opts["gradient_checkpointing_kwargs"] = Opt(facts.gc_kwargs, where)


def stage(script: Script, fallback) -> tuple[tuple[str, str], str]:
    """The stage: TRL's trainer or config class, else a sequence-classification model (a new score head, trained as
    a reward model), else transformers' Trainer on a causal LM."""
    facts = script.facts
    if facts.trainer_key and facts.named_by is not None:
        return (trl_rel.TRAINERS[facts.trainer_key], facts.named_by.at()), facts.trainer_key
    if facts.seqcls is not None:
        return (trl_rel.TRAINERS["reward"], f"{facts.seqcls.at()} (a sequence-classification model: a new score "
                                             "head)"), "reward"
    if facts.trainer is not None:
        return (trl_rel.TRAINERS["sft"], f"{facts.trainer.at()} (transformers' Trainer on a causal LM)"), "sft"
    if facts.lightning is not None:
        return (trl_rel.TRAINERS["sft"], f"{facts.lightning.at()} (Lightning runs the LightningModule's "
                                         "training_step)"), "sft"
    return fallback or ((trl_rel.TRAINERS["sft"], "assumed (the script shows no trainer)"), "sft")


def code_only(draft: Draft, script: Script, whole: bool) -> None:
    facts = script.facts
    apply_loop(draft, facts, script.code)  # the engine and precision a cast is read against
    if draft.sources.get("adapter", "").startswith("assumed: no PEFT flag"):
        # hf.py's wording is about flags; the code itself shows no adapter.
        guarded = any(" the code under an `if` on " in n for n in draft.notes)  # live() left calls out
        draft.set("adapter", "full", f"{script.code.file}: no LoraConfig, get_peft_model or PeftModel " + (
            "runs here (the code under an `if` that is off is left out: see the notes)" if guarded else "in the code"))
        draft.notes = [n for n in draft.notes if not n.startswith("no PEFT flag in the command")]
    if draft.sources.get("adapter", "").endswith(_ELSEWHERE):  # peft_config=<a helper's result>: None or a config
        draft.maybe("adapter", {"lora": "the trainer's peft_config is an adapter config",
                                "full": "the trainer's peft_config is None (full fine-tuning)"},
                    f"{draft.sources['adapter'].removesuffix(_ELSEWHERE)}: built where the code does not show")
    if facts.hook:
        draft.set("input_grad_hook", True, facts.hook)
        draft.unsure.pop("input_grad_hook", None)
    elif facts.trainer is not None and facts.trainer_key and "peft_config" in facts.trainer.kwargs and \
            not facts.wraps and draft.get("adapter") != "full":
        # TRL's trainer builds the adapter from peft_config itself and hooks the embedding output with it (as the
        # flags-only reading of a TRL run says), so the script needs no hook of its own.
        draft.set("input_grad_hook", *trl_rel.hook(draft, facts.trainer_key))
        draft.unsure.pop("input_grad_hook", None)
    if facts.unsloth:
        draft.set("unsloth", True, f"{facts.unsloth} (Unsloth loads and patches the model)")
    if facts.state_dict_patch:
        draft.set("state_dict_patched", True, f"{facts.state_dict_patch} (the model's state_dict returns PEFT's "
                  "adapter state dict)")
    _loaded_frozen(draft, script)
    frozen = kbit_prep_after_wrap(script.code, facts, lineage)
    if frozen:  # the same outcome as an adapter loaded for inference: no parameter requires grad
        draft.set("adapter_loaded_frozen", True, frozen)
    _task_head(draft, script)
    _casts(draft, script)
    _moves(draft, script)
    optimizer_params(draft, script.facts.engine_moves, (script.path.parent,))
    _merges(draft, script)
    apply_zero_init(draft, facts, script.code)
    plugin_policy(draft, script.code)
    adapter_reads(draft, facts)
    adalora(draft, facts)
    peft_config_on_peft_model(draft, facts, script.code, lineage)
    if not whole:
        draft.note(f"{script.code.file} shows no trainer and no training step: read as a part of a script, so what "
                   "it does not show is left open")
        if draft.get("adapter") == "full" and not facts.configs and not facts.wraps and not facts.peft_loads:
            draft.maybe("adapter", {"full": "the rest of the script trains every weight",
                                    "lora": "the rest of the script adds LoRA adapters (get_peft_model)"},
                        "the snippet does not show whether the model gets adapters")


_ELSEWHERE = " (an adapter config built elsewhere)"


def _loaded_frozen(draft: Draft, script: Script) -> None:
    """PeftModel.from_pretrained loads an adapter for inference unless is_trainable=True (peft peft_model.py)."""
    facts, code = script.facts, script.code
    merged = {id(c) for m in facts.merges for c in lineage(m, code)}
    for load in facts.peft_loads:
        trainable = load.kwargs.get("is_trainable", False)
        if trainable is True or id(load) in merged:
            continue
        if facts.trains and not isinstance(trainable, Unread) and code.always_runs(load):
            draft.set("adapter_loaded_frozen", True, f"{load.at()} (without is_trainable=True the adapter loads "
                      "frozen)")
        else:
            why = (f"{load.at()} is in {load.scope}(), which the script only hands on (a hook): whether it runs before "
                   "training is not visible" if not code.always_runs(load) else
                   f"{load.at()}: the code does not show whether this adapter is trained")
            draft.maybe("adapter_loaded_frozen", {True: "the loaded adapter is then trained",
                                                  False: "the loaded adapter is only used for inference"}, why)


def _task_head(draft: Draft, script: Script) -> None:
    """A sequence-classification model's new score head is saved with the adapter only as PEFT's modules_to_save:
    task_type SEQ_CLS adds it (peft PeftModelForSequenceClassification), or the script names it."""
    from loraflow.stagespec import STAGES

    spec = STAGES.get(draft.get("stage"))
    facts = script.facts
    if spec is None or spec.head != "score" or draft.get("adapter") == "full":
        return
    for config in facts.configs:
        task, keep = config.kwargs.get("task_type"), config.kwargs.get("modules_to_save")
        if str(task).upper().endswith("_CLS"):  # SEQ_CLS, TOKEN_CLS: PEFT's classification models
            draft.set("task_head_saved", True, f"{config.at('task_type')} (PEFT trains and saves the score head)")
            return
        if isinstance(keep, list) and any(h in str(m) for m in keep for h in ("score", "classifier", "head")):
            draft.set("task_head_saved", True, config.at("modules_to_save"))
            return
    if facts.configs:
        draft.set("task_head_saved", False, f"{facts.configs[0].at()} (no task_type=SEQ_CLS and no score head in "
                  "modules_to_save: the new head stays out of the adapter)")
    elif facts.peft_loads or facts.saved_configs:
        where = (facts.peft_loads or facts.saved_configs)[0]
        draft.maybe("task_head_saved", {True: "the saved adapter holds the score head (its modules_to_save)",
                                        False: "the saved adapter holds only the LoRA weights"},
                    f"{where.at()}: what the saved adapter holds is in its adapter_config.json, not visible here")


def _bits(draft: Draft, script: Script, value) -> str | None:
    """The quantization of the model a value holds; where the code does not show its load, the script's."""
    found = bits_of(load_of(value, script.code), script.code)
    return draft.get("quantization") if found == "?" else found


def _casts(draft: Draft, script: Script) -> None:
    """model.half() / .to(torch.bfloat16): a quantized model refuses the cast. Otherwise the weights that train are
    stored in half precision when the cast comes after the adapters are added, or in full fine-tuning; a base made
    half before the adapters (or loaded so) passes its dtype to what PEFT copies from it (modules_to_save), and to
    the adapters themselves before peft 0.12 (autocast_adapter_dtype)."""
    facts, code = script.facts, script.code
    base: tuple[str, str] | None = None
    if facts.opts.get("torch_dtype") is not None and str(facts.opts["torch_dtype"].value) in _HALF:
        base = (str(facts.opts["torch_dtype"].value), facts.opts["torch_dtype"].source)
    for call, dtype in facts.casts:
        if dtype != "base" and _bits(draft, script, call.owner):
            draft.set("quantized_moved", True, f"{call.at()} (casts a quantized model)")
            continue
        if dtype == "base":  # get_peft_model(..., autocast_adapter_dtype=False): adapters in the base's dtype
            dtype = base[0] if base else str((load_of(call.arg(0, "model"), code) or call).kwargs.get("torch_dtype"))
        if dtype not in _HALF:
            continue
        if any(w.line <= call.line for w in facts.wraps) or draft.get("adapter") == "full":
            _half(draft, dtype, f"{call.at()} (the trained weights are stored in {dtype})")
        else:
            base = (dtype, call.at())
    if base is None or draft.has("precision") and draft.get("precision") in _HALF.values():
        return
    dtype, where = base
    saved = [c.kwargs.get("modules_to_save") for c in facts.configs]
    if draft.get("adapter") == "full":
        _half(draft, dtype, f"{where} (full fine-tuning trains the weights in {dtype})")
    elif any(m and (not isinstance(m, Unread) or m.text not in ("[]", "None")) for m in saved):
        _half(draft, dtype, f"{where} (modules_to_save copies the {dtype} modules: they train in {dtype})")
    elif not draft.get("quantization") and not any("quantization_config" in c.kwargs for c in facts.loads) and \
            adapter_dtype.adapters_follow_base(draft):  # a quantized base is k-bit prepared: its adapters are float32
        _half(draft, dtype, f"{where} ({adapter_dtype.WHY})")


_HALF = {"bfloat16": "bf16", "float16": "fp16"}
_half = adapter_dtype.trained_in_half


def _moves(draft: Draft, script: Script) -> None:
    """A k-bit model moved after loading: transformers refuses 8-bit moves, and 4-bit ones before bitsandbytes
    0.43.2 (modeling_utils.py PreTrainedModel.to); a DeepSpeed engine moves the module it wraps."""
    for call in script.facts.engine_moves:
        model = call.kwargs.get("model")
        bits = _bits(draft, script, model)
        if bits and (bits == "?" or not engine_moves_peft(model, script.code, lineage) and move_refused(draft, bits)):
            draft.set("quantized_moved", True, f"{call.at()} (the DeepSpeed engine moves the model to its device)")
    for call in script.facts.moves:
        bits = _bits(draft, script, call.owner)
        if move_refused(draft, bits):
            draft.set("quantized_moved", True, f"{call.at()} (moves a {bits} model after loading)")


def _merges(draft: Draft, script: Script) -> None:
    """merge_and_unload on a k-bit model. Where the code does not show how the merged model was loaded (a fragment,
    AutoPeftModel loading the base its adapter names), the base may be a pre-quantized checkpoint."""
    facts = script.facts
    for call in facts.merges:
        load = load_of(call.owner, script.code)
        found = bits_of(load, script.code)
        if found in ("4bit", "8bit") or (load is None and draft.get("quantization")):
            draft.set("merge_into_quantized", True, f"{call.at()} (merges the adapter into the quantized base)")
        elif found == "?" and not facts.loads and draft.get("quantization") is None:
            draft.set("merge_into_quantized", True, f"{call.at()} (merges into quantized weights if the base is "
                      "quantized)")
            draft.maybe("quantization", {None: "the base is not quantized",
                                         "4bit": "the base checkpoint is pre-quantized (quantization_config in its "
                                                 "config.json)"},
                        f"{call.at()}: the code does not show how the merged model's base was loaded")


# Unsloth's vision loader (FastModel, FastVisionModel) checkpoints non-reentrantly under DDP since PR #3751 (merged
# 2025-12-19, first in 2025.12.8; unsloth/models/vision.py `use_reentrant = not is_distributed()`); FastLanguageModel
# stays reentrant (unsloth/models/llama.py prepare_model_for_kbit_training(use_reentrant=True)).
UNSLOTH_VISION_DDP = Mitigation(("ddp-reentrant-unused",), "2025.12.8", "FastModel / FastVisionModel checkpoint "
                                "non-reentrantly in a multi-process launch (FastLanguageModel stays reentrant)",
                                "unsloth/models/vision.py (PR #3751)", package="unsloth")


def _unsloth_ddp(draft: Draft, script: Script) -> None:
    if not (script.facts.unsloth_vision and draft.get("world_size") > 1 and draft.get("checkpointing") != "off"
            and "Unsloth's prepare_model_for_training" in draft.sources.get("reentrant", "")):
        return
    # The script reader also serves the HF frontend's reading of a script, so the release is read here directly.
    if at_least(draft, "unsloth", UNSLOTH_VISION_DDP.since):
        draft.set("reentrant", False, f"Unsloth >= {UNSLOTH_VISION_DDP.since} checkpoints FastModel / "
                  "FastVisionModel models non-reentrantly in a multi-process launch (unsloth/models/vision.py, "
                  "unslothai/unsloth PR #3751)")
