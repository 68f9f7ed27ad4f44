"""`check --data FILE`: the samples decide the rules that depend on them (issue 31). Without the file such a
finding stays under "depends on"; with it, it holds or not, and the report says the file decided it."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest
from conftest import ROOT

from loraflow.errors import LoraflowError
from loraflow.frontends import data_facts, parse_versions, run_check

# TRL's VLM example under ZeRO-3, full fine-tuning: a rank whose micro-batch holds no image skips the vision tower's
# forward and ZeRO-3's gather hangs or errors (zero3-vision-skipped) - only when text-only samples are mixed in.
LINE = ("accelerate launch --config_file=examples/accelerate_configs/deepspeed_zero3.yaml examples/scripts/sft_vlm.py "
        "--dataset_name HuggingFaceH4/llava-instruct-mix-vsft --model_name_or_path llava-hf/llava-1.5-7b-hf --bf16 "
        "--torch_dtype bfloat16 --gradient_checkpointing --output_dir o")
VERSIONS = "torch=2.13.0,transformers=5.23.0,peft=0.21.2,trl=1.16.0,deepspeed=0.19.8,accelerate=1.15.0"


def _image(n: int) -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": f"what is {n}?"}]},
                         {"role": "assistant", "content": [{"type": "text", "text": "a cat"}]}],
            "images": [f"img/{n}.jpg"]}


def _text(n: int) -> dict:
    return {"messages": [{"role": "user", "content": f"say {n}"}, {"role": "assistant", "content": "ok"}],
            "images": []}


def _write(path, records, jsonl=True):
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n" if jsonl else json.dumps(records))
    return str(path)


def _check(data: str | None) -> tuple[dict, int]:
    text, code = run_check(shlex.split(LINE), None, [], dict(parse_versions(VERSIONS)), True, data)
    return json.loads(text), code


def test_without_data_the_finding_is_a_question(tmp_path):
    doc, code = _check(None)
    finding = {f["rule"]: f for f in doc["findings"]}["zero3-vision-skipped"]
    assert finding["holds_if"] and code == 1 and any("text-only" in q for q in doc["depends_on"])


def test_text_only_samples_in_the_data_decide_it_holds(tmp_path):
    doc, code = _check(_write(tmp_path / "mixed.jsonl", [_image(1), _text(2), _image(3)]))
    finding = {f["rule"]: f for f in doc["findings"]}["zero3-vision-skipped"]
    assert finding["holds_if"] is None and code == 2
    assert "3 samples, 2 with an image" in doc["sources"]["image_every_rank"]


def test_every_sample_with_an_image_decides_it_does_not(tmp_path):
    doc, code = _check(_write(tmp_path / "all.json", [_image(1), _image(2)], jsonl=False))
    assert "zero3-vision-skipped" not in {f["rule"] for f in doc["findings"]}
    assert not any("text-only" in q for q in doc["depends_on"])


def test_formats_llava_placeholders_and_content_parts(tmp_path):
    llava = {"id": "1", "image": "coco/1.jpg", "conversations": [{"from": "human", "value": "<image>\nWhat?"},
                                                                 {"from": "gpt", "value": "A dog."}]}
    placeholder_only = {"conversations": [{"from": "human", "value": "<image>\nAnd this?"}]}
    url_part = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]}
    facts = data_facts.read(_write(tmp_path / "d.jsonl", [llava, placeholder_only, url_part, _text(4)]))
    assert (facts.samples, facts.with_images, facts.image_every_rank) == (4, 3, False)
    assert facts.longest_text_chars == len("<image>\nWhat?") + len("A dog.")  # the turns' text, not their labels


def test_bad_data_files_name_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(_image(1)) + "\n{not json\n")
    with pytest.raises(LoraflowError, match=r"bad.jsonl, line 2: not a JSON record"):
        data_facts.read(str(bad))
    with pytest.raises(LoraflowError, match="no such file"):
        data_facts.read(str(tmp_path / "missing.jsonl"))
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(LoraflowError, match="holds no samples"):
        data_facts.read(str(tmp_path / "empty.jsonl"))


def test_cli_takes_data_and_refuses_it_for_a_loraflow_config(tmp_path):
    data = _write(tmp_path / "mixed.jsonl", [_image(1), _text(2)])
    cmd = [sys.executable, "-m", "loraflow", "check", "--versions", VERSIONS, "--data", data, "--", *shlex.split(LINE)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    assert "[crash] zero3-vision-skipped" in proc.stdout and "2 samples, 1 with an image" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "loraflow", "check", "--data", data], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 3 and "--data is for another framework's run" in proc.stderr
