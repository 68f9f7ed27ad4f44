"""Image-text data: images read from paths, URLs and base64 and checked before any model loads; labels on assistant
tokens only and never on image tokens; truncation that would cut an image drops the sample; collate batches image
tensors as each family's forward expects, which a tiny LLaVA proves by training on a batch."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterable
from typing import Any

import pytest
import torch
from conftest import make_config, write_jsonl
from PIL import Image
from transformers import (
    AutoTokenizer,
    CLIPImageProcessor,
    LlavaProcessor,
    Qwen2VLImageProcessor,
    Qwen2VLProcessor,
)

from loraflow.data import load_sft, load_stage_data, read_records
from loraflow.data.batching import Row, collate
from loraflow.data.formatting import IGNORE
from loraflow.data.images import content_parts, image_payload, load_image
from loraflow.data.multimodal import (
    collate_images,
    image_token_ids,
    load_rows,
    tokenize_record,
    truncate_rows,
)
from loraflow.data.preference import collate_pairs, tokenize_pair
from loraflow.data.readers import Record
from loraflow.errors import DataError
from loraflow.locations import ASSETS

# Renders string content or a list of parts; an image part becomes IMAGE (the processor's placeholder).
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{% if m['content'] is string %}{{ m['content'] }}{% else %}"
            "{% for p in m['content'] %}{% if p['type'] == 'image' %}IMAGE{% else %}{{ p['text'] }}{% endif %}"
            "{% endfor %}{% endif %}<|end|>{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
SIDE, PATCH = 16, 8
TOKENS_PER_IMAGE = (SIDE // PATCH) ** 2


# The tests' own check of every image a data file names (moved out of the package: the product checks images as it
# reads rows, in data.multimodal); it counts them and raises the loader's DataError at the first bad one.
def iter_image_parts(messages: Any, record: Record, field: str) -> Iterable[tuple[str, Any]]:
    """(where, value) of each image part of a list of messages, in order."""
    if not isinstance(messages, list):
        return
    for i, m in enumerate(messages):
        if isinstance(m, dict) and isinstance(m.get("content"), list):
            for j, part in enumerate(content_parts(m["content"], record, f"{field}[{i}].content")):
                if part["type"] == "image":
                    yield f"{field}[{i}].content[{j}]", image_payload(part)[1]


def check_images(records: Iterable[Record]) -> int:
    """Open every image the records name (chat `messages`, and a pair's `prompt`, `chosen` and `rejected`); raise
    a DataError at the first that is missing or unreadable. Returns the number of images checked."""
    count = 0
    for record in records:
        for field in ("messages", "prompt", "chosen", "rejected"):
            for where, value in iter_image_parts(record.data.get(field), record, field):
                load_image(value, record, where)
                count += 1
    return count


def _tokenizer(*special: str):
    tokenizer = AutoTokenizer.from_pretrained(ASSETS / "tiny-base")
    tokenizer.add_special_tokens({"additional_special_tokens": list(special)})
    return tokenizer


@pytest.fixture(scope="module")
def llava():
    """A LLaVA processor: CLIP image processor (16 px), patch 8, the `default` strategy (CLS dropped): 4 tokens per
    image."""
    images = CLIPImageProcessor(size={"shortest_edge": SIDE}, crop_size={"height": SIDE, "width": SIDE})
    return LlavaProcessor(image_processor=images, tokenizer=_tokenizer("<image>"), patch_size=PATCH,
                          vision_feature_select_strategy="default", num_additional_image_tokens=1,
                          chat_template=TEMPLATE.replace("IMAGE", "<image>"))


class ImageOnlyQwen2VLProcessor(Qwen2VLProcessor):
    """Qwen2-VL's processor without its video processor, which needs torchvision (not installed here)."""

    @classmethod
    def get_attributes(cls):
        return ["image_processor", "tokenizer"]

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        self.video_processor = None
        super().__init__(image_processor, tokenizer, None, chat_template=chat_template)


@pytest.fixture(scope="module")
def qwen():
    images = Qwen2VLImageProcessor(min_pixels=28 * 28, max_pixels=56 * 56, patch_size=14, merge_size=2,
                                   temporal_patch_size=2)
    tokenizer = _tokenizer("<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>")
    template = TEMPLATE.replace("IMAGE", "<|vision_start|><|image_pad|><|vision_end|>")
    return ImageOnlyQwen2VLProcessor(image_processor=images, tokenizer=tokenizer, chat_template=template)


def png(path, color=(255, 0, 0), size=(20, 30)):
    Image.new("RGB", size, color).save(path)
    return path


def png_bytes(color=(0, 0, 255)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (24, 24), color).save(buffer, format="PNG")
    return buffer.getvalue()


def chat(*user_parts, answer="ok"):
    return {"messages": [{"role": "user", "content": list(user_parts)}, {"role": "assistant", "content": answer}]}


def learned_text(row: Row, processor) -> str:
    return processor.tokenizer.decode([t for t in row.labels if t != IGNORE])


def test_labels_only_on_assistant_tokens_never_on_image_tokens(tmp_path, llava):
    png(tmp_path / "a.png")
    record = Record({"messages": [
        {"role": "user", "content": [{"type": "image", "path": "a.png"}, {"type": "text", "text": "hi"},
                                     {"type": "image", "path": "a.png"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "see"}, {"type": "image", "path": "a.png"},
                                          {"type": "text", "text": "yes"}]}]}, "mem line 1", str(tmp_path))
    row = tokenize_record(record, "auto", llava)
    image_id = llava.tokenizer.convert_tokens_to_ids("<image>")
    at_images = [k for k, t in enumerate(row.input_ids) if t == image_id]
    assert len(at_images) == 3 * TOKENS_PER_IMAGE  # each placeholder expanded by the processor
    assert all(row.labels[k] == IGNORE for k in at_images)  # including the image inside the assistant's turn
    assert learned_text(row, llava) == "seeyes<|end|>"
    assert row.images["pixel_values"].shape == (3, 3, SIDE, SIDE)
    assert row.images_end == at_images[-1] + 1


def test_image_references_resolve_paths_urls_and_base64(tmp_path, llava):
    (tmp_path / "imgs").mkdir()
    png(tmp_path / "imgs" / "red.png")
    raw = png_bytes()
    records = [
        chat({"type": "image", "path": "imgs/red.png"}, {"type": "text", "text": "relative"}),
        chat({"type": "image", "url": (tmp_path / "imgs" / "red.png").as_uri()}, {"type": "text", "text": "file"}),
        chat({"type": "image", "image": "data:image/png;base64," + base64.b64encode(raw).decode()},
             {"type": "image", "image": base64.b64encode(raw).decode()}, {"type": "text", "text": "b64"}),
        {"messages": [{"role": "user", "content": "text only"}, {"role": "assistant", "content": "fine"}]},
    ]
    write_jsonl(tmp_path / "d.jsonl", records)
    read = read_records(str(tmp_path / "d.jsonl"), "data.train", "train")
    assert check_images(read) == 4
    rows = [tokenize_record(r, "auto", llava) for r in read]
    assert [r.images["pixel_values"].shape[0] if r.images else 0 for r in rows] == [1, 1, 2, 0]
    # A record rebuilt without base_dir (format conversion) still resolves against its file's directory.
    rebuilt = Record(read[0].data, read[0].origin)
    assert torch.equal(tokenize_record(rebuilt, "auto", llava).images["pixel_values"], rows[0].images["pixel_values"])
    # Red and blue images give different pixels: the payload was decoded, not a placeholder.
    assert not torch.equal(rows[0].images["pixel_values"][0], rows[2].images["pixel_values"][0])


def test_missing_and_corrupt_images_name_file_line_and_part(tmp_path, llava):
    (tmp_path / "broken.png").write_bytes(png_bytes()[:40])  # a PNG cut short: the header parses, pixels do not
    (tmp_path / "junk.png").write_bytes(b"not an image at all")
    png(tmp_path / "ok.png")
    for name, bad in (("missing", "nope.png"), ("truncated", "broken.png"), ("junk", "junk.png")):
        path = write_jsonl(tmp_path / f"{name}.jsonl", [
            chat({"type": "image", "path": "ok.png"}, {"type": "text", "text": "fine"}),
            chat({"type": "text", "text": "look"}, {"type": "image", "path": bad})])
        read = read_records(str(path), "data.train", "train")
        with pytest.raises(DataError, match=rf"{name}.jsonl line 2: `messages\[0\].content\[1\]` names image "
                                            rf"{bad}.*Fix:") as info:
            check_images(read)
        with pytest.raises(DataError, match=rf"{name}.jsonl line 2: `messages\[0\].content\[1\]`"):
            load_rows(read, llava, 256, "data.train")
        assert ("cannot be read: no such file" if name == "missing" else "cannot be decoded") in str(info.value)


def test_bad_parts_are_named(tmp_path, llava):
    cases = [({"type": "video", "path": "v.mp4"}, r"content\[0\]` has type 'video'"),
             ({"type": "image"}, r"content\[0\]` is an image part without an image"),
             ({"type": "text"}, r"content\[0\]` is a text part without a string `text`")]
    for part, message in cases:
        with pytest.raises(DataError, match=rf"x line 3: `messages\[0\]\.{message}"):
            tokenize_record(Record(chat(part), "x line 3"), "auto", llava)


def test_an_image_the_template_does_not_render_is_refused(tmp_path, llava):
    png(tmp_path / "a.png")
    user_images_only = TEMPLATE.replace("{% if p['type'] == 'image' %}IMAGE",
                                        "{% if p['type'] == 'image' %}{% if m['role'] == 'user' %}<image>{% endif %}")
    processor = LlavaProcessor(image_processor=llava.image_processor, tokenizer=llava.tokenizer, patch_size=PATCH,
                               vision_feature_select_strategy="default", num_additional_image_tokens=1,
                               chat_template=user_images_only)
    record = Record({"messages": [{"role": "user", "content": "draw"}, {"role": "assistant", "content": [
        {"type": "text", "text": "here"}, {"type": "image", "path": "a.png"}]}]}, "d line 4", str(tmp_path))
    with pytest.raises(DataError, match=r"d line 4: .*Image parts: messages\[1\].content\[1\] \(assistant\)\. "
                                        r"The chat template must render one placeholder per image part"):
        tokenize_record(record, "auto", processor)


def test_truncation_drops_samples_whose_images_it_would_cut(tmp_path, llava):
    png(tmp_path / "a.png")
    early = Record(chat({"type": "image", "path": "a.png"}, {"type": "text", "text": "q"}, answer="a long answer"),
                   "d line 1", str(tmp_path))
    late = Record(chat({"type": "text", "text": "a long question first"}, {"type": "image", "path": "a.png"}),
                  "d line 2", str(tmp_path))
    rows = [(tokenize_record(r, "auto", llava), r.origin) for r in (early, late)]
    limit = rows[0][0].images_end + 4  # keeps the first image whole and some of its answer
    assert rows[1][0].images_end > limit
    kept, stats = truncate_rows(rows, limit)
    assert len(kept) == 1 and stats.truncated == 1 and len(kept[0].input_ids) == limit
    assert kept[0].images["pixel_values"].shape[0] == 1
    assert stats.image_cut == 1 and stats.image_cut_origins == ["d line 2"]
    assert "cut through their image tokens (first: d line 2); raise data.max_length" in stats.describe("train", limit)


def test_collate_mixes_text_only_rows_and_batches_images(tmp_path, llava):
    png(tmp_path / "a.png")
    two = Record(chat({"type": "image", "path": "a.png"}, {"type": "image", "path": "a.png"}), "l1", str(tmp_path))
    text = Record({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}, "l2")
    one = Record(chat({"type": "image", "path": "a.png"}), "l3", str(tmp_path))
    rows = [tokenize_record(r, "auto", llava) for r in (two, text, one)]
    batch = collate(rows, llava.tokenizer.pad_token_id)
    assert batch["pixel_values"].shape == (3, 3, SIDE, SIDE)
    image_id = llava.tokenizer.convert_tokens_to_ids("<image>")
    assert int((batch["input_ids"] == image_id).sum()) == 3 * TOKENS_PER_IMAGE
    assert set(collate([rows[1]], 0)) == {"input_ids", "labels", "attention_mask"}  # no image keys at all


def test_qwen2_vl_patches_grid_and_token_types(tmp_path, qwen):
    png(tmp_path / "a.png", size=(20, 30))
    png(tmp_path / "b.png", size=(60, 40))
    rows = [tokenize_record(Record(chat(*parts), f"l{i}", str(tmp_path)), "auto", qwen) for i, parts in enumerate([
        ({"type": "image", "path": "a.png"}, {"type": "text", "text": "hi"}, {"type": "image", "path": "b.png"}),
        ({"type": "text", "text": "no image"},), ({"type": "image", "path": "b.png"},)])]
    assert rows[0].images["image_grid_thw"].tolist() == [[1, 2, 2], [1, 2, 4]]
    pad_id = qwen.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert {pad_id, qwen.tokenizer.convert_tokens_to_ids("<|vision_start|>")} <= image_token_ids(qwen)
    assert all(label == IGNORE for t, label in zip(rows[0].input_ids, rows[0].labels) if t == pad_id)
    batch = collate(rows, qwen.tokenizer.pad_token_id)
    patches = sum(int(r.images["pixel_values"].shape[0]) for r in rows if r.images)
    assert batch["pixel_values"].shape[0] == patches
    assert batch["image_grid_thw"].tolist() == [[1, 2, 2], [1, 2, 4], [1, 2, 4]]
    # Qwen2-VL merges 2x2 patches into one token: the grids account for every image token of the batch.
    assert int((batch["input_ids"] == pad_id).sum()) == int(batch["image_grid_thw"].prod(-1).sum()) // 4
    assert batch["mm_token_type_ids"].shape == batch["input_ids"].shape
    assert torch.equal(batch["mm_token_type_ids"].bool(), batch["input_ids"] == pad_id)


def test_per_row_layouts_are_padded_along_the_image_dim():
    # Idefics3 gives each row [1, n_images, C, H, W] and a pixel_attention_mask [1, n_images, H, W].
    a = Row([1, 2], [1, 2], images={"pixel_values": torch.ones(1, 2, 3, 4, 4),
                                    "pixel_attention_mask": torch.ones(1, 2, 4, 4, dtype=torch.bool)})
    b = Row([1], [1], images={"pixel_values": torch.full((1, 1, 3, 4, 4), 2.0),
                              "pixel_attention_mask": torch.ones(1, 1, 4, 4, dtype=torch.bool)})
    batch = collate_images([a, Row([5], [5]), b], 2)
    assert batch["pixel_values"].shape == (2, 2, 3, 4, 4)
    assert batch["pixel_values"][1, 1].abs().sum() == 0  # padding is an all-zero image, which Idefics3 drops
    assert batch["pixel_attention_mask"].shape == (2, 2, 4, 4) and not batch["pixel_attention_mask"][1, 1].any()


def test_dpo_pair_carries_the_prompt_images_on_both_sides(tmp_path, llava):
    png(tmp_path / "a.png")
    prompt = [{"role": "user", "content": [{"type": "image", "path": "a.png"}, {"type": "text", "text": "colour?"}]}]
    missing = [{"role": "user", "content": [{"type": "image", "path": "gone.png"}]}]
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": prompt, "chosen": "red", "rejected": "blue"},
                                              {"prompt": missing, "chosen": "red", "rejected": "blue"}])
    # Format conversion rebuilds records without base_dir: the image still resolves against p.jsonl's directory.
    record, bad = (Record(r.data, r.origin) for r in read_records(str(path), "data.train", "train"))
    pair = tokenize_pair(record, llava.tokenizer, processor=llava)
    assert learned_text(pair.chosen, llava) == "red<|end|>" and learned_text(pair.rejected, llava) == "blue<|end|>"
    batch = collate_pairs([pair], llava.tokenizer.pad_token_id, pack_to=512)  # packing is skipped for images
    assert "segments" not in batch and batch["input_ids"].shape[0] == 2
    assert batch["pixel_values"].shape == (2, 3, SIDE, SIDE)
    with pytest.raises(DataError, match=r"p.jsonl line 2: `prompt\[0\].content\[0\]` names image gone.png"):
        tokenize_pair(bad, llava.tokenizer, processor=llava)


def test_splits_and_eval_prompts_keep_images(tmp_path, tiny_model, llava):
    png(tmp_path / "a.png")
    rows = [chat({"type": "image", "path": "a.png"}, {"type": "text", "text": f"q{i}"}, answer=f"a{i}")
            for i in range(3)] + [{"messages": [{"role": "user", "content": "t"}, {"role": "assistant",
                                                                                  "content": "u"}]}]
    write_jsonl(tmp_path / "train.jsonl", rows)
    write_jsonl(tmp_path / "eval.jsonl", rows[:2])
    config = make_config(tiny_model, f"data.train={tmp_path / 'train.jsonl'}",
                         f"data.eval={tmp_path / 'eval.jsonl'}", "data.packing=true", "eval.generate=true")
    train, held_out = load_stage_data(config, llava.tokenizer, llava)
    assert len(train.rows) == 4 and sum(1 for r in train.rows if r.images) == 3  # not packed
    assert [p.reference for p in held_out.prompts] == ["a0", "a1"]
    assert held_out.prompts[0].images["pixel_values"].shape == (1, 3, SIDE, SIDE)
    assert llava.tokenizer.decode(held_out.prompts[0].prompt_ids).endswith("q0<|end|><|assistant|>")
    assert load_sft(config, llava.tokenizer, llava)[0].stats.samples == 4


def test_tiny_llava_trains_on_a_collated_batch(tmp_path, llava):
    from transformers import (
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
    )

    png(tmp_path / "a.png")
    png(tmp_path / "b.png", color=(0, 200, 0))
    records = [Record(chat({"type": "image", "path": "a.png"}, {"type": "image", "path": "b.png"}), "l1",
                      str(tmp_path)),
               Record({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}, "l2"),
               Record(chat({"type": "text", "text": "what"}, {"type": "image", "path": "b.png"}), "l3",
                      str(tmp_path))]
    batch = collate([tokenize_record(r, "auto", llava) for r in records], llava.tokenizer.pad_token_id)
    torch.manual_seed(0)
    config = LlavaConfig(
        vision_config=CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                       num_attention_heads=2, image_size=SIDE, patch_size=PATCH),
        text_config=LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, pad_token_id=0),
        image_token_id=llava.tokenizer.convert_tokens_to_ids("<image>"), vision_feature_select_strategy="default",
        vision_feature_layer=-1)
    model = LlavaForConditionalGeneration(config)
    loss = model(**batch).loss
    loss.backward()
    assert torch.isfinite(loss)
    projector = model.model.multi_modal_projector.linear_1.weight.grad
    assert projector is not None and projector.abs().sum() > 0  # the images reached the loss


def test_tiny_qwen2_vl_trains_on_a_collated_batch(tmp_path, qwen):
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    png(tmp_path / "a.png", size=(20, 30))
    png(tmp_path / "b.png", color=(0, 200, 0), size=(60, 40))
    records = [Record(chat({"type": "image", "path": "a.png"}, {"type": "text", "text": "hi"},
                           {"type": "image", "path": "b.png"}), "l1", str(tmp_path)),
               Record({"messages": [{"role": "user", "content": "t"}, {"role": "assistant", "content": "u"}]}, "l2"),
               Record(chat({"type": "image", "path": "b.png"}), "l3", str(tmp_path))]
    batch = collate([tokenize_record(r, "auto", qwen) for r in records], qwen.tokenizer.pad_token_id)
    token = qwen.tokenizer.convert_tokens_to_ids
    config = Qwen2VLConfig(
        text_config={"vocab_size": 96, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "pad_token_id": 0,
                     "rope_parameters": {"rope_type": "default", "mrope_section": [4, 2, 2], "rope_theta": 1e4}},
        vision_config={"depth": 1, "embed_dim": 32, "hidden_size": 64, "num_heads": 2, "patch_size": 14,
                       "spatial_merge_size": 2, "temporal_patch_size": 2},
        image_token_id=token("<|image_pad|>"), video_token_id=token("<|video_pad|>"),
        vision_start_token_id=token("<|vision_start|>"), vision_end_token_id=token("<|vision_end|>"))
    torch.manual_seed(0)
    model = Qwen2VLForConditionalGeneration(config)
    loss = model(**batch).loss
    loss.backward()
    assert torch.isfinite(loss)
    merger = model.model.visual.merger.mlp[0].weight.grad
    assert merger is not None and merger.abs().sum() > 0  # every image's patches reached the loss


def test_a_text_only_sample_encodes_with_a_processor_that_demands_images():
    """PaliGemma's processor raises for text without images; a text-only row (mixed into image data, or a pair's
    text-only prompt) is encoded by its tokenizer, with labels on the answer. It was refused with advice about
    image placeholders that did not apply."""
    from loraflow.verify.sweep_vision import BUILDERS

    _, processor = BUILDERS["paligemma"]()
    record = Record({"messages": [{"role": "user", "content": "Say abc."},
                                  {"role": "assistant", "content": "abc"}]}, "data.jsonl line 3")
    row = tokenize_record(record, "auto", processor)
    assert learned_text(row, processor) == "abc<|end|>"
    assert not row.images
