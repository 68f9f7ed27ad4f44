"""Launches of a training script of the user's own that is not here (the commonest shape in issue threads and
example folders): its flags are read for what they name, and nothing is read as another framework's on a flag
that many scripts share."""

from __future__ import annotations

import json
import shlex

from loraflow.frontends import parse_versions, run_check

VERSIONS = dict(parse_versions("torch=2.3.0,transformers=4.41.0,peft=0.11.1,accelerate=0.30.1,deepspeed=0.14.2"))


def _doc(line: str, tmp_path, monkeypatch) -> dict:
    monkeypatch.chdir(tmp_path)
    return json.loads(run_check(shlex.split(line), None, [], dict(VERSIONS), True)[0])


def test_a_script_s_own_deepspeed_config_flag_chooses_deepspeed_and_its_name_says_the_stage(tmp_path, monkeypatch):
    doc = _doc("deepspeed --num_gpus 4 train.py --model_name_or_path Qwen/Qwen-1_8B-Chat --lora_dim 16 "
               "--gradient_checkpointing --ds_file ds_zero2_no_offload.json", tmp_path, monkeypatch)
    assert doc["framework"] == "hf"  # `--lora_dim` alone beside a train.py is not DeepSpeed-Chat's main.py
    assert (doc["setup"]["engine"], doc["setup"]["zero_stage"], doc["setup"]["offload"]) == ("deepspeed", 2, False)
    assert doc["setup"]["adapter"] == "lora"
    assert not any(u.startswith("--ds_file") for u in doc["unknown"])


def test_deepspeed_chat_is_still_read_beside_its_main_py_or_another_flag_of_its_own(tmp_path, monkeypatch):
    for line in ("deepspeed main.py --model_name_or_path facebook/opt-1.3b --lora_dim 128 --zero_stage 3",
                 "deepspeed train.py --model_name_or_path facebook/opt-1.3b --lora_dim 128 --only_optimize_lora"):
        assert _doc(line, tmp_path, monkeypatch)["framework"] == "deepspeed-chat", line


def test_a_name_that_says_no_offload_does_not_offload(tmp_path, monkeypatch):
    doc = _doc("deepspeed train.py --deepspeed ds_config_zero3_no_offload.json --lora_r 8", tmp_path, monkeypatch)
    assert (doc["setup"]["zero_stage"], doc["setup"]["offload"]) == (3, False)
    doc = _doc("deepspeed train.py --deepspeed ds_config_zero3_offload.json --lora_r 8", tmp_path, monkeypatch)
    assert doc["setup"]["offload"] is True


def test_a_script_s_own_target_and_bits_flags_are_read(tmp_path, monkeypatch):
    doc = _doc("deepspeed finetune-lora.py --model_name_or_path meta-llama/Llama-2-7b-hf --load_in_bits 8 "
               "--lora_r 8 --target_modules query_key_value --deepspeed ds_config_zero2.json", tmp_path, monkeypatch)
    assert doc["setup"]["quantization"] == "8bit"
    assert not any(u.startswith(("--load_in_bits", "--target_modules")) for u in doc["unknown"])
    # query_key_value is Falcon's / BLOOM's attention, not a Llama layer: nothing would be adapted.
    assert any(f["rule"] == "no-adapter-matched" for f in doc["findings"])


def test_a_llama_factory_config_that_is_not_here_leaves_the_verdict_open(tmp_path, monkeypatch):
    """Read from its name (`llama3_lora_sft_ds3.yaml`: LoRA, ZeRO-3), its other keys unseen: at most exit 1."""
    doc = _doc("llamafactory-cli train examples/train_lora/llama3_lora_sft_ds3.yaml", tmp_path, monkeypatch)
    assert doc["setup"]["adapter"] == "lora" and doc["exit_code"] >= 1
    assert any(u.startswith("examples/train_lora/llama3_lora_sft_ds3.yaml: not here") for u in doc["unknown"])
