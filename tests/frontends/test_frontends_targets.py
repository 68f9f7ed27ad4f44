"""Adapter targets read against the model's family (frontends/targets.py): a list naming only another family's
linear layers matches no module (rule no-adapter-matched), in every frontend that reads a target list; anything
check cannot be sure of (an unlisted family, a name no family declares, all-linear, a regex) decides nothing."""

from __future__ import annotations

import json
import shlex

import pytest
from packaging.version import Version

from loraflow.frontends import run_check
from loraflow.frontends.targets import family_of, foreign

CURRENT = {"torch": Version("2.13.0"), "transformers": Version("5.23.0"), "peft": Version("0.21.2"),
           "deepspeed": Version("0.19.8"), "accelerate": Version("1.15.0")}


@pytest.mark.parametrize("model,targets,decided", [
    ("meta-llama/Llama-2-7b-hf", ["query_key_value"], True),   # GPT-NeoX names on a Llama (StableLM issue 98)
    ("meta-llama/Llama-2-7b-hf", ["q_proj", "v_proj"], False),
    ("meta-llama/Llama-2-7b-hf", ["q_proj", "query_key_value"], False),  # one name matches: PEFT adapts it
    ("tiiuae/falcon-7b", ["q_proj", "v_proj"], True),
    ("tiiuae/falcon-7b", ["query_key_value"], False),
    ("EleutherAI/pythia-1.4b", ["c_attn"], True),
    ("gpt2", ["c_attn"], False), ("gpt2", ["q_proj"], True),
    ("Qwen/Qwen2.5-7B-Instruct", ["c_attn"], True),
    ("Qwen/Qwen-7B-Chat", ["c_attn"], False),  # Qwen's first release names its layers c_attn: not listed
    ("microsoft/Phi-3-mini-4k-instruct", ["q_proj", "v_proj"], True),
    ("meta-llama/Llama-2-7b-hf", ["all-linear"], False),
    ("meta-llama/Llama-2-7b-hf", [".*query_key_value"], False),  # a regex: not read
    ("meta-llama/Llama-2-7b-hf", ["W_pack"], False),  # a name no listed family declares (Baichuan's)
    ("baichuan-inc/Baichuan2-7B-Chat", ["q_proj"], False),  # an unlisted family
    ("/data/models/my-model", ["query_key_value"], False),
])
def test_targets_against_the_family_the_name_says(model, targets, decided):
    assert (foreign(model, targets) is not None) == decided


def test_family_names():
    assert family_of("mistralai/Mistral-7B-v0.1") == "llama" and family_of("Qwen/Qwen3-8B") == "llama"
    assert family_of("databricks/dolly-v2-3b") == "gpt_neox" and family_of("Qwen/Qwen-7B") is None


def findings(argv=None, framework=None, files=None) -> dict[str, str | None]:
    doc = json.loads(run_check(argv, framework, files or [], dict(CURRENT), as_json=True)[0])
    return {f["rule"]: f["holds_if"] for f in doc["findings"]}


def test_every_frontend_with_a_target_list_reads_it_against_the_model(tmp_path):
    hf = ("torchrun --nproc_per_node 2 train.py --model_name_or_path meta-llama/Llama-2-7b-hf --use_peft "
          "--lora_target_modules query_key_value dense --output_dir o")
    assert findings(shlex.split(hf))["no-adapter-matched"] is None
    assert "no-adapter-matched" not in findings(shlex.split(hf.replace("query_key_value dense", "q_proj v_proj")))
    lf = tmp_path / "lf.yaml"
    lf.write_text("model_name_or_path: tiiuae/falcon-7b\nstage: sft\ndo_train: true\nfinetuning_type: lora\n"
                  "lora_target: q_proj,v_proj\ndataset: alpaca_en_demo\ntemplate: falcon\noutput_dir: o\n")
    assert findings(framework="llama-factory", files=[str(lf)])["no-adapter-matched"] is None
    ax = tmp_path / "ax.yml"
    ax.write_text("base_model: EleutherAI/pythia-1.4b\nadapter: lora\nlora_r: 8\nlora_target_modules:\n  - q_proj\n"
                  "  - v_proj\ndatasets:\n  - path: d.jsonl\n    type: alpaca\n")
    assert findings(framework="axolotl", files=[str(ax)])["no-adapter-matched"] is None
    script = tmp_path / "train.py"
    script.write_text("from transformers import AutoModelForCausalLM\nfrom peft import LoraConfig, get_peft_model\n"
                      "model = AutoModelForCausalLM.from_pretrained('meta-llama/Llama-2-7b-hf')\n"
                      "model = get_peft_model(model, LoraConfig(r=8, target_modules=['query_key_value']))\n"
                      "model.train()\n")
    assert "no-adapter-matched" in findings(framework="python", files=[str(script)])
