"""A model spread over GPUs by device_map: refused in any multi-process launch (device-map-split-distributed), and an
Unsloth model so spread in one process (unsloth-multi-gpu), as `check` reads training scripts and `explain` reads
the refusals. The cluster: transformers#31557, Qwen#900/#1081 and PR #833, Qwen-VL#218, HuatuoGPT-II#32,
LLM-Workshop#9 (accelerate's refusal), unsloth#2467 (an Unsloth model spread with device_map='auto')."""

from __future__ import annotations

from script_check import check, rules

from loraflow.explain import diagnose_log
from loraflow.rules import get_rule
from loraflow.rules.combination import Combination

SCRIPT = """\
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig, TrainingArguments, Trainer
    from peft import LoraConfig, get_peft_model

    model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-7b-hf", device_map={where},{quant}
                                                 torch_dtype=torch.bfloat16)
    model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    args = TrainingArguments(output_dir="out", bf16=True, per_device_train_batch_size=1)
    Trainer(model=model, args=args, train_dataset=None).train()
"""
QUANT = " quantization_config=BitsAndBytesConfig(load_in_4bit=True),"
TORCHRUN = ["torchrun", "--nproc_per_node", "4", "train.py"]


def _script(where: str, quant: bool = False) -> str:
    return SCRIPT.format(where=where, quant=QUANT if quant else "")


def _finding(report: dict, rule: str) -> dict:
    return next(f for f in report["findings"] if f["rule"] == rule)


def test_the_rule_needs_a_spread_model_and_several_processes():
    rule = get_rule("device-map-split-distributed")
    assert rule.when(Combination(model_split=True, world_size=2, engine="ddp"))
    assert not rule.when(Combination(model_split=True, world_size=1))
    assert not rule.when(Combination(model_split=False, world_size=2, engine="ddp"))
    assert rule.when(Combination(model_split=True, world_size=2, engine="deepspeed", zero_stage=2))
    # FSDP and ZeRO-3's zero.Init load without dispatching over devices (ZeRO-3 refuses the device_map itself).
    for engine, stage in (("fsdp1", 0), ("fsdp2", 0), ("deepspeed", 3)):
        assert not rule.when(Combination(model_split=True, world_size=2, engine=engine, zero_stage=stage)), engine


def test_device_map_auto_under_torchrun_fails_as_given(tmp_path, monkeypatch):
    report = check(tmp_path, monkeypatch, _script('"auto"'), TORCHRUN)
    found = _finding(report, "device-map-split-distributed")
    assert found["holds_if"] is None and report["exit_code"] == 2
    assert any("device_map=" in fix and "model_split is now True" in fix for fix in found["fix_here"])


def test_one_process_may_spread_the_model(tmp_path, monkeypatch):
    report = check(tmp_path, monkeypatch, _script('"auto"'), ["python", "train.py"])
    assert "device-map-split-distributed" not in rules(report)
    assert report["exit_code"] == 0


def test_a_per_rank_device_map_is_not_a_spread(tmp_path, monkeypatch):
    text = _script('{"": int(os.environ.get("LOCAL_RANK", 0))}').replace("import torch", "import os\nimport torch")
    report = check(tmp_path, monkeypatch, text, TORCHRUN)
    assert "device-map-split-distributed" not in rules(report)


def test_a_literal_map_over_two_gpus_is_a_spread(tmp_path, monkeypatch):
    report = check(tmp_path, monkeypatch, _script('{"model.embed_tokens": 0, "model.layers": 0, "lm_head": 1}'),
                   TORCHRUN)
    assert _finding(report, "device-map-split-distributed")["holds_if"] is None


def test_a_quantized_model_spread_is_refused_as_a_spread_not_as_a_move(tmp_path, monkeypatch):
    """accelerate checks the device map before the k-bit placement (accelerator.py prepare_model), so 'auto' meets
    the spread refusal; a 4-bit model loaded on GPU 0 by every rank is the move (kbit-model-moved)."""
    spread = check(tmp_path, monkeypatch, _script('"auto"', quant=True), TORCHRUN)
    assert "device-map-split-distributed" in rules(spread) and "kbit-model-moved" not in rules(spread)
    fixed = check(tmp_path, monkeypatch, _script("0", quant=True), TORCHRUN)
    assert "kbit-model-moved" in rules(fixed) and "device-map-split-distributed" not in rules(fixed)


UNSLOTH = """\
    from unsloth import FastLanguageModel
    from trl import SFTTrainer, SFTConfig

    model, tokenizer = FastLanguageModel.from_pretrained(model_name="Qwen/Qwen2.5-72B", load_in_4bit=True,
                                                         device_map={where})
    model = FastLanguageModel.get_peft_model(model, r=16, target_modules=["q_proj", "v_proj"])
    SFTTrainer(model=model, args=SFTConfig(output_dir="out"), train_dataset=None).train()
"""


def test_an_unsloth_model_spread_in_one_process_depends_on_the_gpus_it_sees(tmp_path, monkeypatch):
    """unsloth#2467: device_map='auto' spread a 4-bit 72B model over the GPUs and Unsloth's kernels met tensors on
    two of them. How many GPUs the process sees is not in the launch: the one question check asks."""
    report = check(tmp_path, monkeypatch, UNSLOTH.format(where='"auto"'), unsloth="2025.4.1")
    found = _finding(report, "unsloth-multi-gpu")
    assert found["holds_if"] and "several GPUs" in found["holds_if"] and report["exit_code"] == 1
    assert "model_split" in found["decided_by"]
    # One process already: fewer processes cannot help, the device_map can.
    assert not any("process count" in fix for fix in found["fix_here"])
    assert any(fix.startswith("change device_map=") for fix in found["fix_here"])
    # Unsloth's default, "sequential", fills the first GPU first: no question.
    default = check(tmp_path, monkeypatch, UNSLOTH.format(where='"sequential"'), unsloth="2025.4.1")
    assert "unsloth-multi-gpu" not in rules(default)


def test_explain_names_accelerates_and_ddps_refusals():
    for line in ("ValueError: You can't train a model that has been loaded with `device_map='auto'` in any "
                 "distributed mode. Please rerun your script specifying `--num_processes=1` or by launching with "
                 "`python {{myscript.py}}`.",
                 "ValueError: You can't train a model that has been loaded in 8-bit precision on multiple devices in "
                 "any distributed mode. In order to use 8-bit models that have been loaded across multiple GPUs the "
                 "solution is to use Naive Pipeline Parallelism.",
                 "ValueError: DistributedDataParallel device_ids and output_device arguments only work with "
                 "single-device/multiple-device GPU modules or CPU modules, but got device_ids [0], output_device 0, "
                 "and module parameters {device(type='cuda', index=0), device(type='cuda', index=1)}."):
        _, candidates, _ = diagnose_log(line, None)
        assert candidates and candidates[0].rule.id == "device-map-split-distributed", line
        assert candidates[0].confidence == "confirmed"
