"""Model families: what loraflow knows about each transformers `model_type`, in one table.

What differs between architectures is declared here once, with its source beside it: the names of an image-text
model's towers, of a decoder layer's attention and MLP children, of the embeddings and the output head, of the
linear layers; the transforms a model applies to its logits after the head; the image inputs its processor returns
and the tokens that frame an image; and which transformers auto class loads it. Adding a family is one entry in
FAMILIES.

Most lookups do not know the family (they look at a module tree, a processor, a batch), so they match the generic
lists at the end of this file: every name an entry of FAMILIES (or UNLISTED) declares, in table order, which is the
order of preference where a lookup takes the first match. A model_type without an entry gets DEFAULT.

This module imports nothing from the rest of loraflow, so setup, the plan, data, engines and frontends can all
read it without an import cycle.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Mapping, NamedTuple

TOWER_NAMES = ("vision", "projector", "language")
"""An image-text model's towers: the vision encoder, the projector that maps image features into the language
model's embedding space, and the language model (everything else: token embeddings, decoder layers, output head)."""

_LLAMA_LINEARS = (("q_proj", "k_proj", "v_proj", "o_proj"), ("gate_proj", "up_proj", "down_proj"))


@dataclass(frozen=True)
class Family:
    """One model_type's facts. The defaults are Llama's names, which Qwen, Mistral, Gemma and most decoders share,
    and a text-only model (no towers, no image inputs)."""

    vision: tuple[str, ...] = ()
    """Names of the vision encoder's root module (the last part of its module name)."""
    projector: tuple[str, ...] = ()
    """Names of the projector's root module."""
    attention: tuple[str, ...] = ("self_attn",)
    """Names of a decoder layer's attention child (what checkpointing.granularity=attention recomputes)."""
    mlp: tuple[str, ...] = ("mlp",)
    """Names of a decoder layer's MLP child (what checkpointing.granularity=mlp recomputes)."""
    embedding: tuple[str, ...] = ("embed_tokens",)
    """Names of the token embeddings module."""
    head: tuple[str, ...] = ("lm_head",)
    """Names of the output head."""
    linears: tuple[tuple[str, ...], tuple[str, ...]] = _LLAMA_LINEARS
    """(attention, MLP) linear layer names of a decoder layer (fused expert weights are parameters, not Linears)."""
    logit_transforms: Mapping[str, float | None] = field(default_factory=dict)
    """Config attributes of transforms transformers applies to the logits after the output head -> the value at
    which each is the identity."""
    image_inputs: tuple[str, ...] = ()
    """Processor outputs its forward takes beside input_ids and attention_mask (IMAGE_LAYOUTS says how a
    micro-batch stacks them)."""
    image_token_words: tuple[str, ...] = ()
    """Words in the names of its processor's attributes that hold an image token (`<word>...token`, or its `_id`)."""
    framing_tokens: tuple[str, ...] = ()
    """Tokens that frame an image which its processor does not name as attributes."""
    image_cross_attention: bool = False
    """Images reach the language model through cross-attention layers fed a tensor computed outside them (Mllama),
    not as image tokens in the sequence."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "logit_transforms", MappingProxyType(dict(self.logit_transforms)))


# Image-text families that share their parts with another declare only what differs (dataclasses.replace).
_LLAVA = Family(vision=("vision_tower",), projector=("multi_modal_projector",),
                image_inputs=("pixel_values",),  # [n_images, C, H, W]
                image_token_words=("image",))  # processor.image_token
_QWEN2_VL = Family(
    vision=("visual",),
    # visual.merger sits inside its vision encoder, and is still the projector (setup/towers.py tower_of).
    projector=("merger",),
    # pixel_values [n_patches, D]; image_grid_thw [n_images, 3]; mm_token_type_ids: the modality of each token.
    image_inputs=("pixel_values", "image_grid_thw", "mm_token_type_ids"),
    image_token_words=("vision",),  # vision_start_token / vision_end_token
    framing_tokens=("<|vision_start|>", "<|vision_end|>"))  # only in its model config, not processor attributes
_IDEFICS3 = Family(
    vision=("vision_model",), projector=("connector",),
    # pixel_values [1, n_images, C, H, W] and pixel_attention_mask [1, n_images, H, W]; the model drops the
    # all-zero images that pad them.
    image_inputs=("pixel_values", "pixel_attention_mask"),
    image_token_words=("image",),  # fake_image_token, global_image_token
    framing_tokens=("<fake_token_around_image>", "<global-img>"))

# Order matters where a lookup takes the first match (SUB_BLOCKS, LOGIT_TRANSFORMS) and a module holds two of the
# names: put a new family after those whose names it should not overrule.
FAMILIES: dict[str, Family] = {
    # Decoder-only language models: the entries are the families that name a part otherwise than Llama.
    "llama": Family(),
    "gpt2": Family(attention=("attn",), embedding=("wte",), linears=(("c_attn", "c_proj"), ("c_fc", "c_proj"))),
    "falcon": Family(attention=("self_attention",), embedding=("word_embeddings",),
                     linears=(("query_key_value", "dense"), ("dense_h_to_4h", "dense_4h_to_h"))),
    # Its head is embed_out in its checkpoints and before transformers 5 (which renames it to lm_head on load:
    # conversion_mapping.py), so launch scripts name it so.
    "gpt_neox": Family(attention=("attention",), embedding=("embed_in",), head=("lm_head", "embed_out"),
                       linears=(("query_key_value", "dense"), ("dense_h_to_4h", "dense_4h_to_h"))),
    "llama4_text": Family(mlp=("feed_forward",)),
    # Its attention sits inside norm_attn_norm with the norms, so no child of the layer is the attention alone.
    "dbrx": Family(attention=(), mlp=("ffn",), embedding=("wte",), linears=(("Wqkv", "out_proj"), ())),
    # block_sparse_moe before transformers 5; its experts are fused parameters, not Linears.
    "mixtral": Family(mlp=("mlp", "block_sparse_moe"), linears=(_LLAMA_LINEARS[0], ())),
    "phi3": Family(linears=(("qkv_proj", "o_proj"), ("gate_up_proj", "down_proj"))),
    # Gemma2/3, ...: c * tanh(logits / c) when set.
    "gemma2": Family(logit_transforms={"final_logit_softcapping": None}),
    "cohere": Family(logit_transforms={"logit_scale": 1.0}),  # logits * logit_scale
    "granite": Family(logit_transforms={"logits_scaling": 1.0}),  # logits / logits_scaling
    # Image-text models.
    "llava": _LLAVA,
    # pixel_values [n_images, n_patches, C, H, W], whose all-zero padding patches the model drops; image_sizes
    # [n_images, 2].
    "llava_next": replace(_LLAVA, image_inputs=("pixel_values", "image_sizes")),
    # As LLaVA-NeXT, with batch_num_images [n_rows]: how many images each row holds.
    "llava_onevision": replace(_LLAVA, image_inputs=("pixel_values", "image_sizes", "batch_num_images")),
    # Pixtral's images keep their own sizes: pixel_values [n_images, C, H, W] padded, image_sizes [n_images, 2].
    "mistral3": replace(_LLAVA, image_inputs=("pixel_values", "image_sizes")),
    # token_type_ids: 1 on image tokens. boi_token / eoi_token name its framing tokens.
    "gemma3": replace(_LLAVA, image_inputs=("pixel_values", "token_type_ids"),
                      image_token_words=("image", "boi", "eoi"), framing_tokens=("<start_of_image>", "<end_of_image>")),
    "paligemma": replace(_LLAVA, image_inputs=("pixel_values", "token_type_ids")),
    "qwen2_vl": _QWEN2_VL,
    "qwen2_5_vl": _QWEN2_VL,
    # pixel_values [1, n_images, n_tiles, C, H, W]; aspect_ratio_ids [1, n_images]; aspect_ratio_mask
    # [1, n_images, n_tiles]; cross_attention_mask [1, n_tokens, n_images, n_tiles]: which image tiles each token
    # attends to (its cross-attention layers read the images; no image tokens are replaced).
    "mllama": Family(vision=("vision_model",), projector=("multi_modal_projector",),
                     image_inputs=("pixel_values", "aspect_ratio_ids", "aspect_ratio_mask", "cross_attention_mask"),
                     image_token_words=("image",), image_cross_attention=True),
    "idefics3": _IDEFICS3,
    "smolvlm": _IDEFICS3,
    "minicpmv": Family(vision=("vpm",), projector=("resampler",)),  # MiniCPM-V (remote code)
}
"""model_type -> its facts."""

UNLISTED = Family(vision=("vision_encoder", "image_encoder"), projector=("mm_projector", "aligner"), attention=(),
                  mlp=(), embedding=(), head=("output",), linears=((), ()),
                  logit_transforms={"output_multiplier": 1.0},  # logits * output_multiplier
                  image_token_words=("img",))
"""Names seen in implementations that have no entry of their own (remote code, other repositories); the generic
lists match them after every entry's."""

DEFAULT = Family()
"""The facts of a model_type without an entry: Llama's names."""


def family(model_type: str) -> Family:
    """The facts of `model_type` (DEFAULT for one without an entry)."""
    return FAMILIES.get(model_type, DEFAULT)


def _union(name: str) -> tuple:
    """Every entry's values of one field, in table order, each once."""
    return tuple(dict.fromkeys(v for f in (*FAMILIES.values(), UNLISTED) for v in getattr(f, name)))


def _merged(name: str) -> dict:
    """Every entry's mapping of one field in one dict; two entries that give a key different values are a mistake
    in the table."""
    out: dict = {}
    for f in (*FAMILIES.values(), UNLISTED):
        for key, value in getattr(f, name).items():
            if out.setdefault(key, value) != value:
                raise ValueError(f"families.py: {name}[{key!r}] is declared as both {out[key]!r} and {value!r}")
    return out


# -- the generic lists: what lookups match when they do not know the family ---------------------------------
VISION_NAMES = _union("vision")
PROJECTOR_NAMES = _union("projector")
SUB_BLOCKS = {"attention": _union("attention"), "mlp": _union("mlp")}
"""checkpointing.granularity -> the names architectures give that child of a decoder layer, first match wins."""
EMBEDDING_NAMES = _union("embedding")
HEAD_NAMES = _union("head")
LOGIT_TRANSFORMS = _merged("logit_transforms")

IMAGE_LAYOUTS = {
    "pixel_values": "images",
    "pixel_attention_mask": "pad1",  # padded with False like its images
    "aspect_ratio_ids": "rows",
    "aspect_ratio_mask": "rows",
    "cross_attention_mask": "token_grid",
    "token_type_ids": "token",
    "mm_token_type_ids": "token",
}
"""How collate batches each processor output of the rows in a micro-batch, as each family's forward expects:
  cat:    concatenated along dim 0 (the model consumes images in order of their placeholder tokens)
  pad1:   padded with zeros along dim 1 to the batch's largest, then concatenated along dim 0
  rows:   [1, ...] per row, and every row gets one: zero-padded to the largest of the other dimensions, all zeros
          for a row without images (Mllama's cross-attention reads one entry per row)
  images: rows for a 6-D layout (Mllama), pad1 for a 5-D one (Idefics3, LLaVA-NeXT), else cat
  token:  one value per input id: padded like input_ids (0 on padding and on rows that lack it)
  token_grid: rows whose dim 1 counts tokens (Mllama's cross_attention_mask): padded or cut to the batch's width
A key not listed is concatenated along dim 0."""
IMAGE_BATCHING = {key: IMAGE_LAYOUTS.get(key, "cat") for key in _union("image_inputs")}
"""Every image input a family's forward takes -> how collate batches it."""
TOKEN_KEYS = {k for k, rule in IMAGE_BATCHING.items() if rule == "token"}
"""Per-token image inputs: truncated and padded like input_ids."""

IMAGE_TOKEN_ATTR = re.compile(rf"({'|'.join(map(re.escape, _union('image_token_words')))}).*token$")
"""Processor attributes naming image tokens (image_token, boi_token, vision_start_token, ...)."""
FRAMING_TOKENS = _union("framing_tokens")

# -- families whose activations overflow float16 ---------------------------------------------------------------
class Fp16Overflow(NamedTuple):
    names: str
    """Matched, case-insensitively, against a model id or path (what a launch line gives)."""
    source: str


FP16_OVERFLOW: Mapping[str, Fp16Overflow] = MappingProxyType({
    # T5's authors trained it with bfloat16 activations only; its feed-forward outputs exceed 65504 in float16
    # (google-research/text-to-text-transfer-transformer#539; transformers clamps T5's hidden states under fp16).
    "t5": Fp16Overflow(r"(?<![a-z0-9])(flan[-_.]?|m|by|u|um|code|long)?t5([-_.]|$)|(?<![a-z])ul2(?![a-z0-9])",
                       "google-research/text-to-text-transfer-transformer#539"),
    # Gemma 3's large RMSNorm weights and post-norms overflow float16 (transformers#36822); Unsloth loads Gemma 3 /
    # 3n, gpt-oss and Qwen3.5 in bfloat16 with float32 upcasts when float16 is asked (unsloth FORCE_FLOAT32).
    # Not `gemma-3b` (PaliGemma-1's `paligemma-3b-pt-224` is a 3B Gemma 1).
    "gemma3": Fp16Overflow(r"gemma[-_.]?3(?!\d*b)", "huggingface/transformers#36822; unsloth FORCE_FLOAT32"),
    "gpt_oss": Fp16Overflow(r"gpt[-_.]?oss", "unsloth FORCE_FLOAT32 (unsloth_zoo)"),
    "qwen3_5": Fp16Overflow(r"qwen[-_.]?3\.5", "unsloth FORCE_FLOAT32 (Qwen3.5's GDN layers NaN in float16)"),
    # The backward overflows along the residual stream: finite loss, NaN grad norm on the first steps
    # (unslothai/unsloth-zoo#866).
    "gemma4": Fp16Overflow(r"gemma[-_.]?4", "unslothai/unsloth-zoo#866"),
    "qwen3_moe": Fp16Overflow(r"qwen[-_.]?3[-_.]\d+b[-_.]a\d+b", "unslothai/unsloth-zoo#866"),
    "glm4_moe": Fp16Overflow(r"glm[-_.]?4\.[56](?![0-9])(?![-_.]?v)", "unslothai/unsloth-zoo#866"),
})
"""model_type -> the model names that family goes by and the source showing it overflows float16 in training. The
text-only and multimodal model_types of a family share its entry (fp16_overflows_type)."""
_FP16_OVERFLOW_RES = tuple((t, re.compile(f.names, re.IGNORECASE)) for t, f in FP16_OVERFLOW.items())


_FP16_OVERFLOW_KIN = {"mt5": "t5", "umt5": "t5", "gemma3n": "gemma3", "qwen3_5_moe": "qwen3_5"}
"""model_types that share a family's FP16_OVERFLOW entry (besides each one's `_text` variant)."""


def fp16_overflows_type(model_type: str) -> bool:
    """Whether a model_type belongs to a family of FP16_OVERFLOW."""
    base = model_type.removesuffix("_text")
    return _FP16_OVERFLOW_KIN.get(base, base) in FP16_OVERFLOW


def fp16_overflow_name(model: str) -> str | None:
    """The FP16_OVERFLOW model_type a model id or path names, or None."""
    return next((t for t, rx in _FP16_OVERFLOW_RES if model and rx.search(model)), None)


# -- which transformers auto class loads a model ---------------------------------------------------------------
class AutoClass(NamedTuple):
    name: str
    mapping: str


AUTO_CLASSES = {
    "causal-lm": AutoClass("AutoModelForCausalLM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    "image-text": AutoClass("AutoModelForImageTextToText", "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES"),
    "score": AutoClass("AutoModelForSequenceClassification", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"),
}
"""Each way loraflow loads a model -> transformers' auto class and its mapping of the model_types it registers
(transformers.models.auto.modeling_auto). transformers' registry decides which model_type loads with which class,
so no entry of FAMILIES repeats it."""


def auto_mapping(kind: str):
    """model_type -> class name, for the model_types transformers registers under AUTO_CLASSES[kind]."""
    from transformers.models.auto import modeling_auto

    return getattr(modeling_auto, AUTO_CLASSES[kind].mapping)


def loads_as(hf_config, head: str = "lm") -> str:
    """The AUTO_CLASSES kind that loads this model for `head`: a scalar score head on a sequence-classification
    class; otherwise an image-text-to-text model (a vision config beside the text one, and transformers has the
    class for it) with AutoModelForImageTextToText, whichever causal-LM class it may also have, and anything else as
    a causal LM."""
    if head == "score":
        return "score"
    model_type = getattr(hf_config, "model_type", "unknown")
    if hasattr(hf_config, "vision_config") and model_type in auto_mapping("image-text"):
        return "image-text"
    return "causal-lm"


# Read by the rule mm-token-types-required and by check's frontends (frontends/vision.py).
TOKEN_TYPES_LAST: Mapping[str, str | None] = MappingProxyType({"gemma3": "5.6.0", "paligemma": "5.9.0",
                                                               "gemma4": "5.6.0", "molmo2": None})
"""model_type -> the first transformers release whose image-text class no longer refuses a training forward without
the token type ids its processor makes (None: the installed 5.23 still does), read from the wheels: gemma3's
create_causal_mask_mapping raises from 5.0.0 to 5.5.4, paligemma's to 5.8.1, gemma4's (mm_token_type_ids, which it
has from 5.5.0) in 5.5.x; molmo2's forward (modeling_molmo2.py) raises in 5.23.0. 4.x used the ids only when given."""
