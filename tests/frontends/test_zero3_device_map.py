"""from_pretrained given a device_map while ZeRO-3 is configured (zero3-device-map-load): transformers refuses it in
every release (modeling_utils.py from_pretrained, integrations/accelerate.py check_and_set_device_map in 5.x), and
refused low_cpu_mem_usage=True too before 4.51. Threads: hiyouga/LlamaFactory#199, OptimalScale/LMFlow#620 and #686,
huggingface/accelerate#2543, locuslab/open-unlearning#38, shibing624/MedicalGPT#477. The refusal is reproduced here
on the installed transformers and deepspeed (CPU), and the log it prints is read back by explain."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from script_check import check, rules

from loraflow.explain import diagnose_log

RULE = "zero3-device-map-load"
SCRIPT = '''
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments
    args = TrainingArguments(output_dir="out", deepspeed="{ds}", bf16=True)
    model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-7b-hf", torch_dtype=torch.bfloat16{load})
    model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    Trainer(model=model, args=args, train_dataset=data).train()
'''
DS = {"zero_optimization": {"stage": 3}, "bf16": {"enabled": True}, "train_micro_batch_size_per_gpu": 1}
LAUNCH = ["torchrun", "--nproc_per_node", "2", "train.py"]


@pytest.mark.parametrize("load, stage, transformers, holds", [
    (", device_map='auto'", 3, "5.23.0", True),
    (", device_map={'': 0}", 3, "4.40.0", True),
    (", device_map={'': int(os.environ['LOCAL_RANK'])}", 3, "5.23.0", True),  # the per-rank DDP/QLoRA recipe
    (", device_map=None if is_deepspeed_zero3_enabled() else 'auto'", 3, "5.23.0", False),  # the fix
    (", low_cpu_mem_usage=True", 3, "4.50.0", True),
    (", low_cpu_mem_usage=True", 3, "4.51.0", False),  # ignored from 4.51
    (", device_map={'': 0}", 2, "5.23.0", False),  # ZeRO-2 keeps a whole copy per rank
    ("", 3, "5.23.0", False),
])
def test_the_load_and_the_stage_decide(tmp_path, monkeypatch, load, stage, transformers, holds):
    ds = {**DS, "zero_optimization": {"stage": stage}}
    report = check(tmp_path, monkeypatch, SCRIPT.format(ds="ds.json", load=load), argv=LAUNCH,
                   files={"ds.json": json.dumps(ds)}, transformers=transformers)
    assert (RULE in rules(report)) == holds, rules(report)
    if holds:
        assert report["exit_code"] == 2 and "device_map" in report["flags"]["device_map_load"]


def test_a_load_before_the_script_configures_zero3_is_not_refused(tmp_path, monkeypatch):
    """transformers refuses only while an HfDeepSpeedConfig / TrainingArguments(deepspeed=...) exists: a script that
    loads first and configures ZeRO-3 after is not refused (its model is then built whole)."""
    late = SCRIPT.format(ds="ds.json", load=", device_map={'': 0}").splitlines()
    late = "\n".join([late[0], *late[1:4], late[5], late[4], *late[6:]])  # the load above TrainingArguments
    assert late.index("from_pretrained") < late.index("TrainingArguments(")
    report = check(tmp_path, monkeypatch, late, argv=LAUNCH, files={"ds.json": json.dumps(DS)})
    assert RULE not in rules(report), rules(report)


def test_arguments_parsed_from_the_launch_configure_zero3_before_any_load(tmp_path, monkeypatch):
    script = """
        import torch
        from transformers import AutoModelForCausalLM, HfArgumentParser, Trainer, TrainingArguments
        (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()
        model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-7b-hf", device_map="auto")
        Trainer(model=model, args=args, train_dataset=data).train()
    """
    argv = LAUNCH + ["--deepspeed", "ds.json", "--output_dir", "out"]
    report = check(tmp_path, monkeypatch, script, argv=argv, files={"ds.json": json.dumps(DS)})
    assert RULE in rules(report), rules(report)


def test_the_examples_low_cpu_mem_usage_flag(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ds.json").write_text(json.dumps(DS))
    from script_check import launch_findings

    line = ("deepspeed --num_gpus 2 run_clm.py --model_name_or_path gpt2 --deepspeed ds.json --low_cpu_mem_usage "
            "--output_dir o --do_train")
    assert RULE in launch_findings(tmp_path, monkeypatch, line, "transformers=4.40.0,deepspeed=0.14.0")
    assert RULE not in launch_findings(tmp_path, monkeypatch, line, "transformers=4.51.3,deepspeed=0.16.0")


@pytest.mark.parametrize("log, first", [
    ("ValueError: DeepSpeed Zero-3 is not compatible with `low_cpu_mem_usage=True` or with passing a `device_map`.",
     RULE),
    ("ValueError: DeepSpeed Zero-3 is not compatible with passing a `device_map`.", RULE),  # transformers >= 4.51
    ("    model = AutoModelForCausalLM.from_pretrained(path, load_in_8bit=True, device_map={'': 0})\n"
     "ValueError: DeepSpeed Zero-3 is not compatible with `low_cpu_mem_usage=True` or with passing a `device_map`.",
     "zero3-init-quantized-load"),  # the quantized load under zero.Init names its own rule
    ('  File "/env/lib/python3.10/site-packages/unsloth/models/llama.py", line 1, in from_pretrained\n'
     "ValueError: DeepSpeed Zero-3 is not compatible with passing a `device_map`.", "unsloth-multi-gpu"),
])
def test_explain_names_the_load_unless_the_log_shows_why_it_was_given(log, first):
    _, candidates, _ = diagnose_log(log)
    assert candidates and candidates[0].rule.id == first, [c.rule.id for c in candidates]


LIVE = '''
    import os, sys, tempfile, traceback
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig
    from transformers.integrations import HfDeepSpeedConfig

    folder = tempfile.mkdtemp()
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    stage = int(sys.argv[1])
    keep = HfDeepSpeedConfig({"zero_optimization": {"stage": stage}, "train_micro_batch_size_per_gpu": 1})
    try:
        AutoModelForCausalLM.from_pretrained(folder, device_map={"": "cpu"})
        print("LOADED")
    except ValueError:
        traceback.print_exc()
'''


@pytest.mark.parametrize("stage, refused", [(3, True), (2, False)])
def test_the_installed_transformers_refuses_the_map_under_zero3_only(tmp_path, stage, refused):
    script = tmp_path / "load.py"
    script.write_text(textwrap.dedent(LIVE))
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, str(script), str(stage)], capture_output=True, text=True, timeout=240,
                          env=env)
    log = done.stdout + done.stderr
    assert ("LOADED" not in done.stdout) == refused, log[-2000:]
    if refused:
        _, candidates, _ = diagnose_log(log)
        assert candidates and candidates[0].rule.id == RULE, (log[-1500:], [c.rule.id for c in candidates])
