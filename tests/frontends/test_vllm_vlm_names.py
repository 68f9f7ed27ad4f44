"""vLLM before 0.9.1 (Qwen2-VL, Qwen2.5-VL) or 0.9.2 (LLaVA, Gemma 3, Mllama) cannot place weights under the module
names transformers 4.52 gave these models (vllm-vlm-weight-names). The cluster: vllm-project/vllm#19149 (ms-swift
GRPO, transformers 4.52.4, vLLM 0.8.5), verl-project/verl#1710, hiyouga/LlamaFactory#8254 and #8147,
hiyouga/EasyR1#305, huggingface/transformers#38403; the fixes vllm-project/vllm#19054 (0.9.1) and
huggingface/transformers#38385 (saving, 4.52.4). Releases read from the transformers, vllm and verl wheels."""

from __future__ import annotations

import json
import shlex

import pytest

from loraflow.explain import diagnose_log
from loraflow.frontends import parse_versions, run_check
from loraflow.frontends.model_types import VLM_RENAMED, model_type_of

RULE = "vllm-vlm-weight-names"
TRL = "trl grpo --model_name_or_path {model} --use_vllm --dataset_name d"
SWIFT = "swift rlhf --rlhf_type grpo --model {model} --use_vllm true --train_type full --dataset d"
VERL = ("python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo actor_rollout_ref.model.path={model} "
        "actor_rollout_ref.rollout.name=vllm data.train_files=d")
QWEN = "Qwen/Qwen2.5-VL-3B-Instruct"


def _findings(line: str, versions: str) -> dict[str, str | None]:
    doc = json.loads(run_check(shlex.split(line), None, [], dict(parse_versions(versions)), as_json=True)[0])
    return {f["rule"]: f["holds_if"] for f in doc["findings"]}


@pytest.mark.parametrize("launch, model, versions, holds", [
    (TRL, QWEN, "transformers=4.52.4,vllm=0.8.5,trl=0.20.0", True),  # vllm#19149's pair
    (TRL, QWEN, "transformers=4.52.4,vllm=0.9.1,trl=0.20.0", False),  # the loader maps the new names (PR #19054)
    (TRL, QWEN, "transformers=4.51.3,vllm=0.8.5,trl=0.19.0", False),  # the old layout, as vLLM expects
    (TRL, "google/gemma-3-4b-it", "transformers=4.52.4,vllm=0.9.1,trl=0.20.0", True),  # gemma3_mm.py: from 0.9.2
    (TRL, "google/gemma-3-4b-it", "transformers=4.52.4,vllm=0.9.2,trl=0.20.0", False),
    (TRL, "meta-llama/Llama-3.1-8B-Instruct", "transformers=4.52.4,vllm=0.8.5,trl=0.20.0", False),  # not renamed
    (SWIFT, QWEN, "transformers=4.52.4,vllm=0.8.5,ms-swift=3.5.0", True),
    (VERL, QWEN, "transformers=4.52.4,vllm=0.8.5,verl=0.4.0", True),  # verl#1710
    (VERL, QWEN, "transformers=4.52.4,vllm=0.8.5,verl=0.4.1", False),  # convert_weight_keys renames them
])
def test_the_releases_and_the_framework_decide(launch, model, versions, holds):
    found = _findings(launch.format(model=model), versions)
    assert (RULE in found) == holds, found
    if holds:
        assert found[RULE] is None  # decided by the versions given


def test_without_a_vllm_release_it_depends_on_it():
    found = _findings(TRL.format(model=QWEN), "transformers=4.52.4,trl=0.20.0")
    assert found.get(RULE) == "vllm<0.9.1", found


def test_without_vllm_rollouts_nothing_is_synced():
    found = _findings("trl grpo --model_name_or_path Qwen/Qwen2.5-VL-3B-Instruct --dataset_name d",
                      "transformers=4.52.4,vllm=0.8.5,trl=0.20.0")
    assert RULE not in found


def test_the_renamed_model_types():
    assert {model_type_of(m) for m in (QWEN, "Qwen/Qwen2-VL-7B-Instruct")} == {"qwen2_5_vl", "qwen2_vl"}
    assert VLM_RENAMED[model_type_of("llava-hf/llava-1.5-7b-hf")] == "vlm"
    assert model_type_of("Qwen/Qwen2.5-7B-Instruct") not in VLM_RENAMED


@pytest.mark.parametrize("text, level", [
    ("KeyError: 'language_model.embed_tokens.weight'", "confirmed"),
    ("KeyError: 'language_model.layers.0.self_attn.qkv_proj.weight'", "confirmed"),
    ('  File "/x/vllm/model_executor/models/qwen2_5_vl.py", line 1126, in load_weights\n'
     "    return loader.load_weights(weights, mapper=self.hf_to_vllm_mapper)\n"
     "KeyError: 'visual.patch_embed.proj.weight'", "confirmed"),
])
def test_explain_names_it(text, level):
    _, candidates, _ = diagnose_log(text)
    assert candidates and candidates[0].rule.id == RULE and candidates[0].confidence == level


@pytest.mark.parametrize("text", [
    "KeyError: 'language_model.model.layers.0.linear_attn.in_proj_qkvz.weight'",  # vLLM's own prefix (vllm#36640)
    "KeyError: 'layers.0.mlp.down_proj.weight_scale'",  # a quantization scale (llm-compressor#959)
])
def test_explain_leaves_other_keyerrors(text):
    _, candidates, _ = diagnose_log(text)
    assert not candidates or candidates[0].rule.id != RULE
