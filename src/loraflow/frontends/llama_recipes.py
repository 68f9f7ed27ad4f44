"""llama-recipes (meta-llama/llama-recipes, renamed llama-cookbook in 2025; pip `llama-recipes`, then `llama-cookbook`):
`python -m llama_recipes.finetuning --use_peft ...`, `torchrun ... getting-started/finetuning/finetuning.py
--enable_fsdp ...` and the same script at its older places (llama_finetuning.py, examples/, recipes/finetuning/,
recipes/quickstart/finetuning/). Flags go through python-fire into finetuning.main(**kwargs), and
utils/config_utils.py update_config sets each on every config that has the attribute: a flat `--use_fp16` sets
train_config's and fsdp_config's alike, `--fsdp_config.pure_bf16` only fsdp_config's.

What finetuning.py does with them, read at each release (src/llama_recipes/, src/llama_cookbook/ from 0.0.5):
- The model: LlamaForCausalLM.from_pretrained (MllamaForConditionalGeneration for a Vision model from 0.0.4), in
  float32 before 0.0.3, in torch_dtype=float16 if use_fp16 else bfloat16 from 0.0.3; use_cache=False under FSDP.
- Quantization: a bool before 0.0.3 (load_in_8bit, then prepare_model_for_int8_training - kbit from 0.0.2 - which
  turns on transformers' checkpointing and the input-grad hook); from 0.0.3 `4bit`/`8bit` through
  quantization_config.create_bnb_config (quant_storage bfloat16), a bare switch read as 8bit with a FutureWarning,
  8bit beside --enable_fsdp refused, and no k-bit preparation at all.
- PEFT: get_peft_model(model, LoraConfig(q_proj, v_proj)) after loading, before FSDP.
- --enable_fsdp: FSDP1 (FullyShardedDataParallel) with fsdp_auto_wrap_policy (each trainable leaf its own unit, each
  decoder layer one) for PEFT, the decoder-layer policy otherwise; use_orig_params not passed (False) before 0.0.5,
  freeze_LLM_only's value from 0.0.5. Mixed precision from get_policies (bfSixteen_mixed - float32 params - in 0.0.1,
  bfSixteen from 0.0.2, fpSixteen with use_fp16) unless pure_bf16, which casts the model to bfloat16 instead.
  fsdp_activation_checkpointing (on by default) wraps each decoder layer in torch's checkpoint_wrapper
  (NO_REENTRANT); from 0.0.3 it also calls enable_input_require_grads() and gradient_checkpointing_enable().
- Without --enable_fsdp no process group is made: every process torchrun starts trains a copy of its own (no DDP).
- fp16: train_utils.py scales the loss with ShardedGradScaler under FSDP, torch.cuda.amp.GradScaler otherwise.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

from packaging.version import Version

from loraflow.errors import LoraflowError
from loraflow.frontends.adapter_dtype import adapters_follow_base
from loraflow.frontends.argv import Command, parse_flags, script_command
from loraflow.frontends.base import Framework, FrontendResult
from loraflow.frontends.common import Draft, at_least, embedding_targets, finish_world
from loraflow.frontends.model_types import model_name_facts
from loraflow.frontends.llama_recipes_keys import CONFIG_KEYS, ERA_KEYS, OWN_FLAGS, SCRIPTS

NAME = "llama-recipes"
PKG = "llama-recipes"
SRC = "src/llama_recipes"
# The releases where what finetuning.py does changed (git tags v0.0.2 ... of meta-llama/llama-recipes; 0.0.1 is the
# PyPI wheel, whose code is commit 190c2e52).
DOTTED = "0.0.2"        # 5da84b29: update_config gets dataclass instances, so `--fsdp_config.x` reaches them
BF16_PARAMS = "0.0.2"   # get_policies: bfSixteen (bf16 params) replaced bfSixteen_mixed (fp32 params)
QLORA = "0.0.3"         # PR #572 (808a3f7a): 4bit/8bit, bf16 load, no k-bit preparation, hook + HF checkpointing
ORIG_PARAMS = "0.0.5"   # FSDP(use_orig_params=train_config.freeze_LLM_only)
NOT_USED = ("deepspeed", "trl", "accelerate")
FLAGS = {"engine": "--enable_fsdp", "world_size": "torchrun --nproc_per_node",
         "adapter": "--use_peft --peft_method lora", "quantization": "--quantization (4bit, 8bit)",
         "precision": "--fsdp_config.pure_bf16 / --use_fp16 / --mixed_precision",
         "checkpointing": "--fsdp_config.fsdp_activation_checkpointing", "offload": "--fsdp_config.fsdp_cpu_offload",
         "quant_storage_matches": "--quantization_config.quant_storage", "fsdp_use_orig_params":
         "FSDP(use_orig_params=...) in finetuning.py (no flag)", "frozen_modules": "--freeze_layers"}
_FALSE_WORDS = ("false", "no", "off", "none")


class Options:
    """The values finetuning.main's configs end up with: (config, field) -> (value, as written), in the order the
    line gives them (a later flag wins, as update_config's setattr does)."""

    def __init__(self) -> None:
        self.values: dict[tuple[str, str], tuple[Any, str]] = {}

    def get(self, config: str, key: str, default: Any = None) -> Any:
        return self.values[(config, key)][0] if (config, key) in self.values else default

    def src(self, config: str, key: str) -> str:
        return self.values[(config, key)][1]

    def has(self, config: str, key: str) -> bool:
        return (config, key) in self.values

    def on(self, config: str, key: str, default: bool = False) -> bool:
        return bool(self.get(config, key, default))


def _fire_value(text: str | None) -> Any:
    """python-fire's reading of a flag's value: a bare flag is True, Python literals are parsed, any other word is a
    string (so `false` is the non-empty, true string 'false')."""
    if text is None:
        return True
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _options(cmd: Command, draft: Draft) -> Options:
    args, positionals, _ = parse_flags(cmd.args)
    if positionals:
        draft.unknown.append(f"{' '.join(positionals)} (fire passes positionals to main(**kwargs), which takes none)")
    opts = Options()
    # Asked only where a dotted flag is given, so that lines without one do not split on this release.
    dotted_ok = any("." in a.name for a in args) and at_least(draft, PKG, DOTTED)
    for a in args:
        value = _fire_value(a.one())
        if isinstance(value, str) and value.lower() in _FALSE_WORDS:
            draft.note(f"{a.raw}: fire reads `{value}` as a string, which is true; write False to turn it off")
        name, dot, field = a.name.partition(".")
        if dot:
            known = CONFIG_KEYS.get(name)
            if known is None and not name.endswith("_dataset"):
                draft.unknown.append(f"{a.raw} (no llama-recipes config is named {name})")
            elif known is not None and field not in known:
                draft.unknown.append(f"{a.raw} ({name} has no field {field}: update_config warns and ignores it)")
            elif not dotted_ok:
                draft.note(f"{a.raw}: llama-recipes < {DOTTED} passes its config classes, not instances, to "
                           f"update_config, so a dotted flag reaches no config (fixed by commit 5da84b29); the flat "
                           f"--{field} works in every release")
            else:
                opts.values[(name, field)] = (value, a.raw)
            continue
        owners = [c for c, keys in CONFIG_KEYS.items() if a.name in keys]
        if not owners:
            draft.unknown.append(f"{a.raw} (update_config: `Warning: unknown parameter {a.name}`)")
        for config in owners:
            opts.values[(config, a.name)] = (value, a.raw)
    draft.eras_from(PKG, "llama-recipes", ERA_KEYS, {f for (_, f) in opts.values}, prefix="--")
    return opts


def _program(cmd: Command, draft: Draft) -> str:
    """How the line names finetuning.py, and the release range its place in the repository dates."""
    path = cmd.program.replace("\\", "/")
    if cmd.program_kind == "module":
        if not re.search(r"(?:^|\.)llama_(?:recipes|cookbook)\.finetuning$", path):
            raise LoraflowError(f"`-m {cmd.program}` runs no finetuning; loraflow check reads `python -m "
                                "llama_recipes.finetuning` and the finetuning.py scripts of llama-recipes.")
        if "llama_cookbook" in path:
            draft.era(PKG, ">=0.0.5", "the package is llama_cookbook from 0.0.5")
        return f"-m {cmd.program}"
    for pattern, spec, why in SCRIPTS:
        if re.search(pattern, path):
            if spec:
                draft.era(PKG, spec, why)
            return path
    if not path.endswith("finetuning.py"):
        if _copy(path):  # a user's copy under another name: read as finetuning.py, its own code unseen (exit 1)
            draft.unknown.append(f"{path}: the user's copy of llama-recipes' finetuning.py (its flags are "
                                 "finetuning.py's), read as finetuning.py; its code is not read")
            return path
        raise LoraflowError(f"`{cmd.program}`: loraflow check reads llama-recipes' finetuning.py (or `python -m "
                            "llama_recipes.finetuning`), not its other scripts.")
    return path


def _copy(path: str) -> bool:
    """A script named for fine-tuning that is not one of llama-recipes' places (UNITES-Lab/MoE-RBench's
    `finetuning_llama.py --enable_fsdp --batch_size_training 64 --dist_checkpoint_root_folder ...`)."""
    return path.endswith(".py") and "finetun" in Path(path).name.lower()


def _quantization(draft: Draft, opts: Options, fsdp: bool) -> str | None:
    value = opts.get("train_config", "quantization")
    if not value:
        return None
    raw = opts.src("train_config", "quantization")
    given = draft.version(PKG)
    if isinstance(value, str) and value not in ("4bit", "8bit") and (given is None or given >= Version(QLORA)):
        raise LoraflowError(f"`{raw}`: llama-recipes reads --quantization 4bit or 8bit (from {QLORA} "
                            "quantization_config.create_bnb_config raises `ValueError: quantization must be either "
                            "'4bit' or '8bit'`); give --quantization 4bit for QLoRA.")
    if not at_least(draft, PKG, QLORA):
        draft.set("quantization", "8bit", f"{raw} (llama-recipes < {QLORA}: a bool, load_in_8bit=True; "
                  f"{SRC}/finetuning.py)")
        if value != True:  # noqa: E712 - fire's True, as opposed to a word it read
            draft.note(f"{raw}: before {QLORA} --quantization is a bool, so any value loads the model in 8-bit")
        if fsdp:  # nothing refuses it before 0.0.3; FSDP1 meets the int8 weights when it flattens the first unit
            draft.note(f"{raw} with --enable_fsdp: llama-recipes < {QLORA} wraps the 8-bit model in FSDP, which "
                       "cannot flatten its int8 weights (`ValueError: Cannot flatten integer dtype tensors`)")
        return "8bit"
    if value is True:
        draft.note(f"{raw}: a bare --quantization is read as 8bit with a FutureWarning (llama-recipes >= {QLORA}); "
                   "give --quantization 4bit or 8bit")
        bits = "8bit"
    else:
        bits = value
        draft.era(PKG, f">={QLORA}", f"--quantization {value} is the spelling of llama-recipes >= {QLORA}")
    draft.set("quantization", bits, f"{raw} ({SRC}/configs/quantization.py create_bnb_config)")
    if bits == "8bit" and fsdp:
        draft.note(f"{raw} with --enable_fsdp: llama-recipes >= {QLORA} raises `ValueError: 8bit quantization is not "
                   "supported with FSDP, please use 4bit quantization` before training")
    return bits


def _adapter(draft: Draft, opts: Options, fsdp: bool, model: str) -> None:
    if not opts.on("train_config", "use_peft"):
        draft.set("adapter", "full", f"no --use_peft (train_config.use_peft: False, {SRC}/configs/training.py)")
        if opts.on("train_config", "freeze_layers"):
            if fsdp:
                draft.set("frozen_modules", True, f"{opts.src('train_config', 'freeze_layers')} "
                          "(freeze_transformer_layers, under --enable_fsdp only)")
            else:
                draft.note("--freeze_layers: finetuning.py freezes layers only under --enable_fsdp")
        return
    method = opts.get("train_config", "peft_method", "lora")
    where = opts.src("train_config", "peft_method") if opts.has("train_config", "peft_method") else \
        "default (train_config.peft_method: lora)"
    if method not in ("lora", "llama_adapter", "prefix"):
        raise LoraflowError(f"`--peft_method {method}`: llama-recipes knows lora, llama_adapter and prefix "
                            "(generate_peft_config raises `Peft config not found`); give --peft_method lora.")
    if method == "prefix":
        draft.note("--peft_method prefix: generate_peft_config raises `PrefixTuning is currently not supported` "
                   "(llama-recipes >= 0.0.2)")
    if method == "llama_adapter":
        draft.note("--peft_method llama_adapter trains LLaMA-Adapter prompts on a frozen base: read as an adapter run"
                   + ("; with --enable_fsdp generate_peft_config raises `Llama_adapter is currently not supported in "
                      "combination with FSDP` (>= 0.0.2)" if fsdp else ""))
    draft.set("adapter", "lora", f"--use_peft, {where} ({SRC}/utils/config_utils.py generate_peft_config)")
    targets = opts.get("lora_config", "target_modules")
    if isinstance(targets, (list, tuple)):
        embedding_targets(draft, [str(t) for t in targets], opts.src("lora_config", "target_modules"), model)
    if opts.get("train_config", "from_peft_checkpoint"):
        draft.note("--from_peft_checkpoint: PeftModel.from_pretrained(..., is_trainable=True), trainable; in 0.0.3 "
                   "and 0.0.4 the next line calls model.peft_config(), a dict: `TypeError: 'dict' object is not "
                   "callable`")


def _storage(draft: Draft, opts: Options, fsdp: bool, quantized: bool) -> tuple[str, str]:
    """The dtype the base's unquantized weights are stored in when training starts, and why."""
    fp16 = opts.on("train_config", "use_fp16")
    pure = fsdp and opts.on("fsdp_config", "pure_bf16") and not (quantized and at_least(draft, PKG, QLORA))
    if pure:
        return "bf16", f"{opts.src('fsdp_config', 'pure_bf16')}: model.to(torch.bfloat16), no FSDP MixedPrecision"
    if opts.on("fsdp_config", "pure_bf16"):
        draft.note("--pure_bf16 acts only under --enable_fsdp and, from 0.0.3, without --quantization")
    if at_least(draft, PKG, QLORA):
        dtype = "fp16" if fp16 else "bf16"
        why = f"{opts.src('train_config', 'use_fp16')}: " if fp16 else ""
        return dtype, f"{why}from_pretrained(torch_dtype=float16 if use_fp16 else bfloat16) (llama-recipes >= {QLORA})"
    return "fp32", f"from_pretrained without torch_dtype: float32 (llama-recipes < {QLORA})"


def _compute(draft: Draft, opts: Options, fsdp: bool, storage: str) -> tuple[str, str]:
    """The dtype the forward runs in: FSDP's MixedPrecision param_dtype (get_policies), autocast with use_fp16."""
    if fsdp and storage == "bf16" and opts.on("fsdp_config", "pure_bf16"):
        return "bf16", "pure_bf16"
    if fsdp and opts.on("fsdp_config", "mixed_precision", True):
        if opts.on("fsdp_config", "use_fp16"):
            return "fp16", f"{opts.src('fsdp_config', 'use_fp16')}: get_policies -> fpSixteen (param_dtype float16)"
        if not at_least(draft, PKG, BF16_PARAMS):
            return storage, "get_policies -> bfSixteen_mixed (param_dtype float32) in llama-recipes 0.0.1"
        if storage == "fp32":
            draft.maybe("precision", {"bf16-mixed": "a GPU with bfloat16 (get_policies: bfSixteen)",
                                      "fp32": "a GPU without it (`bFloat16 support not present`)"},
                        "get_policies picks bfSixteen only where torch.cuda.is_bf16_supported()")
            return "bf16", "get_policies -> bfSixteen (param_dtype bfloat16) on a GPU with bfloat16"
        return storage, f"the model is stored in {storage}"
    if opts.on("train_config", "use_fp16"):
        return "fp16", f"{opts.src('train_config', 'use_fp16')}: train_utils.py runs forward under autocast"
    return storage, f"the model is stored in {storage}" if storage != "fp32" else "no autocast, no FSDP policy"


def _precision(draft: Draft, opts: Options, fsdp: bool, bits: str | None) -> None:
    storage, why = _storage(draft, opts, fsdp, bits is not None)
    compute, how = _compute(draft, opts, fsdp, storage)
    full = draft.get("adapter") == "full"
    if full or storage == "fp32" or bits == "8bit":
        trained = storage if full else "fp32"
        reason = "full fine-tuning trains the stored weights" if full else (
            "LoRA weights beside int8 weights stay float32" if bits == "8bit" else "the base is float32")
    elif adapters_follow_base(draft):
        trained, reason = storage, "peft 0.7 - 0.11 create LoRA weights in the base layer's dtype"
    else:
        trained, reason = "fp32", "peft keeps LoRA weights in float32 (autocast_adapter_dtype from 0.12)"
    if trained == "fp32":
        precision = {"fp32": "fp32", "bf16": "bf16-mixed", "fp16": "fp16-mixed"}[compute]
    else:
        precision = trained
    draft.set("precision", precision, f"{why}; {how}; {reason}")
    if fsdp and draft.get("adapter") != "full" and trained == "fp32" and storage != "fp32":
        draft.set("mixed_param_dtypes", True, f"{reason}, beside a {storage} base")
    if opts.on("train_config", "use_fp16"):
        scaler = "ShardedGradScaler" if fsdp else "torch.cuda.amp.GradScaler"
        # torch's ShardedGradScaler unscales float16 gradients (_unscale_grads_(allow_fp16=True)): FSDP may hold them.
        draft.set("grad_scaler", not fsdp, f"{opts.src('train_config', 'use_fp16')}: train_utils.py {scaler}"
                  + (" (unscales fp16 gradients: allow_fp16=True)" if fsdp else ""))
    elif compute == "fp16":
        draft.set("grad_scaler", False, "fsdp_config.use_fp16 without train_config.use_fp16: no GradScaler")
        draft.note("FSDP computes in float16 without loss scaling (only the flat --use_fp16 sets train_config's, "
                   "which creates the ShardedGradScaler): small gradients underflow")
    if bits == "4bit" and fsdp:
        store = str(opts.get("quantization_config", "quant_storage", "bfloat16")).removeprefix("torch.")
        store = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(store, store)
        src = opts.src("quantization_config", "quant_storage") if opts.has("quantization_config", "quant_storage") \
            else "default (quantization_config.quant_storage: torch.bfloat16)"
        draft.set("quant_storage_matches", store == storage, f"{src} beside a {storage} base ({why})")


def _checkpointing(draft: Draft, opts: Options, fsdp: bool, bits: str | None) -> None:
    hf_default = not at_least(draft, "transformers", "5.0.0")
    hf_reentrant = (hf_default, "default (transformers < 5.0: use_reentrant=True when gradient_checkpointing_kwargs"
                    " is unset)" if hf_default else "default (transformers >= 5.0: use_reentrant=False)")
    new = at_least(draft, PKG, QLORA)
    prepared = bits is not None and not new
    if prepared:  # prepare_model_for_int8/kbit_training(use_gradient_checkpointing=True)
        draft.set("checkpointing", "all", f"--quantization: prepare_model_for_kbit_training ({SRC}/finetuning.py < "
                  f"{QLORA}) turns on gradient checkpointing")
        draft.set("checkpoint_impl", "transformers", "prepare_model_for_kbit_training -> gradient_checkpointing_enable")
        draft.set("input_grad_hook", True, "prepare_model_for_kbit_training hooks the embedding output")
        draft.set("reentrant", *hf_reentrant)
    if not fsdp:
        if not prepared:
            draft.set("checkpointing", "off", "without --enable_fsdp finetuning.py turns on no checkpointing")
        return
    key = "fsdp_activation_checkpointing"
    if not opts.on("fsdp_config", key, True):
        if not prepared:
            draft.set("checkpointing", "off", opts.src("fsdp_config", key))
        return
    where = opts.src("fsdp_config", key) if opts.has("fsdp_config", key) else \
        "default (fsdp_config.fsdp_activation_checkpointing: True)"
    wrapper = "apply_fsdp_checkpointing: torch's checkpoint_wrapper (CheckpointImpl.NO_REENTRANT) on each decoder layer"
    draft.set("checkpointing", "all", f"{where}: {wrapper}")
    if new:
        draft.set("checkpoint_impl", "transformers", f"{where}: gradient_checkpointing_enable() as well as {wrapper} "
                  f"(llama-recipes >= {QLORA})")
        draft.set("input_grad_hook", True, f"{where}: enable_input_require_grads() (llama-recipes >= {QLORA})")
        draft.set("reentrant", *hf_reentrant)
    elif not prepared:
        draft.set("checkpoint_impl", "torch-wrapper", f"{where}: {wrapper}")
        draft.set("reentrant", False, f"{SRC}/policies/activation_checkpointing_functions.py: non_reentrant_wrapper")


def _fsdp(draft: Draft, opts: Options, cmd: Command) -> None:
    draft.set("engine", "fsdp1", f"{opts.src('train_config', 'enable_fsdp')}: FullyShardedDataParallel")
    if cmd.launcher is None:
        draft.note("--enable_fsdp reads LOCAL_RANK, RANK and WORLD_SIZE: start finetuning.py with torchrun")
    if at_least(draft, PKG, ORIG_PARAMS):
        orig = opts.on("train_config", "freeze_LLM_only")
        draft.set("fsdp_use_orig_params", orig, f"FSDP(use_orig_params=train_config.freeze_LLM_only) "
                  f"(llama-recipes >= {ORIG_PARAMS})")
    else:
        draft.set("fsdp_use_orig_params", False, f"FSDP(...) without use_orig_params: torch's False "
                  f"(llama-recipes < {ORIG_PARAMS})")
    if draft.get("adapter") != "full":
        draft.set("fsdp_frozen_units_separate", True, f"{SRC}/utils/fsdp_utils.py fsdp_auto_wrap_policy: every leaf "
                  "with a trainable weight is its own unit")
    elif draft.get("frozen_modules"):
        draft.set("fsdp_frozen_units_separate", True, "freeze_transformer_layers freezes whole decoder layers, each "
                  "its own unit (get_llama_wrapper)")
    draft.set("use_cache", False, "finetuning.py: use_cache = False if train_config.enable_fsdp")
    if opts.on("fsdp_config", "fsdp_cpu_offload"):
        draft.set("offload", True, f"{opts.src('fsdp_config', 'fsdp_cpu_offload')}: CPUOffload(offload_params=True)")
    strategy = str(opts.get("fsdp_config", "sharding_strategy", ""))
    if strategy and strategy.rsplit(".", 1)[-1] != "FULL_SHARD":
        draft.note(f"{opts.src('fsdp_config', 'sharding_strategy')}: fire passes a string where fsdp_config holds a "
                   "ShardingStrategy; read as FSDP with FULL_SHARD's units")


def from_command(cmd: Command, versions: dict) -> FrontendResult:
    draft = Draft(NAME, versions)
    named = _program(cmd, draft)
    opts = _options(cmd, draft)
    fsdp = opts.on("train_config", "enable_fsdp")
    model = str(opts.get("train_config", "model_name", ""))
    draft.set("stage", "sft", f"{named} (causal-LM fine-tuning)")
    draft.set("not_used", NOT_USED, f"{SRC}/finetuning.py: its own loop (train_utils.py train), FSDP from torch")
    if model:
        model_name_facts(draft, Path(model.rstrip("/")).name, opts.src("train_config", "model_name"))
        if "vision" in model.lower():  # MllamaForConditionalGeneration from 0.0.4; its towers are not modelled here
            draft.note(f"{opts.src('train_config', 'model_name')}: a Llama 3.2 Vision model is read as its language "
                       "model; what its vision tower and cross-attention layers add is not checked")
    bits = _quantization(draft, opts, fsdp)
    _adapter(draft, opts, fsdp, model)
    if fsdp:
        _fsdp(draft, opts, cmd)
        finish_world(draft, cmd)
    else:
        draft.set("engine", "single", "no --enable_fsdp: finetuning.py makes no process group and no DDP")
        draft.set("world_size", 1, "no --enable_fsdp: each process trains alone")
        draft.set("use_cache", True, "from_pretrained(use_cache=None) keeps the model config's (True)")
        if cmd.world_size and cmd.world_size > 1:
            draft.note(f"{cmd.world_source}: without --enable_fsdp each of the {cmd.world_size} processes trains its "
                       "own copy on all the data (no DDP, no DistributedSampler); add --enable_fsdp")
    _precision(draft, opts, fsdp, bits)
    _checkpointing(draft, opts, fsdp, bits)
    draft.flag(**FLAGS)
    return draft.result()


def from_files(paths: list[str], versions: dict) -> FrontendResult:
    """A launch script holding the `torchrun ... finetuning.py` or `python -m llama_recipes.finetuning` line."""
    return from_command(script_command(paths, NAME, "python -m llama_recipes.finetuning --use_peft ..."), versions)


def _recognise(view) -> bool:
    if view.runs("llama_recipes") or view.runs("llama_cookbook"):
        return True
    own = {f for f in view.flags if f in OWN_FLAGS or f.startswith("fsdp_config.")}
    if any(re.search(pattern, view.program) for pattern, _, _ in SCRIPTS):
        return bool(own)
    if view.program.endswith("finetuning.py"):
        return len(own) >= 2
    # a renamed copy: three flags that only llama-recipes' finetuning.py takes
    return _copy(view.program.replace("\\", "/")) and len(own - {"use_peft", "peft_method"}) >= 3


FRAMEWORK = Framework(name=NAME, title="llama-recipes (llama-cookbook)", module="llama_recipes",
                      recognise=_recognise, flags=FLAGS, log_paths=r"llama_(?:recipes|cookbook)[/\\]", dated=True,
                      aliases=("llama_recipes", "llama-cookbook", "llama_cookbook"))
