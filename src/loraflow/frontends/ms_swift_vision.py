"""ms-swift's image-text runs: which towers it trains and how its all-linear reaches them, and what its templates
do with images around the engine's forward, per release. Read by ms_swift.py, whose module this would overfill."""

from __future__ import annotations

import re

from loraflow.frontends import vision
from loraflow.frontends.common import Draft, as_list, at_least
from loraflow.frontends.model_types import model_name_facts

# Templates that ran the model's own modules while encoding a sample (data preprocessing, outside the engine's
# forward) until ms-swift 2.3.1 moved that work into _post_encode, called from a forward pre-hook on the model
# (swift/llm/utils/template.py, PR #1594): deepseek-vl's encode called model.prepare_inputs_embeds (vision tower,
# aligner, token embeddings), InternLM-XComposer2's model.encode_img / img2emb.
_ENCODE_RUNS_MODEL = re.compile(r"deepseek[-_]vl(?!2)|internlm[-_]?xcomposer2", re.I)


def _encode_runs_model(draft: Draft, model: str, source: str) -> None:
    if model and _ENCODE_RUNS_MODEL.search(model) and not at_least(draft, "ms-swift", "2.3.1"):
        draft.set("weights_outside_forward", True, f"{source}: ms-swift < 2.3.1 runs {model}'s vision tower and "
                  "embeddings in the template's encode of each sample, outside the engine's forward "
                  "(swift/llm/utils/template.py)")


# ms-swift model types of text-only families (swift/llm/model/model/*.py): their loader builds the model through
# AutoModelForCausalLM (get_model_tokenizer_with_flash_attn's default automodel_class), so an image-text checkpoint
# forced to one (`--model Qwen/Qwen2.5-VL-7B-Instruct --model_type qwen2_5`) fails with transformers' "Unrecognized
# configuration class <...Qwen2_5_VLConfig> for this kind of AutoModel: AutoModelForCausalLM".
# Natively image-text families spelled like text ones are left out: ms-swift registers qwen3_5, qwen3_5_moe, llama4
# and gemma4 under MLLMModelType (swift/llm/model/constant.py; swift/model/constant.py from 4.0).
_TEXT_MODEL_TYPE = re.compile(r"^(?!qwen3_5(_moe)?$|llama4$|gemma4$)"
                              r"(qwen\d?(_\d)?(_moe)?|llama\d?(_\d)?|internlm\d?(_\d)?|glm\d?|chatglm\d?|mistral|"
                              r"mixtral|gemma\d?(_text)?|phi\d?(_\d)?|minicpm\d?|yi|deepseek(_v\d)?|"
                              r"baichuan\d?)$", re.I)


def text_model_type(draft: Draft, model_type: str, source: str, key: str | None) -> None:
    """--model_type naming a text-only family beside an image-text --model: the text loader is used."""
    if key == "model_type" or not model_type or not _TEXT_MODEL_TYPE.match(model_type.strip("'\"")):
        return
    draft.set("causal_lm_class", True, f"{source} (a text model type for an image-text checkpoint: ms-swift loads "
              "it through AutoModelForCausalLM, swift/llm/model/register.py)")


def image_text(draft: Draft, get, src, on, opts: dict) -> None:
    """The image-text fields: the model's name (or --model_type) or a tower flag; then the towers ms-swift trains.
    From 3.0, --freeze_vit / --freeze_aligner default true and --freeze_llm false (swift/arguments/tuner_args.py),
    for full training and LoRA alike: all-linear is turned into a regex over the unfrozen towers only
    (get_multimodal_target_regex, v3.0); 2.4 - 2.x had --freeze_vit false by default and no --freeze_aligner."""
    key = next((k for k in ("model", "model_id_or_path", "model_type") if k in opts), None)
    model = str(get(key) or "") if key else ""
    flag = next((src(k) for k in ("freeze_vit", "freeze_aligner") if k in opts), None)
    model_name_facts(draft, model, src(key) if key else "")
    _encode_runs_model(draft, model, src(key) if key else "")
    if not vision.recognise(draft, model, src(key) if key else "", flag):
        return
    if "model_type" in opts:
        text_model_type(draft, str(get("model_type") or ""), src("model_type"), key)
    if "freeze_aligner" in opts and ">=3.0.0" not in draft.eras.get("ms-swift", ("",))[0]:
        draft.era("ms-swift", ">=3.0.0", "--freeze_aligner exists from ms-swift 3.0")
    new = at_least(draft, "ms-swift", "3.0.0")
    vit_frozen = on("freeze_vit", default=new)
    vit_src = src("freeze_vit") if "freeze_vit" in opts else (f"default (ms-swift {'>=' if new else '<'} 3.0: "
                                                               f"freeze_vit {str(new).lower()})")
    al_frozen = on("freeze_aligner", default=new if new else vit_frozen)
    al_src = src("freeze_aligner") if "freeze_aligner" in opts else "default (ms-swift >= 3.0: freeze_aligner true)" \
        if new else vit_src
    llm_frozen = on("freeze_llm")
    full = draft.get("adapter") == "full"
    if full and (vit_frozen or al_frozen or llm_frozen):
        draft.set("frozen_modules", True, vit_src if vit_frozen else al_src if al_frozen else src("freeze_llm"))
    targets = as_list(get("target_modules", "all-linear")) if new or "target_modules" in opts else []
    tsrc = src("target_modules") if "target_modules" in opts else "default (ms-swift: target_modules all-linear)"
    regex = "target_regex" in opts
    per_tower = new and any(t.lower() == "all-linear" for t in targets)
    if full and not (vit_frozen and al_frozen):
        draft.set("towers_trainable", True, f"{vit_src if not vit_frozen else al_src} (the "
                  f"{'vision encoder' if not vit_frozen else 'aligner'} trains)")
    elif not full and per_tower and not (vit_frozen and al_frozen) and not regex:
        draft.set("towers_trainable", True, f"{tsrc} with {vit_src if not vit_frozen else al_src}: adapters in the "
                  "unfrozen vision side")
        if not vit_frozen:
            draft.set("tower_adapters", True, f"{tsrc} with {vit_src}: all-linear covers the ViT")
    if not full and not regex and targets:
        if per_tower:
            draft.set("targets_all_towers", False, f"{tsrc}: ms-swift >= 3.0 matches all-linear inside the unfrozen "
                      "towers only (get_multimodal_target_regex)")
        elif new and vision.targets_reach_towers(model, targets):
            vision.targets_enter_tower(draft, tsrc, ": short names are matched by PEFT against the whole model, the "
                                       "ViT included", model)
    vision.tower_hook(draft)
    _blank_image(draft, model)
    vision.data_unknowns(draft, "max_length")


# Templates whose _post_encode runs the vision tower on a blank 32x32 image (its embedding added times 0) when a
# training batch holds none, under DeepSpeed: Qwen2-VL, QVQ and Qwen2.5-VL (swift/llm/template/template/qwen.py
# Qwen2VLTemplate) and InternVL (template/internvl.py InternvlTemplate), from the 3.0 rewrite (commit b40f31d).
# Qwen2-VL's template ran the tower once for a batch's images and once more for its videos until 3.7 passed both in
# one call (PR #5018): a rank whose batch mixes them still runs it twice.
_BLANK_IMAGE = re.compile(r"qwen[-_.]?2(\.5)?[-_.]?vl|qvq|intern[-_.]?vl", re.IGNORECASE)
_VIDEO_APART = re.compile(r"qwen[-_.]?2(\.5)?[-_.]?vl|qvq", re.IGNORECASE)


def _blank_image(draft: Draft, model: str) -> None:
    if draft.has("image_every_rank") or draft.get("engine") != "deepspeed" or not _BLANK_IMAGE.search(model):
        return
    if not at_least(draft, "ms-swift", "3.0.0"):
        return
    draft.set("image_every_rank", True, "ms-swift >= 3.0 runs the vision tower on a blank image when a batch has "
              "none, under DeepSpeed (swift/llm/template/template/qwen.py, internvl.py: _post_encode)")
    if _VIDEO_APART.search(model) and not at_least(draft, "ms-swift", "3.7.0"):
        draft.maybe("image_every_rank", {True: "no micro-batch mixes images and videos (a text-only one gets "
                                               "ms-swift's blank image)",
                                         False: "images and videos share a micro-batch: that rank runs the vision "
                                                "tower twice"},
                    "whether image and video samples are mixed is in the data; ms-swift 3.0 - 3.6 runs Qwen2-VL's "
                    "tower once for images and once for videos (template qwen.py _post_encode, one call from PR "
                    "#5018)")
