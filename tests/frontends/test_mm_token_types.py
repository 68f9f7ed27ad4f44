"""The image-text class of Gemma 3, Gemma 4, PaliGemma and Molmo2 refuses a training forward without the token type
ids its processor makes (mm-token-types-required): transformers 5.0 made the check depend on train mode, so text-only
runs of the multimodal checkpoints stop at the first step. NVIDIA-NeMo/Automodel#1203, huggingface/trl#5032 and
#5807, unslothai/unsloth PR #4017, trl PRs #5643/#5644; ranges read from the transformers wheels. Molmo2 still raises
on the installed 5.23, which is reproduced here on a tiny model."""

from __future__ import annotations

import json
import shlex

import pytest
import torch

from loraflow.explain import diagnose_log
from loraflow.frontends import parse_versions, run_check

RULE = "mm-token-types-required"
TRL = ("trl sft --model_name_or_path {model} --dataset_name trl-lib/Capybara --use_peft --lora_target_modules "
       "all-linear --output_dir out")


def findings(line: str, versions: str, data: str | None = None) -> dict[str, str | None]:
    doc = json.loads(run_check(shlex.split(line), None, [], dict(parse_versions(versions)), True, data)[0])
    return {f["rule"]: f["holds_if"] for f in doc["findings"]}


@pytest.mark.parametrize("model, transformers, holds", [
    ("google/gemma-3-4b-it", "5.2.0", True),
    ("google/translategemma-4b-it", "5.5.4", True),
    ("google/gemma-3-4b-it", "5.6.0", False),  # the check left gemma3 in 5.6.0
    ("google/gemma-3-4b-it", "4.57.1", False),  # 4.x used the ids only when given
    ("google/paligemma2-3b-pt-224", "5.8.1", True),
    ("google/paligemma2-3b-pt-224", "5.9.0", False),
    ("allenai/Molmo2-8B", "5.23.0", True),  # still raises
    ("google/gemma-3-1b-it", "5.2.0", False),  # the text-only class
])
def test_the_model_and_the_release_decide_and_the_data_is_the_question(model, transformers, holds):
    found = findings(TRL.format(model=model), f"transformers={transformers},trl=1.4.0")
    assert (RULE in found) == holds, found
    if holds:
        assert found[RULE] == "the data is text only (its collator, the tokenizer's, makes no token_type_ids)"


def test_the_data_settles_it(tmp_path):
    text = tmp_path / "text.json"
    text.write_text(json.dumps([{"messages": [{"role": "user", "content": "hi"}]}]))
    images = tmp_path / "images.json"
    images.write_text(json.dumps([{"messages": [{"role": "user", "content": "<image>what"}], "images": ["a.png"]}]))
    line = TRL.format(model="google/gemma-3-4b-it")
    assert findings(line, "transformers=5.2.0,trl=1.4.0", str(text))[RULE] is None
    assert RULE not in findings(line, "transformers=5.2.0,trl=1.4.0", str(images))


@pytest.mark.parametrize("line", [
    "ValueError: `token_type_ids` is required as a model input when training",
    "ValueError: `mm_token_type_ids` is required as a model input when training",
    'torch._dynamo.exc.Unsupported: ... ValueError("token_type_ids is required as a model input when training")',
])
def test_explain_names_it_from_the_refusal(line):
    _, candidates, _ = diagnose_log(line)
    assert candidates and (candidates[0].rule.id, candidates[0].confidence) == (RULE, "confirmed")


def test_the_installed_molmo2_refuses_a_text_only_training_forward_and_takes_zero_ids():
    from transformers import AutoModelForImageTextToText, Molmo2Config

    small = dict(hidden_size=32, num_attention_heads=2, num_key_value_heads=2, intermediate_size=64, head_dim=16)
    config = Molmo2Config(text_config={**small, "num_hidden_layers": 1, "vocab_size": 128},
                          vision_config={**small, "num_hidden_layers": 2},
                          adapter_config={**small, "vision_feature_layer": [-1], "text_hidden_size": 32})
    model = AutoModelForImageTextToText.from_config(config).train()
    ids = torch.randint(0, 100, (1, 8))
    with pytest.raises(ValueError) as raised:
        model(input_ids=ids, labels=ids)
    _, candidates, _ = diagnose_log(f"ValueError: {raised.value}")
    assert candidates[0].rule.id == RULE
    assert torch.isfinite(model(input_ids=ids, labels=ids, mm_token_type_ids=torch.zeros_like(ids)).loss)
    model.eval()
    assert torch.isfinite(model(input_ids=ids, labels=ids).loss)  # only train mode checks
