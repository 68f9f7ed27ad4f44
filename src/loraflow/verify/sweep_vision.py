"""Tiny image-text models of the families transformers ships, built from their configs with a processor that
transformers' AutoProcessor loads (no torchvision: the image processors' PIL backends), and small image data for every
stage: the composition sweep's image-text families (sweep_models.model_dir builds them) and the tests' own.

Nothing is downloaded: the tokenizer is the bundled tiny-base's with each family's image tokens added, the weights
are random, and the images are coloured squares drawn here."""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

from loraflow.locations import ASSETS

VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)

# Renders string content or a list of parts; an image part becomes IMAGE (the family's placeholder).
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{% if m['content'] is string %}{{ m['content'] }}{% else %}"
            "{% for p in m['content'] %}{% if p['type'] == 'image' %}IMAGE{% else %}{{ p['text'] }}{% endif %}"
            "{% endfor %}{% endif %}<|end|>{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
TEXT = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, pad_token_id=0, bos_token_id=1, eos_token_id=2)
COLOURS = {"red": (220, 30, 30), "green": (30, 200, 60), "blue": (40, 60, 220), "yellow": (230, 220, 40)}


def _tokenizer(*special: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ASSETS / "tiny-base")
    tokenizer.add_special_tokens({"additional_special_tokens": list(special)})
    return tokenizer


def _llava():
    from transformers import CLIPImageProcessor, LlavaConfig, LlavaProcessor

    tokenizer = _tokenizer("<image>")
    # 3 vision layers: LLaVA reads the second-to-last (vision_feature_layer=-2), so two of them run.
    config = LlavaConfig(text_config={**TEXT, "vocab_size": len(tokenizer)},
                         vision_config=dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64,
                                            num_hidden_layers=3, num_attention_heads=2, image_size=16, patch_size=8,
                                            projection_dim=32),
                         image_token_index=tokenizer.convert_tokens_to_ids("<image>"))
    images = CLIPImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16})
    processor = LlavaProcessor(image_processor=images, tokenizer=tokenizer, patch_size=8,
                               vision_feature_select_strategy="default", num_additional_image_tokens=1,
                               chat_template=TEMPLATE.replace("IMAGE", "<image>"))
    return config, processor


def _idefics3():
    from transformers import Idefics3Config, Idefics3ImageProcessor, Idefics3Processor

    tokenizer = _tokenizer("<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>")
    config = Idefics3Config(text_config={**TEXT, "vocab_size": len(tokenizer)},
                            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                               num_attention_heads=2, image_size=32, patch_size=8),
                            scale_factor=2, image_token_id=tokenizer.convert_tokens_to_ids("<image>"))
    images = Idefics3ImageProcessor(size={"longest_edge": 32}, max_image_size={"longest_edge": 32},
                                    do_image_splitting=False)
    processor = Idefics3Processor(image_processor=images, tokenizer=tokenizer, image_seq_len=4,
                                  chat_template=TEMPLATE.replace("IMAGE", "<image>"))
    return config, processor


def _mllama():
    from transformers import MllamaConfig, MllamaImageProcessor, MllamaProcessor

    tokenizer = _tokenizer("<|image|>")
    # Cross-attention in layer 1 of 2; its image tiles 28x28 in patches of 14 (4 tiles: the aspect ratios transformers
    # supports by default).
    text = {**TEXT, "model_type": "mllama_text_model", "vocab_size": len(tokenizer) + 8, "cross_attention_layers": [1],
            "rope_scaling": None}
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_global_layers=1, attention_heads=2,
                  image_size=28, patch_size=14, max_num_tiles=4, vision_output_dim=64, intermediate_layers_indices=[0])
    config = MllamaConfig(text_config=text, vision_config=vision,
                          image_token_index=tokenizer.convert_tokens_to_ids("<|image|>"))
    processor = MllamaProcessor(image_processor=MllamaImageProcessor(size={"height": 28, "width": 28}, max_image_tiles=4),
                                tokenizer=tokenizer, chat_template=TEMPLATE.replace("IMAGE", "<|image|>"))
    return config, processor


def _paligemma():
    from transformers import PaliGemmaConfig, PaliGemmaProcessor, SiglipImageProcessor

    images = SiglipImageProcessor(size={"height": 16, "width": 16})
    images.image_seq_length = 4  # (16 / 8) ** 2 patches: the processor expands each image into this many tokens
    processor = PaliGemmaProcessor(image_processor=images, tokenizer=_tokenizer("<image>"),
                                   chat_template=TEMPLATE.replace("IMAGE", "<image>"))
    tokenizer = processor.tokenizer  # with the location and segmentation tokens the processor adds
    config = PaliGemmaConfig(text_config={**TEXT, "model_type": "gemma", "vocab_size": len(tokenizer), "head_dim": 16},
                             vision_config=dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64,
                                                num_hidden_layers=2, num_attention_heads=2, image_size=16,
                                                patch_size=8, projection_dim=64),
                             image_token_index=tokenizer.convert_tokens_to_ids("<image>"), projection_dim=64)
    config.text_config.hidden_size = 64
    return config, processor


def _llava_next():
    from transformers import LlavaNextConfig, LlavaNextImageProcessor, LlavaNextProcessor

    tokenizer = _tokenizer("<image>")
    # One 16 px tile (pinpoint 16x16) in 8 px patches: 4 base tokens + 2x2 tile tokens + 2 row newlines = 10.
    config = LlavaNextConfig(text_config={**TEXT, "vocab_size": len(tokenizer)},
                             vision_config=dict(model_type="clip_vision_model", **{**VISION, "num_hidden_layers": 3},
                                                image_size=16, patch_size=8, projection_dim=32),
                             image_grid_pinpoints=[[16, 16]], image_token_index=tokenizer.convert_tokens_to_ids("<image>"))
    images = LlavaNextImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16},
                                     image_grid_pinpoints=[[16, 16]])
    processor = LlavaNextProcessor(image_processor=images, tokenizer=tokenizer, patch_size=8,
                                   vision_feature_select_strategy="default", num_additional_image_tokens=1,
                                   chat_template=TEMPLATE.replace("IMAGE", "<image>"))
    return config, processor


def _llava_onevision():
    from transformers import LlavaOnevisionConfig, LlavaOnevisionImageProcessor, LlavaOnevisionProcessor

    tokenizer = _tokenizer("<image>", "<video>")
    # SigLIP (no CLS token), 16 px in 8 px patches: 4 tokens per 16 px tile, one tile + the base image, newline.
    config = LlavaOnevisionConfig(text_config={**TEXT, "model_type": "qwen2", "vocab_size": len(tokenizer)},
                                  vision_config=dict(model_type="siglip_vision_model", **VISION, image_size=16,
                                                     patch_size=8),
                                  image_grid_pinpoints=[[16, 16]], vision_feature_layer=-1,
                                  vision_feature_select_strategy="full",
                                  image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
                                  video_token_index=tokenizer.convert_tokens_to_ids("<video>"))
    images = LlavaOnevisionImageProcessor(size={"height": 16, "width": 16}, image_grid_pinpoints=[[16, 16]])
    processor = _image_only(LlavaOnevisionProcessor)(
        image_processor=images, tokenizer=tokenizer, video_processor=None, num_image_tokens=4,
        vision_feature_select_strategy="full", chat_template=TEMPLATE.replace("IMAGE", "<image>"))
    return config, processor


def _qwen_tokenizer():
    return _tokenizer("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")


def _qwen_processor(cls, tokenizer):
    from transformers import Qwen2VLImageProcessor

    # 16 x 16 px (every image is resized into [min_pixels, max_pixels]) in 4 px patches merged 2 x 2: 4 tokens.
    images = Qwen2VLImageProcessor(min_pixels=16 * 16, max_pixels=16 * 16, patch_size=4, merge_size=2,
                                   temporal_patch_size=2)
    return _image_only(cls)(image_processor=images, tokenizer=tokenizer,
                           chat_template=TEMPLATE.replace("IMAGE", "<|vision_start|><|image_pad|><|vision_end|>"))


def _qwen_ids(tokenizer):
    t = tokenizer.convert_tokens_to_ids
    return dict(image_token_id=t("<|image_pad|>"), video_token_id=t("<|video_pad|>"),
                vision_start_token_id=t("<|vision_start|>"), vision_end_token_id=t("<|vision_end|>"))


def _qwen2_vl():
    from transformers import Qwen2VLConfig, Qwen2VLProcessor

    tokenizer = _qwen_tokenizer()
    text = {**TEXT, "vocab_size": len(tokenizer), "rope_scaling": {"type": "mrope", "mrope_section": [2, 2, 4]}}
    text.pop("model_type")
    config = Qwen2VLConfig(text_config=text, vision_config=dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2,
                                                                mlp_ratio=2, patch_size=4, spatial_merge_size=2,
                                                                temporal_patch_size=2, in_chans=3),
                           **_qwen_ids(tokenizer))
    return config, _qwen_processor(Qwen2VLProcessor, tokenizer)


def _qwen2_5_vl():
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLProcessor

    tokenizer = _qwen_tokenizer()
    text = {**TEXT, "vocab_size": len(tokenizer), "rope_scaling": {"type": "mrope", "mrope_section": [2, 2, 4]}}
    text.pop("model_type")
    # Window attention in 16 px windows (2 x 2 merged patches); block 1 attends globally.
    config = Qwen2_5_VLConfig(text_config=text,
                              vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                                                 out_hidden_size=64, patch_size=4, spatial_merge_size=2,
                                                 temporal_patch_size=2, in_channels=3, window_size=16,
                                                 fullatt_block_indexes=[1]),
                              **_qwen_ids(tokenizer))
    return config, _qwen_processor(Qwen2_5_VLProcessor, tokenizer)


def _gemma3():
    from transformers import AutoTokenizer, Gemma3Config, Gemma3ImageProcessor, Gemma3Processor

    # Gemma3Processor reads boi_token / eoi_token / image_token (and their ids) off the tokenizer: named special
    # tokens, saved in tokenizer_config.json's extra_special_tokens.
    tokenizer = AutoTokenizer.from_pretrained(ASSETS / "tiny-base", extra_special_tokens={
        "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"})
    t = tokenizer.convert_tokens_to_ids
    # SigLIP 32 px in 8 px patches (16), average-pooled to mm_tokens_per_image=4.
    config = Gemma3Config(text_config={**TEXT, "model_type": "gemma3_text", "vocab_size": len(tokenizer),
                                       "head_dim": 16, "sliding_window": 16},
                          vision_config=dict(model_type="siglip_vision_model", **VISION, image_size=32, patch_size=8),
                          mm_tokens_per_image=4, boi_token_index=t("<start_of_image>"),
                          eoi_token_index=t("<end_of_image>"), image_token_index=t("<image_soft_token>"))
    images = Gemma3ImageProcessor(size={"height": 32, "width": 32})
    processor = Gemma3Processor(image_processor=images, tokenizer=tokenizer, image_seq_length=4,
                                chat_template=TEMPLATE.replace("IMAGE", "<start_of_image>"))
    return config, processor


def _image_only(cls):
    from loraflow.setup.processor import image_only

    return image_only(cls)


BUILDERS = {"llava": _llava, "llava_next": _llava_next, "llava_onevision": _llava_onevision, "idefics3": _idefics3,
            "mllama": _mllama, "paligemma": _paligemma, "qwen2_vl": _qwen2_vl, "qwen2_5_vl": _qwen2_5_vl,
            "gemma3": _gemma3}
"""model_type -> its (config, processor) builder."""
FAMILIES = tuple(BUILDERS)


VIDEO_PROCESSORS = {"LlavaOnevisionProcessor": "LlavaOnevisionVideoProcessor",
                    "Qwen2VLProcessor": "Qwen2VLVideoProcessor", "Qwen2_5_VLProcessor": "Qwen2VLVideoProcessor"}
"""Processors with a video part (built here without it) -> the video processor their checkpoints name."""


def build_image_text(path: Path, family: str, seed: int = 0) -> Path:
    """A randomly initialised tiny `family` model and its processor, saved to `path`."""
    from transformers import AutoModelForImageTextToText

    config, processor = BUILDERS[family]()
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("_gate"):  # Mllama's cross-attention gates start at 0 (tanh 0: no image reaches the text)
                p.fill_(0.5)
            elif p.dim() >= 2 and not p.any():  # Gemma3's projection starts at zeros, cutting the vision side off
                p.normal_(0, 0.02)
    model.save_pretrained(path)
    processor.save_pretrained(path)
    video = VIDEO_PROCESSORS.get(type(processor).__name__)
    if video:  # as hub checkpoints ship it: AutoProcessor needs torchvision to build it, loraflow loads without it
        settings = {k: v for k, v in processor.image_processor.to_dict().items() if k != "image_processor_type"}
        (path / "video_preprocessor_config.json").write_text(
            json.dumps({**settings, "video_processor_type": video}, indent=1))
    return path


def colour_records(root: Path, n: int, seed: int, text_only_every: int = 0) -> list[dict]:
    """Image chat samples asking the colour of a square (PNG files under root/images), and, every
    `text_only_every`-th sample, a text-only one."""
    from PIL import Image

    rng = random.Random(seed)
    (root / "images").mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(n):
        if text_only_every and i % text_only_every == text_only_every - 1:
            word = "".join(rng.choice("abcdefg") for _ in range(4))
            out.append({"messages": [{"role": "user", "content": f"Say {word}."},
                                     {"role": "assistant", "content": word}]})
            continue
        name = rng.choice(sorted(COLOURS))
        image = Image.new("RGB", (20, 20), (255, 255, 255))
        image.paste(COLOURS[name], (rng.randint(0, 6), rng.randint(0, 6), rng.randint(12, 20), rng.randint(12, 20)))
        file = f"images/{seed}-{i}.png"
        image.save(root / file)
        out.append({"messages": [
            {"role": "user", "content": [{"type": "image", "path": file}, {"type": "text", "text": "Colour?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": name}]}]})
    return out


def write_colour_data(root: Path, n: int = 16, seed: int = 0, text_only_every: int = 0) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"colours-{seed}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in colour_records(root, n, seed, text_only_every)))
    return path


def _as_stage_record(record: dict, kind: str) -> dict:
    """A colour chat sample as a record of a stage's data kind (stagespec.StageSpec.data): the conversation, a
    preference pair (the right colour chosen over a wrong one), or a prompt with its answer."""
    if kind == "sft":
        return record
    user, answer = record["messages"]
    right = answer["content"] if isinstance(answer["content"], str) else answer["content"][0]["text"]
    if kind == "pairs":
        return {"prompt": [user], "chosen": right, "rejected": f"not {right}"}
    return {"prompt": [user], "answer": right}


def write_stage_data(root: Path, kind: str, n: int = 16) -> tuple[Path, Path]:
    """(train, eval) files of image records of a stage's data kind under root, every fourth one text-only (a
    micro-batch then mixes rows with and without images, as real image-text data does)."""
    root.mkdir(parents=True, exist_ok=True)
    out = []
    for split, seed in (("train", 0), ("eval", 1)):
        path = root / f"{kind}-{split}.jsonl"
        if not path.is_file():
            records = [_as_stage_record(r, kind) for r in colour_records(root, n, seed, text_only_every=4)]
            tmp = path.with_suffix(".part")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
            tmp.replace(path)
        out.append(path)
    return out[0], out[1]
