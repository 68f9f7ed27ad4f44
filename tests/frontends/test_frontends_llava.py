"""LLaVA's train.py and its lineage (`llava/train/train.py`, `train_mem.py`), read from the launch line when the
script is not here: LLaVA-1.5's published LoRA recipe (tests/fixtures/corpus/check/scripts/011, haotian-liu/LLaVA
scripts/v1_5/finetune_lora.sh) and the launch of haotian-liu/LLaVA#363, whose fp16 cast of the model before
get_peft_model left the trained projector in fp16 under the Trainer's GradScaler."""

from __future__ import annotations

import json
import shlex

from conftest import ROOT
from packaging.version import Version

from loraflow.frontends import detect, from_command, run_check
from loraflow.frontends.shell import command_from_script

RECIPE = ROOT / "tests" / "fixtures" / "corpus" / "check" / "scripts" / "011-llava15-lora-zero3.sh"
PINNED = {"torch": Version("2.1.2"), "transformers": Version("4.37.2"), "deepspeed": Version("0.12.6"),
          "accelerate": Version("0.21.0"), "peft": Version("0.6.0")}
# https://github.com/haotian-liu/LLaVA/issues/363 (the launch as posted, paths shortened)
ISSUE_363 = ("python llava/train/train.py --lora_enable True --model_name_or_path weights/vicuna-7b-v1.3 --version v1 "
             "--data_path data/llava_instruct_150k.json --image_folder data/train2017 --vision_tower "
             "openai/clip-vit-large-patch14 --pretrain_mm_mlp_adapter weights/projector.bin --mm_vision_select_layer -2 "
             "--mm_use_im_start_end True --fp16 True --output_dir out --num_train_epochs 3 "
             "--per_device_train_batch_size 1 --tf32 False --model_max_length 2048 --gradient_checkpointing True "
             "--lazy_preprocess True --report_to wandb")


def check(argv: list[str], versions: dict) -> tuple[set[str], int]:
    doc = json.loads(run_check(argv, None, [], dict(versions), True)[0])
    return {f["rule"] for f in doc["findings"] if f["impact"] in ("crash", "silent")}, doc["exit_code"]


def test_the_published_lora_recipe_reads_as_llava_s_code_sets_it_up_and_is_clean(monkeypatch):
    monkeypatch.chdir(RECIPE.parent)
    argv = command_from_script(str(RECIPE))
    assert detect(argv) == "llava"
    s = from_command(argv, PINNED).setup
    assert (s.adapter, s.engine, s.zero_stage, s.checkpointing, s.input_grad_hook) == ("lora", "deepspeed", 3, "all",
                                                                                       True)
    assert (s.image_text, s.frozen_modules, s.tower_adapters, s.towers_full) == (True, True, False, True)
    assert s.image_every_rank and s.image_safe_truncation and s.precision == "bf16-mixed"
    # Clean as launched; LLaVA's train.py resumes by itself when output_dir holds a checkpoint, and transformers
    # 4.37 (its pin) cannot load a PEFT model's DeepSpeed checkpoint (LLaVA#1200, #1492): the question check asks.
    assert check(argv, PINNED) == ({"zero-peft-resume-strict"}, 1)
    doc = json.loads(run_check(argv, None, [], dict(PINNED), True)[0])
    assert "output_dir already holds a checkpoint" in doc["findings"][0]["holds_if"]


def test_lora_at_16_bits_casts_the_trained_projector_to_the_half_dtype_outside_deepspeed():
    serious, code = check(shlex.split(ISSUE_363), PINNED)
    assert "fp16-trainable-unscale" in serious and code == 2
    bf16 = shlex.split(ISSUE_363.replace("--fp16 True", "--bf16 True"))
    assert from_command(bf16, PINNED).setup.precision == "bf16"
    assert "bf16-lost-updates" in check(bf16, PINNED)[0]  # the projector trains in bf16 with no float32 copy


def test_bits_4_quantizes_the_language_model_and_keeps_mixed_precision():
    s = from_command(shlex.split(ISSUE_363.replace("--fp16 True", "--bf16 True --bits 4")), PINNED).setup
    assert (s.quantization, s.precision) == ("4bit", "bf16-mixed")


def test_a_llava_model_name_does_not_reopen_what_train_py_settles():
    """LLaVA-1.5's finetune_task_lora.sh starts from liuhaotian/llava-v1.5-13b: the name alone makes the blank image
    and the truncation questions of a generic vision model, which train.py's own code answers."""
    argv = shlex.split(ISSUE_363.replace("weights/vicuna-7b-v1.3", "liuhaotian/llava-v1.5-13b"))
    result = from_command(argv, PINNED)
    assert result.setup.image_every_rank and result.setup.image_safe_truncation
    assert not {"image_every_rank", "image_safe_truncation"} & set(result.unsure)


def test_deepspeed_without_a_gpu_count_runs_one_process_per_gpu_of_the_machine():
    """`deepspeed llava/train/train_mem.py ...` (every LLaVA script) starts a process per visible GPU: the count is a
    question, not 1."""
    argv = ["deepspeed"] + shlex.split(ISSUE_363)[1:]
    assert "world_size" in from_command(argv, PINNED).unsure
    assert "world_size" not in from_command(["deepspeed", "--num_gpus", "2"] + argv[1:], PINNED).unsure
