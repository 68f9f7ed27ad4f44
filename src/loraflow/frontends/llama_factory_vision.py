"""LLaMA-Factory's image-text runs: whether the run is one (the model's name, a VLM chat template or key), which towers
train (freeze_vision_tower, freeze_multi_modal_projector, train_mm_proj_only) and where the LoRA targets land."""

from __future__ import annotations

import re
from typing import Any

from loraflow.frontends import vision
from loraflow.frontends.base import Mitigation
from loraflow.frontends.common import Draft, accessors, as_list, at_least, mitigated
from loraflow.frontends.model_types import model_name_facts

HP = "src/llamafactory/hparams"

# Chat templates whose mm_plugin takes images (src/llamafactory/data/template.py); gemma3, llama4 and mistral_small
# also serve text-only checkpoints, so they say nothing alone.
VLM_TEMPLATE = re.compile(r"^(qwen2_vl|qwen2_5_vl|qwen3_vl\w*|qwen2_omni\w*|qwen3_omni\w*|llava\w*|video_llava|"
                           r"paligemma\w*|mllama|minicpm_[vo]|intern_?vl|idefics\w*|glm4v|glm4_1v|glm4_5v|kimi_vl|"
                           r"pixtral|cogvlm\w*|yi_vl|gemma3n|phi4_mm)$")
# Keys only image-text runs set (the vision tower, the projector, image resolution).
_VLM_KEYS = ("freeze_vision_tower", "freeze_multi_modal_projector", "train_mm_proj_only", "image_max_pixels",
             "image_min_pixels")
# LLaMA-Factory's collator adds a blank 64x64 image to a batch without images, so the vision tower runs on every
# rank: "avoid process hanging in zero3/fsdp case" (src/llamafactory/data/collator.py, commit 2f09c34, 2024-12-04,
# first in v0.9.2).
FAKE_IMAGE = Mitigation(("zero3-vision-skipped", "ddp-unused-vision-tower"), "0.9.2", "the collator adds a blank "
                        "64x64 image to a batch without images, so the vision tower runs on every rank",
                        "src/llamafactory/data/collator.py (commit 2f09c34)")


def image_text(draft: Draft, opts: dict[str, tuple[Any, str]], ftype: str) -> None:
    """The image-text fields: the model's name, a VLM template or key; then the towers LLaMA-Factory trains."""
    get, src, on = accessors(opts)
    model = str(get("model_name_or_path") or "")
    evidence = next((src(k) for k in _VLM_KEYS if k in opts), None)
    if evidence is None and VLM_TEMPLATE.match(str(get("template") or "")):
        evidence = src("template")
    model_name_facts(draft, model, src("model_name_or_path") if model else "")
    if not vision.recognise(draft, model, src("model_name_or_path") if model else "", evidence):
        return
    if "freeze_vision_tower" in opts:
        draft.era("llama-factory", ">=0.8.0", "freeze_vision_tower exists from LLaMA-Factory 0.8.0")
    if "freeze_multi_modal_projector" in opts:
        draft.era("llama-factory", ">=0.9.2", "freeze_multi_modal_projector exists from LLaMA-Factory 0.9.2")
    # Defaults (hparams/finetuning_args.py): freeze_vision_tower true (v0.8.0); freeze_multi_modal_projector true
    # (v0.9.2; before it the projector trained in full and freeze tuning); train_mm_proj_only freezes the tower.
    mm_only = on("train_mm_proj_only")
    vt_frozen = on("freeze_vision_tower", True) or mm_only
    vt_src = (src("train_mm_proj_only") if mm_only else src("freeze_vision_tower") if "freeze_vision_tower" in opts
              else f"default ({HP}/finetuning_args.py: freeze_vision_tower true)")
    if "freeze_multi_modal_projector" in opts:
        proj_frozen, proj_src = on("freeze_multi_modal_projector"), src("freeze_multi_modal_projector")
    elif at_least(draft, "llama-factory", "0.9.2"):
        proj_frozen, proj_src = True, f"default ({HP}/finetuning_args.py: freeze_multi_modal_projector true, v0.9.2)"
    else:
        proj_frozen, proj_src = ftype == "lora", "LLaMA-Factory < 0.9.2 trains the projector in full/freeze tuning"
    if mm_only:
        proj_frozen, proj_src = False, src("train_mm_proj_only")
    if vt_frozen or (ftype != "lora" and proj_frozen) or on("freeze_language_model") or mm_only:
        draft.set("frozen_modules", True, vt_src if vt_frozen else proj_src)
    # Under LoRA every base weight stays frozen; the tower trains only through adapters placed in it (below).
    if ftype != "lora" and not vt_frozen:
        draft.set("towers_trainable", True, f"{vt_src} (the vision tower trains)")
    elif ftype != "lora" and not proj_frozen:
        draft.set("towers_trainable", True, f"{proj_src} (the projector trains)")
    if ftype == "lora":
        _tower_targets(draft, opts, model, vt_frozen, vt_src)
    if draft.get("tower_adapters") and draft.get("checkpointing") != "off":
        draft.set("tower_input_hook", True, "LLaMA-Factory's checkpoint function marks the input of every "
                  "checkpointed trainable layer, vision blocks included (model_utils/checkpointing.py)")
    if mitigated(draft, "zero3-vision-skipped"):
        draft.set("image_every_rank", True, f"LLaMA-Factory >= {FAKE_IMAGE.since} adds a blank image to a batch "
                  "without images (src/llamafactory/data/collator.py)")
    vision.data_unknowns(draft, "cutoff_len")


def _tower_targets(draft: Draft, opts: dict[str, tuple[Any, str]], model: str, vt_frozen: bool, vt_src: str) -> None:
    """Where LoRA targets land in an image-text model. lora_target all collects Linear names outside the vision tower
    while it is frozen (model_utils/misc.py find_all_linear_modules, v0.8.0). From v0.9.0 patch_target_modules
    (model_utils/visual.py) turns the names into full module paths that skip the frozen tower and, always, the
    model's lora_conflict_keys (Qwen2-VL's Conv3d `patch_embed`, the fix of hiyouga/LlamaFactory#5324): with
    freeze_vision_tower false the adapters go into the tower's Linear layers, as asked, and nowhere PEFT refuses."""
    get, src, on = accessors(opts)
    targets = as_list(get("lora_target")) if "lora_target" in opts else ["all"]
    tsrc = src("lora_target") if "lora_target" in opts else f"default ({HP}/finetuning_args.py: lora_target all)"
    if not vision.targets_reach_towers(model, targets):
        return
    short = not any(t.lower() == "all" for t in targets)
    full_paths = at_least(draft, "llama-factory", "0.9.0")
    if not vt_frozen and full_paths:
        draft.set("targets_all_towers", False, f"{tsrc} with {vt_src}: LLaMA-Factory >= 0.9.0 names the tower's "
                  "modules by full path and leaves out lora_conflict_keys (model_utils/visual.py patch_target_modules)")
        draft.set("tower_adapters", True, f"{tsrc} with {vt_src} (adapters in the vision tower, as asked)")
        draft.set("towers_trainable", True, f"{tsrc} with {vt_src} (adapters in the vision tower)")
    elif not vt_frozen or (short and not full_paths):
        draft.set("targets_all_towers", True, f"{tsrc} with {vt_src}: the target names are matched in the "
                  "vision tower too")
        draft.set("tower_adapters", True, f"{tsrc} (adapters in the vision tower)")
        draft.set("towers_trainable", True, f"{tsrc} (adapters in the vision tower)")
    else:
        draft.set("targets_all_towers", False, f"{tsrc} with {vt_src}: LLaMA-Factory keeps the frozen vision "
                  "tower out of the targets (model_utils/misc.py, model_utils/visual.py)")
