"""Image-text (vision-language) launches, for every frontend: which models are image-text models (by the name or path
a launch gives), which adapter target names reach their vision encoder or projector, and the two parts of an
image-text run that no launch line shows (whether every micro-batch carries an image, whether a length limit cuts
inside an image's placeholder tokens).

The model families are declared once here; frontends call `recognise` with the model they read and `data_unknowns`
once the setup is known. The short module names per family are those of the transformers implementations (and the
vendors' remote code for MiniCPM-V / InternVL): Qwen2-VL's vision blocks are `attn.qkv`, `attn.proj`, `mlp.fc1/fc2`
and its patch embedding a Conv3d named `patch_embed.proj`; Qwen2.5-VL's vision MLP is `gate_proj/up_proj/down_proj`;
CLIP / SigLIP towers (LLaVA, PaliGemma, Gemma 3, Idefics, SmolVLM, MiniCPM-V's vpm, Phi-3-vision) use
`q_proj/k_proj/v_proj/out_proj/fc1/fc2`; InternViT `attn.qkv`, `attn.proj`, `mlp.fc1/fc2`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from loraflow.families import TOKEN_TYPES_LAST
from loraflow.frontends.common import Draft, at_least

_CLIP = frozenset({"q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2", "linear_1", "linear_2"})
_VIT = frozenset({"qkv", "proj", "fc1", "fc2"})


@dataclass(frozen=True)
class Family:
    name: str
    pattern: str
    """Matched, case-insensitively, against a model id or path."""
    tower_names: frozenset[str]
    """Short module names (suffixes) found in its vision encoder or projector: a target list holding one of them
    also adapts the tower when PEFT matches it against the whole model."""
    refused: frozenset[str] | None = frozenset()
    """Short names a tower module PEFT's LoRA refuses shares with a Linear one, so that name-matched targets reach
    it: Qwen2-VL's Conv3d `patch_embed.proj` beside the blocks' `attn.proj` (PEFT's all-linear collects the base
    names of Linear modules, peft tuners_utils.py _maybe_include_all_linear_layers, then matches them by suffix;
    LlamaFactory#6938). None: not known for the family."""


# Most specific first: the first family whose pattern matches a model name decides its tower names.
_PATCH_PROJ = frozenset({"proj"})
FAMILIES = (
    Family("qwen2.5-vl", r"qwen[-_.]?2\.5[-_.]?vl", _VIT | {"gate_proj", "up_proj", "down_proj", "mlp.0", "mlp.2"},
           _PATCH_PROJ),
    Family("qwen3-vl", r"qwen[-_.]?3[-_.]?vl", {"qkv", "proj", "linear_fc1", "linear_fc2"}, _PATCH_PROJ),
    Family("qwen-vl", r"qwen[-_.]?2?[-_.]?vl|qvq", _VIT | {"mlp.0", "mlp.2", "c_fc", "c_proj", "attn_pool"},
           _PATCH_PROJ),
    Family("llava", r"llava|vip-llava|bakllava", _CLIP),
    Family("minicpm-v", r"minicpm[-_.]?(llama3[-_.]?)?[vo]", _CLIP | {"kv_proj"}),
    Family("internvl", r"intern[-_.]?vl|internvit|mini[-_.]?internvl", _VIT | {"mlp1.1", "mlp1.3"}),
    Family("idefics", r"idefics|smolvlm", _CLIP | {"proj"}),
    Family("paligemma", r"paligemma", _CLIP),
    # Gemma 3 from 4B on (and 3n) takes images; 1B and 270M are text-only.
    Family("gemma-3", r"gemma[-_.]?3n|gemma[-_.]?3[-_.](4|12|27)b", _CLIP),
    Family("phi-vision", r"phi[-_.]?3(\.5)?[-_.]vision|phi[-_.]?4[-_.]multimodal", _CLIP),
    Family("mllama", r"llama[-_.]?3\.2[-_.]\d+b[-_.]vision|mllama", _CLIP | {"o_proj", "gate_proj", "up_proj",
                                                                                "down_proj"}),
    Family("pixtral", r"pixtral|mistral[-_.]small[-_.]3\.[12]", _CLIP | {"o_proj", "gate_proj", "up_proj",
                                                                          "down_proj"}),
    Family("other", r"(?<![a-z])(glm[-_.]?4\.?\dv|glm[-_.]?4v|cogvlm|deepseek[-_.]vl|janus|molmo|florence|blip|"
                    r"kimi[-_.]vl|ovis|aria|fuyu|chameleon|emu3|mplug[-_.]owl|cambrian)|"
                    r"[-_.]vl\d?([-_.]|$)|vlm|[-_.]vision([-_.]|$)", _VIT | _CLIP, None),
)
_FAMILY_RES = tuple((f, re.compile(f.pattern, re.IGNORECASE)) for f in FAMILIES)


def family(model: str) -> Family | None:
    """The image-text family a model id or path names, or None (a text-only model, or a name that does not say)."""
    for fam, rx in _FAMILY_RES:
        if model and rx.search(model):
            return fam
    return None


def recognise(draft: Draft, model: str, model_source: str, flag_source: str | None = None) -> bool:
    """Set `image_text` when the model's name or a flag only image-text runs have (`--freeze_vit`, `--tune_vision`,
    a VLM chat template) says so; returns whether it did."""
    fam = family(model)
    if fam is not None:
        draft.set("image_text", True, f"{model_source} ({model}: an image-text model, {fam.name})")
    elif flag_source:
        draft.set("image_text", True, f"{flag_source} (a flag only image-text runs have)")
    return draft.get("image_text")


def targets_reach_towers(model: str, targets: list[str]) -> bool:
    """Whether adapter targets that PEFT matches by name against the whole model (a list of short names, all-linear)
    also match modules of the vision encoder or projector. A regex string or full module paths match only what they
    name (those that name the tower are tower_adapters, see intent.TOWER_MODULE)."""
    names = [t.strip() for t in targets if t.strip()]
    if any(t.lower() in ("all-linear", "all") for t in names):
        return True
    fam = family(model)
    tower = fam.tower_names if fam is not None else _VIT
    return any(t in tower for t in names if not re.search(r"[\\^$*+?()\[\]|{}]", t))


def targets_enter_tower(draft: Draft, source: str, why: str, model: str, targets: list[str] | None = None) -> None:
    """Record that the launch's adapter targets are matched against every tower, so adapters land in the vision
    encoder (rule lora-targets-vision-tower, and the tower then trains). `targets`: given by a framework that keeps
    no tower frozen (TRL, a Trainer script), where adapters in the tower are what the targets ask for; they are then
    wrong only where a name also reaches a tower module PEFT refuses (Family.refused)."""
    fam = family(model)
    if targets is not None and fam is not None and fam.refused is not None:
        names = {t.strip() for t in targets}
        if not (fam.refused and (names & fam.refused or any(t.lower() in ("all-linear", "all") for t in names))):
            draft.set("targets_all_towers", False, f"{source}: every {fam.name} tower module the names reach is one "
                      "PEFT wraps, and nothing in this launch keeps the tower frozen")
            draft.set("tower_adapters", True, f"{source} (matches modules of the vision encoder of {model})")
            draft.set("towers_trainable", True, f"{source} (adapters in the vision encoder)")
            return
    draft.set("targets_all_towers", True, f"{source}{why}")
    draft.set("tower_adapters", True, f"{source} (matches modules of the vision encoder of {model})")
    draft.set("towers_trainable", True, f"{source} (adapters in the vision encoder)")


def data_unknowns(draft: Draft, length_key: str = "") -> None:
    """What the data decides in an image-text run, unless the frontend already knows it from the framework: whether
    some micro-batch holds no image (the vision tower then skips a rank), and whether the length limit cuts a sample
    inside its image tokens. Each is evaluated both ways, so a finding that needs it holds only conditionally."""
    if not draft.get("image_text"):
        return
    if not draft.has("image_every_rank"):
        draft.maybe("image_every_rank", {True: "every micro-batch holds an image (no text-only samples mixed in)",
                                         False: "some micro-batch holds no image (text-only samples mixed in)"},
                    "whether text-only samples reach a rank is in the data, which the launch line does not show")
    if not draft.has("image_safe_truncation"):
        limit = f" ({length_key})" if length_key else ""
        draft.maybe("image_safe_truncation", {True: f"no image sample is longer than the length limit{limit}",
                                              False: f"an image sample is longer than the length limit{limit} and "
                                                     "is cut inside its image tokens"},
                    "how long the image samples are (images x tokens per image) is in the data")


def token_types_unknown(draft: Draft) -> None:
    """The HF Trainer / TRL on the image-text class of a model whose training forward needs its token type ids (rule
    mm-token-types-required): a text-only dataset is collated by the tokenizer, which makes none, and whether the data
    holds images is not in the launch (`check --data FILE` settles it)."""
    if draft.get("model_type") in TOKEN_TYPES_LAST and not draft.has("mm_token_types_missing"):
        draft.maybe("mm_token_types_missing",
                    {True: "the data is text only (its collator, the tokenizer's, makes no token_type_ids)",
                     False: "the batches come from the model's processor with images (token_type_ids included)"},
                    "whether the data holds images is not in the launch line")


# Image-text classes whose own enable_input_require_grads hooks the vision embeddings too, before transformers 5 did
# it for every model (PR #41993 "follows the existing implementations for idefics2-3 and smolvlm"): Idefics,
# Idefics2, Idefics3, SmolVLM (transformers models/idefics2/modeling_idefics2.py _vision_require_grads_hook).
_HOOKS_TOWER = re.compile(r"idefics|smolvlm", re.IGNORECASE)


def tower_hook(draft: Draft, model: str = "") -> None:
    """Whether the input-grad hook of enable_input_require_grads reaches adapters inside a checkpointed vision tower:
    from transformers 5 it hooks each sub-model's input embeddings (PR #41993: the patch embedding too); before,
    only the language model's token embeddings. Call it once checkpointing and the adapters are known."""
    if draft.get("tower_adapters") and draft.get("checkpointing") != "off" and not draft.has("tower_input_hook") \
            and model and _HOOKS_TOWER.search(model):
        draft.set("tower_input_hook", True, f"{model}: its model class's enable_input_require_grads also hooks the "
                  "vision embeddings (transformers models/idefics2/modeling_idefics2.py)")
    if draft.get("tower_adapters") and draft.get("checkpointing") != "off" and not draft.has("tower_input_hook"):
        new = at_least(draft, "transformers", "5.0.0")
        draft.set("tower_input_hook", new, f"transformers {'>=' if new else '<'} 5.0: enable_input_require_grads "
                  f"{'also hooks' if new else 'does not hook'} the vision tower's patch embedding (PR #41993)")
