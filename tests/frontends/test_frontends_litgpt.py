"""LitGPT frontend of `loraflow check`: launch lines as posted in Lightning-AI/litgpt issues (#693, #1538, #477, #553)
and its `--config` YAML -> Combination, and what `check` reports on them. LitGPT's true half precision scales no loss,
so the GradScaler rule must not fire on `--precision 16-true`; several devices mean Fabric's FSDP with checkpointed
Blocks."""

from __future__ import annotations

import json
import shlex

import pytest
from packaging.version import Version

from loraflow.errors import LoraflowError
from loraflow.frontends import detect, from_command, run_check

CURRENT = {"torch": Version("2.13.0"), "transformers": Version("5.23.0"), "peft": Version("0.21.2")}
# https://github.com/Lightning-AI/litgpt/issues/693
PURE_FP16_QLORA = ("python finetune/lora.py --precision 16-true --quantize bnb.nf4 --checkpoint_dir checkpoints/$MODEL "
                   "--out_dir output/code-gen-ui --data_dir data/csv")
# https://github.com/Lightning-AI/litgpt/issues/1538
FOUR_DEVICES = "litgpt finetune_lora checkpoints/microsoft/phi-2/ --devices 4"
# https://github.com/Lightning-AI/litgpt/issues/477 and #553
BF16_TRUE_QLORA = 'python finetune/lora.py --precision "bf16-true" --quantize "bnb.nf4-dq"'
BF16_TRUE = 'python3 finetune/lora.py --precision "bf16-true" --checkpoint_dir checkpoints/meta-llama/Llama-2-7b-hf'


def check(text: str) -> tuple[dict, int]:
    out, code = run_check(shlex.split(text), None, [], dict(CURRENT), True)
    return json.loads(out), code


def test_true_fp16_qlora_is_pure_half_without_a_grad_scaler():
    assert detect(shlex.split(PURE_FP16_QLORA)) == "litgpt"
    r = from_command(shlex.split(PURE_FP16_QLORA), CURRENT)
    s = r.setup
    assert (s.adapter, s.precision, s.quantization, s.grad_scaler, s.engine) == ("lora", "fp16", "4bit", False,
                                                                                  "single")
    doc, _ = check(PURE_FP16_QLORA)
    assert "fp16-trainable-unscale" not in {f["rule"] for f in doc["findings"]}


def test_several_devices_are_fabric_fsdp_with_every_block_checkpointed():
    s = from_command(shlex.split(FOUR_DEVICES), CURRENT).setup
    assert (s.engine, s.world_size, s.fsdp_use_orig_params, s.fsdp_frozen_units_separate) == ("fsdp1", 4, True, False)
    assert (s.checkpointing, s.checkpoint_impl, s.reentrant) == ("all", "torch-wrapper", False)
    doc, code = check(FOUR_DEVICES)
    assert "fsdp-frozen-grad-memory" in {f["rule"] for f in doc["findings"]} and code == 0  # advice, not a crash


def test_one_device_bf16_true_runs_clean_and_its_quantized_twin_reads_4bit():
    doc, code = check(BF16_TRUE)
    assert code == 0 and not [f for f in doc["findings"] if f["impact"] in ("crash", "silent")]
    s = from_command(shlex.split(BF16_TRUE_QLORA), CURRENT).setup
    assert (s.precision, s.quantization, s.engine) == ("bf16", "4bit", "single")


def test_litgpt_s_own_refusals_are_named_and_the_default_precision_is_a_choice():
    r = from_command(shlex.split("litgpt finetune_lora checkpoints/x --quantize bnb.nf4"), CURRENT)
    assert any("Quantization and mixed precision is not supported" in n for n in r.notes)
    assert set(r.unsure["precision"][0]) == {"bf16-mixed", "fp16-mixed"}
    r = from_command(shlex.split("litgpt finetune lora checkpoints/x --precision bf16-true --quantize bnb.nf4 "
                                 "--devices 2"), CURRENT)
    assert r.setup.adapter == "lora" and any("not supported for multi-GPU training" in n for n in r.notes)


def test_a_config_file_is_read_and_flags_override_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lora.yaml").write_text("precision: bf16-mixed\ndevices: 2\nlora_r: 8\ntrain:\n  epochs: 1\n")
    s = from_command(shlex.split("litgpt finetune_full --config lora.yaml --precision 32-true"), CURRENT).setup
    assert (s.adapter, s.precision, s.engine, s.world_size) == ("full", "fp32", "fsdp1", 2)


def test_commands_that_do_not_finetune_are_refused_with_what_check_reads():
    for line in ("litgpt generate checkpoints/x", "python3 generate/lora.py --checkpoint_dir checkpoints/x "
                 "--quantize bnb.nf4"):
        with pytest.raises(LoraflowError, match="finetun"):
            from_command(shlex.split(line), CURRENT)
