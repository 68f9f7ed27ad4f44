"""Image-text models after training: `loraflow generate --image`, image parts in `--prompts` files and `/image` in
chat give what transformers and PEFT give for the saved adapter (the processor's own chat template and encoding,
PeftModel.from_pretrained, model.generate, greedy: token for token), and `loraflow merge` writes the processor beside
the merged model so AutoProcessor loads it. The README's image-text demo run (examples/sft-vision.yaml on the bundled
tiny LLaVA, its vision tower and projector trained in full; the session's `vision_demo`) is the run they query."""

from __future__ import annotations

import io
import json
import re
import shlex
import shutil
from pathlib import Path

import pytest
import torch
from conftest import ROOT

from loraflow.commands.cli import main
from loraflow.errors import LoraflowError
from loraflow.locations import ASSETS

QUESTION = "What colour is the shape?"
IMAGES = [ASSETS / "shapes" / "images" / f"eval-0000{i}.png" for i in (0, 1)]
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def vision_run(vision_demo) -> Path:
    """The README's vision demo run (tests/conftest.py, shared with tests/test_vision_demo.py): examples/sft-vision.yaml
    trained, its towers in full, rather than a second training of the same example here."""
    tmp, proc, _ = vision_demo
    return tmp / re.search(r"^run directory: (\S+)$", proc.stdout, re.M).group(1)


@pytest.fixture(scope="module")
def loaded(vision_run):
    from loraflow.commands.generate import load

    return load(str(vision_run))


@pytest.fixture(scope="module")
def reference(vision_run):
    """What transformers and PEFT alone give: the processor's chat template and encoding, the adapter on the base,
    model.generate, greedy; through the first stop token, as loraflow reports it."""
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText, AutoProcessor

    adapter = vision_run / "adapter"
    processor = AutoProcessor.from_pretrained(adapter)
    model = PeftModel.from_pretrained(AutoModelForImageTextToText.from_pretrained(ASSETS / "tiny-vlm"), adapter)

    def ids(images: list[Path], question: str = QUESTION) -> list[int]:
        parts = [{"type": "image", "path": str(p)} for p in images] + [{"type": "text", "text": question}]
        inputs = processor.apply_chat_template([{"role": "user", "content": parts}], add_generation_prompt=True,
                                               tokenize=True, return_dict=True, return_tensors="pt")
        out = model.eval().generate(**inputs, do_sample=False, max_new_tokens=NEW_TOKENS)
        out = out[0, inputs["input_ids"].shape[1]:].tolist()
        eos = processor.tokenizer.eos_token_id
        return out[: out.index(eos) + 1] if eos in out else out

    ids.processor = processor
    ids.model = model
    return ids


def ours(loaded, prompt) -> list[int]:
    from loraflow.commands.generate import Sampling, complete, prompt_inputs

    ids, images = prompt_inputs(loaded, prompt, True)
    return complete(loaded, ids, Sampling(max_new_tokens=NEW_TOKENS), images).token_ids


def generate_json(capsys, *argv: str) -> list[dict]:
    capsys.readouterr()
    assert main(["generate", *argv, "--max-new-tokens", str(NEW_TOKENS), "--json"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def text(reference, ids: list[int]) -> str:
    return reference.processor.tokenizer.decode(ids, skip_special_tokens=True).strip()


def test_greedy_generation_with_images_equals_peft_token_for_token(vision_run, loaded, reference, capsys):
    from loraflow.commands.vision import image_prompt

    one, other, both = reference(IMAGES[:1]), reference(IMAGES[1:]), reference(IMAGES)
    assert one != other, "the two images should get different answers, or the image is not reaching the model"
    assert ours(loaded, image_prompt(QUESTION, [str(IMAGES[0])])) == one
    assert ours(loaded, image_prompt(QUESTION, [str(p) for p in IMAGES])) == both  # --image, repeated
    [row] = generate_json(capsys, str(vision_run), "--prompt", QUESTION, "--image", str(IMAGES[1]))
    assert row["completion"] == text(reference, other) and row["tokens"] == len(other)
    assert row["messages"][0]["content"] == [{"type": "image", "path": str(IMAGES[1])},
                                             {"type": "text", "text": QUESTION}]


def test_adapter_directory_alone_loads_as_an_image_text_model(vision_run, reference, tmp_path):
    """No run config above it: the base comes from adapter_config.json (an image-text model, which has no causal-LM
    class) and the processor from the adapter folder."""
    from loraflow.commands.generate import load
    from loraflow.commands.vision import image_prompt

    alone = load(str(shutil.copytree(vision_run / "adapter", tmp_path / "adapter")))
    assert alone.processor is not None
    assert ours(alone, image_prompt(QUESTION, [str(IMAGES[0])])) == reference(IMAGES[:1])


def test_prompts_file_with_image_parts_reads_as_training_data(loaded, reference, tmp_path):
    from loraflow.commands.generate import Sampling, generate, read_prompts

    (tmp_path / "pictures").mkdir()
    shutil.copy(IMAGES[0], tmp_path / "pictures" / "a.png")
    user = {"role": "user",
            "content": [{"type": "image", "path": "pictures/a.png"}, {"type": "text", "text": QUESTION}]}
    records = [{"messages": [user, {"role": "assistant", "content": [{"type": "text", "text": "blue"}]}]},
               {"messages": [{"role": "user", "content": QUESTION}]}]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    out = io.StringIO()
    generate(loaded, read_prompts(str(tmp_path / "p.jsonl")), Sampling(max_new_tokens=NEW_TOKENS), as_json=True,
             out=out)
    with_image, text_only = (json.loads(line) for line in out.getvalue().splitlines())
    # The relative path resolved against the file's directory; the trailing answer is the reference.
    assert with_image["completion"] == text(reference, reference(IMAGES[:1]))
    assert with_image["messages"] == [user] and with_image["reference"] == "blue"
    assert text_only["completion"] == text(reference, reference([]))
    out = io.StringIO()
    generate(loaded, read_prompts(str(tmp_path / "p.jsonl"))[:1], Sampling(max_new_tokens=NEW_TOKENS), out=out)
    assert out.getvalue().startswith(f">>> [image pictures/a.png] {QUESTION}\n")


def test_chat_attaches_an_image_to_the_next_message(loaded, reference, tmp_path):
    from loraflow.commands.generate import Sampling, chat

    out = io.StringIO()
    conversation = f"/image {IMAGES[0]}\n{QUESTION}\n/reset\n{QUESTION}\n/exit\n"
    chat(loaded, Sampling(max_new_tokens=NEW_TOKENS), io.StringIO(conversation), out)
    lines = out.getvalue().splitlines()
    assert lines[0] == f"(image {IMAGES[0]} attached to your next message)"
    assert lines[1] == f"assistant> {text(reference, reference(IMAGES[:1]))}"
    assert lines[3] == f"assistant> {text(reference, reference([]))}"  # after /reset: no image
    with pytest.raises(LoraflowError, match=r"/image .*missing\.png: no such file"):
        chat(loaded, Sampling(max_new_tokens=NEW_TOKENS), io.StringIO(f"/image {tmp_path}/missing.png\nhi\n"),
             io.StringIO())


def test_images_that_cannot_be_used_are_clear_errors(vision_run, tiny_model, tmp_path, capsys, monkeypatch):
    from loraflow.commands.generate import Sampling, chat, load

    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not an image")
    (tmp_path / "missing.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": [
        {"type": "image", "path": "nowhere.png"}, {"type": "text", "text": "hi"}]}]}) + "\n")
    (tmp_path / "image.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": [
        {"type": "image", "path": str(IMAGES[0])}, {"type": "text", "text": "hi"}]}]}) + "\n")
    run, image = str(vision_run), str(IMAGES[0])
    cases = [([run, "--prompt", "x", "--image", str(tmp_path / "gone.png")], "gone.png: no such file"),
             ([run, "--prompt", "x", "--image", str(tmp_path / "broken.png")], "broken.png: cannot be decoded"),
             ([run, "--prompts", str(tmp_path / "missing.jsonl")],
              "missing.jsonl line 1: `messages[0].content[0]` names image nowhere.png, which cannot be read"),
             ([run, "--prompts", str(tmp_path / "missing.jsonl"), "--image", image], "--image goes with --prompt"),
             ([run, "--prompt", "x", "--image", image, "--no-chat-template"], "--no-chat-template: --image gives"),
             ([str(tiny_model), "--prompt", "x", "--image", image], "--image: the prompt holds 1 image(s), but model"),
             ([str(tiny_model), "--prompts", str(tmp_path / "image.jsonl")], "image.jsonl line 1: the prompt holds")]
    for argv, message in cases:
        capsys.readouterr()
        assert main(["generate", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert message in err, (argv, err)
    assert "text-only model" in err and "drop the image parts from the --prompts file" in err
    with pytest.raises(LoraflowError, match="/image: model .* is a text-only model"):
        chat(load(str(tiny_model)), Sampling(max_new_tokens=4), io.StringIO(f"/image {image}\nhi\n"), io.StringIO())


def test_merge_writes_the_processor_beside_the_merged_model(vision_run, loaded, reference, tmp_path, capsys):
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    merged = tmp_path / "merged"
    assert main(["merge", str(vision_run / "adapter"), str(merged)]) == 0
    processor = AutoProcessor.from_pretrained(merged)
    model = AutoModelForImageTextToText.from_pretrained(merged).eval()
    parts = [{"type": "image"}, {"type": "text", "text": QUESTION}]
    prompt = processor.apply_chat_template([{"role": "user", "content": parts}], add_generation_prompt=True)
    inputs = processor(text=prompt, images=[Image.open(IMAGES[0]).convert("RGB")], return_tensors="pt")
    with torch.no_grad():
        got, want = model(**inputs).logits, reference.model.eval()(**inputs).logits
    assert (got - want).abs().max().item() < 1e-4
    # And generate reads the merged directory as a model with its processor: the adapter's answer.
    [row] = generate_json(capsys, str(merged), "--prompt", QUESTION, "--image", str(IMAGES[0]))
    assert row["completion"] == text(reference, reference(IMAGES[:1]))


def test_the_readme_s_image_query_answers_on_the_vision_demo_run(vision_run, reference, capsys, monkeypatch):
    """The README's quickstart trains examples/sft-vision.yaml into runs/shapes and asks it about a bundled image:
    that line, pointed at the same example's run, answers as PEFT does."""
    line = next(line for line in (ROOT / "README.md").read_text().splitlines()
                if line.startswith("loraflow generate runs/shapes --image"))
    argv = shlex.split(line)[2:]
    assert argv[0] == "runs/shapes"
    monkeypatch.chdir(ROOT)  # the image path is relative to the repository, as the README runs it
    [row] = generate_json(capsys, str(vision_run), *argv[1:])
    image = ROOT / argv[argv.index("--image") + 1]
    assert row["completion"] == text(reference, reference([image], argv[argv.index("--prompt") + 1]))
