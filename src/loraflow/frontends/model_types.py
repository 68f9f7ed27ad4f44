"""What a model's hub id or path says: its config.model_type where the name makes it certain (PEFT's default LoRA
targets are keyed by it, rule lora-no-default-targets), whether transformers 4.52 renamed its modules (the image-text
models whose weights older vLLM releases cannot place, rule vllm-vlm-weight-names), a checkpoint saved quantized, a
family that overflows float16 - all set on a frontend's draft by model_name_facts, once for every frontend."""

from __future__ import annotations

import re

from loraflow.families import FP16_OVERFLOW, fp16_overflow_name
from loraflow.frontends.common import Draft, at_least
from loraflow.frontends.moe_blocks import moe_facts

# config.model_type of checkpoints whose type is certain from the id (the last part of a hub id or path); the first
# pattern that matches decides, so the more specific ones (Qwen2.5-VL before Qwen2.5, a Qwen distill of DeepSeek-R1
# before DeepSeek) come first. An id no pattern matches (a local name, an architecture not listed) decides nothing.
_MODEL_TYPES = tuple((t, re.compile(rx, re.I)) for t, rx in (
    ("qwen2", r"distill[-_]qwen|qwq"), ("llama", r"distill[-_]llama"),
    ("qwen3_vl_moe", r"qwen3[-_.]?vl[-_.].*\ba\d+(\.\d+)?b\b"), ("qwen3_vl", r"qwen3[-_.]?vl"),
    ("qwen2_5_vl", r"qwen2[._]5[-_.]?vl"), ("qwen2_vl", r"qwen2[-_.]?vl"),
    ("qwen2_5_omni", r"qwen2[._]5[-_.]?omni"), ("qwen2_audio", r"qwen2[-_.]?audio"),
    ("qwen", r"^qwen[-_](vl|\d+(\.\d+)?b)"),
    ("qwen3_next", r"^qwen3[-_]next"), ("qwen3_omni_moe", r"^qwen3[-_]omni"),
    ("qwen3_moe", r"^qwen3[-_.].*\ba\d+(\.\d+)?b\b"), ("qwen3", r"^qwen3\b|^qwen3[-_.]"),
    ("qwen2_moe", r"^qwen(1[._]5|2)[-_.]moe|^qwen2[-_.]57b[-_]a14b"),
    ("qwen2", r"^qwen(1[._]5|2|2[._]5)\b|^qwen(1[._]5|2|2[._]5)[-_.]"),
    ("chatglm", r"^chatglm|^glm[-_]4[-_]9b[-_]chat$|^glm[-_]4[-_]9b$"), ("baichuan", r"^baichuan"),
    ("internlm2", r"^internlm2"), ("internlm", r"^internlm[-_]"), ("internvl_chat", r"^internvl"),
    ("minicpmv", r"^minicpm[-_](v|o|llama3[-_]v)"), ("paligemma", r"^paligemma"),
    ("phimoe", r"^phi[-_]?3\.5[-_]moe"), ("phi3_v", r"^phi[-_]?3(\.5)?[-_]vision"),
    ("phi4mm", r"^phi[-_]?4[-_]multimodal"), ("phi3", r"^phi[-_]?(3|4)"),
    ("phi", r"^phi[-_]?(1|1_5|2)\b"), ("gemma3n", r"^gemma[-_]?3n"), ("gemma3_text", r"^gemma[-_]?3[-_](1b|270m)"),
    ("gemma3", r"^gemma[-_]?3\b|^translategemma|^medgemma[-_]4b"), ("molmo2", r"^molmo[-_]?2"),
    ("gemma2", r"^gemma[-_]?2\b"), ("gemma", r"^(code)?gemma[-_](\d+b|1\.1|2b|7b)"),
    ("mllama", r"^llama[-_]3\.2[-_]\d+b[-_]vision"), ("llava", r"^llava[-_]1\.5[-_]\d+b[-_]hf$"),
    ("llama4", r"^llama[-_]4"),
    ("mixtral", r"^mixtral"), ("mistral", r"^mistral[-_]7b"),
    ("llama", r"^(meta[-_])?llama[-_]?[23]|^(tiny|code)llama|^vicuna|^yi[-_](6|9|34)b|"
              r"^deepseek[-_](llm|coder)[-_](?!v2)"),
    ("deepseek_v3", r"^deepseek[-_]v3|^deepseek[-_]r1$"), ("deepseek_v2", r"^deepseek[-_](coder[-_])?v2"),
    ("glm4_moe", r"^glm[-_]4\.5(?!v)|^glm[-_]4\.6(?!v)"), ("jamba", r"^(ai21[-_])?jamba"), ("olmoe", r"^olmoe"),
    ("falcon", r"^falcon[-_]"), ("bloom", r"^bloom"), ("gpt_neox", r"^pythia|^gpt[-_]?neox|^dolly[-_]v2"),
    ("gpt2", r"^(distil)?gpt2\b"), ("opt", r"^opt[-_]\d"), ("starcoder2", r"^starcoder2"),
    ("gpt_bigcode", r"^(starcoder|santacoder)"), ("mpt", r"^mpt[-_]\d"), ("mt5", r"^mt5[-_]"),
    ("t5", r"^(flan[-_])?t5[-_]"),
))

VLM_RENAMED = {"qwen2_vl": "qwen2-vl", "qwen2_5_vl": "qwen2-vl", "llava": "vlm", "gemma3": "vlm", "mllama": "vlm"}
"""Model types whose modules transformers 4.52.0 moved under model.language_model / model.visual (model.vision_tower,
model.multi_modal_projector) (PR #37033; modeling_utils.py VLMS): live weights carry the new names on every later
release. vLLM maps them for Qwen2-VL / Qwen2.5-VL from 0.9.1 (qwen2_5_vl.py hf_to_vllm_mapper, PR #19054) and for
LLaVA, Gemma 3 and Mllama from 0.9.2 (llava.py, gemma3_mm.py, mllama.py), read from the vllm wheels."""


# Hub organizations whose name local copies keep in front of the model's (`mistralai_Mixtral-8x7B-Instruct-v0.1`,
# huggingface_hub's cache folder `models--Qwen--Qwen2.5-7B`, ModelScope's `Qwen___Qwen2.5-7B`).
_ORGS = re.compile(r"^(?:models--)?(mistralai|meta[-_]llama|qwen|deepseek[-_]ai|google|microsoft|thudm|zai[-_]org|"
                   r"baichuan[-_]inc|internlm|opengvlab|openbmb|01[-_]ai|tiiuae|bigscience|eleutherai|llava[-_]hf|"
                   r"ai21labs|allenai|bigcode|mosaicml|lmsys|huggingfacetb|unsloth)(?:--|_{1,3})", re.I)


def model_type_of(model: str) -> str | None:
    """The config.model_type a hub id or local path names unambiguously, or None."""
    name = model.rstrip("/").rsplit("/", 1)[-1]
    if not name:
        return None
    names = (name, _ORGS.sub("", name)) if _ORGS.match(name) else (name,)
    return next((t for n in names for t, rx in _MODEL_TYPES if rx.search(n)), None)


# Checkpoints published already quantized after training, by the names their uploaders give them: `-GPTQ`, `-AWQ`,
# `-AQLM`, Qwen's `-Int4` / `-Int8` (GPTQ), Neural Magic / Red Hat's compressed-tensors `w8a8`, `w4a16`, `w8a16`.
# bitsandbytes uploads (`-bnb-4bit`) load as bitsandbytes quantization (script_facts.prequantized), fine-grained FP8
# ones are fp8_checkpoint (below) and mxfp4 ones are dequantized where no kernel runs them: none is read here.
_PTQ_NAMES = ((re.compile(r"(?:^|[-_./])(gptq|awq|aqlm)(?:$|[-_./])", re.I), None),
              (re.compile(r"[-_.]int[48](?:$|[-_./])", re.I), "gptq"),
              (re.compile(r"(?:^|[-_./])w(?:4|8)a(?:8|16)(?:$|[-_./])", re.I), "compressed-tensors"))


def ptq_method(model: str) -> str | None:
    """The post-training quantization a checkpoint's name says it was saved with, or None."""
    for pattern, method in _PTQ_NAMES:
        found = pattern.search(model)
        if found:
            return method or found.group(1).lower()
    return None


# Checkpoints whose config.json declares fine-grained FP8 weights (quant_method fp8): an `-FP8` upload (Qwen3-*-FP8,
# GLM-4.5-FP8, unsloth's) and the releases shipped in FP8 under their plain names: DeepSeek-V3 / V3.1 / V3.2 / R1,
# Kimi-K2 (not -Thinking, INT4), MiniMax-M2. Not: Neural Magic / Red Hat's `-FP8` and `-FP8-dynamic` uploads
# (compressed-tensors, a quantizer of its own), a name that says another format or a derived model (a distill onto
# Qwen or Llama, an AWQ/GGUF/bf16 copy, a LoRA output folder).
_FP8_SUFFIX = re.compile(r"[-_.]fp8(?:$|[-_./])(?![-_]?dynamic)", re.I)
_FP8_PLAIN = re.compile(r"^deepseek[-_](v3(\.\d)?|r1)(?:$|[-_])|^kimi[-_]k2(?![-_]thinking)|^minimax[-_]m2", re.I)
_NOT_FP8 = re.compile(r"awq|gguf|gptq|bf16|bnb|int[48]|[48]bit|lora|exl2|mlx|[-_]out(put)?$", re.I)
_DERIVED = re.compile(r"distill|qwen|llama", re.I)  # a DeepSeek-R1 distilled onto another family's bf16 model
_COMPRESSED_ORGS = re.compile(r"^(neuralmagic|redhatai|nm-testing)/", re.I)


def fp8_checkpoint(model: str) -> bool:
    """Whether a hub id or path names a checkpoint shipped in fine-grained FP8 (config.json quant_method fp8)."""
    name = model.rstrip("/").rsplit("/", 1)[-1]
    if _NOT_FP8.search(name) or _COMPRESSED_ORGS.search(model.strip()):
        return False
    return bool(_FP8_SUFFIX.search(name) or (_FP8_PLAIN.search(name) and not _DERIVED.search(name)))


def model_name_facts(draft: Draft, model: str, source: str) -> None:
    """What the model's name or path says beyond its towers: a family whose activations overflow float16
    (families.FP16_OVERFLOW; rule fp16-overflow), a checkpoint saved quantized after training (ptq_method) or shipped
    in FP8 (fp8_checkpoint; rule fp8-checkpoint-not-trainable), an image-text model whose modules transformers 4.52
    renamed (rule vllm-vlm-weight-names)."""
    method = ptq_method(model)
    if method is not None:
        draft.set("ptq_checkpoint", method, f"{source} ({model}: a checkpoint saved {method}-quantized, by its name)")
        where = source.split(" (")[0].split(": ", 1)[-1] or "the model path"
        draft.flags.setdefault("ptq_checkpoint", f"{where} (the unquantized checkpoint)")
    if fp8_checkpoint(model):
        draft.set("fp8_checkpoint", True, f"{source} ({model}: a checkpoint shipped in FP8, config.json "
                                          "quant_method fp8)")
    model_type = model_type_of(model)
    if model_type:
        draft.set("model_type", model_type, f"{source} ({model})")
    moe_facts(draft, model_type, model, source, at_least)
    renamed = VLM_RENAMED.get(model_type or "")
    if renamed:
        draft.set("vlm_renamed", renamed, f"{source} ({model}: transformers >= 4.52 names its modules "
                                          "model.language_model / model.visual...)")
    kind = fp16_overflow_name(model)
    if kind is None and "$" in model:  # `checkpoints/$MODEL`: the family is in a variable the line does not show
        draft.maybe("fp16_overflows", {True: "a family whose activations overflow float16 (T5, Gemma, ...)",
                                       False: "a family that stays in float16's range"},
                    f"{source}: the model is in {model}, not visible here")
    elif kind is not None:
        draft.set("fp16_overflows", True, f"{source} ({model}: the {kind} family overflows float16, "
                                          f"{FP16_OVERFLOW[kind].source})")
