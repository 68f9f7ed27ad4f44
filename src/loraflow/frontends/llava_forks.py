"""Forks of LLaVA's train.py whose code decides differently from LLaVA's what trains, read when the script is not
here (llava.py applies LLaVA's own facts first, then the fork's). A fork is told by its program path or by flags
only its dataclasses have; each fact below is read from the fork's train.py.

- LLaVA-NeXT / LLaVA-OneVision (LLaVA-VL/LLaVA-NeXT llava/train/train.py, the same path as LLaVA's): its
  TrainingArguments default `gradient_checkpointing` to True; `--mm_tunable_parts` (mm_vision_tower, mm_mlp_adapter,
  mm_language_model, mm_vision_resampler) freezes the whole model after get_peft_model and unfreezes each part
  named, the language model by `requires_grad_(True)` on every parameter outside the towers, LoRA's base weights
  included; without it `--unfreeze_mm_vision_tower` trains the vision tower in full, as in Open-LLaVA-NeXT's
  train.py (xiaoachen98/Open-LLaVA-NeXT), whose TrainingArguments keep the HF default (no checkpointing).
- LLaVA-NeXT's `llava/train/train_dpo.py` takes the same flags plus DPO's (`--beta`, `--dpo_alpha`, `--gamma`) and
  trains DPO through a subclass of TRL's DPOTrainer.
- Video-LLaVA / MoE-LLaVA (PKU-YuanGroup videollava|moellava/train/train.py): LLaVA's code with `--image_tower` and
  `--video_tower` (LanguageBind encoders) in place of `--vision_tower`; the towers' forward runs under
  torch.no_grad (multimodal_encoder/languagebind/__init__.py), frozen.
- Bunny (BAAI-DCAI/Bunny bunny/train/train.py): LLaVA's code with `--model_type` choosing the language model and
  `--unfreeze_vision_tower`, which sets the vision tower's parameters trainable after LoRA: it trains in full.
- MobileVLM (Meituan-AutoML/MobileVLM mobilevlm/train/train.py): LLaVA's code whose find_all_linear_names skips
  nothing, so LoRA also wraps the CLIP tower's layers, idle there: the tower runs under torch.no_grad.
- TinyLLaVA Factory (TinyLLaVA/TinyLLaVA_Factory tinyllava/train/train.py, training_recipe/base.py and
  lora_recipe.py): `--training_recipe lora` puts LoRA on each part whose `--tune_type_llm` / `--tune_type_vision_tower`
  / `--tune_type_connector` is lora (find_all_linear_names skips the others by name), then sets each part frozen or
  full; under `--gradient_checkpointing` it hooks only the language model's embeddings (support_gradient_checkpoint);
  a sample without an image gets a blank one.
- VILA / NVILA (NVlabs/VILA llava/train/train.py and args.py, the same path as LLaVA's): `--tune_language_model`,
  `--tune_vision_tower`, `--tune_mm_projector` (each False by default) set each part trainable; `--lora_enable` puts
  LoRA on the language model with `--lora_llm` and on the vision tower with `--lora_vt` (then hooking the tower's
  input embeddings); `--dpo` trains DPO (VILADPOTrainer).
- mPLUG-Owl2 (X-PLUG/mPLUG-Owl mPLUG-Owl2/mplug_owl2/train/train.py): after get_peft_model it calls
  `model.requires_grad_(True)`, so with `--lora_enable` every weight trains, then freezes the vision model
  (`--freeze_vision_model`, default True) and trains the visual abstractor (`--tune_visual_abstractor`, default
  True); a sample without an image gets a blank one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from loraflow.frontends.common import Draft, as_bool, as_list
from loraflow.frontends.hf_options import Opt


@dataclass(frozen=True)
class Fork:
    name: str
    code: str
    """Where its facts were read (repository and path), for the sources."""
    own: frozenset[str]
    """Flags of its own dataclasses beyond LLaVA's."""
    marks: frozenset[str] = frozenset()
    """Flags only this fork takes: one of them on a LLaVA-lineage launch names the fork."""
    program: str = ""
    """A regex its entry point matches."""
    checkpointing_default: bool = False
    """Its TrainingArguments' gradient_checkpointing default."""
    flags: tuple[tuple[str, str], ...] = ()
    """Setup fields its own flags set, over llava.FLAGS."""
    stage: tuple[str, str] | None = None
    """The stage its entry point trains and the trainer that says so, where not LLaVA's SFT."""
    idle_tower_adapters: str = ""
    """Why adapters that PEFT's name matching puts in its towers change nothing, where its code differs from
    LLaVA's skip list (find_all_linear_names)."""


NEXT = Fork("LLaVA-NeXT", "LLaVA-VL/LLaVA-NeXT llava/train/train.py", frozenset("""mm_tunable_parts
unfreeze_mm_vision_tower unfreeze_language_model mm_vision_tower_lr tune_mm_vision_resampler freeze_mm_vision_resampler
vision_tower_pretrained model_class_name mm_resampler_type mm_mask_drop_mode mm_mask_drop_skip_percentage
mm_mask_drop_ratio mm_mask_drop_ratio_upper mm_mask_drop_ratio_lower mm_spatial_pool_stride mm_spatial_pool_mode
mm_spatial_pool_out_channels mm_perceiver_depth mm_perceiver_latents mm_perceiver_ff_mult mm_perceiver_pretrained
mm_qformer_depth mm_qformer_latents mm_qformer_pretrained rope_scaling_factor rope_scaling_type image_grid_pinpoints
image_crop_resolution image_split_resolution video_folder video_fps frames_upbound force_sample add_time_instruction
mm_newline_position faster_token_stride add_faster_video group_by_varlen group_by_modality_length_auto
verbose_logging enable_ring_attention early_mix_text attn_implementation""".split()),
            # Not --unfreeze_mm_vision_tower / --mm_vision_tower_lr: Open-LLaVA-NeXT's train.py takes them too, with
            # the HF default (no checkpointing); what they do is the same in both (apply, _tower_unfrozen).
            marks=frozenset({"mm_tunable_parts", "frames_upbound", "mm_spatial_pool_stride", "mm_spatial_pool_mode",
                             "mm_newline_position", "force_sample", "add_time_instruction", "model_class_name",
                             "mm_resampler_type", "vision_tower_pretrained"}),
            checkpointing_default=True,
            flags=(("adapter", "--mm_tunable_parts (mm_language_model) / --lora_enable"),
                   ("towers_trainable", "--mm_tunable_parts / --unfreeze_mm_vision_tower"),
                   ("frozen_modules", "--mm_tunable_parts")))
# LLaVA-NeXT's llava/train/train_dpo.py: the same arguments plus DPO's, its LLaVADPOTrainer a subclass of TRL's
# DPOTrainer (chosen and rejected concatenated in one forward), a reference model loaded apart under ZeRO-3.
NEXT_DPO = Fork("LLaVA-NeXT DPO", "LLaVA-VL/LLaVA-NeXT llava/train/train_dpo.py", NEXT.own | frozenset(
    "dpo_alpha beta gamma generate_during_eval precompute_ref_log_probs s2 s2_scales input_prompt refine_prompt "
    "num_sample".split()), program=r"(?:^|/)llava/train/train_dpo\.py$", checkpointing_default=True, flags=NEXT.flags,
    stage=("dpo", "LLaVA-VL/LLaVA-NeXT llava/train/train_dpo.py: LLaVADPOTrainer, a subclass of TRL's DPOTrainer"))
VIDEO = Fork("Video-LLaVA", "PKU-YuanGroup/Video-LLaVA videollava/train/train.py",
             frozenset({"image_tower", "video_tower", "video_folder", "tokenizer_model_max_length"}),
             marks=frozenset({"image_tower", "video_tower"}),
             idle_tower_adapters="find_all_linear_names skips vision_tower, not image_tower / video_tower, but the "
                                 "LanguageBind towers run under torch.no_grad (languagebind/__init__.py), so the "
                                 "adapters PEFT puts there get no gradient and change nothing")
MOBILEVLM = Fork("MobileVLM", "Meituan-AutoML/MobileVLM mobilevlm/train/train.py", frozenset({"vision_tower_type"}),
                 program=r"(?:^|/)mobilevlm/train/train(?:_mem)?\.py$",
                 idle_tower_adapters="find_all_linear_names collects every Linear's name, the CLIP tower's too, but "
                                     "the tower runs under torch.no_grad (mobilevlm/model/vision_encoder.py), so "
                                     "the adapters PEFT puts there get no gradient and change nothing")
MPLUG_OWL2 = Fork("mPLUG-Owl2", "X-PLUG/mPLUG-Owl mPLUG-Owl2/mplug_owl2/train/train.py",
                  frozenset({"tune_visual_abstractor", "freeze_vision_model", "visual_abstractor_lr"}),
                  program=r"(?:^|/)mplug_owl2/train/train(?:_mem)?\.py$",
                  flags=(("adapter", "--lora_enable (train.py's model.requires_grad_(True) trains every weight)"),
                         ("frozen_modules", "--freeze_vision_model"), ("towers_trainable", "--tune_visual_abstractor")))
BUNNY = Fork("Bunny", "BAAI-DCAI/Bunny bunny/train/train.py",
              frozenset({"model_type", "unfreeze_vision_tower", "use_s2"}),
              marks=frozenset({"unfreeze_vision_tower", "use_s2"}), program=r"(?:^|/)bunny/train/train\.py$",
              flags=(("towers_trainable", "--unfreeze_vision_tower"),))
TINYLLAVA = Fork("TinyLLaVA", "TinyLLaVA/TinyLLaVA_Factory tinyllava/train/train.py", frozenset("""conv_version
vision_tower2 connector_type training_recipe tune_type_llm tune_type_vision_tower tune_vision_tower_from_layer
tune_type_connector pretrained_model_path tokenizer_use_fast attn_implementation""".split()),
                 marks=frozenset({"training_recipe", "tune_type_llm", "tune_type_vision_tower", "tune_type_connector"}),
                 program=r"(?:^|/)tinyllava/train/train\.py$",
                 flags=(("adapter", "--training_recipe / --tune_type_llm"),
                        ("towers_trainable", "--tune_type_vision_tower / --tune_type_connector"),
                        ("tower_adapters", "--tune_type_vision_tower")))
VILA = Fork("VILA", "NVlabs/VILA llava/train/train.py", frozenset("""data_mixture eval_data_mixture
vflan_no_system_prompt downsample_video num_video_frames fps mm_projector vision_resolution interpolate_mode
drop_path_rate mlp_path s2 s2_scales s2_max_split_size tune_vision_tower tune_language_model tune_mm_projector
model_dtype use_dora lora_llm lora_vt dpo longvila_sampler dpo_beta total_time_limit pre_terminate_time
seq_parallel_size seq_parallel_ring_size seq_parallel_ring_type debug_e2e vision_tower_lr quantize_model
num_time_tokens time_token_format soft_ce_std ps3 look_close_mode tune_top_down_selection use_one_logger""".split()),
            marks=frozenset({"tune_language_model", "tune_vision_tower", "tune_mm_projector", "data_mixture",
                             "lora_llm", "lora_vt", "dpo_beta"}),
            flags=(("adapter", "--lora_enable with --lora_llm / --tune_language_model"),
                   ("frozen_modules", "--tune_language_model / --tune_vision_tower / --tune_mm_projector"),
                   ("towers_trainable", "--tune_vision_tower / --tune_mm_projector / --lora_vt"),
                   ("tower_adapters", "--lora_vt")))
FORKS = (MPLUG_OWL2, NEXT_DPO, VIDEO, MOBILEVLM, BUNNY, TINYLLAVA, VILA, NEXT)
TOWER_FLAGS = ("vision_tower", "image_tower", "video_tower")
"""The flags that load a LLaVA-lineage script's encoders."""


def fork_of(program: str, flags: set[str] | frozenset[str]) -> Fork | None:
    """The fork a LLaVA-lineage launch runs, from its program path or the flags only that fork takes."""
    path = program.replace("\\", "/")
    for fork in FORKS:
        if (fork.program and re.search(fork.program, path)) or fork.marks & set(flags):
            return fork
    return None


def checkpointing_default(fork: Fork | None, opts: dict[str, Opt]) -> dict[str, Opt]:
    """The fork's gradient_checkpointing default, as an option the HF reader applies, where no flag gives one."""
    if fork is None or not fork.checkpointing_default or "gradient_checkpointing" in opts:
        return {}
    return {"gradient_checkpointing": Opt(True, f"default ({fork.code}: TrainingArguments gradient_checkpointing "
                                                "True)")}


def _tune_type(own: dict[str, Opt], part: str) -> tuple[str, str]:
    """TinyLLaVA's `--tune_type_<part>` (frozen, full, lora, qlora, partially-tune) and where it came from."""
    opt = own.get(f"tune_type_{part}")
    if opt is None or opt.value is None:
        return "frozen", f"default ({TINYLLAVA.code}: tune_type_{part} frozen)"
    return str(opt.value).lower(), opt.source


def _recipe(own: dict[str, Opt]) -> str:
    """TinyLLaVA's `--training_recipe` (common, lora, qlora); one the launch does not show (a shell variable) is read
    as lora where a part's tune type is lora, the only recipe that adds those adapters."""
    opt = own.get("training_recipe")
    if opt is not None and opt.value is not None and str(opt.value).strip() and "$" not in str(opt.value):
        return str(opt.value).lower()
    tunes = {_tune_type(own, p)[0] for p in ("llm", "vision_tower", "connector")}
    if opt is not None and tunes & {"lora", "qlora"}:
        return "lora"
    return "common"


def adapter_option(fork: Fork | None, own: dict[str, Opt]) -> Opt | None:
    """Whether the language model gets adapters, where the fork's own flags decide it rather than --lora_enable."""
    if fork is VILA:
        return _vila_adapter(own)
    if fork is not TINYLLAVA:
        return None
    recipe = _recipe(own)
    llm, src = _tune_type(own, "llm")
    if recipe in ("lora", "qlora") and llm in ("lora", "qlora"):
        return Opt(True, f"{src} ({TINYLLAVA.code}: the {recipe} recipe's get_peft_model on the language model)")
    return Opt(False, f"{src} ({TINYLLAVA.code}: --training_recipe {recipe}, the language model "
                      f"{'stays frozen' if llm == 'frozen' else 'trains in full'})")


def _on(own: dict[str, Opt], name: str, default: bool = False) -> bool:
    opt = own.get(name)
    if opt is None:
        return default
    return as_bool(opt.value if opt.value is not None else True, opt.source)


def apply(draft: Draft, fork: Fork | None, own: dict[str, Opt], lora: bool) -> None:
    """What the fork's code trains, over LLaVA's facts that llava.py set, and the flags that change it."""
    if fork is not None:
        draft.flag(**dict(fork.flags))
    if _on(own, "unfreeze_mm_vision_tower") and "mm_tunable_parts" not in own:
        # LLaVA-NeXT's train.py without --mm_tunable_parts, and Open-LLaVA-NeXT's (xiaoachen98/Open-LLaVA-NeXT
        # llava/train/train.py unfreeze_vit): the vision tower's parameters set trainable.
        _tower_unfrozen(draft, f"{own['unfreeze_mm_vision_tower'].source} (the vision tower's parameters set "
                        "trainable: requires_grad_(True))", lora)
        draft.flag(towers_trainable="--unfreeze_mm_vision_tower")
    if fork in (NEXT, NEXT_DPO):
        _next_parts(draft, own, lora)
    elif fork is BUNNY and _on(own, "unfreeze_vision_tower"):
        _tower_unfrozen(draft, f"{own['unfreeze_vision_tower'].source} ({BUNNY.code}: the vision tower's parameters "
                        "set trainable)", lora)
    elif fork is MPLUG_OWL2:
        _mplug_owl2(draft, own, lora)
    elif fork is TINYLLAVA:
        _tinyllava(draft, own)
    elif fork is VILA:
        _vila(draft, own)
    if fork is not None and fork.idle_tower_adapters and lora:
        draft.set("tower_adapters", False, f"{fork.code}: {fork.idle_tower_adapters}")


def _language_model_full(draft: Draft, source: str, lora: bool, remedy: str) -> None:
    if lora:
        draft.set("adapter", "full", f"{source}: requires_grad_(True) on every language-model weight after "
                  "get_peft_model, LoRA's base weights included: the language model trains in full beside its "
                  "adapters")
        draft.note(f"{source} unfreezes the language model after LoRA froze it, so --lora_enable trains every "
                   f"weight (memory and updates of full fine-tuning); to train only the adapters, {remedy}")


def _tower_unfrozen(draft: Draft, source: str, lora: bool) -> None:
    draft.set("towers_trainable", True, source)
    draft.set("towers_full", True, f"{source}: the vision tower trains in full")
    if lora:
        draft.set("frozen_modules", True, f"{source}; LoRA leaves the language model's base weights frozen")
    elif "language model" not in draft.sources.get("frozen_modules", ""):  # --freeze_backbone keeps it frozen
        draft.set("frozen_modules", False, f"{source}: with the language model and the projector, every weight trains")


def _next_parts(draft: Draft, own: dict[str, Opt], lora: bool) -> None:
    """LLaVA-NeXT train.py: `--mm_tunable_parts` decides every part; else `--unfreeze_mm_vision_tower`."""
    if "mm_tunable_parts" not in own:
        return
    opt = own["mm_tunable_parts"]
    parts = set(as_list(opt.value))
    src = f"{opt.source} ({NEXT.code}: model.requires_grad_(False), then each part named trains in full)"
    towers = parts & {"mm_vision_tower", "mm_mlp_adapter", "mm_vision_resampler"}
    draft.set("towers_trainable", bool(towers), src)
    draft.set("towers_full", bool(towers), src)
    every = {"mm_vision_tower", "mm_language_model"} <= parts
    draft.set("frozen_modules", not every, f"{src}: {'nothing stays' if every else 'the parts not named stay'} frozen")
    if "mm_language_model" in parts:
        _language_model_full(draft, opt.source, lora, "drop mm_language_model from --mm_tunable_parts and "
                             "set the LoRA weights trainable again after the parts are chosen (train.py)")
    elif lora:
        draft.set("adapter_loaded_frozen", True, f"{opt.source} names no mm_language_model: LLaVA-NeXT's train.py "
                  "freezes the LoRA weights with the rest of the model after get_peft_model; only the parts named "
                  "train")


def _mplug_owl2(draft: Draft, own: dict[str, Opt], lora: bool) -> None:
    code = MPLUG_OWL2.code
    _language_model_full(draft, f"{code} (model.requires_grad_(True) after the model setup)", lora,
                         "remove train.py's model.requires_grad_(True) (no flag turns it off)")
    vision = _on(own, "freeze_vision_model", default=True)
    vsrc = own["freeze_vision_model"].source if "freeze_vision_model" in own else \
        f"default ({code}: freeze_vision_model True)"
    abstractor = _on(own, "tune_visual_abstractor", default=True)
    asrc = own["tune_visual_abstractor"].source if "tune_visual_abstractor" in own else \
        f"default ({code}: tune_visual_abstractor True)"
    draft.set("image_text", True, f"{code} (a vision model and a visual abstractor before the language model)")
    draft.set("frozen_modules", vision, f"{vsrc}: the vision model {'stays frozen' if vision else 'trains'}")
    draft.set("tower_adapters", False, f"{code}: find_all_linear_names skips vision_model and visual_abstractor")
    # requires_grad_(True) on the whole model: the abstractor trains whatever --tune_visual_abstractor says.
    draft.set("towers_trainable", True, f"{asrc}: the visual abstractor trains in full")
    draft.set("towers_full", True, f"{asrc}: the visual abstractor trains in full" if abstractor else
              f"{code}: model.requires_grad_(True) leaves the visual abstractor trainable")
    draft.settle("image_every_rank", True, f"{code}: a sample without an image gets a blank one (LazySupervisedDataset"
                 ": torch.zeros(3, H, W)), so the vision model runs on every rank")
    draft.settle("image_safe_truncation", True, f"{code}: one image placeholder per image, expanded into the "
                 "abstractor's queries inside the model, so a length limit cannot cut an image apart")


def _tinyllava(draft: Draft, own: dict[str, Opt]) -> None:
    code = TINYLLAVA.code
    recipe = _recipe(own)
    parts = {p: _tune_type(own, p) for p in ("llm", "vision_tower", "connector")}
    adapted = {p for p, (kind, _) in parts.items() if kind in ("lora", "qlora") and recipe in ("lora", "qlora")}
    frozen = [p for p, (kind, _) in parts.items() if kind == "frozen" or (p in adapted and p == "llm")]
    vision, vsrc = parts["vision_tower"]
    connector, csrc = parts["connector"]
    draft.set("frozen_modules", bool(frozen), f"{code}: " + (
        f"{', '.join(frozen)} frozen (tune_type frozen, or LoRA on a frozen base)" if frozen else "every part trains"))
    full = [src for kind, src in (parts["vision_tower"], parts["connector"]) if kind in ("full", "partially-tune")]
    draft.set("towers_full", bool(full), f"{full[0]} ({code}: requires_grad_(True) on the part)" if full else
              f"{vsrc}, {csrc}: neither the vision tower nor the connector trains in full")
    draft.set("tower_adapters", "vision_tower" in adapted, f"{vsrc} ({code}: find_all_linear_names "
              f"{'keeps' if 'vision_tower' in adapted else 'skips'} the vision tower)")
    draft.set("towers_trainable", bool(full) or bool(adapted - {"llm"}), f"{vsrc}; {csrc}")
    if "vision_tower" in adapted:
        draft.set("targets_all_towers", False, f"{vsrc} ({code}: LoRA targets chosen per part)")
        if draft.get("checkpointing") != "off":
            draft.settle("tower_input_hook", False, f"{code}: support_gradient_checkpoint calls "
                         "enable_input_require_grads on the language model only (training_recipe/base.py)")
    draft.settle("image_every_rank", True, f"{code}: a sample without an image gets a blank one (tinyllava/data/"
                 "dataset.py: torch.zeros(3, H, W)), so the vision tower runs on every rank")
    # custom_finetune.py loads the whole model from --pretrained_model_path, with no --vision_tower flag.
    draft.set("image_text", True, f"{code} (a vision tower and a connector before the language model)")
    draft.settle("image_safe_truncation", True, f"{code}: one image placeholder per image, expanded into the "
                 "tower's features inside the model (LLaVA's prepare_inputs_labels_for_multimodal)")


def _vila_flag(own: dict[str, Opt], name: str) -> tuple[bool, str]:
    on = _on(own, name)
    return on, own[name].source if name in own else f"default ({VILA.code} args.py: {name} False)"


def _vila_adapter(own: dict[str, Opt]) -> Opt:
    lora, llm_lora, tune_llm = _on(own, "lora_enable"), _on(own, "lora_llm"), _vila_flag(own, "tune_language_model")
    if lora and llm_lora:
        return Opt(True, f"{own['lora_llm'].source} ({VILA.code}: LoRA on the language model's linear layers)")
    # Without LoRA on it, the language model trains in full or stays frozen: requires_grad_(tune_language_model).
    return Opt(False, f"{tune_llm[1]} ({VILA.code}: the language model "
                      f"{'trains in full' if tune_llm[0] else 'stays frozen'}, no LoRA on it)")


def _vila(draft: Draft, own: dict[str, Opt]) -> None:
    code = VILA.code
    lora = _on(own, "lora_enable")
    llm, llm_src = _vila_flag(own, "tune_language_model")
    tower, tower_src = _vila_flag(own, "tune_vision_tower")
    projector, proj_src = _vila_flag(own, "tune_mm_projector")
    tower_lora = lora and _on(own, "lora_vt")
    llm_frozen = (lora and _on(own, "lora_llm")) or not llm
    tower_frozen = not tower or tower_lora
    draft.set("frozen_modules", llm_frozen or tower_frozen or not projector,
              f"{code}: each part trains only with its --tune_* flag ({llm_src}; {tower_src}; {proj_src})")
    full = [src for on, src in ((tower and not tower_lora, tower_src), (projector, proj_src)) if on]
    draft.set("towers_full", bool(full), f"{full[0]} ({code}: requires_grad_(True) on the part)" if full else
              f"{tower_src}; {proj_src}: neither the vision tower nor the projector trains in full")
    draft.set("towers_trainable", bool(full) or tower_lora, f"{tower_src}; {proj_src}")
    draft.set("tower_adapters", tower_lora, f"{own['lora_vt'].source} ({code}: find_all_linear_names keeps the "
              "vision tower)" if tower_lora else f"{code}: find_all_linear_names skips the vision tower without "
              "--lora_vt")
    if tower_lora:
        draft.set("targets_all_towers", False, f"{own['lora_vt'].source} ({code}: LoRA targets by full module name)")
        draft.settle("tower_input_hook", True, f"{own['lora_vt'].source} ({code}: a forward hook marks the vision "
                     "tower's input embeddings as requiring grad)")
    if _on(own, "dpo"):
        draft.set("stage", "dpo", f"{own['dpo'].source} ({code}: VILADPOTrainer)")
