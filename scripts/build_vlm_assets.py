"""Build the embedded vision-language demo: a tiny pretrained LLaVA (tiny-vlm) and a synthetic visual chat task
(shapes).

    python scripts/build_vlm_assets.py                      # the shipped assets (a few minutes on 2 CPU cores)
    python scripts/build_vlm_assets.py --check              # fine-tune the shipped assets, print before/after
    python scripts/build_vlm_assets.py --quick --out /tmp/x # a smoke run of build + check (seconds)

tiny-vlm is a `LlavaForConditionalGeneration`: a tiny CLIP vision tower (32x32 images, 8x8 patches, 16 image
tokens per image), LLaVA's two-layer projector, and the bundled tiny-base Llama as its language model (its
tokenizer gains one special token, `<image>`). The vision tower and projector are pretrained from scratch, with
the language model lightly tuned, on plain-text captions of generated images ("<image>a picture of two red
circles."). The model has never seen an image in a chat turn. The demo task asks, in chat form, for the colour,
the shape or the number of the objects in an image; the base model answers none (it keeps captioning), and a
LoRA adapter on the language model, with the vision tower and projector trained in full, learns it in about a
minute on 2 CPU cores. The held-out set has new images, half of them of colour/shape pairs that the SFT training
data never shows (the captions describe every pair: as tiny-base knows a word's reversal from prose only, the model
has seen those objects described, never asked about).

Everything is seeded; on the same torch version and thread count (BUILD.json records both) the weights are
bit-identical, and BUILD.json records their sha256.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
ASSETS = ROOT / "src" / "loraflow" / "assets"
IMAGE_TOKEN = "<image>"
IMAGE_SIZE, PATCH = 32, 8
COLOURS = {"red": (215, 40, 40), "green": (40, 160, 60), "blue": (45, 75, 215), "yellow": (225, 195, 30)}
SHAPES = ["square", "circle", "triangle"]
COUNTS = ["one", "two", "three"]
# Colour/shape pairs the SFT training data never shows (the captions do): half the held-out set is drawn from them,
# so the metric shows the model answers questions about combinations it was never asked about. (Kept out of the
# captions too, the vision tower tied shape to colour and named these pairs' shapes at about chance.)
HELD_OUT = {("green", "triangle"), ("yellow", "circle"), ("blue", "square")}
QUESTIONS = {
    "colour": ["What colour is the shape?", "What colour are the shapes?", "Which colour do you see?"],
    "shape": ["What shape is it?", "What shape are they?", "Which shape do you see?"],
    "count": ["How many shapes are there?", "How many objects do you see?", "Count the shapes."],
}
# The tiny-base template, with content as a string or as a list of parts (transformers' multimodal convention):
# an image part renders as the image token, which the processor expands to one token per image feature.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'image' %}<image>{% elif p['type'] == 'text' %}{{ p['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}")


# ---------------------------------------------------------------------------------------------------- images
def draw(rng: random.Random, colour: str, shape: str, count: int):
    """A 32x32 picture of `count` non-overlapping shapes of one colour and kind, on a slightly tinted background."""
    from PIL import Image, ImageDraw

    bg = tuple(rng.randint(225, 255) for _ in range(3))
    img = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), bg)
    pen = ImageDraw.Draw(img)
    base = COLOURS[colour]
    boxes: list[tuple[int, int, int]] = []
    tries = 0
    while len(boxes) < count:
        tries += 1
        if tries % 50 == 0:
            boxes = []  # the first boxes left no room for the rest: start the layout again
        s = rng.randint(9, 13)
        x, y = rng.randint(1, IMAGE_SIZE - s - 1), rng.randint(1, IMAGE_SIZE - s - 1)
        if any(x < bx + bs + 1 and bx < x + s + 1 and y < by + bs + 1 and by < y + s + 1 for bx, by, bs in boxes):
            continue  # overlapping shapes would make the count ambiguous
        boxes.append((x, y, s))
    for x, y, s in boxes:
        fill = tuple(min(255, max(0, c + rng.randint(-20, 20))) for c in base)
        if shape == "square":
            pen.rectangle([x, y, x + s - 1, y + s - 1], fill=fill)
        elif shape == "circle":
            pen.ellipse([x, y, x + s - 1, y + s - 1], fill=fill)
        else:
            pen.polygon([(x + (s - 1) / 2, y), (x, y + s - 1), (x + s - 1, y + s - 1)], fill=fill)
    return img


def sample_scene(rng: random.Random, held_out: bool | None) -> tuple[str, str, int]:
    """A (colour, shape, count); held_out=True draws only HELD_OUT pairs, False never, None either."""
    while True:
        colour, shape, count = rng.choice(list(COLOURS)), rng.choice(SHAPES), rng.randint(1, 3)
        if held_out is None or ((colour, shape) in HELD_OUT) == held_out:
            return colour, shape, count


def caption(rng: random.Random, colour: str, shape: str, count: int) -> str:
    noun = shape + ("s" if count > 1 else "")
    lead = rng.choice(["a picture of", "this image shows", "here we see", "an image of"])
    return f"{lead} {COUNTS[count - 1]} {colour} {noun}."


# ---------------------------------------------------------------------------------------------------- model
def build_model(base: Path, vision: dict):
    """tiny-base's Llama with one more token (<image>), a fresh CLIP vision tower and LLaVA projector."""
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        CLIPVisionConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
    )

    tok = AutoTokenizer.from_pretrained(base)
    tok.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    tok.chat_template = CHAT_TEMPLATE
    image_id = tok.convert_tokens_to_ids(IMAGE_TOKEN)
    lm = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    text_cfg = lm.config
    text_cfg.vocab_size = len(tok)
    text_cfg._name_or_path = ""  # not the builder's absolute path in the shipped config
    vis_cfg = CLIPVisionConfig(image_size=IMAGE_SIZE, patch_size=PATCH, num_channels=3, **vision)
    cfg = LlavaConfig(vision_config=vis_cfg, text_config=text_cfg, image_token_index=image_id,
                      image_seq_length=(IMAGE_SIZE // PATCH) ** 2, vision_feature_select_strategy="default",
                      vision_feature_layer=-1, projector_hidden_act="gelu", tie_word_embeddings=False)
    model = LlavaForConditionalGeneration(cfg)
    with torch.no_grad():
        emb, head = lm.get_input_embeddings().weight, lm.get_output_embeddings().weight
        # The <image> row is never read (image features replace it) nor predicted; the mean keeps it harmless.
        model.get_input_embeddings().weight.copy_(torch.cat([emb, emb.mean(0, keepdim=True)]))
        model.lm_head.weight.copy_(torch.cat([head, head.mean(0, keepdim=True)]))
        missing = model.model.language_model.load_state_dict(
            {k.removeprefix("model."): v for k, v in lm.state_dict().items()
             if k.startswith("model.") and "embed_tokens" not in k}, strict=False)
        assert missing.missing_keys == ["embed_tokens.weight"] and not missing.unexpected_keys, missing
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.bos_token_id = tok.bos_token_id
    return tok, model


def build_processor(tok):
    from transformers import CLIPImageProcessor, LlavaProcessor

    # Resolves to CLIPImageProcessorPil without torchvision; images are already 32x32, so resize/crop are no-ops.
    images = CLIPImageProcessor(size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE,
                                "width": IMAGE_SIZE})
    # CLIP prepends a CLS token (+1) and the "default" strategy drops it (-1): 16 image tokens per image,
    # matching the model's vision_feature_select_strategy.
    return LlavaProcessor(image_processor=images, tokenizer=tok, patch_size=PATCH,
                          vision_feature_select_strategy="default", num_additional_image_tokens=1,
                          chat_template=CHAT_TEMPLATE, image_token=IMAGE_TOKEN)


def caption_batches(processor, rng: random.Random, n: int):
    """Plain-text captioning rows: <image x16>caption<|end|> (no BOS: tiny-base never saw one); loss on the
    caption only."""
    tok = processor.tokenizer
    texts, images = [], []
    for _ in range(n):
        scene = sample_scene(rng, held_out=None)
        images.append(draw(rng, *scene))
        texts.append(f"{IMAGE_TOKEN}{caption(rng, *scene)}{tok.eos_token}")
    enc = processor(text=texts, images=images, return_tensors="pt", padding=True)
    labels = enc["input_ids"].clone()
    labels[enc["attention_mask"] == 0] = -100
    labels[labels == processor.image_token_id] = -100
    return enc, labels


def pretrain(model, processor, steps: int, batch: int, seed: int, lr: float, lm_lr: float):
    torch.manual_seed(seed)
    rng = random.Random(seed + 1)
    lm_params = list(model.model.language_model.parameters()) + list(model.lm_head.parameters())
    lm_ids = {id(p) for p in lm_params}
    vis_params = [p for p in model.parameters() if id(p) not in lm_ids]
    opt = torch.optim.AdamW([{"params": vis_params, "lr": lr, "peak": lr},
                             {"params": lm_params, "lr": lm_lr, "peak": lm_lr}], weight_decay=0.01,
                            betas=(0.9, 0.95))
    start, warmup = time.time(), min(50, steps // 10 + 1)
    model.train()
    loss = torch.tensor(0.0)
    for step in range(steps):
        scale = min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * step / steps))
        for group in opt.param_groups:
            group["lr"] = group["peak"] * scale
        enc, labels = caption_batches(processor, rng, batch)
        loss = model(**enc, labels=labels, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        if step % 100 == 0 or step == steps - 1:
            print(f"pretrain step {step:5d}  loss {loss.item():.4f}  {time.time() - start:6.0f}s", flush=True)
    return float(loss.item()), time.time() - start


@torch.no_grad()
def caption_accuracy(model, processor, n: int, seed: int) -> float:
    """The base model's skill in its own (captioning) format, on new images."""
    rng, tok, right = random.Random(seed), processor.tokenizer, 0
    model.eval()
    for _ in range(n):
        scene = sample_scene(rng, held_out=None)
        lead = "a picture of"
        enc = processor(text=[f"{IMAGE_TOKEN}{lead} "], images=[draw(rng, *scene)],
                        return_tensors="pt")
        out = model.generate(**enc, max_new_tokens=24, do_sample=False)
        text = tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        right += f"{lead} {text}".split(".")[0] + "." == f"{lead} {caption_text(*scene)}"
    return right / n


def caption_text(colour: str, shape: str, count: int) -> str:
    return f"{COUNTS[count - 1]} {colour} {shape}{'s' if count > 1 else ''}."


# ---------------------------------------------------------------------------------------------------- task
def chat_record(image_rel: str, question: str, answer: str) -> dict:
    return {"messages": [
        {"role": "user", "content": [{"type": "image", "path": image_rel}, {"type": "text", "text": question}]},
        {"role": "assistant", "content": [{"type": "text", "text": answer}]}]}


def text_only_record(rng: random.Random) -> dict:
    """A chat turn of a word game tiny-base already plays (content as a plain string): mixed into the training
    data so a data pipeline meets samples without images."""
    word = "".join(rng.choice("bcdfghklmnprstvz") + rng.choice("aeiou") for _ in range(rng.randint(2, 3)))
    return {"messages": [{"role": "user", "content": f"Please write the word {word} in capital letters."},
                         {"role": "assistant", "content": word.upper()}]}


def build_shapes(out: Path, n_train: int, n_eval: int, seed: int) -> dict:
    rng = random.Random(seed)
    (out / "images").mkdir(parents=True, exist_ok=True)
    for old in (out / "images").glob("*.png"):
        old.unlink()

    def make(split: str, i: int, held_out: bool | None) -> dict:
        colour, shape, count = sample_scene(rng, held_out)
        rel = f"images/{split}-{i:05d}.png"
        draw(rng, colour, shape, count).save(out / rel, optimize=True)
        kind = rng.choice(list(QUESTIONS))
        answer = {"colour": colour, "shape": shape, "count": COUNTS[count - 1]}[kind]
        return chat_record(rel, rng.choice(QUESTIONS[kind]), answer)

    train: list[dict] = []
    for i in range(n_train):
        train.append(text_only_record(rng) if rng.random() < 0.05 else make("train", i, held_out=False))
    evals = [make("eval", i, held_out=i % 2 == 0) for i in range(n_eval)]
    for name, rows in (("train.jsonl", train), ("eval.jsonl", evals)):
        (out / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"train": len(train), "eval": len(evals), "text_only_train": sum(isinstance(
        r["messages"][0]["content"], str) for r in train)}


# ---------------------------------------------------------------------------------------------------- check
def encode_chat(processor, record: dict, root: Path) -> dict:
    """input_ids, labels (assistant tokens only), pixel_values (or None), the prompt length and the answer."""
    from PIL import Image

    msgs = record["messages"]
    images = [Image.open(root / p["path"]).convert("RGB") for m in msgs if not isinstance(m["content"], str)
              for p in m["content"] if p["type"] == "image"]
    prompt = processor.apply_chat_template(msgs[:-1], add_generation_prompt=True, tokenize=False)
    full = processor.apply_chat_template(msgs, tokenize=False)
    assert full.startswith(prompt), (prompt, full)
    kw = {"images": images} if images else {}
    p_ids = processor(text=[prompt], return_tensors="pt", **kw)
    f_ids = processor(text=[full], return_tensors="pt", **kw)["input_ids"][0]
    n_prompt = p_ids["input_ids"].shape[1]
    labels = f_ids.clone()
    labels[:n_prompt] = -100
    answer = msgs[-1]["content"]
    answer = answer if isinstance(answer, str) else "".join(p["text"] for p in answer if p["type"] == "text")
    return {"input_ids": f_ids, "labels": labels, "prompt_ids": p_ids["input_ids"][0],
            "pixel_values": p_ids.get("pixel_values"), "answer": answer}


def collate(rows: list[dict], pad: int, key: str = "input_ids", left: bool = False) -> dict:
    width = max(len(r[key]) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(r[key])
        sl = slice(width - n, width) if left else slice(0, n)
        ids[i, sl], mask[i, sl] = r[key], 1
        if key == "input_ids":
            labels[i, sl] = r["labels"]
    batch = {"input_ids": ids, "attention_mask": mask}
    pix = [r["pixel_values"] for r in rows if r["pixel_values"] is not None]
    if pix:
        batch["pixel_values"] = torch.cat(pix)
    if key == "input_ids":
        batch["labels"] = labels
    return batch


@torch.no_grad()
def exact_match(model, processor, rows: list[dict], batch: int = 50) -> tuple[float, list, dict]:
    """Greedy exact match (the decoded answer, special tokens skipped, stripped), overall and per question kind."""
    tok, right, examples = processor.tokenizer, 0, []
    by_kind: dict[str, list[int]] = {}
    model.eval()
    for s in range(0, len(rows), batch):
        chunk = rows[s: s + batch]
        enc = collate(chunk, tok.pad_token_id, key="prompt_ids", left=True)
        out = model.generate(**enc, max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id,
                             eos_token_id=tok.eos_token_id)
        for r, o in zip(chunk, out[:, enc["input_ids"].shape[1]:]):
            text = tok.decode(o, skip_special_tokens=True).strip()
            right += text == r["answer"].strip()
            kind = "colour" if r["answer"] in COLOURS else "shape" if r["answer"] in SHAPES else "count"
            by_kind.setdefault(kind, [0, 0])[0] += text == r["answer"].strip()
            by_kind[kind][1] += 1
            if len(examples) < 4:
                examples.append((r["answer"], text))
    model.train()
    return right / len(rows), examples, {k: f"{a}/{b}" for k, (a, b) in sorted(by_kind.items())}


def check(vlm: Path, shapes: Path, steps: int, batch: int, lr: float, seed: int) -> dict:
    """The demo in plain PyTorch + peft: LoRA (rank 16, all-linear) on the language model, vision tower and
    projector trained in full, AdamW, fp32; greedy exact match on eval.jsonl before and after."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText, AutoProcessor

    torch.manual_seed(seed)
    processor = AutoProcessor.from_pretrained(vlm)
    model = AutoModelForImageTextToText.from_pretrained(vlm, dtype=torch.float32)
    load = lambda name: [encode_chat(processor, json.loads(line), shapes)
                         for line in (shapes / name).read_text().splitlines()]
    train, evals = load("train.jsonl"), load("eval.jsonl")
    held = [r for i, r in enumerate(evals) if i % 2 == 0]
    before, ex_before, kinds_before = exact_match(model, processor, evals)
    print(f"before: exact match {before:.3f} {kinds_before}  e.g. {ex_before}", flush=True)
    cfg = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                     target_modules=r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)")
    model = get_peft_model(model, cfg)
    for name, p in model.named_parameters():
        if "vision_tower" in name or "multi_modal_projector" in name:
            p.requires_grad_(True)
    params = [p for p in model.parameters() if p.requires_grad]
    print(f"trainable parameters: {sum(p.numel() for p in params)}", flush=True)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    rng, start, warmup = random.Random(seed), time.time(), max(1, steps // 20)
    model.train()
    order: list[int] = []
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * step / steps))
        if len(order) < batch:
            order += rng.sample(range(len(train)), len(train))
        idx, order = order[:batch], order[batch:]
        enc = collate([train[i] for i in idx], processor.tokenizer.pad_token_id)
        loss = model(**enc, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad()
        if step % 50 == 0 or step == steps - 1:
            print(f"sft step {step:4d}  loss {loss.item():.4f}  {time.time() - start:5.0f}s", flush=True)
    seconds = time.time() - start
    after, ex_after, kinds_after = exact_match(model, processor, evals)
    after_held, _, _ = exact_match(model, processor, held)
    result = {"before": before, "after": after, "after_on_held_out_pairs": after_held, "after_by_kind": kinds_after,
              "steps": steps, "batch": batch, "lr": lr, "threads": torch.get_num_threads(),
              "train_seconds": round(seconds, 1), "examples_after": ex_after}
    print(json.dumps(result), flush=True)
    return result


# ---------------------------------------------------------------------------------------------------- main
def verify(vlm: Path) -> int:
    """The saved dir loads through the auto classes and the processor expands <image> to the model's count."""
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(vlm)
    model = AutoModelForImageTextToText.from_pretrained(vlm)
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}]
    text = processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == "<|user|><image>hi<|end|><|assistant|>", text
    assert processor.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False) == text
    enc = processor(text=[text], images=[Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE))], return_tensors="pt")
    n = int((enc["input_ids"] == model.config.image_token_id).sum())
    with torch.no_grad():
        model(**enc)  # raises if the token count and the image features disagree
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ASSETS)
    ap.add_argument("--quick", action="store_true", help="a few steps and little data: checks the pipeline only")
    ap.add_argument("--check", action="store_true", help="only fine-tune OUT/tiny-vlm on OUT/shapes (no build)")
    ap.add_argument("--steps", type=int, default=2000, help="caption pretraining steps")
    ap.add_argument("--sft-steps", type=int, default=600)
    ap.add_argument("--sft-batch", type=int, default=16)
    ap.add_argument("--sft-lr", type=float, default=5e-4)
    ap.add_argument("--threads", type=int, help="CPU threads: 1 to build (the shipped weights were built with 1; "
                    "the weights depend on it, and one thread is not slowed down by other processes on a shared "
                    "machine), 2 for --check (the demo's setting)")
    args = ap.parse_args()
    args.threads = args.threads or (2 if args.check else 1)
    torch.set_num_threads(args.threads)
    vlm, shapes = args.out / "tiny-vlm", args.out / "shapes"
    if args.check:
        check(vlm, shapes, args.sft_steps, args.sft_batch, args.sft_lr, seed=0)
        return
    steps = 5 if args.quick else args.steps
    vision = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4}
    torch.manual_seed(0)  # the vision tower's and projector's initial weights
    tok, model = build_model(ASSETS / "tiny-base", vision)
    processor = build_processor(tok)
    loss, seconds = pretrain(model, processor, steps, batch=4 if args.quick else 32, seed=0, lr=2e-3, lm_lr=3e-4)
    cap_acc = caption_accuracy(model, processor, 10 if args.quick else 100, seed=123)
    vlm.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(vlm, safe_serialization=True)
    processor.save_pretrained(vlm)
    tok.save_pretrained(vlm)  # the tokenizer's own chat_template.jinja, for tokenizer-only callers
    counts = build_shapes(shapes, 40 if args.quick else 1000, 10 if args.quick else 100, seed=1)
    n_image_tokens = verify(vlm)
    digest = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(vlm.glob("*.safetensors"))}
    build = {"steps": steps, "final_loss": round(loss, 4), "seconds": round(seconds), "threads": args.threads,
             "torch": torch.__version__, "vision": vision, "image_tokens_per_image": n_image_tokens,
             "caption_accuracy_on_new_images": cap_acc, "shapes": counts, "sha256": digest}
    (vlm / "BUILD.json").write_text(json.dumps(build, indent=2) + "\n")
    print(json.dumps(build, indent=2))
    if args.quick:
        check(vlm, shapes, steps=3, batch=4, lr=args.sft_lr, seed=0)


if __name__ == "__main__":
    main()
