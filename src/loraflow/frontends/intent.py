"""What a training script's own flags say it does, for scripts that are not a framework's entry point: PEFT's
example scripts, model vendors' `finetune_lora.sh`, forks. Their flags are their own (`--use_peft_lora`,
`--use_lora true`, `--lora_enable True`, `--use_llm_lora 16`, `--use_4bit_quantization`, `--q_lora`, `--use_reentrant`,
`--tune_vision`, `--fix_vit`), but the spellings follow a few common patterns. Each inference is reported as such,
with the flag it came from; a flag that suggests an adapter makes `check` evaluate the adapter case rather than
silently assume full fine-tuning.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from loraflow.families import VISION_NAMES
from loraflow.frontends.argv import parse_bool

_TRUE_INT = re.compile(r"^\d+$")
# Adapter switches (a boolean) and ranks (a number > 0 means an adapter), by name pattern.
_ADAPTER_SWITCH = re.compile(r"^(use_(peft_)?lora|lora_enable|enable_lora|use_(llm_|vision_)?lora|vision_lora|"
                             r"llm_lora|use_peft|peft|q_?lora|use_q_?lora|lora)$")
_ADAPTER_RANK = re.compile(r"^(lora_(r|rank|dim)|(llm|vision|actor)_lora_(r|rank|dim)|use_(llm|vision)_lora)$")
# `--finetuning_type lora`, and the same choice as scripts of their own spell it: `--train_mode lora`,
# `--finetune lora`, `--adapter_name lora` (LLM-Adapters' finetune.py), `--peft_method lora`, `--method qlora`.
_ADAPTER_TYPE = re.compile(r"^(finetun(e|ing)(_(type|method|mode|strategy))?|(train(ing)?|tun(er|ing)|sft|peft|ft)_"
                           r"(type|mode|method|strategy)|adapter(_(name|type|method))?|method)$")
_QUANT4 = re.compile(r"^(use_4bit(_quantization)?|load_in_4bit|q_?lora|use_q_?lora|4bit)$")
_QUANT8 = re.compile(r"^(use_8bit(_quantization)?|load_in_8bit|8bit)$")
_QUANT_BITS = re.compile(r"^(bits|quantization_bit|quant_bits|load_bits|load_in_bits)$")
# How the script's own 4-bit load is set up (qlora.py's `--double_quant --quant_type nf4`, PEFT's examples'
# `--use_nested_quant`): details of a k-bit load no rule reads, so read rather than listed as not understood.
_QUANT_DETAIL = re.compile(r"^((use_)?(double|nested)_quant|(bnb_4bit_)?(quant_type|use_double_quant))$")
_STORAGE = re.compile(r"^bnb_4bit_quant_storage(_dtype)?$")
_REENTRANT = re.compile(r"^(use_reentrant|gradient_checkpointing_use_reentrant|use_reentrant_gc|reentrant)$")
_DORA = re.compile(r"^use_dora$")
# Sharding switches of scripts' own (`--use_fsdp`, `--enable_fsdp`): the script wraps the model in FSDP itself, so
# which FSDP and its use_orig_params are the script's code, not a flag of the HF Trainer.
OWN_DS_CONFIG = re.compile(r"^(ds_file|ds_config(_file|_path)?|deepspeed_(config|file)(_file|_path)?|zero_config)$")
"""A script's own flag naming the DeepSpeed JSON it hands to deepspeed.initialize (`--ds_file ds_zero2.json`)."""
_FSDP = re.compile(r"^(use_fsdp|enable_fsdp)$")
# Towers a vision-language script trains or freezes: `--tune_vision true`, `--tune_llm false`, `--fix_vit True`,
# `--freeze_vision_tower`, `--freeze_llm`, `--freeze_backbone`, `--tune_mm_mlp_adapter` (only the projector trains).
_TUNE = re.compile(r"^(tune|train)_(vision|vit|llm|language_model|backbone|visual|mm_mlp_adapter|merger|"
                   r"img_projector|aligner|projector|mm_projector)$")
# Adapters inside the vision tower: `--vision_lora True`, `--use_vision_lora`, `--vision_lora_rank 16`, or target
# modules that name the tower (`visual.*qkv`, `vpm`, `vision_model`); a projector/merger is not the tower.
# InternVL's `--use_backbone_lora 16` is a LoRA rank for its ViT (internvl_chat_finetune.py ModelArguments).
_VISION_WORDS = ("vision", "vit", "visual")
"""Short words scripts use for the vision encoder in flag names and target lists."""
_TOWER_LORA = re.compile(rf"^(use_)?({'|'.join(_VISION_WORDS)}|backbone)_lora(_(r|rank|dim))?$|^lora_(vision|vit)$")
# A target names the tower by a vision-encoder module name of any family (families.VISION_NAMES), one of the short
# words, its encoder's own name (SigLIP, CLIP's vision model) or Qwen2-VL's patch embedding.
_TOWER_TARGETS = dict.fromkeys((*VISION_NAMES, *_VISION_WORDS, "siglip", "clip_vision", "patch_embed"))
TOWER_MODULE = re.compile(rf"(?<![a-z])({'|'.join(map(re.escape, _TOWER_TARGETS))})(?![a-z])", re.I)
_TARGETS = re.compile(r"^(lora_)?target(_modules?)?$|^lora_target_modules$|^lora_modules$")
_FREEZE = re.compile(r"^(freeze|fix)_(vision(_tower)?|vit|llm|language_model|backbone|visual|mlp|merger|vision_model|"
                     r"aligner|projector|mm_projector|multi_modal_projector)$")
# The vision side of an image-text model (encoder, projector/merger/aligner): a flag that names one exists only in
# image-text scripts. `backbone` is not one (LLaVA's --freeze_backbone is the language model, InternVL's the ViT), nor
# `mlp` (InternVL's projector, but a common word).
_VISION_PART = re.compile(r"_(vision(_tower|_model)?|vit|visual|merger|mm_mlp_adapter|img_projector|aligner|projector|"
                          r"mm_projector|multi_modal_projector)$")
# Checkpointing switches of scripts' own: InternVL's `--grad_checkpoint` (default true).
_CHECKPOINT = re.compile(r"^(grad_checkpoint|grad_ckpt|use_gradient_checkpointing|gradient_checkpoint)$")
# Names kept out of adapters in scripts that target every Linear by its full module path (Qwen2-VL-Finetune's
# find_target_linear_names): full paths match only themselves, never another tower's module of the same short name.
_EXCLUDE = re.compile(r"^lora_namespan_exclude$")
# Image-input settings only image-text scripts have: Qwen2-VL-Finetune's --image_min_pixels / --image_folder,
# InternVL's --force_image_size / --max_dynamic_patch, MiniCPM-V's --max_slice_nums.
_IMAGE_INPUT = re.compile(r"^(image_(min|max)_pixels|(min|max)_pixels|image_folder|image_dir|force_image_size|"
                          r"max_dynamic_patch|dynamic_image_size|use_thumbnail|max_slice_nums)$")


def names_training_flag(names: set[str]) -> bool:
    """Whether flag names alone show a fine-tuning script's own switches (`--enable_lora`, `--lora_rank`,
    `--quantization_bit`, `--ds_config`): a script check has never seen, launched with nothing of the HF Trainer's."""
    patterns = (_ADAPTER_SWITCH, _ADAPTER_RANK, _ADAPTER_TYPE, _QUANT4, _QUANT8, _QUANT_BITS, OWN_DS_CONFIG)
    return any(p.match(n) for n in names for p in patterns)


@dataclass
class Intent:
    adapter: str | None = None
    """lora / dora / full, or None when no flag says."""
    quantization: str | None = None
    storage: str | None = None
    reentrant: bool | None = None
    frozen_modules: bool = False
    """A tower (vision encoder, language model, projector) stays frozen."""
    tower_adapters: bool = False
    """Adapters sit inside the vision tower."""
    image_text: bool = False
    """A flag only image-text scripts have (`--tune_vision`, `--freeze_vision_tower`, `--vision_lora`)."""
    towers_trainable: bool = False
    """A flag says the vision encoder or projector trains (`--tune_vision true`, `--freeze_vision_tower false`,
    `--tune_merger true`) or carries adapters."""
    projector_mlp_trains: bool = False
    """`--freeze_mlp false`: InternVL's projector trains, if the model is an image-text model."""
    checkpointing: bool | None = None
    fsdp: bool = False
    """The script shards the model with FSDP itself (`--use_fsdp`)."""
    targets: list[str] = field(default_factory=list)
    """The adapter's target modules as the script's own flag names them (`--target_modules q_proj,v_proj`)."""
    full_paths: bool = False
    """Adapter targets are full module paths (`--lora_namespan_exclude`)."""
    sources: dict[str, str] = field(default_factory=dict)
    used: set[str] = field(default_factory=set)
    """The flags read (so they are not listed as not understood)."""


def _truthy(value: Any, where: str) -> bool | None:
    if isinstance(value, list):
        value = value[0] if value else None
    if value is None or isinstance(value, bool):
        return True if value is None else value
    text = str(value).strip()
    if _TRUE_INT.match(text):
        return int(text) > 0
    try:
        return parse_bool(text, where)
    except Exception:  # noqa: BLE001 - a non-boolean value (a module list, a name) says nothing
        return None


def infer(options: dict[str, tuple[Any, str]]) -> Intent:
    """`options`: flag name -> (value, as written). Reads the flags that match the common patterns."""
    out = Intent()
    for name, (value, raw) in options.items():
        if _ADAPTER_TYPE.match(name) and isinstance(value, (str, list)):
            _adapter_type(out, name, value, raw)
            continue
        if _TOWER_LORA.match(name) or (_TARGETS.match(name) and TOWER_MODULE.search(str(value))):
            on = True if _TARGETS.match(name) else _truthy(value, raw)
            if on:
                out.tower_adapters, out.sources["tower_adapters"] = True, raw
                out.towers_trainable, out.sources["towers_trainable"] = True, raw
                if out.adapter in (None, "full"):
                    out.adapter, out.sources["adapter"] = "lora", raw
            if _TOWER_LORA.match(name):
                out.image_text, out.sources["image_text"] = True, raw
            out.used.add(name)
            continue
        if _TARGETS.match(name) and isinstance(value, (str, list)) and value:
            out.targets = [t.strip(" '\"[]") for t in (value if isinstance(value, list) else re.split(r"[,\s]+",
                                                                                                     value)) if t]
            out.sources["targets"] = raw
            out.used.add(name)
            continue
        if _ADAPTER_SWITCH.match(name) or _ADAPTER_RANK.match(name):
            on = _truthy(value, raw)
            if on is not None:
                out.used.add(name)
                if on and out.adapter in (None, "full"):
                    out.adapter, out.sources["adapter"] = "lora", raw
                # `--q_lora False` (FastChat's, Qwen's finetune.py) turns the 4-bit load off, not the adapter.
                elif on is False and out.adapter is None and _ADAPTER_SWITCH.match(name) and not _QUANT4.match(name):
                    out.adapter, out.sources["adapter"] = "full", raw
            if _QUANT4.match(name) and on:
                out.quantization, out.sources["quantization"] = "4bit", raw
            continue
        if _QUANT4.match(name) or _QUANT8.match(name):
            on = _truthy(value, raw)
            out.used.add(name)
            if on:
                out.quantization = "4bit" if _QUANT4.match(name) else "8bit"
                out.sources["quantization"] = raw
        elif _QUANT_BITS.match(name) and str(value).strip() in ("4", "8"):
            out.quantization, out.sources["quantization"] = f"{str(value).strip()}bit", raw
            out.used.add(name)
        elif _QUANT_DETAIL.match(name):
            out.used.add(name)
        elif _STORAGE.match(name):
            out.storage = str(value[0] if isinstance(value, list) and value else value)
            out.used.add(name)
        elif _REENTRANT.match(name):
            on = _truthy(value, raw)
            if on is not None:
                out.reentrant, out.sources["reentrant"] = on, raw
                out.used.add(name)
        elif _FSDP.match(name) and _truthy(value, raw) is not None:
            out.fsdp = bool(_truthy(value, raw))
            out.sources["fsdp"] = raw
            out.used.add(name)
        elif _DORA.match(name) and _truthy(value, raw):
            out.adapter, out.sources["adapter"] = "dora", raw
            out.used.add(name)
        elif _TUNE.match(name) or _FREEZE.match(name):
            _towers(out, name, value, raw)
        elif _CHECKPOINT.match(name):
            on = _truthy(value, raw)
            if on is not None:
                out.checkpointing, out.sources["checkpointing"] = on, raw
                out.used.add(name)
        elif _IMAGE_INPUT.match(name):
            out.image_text = True
            out.sources.setdefault("image_text", raw)
            out.used.add(name)
        elif _EXCLUDE.match(name):
            out.full_paths, out.sources["full_paths"] = True, raw
            out.used.add(name)
    return out


def _adapter_type(out: Intent, name: str, value: Any, raw: str) -> None:
    """`--finetuning_type lora`, `--train_type qlora`, `--peft_type dora`."""
    kind = str(value[0] if isinstance(value, list) and value else value).lower()
    if kind in ("lora", "qlora", "dora", "longlora", "full", "freeze"):
        out.adapter = "full" if kind == "full" else "dora" if kind == "dora" else "lora"
        out.sources["adapter"] = raw
        if kind == "qlora":
            out.quantization, out.sources["quantization"] = "4bit", raw
        out.used.add(name)


def _towers(out: Intent, name: str, value: Any, raw: str) -> None:
    """`--tune_X` / `--freeze_X` / `--fix_X`: which towers train."""
    on = _truthy(value, raw)
    if on is None:
        return
    out.used.add(name)
    # `--tune_llm false`, `--freeze_vision_tower`, `--fix_vit True`, `--tune_mm_mlp_adapter` (only the
    # projector trains): some base weights stay frozen.
    frozen = (on is False) if _TUNE.match(name) else on
    if name == "tune_mm_mlp_adapter" and on:
        frozen = True
    if frozen:
        out.frozen_modules, out.sources["frozen_modules"] = True, raw
    vision = _VISION_PART.search(name)
    if vision:
        out.image_text = True
        out.sources.setdefault("image_text", raw)
    if (vision and frozen is False) or (name == "tune_mm_mlp_adapter" and on):
        out.towers_trainable, out.sources["towers_trainable"] = True, raw
    elif name == "freeze_mlp" and on is False:
        out.projector_mlp_trains, out.sources["projector_mlp_trains"] = True, raw


def apply_fsdp(draft: Any, intent: Intent) -> None:
    """`--use_fsdp` on a script of its own, where no launcher or Trainer flag chose the engine: the script wraps the
    model in FSDP (FSDP1: `FullyShardedDataParallel`, the wrapper such scripts predate FSDP2 with). Whether it passes
    use_orig_params=True is its code; torch's own default is False (`use_orig_params: bool = False`,
    torch/distributed/fsdp/fully_sharded_data_parallel.py), so both are evaluated."""
    if not intent.fsdp or draft.get("engine") not in ("single", "ddp"):
        return
    where = intent.sources["fsdp"]
    draft.set("engine", "fsdp1", f"{where} (inferred: the script wraps the model in FSDP itself)")
    # The fix names the script's own switch, not the HF Trainer's --fsdp.
    draft.flag(engine=f"{where.split(' ')[0]} (the script's own FSDP switch)")
    draft.maybe("fsdp_use_orig_params", {False: "the script builds FSDP with torch's default use_orig_params=False",
                                         True: "the script passes use_orig_params=True"},
                f"{where}: the script's own FSDP wrapping decides use_orig_params")
    # Its own wrap policy, not the HF Trainer's (which wraps PEFT's adapters as units of their own): a decoder layer
    # is one unit holding its frozen weights beside its adapters unless the script wraps the adapters apart.
    draft.maybe("fsdp_frozen_units_separate", {False: "the script wraps each layer as one FSDP unit",
                                               True: "the script wraps the adapters as units of their own"},
                f"{where}: the script's own FSDP wrap policy decides what each unit holds")
