"""ZeRO-3's "auto" stage3_prefetch_bucket_size filled as a float that DeepSpeed >= 0.15.0's pydantic 2 validation
refuses (zero3-prefetch-bucket-float). The cluster: deepspeedai/DeepSpeed#6525, OpenBMB/MiniCPM-V#694,
hiyouga/LlamaFactory#5252, #5586, #5795, THUDM/LongWriter#16, hustvl/Senna#14; fixed by transformers PR #33402
(4.45.0) and accelerate PR #2814 (0.31.0). Releases read from the deepspeed sdists (0.14.4, 0.15.0) and the
transformers / accelerate wheels."""

from __future__ import annotations


import pytest
from script_check import launch_findings

from loraflow.explain import diagnose_log

RULE = "zero3-prefetch-bucket-float"
LF = ("model_name_or_path: meta-llama/Meta-Llama-3-8B-Instruct\nstage: sft\ndo_train: true\nfinetuning_type: lora\n"
      "lora_target: all\ndeepspeed: {ds}\ndataset: alpaca_en_demo\ntemplate: llama3\noutput_dir: out\nbf16: true\n")


_findings = launch_findings


@pytest.mark.parametrize("versions, holds", [
    ("deepspeed=0.15.0,transformers=4.44.2", True),  # LlamaFactory#5252's DeepSpeed, the Trainer of its day
    ("deepspeed=0.15.0,transformers=4.45.0", False),  # int(0.9 * hidden_size**2) (PR #33402)
    ("deepspeed=0.14.4,transformers=4.44.2", False),  # pydantic 1 truncated the float
])
def test_llamafactory_shipped_zero3_file(tmp_path, monkeypatch, versions, holds):
    # examples/deepspeed/ds_z3_config.json is not here: read as shipped, "auto" included.
    found = _findings(tmp_path, monkeypatch, "llamafactory-cli train sft.yaml", versions,
                      {"sft.yaml": LF.format(ds="examples/deepspeed/ds_z3_config.json")})
    assert (RULE in found) == holds, found


@pytest.mark.parametrize("bucket, stage, versions, holds", [
    ('"auto"', 3, "deepspeed=0.15.1,transformers=4.44.2", True),
    ('"auto"', 2, "deepspeed=0.15.1,transformers=4.44.2", False),  # the key is a stage-3 one
    ("15099494.4", 3, "deepspeed=0.15.1,transformers=4.46.0", True),  # a literal fraction: no filler rounds it
    ("15099494", 3, "deepspeed=0.15.1,transformers=4.44.2", False),
])
def test_the_json_decides(tmp_path, monkeypatch, bucket, stage, versions, holds):
    ds = ('{"zero_optimization": {"stage": %d, "stage3_prefetch_bucket_size": %s}, "bf16": {"enabled": "auto"}}'
          % (stage, bucket))
    line = "torchrun --nproc_per_node 2 trl/scripts/sft.py --model_name_or_path m --use_peft --deepspeed ds.json"
    found = _findings(tmp_path, monkeypatch, line, versions + ",trl=0.11.0", {"ds.json": ds})
    assert (RULE in found) == holds, found


def test_unknown_releases_name_the_question(tmp_path, monkeypatch):
    found = _findings(tmp_path, monkeypatch, "swift sft --model Qwen/Qwen2.5-7B-Instruct --train_type lora "
                      "--deepspeed zero3 --dataset d", "ms-swift=3.0.0", {})
    assert found.get(RULE) == "deepspeed>=0.15.0 and transformers<4.45.0", found


@pytest.mark.parametrize("text", [
    "[rank3]: pydantic_core._pydantic_core.ValidationError: 1 validation error for DeepSpeedZeroConfig\n"
    "[rank3]: stage3_prefetch_bucket_size\n"
    "[rank3]:   Input should be a valid integer, got a number with a fractional part [type=int_from_float, "
    "input_value=15099494.4, input_type=float]",
    "pydantic_core._pydantic_core.ValidationError: 1 validation error for DeepSpeedZeroConfig\n"
    "stage3_prefetch_bucket_size\n  Input should be a valid integer, got a number with a fractional part "
    "[type=int_from_float, input_value=11560550.4, input_type=float]",
])
def test_explain_names_it(text):
    _, candidates, _ = diagnose_log(text)
    assert candidates and candidates[0].rule.id == RULE and candidates[0].confidence == "confirmed"
